#pragma once
// mergekit's breadcrumbs trim (its magnitude_outliers sparsification): of a tensor's n deltas,
// drop the largest |Δ| (a share gamma of them) and the smallest, keeping int(density·n) in
// between. Here as a band of magnitudes, lower <= |Δ| < upper, decided per (expert, tensor)
// from the whole tensor's magnitude sketch (docs/operators.md, "breadcrumbs").
#include <cstdint>
#include <span>

namespace mergepipe {

// How many entries mergekit keeps and drops from the top, for n entries: keep = int(d·n),
// top = int(γ·n), bottom = n − keep − top; a negative bottom is taken from the top (top +=
// bottom, bottom = 0). density >= 1 keeps everything (no cut at all). mergekit keeps the
// ascending ranks [bottom, n − top), an empty range when top is 0: then nothing is kept.
struct BreadcrumbsCounts {
  bool keep_all = false;  // density >= 1
  std::uint64_t keep = 0, top = 0;
  bool keeps_nothing() const { return !keep_all && (keep == 0 || top == 0); }
};
BreadcrumbsCounts breadcrumbs_counts(std::uint64_t n, double density, double gamma);

// The entries a band keeps: lower <= |Δ| < upper, compared as fp32 bit patterns (so NaN is above
// every number). upper = 0 means no upper cut (NaN kept, as ties keeps it at threshold 0);
// lower = upper = +inf keeps nothing.
struct TrimBand {
  float lower = 0.0f;
  float upper = 0.0f;
  bool operator==(const TrimBand&) const = default;
};

// The band of a sparse magnitude sketch (ascending bucket keys and their counts, summing to
// `total`): lower is the lower edge of the bucket holding the (top + keep)-th largest |Δ|, upper
// the upper edge of the bucket holding the (top + 1)-th largest, the largest kept. Whole buckets
// are kept, so the band holds every entry mergekit keeps and, at its two edges, those sharing a
// bucket with them (as the ties threshold keeps its bucket whole).
TrimBand breadcrumbs_band(std::span<const std::uint16_t> keys,
                          std::span<const std::uint64_t> counts, std::uint64_t total,
                          double density, double gamma);

}  // namespace mergepipe
