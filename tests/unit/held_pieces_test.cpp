// Held expert pieces: every admitted expert byte in exactly one held range, pieces within their
// limit, and a merge from held pieces byte-identical to the plain stream, with its expert bytes
// read by the fills' in-place requests instead of the stream's slices.
#include "mergepipe/held_pieces.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <tuple>

#include "mergepipe/error.hpp"

namespace mergepipe {
namespace {

const std::vector<TensorInfo> kTensors = {{"a.weight", DType::kBF16, {37, 29}},
                                          {"b.weight", DType::kBF16, {5000}},
                                          {"norm", DType::kBF16, {64}}};
constexpr std::size_t kExperts = 3;

// Checkpoints in memory: base and experts near it, in bf16. Counts the kinds of reads.
class MemoryReader : public BlockReader {
 public:
  std::map<int, std::vector<std::vector<std::byte>>> data;
  std::atomic<int> plain_expert_reads{0}, plain_base_reads{0}, in_place_reads{0};
  int fail_source = -2;  // in-place reads of this source throw

  MemoryReader() {
    std::mt19937 rng(3);
    std::normal_distribution<float> base_dist(0.0f, 0.02f), delta(0.0f, 0.002f);
    for (int src = SourceId::kBase; src < static_cast<int>(kExperts); ++src)
      for (std::size_t t = 0; t < kTensors.size(); ++t) {
        std::vector<std::byte> bytes(kTensors[t].nbytes());
        for (std::uint64_t i = 0; i < kTensors[t].numel(); ++i) {
          float v = base_dist(rng);
          if (src != SourceId::kBase) {
            std::uint16_t b;
            std::memcpy(&b, data[SourceId::kBase][t].data() + 2 * i, 2);
            v = bf16_to_f32(b) + delta(rng);
          }
          const std::uint16_t h = f32_to_bf16(v);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        data[src].push_back(std::move(bytes));
      }
  }
  void read(SourceId source, std::uint32_t tensor, std::uint64_t begin,
            std::span<std::byte> dst) override {
    ++(source.expert == SourceId::kBase ? plain_base_reads : plain_expert_reads);
    copy(source, tensor, begin, dst);
  }
  void read_in_place(SourceId source, std::uint32_t tensor, std::uint64_t begin,
                     std::span<std::byte> dst) override {
    ++in_place_reads;
    if (source.expert == fail_source) throw IoError(describe(source, tensor, begin, dst.size()));
    copy(source, tensor, begin, dst);
  }
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t begin,
                       std::uint64_t length) const override {
    return "memory source " + std::to_string(source.expert) + " tensor " + std::to_string(tensor) +
           " bytes " + std::to_string(begin) + "+" + std::to_string(length);
  }

 private:
  void copy(SourceId source, std::uint32_t tensor, std::uint64_t begin, std::span<std::byte> dst) {
    const std::vector<std::byte>& bytes = data.at(source.expert).at(tensor);
    ASSERT_LE(begin + dst.size(), bytes.size());
    std::memcpy(dst.data(), bytes.data() + begin, dst.size());
  }
};

class MemorySink : public OutputSink {
 public:
  std::vector<std::vector<std::byte>> out;
  MemorySink() {
    for (const TensorInfo& t : kTensors) out.emplace_back(t.nbytes());
  }
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override {
    ASSERT_LE(elem_begin * 2 + bytes.size(), out[tensor].size());
    std::memcpy(out[tensor].data() + elem_begin * 2, bytes.data(), bytes.size());
  }
};

class Recorder : public ExecutionObserver {
 public:
  std::vector<std::pair<std::uint32_t, std::uint64_t>> done;
  std::size_t stop_after = SIZE_MAX;
  void block_done(std::uint32_t block, std::uint64_t hash, std::uint64_t) override {
    done.emplace_back(block, hash);
  }
  bool stop_requested() override { return done.size() >= stop_after; }
};

struct Fixture {
  Blocking blocking = make_blocking(kTensors, 300);
  std::vector<std::vector<char>> admitted;  // [expert][block]
  MemoryReader reader;

