#pragma once
// Positioned writes of output ranges on a thread of their own, so the thread that merges never
// waits for the page cache (allocation, reclaim, dirty throttling) or the device. Each range is
// copied into one of a few buffers (the caller reuses its own at once; a full set of buffers
// makes write() wait: bounded memory), written with pwrite, and its writeback started at once
// (sync_file_range), so the output reaches storage alongside the reads instead of in one final
// fsync. A write error is reported by the next write() or by finish().
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

class AsyncFileWriter {
 public:
  // Opens every path for writing (they must exist; nothing is truncated).
  explicit AsyncFileWriter(const std::vector<std::string>& paths, std::size_t buffers = 4);
  ~AsyncFileWriter();  // after an error or without finish(): drops what is still queued
  AsyncFileWriter(const AsyncFileWriter&) = delete;
  AsyncFileWriter& operator=(const AsyncFileWriter&) = delete;

  void write(std::size_t file, std::uint64_t offset, std::span<const std::byte> bytes);
  // Waits for every queued write, then fdatasyncs every file. Throws the first write error.
  void finish();

 private:
  struct Job {
    std::size_t file = 0;
    std::uint64_t offset = 0;
    std::vector<std::byte> bytes;
  };
  void loop();
  void rethrow_if_failed();  // under mutex_

  std::vector<File> files_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<std::vector<std::byte>> free_;  // spare buffers
  std::size_t in_flight_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mergepipe::io
