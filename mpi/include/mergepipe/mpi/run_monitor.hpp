#pragma once
// The channel between the ranks while they stream their blocks, point-to-point and non-blocking
// so nobody waits for anybody:
//  - every rank reports its progress to rank 0 (at most every `report_interval` seconds), which
//    hands the sum to a ProgressListener;
//  - a rank that fails tells rank 0 at once, and rank 0 tells every rank still working to stop
//    before its next block, so one rank's error ends the job promptly instead of after every
//    other rank has finished its whole share;
//  - at the end every rank waits for the others by polling with short sleeps, not inside a
//    blocking MPI call (Open MPI busy-polls there, stealing the core a busy rank needs).
// Only the thread that created the monitor may call it (MPI_THREAD_FUNNELED).
#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/progress.hpp"

namespace mergepipe::mpi {

class RunMonitor {
 public:
  // Collective only in spirit: every rank of `comm` must create one for the phase and call
  // finish() exactly once. `total_bytes` is the phase's global total. `listener` is used on
  // rank 0 only (may be null).
  RunMonitor(const Comm& comm, const char* phase, std::uint64_t total_bytes,
             ProgressListener* listener, double report_interval = 0.5);
  ~RunMonitor();
  RunMonitor(const RunMonitor&) = delete;
  RunMonitor& operator=(const RunMonitor&) = delete;

  // This rank moved `bytes` more.
  void add(std::uint64_t bytes);
  // True once another rank failed: stop before the next block.
  bool stop_requested();
  // This rank's work is over (`failed`: it threw). Returns when every rank's is. Then call
  // Comm::check with the local failure to learn the job's outcome.
  void finish(bool failed);

 private:
  enum Kind : std::uint64_t { kProgress = 1, kDone = 2, kFailed = 3, kStop = 4, kFinished = 5 };
  struct Message {
    std::uint64_t kind = 0;
    std::uint64_t bytes = 0;
  };
  void send_report(Kind kind);        // non-root
  void poll();                        // root: drain reports; non-root: look for a stop
  void stop_everyone();               // root
  void notify_listener(bool forced);  // root
  void complete_sends(bool wait);

  const Comm& comm_;
  ProgressSnapshot snapshot_;
  ProgressListener* listener_;
  const double report_interval_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_report_;
  std::uint64_t local_bytes_ = 0;
  bool stop_ = false;
  bool got_final_word_ = false;  // non-root: rank 0's stop or finished message arrived
  bool finished_ = false;
  // root: per rank
  std::vector<std::uint64_t> rank_bytes_;
  std::vector<char> rank_done_, told_;
  // outstanding non-blocking sends; their buffers live in `send_buffers_`
  std::vector<MPI_Request> requests_;
  std::deque<Message> send_buffers_;
};

}  // namespace mergepipe::mpi
