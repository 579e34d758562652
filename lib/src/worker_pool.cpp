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

void WorkerPool::for_each(std::size_t items, const std::function<void(int, std::size_t)>& fn) {
  if (items == 0) return;
  Batch batch;
  batch.fn = &fn;
  batch.items = items;
  if (size_ > 1 && items > 1) {
    {
      std::lock_guard lock(mutex_);
      batch_ = &batch;
      ++generation_;
    }
    start_cv_.notify_all();
  }
  work_on(batch, 0);
  {
    // Helpers that wake from now on find no batch; wait only for those already working on it.
    std::unique_lock lock(mutex_);
    batch_ = nullptr;
    done_cv_.wait(lock, [this] { return batch_workers_ == 0; });
  }
  if (batch.error) std::rethrow_exception(batch.error);
}

void WorkerPool::work_on(Batch& batch, int worker) {
  for (std::size_t item; !batch.failed && (item = batch.next++) < batch.items;) {
    try {
      (*batch.fn)(worker, item);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!batch.error) batch.error = std::current_exception();
      batch.failed = true;
    }
  }
}

void WorkerPool::loop(int worker) {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(int)>* task = nullptr;
    Batch* batch = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
      batch = batch_;
      if (batch) ++batch_workers_;
    }
    if (batch) {
      work_on(*batch, worker);
      std::lock_guard lock(mutex_);
      if (--batch_workers_ == 0) done_cv_.notify_all();
      continue;
    }
    if (!task) continue;  // woken for a for_each that was over before this thread looked
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
