#pragma once
// BlockReader over checkpoint folders: positioned reads of exactly the requested byte ranges.
// Expert files get read-ahead disabled (POSIX_FADV_RANDOM) so the page cache holds only what the
// plan admitted and the budget can be checked from outside the process; the base, and the
// experts of a full read, are read whole, so they get sequential read-ahead, which keeps the
// device busy between our requests.
#include <memory>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

class CheckpointBlockReader : public BlockReader {
 public:
  // `experts[k]` is expert k in plan order. Opens every shard read-only.
  enum class ExpertAccess { kExactRanges, kWholeFiles };
  CheckpointBlockReader(const CheckpointLocation& base,
                        const std::vector<CheckpointLocation>& experts, ByteCounters& counters,
                        ExpertAccess access = ExpertAccess::kExactRanges);
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override;
  void prefetch(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                std::uint64_t length) override;
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override;

 private:
  struct Opened {
    const CheckpointLocation* location;
    std::vector<File> files;
  };
  Opened open(const CheckpointLocation& location, bool sequential);
  const Opened& opened(SourceId source) const;

  Opened base_;
  std::vector<Opened> experts_;
  ByteCounters& counters_;
};

}  // namespace mergepipe::io
