#pragma once
// Runs a merge task on every rank of a communicator: partition the blocks by bytes, stream and
// merge this rank's blocks, write them into the shared output files, gather the output hashes
// and byte counts on rank 0. Collective: every rank calls it with the same task.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/merge_task.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

struct MergeRunOptions {
  std::string output_dir;  // an existing (staging) folder; tensor files are written inside it
  int threads = 1;
  int prefetch_depth = 2;
  bool allow_nonfinite = false;
  std::vector<std::pair<std::string, std::string>> mpiio_hints;
};

struct MergeRunResult {
  io::ByteCounts bytes;                    // summed over ranks
  std::vector<std::string> tensor_hashes;  // rank 0: per tensor (combine_block_hashes)
  std::vector<std::string> files;          // output data files written (names in output_dir)
  double merge_seconds = 0;                // slowest rank
  double read_wait_seconds = 0, compute_seconds = 0, write_seconds = 0;  // slowest rank
  std::uint64_t max_rss_bytes = 0;  // largest peak RSS over ranks
};

MergeRunResult run_merge(const Comm& comm, const MergeTask& task, const MergeRunOptions& options);

// Name of the HDF5 output file inside the output folder.
inline constexpr const char* kHdf5OutputName = "model.h5";

}  // namespace mergepipe::mpi
