#pragma once
// How a job is spread over nodes: what the manifest and the summary say, so that a run on 1 node
// x 2 ranks and one on 2 nodes x 1 rank can be told apart, and each node's threads are its own
// (not rank 0's).
#include <string>
#include <vector>

#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/mpi/cpu_placement.hpp"

namespace mergepipe::mpi {

struct NodeLayout {
  std::string host;  // the node's host name
  int ranks = 0;     // ranks on the node
  int threads = 0;   // compute threads per rank there (the largest, if they differ)
  int cpus = 0;      // CPUs the node's ranks may run on together
  bool operator==(const NodeLayout&) const = default;
};

struct JobLayout {
  std::vector<NodeLayout> nodes;  // in the order of their lowest rank (rank 0's node first)
  std::vector<int> ranks_per_node() const;
};

// Collective over comm; complete on rank 0 (the other ranks get their own node only). `threads`
// is this rank's compute thread count.
JobLayout job_layout(const Comm& comm, const CpuPlacement& placement, int threads);

}  // namespace mergepipe::mpi
