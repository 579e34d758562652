#pragma once
// --full-read with TIES: there is no catalog, so the per-tensor trimming thresholds come from the
// data itself, with the same sketch definition as the catalog (SPEC §3) so a 100% budgeted
// merge and a full read agree bit for bit. Costs one extra read of every expert tensor.
#include <vector>

#include "mergepipe/merge_task.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

// Returns thresholds [expert][tensor] on every rank. Collective.
std::vector<float> compute_thresholds_from_data(const Comm& comm, const MergeTask& task);

}  // namespace mergepipe::mpi