  explicit Fixture(double share) {
    std::mt19937 rng(11);
    std::bernoulli_distribution coin(share);
    admitted.assign(kExperts, std::vector<char>(blocking.blocks.size()));
    for (auto& row : admitted)
      for (auto& a : row) a = coin(rng);
  }
  std::function<bool(std::size_t, std::size_t)> admits() const {
    return [this](std::size_t k, std::size_t b) { return admitted[k][b] != 0; };
  }
  ExecutionJob job() const {
    MergeSpec spec;
    spec.method = MergeMethod::kTies;
    for (std::size_t k = 0; k < kExperts; ++k)
      spec.experts.push_back({"e" + std::to_string(k), 1.0 + 0.5 * double(k), 0.5});
    ExecutionJob j;
    j.blocking = &blocking;
    j.tensors = &kTensors;
    j.out_dtypes.assign(kTensors.size(), DType::kBF16);
    j.op = OperatorConfig::from_spec(spec);
    for (const auto& t : kTensors) j.name_keys.push_back(tensor_name_key(t.name));
    j.thresholds.assign(kExperts * kTensors.size(), 0.001f);
    j.experts = kExperts;
    j.admitted = admits();
    j.threads = 2;
    j.slice_bytes = 128;  // several slices per block
    return j;
  }
  // The blocks in a scrambled order, cut into lists as a rank's drawn chunks are.
  std::vector<std::vector<std::uint32_t>> lists() const {
    std::vector<std::uint32_t> all = block_range(0, std::uint32_t(blocking.blocks.size()));
    std::reverse(all.begin() + 10, all.begin() + 30);
    std::vector<std::vector<std::uint32_t>> out;
    for (std::size_t at = 0, n = 1; at < all.size(); at += n, n = n * 2 + 1)
      out.emplace_back(all.begin() + at, all.begin() + std::min(all.size(), at + n));
    return out;
  }
  // Hands out lists() in turn, then nothing; counts the calls in `asked`.
  std::function<std::optional<std::vector<std::uint32_t>>()> list_source(
      std::size_t* asked = nullptr) const {
    auto next = std::make_shared<std::size_t>(0);
    return [all = lists(), next, asked]() -> std::optional<std::vector<std::uint32_t>> {
      if (asked) ++*asked;
      if (*next == all.size()) return std::nullopt;
      return all[(*next)++];
    };
  }
};

// (expert, tensor, byte) of every admitted expert byte of `blocks`, as byte intervals.
using Interval = std::tuple<int, std::uint32_t, std::uint64_t, std::uint64_t>;
std::set<Interval> admitted_bytes(const Fixture& f, const std::vector<std::uint32_t>& blocks) {
  std::set<Interval> out;
  for (std::uint32_t b : blocks)
    for (std::size_t k = 0; k < kExperts; ++k)
      if (f.admitted[k][b]) {
        const Block& blk = f.blocking.blocks[b];
        out.insert({int(k), blk.tensor, blk.byte_begin, blk.byte_begin + blk.byte_length});
      }
  return out;
}

}  // namespace

TEST(HeldPieces, CutCoversEachAdmittedByteOnceWithinTheLimit) {
  const Fixture f(0.6);
  std::vector<std::uint32_t> blocks;  // every block, some out of order
  for (const auto& list : f.lists()) blocks.insert(blocks.end(), list.begin(), list.end());
  ASSERT_GT(blocks.size(), 40u);
  for (std::uint64_t limit : {std::uint64_t{1}, std::uint64_t{300}, std::uint64_t{700},
                              std::uint64_t{2000}, std::uint64_t{1} << 30}) {
    const std::vector<HeldPiece> pieces =
        cut_held_pieces(f.blocking, blocks, kExperts, f.admits(), limit);
    std::vector<std::uint32_t> joined;
    for (const HeldPiece& p : pieces) {
      ASSERT_FALSE(p.blocks.empty());
      joined.insert(joined.end(), p.blocks.begin(), p.blocks.end());
      std::uint64_t admitted = 0;
      for (const Interval& i : admitted_bytes(f, p.blocks))
        admitted += std::get<3>(i) - std::get<2>(i);
      EXPECT_EQ(p.expert_bytes, admitted);
      if (p.ranges.empty()) {
        // Not held: a lone block over the limit, or blocks with nothing admitted.
        EXPECT_TRUE((p.blocks.size() == 1 && p.expert_bytes > limit) || p.expert_bytes == 0);
        continue;
      }
      EXPECT_LE(p.expert_bytes, limit);
      // The ranges, cut back into blocks, are exactly the admitted blocks; none overlap.
      std::set<Interval> held;
      std::uint64_t range_bytes = 0;
      for (const HeldRange& r : p.ranges) {
        ASSERT_NE(r.source.expert, SourceId::kBase);
        range_bytes += r.length;
        for (std::uint64_t at = r.byte_begin; at < r.byte_begin + r.length;) {
          const Block* blk = nullptr;
          for (const Block& b : f.blocking.blocks)
            if (b.tensor == r.tensor && b.byte_begin == at) blk = &b;
          ASSERT_NE(blk, nullptr) << "range does not start on a block";
          held.insert({r.source.expert, r.tensor, at, at + blk->byte_length});
          at += blk->byte_length;
        }
      }
      EXPECT_EQ(range_bytes, p.expert_bytes);
      EXPECT_EQ(held, admitted_bytes(f, p.blocks));
    }
    EXPECT_EQ(joined, blocks) << "limit " << limit;
    if (limit == 1) {
      for (const HeldPiece& p : pieces) EXPECT_TRUE(p.ranges.empty());
    }
  }
  // Everything admitted, no limit: one range per expert and tensor stretch (adjacent blocks
  // joined), so a fill asks for large requests.
  Fixture all(1.0);
  const std::vector<std::uint32_t> in_order =
      block_range(0, std::uint32_t(all.blocking.blocks.size()));
  const auto one =
      cut_held_pieces(all.blocking, in_order, kExperts, all.admits(), std::uint64_t{1} << 30);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].ranges.size(), kExperts * kTensors.size());
}

