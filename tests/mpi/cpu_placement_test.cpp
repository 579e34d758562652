// cpu_placement at 1, 2 and 4 ranks: the counts are the affinity masks of this rank and of all
// ranks on the node, and a rank bound to fewer CPUs than the launcher has gets advice.
#include "mergepipe/mpi/cpu_placement.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <string>
#include <vector>

using namespace mergepipe;

namespace {
cpu_set_t own_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return set;
}

// The union of every rank's mask, computed here by gathering them (not by the code under test).
int union_count(const cpu_set_t& mine) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<cpu_set_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&mine, sizeof(cpu_set_t), MPI_BYTE, all.data(), sizeof(cpu_set_t), MPI_BYTE,
                MPI_COMM_WORLD);
  cpu_set_t both;
  CPU_ZERO(&both);
  for (const cpu_set_t& s : all) CPU_OR(&both, &both, &s);
  return CPU_COUNT(&both);
}
}  // namespace

TEST(MPI, CpuPlacementCountsTheAffinityMasks) {
  mpi::Comm comm = mpi::Comm::world();
  const cpu_set_t mine = own_mask();
  const mpi::CpuPlacement p = mpi::cpu_placement(comm);
  EXPECT_EQ(p.rank_cpus, CPU_COUNT(&mine));
  EXPECT_EQ(p.ranks_on_node, comm.size());  // CTest runs every rank on this machine
  std::vector<int> every_rank(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) every_rank[static_cast<std::size_t>(r)] = r;
  EXPECT_EQ(p.node_ranks, every_rank);
  EXPECT_EQ(p.node_cpus, union_count(mine));
  EXPECT_GE(p.launcher_cpus, p.node_cpus);
  EXPECT_GE(mpi::default_threads(p), 1);
}

// Narrows this rank to the lowest CPU it may use, as a launcher binding would, for the scope.
class PinnedToLowestCpu {
 public:
  PinnedToLowestCpu() : before_(own_mask()) {
    int first = 0;
    while (!CPU_ISSET(first, &before_)) ++first;
    CPU_ZERO(&one_);
    CPU_SET(first, &one_);
    EXPECT_EQ(sched_setaffinity(0, sizeof(one_), &one_), 0);
  }
  ~PinnedToLowestCpu() { EXPECT_EQ(sched_setaffinity(0, sizeof(before_), &before_), 0); }
  const cpu_set_t& mask() const { return one_; }

 private:
  cpu_set_t before_, one_;
};

TEST(MPI, RanksPinnedToOneCpuGetAdviceWhenTheLauncherHasMore) {
  mpi::Comm comm = mpi::Comm::world();
  mpi::CpuPlacement p;
  int pinned_union = 0;
  {
    const PinnedToLowestCpu pinned;
    p = mpi::cpu_placement(comm);
    pinned_union = union_count(pinned.mask());
  }
  EXPECT_EQ(p.rank_cpus, 1);
  EXPECT_EQ(p.node_cpus, pinned_union);
  if (p.launcher_cpus > p.node_cpus) {
    EXPECT_EQ(mpi::default_threads(p), 1);
    EXPECT_NE(mpi::idle_cpu_advice(p).find("--bind-to none"), std::string::npos);
  } else {
    GTEST_SKIP() << "the launcher itself may use only " << p.launcher_cpus << " CPU(s)";
  }
}

TEST(MPI, SlurmsCpuCountCapsTheLaunchersMask) {
  mpi::Comm comm = mpi::Comm::world();
  mpi::CpuPlacement p;
  {
    const PinnedToLowestCpu pinned;
    // A job that owns only the CPUs its ranks are bound to: the rest of the node is another
    // job's.
    const std::string owned = std::to_string(union_count(pinned.mask()));
    ASSERT_EQ(setenv("SLURM_CPUS_ON_NODE", owned.c_str(), 1), 0);
    p = mpi::cpu_placement(comm);
    unsetenv("SLURM_CPUS_ON_NODE");
  }
  EXPECT_EQ(p.launcher_cpus, p.node_cpus);
  EXPECT_EQ(mpi::idle_cpu_advice(p), "");
  EXPECT_EQ(mpi::default_threads(p), 1);
}
