#include "mergepipe/magnitude_sketch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "mergepipe/dtype.hpp"
#include "mergepipe/error.hpp"

using mergepipe::MagnitudeSketch;

namespace {
std::vector<float> deltas(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.003f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  for (std::size_t i = 0; i < n; i += 7) v[i] = 0.0f;  // untouched entries
  return v;
}
}  // namespace

TEST(MagnitudeSketch, ThresholdKeepsAtLeastKAndIsWithinTheBucketResolution) {
  const auto v = deltas(50000, 1);
  MagnitudeSketch s;
  s.add(v.data(), v.size());
  std::vector<float> mags(v.size());
  std::transform(v.begin(), v.end(), mags.begin(), [](float x) { return std::fabs(x); });
  std::sort(mags.rbegin(), mags.rend());
  for (double d : {0.01, 0.1, 0.2, 0.5, 0.9}) {
    const auto k = static_cast<std::size_t>(std::floor(d * double(v.size())));
    const float exact = mags[k - 1];  // k-th largest |Δ|
    const float t = s.threshold(d);
    EXPECT_LE(t, exact) << d;                           // rounded toward keeping more
    EXPECT_GE(t, exact * (1.0f - 1.0f / 256.0f)) << d;  // by at most 2^-8 relative
    const auto kept = std::count_if(mags.begin(), mags.end(), [&](float m) { return m >= t; });
    EXPECT_GE(static_cast<std::size_t>(kept), k);
    EXPECT_EQ(static_cast<std::uint64_t>(kept), s.kept_count(t));
  }
  EXPECT_EQ(s.threshold(1.0), 0.0f);
  EXPECT_TRUE(std::isinf(s.threshold(1e-9)));
}

TEST(MagnitudeSketch, SparseDenseAndMergedFormsAgree) {
  const auto a = deltas(10000, 2), b = deltas(7000, 3);
  MagnitudeSketch whole;
  whole.add(a.data(), a.size());
  whole.add(b.data(), b.size());
  MagnitudeSketch pa, pb;
  pa.add(a.data(), a.size());
  pb.add(b.data(), b.size());
  // Sparse + sparse (what rank 0 does with gathered parts) stays sparse and equals the whole.
  MagnitudeSketch sparse = MagnitudeSketch::from_sparse(pa.keys(), pa.counts());
  sparse.merge(MagnitudeSketch::from_sparse(pb.keys(), pb.counts()));
  EXPECT_EQ(sparse, whole);
  for (double d : {0.05, 0.3, 0.77}) EXPECT_EQ(sparse.threshold(d), whole.threshold(d));
  pa.merge(pb);
  pa.compact();
  EXPECT_EQ(pa, whole);
  EXPECT_EQ(pa.total(), a.size() + b.size());
}

TEST(MagnitudeSketch, AddZerosCountsLikeAddingZeros) {
  const auto v = deltas(5000, 4);
  const std::vector<float> zeros(3000, 0.0f);
  MagnitudeSketch added, counted;
  added.add(v.data(), v.size());
  added.add(zeros.data(), zeros.size());
  counted.add(v.data(), v.size());
  counted.add_zeros(zeros.size());
  EXPECT_EQ(counted, added);
  EXPECT_EQ(counted.total(), 8000u);
  // 3000 + 715 of the 8000 are 0: keeping 60% (4800 > 4285 non-zero) reaches the zeros.
  EXPECT_EQ(counted.threshold(0.6), 0.0f);
  EXPECT_GT(counted.threshold(0.5), 0.0f);
  MagnitudeSketch only_zeros;
  only_zeros.add_zeros(10);
  EXPECT_EQ(only_zeros.keys(), std::vector<std::uint16_t>{0});
  EXPECT_EQ(only_zeros.counts(), std::vector<std::uint64_t>{10});
}

