// Threads per rank and the idle-CPU advice, from where the launcher let the ranks run.
#include "mergepipe/mpi/cpu_placement.hpp"

#include <gtest/gtest.h>

using mergepipe::mpi::CpuPlacement;
using mergepipe::mpi::default_threads;
using mergepipe::mpi::idle_cpu_advice;

namespace {
CpuPlacement placement(int rank_cpus, int node_cpus, int launcher_cpus, int ranks_on_node) {
  return {rank_cpus, node_cpus, launcher_cpus, ranks_on_node, {}, {}};
}
}  // namespace

TEST(CpuPlacement, ABoundRankUsesTheCpusItWasGiven) {
  // mpirun -np 1 on two cores: bound to one, so a second compute thread would only compete.
  EXPECT_EQ(default_threads(placement(1, 1, 2, 1)), 1);
  // mpirun --map-by slot:PE=8 with two ranks on 16 CPUs.
  EXPECT_EQ(default_threads(placement(8, 16, 16, 2)), 8);
  // srun --cpus-per-task=4 on a node where the job has 32 CPUs.
  EXPECT_EQ(default_threads(placement(4, 8, 32, 2)), 4);
}

TEST(CpuPlacement, UnboundRanksShareTheNodeEvenly) {
  EXPECT_EQ(default_threads(placement(2, 2, 2, 1)), 2);
  EXPECT_EQ(default_threads(placement(16, 16, 16, 4)), 4);
  // More ranks than CPUs (oversubscribed tests): still one thread each.
  EXPECT_EQ(default_threads(placement(2, 2, 2, 4)), 1);
}

TEST(CpuPlacement, AdviceOnlyWhenTheJobHasIdleCpus) {
  EXPECT_EQ(idle_cpu_advice(placement(1, 2, 2, 2)), "");  // two ranks, one core each
  EXPECT_EQ(idle_cpu_advice(placement(2, 2, 2, 1)), "");  // one rank, unbound
  const std::string advice = idle_cpu_advice(placement(1, 1, 2, 1));
  EXPECT_NE(advice.find("1 of its 2 CPUs"), std::string::npos) << advice;
  EXPECT_NE(advice.find("1 CPU stays idle"), std::string::npos) << advice;
  EXPECT_NE(advice.find("--bind-to none"), std::string::npos) << advice;
  EXPECT_NE(idle_cpu_advice(placement(1, 2, 64, 2)).find("62 CPUs stay idle"), std::string::npos);
}
