// job_layout at 1, 2 and 4 ranks: the nodes as the placement describes them, rank 0's node
// first, each with its ranks and threads; a placement that puts ranks on nodes of their own
// (as a multi-node job has them) is told apart from one node holding them all.
#include "mergepipe/mpi/job_layout.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

using namespace mergepipe;

TEST(MPI, JobLayoutOfTheRealPlacementIsOneNode) {
  const mpi::Comm comm = mpi::Comm::world();
  const mpi::CpuPlacement placement = mpi::cpu_placement(comm);  // every rank on this machine
  const mpi::JobLayout layout = mpi::job_layout(comm, placement, 3);
  if (!comm.is_root()) return;
  ASSERT_EQ(layout.nodes.size(), 1u);
  EXPECT_EQ(layout.nodes[0].ranks, comm.size());
  EXPECT_EQ(layout.nodes[0].threads, 3);
  EXPECT_FALSE(layout.nodes[0].host.empty());
  EXPECT_EQ(layout.ranks_per_node(), std::vector<int>{comm.size()});
}

TEST(MPI, JobLayoutGroupsRanksByTheirNode) {
  // Pretend nodes of two consecutive ranks each ({0, 1}, {2, 3}, ...), the last one shorter,
  // with threads that differ by rank: the node reports its largest.
  const mpi::Comm comm = mpi::Comm::world();
  mpi::CpuPlacement placement;
  const int first = comm.rank() - comm.rank() % 2;
  for (int r = first; r < std::min(first + 2, comm.size()); ++r) placement.node_ranks.push_back(r);
  placement.ranks_on_node = static_cast<int>(placement.node_ranks.size());
  placement.node_cpus = 2;
  const mpi::JobLayout layout = mpi::job_layout(comm, placement, 1 + comm.rank() % 2);
  if (!comm.is_root()) return;
  const std::size_t nodes = static_cast<std::size_t>((comm.size() + 1) / 2);
  ASSERT_EQ(layout.nodes.size(), nodes);
  int ranks = 0;
  for (std::size_t n = 0; n < nodes; ++n) {
    const int expected = std::min(2, comm.size() - static_cast<int>(2 * n));
    EXPECT_EQ(layout.nodes[n].ranks, expected) << n;
    EXPECT_EQ(layout.nodes[n].threads, expected == 2 ? 2 : 1) << n;
    EXPECT_EQ(layout.nodes[n].cpus, 2);
    ranks += layout.nodes[n].ranks;
  }
  EXPECT_EQ(ranks, comm.size());
}
