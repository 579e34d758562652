#pragma once
// A fixed set of threads that run one function together and return (fork-join). The calling
// thread takes part as worker 0, so a pool of 1 starts no thread at all.
#include <condition_variable>
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

 private:
  void loop(int worker);

  int size_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  unsigned long generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace mergepipe
