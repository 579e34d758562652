#include "mergepipe/worker_pool.hpp"

#include <algorithm>

#include "mergepipe/thread_name.hpp"

namespace mergepipe {

WorkerPool::WorkerPool(int threads) : size_(std::max(1, threads)) {
  for (int w = 1; w < size_; ++w)
    threads_.emplace_back([this, w] {
      name_this_thread("mp-worker");
      loop(w);
    });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard lock(mutex_);
    task_ = &fn;
    pending_ = size_ - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::loop(int worker) {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr err;
    try {
      (*task)(worker);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

}  // namespace mergepipe
