// breadcrumbs' band (trim_band.hpp): mergekit's counts, and the band a sketch gives.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/trim_band.hpp"

using namespace mergepipe;

namespace {

std::size_t kept_by(const TrimBand& band, const std::vector<float>& values) {
  std::size_t kept = 0;
  for (float v : values) {
    const float m = std::fabs(v);
    kept += m >= band.lower && (band.upper <= 0.0f || m < band.upper);
  }
  return kept;
}

TrimBand band_of(const std::vector<float>& values, double density, double gamma) {
  MagnitudeSketch sketch;
  sketch.add(values.data(), values.size());
  return sketch.band(density, gamma);
}

}  // namespace

TEST(TrimBand, CountsAreMergekits) {
  // The golden cases' own arithmetic (tests/data/golden, breadcrumbs/*).
  BreadcrumbsCounts c = breadcrumbs_counts(128, 0.8, 0.05);
  EXPECT_EQ(c.keep, 102u);
  EXPECT_EQ(c.top, 6u);
  EXPECT_FALSE(c.keeps_nothing());
  c = breadcrumbs_counts(128, 0.5, 0.01);
  EXPECT_EQ(c.top, 1u);
  // 32 entries at gamma 0.01: no entry on top, and mergekit's slice [bottom:-0] is empty.
  c = breadcrumbs_counts(32, 0.5, 0.01);
  EXPECT_EQ(c.top, 0u);
  EXPECT_TRUE(c.keeps_nothing());
  // gamma beyond what is left: the bottom count would be negative, it is taken from the top.
  c = breadcrumbs_counts(32, 0.7, 0.5);
  EXPECT_EQ(c.keep, 22u);
  EXPECT_EQ(c.top, 10u);
  c = breadcrumbs_counts(32, 1.0, 0.3);
  EXPECT_TRUE(c.keep_all);
  EXPECT_FALSE(c.keeps_nothing());
  EXPECT_TRUE(breadcrumbs_counts(10, 0.05, 0.5).keeps_nothing());  // int(0.5) = 0 kept
}

TEST(TrimBand, DistinctMagnitudesKeepExactlyMergekitsRanks) {
  // 1..100, signs alternating: every value in its own bucket, so the band is exact. Top 10
  // dropped (91..100), the next 50 kept (41..90).
  std::vector<float> v;
  for (int i = 1; i <= 100; ++i) v.push_back(static_cast<float>(i % 2 ? i : -i));
  const TrimBand b = band_of(v, 0.5, 0.1);
  EXPECT_EQ(kept_by(b, v), 50u);
  EXPECT_GT(b.lower, 40.0f);
  EXPECT_LE(b.lower, 41.0f);
  EXPECT_GT(b.upper, 90.0f);
  EXPECT_LE(b.upper, 91.0f);
  // Keeping down to the smallest (bottom 0) keeps zeros too: the lower edge is 0.
  std::vector<float> with_zeros = v;
  with_zeros.resize(120, 0.0f);
  const TrimBand all_below = band_of(with_zeros, 0.9, 0.1);  // keep 108, top 12
  EXPECT_EQ(all_below.lower, 0.0f);
  EXPECT_EQ(kept_by(all_below, with_zeros), 108u);
}

TEST(TrimBand, EdgesKeepWholeBucketsAndSpecialCases) {
  // All equal: one bucket, both cuts fall in it, and it is kept whole (toward keeping more).
  const std::vector<float> same(100, 0.25f);
  const TrimBand b = band_of(same, 0.5, 0.1);
  EXPECT_EQ(kept_by(b, same), 100u);
  EXPECT_EQ(b.lower, 0.25f);
  EXPECT_GT(b.upper, 0.25f);
  // density >= 1: no cut at all (NaN kept, as ties' threshold 0 keeps it).
  EXPECT_EQ(band_of(same, 1.0, 0.1), TrimBand{});
  // Nothing on top (gamma·n < 1): nothing kept, by mergekit's empty slice.
  const TrimBand none = band_of(same, 0.5, 0.001);
  EXPECT_TRUE(std::isinf(none.lower));
  EXPECT_TRUE(std::isinf(none.upper));
  EXPECT_EQ(kept_by(none, same), 0u);
  // The largest kept entry infinite: an upper cut above the Inf bucket would be a NaN edge; none.
  std::vector<float> inf_top(98, 1.0f);
  inf_top.resize(100, std::numeric_limits<float>::infinity());
  EXPECT_EQ(band_of(inf_top, 0.5, 0.01).upper, 0.0f);
  // One infinite entry on top (the one dropped): the cut lies above the 1.0 bucket.
  inf_top[98] = 1.0f;
  const TrimBand finite = band_of(inf_top, 0.5, 0.01);
  EXPECT_GT(finite.upper, 1.0f);
  EXPECT_LT(finite.upper, 1.01f);
  // From a sparse form as from the sketch itself.
  MagnitudeSketch s;
  s.add(same.data(), same.size());
  const auto keys = s.keys();
  const auto counts = s.counts();
  EXPECT_EQ(breadcrumbs_band(keys, counts, s.total(), 0.5, 0.1), b);
}