TEST(MagnitudeSketch, Bf16DeltasCountLikeTheirConvertedValues) {
  // Odd length (the lanes' tail), NaN/Inf/subnormal patterns among random ones.
  std::mt19937 rng(5);
  std::uniform_int_distribution<unsigned> any(0, 0xffff);
  const std::size_t n = 10001;
  std::vector<std::byte> base_bf16(2 * n), expert_bf16(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t b = static_cast<std::uint16_t>(any(rng)),
                  e = static_cast<std::uint16_t>(any(rng));
    if (i % 5 == 0) e = b;   // unchanged entries
    if (i == 7) b = 0x7f80;  // +Inf base
    if (i == 8) e = 0xffc1;  // NaN expert
    if (i == 9) e = 0x0001;  // subnormal
    std::memcpy(base_bf16.data() + 2 * i, &b, 2);
    std::memcpy(expert_bf16.data() + 2 * i, &e, 2);
  }
  std::vector<float> base(n), delta(n);
  mergepipe::convert_to_f32(mergepipe::DType::kBF16, base_bf16.data(), base.data(), n);
  mergepipe::convert_delta_to_f32(mergepipe::DType::kBF16, expert_bf16.data(), base.data(),
                                  delta.data(), n);
  MagnitudeSketch fused, plain;
  fused.add_bf16_deltas(expert_bf16.data(), base.data(), n);
  plain.add(delta.data(), n);
  EXPECT_EQ(fused, plain);
  EXPECT_EQ(fused.total(), n);
}

TEST(MagnitudeSketch, CountsEveryValueOnceWhateverTheLengthModuloTheLanes) {
  // The dense counters interleave lanes and the loop is unrolled by them: every length around
  // a multiple of the lane count, fused and plain, against a histogram counted one by one.
  const auto v = deltas(1040, 9);
  std::vector<std::byte> expert(2 * v.size()), base_bytes(2 * v.size());
  std::vector<float> base(v.size());
  std::mt19937 rng(10);
  std::uniform_int_distribution<unsigned> mantissa(0, 0x7f);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto b = static_cast<std::uint16_t>(0x3f00 | mantissa(rng));  // ~0.5-1.0
    const auto e = static_cast<std::uint16_t>(i % 3 == 0 ? b : b + (i % 11) - 5);
    std::memcpy(base_bytes.data() + 2 * i, &b, 2);
    std::memcpy(expert.data() + 2 * i, &e, 2);
  }
  mergepipe::convert_to_f32(mergepipe::DType::kBF16, base_bytes.data(), base.data(), v.size());
  for (std::size_t n : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1029, 1030, 1031, 1032, 1033}) {
    std::map<std::uint16_t, std::uint64_t> plain_expected, fused_expected;
    std::vector<float> delta(n);
    mergepipe::convert_delta_to_f32(mergepipe::DType::kBF16, expert.data(), base.data(),
                                    delta.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      ++plain_expected[mergepipe::magnitude_bucket(v[i])];
      ++fused_expected[mergepipe::magnitude_bucket(delta[i])];
    }
    MagnitudeSketch plain, fused;
    plain.add(v.data(), n);
    fused.add_bf16_deltas(expert.data(), base.data(), n);
    for (auto [sketch, expected] :
         {std::pair{&plain, &plain_expected}, {&fused, &fused_expected}}) {
      sketch->compact();
      std::vector<std::uint16_t> keys;
      std::vector<std::uint64_t> counts;
      for (const auto& [key, count] : *expected) {
        keys.push_back(key);
        counts.push_back(count);
      }
      EXPECT_EQ(sketch->keys(), keys) << n;
      EXPECT_EQ(sketch->counts(), counts) << n;
      EXPECT_EQ(sketch->total(), n);
    }
  }
}

