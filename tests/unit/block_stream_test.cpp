// BlockStream: blocks come out in list order with exactly the wanted reads, whatever the number
// of I/O threads; errors reach the consumer; memory stays bounded; stopping early never hangs.
#include "mergepipe/block_stream.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "mergepipe/error.hpp"

using namespace mergepipe;

namespace {

// Bytes derived from (source, tensor, offset), so any misplaced read shows. Optionally slow and
// out of order (random per-read delays) to shake the scheduling.
class PatternReader : public BlockReader {
 public:
  std::atomic<int> reads{0};
  std::atomic<int> in_flight{0}, max_in_flight{0};
  int fail_on_read = -1;
  bool jitter = false;
  std::mutex mutex;
  std::set<std::pair<int, std::uint64_t>> seen;  // (source, tensor << 40 | offset)

  static std::byte value(int source, std::uint32_t tensor, std::uint64_t at) {
    return static_cast<std::byte>((source * 31 + tensor * 7 + at * 13) & 0xff);
  }
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override {
    const int n = reads++;
    const int now = ++in_flight;
    int prev = max_in_flight.load();
    while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {
    }
    if (jitter) std::this_thread::sleep_for(std::chrono::microseconds((n * 7919) % 400));
    --in_flight;
    if (n == fail_on_read) throw IoError("pattern: injected failure at read " + std::to_string(n));
    {
      std::lock_guard lock(mutex);
      EXPECT_TRUE(seen.insert({source.expert, (std::uint64_t{tensor} << 40) | byte_begin}).second)
          << "read twice";
    }
    for (std::size_t i = 0; i < dst.size(); ++i)
      dst[i] = value(source.expert, tensor, byte_begin + i);
  }
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override {
    return "pattern " + std::to_string(source.expert) + "/" + std::to_string(tensor) + "@" +
           std::to_string(byte_begin) + "+" + std::to_string(length);
  }
};

struct StreamFixture {
  std::vector<TensorInfo> tensors{
      {"a", DType::kBF16, {40, 16}}, {"b", DType::kF32, {300}}, {"c", DType::kBF16, {7, 9}}};
  Blocking blocking = make_blocking(tensors, 96);
  std::size_t experts = 5;
  bool wanted(std::size_t k, std::size_t b) const { return (k + 2 * b) % 3 != 0; }
};

}  // namespace

TEST(BlockStream, HandsOutBlocksInOrderWithExactlyTheWantedReads) {
  const StreamFixture s;
  for (int threads : {0, 1, 3, 8}) {
    for (int depth : {1, 4}) {
      PatternReader reader;
      reader.jitter = true;
      std::vector<std::uint32_t> list;
      for (std::uint32_t b = 0; b < s.blocking.blocks.size(); b += 2) list.push_back(b);
      for (std::uint32_t b = 1; b < s.blocking.blocks.size(); b += 2) list.push_back(b);
      StreamOptions o;
      o.io_threads = threads;
      o.depth = depth;
      o.wanted = [&](std::size_t k, std::size_t b) { return s.wanted(k, b); };
      BlockStream stream(s.blocking, list, s.experts, reader, o);
      double waited = 0;
      std::uint64_t expect_base = 0, expect_expert = 0;
      int expect_reads = 0;
      for (std::uint32_t b : list) {
        auto loaded = stream.next(waited);
        ASSERT_NE(loaded, nullptr);
        ASSERT_EQ(loaded->block, b);
        const Block& blk = s.blocking.blocks[b];
        ASSERT_EQ(loaded->base.size(), blk.byte_length);
        EXPECT_EQ(loaded->base[0], PatternReader::value(-1, blk.tensor, blk.byte_begin));
        expect_base += blk.byte_length;
        ++expect_reads;
        for (std::size_t k = 0; k < s.experts; ++k) {
          ASSERT_EQ(loaded->present[k] != 0, s.wanted(k, b));
          if (!s.wanted(k, b)) continue;
          ++expect_reads;
          expect_expert += blk.byte_length;
          const auto& bytes = loaded->experts[k];
          ASSERT_EQ(bytes.size(), blk.byte_length);
          for (std::size_t i = 0; i < bytes.size(); ++i)
            ASSERT_EQ(bytes[i], PatternReader::value(int(k), blk.tensor, blk.byte_begin + i));
        }
        stream.recycle(std::move(loaded));
      }
      EXPECT_EQ(stream.next(waited), nullptr);
      EXPECT_EQ(stream.base_bytes(), expect_base);
      EXPECT_EQ(stream.expert_bytes(), expect_expert);
      EXPECT_EQ(reader.reads.load(), expect_reads);
      EXPECT_LE(reader.max_in_flight.load(), std::max(1, threads));
    }
  }
}

TEST(BlockStream, SeveralReadsAreInFlightAtOnce) {
  const StreamFixture s;
  PatternReader reader;
  reader.jitter = true;
  StreamOptions o;
  o.io_threads = 4;
  o.depth = 2;
  BlockStream stream(s.blocking, block_range(0, std::uint32_t(s.blocking.blocks.size())), s.experts,
                     reader, o);
  double waited = 0;
  while (auto b = stream.next(waited)) stream.recycle(std::move(b));
  EXPECT_GE(reader.max_in_flight.load(), 2) << "reads were issued one at a time";
}

