#include "mergepipe/executor.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"

using namespace mergepipe;

namespace {

// Checkpoints held in memory: source -> tensor -> bytes.
class MemoryReader : public BlockReader {
 public:
  std::map<int, std::vector<std::vector<std::byte>>> data;
  int fail_at_read = -1;  // throw on this read (0-based), -1 never
  std::atomic<int> reads{0};
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override {
    if (reads++ == fail_at_read)
      throw IoError("memory: injected read failure at offset " + std::to_string(byte_begin));
    const auto& bytes = data.at(source.expert).at(tensor);
    ASSERT_LE(byte_begin + dst.size(), bytes.size());
    std::memcpy(dst.data(), bytes.data() + byte_begin, dst.size());
  }
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override {
    return "memory source " + std::to_string(source.expert) + " tensor " + std::to_string(tensor) +
           " bytes " + std::to_string(byte_begin) + "+" + std::to_string(length);
  }
};

class MemorySink : public OutputSink {
 public:
  std::vector<std::vector<std::byte>> out;
  std::vector<TensorInfo> tensors;
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override {
    auto& o = out.at(tensor);
    const std::size_t offset = elem_begin * dtype_size(tensors[tensor].dtype);
    ASSERT_LE(offset + bytes.size(), o.size());
    std::memcpy(o.data() + offset, bytes.data(), bytes.size());
  }
};

std::vector<std::byte> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::byte> bytes(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t v = f32_to_bf16(dist(rng));
    std::memcpy(bytes.data() + 2 * i, &v, 2);
  }
  return bytes;
}

struct Fixture {
  std::vector<TensorInfo> tensors{{"a.weight", DType::kBF16, {37, 29}},
                                  {"b.weight", DType::kBF16, {5000}},
                                  {"norm", DType::kBF16, {64}}};
  Blocking blocking = make_blocking(tensors, 300);
  MemoryReader reader;
  std::size_t experts = 3;
  std::vector<std::vector<char>> admitted;  // [expert][block]

  explicit Fixture(unsigned seed) {
    std::mt19937 rng(seed);
    for (int src = -1; src < int(experts); ++src) {
      for (const auto& t : tensors) {
        auto base = src < 0 ? random_bf16(t.numel(), rng, 0.02f) : std::vector<std::byte>();
        if (src >= 0) {
          // Expert = base + small delta, rounded to bf16.
          const auto& b = reader.data[-1][&t - tensors.data()];
          std::vector<float> f(t.numel());
          convert_to_f32(DType::kBF16, b.data(), f.data(), f.size());
          std::normal_distribution<float> d(0.0f, 0.002f);
          for (auto& x : f) x += d(rng);
          base.resize(t.numel() * 2);
          convert_from_f32(DType::kBF16, f.data(), base.data(), f.size());
          // Fine-tuned experts leave stretches bit-identical to the base: expert 1 most of
          // tensor b (cut mid-block and mid-chunk), expert 2 all of the norm.
          const std::size_t tensor = std::size_t(&t - tensors.data());
          if (src == 1 && tensor == 1)
            std::memcpy(base.data() + 2 * 700, b.data() + 2 * 700, 2 * 3900);
          if (src == 2 && tensor == 2) base = b;
        }
        reader.data[src].push_back(std::move(base));
      }
    }
    std::bernoulli_distribution coin(0.6);
    admitted.assign(experts, std::vector<char>(blocking.blocks.size()));
    for (auto& row : admitted)
      for (auto& a : row) a = coin(rng);
  }

  ExecutionJob job(MergeMethod method, int threads, int prefetch) const {
    MergeSpec spec;
    spec.method = method;
    for (std::size_t k = 0; k < experts; ++k)
      spec.experts.push_back({"e" + std::to_string(k), 1.0 + 0.5 * double(k), 0.5});
    ExecutionJob j;
    j.blocking = &blocking;
    j.tensors = &tensors;
    j.out_dtypes = {DType::kBF16, DType::kF32, DType::kBF16};
    j.op = OperatorConfig::from_spec(spec);
    for (const auto& t : tensors) j.name_keys.push_back(tensor_name_key(t.name));
    j.thresholds.assign(experts * tensors.size(), 0.001f);
    j.experts = experts;
    j.admitted = [this](std::size_t k, std::size_t b) { return admitted[k][b] != 0; };
    j.threads = threads;
    j.prefetch_depth = prefetch;
    return j;
  }

