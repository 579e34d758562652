#pragma once
// Reads blocks ahead of the code that consumes them: for each block of an ordered list, the base
// block and the wanted expert blocks, on several I/O threads so that several requests are in
// flight at once (one request at a time leaves the device idle between requests, and a single
// stream cannot fill a parallel file system or an NVMe queue).
//
// A block may be handed out in slices of at most `slice_bytes` (the catalog's blocks are the
// unit of planning, 4 MiB by default; K + 1 of them are far larger than the CPU caches, so the
// bytes a read copies would be evicted before the merge reads them again; a slice of every
// source fits). At most `depth` slices wait ready ahead of the consumer, so memory stays
// (depth + 1) × (experts + 1) × slice size whatever the model size. Slices are handed out in
// list order, each block's slices in element order.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mergepipe/blocking.hpp"

namespace mergepipe {

// Which checkpoint a read is for: the base or expert k (plan order).
struct SourceId {
  static constexpr int kBase = -1;
  int expert = kBase;
};

// Page size of in-place reads: O_DIRECT needs buffer, offset and length aligned to the device's
// logical block, 512 B or 4 KiB.
inline constexpr std::uint64_t kInPlaceAlignment = 4096;

class BlockReader {
 public:
  virtual ~BlockReader() = default;
  // Reads dst.size() bytes of tensor `tensor` of `source`, starting `byte_begin` bytes into the
  // tensor. Called concurrently from several I/O threads: must be thread-safe.
  virtual void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                    std::span<std::byte> dst) = 0;
  // A hint that these bytes will be read soon: a storage-backed reader starts fetching them in
  // the background. Thread-safe; may take a while (call it off the critical path).
  virtual void prefetch(SourceId /*source*/, std::uint32_t /*tensor*/, std::uint64_t /*byte_begin*/,
                        std::uint64_t /*length*/) {}
  // Bytes this reader already holds in memory, used where they are instead of copied: the
  // address of `length` bytes of the tensor from `byte_begin`, valid as long as the reader, or
  // null when it does not hold them (then read() them).
  virtual std::byte* view(SourceId /*source*/, std::uint32_t /*tensor*/,
                          std::uint64_t /*byte_begin*/, std::uint64_t /*length*/) {
    return nullptr;
  }
  // In-place reads, for memory the caller keeps (RetainedWindow): where tensor byte 0 lies
  // within its file's kInPlaceAlignment-sized pages (0 for readers without files) ...
  virtual std::uint64_t in_place_phase(SourceId /*source*/, std::uint32_t /*tensor*/) const {
    return 0;
  }
  // ... and read() into `dst` whose surroundings out to those page boundaries the reader may
  // overwrite: dst.data() - (phase + byte_begin) % kInPlaceAlignment is aligned to it, and the
  // memory up to the page boundary after the last byte is the caller's. A storage reader can
  // then have the device write there directly (O_DIRECT) instead of copying from a scratch.
  virtual void read_in_place(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                             std::span<std::byte> dst) {
    read(source, tensor, byte_begin, dst);
  }
  // Where those bytes live, for error messages ("dir/model.safetensors bytes a..b").
  virtual std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                               std::uint64_t length) const = 0;
};

