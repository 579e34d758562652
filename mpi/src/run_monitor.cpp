#include "mergepipe/mpi/run_monitor.hpp"

#include <thread>

namespace mergepipe::mpi {

namespace {
// Point-to-point tags on the phase's communicator; nothing else sends point-to-point there.
constexpr int kReportTag = 7301;   // any rank -> rank 0
constexpr int kControlTag = 7302;  // rank 0 -> a rank
constexpr auto kPollSleep = std::chrono::milliseconds(2);

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

RunMonitor::RunMonitor(const Comm& comm, const char* phase, std::uint64_t total_bytes,
                       ProgressListener* listener, double report_interval)
    : comm_(comm),
      listener_(comm.is_root() ? listener : nullptr),
      report_interval_(report_interval),
      start_(std::chrono::steady_clock::now()),
      last_report_(start_) {
  snapshot_.phase = phase;
  snapshot_.total_bytes = total_bytes;
  snapshot_.ranks = comm.size();
  if (comm.is_root()) {
    rank_bytes_.assign(static_cast<std::size_t>(comm.size()), 0);
    rank_done_.assign(static_cast<std::size_t>(comm.size()), 0);
    told_.assign(static_cast<std::size_t>(comm.size()), 0);
    notify_listener(true);
  }
}

RunMonitor::~RunMonitor() {
  // finish() is the normal way out; if an exception skipped it, cancel what is pending so no
  // request outlives its buffer.
  for (MPI_Request& r : requests_) {
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }
}

void RunMonitor::add(std::uint64_t bytes) {
  local_bytes_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  if (comm_.is_root()) {
    rank_bytes_[0] = local_bytes_;
    poll();
    return;
  }
  if (seconds_between(last_report_, now) >= report_interval_) {
    last_report_ = now;
    send_report(kProgress);
  }
}

bool RunMonitor::stop_requested() {
  poll();
  return stop_;
}

void RunMonitor::send_report(Kind kind) {
  complete_sends(false);
  send_buffers_.push_back(Message{kind, local_bytes_});
  requests_.push_back(MPI_REQUEST_NULL);
  MPI_Isend(&send_buffers_.back(), 2, MPI_UINT64_T, 0, kReportTag, comm_.handle(),
            &requests_.back());
}

void RunMonitor::complete_sends(bool wait) {
  while (!requests_.empty()) {
    int done = 0;
    MPI_Test(&requests_.front(), &done, MPI_STATUS_IGNORE);
    if (!done) {
      if (!wait) return;
      std::this_thread::sleep_for(kPollSleep);
      continue;
    }
    requests_.erase(requests_.begin());
    send_buffers_.pop_front();
  }
}

void RunMonitor::poll() {
  if (!comm_.is_root()) {
    if (got_final_word_) return;
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(0, kControlTag, comm_.handle(), &flag, &status);
    if (!flag) return;
    Message m;
    MPI_Recv(&m, 2, MPI_UINT64_T, 0, kControlTag, comm_.handle(), MPI_STATUS_IGNORE);
    got_final_word_ = true;
    if (m.kind == kStop) stop_ = true;
    return;
  }
  for (;;) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, comm_.handle(), &flag, &status);
    if (!flag) break;
    Message m;
    MPI_Recv(&m, 2, MPI_UINT64_T, status.MPI_SOURCE, kReportTag, comm_.handle(), MPI_STATUS_IGNORE);
    const auto r = static_cast<std::size_t>(status.MPI_SOURCE);
    rank_bytes_[r] = m.bytes;
    if (m.kind == kDone || m.kind == kFailed) {
      rank_done_[r] = 1;
      if (m.kind == kFailed && !stop_) stop_everyone();
    }
  }
  notify_listener(false);
}

void RunMonitor::stop_everyone() {
  stop_ = true;
  for (int r = 1; r < comm_.size(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (rank_done_[i] || told_[i]) continue;
    told_[i] = 1;
    // Tiny message: MPI sends it eagerly, so a blocking send does not wait for the receiver.
    Message m{kStop, 0};
    MPI_Send(&m, 2, MPI_UINT64_T, r, kControlTag, comm_.handle());
  }
}

void RunMonitor::notify_listener(bool forced) {
  if (!listener_) return;
  std::uint64_t done = 0;
  int finished = 0;
  for (std::size_t r = 0; r < rank_bytes_.size(); ++r) {
    done += rank_bytes_[r];
    finished += rank_done_[r] ? 1 : 0;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!forced && done == snapshot_.done_bytes && finished == snapshot_.ranks_finished &&
      seconds_between(start_, now) - snapshot_.elapsed_seconds < 0.25)
    return;
  snapshot_.done_bytes = done;
  snapshot_.ranks_finished = finished;
  snapshot_.elapsed_seconds = seconds_between(start_, now);
  listener_->update(snapshot_);
}

void RunMonitor::finish(bool failed) {
  if (finished_) return;
  finished_ = true;
  if (!comm_.is_root()) {
    send_report(failed ? kFailed : kDone);
    while (!got_final_word_) {
      poll();
      if (!got_final_word_) std::this_thread::sleep_for(kPollSleep);
    }
    complete_sends(true);
    return;
  }
  rank_bytes_[0] = local_bytes_;
  rank_done_[0] = 1;
  if (failed && !stop_) stop_everyone();
  for (;;) {
    poll();
    bool all = true;
    for (char d : rank_done_) all = all && d;
    if (all) break;
    std::this_thread::sleep_for(kPollSleep);
  }
  Message fin{kFinished, 0};
  for (int r = 1; r < comm_.size(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (told_[i]) continue;
    told_[i] = 1;
    MPI_Send(&fin, 2, MPI_UINT64_T, r, kControlTag, comm_.handle());
  }
  notify_listener(true);
  if (listener_) listener_->finish(snapshot_, !failed && !stop_);
}

}  // namespace mergepipe::mpi
