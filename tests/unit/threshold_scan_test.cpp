// Thresholds from the data (--full-read TIES) equal the sketch of each whole tensor's deltas,
// whatever the blocking, threads or reads in flight.
#include "mergepipe/threshold_scan.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "mergepipe/dtype.hpp"
#include "mergepipe/magnitude_sketch.hpp"

using namespace mergepipe;

namespace {
class Memory : public BlockReader {
 public:
  std::map<int, std::vector<std::vector<std::byte>>> data;  // source -> tensor -> bytes
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override {
    std::memcpy(dst.data(), data.at(source.expert).at(tensor).data() + byte_begin, dst.size());
  }
  std::string describe(SourceId, std::uint32_t, std::uint64_t, std::uint64_t) const override {
    return "memory";
  }
};

// The base (source -1) and `experts` experts of random values of spread `sigma`, every tensor.
Memory random_sources(const std::vector<TensorInfo>& tensors, int experts, unsigned seed,
                      float sigma) {
  Memory mem;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  for (int src = -1; src < experts; ++src) {
    for (const auto& t : tensors) {
      std::vector<float> v(t.numel());
      for (auto& x : v) x = dist(rng);
      std::vector<std::byte> bytes(t.nbytes());
      convert_from_f32(t.dtype, v.data(), bytes.data(), v.size());
      mem.data[src].push_back(bytes);
    }
  }
  return mem;
}
}  // namespace

TEST(ThresholdScan, MatchesTheSketchOfEachWholeTensor) {
  const std::vector<TensorInfo> tensors{
      {"w", DType::kBF16, {64, 48}}, {"empty", DType::kBF16, {0, 8}}, {"v", DType::kF32, {1000}}};
  const std::vector<double> densities{0.5, 0.1, 1.0};
  Memory mem = random_sources(tensors, 3, 3, 0.02f);
  // Experts leave stretches bit-identical to the base (their Δ is exactly 0 there): expert 0
  // 70% of w, so its 50% threshold is 0; expert 1 half of v, including a base +Inf whose Δ is
  // NaN, not 0.
  auto copy_base = [&](int k, std::size_t t, std::size_t first, std::size_t count) {
    const std::size_t size = dtype_size(tensors[t].dtype);
    std::memcpy(mem.data[k][t].data() + first * size, mem.data[-1][t].data() + first * size,
                count * size);
  };
  copy_base(0, 0, 500, 2150);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(mem.data[-1][2].data() + 4 * 3, &inf, 4);
  copy_base(1, 2, 0, 500);
  // Reference: one sketch per (expert, tensor) over the whole tensor.
  std::vector<std::vector<float>> expect;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> row;
    const std::size_t n = tensors[t].numel();
    std::vector<float> base(n), delta(n);
    convert_to_f32(tensors[t].dtype, mem.data[-1][t].data(), base.data(), n);
    for (std::size_t k = 0; k < densities.size(); ++k) {
      convert_to_f32(tensors[t].dtype, mem.data[int(k)][t].data(), delta.data(), n);
      for (std::size_t i = 0; i < n; ++i) delta[i] -= base[i];
      MagnitudeSketch sketch;
      sketch.add(delta.data(), n);
      row.push_back(sketch.threshold(densities[k]));
    }
    expect.push_back(row);
  }
  ASSERT_EQ(expect[0][0], 0.0f);
  for (std::uint64_t block_bytes : {256u, 4096u, 1u << 20}) {
    for (int threads : {1, 2, 3}) {
      const Blocking blocking = make_blocking(tensors, block_bytes);
      ThresholdScan scan;
      scan.blocking = &blocking;
      scan.tensors = &tensors;
      scan.densities = densities;
      scan.threads = threads;
      scan.io_threads = 3;
      std::uint64_t seen = 0;
      scan.on_block = [&](std::uint64_t bytes) { seen += bytes; };
      const auto got = scan_thresholds(scan, {0, 1, 2}, mem);
      EXPECT_EQ(got, expect) << block_bytes << " byte blocks, " << threads << " threads";
      std::uint64_t total = 0;
      for (const auto& t : tensors) total += t.nbytes() * 4;
      EXPECT_EQ(seen, total);
      // A subset of tensors in another order gives those tensors' rows.
      const auto some = scan_thresholds(scan, {2, 0}, mem);
      EXPECT_EQ(some, (std::vector<std::vector<float>>{expect[2], expect[0]}));
    }
  }
}

