#pragma once
// Byte ranges of the inputs read once into memory and then served from there, to the threshold
// scan and the merge of a full-read TIES window, which would otherwise each read the window
// (the second time from the page cache). Reading each byte once, in large requests, into
// memory that is kept from window to window lets a storage reader use O_DIRECT: on the 2-core
// test VM the kernel time of filling, copying out of and reclaiming the page cache was half the
// CPU time of a full-read TIES, on the cores its merge needed.
//
// fill() reads every range on several threads in requests of at most `request_bytes`, each
// placed where the reader can have the device write it directly (BlockReader::read_in_place);
// afterwards view() hands out the bytes without a copy. Memory grows to the largest fill (or
// what reserve() asked for) and is kept, so it is faulted in once per run.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/huge_page_buffer.hpp"

namespace mergepipe {

struct HeldRange {
  SourceId source;
  std::uint32_t tensor = 0;
  std::uint64_t byte_begin = 0, length = 0;  // within the tensor
};

class RetainedWindow final : public BlockReader {
 public:
  // Memory that fill() of `ranges` from `from` needs.
  static std::uint64_t footprint(const BlockReader& from, const std::vector<HeldRange>& ranges);

  // Replaces what the window holds with `ranges` read from `from`, which must outlive the
  // window's use (describe() names its files). Rethrows the first read error, and then holds
  // nothing.
  void fill(BlockReader& from, const std::vector<HeldRange>& ranges, int threads,
            std::uint64_t request_bytes);
  std::uint64_t capacity() const noexcept { return memory_.capacity(); }
  // Makes the memory at least `bytes` now, so that fills up to that size never regrow it (a
  // regrowth frees the old memory and faults in all of the new).
  void reserve(std::uint64_t bytes);

  // Only bytes inside one held range can be read or viewed; anything else is an error here.
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override;
  std::byte* view(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                  std::uint64_t length) override;
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override;

 private:
  struct Held {
    std::uint64_t byte_begin, length;
    std::byte* data;
  };
  const Held* find(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                   std::uint64_t length) const;

  HugePageBuffer memory_;
  std::map<std::pair<int, std::uint32_t>, std::vector<Held>> held_;  // sorted by byte_begin
  BlockReader* from_ = nullptr;
};

}  // namespace mergepipe
