#include "mergepipe/io/async_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>

#include "mergepipe/error.hpp"
#include "mergepipe/thread_name.hpp"

namespace mergepipe::io {

AsyncFileWriter::AsyncFileWriter(const std::vector<std::string>& paths, std::size_t buffers,
                                 std::uint64_t flush_every, OutputIo output_io)
    : flush_every_(flush_every), free_(std::max<std::size_t>(1, buffers)) {
  for (const auto& p : paths) files_.emplace_back(p, File::Mode::kReadWrite);
  if (output_io == OutputIo::kDirect)
    for (const auto& p : paths) direct_files_.push_back(File::open_direct_write(p));
  thread_ = std::thread([this] {
    name_this_thread("mp-write");
    loop();
  });
  if (flush_every_ > 0) {
    flusher_ = std::thread([this] {
      name_this_thread("mp-flush");
      flush_loop();
    });
  }
}

AsyncFileWriter::~AsyncFileWriter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
    unflushed_ = 0;  // abandoned output: no last flush
  }
  cv_.notify_all();
  thread_.join();
  stop_flusher();
}

void AsyncFileWriter::stop_flusher() {
  {
    std::lock_guard lock(mutex_);
    flusher_stopping_ = true;
  }
  cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

std::uint64_t AsyncFileWriter::background_flushes() const {
  std::lock_guard lock(mutex_);
  return flushes_;
}

std::uint64_t AsyncFileWriter::direct_bytes() const {
  std::lock_guard lock(mutex_);
  return direct_bytes_;
}

void AsyncFileWriter::rethrow_if_failed() {
  if (error_) std::rethrow_exception(error_);
}

void AsyncFileWriter::write(std::size_t file, std::uint64_t offset,
                            std::span<const std::byte> bytes) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return error_ || !free_.empty(); });
  rethrow_if_failed();
  Job job{file, offset, 0, std::move(free_.back())};
  free_.pop_back();
  lock.unlock();
  const std::size_t lead = offset % kDirectAlignment;
  job.size = bytes.size();
  job.bytes.reserve(lead + bytes.size());
  if (!bytes.empty()) std::memcpy(job.bytes.data() + lead, bytes.data(), bytes.size());
  lock.lock();
  queue_.push_back(std::move(job));
  ++in_flight_;
  cv_.notify_all();
}

void AsyncFileWriter::finish() {
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return error_ || in_flight_ == 0; });
  }
  stop_flusher();  // a flush it owes runs first: it is most of what the final one would wait for
  {
    std::lock_guard lock(mutex_);
    rethrow_if_failed();
  }
  for (const File& f : files_) {
    if (::fdatasync(f.fd()) != 0)
      throw IoError(f.path() + ": fdatasync failed: " + std::strerror(errno));
  }
}

void AsyncFileWriter::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      write_job(job);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      unflushed_ += job.size;
      free_.push_back(std::move(job.bytes));
      --in_flight_;
    }
    cv_.notify_all();
  }
}

void AsyncFileWriter::write_job(const Job& job) {
  const File& f = files_.at(job.file);
  const std::size_t lead = job.offset % kDirectAlignment;
  const std::byte* data = job.bytes.data() + lead;
  auto buffered = [&](std::uint64_t begin, std::uint64_t end) {
    if (begin >= end) return;
    f.write_at(begin, std::span(data + (begin - job.offset), end - begin));
    // Best effort: start the writeback now; the final fdatasync reports real errors.
    (void)::sync_file_range(f.fd(), static_cast<off64_t>(begin), static_cast<off64_t>(end - begin),
                            SYNC_FILE_RANGE_WRITE);
  };
  const std::uint64_t end = job.offset + job.size;
  const std::uint64_t pages_begin =
      (job.offset + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  const std::uint64_t pages_end = end / kDirectAlignment * kDirectAlignment;
  if (direct_files_.empty() || !direct_files_.at(job.file).is_open() || pages_begin >= pages_end) {
    buffered(job.offset, end);
    return;
  }
  // The partial pages go through the cache: a neighbouring range (perhaps another rank's) fills
  // the rest of them, and a direct write would have to read-modify-write the whole page.
  buffered(job.offset, pages_begin);
  const std::span pages(data + (pages_begin - job.offset), pages_end - pages_begin);
  if (direct_files_[job.file].write_direct_at(pages_begin, pages)) {
    std::lock_guard lock(mutex_);
    direct_bytes_ += pages.size();
  } else {
    buffered(pages_begin, pages_end);  // refused (EINVAL): a larger logical block size
  }
  buffered(pages_end, end);
}

void AsyncFileWriter::flush_loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return flusher_stopping_ || unflushed_ >= flush_every_; });
      if (unflushed_ < flush_every_) return;  // stopping, nothing owed
      unflushed_ = 0;
    }
    for (const File& f : files_) {
      // Linux reports a writeback error to one fsync per open file only: it is kept here, or
      // the final fdatasync would succeed on output that never reached storage.
      if (::fdatasync(f.fd()) != 0) {
        const int err = errno;
        std::lock_guard lock(mutex_);
        if (!error_)
          error_ = std::make_exception_ptr(
              IoError(f.path() + ": fdatasync failed: " + std::strerror(err)));
      }
    }
    {
      std::lock_guard lock(mutex_);
      ++flushes_;
    }
    cv_.notify_all();
  }
}

}  // namespace mergepipe::io
