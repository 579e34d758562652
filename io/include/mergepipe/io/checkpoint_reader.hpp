#pragma once
// BlockReader over checkpoint folders: positioned reads of exactly the requested byte ranges.
// Expert files get read-ahead disabled (POSIX_FADV_RANDOM) so the page cache holds only what the
// plan admitted and the budget can be checked from outside the process; the base, and the
// experts of a full read, are read whole, so they get sequential read-ahead, which keeps the
// device busy between our requests.
//
// Budgeted expert files (exact ranges) can instead be read around the page cache (O_DIRECT:
// InputIo::kDirect, or kAuto on a cold file); whole-file reads keep the cache's sequential
// read-ahead, measured faster. The device writes straight into our buffer, so nothing is read
// ahead past what the plan admitted, and no CPU goes to filling, copying out of and reclaiming
// page cache (on the 2-core test VM a cold buffered read costs about 2 core-seconds per GB in
// the kernel; a direct one costs the copy out of the aligned scratch only).
#include <memory>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/input_io.hpp"

namespace mergepipe::io {

class CheckpointBlockReader : public BlockReader {
 public:
  // `experts[k]` is expert k in plan order. Opens every shard read-only.
  // kHeldWindows: the base and the experts are read in large ranges into memory that is kept
  // (RetainedWindow, held pieces), all through O_DIRECT as `input_io` says, none with
  // read-ahead. kExactRanges: the experts so, the base through the page cache with read-ahead.
  enum class ExpertAccess { kExactRanges, kWholeFiles, kHeldWindows };
  CheckpointBlockReader(const CheckpointLocation& base,
                        const std::vector<CheckpointLocation>& experts, ByteCounters& counters,
                        ExpertAccess access = ExpertAccess::kExactRanges,
                        InputIo input_io = InputIo::kBuffered);
  // Back to reading the base through the page cache, with read-ahead, as kExactRanges does: for
  // a reader opened kHeldWindows whose base bytes turn out not to be held after all.
  void stream_base_through_cache();
  // Shards read with O_DIRECT (the others go through the page cache); of the experts only.
  std::size_t direct_files() const;
  std::size_t direct_expert_files() const;
  std::size_t total_files() const;
  // Whether every shard is read through the page cache and was all there when opened (sampled):
  // each read is then a copy from memory.
  bool reads_from_memory() const noexcept { return reads_from_memory_; }
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override;
  void prefetch(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                std::uint64_t length) override;
  std::uint64_t in_place_phase(SourceId source, std::uint32_t tensor) const override;
  void read_in_place(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                     std::span<std::byte> dst) override;
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override;

 private:
  struct Opened {
    const CheckpointLocation* location;
    std::vector<File> files;
    std::vector<File> direct;  // per shard: open only when that shard is read with O_DIRECT
  };
  Opened open(const CheckpointLocation& location, bool sequential, InputIo input_io);
  const Opened& opened(SourceId source) const;
  // The shard and the file offset of a tensor's byte; InputError when the tensor has no place.
  std::pair<std::uint32_t, std::uint64_t> locate(const Opened& o, std::uint32_t tensor,
                                                 std::uint64_t byte_begin) const;

  bool reads_from_memory_ = true;  // cleared by open() at the first shard that is not
  Opened base_;
  std::vector<Opened> experts_;
  ByteCounters& counters_;
};

}  // namespace mergepipe::io
