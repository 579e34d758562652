#pragma once
// Positioned writes of output ranges on a thread of their own, so the thread that merges never
// waits for the page cache (allocation, reclaim, dirty throttling) or the device. Each range is
// copied into one of a few buffers (the caller reuses its own at once; a full set of buffers
// makes write() wait: bounded memory), at the same offset modulo 4 KiB as in the file, so that
// with OutputIo::kDirect the range's whole pages go from that buffer to the device (O_DIRECT:
// no second copy into the page cache, no inode lock held across it against the other ranks'
// writes into the same shard) and only the partial pages at its ends through the cache. Cached
// bytes have their writeback started at once (sync_file_range), so the output reaches storage
// alongside the reads instead of in one final fsync. Every `flush_every` bytes written, a third
// thread fdatasyncs the files: on a virtual disk the final fdatasync otherwise waits for the host
// to flush everything written so far (0.5-0.7 s for a 1.5 GB output measured), after the reads
// are over. A write or flush error is reported by the next write() or by finish(). Where the
// file system refuses O_DIRECT, everything goes through the cache.
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
#include "mergepipe/io/output_io.hpp"

namespace mergepipe::io {

class AsyncFileWriter {
 public:
  static constexpr std::uint64_t kDefaultFlushEvery = std::uint64_t{64} << 20;

  // Opens every path for writing (they must exist; nothing is truncated). flush_every == 0: no
  // background fdatasync. OutputIo::kAuto is taken as kBuffered: resolve it first
  // (resolve_output_io).
  explicit AsyncFileWriter(const std::vector<std::string>& paths, std::size_t buffers = 4,
                           std::uint64_t flush_every = kDefaultFlushEvery,
                           OutputIo output_io = OutputIo::kBuffered);
  ~AsyncFileWriter();  // after an error or without finish(): drops what is still queued
  AsyncFileWriter(const AsyncFileWriter&) = delete;
  AsyncFileWriter& operator=(const AsyncFileWriter&) = delete;

  void write(std::size_t file, std::uint64_t offset, std::span<const std::byte> bytes);
  // Waits for every queued write and background flush, then fdatasyncs every file. Throws the
  // first write or flush error.
  void finish();
  // Background fdatasync rounds completed so far (each covers every file).
  std::uint64_t background_flushes() const;
  // Bytes written so far with O_DIRECT (the rest went through the page cache).
  std::uint64_t direct_bytes() const;

 private:
  struct Job {
    std::size_t file = 0;
    std::uint64_t offset = 0;
    std::size_t size = 0;
    AlignedBuffer bytes;  // the range starts at bytes.data() + offset % kDirectAlignment
  };
  void write_job(const Job& job);
  void loop();
  void flush_loop();
  void stop_flusher();
  void rethrow_if_failed();  // under mutex_

  std::vector<File> files_;
  std::vector<File> direct_files_;  // kDirect: the same files with O_DIRECT (closed: refused)
  const std::uint64_t flush_every_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<AlignedBuffer> free_;  // spare buffers
  std::size_t in_flight_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::uint64_t unflushed_ = 0;  // bytes written since the last background flush began
  std::uint64_t flushes_ = 0;
  std::uint64_t direct_bytes_ = 0;
  bool flusher_stopping_ = false;
  std::thread thread_;
  std::thread flusher_;
};

}  // namespace mergepipe::io