// The scan tells which (block, expert) deltas are exactly zero, so a full-read merge can skip
// reading those blocks again: an expert bit-identical to the base over a whole block is unchanged
// there, one differing in a single element is not, and a base NaN/Inf never counts as unchanged.
TEST(ThresholdScan, ReportsWhichExpertsChangeEachBlock) {
  const std::vector<TensorInfo> tensors{{"w", DType::kBF16, {4096}}, {"v", DType::kF32, {512}}};
  Memory mem = random_sources(tensors, 2, 5, 0.02f);
  // Expert 0: w identical to the base but for element 3000; v identical with a base +Inf.
  mem.data[0][0] = mem.data[-1][0];
  mem.data[0][0][3000 * 2] ^= std::byte{1};
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(mem.data[-1][1].data() + 4 * 100, &inf, 4);
  mem.data[0][1] = mem.data[-1][1];
  // Expert 1 changes everything except w's first 2048 elements.
  std::memcpy(mem.data[1][0].data(), mem.data[-1][0].data(), 2048 * 2);
  for (int threads : {1, 2}) {
    for (std::uint64_t slice : {std::uint64_t{0}, std::uint64_t{512}}) {
      const Blocking blocking = make_blocking(tensors, 2048);  // w: 4 blocks, v: 1 block
      ASSERT_EQ(blocking.blocks.size(), 5u);
      ThresholdScan scan;
      scan.blocking = &blocking;
      scan.tensors = &tensors;
      scan.densities = {0.5, 0.5};
      scan.threads = threads;
      scan.slice_bytes = slice;
      const ScanResult r = scan_sketches(scan, {0, 1, 2, 3, 4}, mem);
      ASSERT_EQ(r.changed.size(), 5u);
      const std::vector<std::vector<char>> expect{{0, 0}, {0, 0}, {1, 1}, {0, 1}, {1, 1}};
      for (std::uint32_t b = 0; b < 5; ++b)
        EXPECT_EQ(r.changed.at(b), expect[b]) << "block " << b << ", " << threads << " threads";
    }
  }
}

// The Gram scan: each block's sums are those of its elements accumulated in one piece, whatever
// the slicing of its reads, the threads, and the zero stretches it skips; and it reports the
// unchanged blocks as the sketch scan does.
TEST(ThresholdScan, GramOfEachBlockDoesNotDependOnSlicingOrThreads) {
  const std::vector<TensorInfo> tensors{{"w", DType::kBF16, {40000}}, {"v", DType::kF32, {700}}};
  constexpr std::size_t kExperts = 5;
  Memory mem = random_sources(tensors, int(kExperts), 11, 0.5f);
  // Expert 2 leaves w's middle as the base (whole chunks and a ragged stretch); expert 4 all of v.
  std::memcpy(mem.data[2][0].data() + 9000 * 2, mem.data[-1][0].data() + 9000 * 2, 17001 * 2);
  mem.data[4][1] = mem.data[-1][1];
  const Blocking blocking = make_blocking(tensors, 32768);  // w: 3 blocks, v: 1
  std::vector<std::uint32_t> all;
  for (std::uint32_t b = 0; b < blocking.blocks.size(); ++b) all.push_back(b);
  // Reference: every block accumulated in one piece from fp32 copies.
  std::map<std::uint32_t, TensorGram> expect;
  for (std::uint32_t b : all) {
    const Block& blk = blocking.blocks[b];
    const DType dtype = tensors[blk.tensor].dtype;
    const std::size_t size = dtype_size(dtype), n = blk.byte_length / size;
    std::vector<float> base(n);
    convert_to_f32(dtype, mem.data[-1][blk.tensor].data() + blk.byte_begin, base.data(), n);
    std::vector<std::vector<float>> deltas(kExperts, std::vector<float>(n));
    std::vector<const float*> ptrs;
    for (std::size_t k = 0; k < kExperts; ++k) {
      convert_to_f32(dtype, mem.data[int(k)][blk.tensor].data() + blk.byte_begin, deltas[k].data(),
                     n);
      for (std::size_t i = 0; i < n; ++i) deltas[k][i] -= base[i];
      ptrs.push_back(deltas[k].data());
    }
    GramAccumulator acc(kExperts);
    acc.add(base.data(), ptrs, n);
    expect[b] = acc.totals();
  }
  for (int threads : {1, 2, 3}) {
    for (std::uint64_t slice : {std::uint64_t{0}, std::uint64_t{1000}, std::uint64_t{4096}}) {
      ThresholdScan scan;
      scan.gram = true;
      scan.blocking = &blocking;
      scan.tensors = &tensors;
      scan.densities.assign(kExperts, 1.0);
      scan.threads = threads;
      scan.slice_bytes = slice;
      const ScanResult r = scan_sketches(scan, all, mem);
      ASSERT_EQ(r.grams.size(), all.size());
      for (std::uint32_t b : all)
        EXPECT_EQ(r.grams.at(b).sums, expect.at(b).sums)
            << "block " << b << ", " << threads << " threads, " << slice << " byte slices";
      EXPECT_EQ(r.changed.at(3), (std::vector<char>{1, 1, 1, 1, 0}));
      EXPECT_EQ(r.changed.at(0)[2], 1);  // w's first block changes before element 9000
    }
  }
}