  MemorySink sink(const ExecutionJob& j) const {
    MemorySink s;
    s.tensors = tensors;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      s.tensors[t].dtype = j.out_dtypes[t];
      s.out.emplace_back(tensors[t].numel() * dtype_size(j.out_dtypes[t]));
    }
    return s;
  }
};

// Reference: per block, the operator applied to exactly the admitted deltas, each computed.
void expect_direct_merge(const Fixture& f, const ExecutionJob& job, const MemorySink& sink,
                         MergeMethod m) {
  for (std::size_t b = 0; b < f.blocking.blocks.size(); ++b) {
    const Block& blk = f.blocking.blocks[b];
    const std::size_t n = blk.elem_count;
    std::vector<float> base(n), out(n);
    convert_to_f32(DType::kBF16, f.reader.data.at(-1)[blk.tensor].data() + blk.byte_begin,
                   base.data(), n);
    std::vector<std::vector<float>> deltas(f.experts, std::vector<float>(n));
    std::vector<const float*> ptrs(f.experts, nullptr);
    for (std::size_t k = 0; k < f.experts; ++k) {
      if (!f.admitted[k][b]) continue;
      convert_to_f32(DType::kBF16, f.reader.data.at(int(k))[blk.tensor].data() + blk.byte_begin,
                     deltas[k].data(), n);
      for (std::size_t i = 0; i < n; ++i) deltas[k][i] -= base[i];
      ptrs[k] = deltas[k].data();
    }
    std::vector<float> thresholds(f.experts, 0.001f);
    merge_block(job.op, TensorContext{job.name_keys[blk.tensor], thresholds}, blk.elem_begin, n,
                base.data(), ptrs, out.data());
    std::vector<std::byte> expect(n * dtype_size(job.out_dtypes[blk.tensor]));
    convert_from_f32(job.out_dtypes[blk.tensor], out.data(), expect.data(), n);
    const std::size_t offset = blk.elem_begin * dtype_size(job.out_dtypes[blk.tensor]);
    ASSERT_EQ(0, std::memcmp(expect.data(), sink.out[blk.tensor].data() + offset, expect.size()))
        << merge_method_name(m) << " block " << b;
  }
}

}  // namespace

TEST(Executor, MatchesDirectMergeOfWholeTensors) {
  Fixture f(1);
  for (MergeMethod m : {MergeMethod::kLinear, MergeMethod::kTaskArithmetic, MergeMethod::kTies,
                        MergeMethod::kDareLinear, MergeMethod::kDareTies}) {
    const ExecutionJob job = f.job(m, 2, 2);
    MemorySink sink = f.sink(job);
    f.reader.reads = 0;
    const auto stats = execute_blocks(job, block_range(0, std::uint32_t(f.blocking.blocks.size())),
                                      f.reader, sink);
    expect_direct_merge(f, job, sink, m);
    std::uint64_t admitted_bytes = 0, base_bytes = 0;
    for (std::size_t b = 0; b < f.blocking.blocks.size(); ++b) {
      base_bytes += f.blocking.blocks[b].byte_length;
      for (std::size_t k = 0; k < f.experts; ++k)
        admitted_bytes += f.admitted[k][b] ? f.blocking.blocks[b].byte_length : 0;
    }
    EXPECT_EQ(stats.expert_bytes, admitted_bytes);  // exactly the admitted pairs, nothing more
    EXPECT_EQ(stats.base_bytes, base_bytes);
  }
}

TEST(Executor, ThreadsPrefetchAndRangesDoNotChangeBytes) {
  Fixture f(2);
  const std::uint32_t blocks = std::uint32_t(f.blocking.blocks.size());
  const ExecutionJob one = f.job(MergeMethod::kDareTies, 1, 1);
  MemorySink ref = f.sink(one);
  const auto ref_stats = execute_blocks(one, block_range(0, blocks), f.reader, ref);
  for (int threads : {2, 3}) {
    for (int prefetch : {1, 4}) {
      const ExecutionJob job = f.job(MergeMethod::kDareTies, threads, prefetch);
      MemorySink sink = f.sink(job);
      // Split the blocks into three ranges, as three ranks would.
      std::vector<std::uint64_t> hashes;
      for (auto [lo, hi] : {std::pair<std::uint32_t, std::uint32_t>{0, blocks / 3},
                            {blocks / 3, blocks / 2},
                            {blocks / 2, blocks}}) {
        auto s = execute_blocks(job, block_range(lo, hi), f.reader, sink);
        hashes.insert(hashes.end(), s.block_hashes.begin(), s.block_hashes.end());
      }
      EXPECT_EQ(sink.out, ref.out) << threads << " threads, prefetch " << prefetch;
      EXPECT_EQ(hashes, ref_stats.block_hashes);
    }
  }
}

