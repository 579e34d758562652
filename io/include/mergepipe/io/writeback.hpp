#pragma once
// Starts the kernel's writeback of output ranges as soon as they are written, on a thread of its
// own (sync_file_range may block while the device queue is full). Without it a merge that writes
// less than the dirty-page threshold leaves its whole output in the page cache until the final
// fsync, which then writes it all after the reads are done instead of alongside them.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

class WritebackStarter {
 public:
  WritebackStarter();
  ~WritebackStarter();  // waits for the queued requests
  WritebackStarter(const WritebackStarter&) = delete;
  WritebackStarter& operator=(const WritebackStarter&) = delete;

  // `length` bytes at `offset` of `path` were just written: start writing them back. Best
  // effort: failures are ignored (the final fsync reports real write errors).
  void start(const std::string& path, std::uint64_t offset, std::uint64_t length);

 private:
  struct Range {
    std::string path;
    std::uint64_t offset, length;
  };
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Range> queue_;
  bool stopping_ = false;
  std::map<std::string, File> files_;  // used by the thread only
  std::thread thread_;
};

}  // namespace mergepipe::io