TEST(BlockStream, AReadErrorReachesTheConsumer) {
  const StreamFixture s;
  for (int threads : {0, 1, 4}) {
    PatternReader reader;
    reader.fail_on_read = 9;
    StreamOptions o;
    o.io_threads = threads;
    BlockStream stream(s.blocking, block_range(0, std::uint32_t(s.blocking.blocks.size())),
                       s.experts, reader, o);
    double waited = 0;
    try {
      while (auto b = stream.next(waited)) stream.recycle(std::move(b));
      FAIL() << "the injected failure was lost";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("injected failure at read 9"), std::string::npos);
    }
  }
}

TEST(BlockStream, SlicesCoverEachBlockInOrder) {
  const StreamFixture s;
  for (std::uint64_t slice : {2u, 30u, 64u, 1000u}) {
    PatternReader reader;
    reader.jitter = true;
    StreamOptions o;
    o.io_threads = slice == 30u ? 0 : 3;
    o.depth = 2;
    o.slice_bytes = slice;
    o.wanted = [&](std::size_t k, std::size_t b) { return s.wanted(k, b); };
    const auto list = block_range(0, std::uint32_t(s.blocking.blocks.size()));
    BlockStream stream(s.blocking, list, s.experts, reader, o);
    double waited = 0;
    std::uint64_t total = 0;
    for (std::uint32_t b : list) {
      const Block& blk = s.blocking.blocks[b];
      const std::uint64_t elem = blk.byte_length / blk.elem_count;
      std::uint64_t next_elem = 0;
      for (bool last = false; !last;) {
        auto slice_block = stream.next(waited);
        ASSERT_NE(slice_block, nullptr);
        const LoadedBlock& l = *slice_block;
        ASSERT_EQ(l.block, b);
        EXPECT_EQ(l.first_slice, next_elem == 0);
        ASSERT_EQ(l.elem_offset, next_elem);
        ASSERT_GT(l.elem_count, 0u);
        EXPECT_LE(l.byte_length, std::max(slice, elem)) << "slice larger than asked";
        EXPECT_EQ(l.byte_length, l.elem_count * elem);
        EXPECT_EQ(l.byte_offset, l.elem_offset * elem);
        ASSERT_EQ(l.base.size(), l.byte_length);
        for (std::size_t i = 0; i < l.byte_length; ++i)
          ASSERT_EQ(l.base[i],
                    PatternReader::value(-1, blk.tensor, blk.byte_begin + l.byte_offset + i));
        for (std::size_t k = 0; k < s.experts; ++k) {
          if (!l.present[k]) continue;
          ASSERT_EQ(l.experts[k][0],
                    PatternReader::value(int(k), blk.tensor, blk.byte_begin + l.byte_offset));
        }
        next_elem += l.elem_count;
        total += l.byte_length;
        last = l.last_slice;
        stream.recycle(std::move(slice_block));
      }
      EXPECT_EQ(next_elem, blk.elem_count);
    }
    EXPECT_EQ(stream.next(waited), nullptr);
    EXPECT_EQ(stream.base_bytes(), total);
  }
}

TEST(BlockStream, StoppingEarlyDoesNotHangAndReadsAtMostTheWindow) {
  const StreamFixture s;
  for (int depth : {1, 3}) {
    PatternReader reader;
    {
      StreamOptions o;
      o.io_threads = 4;
      o.depth = depth;
      BlockStream stream(s.blocking, block_range(0, std::uint32_t(s.blocking.blocks.size())),
                         s.experts, reader, o);
      double waited = 0;
      auto first = stream.next(waited);  // held, never recycled
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      // At most depth + 1 blocks were scheduled (the held one included).
      EXPECT_LE(reader.reads.load(), (depth + 1) * int(s.experts + 1));
    }
  }
}

TEST(BlockStream, WithoutIoThreadsReadsEachSliceOnTheCallersThreadWhenAskedFor) {
  const StreamFixture s;
  struct ThreadCheckingReader : PatternReader {
    std::thread::id caller = std::this_thread::get_id();
    void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
              std::span<std::byte> dst) override {
      EXPECT_EQ(std::this_thread::get_id(), caller) << "read on another thread";
      PatternReader::read(source, tensor, byte_begin, dst);
    }
  } reader;
  StreamOptions o;
  o.io_threads = 0;
  o.depth = 1;
  o.wanted = [&](std::size_t k, std::size_t b) { return s.wanted(k, b); };
  const auto list = block_range(0, std::uint32_t(s.blocking.blocks.size()));
  BlockStream stream(s.blocking, list, s.experts, reader, o);
  double waited = 0;
  // Slices the consumer keeps: more than the stream's depth, which must not make it wait.
  std::vector<std::unique_ptr<LoadedBlock>> kept;
  int expect_reads = 0;
  for (std::uint32_t b : list) {
    kept.push_back(stream.next(waited));
    ASSERT_NE(kept.back(), nullptr);
    EXPECT_EQ(kept.back()->block, b);
    expect_reads += 1;
    for (std::size_t k = 0; k < s.experts; ++k) expect_reads += s.wanted(k, b) ? 1 : 0;
    EXPECT_EQ(reader.reads.load(), expect_reads) << "read ahead of the consumer";
  }
  EXPECT_EQ(stream.next(waited), nullptr);
  for (auto& b : kept) stream.recycle(std::move(b));
}

TEST(BlockStream, EmptyListEndsAtOnce) {
  const StreamFixture s;
  PatternReader reader;
  BlockStream stream(s.blocking, {}, s.experts, reader, StreamOptions{});
  double waited = 0;
  EXPECT_EQ(stream.next(waited), nullptr);
  EXPECT_EQ(reader.reads.load(), 0);
}