TEST(Executor, ReadFailureSurfacesAsTheReadersError) {
  Fixture f(3);
  f.reader.fail_at_read = 7;
  const ExecutionJob job = f.job(MergeMethod::kLinear, 2, 2);
  MemorySink sink = f.sink(job);
  try {
    execute_blocks(job, block_range(0, std::uint32_t(f.blocking.blocks.size())), f.reader, sink);
    FAIL() << "expected the injected failure";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("injected read failure"), std::string::npos);
  }
}

TEST(Executor, NonFiniteOutputIsRefusedUnlessAllowed) {
  Fixture f(4);
  const std::uint16_t nan = 0x7fc0;
  std::memcpy(f.reader.data[0][1].data() + 20, &nan, 2);  // expert 0, tensor b, element 10
  for (auto& row : f.admitted) std::fill(row.begin(), row.end(), 1);
  ExecutionJob job = f.job(MergeMethod::kTaskArithmetic, 1, 2);
  MemorySink sink = f.sink(job);
  EXPECT_THROW(
      execute_blocks(job, block_range(0, std::uint32_t(f.blocking.blocks.size())), f.reader, sink),
      InputError);
  job.allow_nonfinite = true;
  MemorySink sink2 = f.sink(job);
  const auto stats =
      execute_blocks(job, block_range(0, std::uint32_t(f.blocking.blocks.size())), f.reader, sink2);
  EXPECT_EQ(stats.nonfinite, 1u);
}

TEST(Executor, UnchangedBytesOverANonFiniteBaseStillMergeTheirNaNDelta) {
  // Every expert leaves tensor b bit-identical to the base, whose element 1000 is +Inf: there
  // Δ = Inf − Inf = NaN for all of them, so the merge is NaN, not the base's +Inf a skipped
  // "unchanged" expert would leave.
  Fixture f(5);
  const std::uint16_t inf = 0x7f80;
  std::memcpy(f.reader.data[-1][1].data() + 2000, &inf, 2);
  for (int k = 0; k < int(f.experts); ++k) f.reader.data[k][1] = f.reader.data[-1][1];
  for (auto& row : f.admitted) std::fill(row.begin(), row.end(), 1);
  ExecutionJob job = f.job(MergeMethod::kTaskArithmetic, 2, 2);
  job.allow_nonfinite = true;
  MemorySink sink = f.sink(job);
  const auto stats =
      execute_blocks(job, block_range(0, std::uint32_t(f.blocking.blocks.size())), f.reader, sink);
  EXPECT_EQ(stats.nonfinite, 1u);
  float merged;
  std::memcpy(&merged, sink.out[1].data() + 4 * 1000, 4);  // tensor b is written as fp32
  EXPECT_TRUE(std::isnan(merged));
  expect_direct_merge(f, job, sink, MergeMethod::kTaskArithmetic);
}

