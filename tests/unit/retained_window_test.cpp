// RetainedWindow: ranges read once by in-place requests that honour the alignment contract,
// served afterwards without copies; what it does not hold is an error, not a silent read.
#include "mergepipe/retained_window.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe {
namespace {

// Byte i of tensor t of source s, wherever it is read from.
std::byte byte_at(int source, std::uint32_t tensor, std::uint64_t i) {
  return static_cast<std::byte>(
      (i * 7 + tensor * 31 + static_cast<std::uint64_t>(source + 1) * 101) % 251);
}

// A reader whose tensors start `phase` bytes into a page, as tensors in a safetensors file do,
// and whose in-place reads write whole pages, as an O_DIRECT read does; it fails the test
// when the caller's memory breaks the contract.
class PagedReader : public BlockReader {
 public:
  std::atomic<int> in_place_reads{0}, plain_reads{0};
  std::uint64_t largest_request = 0;
  std::uint64_t fail_at = UINT64_MAX;  // tensor byte whose read throws

  std::uint64_t in_place_phase(SourceId, std::uint32_t tensor) const override {
    return 1000 + tensor * 517;  // may exceed a page: only the remainder counts
  }
  void read(SourceId source, std::uint32_t tensor, std::uint64_t begin,
            std::span<std::byte> dst) override {
    ++plain_reads;
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = byte_at(source.expert, tensor, begin + i);
  }
  void read_in_place(SourceId source, std::uint32_t tensor, std::uint64_t begin,
                     std::span<std::byte> dst) override {
    ++in_place_reads;
    if (begin <= fail_at && fail_at < begin + dst.size()) throw IoError("disk on fire");
    const std::uint64_t head = (in_place_phase(source, tensor) + begin) % kInPlaceAlignment;
    std::byte* page = dst.data() - head;
    if (reinterpret_cast<std::uintptr_t>(page) % kInPlaceAlignment != 0)
      throw std::logic_error("in-place read into unaligned memory");
    const std::uint64_t pages = (head + dst.size() + kInPlaceAlignment - 1) / kInPlaceAlignment;
    // Whole pages, as the device writes them: the bytes around the range are the file's too.
    for (std::uint64_t i = 0; i < pages * kInPlaceAlignment; ++i) {
      const std::int64_t at =
          static_cast<std::int64_t>(begin + i) - static_cast<std::int64_t>(head);
      page[i] =
          at < 0 ? std::byte{0} : byte_at(source.expert, tensor, static_cast<std::uint64_t>(at));
    }
    largest_request = std::max<std::uint64_t>(largest_request, dst.size());
  }
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t begin,
                       std::uint64_t length) const override {
    return "paged source " + std::to_string(source.expert) + " tensor " + std::to_string(tensor) +
           " bytes " + std::to_string(begin) + ".." + std::to_string(begin + length);
  }
};

bool holds_the_bytes(RetainedWindow& window, const HeldRange& r) {
  const std::byte* p = window.view(r.source, r.tensor, r.byte_begin, r.length);
  for (std::uint64_t i = 0; i < r.length; ++i)
    if (p[i] != byte_at(r.source.expert, r.tensor, r.byte_begin + i)) return false;
  return true;
}

TEST(RetainedWindow, HoldsEveryRangeExactlyAcrossSplitRequests) {
  PagedReader from;
  // Neighbouring ranges of one tensor, several sources and tensors, odd sizes, an empty range.
  const std::vector<HeldRange> ranges = {{SourceId{SourceId::kBase}, 0, 0, 70000},
                                         {SourceId{0}, 0, 0, 70000},
                                         {SourceId{1}, 0, 0, 70000},
                                         {SourceId{0}, 0, 70000, 12345},
                                         {SourceId{1}, 3, 4093, 1},
                                         {SourceId{SourceId::kBase}, 2, 99999, 4096 * 5},
                                         {SourceId{0}, 5, 10, 0}};
  RetainedWindow window;
  window.fill(from, ranges, 3, 16384);
  EXPECT_GE(window.capacity(), RetainedWindow::footprint(from, ranges));
  EXPECT_LE(from.largest_request, 16384u);
  EXPECT_GT(from.in_place_reads.load(), static_cast<int>(ranges.size()));  // split
  for (const HeldRange& r : ranges) EXPECT_TRUE(holds_the_bytes(window, r)) << r.byte_begin;
  // Part of a range, and a copy of it.
  std::vector<std::byte> copy(100);
  window.read(SourceId{0}, 0, 70000 + 5000, copy);
  for (std::size_t i = 0; i < copy.size(); ++i) EXPECT_EQ(copy[i], byte_at(0, 0, 75000 + i));
  EXPECT_EQ(from.plain_reads.load(), 0);
}