TEST(MagnitudeSketch, CountsExactlyWhicheverKeysItCountsByVectorCompares) {
  // After its first step a sketch counts its 8 most frequent keys with vector compares and the
  // others one by one, and chooses again when most of a step misses them. Values drawn to make
  // each path matter: mostly a few units in the last place of a bf16 base (as real deltas), then
  // other magnitudes (a new choice), then only 3 distinct keys, one of them 0xfffe (|NaN|,
  // which a careless filler of the unused slots would count twice), added in pieces of every
  // length around the 64-key words and the 4096-key steps.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<std::byte> expert;
  std::vector<float> base;
  auto push = [&](std::uint16_t base_bits, std::uint16_t expert_bits) {
    float b;
    const std::uint32_t bits = std::uint32_t{base_bits} << 16;
    std::memcpy(&b, &bits, sizeof b);
    base.push_back(b);
    expert.resize(expert.size() + 2);
    std::memcpy(expert.data() + expert.size() - 2, &expert_bits, 2);
  };
  for (int i = 0; i < 30000; ++i) {  // ulps of a ~0.01-0.04 base; 10% anything
    const auto b = static_cast<std::uint16_t>(0x3c00 + (rng() & 0x1ff));
    const float u = unit(rng);
    const int ulps = u < 0.55f ? 0 : u < 0.75f ? 1 : u < 0.85f ? -1 : u < 0.9f ? 2 : 0;
    const auto e = static_cast<std::uint16_t>(u < 0.9f ? b + ulps : rng() & 0xffff);
    push(b, e);
  }
  for (int i = 0; i < 12000; ++i) {  // a base near 100 and other deltas
    const auto b = static_cast<std::uint16_t>(0x42c0 + (rng() & 0x3f));
    push(b, static_cast<std::uint16_t>(b + 1 + (rng() & 3)));
  }
  for (int i = 0; i < 9000; ++i) {  // zero, 31, NaN: none of them chosen before
    const int pick = static_cast<int>(rng() % 3);
    push(0x3f80, pick == 0 ? 0x3f80 : pick == 1 ? 0x4200 : 0x7fff);
  }
  std::vector<float> delta(base.size());
  mergepipe::convert_delta_to_f32(mergepipe::DType::kBF16, expert.data(), base.data(), delta.data(),
                                  delta.size());
  std::map<std::uint16_t, std::uint64_t> expected;
  for (float d : delta) ++expected[mergepipe::magnitude_bucket(d)];
  ASSERT_TRUE(expected.count(0xfffe));
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  for (const auto& [key, count] : expected) {
    keys.push_back(key);
    counts.push_back(count);
  }
  MagnitudeSketch plain, fused;
  const std::size_t pieces[] = {4096, 1, 63, 64, 65, 4095, 4097, 127, 10000, 8192, 3};
  for (std::size_t done = 0, p = 0; done < delta.size(); ++p) {
    const std::size_t n = std::min(pieces[p % std::size(pieces)], delta.size() - done);
    plain.add(delta.data() + done, n);
    fused.add_bf16_deltas(expert.data() + 2 * done, base.data() + done, n);
    done += n;
  }
  for (MagnitudeSketch* sketch : {&plain, &fused}) {
    sketch->compact();
    EXPECT_EQ(sketch->keys(), keys);
    EXPECT_EQ(sketch->counts(), counts);
    EXPECT_EQ(sketch->total(), delta.size());
  }
}

TEST(MagnitudeSketch, DenseAndSparsePartsAddUp) {
  // A sketch holding both parts at once (zeros go to the sparse part, values to the dense one)
  // and merges of every combination give what one add() of all the values gives.
  const auto a = deltas(4000, 6), b = deltas(3001, 7);
  std::vector<float> all(a);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), 500, 0.0f);
  all.insert(all.end(), a.begin(), a.end());
  MagnitudeSketch whole;
  whole.add(all.data(), all.size());

  MagnitudeSketch mixed;
  mixed.add(a.data(), a.size());
  mixed.add_zeros(200);
  MagnitudeSketch other;
  other.add(b.data(), b.size());
  other.add_zeros(300);
  mixed.merge(other);  // dense + dense, sparse + sparse
  MagnitudeSketch stored;
  stored.add(a.data(), a.size());
  mixed.merge(MagnitudeSketch::from_sparse(stored.keys(), stored.counts()));
  EXPECT_EQ(mixed, whole);
  for (double d : {0.01, 0.3, 0.9}) {
    EXPECT_EQ(mixed.threshold(d), whole.threshold(d)) << d;
    EXPECT_EQ(mixed.kept_count(mixed.threshold(d)), whole.kept_count(whole.threshold(d))) << d;
  }
  mixed.compact();
  EXPECT_EQ(mixed, whole);
  EXPECT_EQ(mixed.keys(), whole.keys());
  EXPECT_EQ(mixed.counts(), whole.counts());
  // A sparse sketch merged into a dense one, and adds after a compact().
  MagnitudeSketch later = MagnitudeSketch::from_sparse(whole.keys(), whole.counts());
  later.add(b.data(), b.size());
  MagnitudeSketch again = whole;
  again.compact();
  again.add(b.data(), b.size());
  EXPECT_EQ(later, again);
  EXPECT_EQ(later.total(), all.size() + b.size());
}

TEST(MagnitudeSketch, RejectsUnsortedSparseInput) {
  const std::vector<std::uint16_t> keys{5, 3};
  const std::vector<std::uint64_t> counts{1, 1};
  EXPECT_THROW(MagnitudeSketch::from_sparse(keys, counts), mergepipe::InputError);
}

