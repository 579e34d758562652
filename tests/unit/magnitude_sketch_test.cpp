#include "mergepipe/magnitude_sketch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

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

TEST(MagnitudeSketch, RejectsUnsortedSparseInput) {
  const std::vector<std::uint16_t> keys{5, 3};
  const std::vector<std::uint64_t> counts{1, 1};
  EXPECT_THROW(MagnitudeSketch::from_sparse(keys, counts), mergepipe::InputError);
}
