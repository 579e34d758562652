// RunMonitor at 1, 2 and 4 ranks: rank 0 sees the sum of every rank's progress, and a rank that
// fails makes every other rank stop promptly (not after finishing its own work).
#include "mergepipe/mpi/run_monitor.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

using namespace mergepipe;

namespace {
class Recorder : public ProgressListener {
 public:
  void update(const ProgressSnapshot& p) override {
    last = p;
    ++updates;
  }
  void finish(const ProgressSnapshot& p, bool ok) override {
    last = p;
    finished = true;
    success = ok;
  }
  ProgressSnapshot last;
  int updates = 0;
  bool finished = false, success = false;
};

int all_ranks(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}
}  // namespace

TEST(MPI, ProgressOfEveryRankReachesRankZero) {
  mpi::Comm comm = mpi::Comm::world();
  const std::uint64_t per_rank = 1000;
  Recorder recorder;
  {
    mpi::RunMonitor monitor(comm, "merge", per_rank * comm.size(), &recorder, 0.0);
    for (int i = 0; i < 10; ++i) {
      monitor.add(per_rank / 10);
      EXPECT_FALSE(monitor.stop_requested());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    monitor.finish(false);
  }
  int ok = 1;
  if (comm.is_root()) {
    ok &= recorder.finished && recorder.success;
    ok &= recorder.last.done_bytes == per_rank * comm.size();
    ok &= recorder.last.total_bytes == per_rank * comm.size();
    ok &= recorder.last.ranks_finished == comm.size();
    ok &= recorder.last.phase == "merge";
  }
  EXPECT_EQ(all_ranks(ok), 1) << "rank 0 saw " << recorder.last.done_bytes << " bytes from "
                              << recorder.last.ranks_finished << " finished ranks";
}

TEST(MPI, AFailingRankStopsTheOthersPromptly) {
  mpi::Comm comm = mpi::Comm::world();
  // One rank has no other to stop: it would only run the 20 s of work below.
  if (comm.size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const int failing = comm.size() - 1;
  Recorder recorder;
  int iterations = 0;
  bool stopped = false;
  const auto start = std::chrono::steady_clock::now();
  {
    mpi::RunMonitor monitor(comm, "merge", 1u << 30, &recorder);
    if (comm.rank() == failing) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      monitor.finish(true);
    } else {
      // "Work" that would take 20 s unless stopped.
      while (iterations < 20000) {
        if (monitor.stop_requested()) {
          stopped = true;
          break;
        }
        monitor.add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++iterations;
      }
      monitor.finish(false);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int ok = 1;
  if (comm.rank() != failing) ok &= stopped;
  ok &= seconds < 10;
  if (comm.is_root()) ok &= recorder.finished && !recorder.success;
  EXPECT_EQ(all_ranks(ok), 1) << "rank " << comm.rank() << " stopped=" << stopped << " after "
                              << iterations << " iterations, " << seconds << " s";
}