// The count a speculative full-read merge checks its guess with: entries that the operator's
// trim (|Δ| >= t on bit patterns) keeps under one threshold and not the other, counted from the
// sketch alone, for thresholds of other data (a part's guess against the whole tensor's), the
// keep-everything 0 and the keep-nothing +inf, with infinities and NaNs among the values.
TEST(MagnitudeSketch, DecidedDifferentlyCountsTheEntriesBetweenTwoThresholds) {
  auto v = deltas(20000, 4);
  v[3] = std::numeric_limits<float>::infinity();
  v[5] = -std::numeric_limits<float>::quiet_NaN();
  v[8] = -std::numeric_limits<float>::infinity();
  const auto other = deltas(5000, 5);
  MagnitudeSketch dense, guess_source;
  dense.add(v.data(), v.size());
  guess_source.add(other.data(), 800);
  MagnitudeSketch sparse = dense;
  sparse.compact();
  auto trim_keeps = [](float x, float t) {  // the operator's kTrim test
    std::uint32_t xb, tb;
    std::memcpy(&xb, &x, 4);
    std::memcpy(&tb, &t, 4);
    return t <= 0.0f || (xb & 0x7fffffffu) >= tb;
  };
  std::vector<float> thresholds = {0.0f, std::numeric_limits<float>::infinity()};
  for (double d : {1e-9, 0.05, 0.3, 0.31, 0.7, 0.95, 1.0}) {
    thresholds.push_back(dense.threshold(d));
    thresholds.push_back(guess_source.threshold(d));
  }
  int nonzero = 0;
  for (float a : thresholds) {
    for (float b : thresholds) {
      const auto expected = static_cast<std::uint64_t>(std::count_if(
          v.begin(), v.end(), [&](float x) { return trim_keeps(x, a) != trim_keeps(x, b); }));
      EXPECT_EQ(dense.decided_differently(a, b), expected) << a << " " << b;
      EXPECT_EQ(sparse.decided_differently(a, b), expected) << a << " " << b;
      EXPECT_EQ(sparse.decided_differently(b, a), expected) << a << " " << b;
      nonzero += expected > 0;
    }
  }
  EXPECT_GT(nonzero, 0);
  EXPECT_EQ(MagnitudeSketch().decided_differently(0.0f, 1.0f), 0u);
}

// The catalog stores these for every (expert, tensor) and a plan uses them instead of
// threshold(): they must be the same floats, bit for bit, at every step.
TEST(MagnitudeSketch, GridThresholdsAreThresholdAtEveryStep) {
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  std::vector<MagnitudeSketch> sketches(5);
  const auto v = deltas(20000, 3);
  sketches[0].add(v.data(), v.size());  // many buckets
  const std::vector<float> few = {0.5f, -0.5f, 0.25f, 2.0f, 0.0f, 0.0f, 0.0f};
  sketches[1].add(few.data(), few.size());  // few entries: k == 0 at low densities
  sketches[2].add_zeros(333);               // all zero: one bucket
  const std::vector<float> one = {-3.0f};
  sketches[3].add(one.data(), one.size());  // one entry; sketches[4] is empty
  for (auto& s : sketches) s.compact();
  for (std::size_t i = 0; i < sketches.size(); ++i) {
    const MagnitudeSketch& s = sketches[i];
    const auto keys = s.keys();
    const auto counts = s.counts();
    for (const std::size_t steps : {std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
      const std::vector<float> grid =
          MagnitudeSketch::grid_thresholds(keys, counts, s.total(), steps);
      ASSERT_EQ(grid.size(), steps);
      for (std::size_t step = 1; step <= steps; ++step) {
        const double density = static_cast<double>(step) / static_cast<double>(steps);
        EXPECT_EQ(bits(grid[step - 1]), bits(s.threshold(density)))
            << "sketch " << i << " step " << step << " of " << steps;
      }
    }
  }
  // The steps differ where the data does, or the comparison proves little.
  const auto grid = MagnitudeSketch::grid_thresholds(sketches[0].keys(), sketches[0].counts(),
                                                     sketches[0].total(), 100);
  EXPECT_GT(std::set<float>(grid.begin(), grid.end()).size(), 50u);
  EXPECT_TRUE(std::isinf(
      MagnitudeSketch::grid_thresholds(sketches[1].keys(), sketches[1].counts(), 7, 100)[0]));
}
