#pragma once
// BlockReader over checkpoint folders: positioned reads of exactly the requested byte ranges,
// with read-ahead disabled (POSIX_FADV_RANDOM) so the page cache holds only what was asked for
// and the budget can be checked from outside the process.
#include <memory>
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

class CheckpointBlockReader : public BlockReader {
 public:
  // `experts[k]` is expert k in plan order. Opens every shard read-only.
  CheckpointBlockReader(const CheckpointLocation& base, const std::vector<CheckpointLocation>& experts,
                        ByteCounters& counters);
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin, std::span<std::byte> dst) override;

 private:
  struct Opened {
    const CheckpointLocation* location;
    std::vector<File> files;
  };
  Opened open(const CheckpointLocation& location);

  Opened base_;
  std::vector<Opened> experts_;
  ByteCounters& counters_;
};

}  // namespace mergepipe::io