TEST(HeldPieces, MergeFromHeldPiecesEqualsThePlainStream) {
  Fixture f(0.6);
  const ExecutionJob job = f.job();
  const auto lists = f.lists();
  // Reference: each list streamed as it is, slice by slice.
  MemorySink reference;
  Recorder reference_blocks;
  for (const auto& list : lists) execute_blocks(job, list, f.reader, reference, &reference_blocks);

  for (std::uint64_t piece : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{700},
                              std::uint64_t{5000}, std::uint64_t{1} << 30}) {
    MemorySink sink;
    Recorder blocks;
    std::size_t asked = 0;
    const auto next_list = f.list_source(&asked);
    f.reader.plain_expert_reads = 0;
    f.reader.in_place_reads = 0;
    HeldPieceOptions options;
    options.piece_bytes = piece;
    options.fill_threads = 3;
    options.request_bytes = 4096;
    HeldPieceStats held;
    const ExecutionStats stats =
        execute_in_held_pieces(job, next_list, f.reader, sink, &blocks, options, &held);
    EXPECT_EQ(sink.out, reference.out) << "piece " << piece;
    EXPECT_EQ(blocks.done, reference_blocks.done) << "piece " << piece;
    EXPECT_EQ(asked, lists.size() + 1);
    EXPECT_FALSE(stats.stopped);
    std::uint64_t admitted = 0;
    for (const auto& list : lists)
      for (const Interval& i : admitted_bytes(f, list)) admitted += std::get<3>(i) - std::get<2>(i);
    EXPECT_EQ(stats.expert_bytes, admitted);
    if (piece == 0 || piece == 1) {
      // Nothing held: every expert byte comes from the stream's slices.
      EXPECT_EQ(held.held_pieces, 0u);
      EXPECT_EQ(f.reader.in_place_reads, 0);
      EXPECT_GT(f.reader.plain_expert_reads, 0);
    } else {
      EXPECT_GT(held.held_pieces, 0u);
      EXPECT_GT(f.reader.in_place_reads, 0);
    }
    if (piece == (std::uint64_t{1} << 30)) {
      // Everything held: one piece per list, the experts never read slice by slice.
      EXPECT_EQ(held.pieces, lists.size());
      EXPECT_EQ(held.held_bytes, admitted);
      EXPECT_EQ(f.reader.plain_expert_reads, 0);
    }
  }
}

