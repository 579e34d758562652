#include "mergepipe/io/writeback.hpp"

#include <fcntl.h>

#include "mergepipe/error.hpp"
#include "mergepipe/thread_name.hpp"

namespace mergepipe::io {

WritebackStarter::WritebackStarter()
    : thread_([this] {
        name_this_thread("mp-writeback");
        loop();
      }) {}

WritebackStarter::~WritebackStarter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WritebackStarter::start(const std::string& path, std::uint64_t offset, std::uint64_t length) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({path, offset, length});
  }
  cv_.notify_one();
}

void WritebackStarter::loop() {
  for (;;) {
    Range r;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    auto it = files_.find(r.path);
    if (it == files_.end()) {
      try {
        it = files_.emplace(r.path, File(r.path, File::Mode::kRead)).first;
      } catch (const Error&) {
        continue;
      }
    }
    (void)::sync_file_range(it->second.fd(), static_cast<off64_t>(r.offset),
                            static_cast<off64_t>(r.length), SYNC_FILE_RANGE_WRITE);
  }
}

}  // namespace mergepipe::io
