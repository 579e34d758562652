#pragma once
// A fixed set of threads that run one function together and return (fork-join). The calling
// thread takes part as worker 0, so a pool of 1 starts no thread at all.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mergepipe {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const noexcept { return size_; }
  // Runs fn(worker) for worker = 0..size()-1 concurrently; rethrows the first exception.
  void run(const std::function<void(int)>& fn);

  // Runs fn(worker, item) once for each item in [0, items), items claimed in order by whichever
  // worker is free (worker: its index, for per-worker scratch); returns when every claimed item
  // is done, and rethrows the first exception (no item is claimed after it). Unlike run(), it
  // does not wait for a worker that wakes after every item is claimed: on a loaded machine a
  // woken thread can wait for a core longer than the whole batch takes, and the caller works
  // through the items meanwhile.
  void for_each(std::size_t items, const std::function<void(int, std::size_t)>& fn);

 private:
  struct Batch {
    const std::function<void(int, std::size_t)>* fn = nullptr;
    std::size_t items = 0;
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;  // under mutex_
  };
  void loop(int worker);
  void work_on(Batch& batch, int worker);

  int size_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  Batch* batch_ = nullptr;  // the for_each in progress, while its items may still be claimed
  int batch_workers_ = 0;   // helpers inside work_on() of batch_
  unsigned long generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace mergepipe