// A full read holds each piece's base bytes too: same output, and the storage reader is never
// asked for a base slice; each held piece holds its blocks' base bytes exactly once.
TEST(HeldPieces, WithTheBaseHeldTheBaseIsReadOnlyIntoPieces) {
  Fixture f(0.6);
  const ExecutionJob job = f.job();
  const auto lists = f.lists();
  MemorySink reference;
  for (const auto& list : lists) execute_blocks(job, list, f.reader, reference);
  ASSERT_GT(f.reader.plain_base_reads, 0);
  // 1200: a block with every expert admitted fills a piece (4 x 300 bytes).
  for (std::uint64_t piece : {std::uint64_t{1200}, std::uint64_t{5000}, std::uint64_t{1} << 30}) {
    for (const auto& list : lists)
      for (const HeldPiece& p :
           cut_held_pieces(f.blocking, list, kExperts, f.admits(), piece, true)) {
        std::uint64_t base_bytes = 0, blocks_bytes = 0;
        for (const HeldRange& r : p.ranges)
          if (r.source.expert == SourceId::kBase) base_bytes += r.length;
        for (std::uint32_t b : p.blocks) blocks_bytes += f.blocking.blocks[b].byte_length;
        EXPECT_EQ(base_bytes, blocks_bytes) << "piece " << piece;
        // The limit counts the base bytes too.
        EXPECT_LE(base_bytes + p.expert_bytes, piece);
      }
    MemorySink sink;
    f.reader.plain_base_reads = 0;
    f.reader.plain_expert_reads = 0;
    HeldPieceOptions options;
    options.piece_bytes = piece;
    options.request_bytes = 4096;
    options.hold_base = true;
    HeldPieceStats held;
    execute_in_held_pieces(job, f.list_source(), f.reader, sink, nullptr, options, &held);
    EXPECT_EQ(sink.out, reference.out) << "piece " << piece;
    EXPECT_EQ(held.held_pieces, held.pieces);
    EXPECT_EQ(f.reader.plain_base_reads, 0) << "piece " << piece;
    EXPECT_EQ(f.reader.plain_expert_reads, 0) << "piece " << piece;
  }
}

TEST(HeldPieces, AFailedFillEndsTheMergeWithTheReadersError) {
  Fixture f(0.6);
  f.reader.fail_source = 2;
  const ExecutionJob job = f.job();
  const auto next_list = f.list_source();
  MemorySink sink;
  HeldPieceOptions options;
  options.piece_bytes = 2000;
  try {
    execute_in_held_pieces(job, next_list, f.reader, sink, nullptr, options);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("memory source 2"), std::string::npos) << e.what();
  }
}

TEST(HeldPieces, AStopRequestEndsTheMergeBetweenBlocks) {
  Fixture f(0.6);
  const ExecutionJob job = f.job();
  const auto next_list = f.list_source();
  MemorySink sink;
  Recorder blocks;
  blocks.stop_after = 7;
  HeldPieceOptions options;
  options.piece_bytes = 2000;
  const ExecutionStats stats =
      execute_in_held_pieces(job, next_list, f.reader, sink, &blocks, options);
  EXPECT_TRUE(stats.stopped);
  EXPECT_EQ(blocks.done.size(), 7u);
  EXPECT_EQ(stats.blocks_done, 7u);
}

TEST(HeldPieces, HeldExpertsReaderNamesTheStorageAndRefusesWhatItDoesNotHold) {
  Fixture f(1.0);
  RetainedWindow window;
  window.fill(f.reader, {{SourceId{1}, 1, 600, 1200}}, 2, 4096);
  HeldExpertsReader reader(f.reader, window);
  // Expert bytes come from the window without a copy, base bytes from the storage.
  EXPECT_NE(reader.view(SourceId{1}, 1, 700, 100), nullptr);
  EXPECT_EQ(
      0, std::memcmp(reader.view(SourceId{1}, 1, 700, 100), f.reader.data[1][1].data() + 700, 100));
  EXPECT_EQ(reader.view(SourceId{SourceId::kBase}, 1, 700, 100), nullptr);
  std::vector<std::byte> base(100);
  const int before = f.reader.plain_expert_reads;
  reader.read(SourceId{SourceId::kBase}, 1, 700, base);
  EXPECT_EQ(0, std::memcmp(base.data(), f.reader.data[-1][1].data() + 700, 100));
  EXPECT_EQ(f.reader.plain_expert_reads, before);
  // An expert byte that was not held is an error naming the storage, not a silent read.
  std::vector<std::byte> bytes(100);
  try {
    reader.read(SourceId{0}, 1, 700, bytes);
    FAIL() << "read an expert range that was not held";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("memory source 0 tensor 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(f.reader.plain_expert_reads, before);
}

}  // namespace mergepipe