// A byte buffer that keeps its capacity and never zero-fills: every byte is overwritten by a
// read before use, and zeroing (plus the page faults of fresh memory) cost as much as a copy.
// It can instead show bytes held elsewhere (BlockReader::view) without owning or copying them.
class ByteBuffer {
 public:
  std::byte* data() noexcept { return view_ ? view_ : data_.get(); }
  const std::byte* data() const noexcept { return view_ ? view_ : data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::byte& operator[](std::size_t i) noexcept { return data()[i]; }
  const std::byte& operator[](std::size_t i) const noexcept { return data()[i]; }
  // New size of its own memory (a view ends); the contents are unspecified afterwards when it
  // grows past the capacity.
  void resize(std::size_t n) {
    view_ = nullptr;
    if (n > capacity_) {
      data_.reset(new std::byte[n]);
      capacity_ = n;
    }
    size_ = n;
  }
  // Shows n bytes at `bytes` (which must outlive the view) instead of its own memory.
  void show(std::byte* bytes, std::size_t n) noexcept {
    view_ = bytes;
    size_ = n;
  }
  operator std::span<std::byte>() noexcept { return {data(), size_}; }
  operator std::span<const std::byte>() const noexcept { return {data(), size_}; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::byte* view_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

// Raw bytes of one slice of a block: the base and every wanted expert.
struct LoadedBlock {
  std::uint32_t block = 0;
  std::uint64_t elem_offset = 0;  // first element of the slice, counted from the block's start
  std::uint64_t elem_count = 0;
  std::uint64_t byte_offset = 0;  // the same in bytes
  std::uint64_t byte_length = 0;
  bool first_slice = true, last_slice = true;
  ByteBuffer base;
  std::vector<ByteBuffer> experts;
  std::vector<char> present;  // per expert: read for this block
};

// Block buffers kept between streams (one per window of a full read, say), so their memory is
// allocated and faulted in once per run. Thread-safe.
class BlockPool {
 public:
  std::unique_ptr<LoadedBlock> take();
  void give(std::unique_ptr<LoadedBlock> block);

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<LoadedBlock>> blocks_;
};

struct StreamOptions {
  // Concurrent read requests. 0: no I/O threads, next() reads on the caller's thread; for a
  // reader that holds every byte in memory (views), where handing each view over from a thread
  // costs more than finding it (futex wake-ups on both sides for a map lookup).
  int io_threads = 4;
  int depth = 2;                  // slices read ahead of the consumer
  std::uint64_t slice_bytes = 0;  // 0: whole blocks
  // wanted(k, b): read expert k's block b. Must be pure (called from the I/O threads).
  std::function<bool(std::size_t, std::size_t)> wanted;
  // Where the stream takes its buffers from and returns them to (null: its own).
  BlockPool* pool = nullptr;
};

class BlockStream {
 public:
  BlockStream(const Blocking& blocking, std::vector<std::uint32_t> blocks, std::size_t experts,
              BlockReader& reader, StreamOptions options);
  ~BlockStream();
  BlockStream(const BlockStream&) = delete;
  BlockStream& operator=(const BlockStream&) = delete;

  // The next slice in list order, or nullptr after the last. Rethrows the first read error.
  // `waited` grows by the time spent waiting for the block.
  std::unique_ptr<LoadedBlock> next(double& waited);
  // Gives a consumed block's buffers back for reuse.
  void recycle(std::unique_ptr<LoadedBlock> block);

  std::uint64_t base_bytes() const;    // bytes read so far
  std::uint64_t expert_bytes() const;  // bytes read so far

 private:
  // A block whose reads are queued or running, in list order.
  struct Inflight {
    std::unique_ptr<LoadedBlock> block;
    int pending = 0;  // reads not finished yet
  };
  struct Piece {
    Inflight* owner;  // deque elements keep their address while others are pushed and popped
    int source;       // SourceId::expert
  };
  struct Unit {  // one slice of one block
    std::uint32_t block;
    std::uint64_t elem_offset, elem_count, byte_offset, byte_length;
    bool first, last;
  };
  void io_loop();
  bool can_schedule() const;  // under mutex_
  void schedule_next();       // under mutex_
  void read_piece(const Piece& piece);
  std::unique_ptr<LoadedBlock> read_next_here();  // next() without I/O threads

  const Blocking& blocking_;
  std::vector<Unit> units_;
  const std::size_t experts_;
  BlockReader& reader_;
  const StreamOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable io_cv_, ready_cv_;
  std::vector<std::unique_ptr<LoadedBlock>> free_;
  std::deque<Inflight> inflight_;
  std::deque<Piece> pieces_;
  std::size_t scheduled_ = 0;   // units scheduled so far
  std::size_t handed_out_ = 0;  // units handed to the consumer so far
  std::exception_ptr error_;
  bool stopping_ = false;
  std::uint64_t base_bytes_ = 0, expert_bytes_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace mergepipe
