#include "mergepipe/worker_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mergepipe {
namespace {

using namespace std::chrono_literals;

TEST(WorkerPool, ForEachRunsEveryItemOnceOnAValidWorker) {
  for (int threads : {1, 2, 4}) {
    WorkerPool pool(threads);
    for (std::size_t items : {0u, 1u, 7u, 1000u}) {
      std::vector<std::atomic<int>> runs(items);
      std::atomic<int> bad_worker{0};
      pool.for_each(items, [&](int worker, std::size_t item) {
        if (worker < 0 || worker >= pool.size()) ++bad_worker;
        ++runs[item];
      });
      for (std::size_t i = 0; i < items; ++i)
        EXPECT_EQ(runs[i].load(), 1)
            << "threads " << threads << " items " << items << " item " << i;
      EXPECT_EQ(bad_worker.load(), 0);
    }
  }
}

TEST(WorkerPool, ForEachSharesItemsWithTheOtherWorkers) {
  // Item 0 waits for item 1 to start: only a second worker can run it meanwhile.
  WorkerPool pool(2);
  std::atomic<bool> second_started{false};
  std::atomic<bool> overlapped{false};
  pool.for_each(2, [&](int, std::size_t item) {
    if (item == 1) {
      second_started = true;
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!second_started && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    overlapped = second_started.load();
  });
  EXPECT_TRUE(overlapped);
}

TEST(WorkerPool, ForEachRethrowsTheFirstErrorAndStopsClaiming) {
  WorkerPool pool(2);
  std::atomic<int> after{0};
  EXPECT_THROW(pool.for_each(10000,
                             [&](int, std::size_t item) {
                               if (item == 3) throw std::runtime_error("item 3");
                               if (item > 3) ++after;
                               // Every item takes a while: the first throw of a process can
                               // take milliseconds to unwind, in which instant items would let
                               // the other worker run thousands (seen in CI).
                               std::this_thread::sleep_for(1ms);
                             }),
               std::runtime_error);
  // Items already claimed may finish; the rest are not started (all 10000 would take 5 s).
  EXPECT_LT(after.load(), 100);
  // The pool is usable afterwards.
  std::atomic<int> count{0};
  pool.for_each(50, [&](int, std::size_t) { ++count; });
  EXPECT_EQ(count.load(), 50);
}

TEST(WorkerPool, RunAndForEachAlternate) {
  // A helper woken for a for_each that is already over must not run (or miss) the next run().
  WorkerPool pool(3);
  for (int round = 0; round < 300; ++round) {
    std::atomic<int> items{0};
    pool.for_each(static_cast<std::size_t>(round % 5), [&](int, std::size_t) { ++items; });
    ASSERT_EQ(items.load(), round % 5);
    std::vector<std::atomic<int>> per_worker(3);
    pool.run([&](int worker) { ++per_worker[static_cast<std::size_t>(worker)]; });
    for (int w = 0; w < 3; ++w) ASSERT_EQ(per_worker[static_cast<std::size_t>(w)].load(), 1);
  }
}

}  // namespace
}  // namespace mergepipe
