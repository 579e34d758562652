#pragma once
// Progress of a long phase (catalog build, merge) as rank 0 sees it, summed over ranks. The MPI
// layer gathers it; apps/ renders it (terminal bar, log lines, JSON). Nothing here prints.
#include <cstdint>
#include <string>

namespace mergepipe {

struct ProgressSnapshot {
  std::string phase;             // "catalog", "merge", ...
  std::uint64_t done_bytes = 0;  // bytes moved so far (reads + writes), all ranks
  std::uint64_t total_bytes = 0;
  double elapsed_seconds = 0;  // since the phase started
  int ranks = 1;
  int ranks_finished = 0;
};

class ProgressListener {
 public:
  virtual ~ProgressListener() = default;
  // Called on rank 0 whenever its view changes; the listener decides what and when to show.
  virtual void update(const ProgressSnapshot& snapshot) = 0;
  // Called once at the end of the phase (successful or not).
  virtual void finish(const ProgressSnapshot& snapshot, bool success) = 0;
};

}  // namespace mergepipe
