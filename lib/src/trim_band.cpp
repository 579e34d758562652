#include "mergepipe/trim_band.hpp"

#include <cmath>
#include <limits>

#include "mergepipe/magnitude_sketch.hpp"

namespace mergepipe {

BreadcrumbsCounts breadcrumbs_counts(std::uint64_t n, double density, double gamma) {
  BreadcrumbsCounts c;
  if (density >= 1.0) {
    c.keep_all = true;
    return c;
  }
  // Python's int() of a non-negative float: the floor, in double as mergekit computes it.
  const double size = static_cast<double>(n);
  c.keep = static_cast<std::uint64_t>(std::floor(density * size));
  c.top = static_cast<std::uint64_t>(std::floor(gamma * size));
  if (c.keep + c.top > n) c.top = n - c.keep;  // bottom < 0: taken from the top
  return c;
}

TrimBand breadcrumbs_band(std::span<const std::uint16_t> keys,
                          std::span<const std::uint64_t> counts, std::uint64_t total,
                          double density, double gamma) {
  const BreadcrumbsCounts c = breadcrumbs_counts(total, density, gamma);
  if (c.keep_all) return {};
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (c.keeps_nothing()) return {kInf, kInf};
  // The first non-finite bucket (+inf): above it an upper edge would be a NaN, so no cut.
  constexpr std::uint16_t kInfBucket = 0xFF00;
  TrimBand band;
  bool have_upper = false;
  std::uint64_t seen = 0;
  for (std::size_t i = keys.size(); i-- > 0;) {
    seen += counts[i];
    if (!have_upper && seen >= c.top + 1) {  // the largest kept entry's bucket
      have_upper = true;
      band.upper =
          keys[i] < kInfBucket ? bucket_lower_edge(static_cast<std::uint16_t>(keys[i] + 1)) : 0.0f;
    }
    if (seen >= c.top + c.keep) {
      band.lower = bucket_lower_edge(keys[i]);
      return band;
    }
  }
  band.lower = 0.0f;  // fewer entries than top + keep: keep down to zero
  return band;
}

}  // namespace mergepipe
