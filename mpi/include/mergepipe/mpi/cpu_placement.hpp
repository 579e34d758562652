#pragma once
// Where the launcher let this node's ranks run. Open MPI binds each rank to one core when it
// starts two or fewer (and Slurm to the CPUs of the task), so a rank may run on fewer CPUs than
// the job has: its reads and its merge then share them while the others stay idle (measured:
// one rank bound to one of two cores ran a K = 20 full-read TIES in 64 s, unbound in 38 s).
#include <string>
#include <vector>

#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

struct CpuPlacement {
  int rank_cpus = 1;  // CPUs this rank may run on (its affinity mask)
  int node_cpus = 1;  // CPUs this node's ranks may run on together (the union of their masks)
  // CPUs the job may use on this node: the launcher's mask, no more than SLURM_CPUS_ON_NODE
  // under Slurm, at least node_cpus.
  int launcher_cpus = 1;
  int ranks_on_node = 1;
  std::vector<int> node_ranks;    // ranks of the communicator on this node, ascending
  std::vector<int> node_cpu_ids;  // the CPUs of node_cpus
};

// Collective over comm.
CpuPlacement cpu_placement(const Comm& comm);

// Compute threads per rank when --threads is 0: the CPUs the rank was bound to, or, when the
// ranks were not bound, the node's CPUs shared evenly. At least one.
int default_threads(const CpuPlacement& placement);

// Advice when the ranks of this node may use fewer CPUs than the job has; empty otherwise.
std::string idle_cpu_advice(const CpuPlacement& placement);

}  // namespace mergepipe::mpi