TEST(Executor, CombineBlockHashesDependsOnOrderAndContent) {
  const std::vector<std::uint64_t> a{1, 2, 3}, b{1, 3, 2};
  EXPECT_NE(combine_block_hashes(a), combine_block_hashes(b));
  EXPECT_EQ(combine_block_hashes(a), combine_block_hashes(std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_EQ(combine_block_hashes(std::vector<std::uint64_t>{}), "");
  EXPECT_EQ(combine_block_hashes(a).size(), 32u);
}

namespace {
class StopAfter : public ExecutionObserver {
 public:
  explicit StopAfter(std::size_t n) : limit(n) {}
  void block_done(std::uint32_t block, std::uint64_t hash, std::uint64_t moved) override {
    done.push_back(block);
    hashes.push_back(hash);
    bytes += moved;
  }
  bool stop_requested() override { return done.size() >= limit; }
  std::size_t limit;
  std::vector<std::uint32_t> done;
  std::vector<std::uint64_t> hashes;
  std::uint64_t bytes = 0;
};
}  // namespace

TEST(Executor, ObserverSeesEveryBlockAndCanStopTheRun) {
  Fixture f(5);
  const ExecutionJob job = f.job(MergeMethod::kTies, 2, 2);
  const auto all = block_range(0, std::uint32_t(f.blocking.blocks.size()));
  MemorySink sink = f.sink(job);
  StopAfter everything(all.size() + 1);
  const auto full = execute_blocks(job, all, f.reader, sink, &everything);
  EXPECT_FALSE(full.stopped);
  EXPECT_EQ(everything.done, all);
  EXPECT_EQ(everything.hashes, full.block_hashes);
  std::uint64_t expect_bytes = 0;
  for (std::uint32_t b : all) expect_bytes += block_cost(job, b);
  EXPECT_EQ(everything.bytes, expect_bytes);

  MemorySink partial_sink = f.sink(job);
  StopAfter three(3);
  const auto partial = execute_blocks(job, all, f.reader, partial_sink, &three);
  EXPECT_TRUE(partial.stopped);
  EXPECT_EQ(partial.blocks_done, 3u);
  EXPECT_EQ(three.done, std::vector<std::uint32_t>(all.begin(), all.begin() + 3));
}

TEST(Executor, BlocksInAnyOrderGiveTheSameBytes) {
  Fixture f(6);
  const ExecutionJob job = f.job(MergeMethod::kDareLinear, 2, 3);
  const auto all = block_range(0, std::uint32_t(f.blocking.blocks.size()));
  MemorySink in_order = f.sink(job);
  execute_blocks(job, all, f.reader, in_order);
  std::vector<std::uint32_t> shuffled(all.rbegin(), all.rend());
  MemorySink reversed = f.sink(job);
  const auto stats = execute_blocks(job, shuffled, f.reader, reversed);
  EXPECT_EQ(reversed.out, in_order.out);
  EXPECT_EQ(stats.block_hashes.size(), shuffled.size());
}

TEST(Executor, SlicesOfAnySizeGiveTheSameBytes) {
  Fixture f(7);
  for (MergeMethod m : {MergeMethod::kLinear, MergeMethod::kTies, MergeMethod::kDareTies}) {
    ExecutionJob job = f.job(m, 2, 2);
    job.slice_bytes = 0;
    const auto all = block_range(0, std::uint32_t(f.blocking.blocks.size()));
    MemorySink whole = f.sink(job);
    const auto ref = execute_blocks(job, all, f.reader, whole);
    for (std::uint64_t slice : {2u, 6u, 100u, 4096u}) {
      job.slice_bytes = slice;
      MemorySink sliced = f.sink(job);
      const auto got = execute_blocks(job, all, f.reader, sliced);
      EXPECT_EQ(sliced.out, whole.out) << merge_method_name(m) << ", " << slice << "-byte slices";
      EXPECT_EQ(got.block_hashes, ref.block_hashes);
      EXPECT_EQ(got.expert_bytes, ref.expert_bytes);
      EXPECT_EQ(got.base_bytes, ref.base_bytes);
    }
  }
}

TEST(Executor, ReadChecksSeeTheHashOfEachWholeBlock) {
  Fixture f(8);
  ExecutionJob job = f.job(MergeMethod::kLinear, 2, 2);
  job.slice_bytes = 64;  // several slices per block: the hash must still cover the whole block
  std::map<std::pair<int, std::uint32_t>, std::uint64_t> seen;
  job.check_read.wanted = [](SourceId source, std::uint32_t) { return source.expert != 1; };
  job.check_read.verify = [&](SourceId source, std::uint32_t block, std::uint64_t hash) {
    seen[{source.expert, block}] = hash;
  };
  const auto all = block_range(0, std::uint32_t(f.blocking.blocks.size()));
  MemorySink sink = f.sink(job);
  execute_blocks(job, all, f.reader, sink);
  std::size_t expected_checks = 0;
  for (std::uint32_t b : all) {
    const Block& blk = f.blocking.blocks[b];
    for (int src = -1; src < int(f.experts); ++src) {
      if (src == 1 || (src >= 0 && !f.admitted[src][b])) {
        EXPECT_EQ(seen.count({src, b}), 0u);
        continue;
      }
      ++expected_checks;
      const auto& bytes = f.reader.data[src][blk.tensor];
      EXPECT_EQ(seen.at({src, b}), hash64(bytes.data() + blk.byte_begin, blk.byte_length))
          << "source " << src << " block " << b;
    }
  }
  EXPECT_EQ(seen.size(), expected_checks);
  // A verify that throws ends the run with its error.
  job.check_read.verify = [](SourceId source, std::uint32_t block, std::uint64_t) {
    if (source.expert == 2 && block == 3) throw InputError("block 3 of expert 2 changed");
  };
  for (auto& row : f.admitted) std::fill(row.begin(), row.end(), 1);
  MemorySink sink2 = f.sink(job);
  EXPECT_THROW(execute_blocks(job, all, f.reader, sink2), InputError);
}