TEST(RetainedWindow, BytesItDoesNotHoldAreAnErrorNamingThem) {
  PagedReader from;
  RetainedWindow window;
  window.fill(from, {{SourceId{0}, 1, 100, 1000}}, 2, 1 << 20);
  // Straddling the end, another tensor, another source.
  for (const auto& [source, tensor, begin, length] :
       std::vector<HeldRange>{{SourceId{0}, 1, 1000, 101},
                              {SourceId{0}, 2, 100, 10},
                              {SourceId{1}, 1, 100, 10},
                              {SourceId{0}, 1, 99, 2}}) {
    try {
      window.view(source, tensor, begin, length);
      FAIL() << "viewed bytes it does not hold";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("paged source"), std::string::npos) << e.what();
    }
  }
}

TEST(RetainedWindow, RefillReplacesTheRangesAndKeepsOrGrowsTheMemory) {
  PagedReader from;
  RetainedWindow window;
  const std::vector<HeldRange> small = {{SourceId{0}, 0, 0, 5000}};
  const std::vector<HeldRange> large = {{SourceId{1}, 4, 0, 300000}, {SourceId{0}, 4, 0, 300000}};
  window.fill(from, large, 2, 65536);
  const std::uint64_t grown = window.capacity();
  window.fill(from, small, 2, 65536);
  EXPECT_EQ(window.capacity(), grown);  // kept, not shrunk
  EXPECT_TRUE(holds_the_bytes(window, small[0]));
  EXPECT_THROW(window.view(SourceId{1}, 4, 0, 10), IoError);
}

TEST(RetainedWindow, FillsUpToAReservedSizeUseTheReservedMemory) {
  // The memory reserved before the first fill is the memory every fill up to that size uses:
  // no regrowth (which would free it and fault in new pages) and the same address.
  PagedReader from;
  RetainedWindow window;
  const std::vector<HeldRange> small = {{SourceId{0}, 0, 0, 5000}};
  const std::vector<HeldRange> large = {{SourceId{1}, 4, 0, 300000}, {SourceId{0}, 4, 0, 300000}};
  window.reserve(RetainedWindow::footprint(from, large));
  const std::uint64_t reserved = window.capacity();
  EXPECT_GE(reserved, RetainedWindow::footprint(from, large));
  window.fill(from, small, 2, 65536);
  const std::byte* first = window.view(SourceId{0}, 0, 0, 1);
  window.fill(from, large, 2, 65536);
  EXPECT_EQ(window.capacity(), reserved);
  EXPECT_TRUE(holds_the_bytes(window, large[0]));
  EXPECT_TRUE(holds_the_bytes(window, large[1]));
  window.fill(from, small, 2, 65536);
  EXPECT_EQ(window.view(SourceId{0}, 0, 0, 1), first);
}

TEST(RetainedWindow, AFailedReadIsRethrownAndLeavesNothingHeld) {
  PagedReader from;
  RetainedWindow window;
  window.fill(from, {{SourceId{0}, 0, 0, 4000}}, 2, 4096);
  from.fail_at = 150000;
  try {
    window.fill(from, {{SourceId{0}, 0, 0, 400000}}, 4, 8192);
    FAIL() << "the failed read was swallowed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  EXPECT_THROW(window.view(SourceId{0}, 0, 0, 10), IoError);
}

// A block stream over a window shows the held bytes instead of copying them.
TEST(RetainedWindow, BlockStreamsViewTheHeldBytes) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kF32, {1000}}};
  const Blocking blocking = make_blocking(tensors, 1024);
  PagedReader from;
  std::vector<HeldRange> ranges;
  for (int s = SourceId::kBase; s < 2; ++s) ranges.push_back({SourceId{s}, 0, 0, 4000});
  RetainedWindow window;
  window.fill(from, ranges, 2, 1 << 20);
  std::vector<std::uint32_t> blocks(blocking.blocks.size());
  for (std::uint32_t b = 0; b < blocks.size(); ++b) blocks[b] = b;
  StreamOptions options;
  options.slice_bytes = 512;
  BlockStream stream(blocking, blocks, 2, window, options);
  double waited = 0;
  std::uint64_t slices = 0;
  while (auto loaded = stream.next(waited)) {
    const Block& blk = blocking.blocks[loaded->block];
    const std::uint64_t at = blk.byte_begin + loaded->byte_offset;
    EXPECT_EQ(loaded->base.data(),
              window.view(SourceId{SourceId::kBase}, 0, at, loaded->byte_length));
    EXPECT_EQ(loaded->experts[1].data(), window.view(SourceId{1}, 0, at, loaded->byte_length));
    EXPECT_EQ(loaded->experts[0][3], byte_at(0, 0, at + 3));
    ++slices;
    stream.recycle(std::move(loaded));
  }
  EXPECT_EQ(slices, 8u);  // 4000 bytes in 512-byte slices
  EXPECT_EQ(from.plain_reads.load(), 0);
}

}  // namespace
}  // namespace mergepipe
