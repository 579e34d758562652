#pragma once
// Magnitude sketch of one (expert, tensor) delta: a sparse histogram of |Δ| over buckets of
// relative width 2^-8 (a bucket = the fp32 exponent and the top 8 mantissa bits). It gives the
// TIES/DARE top-k trimming threshold for any density, rounded toward keeping more (SPEC §3).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "mergepipe/trim_band.hpp"

namespace mergepipe {

// Bucket key of |x|: bits 30..15 of the fp32 pattern of |x| (exponent + top 8 mantissa bits).
inline std::uint16_t magnitude_bucket(float x) {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  return static_cast<std::uint16_t>((bits & 0x7fffffffu) >> 15);
}
// Smallest |x| in a bucket (its lower edge), as a float.
float bucket_lower_edge(std::uint16_t bucket);

// Two parts with one meaning, their sum: dense counters (used while values are added) and a
// sparse list of non-empty buckets (what a loaded catalog holds: a few KiB instead of 512 KiB per
// expert and tensor). compact() folds the dense part into the sparse one and hands its counters,
// cleared, to a process-wide pool that the next sketch takes them from.
class MagnitudeSketch {
 public:
  MagnitudeSketch() = default;
  // Adds n values (deltas).
  void add(const float* values, std::size_t n);
  // Adds the n deltas float(expert[i]) − base[i] of bf16 expert values (the executor's Δ, bit
  // for bit) without storing them.
  void add_bf16_deltas(const std::byte* expert_bf16, const float* base, std::size_t n);
  // Adds n deltas that are exactly zero (what add() of n zeros does, without reading them).
  void add_zeros(std::size_t n);
  void merge(const MagnitudeSketch& other);
  // Folds the dense counters into the sparse form and releases them (after the last add).
  void compact();

  // Threshold t for density d: with k = floor(d·n), t is the lower edge of the bucket holding
  // the k-th largest |Δ|; keep entries with |Δ| >= t (this keeps at least k). d >= 1 gives 0
  // (keep everything); k == 0 gives +infinity (keep nothing).
  float threshold(double density) const;
  // breadcrumbs' band at this density and gamma (trim_band.hpp).
  TrimBand band(double density, double gamma) const;
  // threshold() of a sketch in sparse form (ascending keys, counts summing to `total`), without
  // building it: a plan needs one threshold per sketch, not the sketch.
  static float threshold(std::span<const std::uint16_t> keys, std::span<const std::uint64_t> counts,
                         std::uint64_t total, double density);
  // threshold(keys, counts, total, d) at every density d = i / steps, i = 1..steps, in one pass
  // (element i - 1): what a catalog stores so that a plan at such a density reads no sketch.
  static std::vector<float> grid_thresholds(std::span<const std::uint16_t> keys,
                                            std::span<const std::uint64_t> counts,
                                            std::uint64_t total, std::size_t steps);
  // Number of entries an entry-wise `|Δ| >= threshold(d)` keeps.
  std::uint64_t kept_count(float threshold) const;
  // Number of entries that a TIES trim (|Δ| >= t on the bit patterns, so NaN counts as the
  // largest) keeps under one of two thresholds of threshold() and drops under the other: those
  // whose bucket lies between theirs. Zero means both thresholds trim these values alike.
  std::uint64_t decided_differently(float a, float b) const;

  std::uint64_t total() const { return total_; }
  // Sparse form for storage: ascending bucket keys with their counts.
  std::vector<std::uint16_t> keys() const;
  std::vector<std::uint64_t> counts() const;
  static MagnitudeSketch from_sparse(std::span<const std::uint16_t> keys,
                                     std::span<const std::uint64_t> counts);
  // The total count of a sparse form; InputError unless the keys ascend strictly, the lengths
  // agree and the sum fits in 64 bits (what from_sparse accepts).
  static std::uint64_t check_sparse(std::span<const std::uint16_t> keys,
                                    std::span<const std::uint64_t> counts);
  bool operator==(const MagnitudeSketch& other) const;

  // Keys counted with vector compares instead of one increment each (see count()).
  static constexpr std::size_t kHotKeys = 8;

 private:
  // Counters of the dense part are 32-bit and come in two lanes per bucket (a key counted one by
  // one at position i counts in lane i % 2, both in one cache line): half the cache footprint of
  // 64-bit counters, and runs of equal keys form two independent chains of increments, not one.
  static constexpr std::size_t kLanes = 2;
  // Values the dense part may take before its counters could overflow: then it is folded.
  static constexpr std::uint64_t kDenseCapacity = 0xffffffffu;

  // Makes room for n more values in the dense part, allocating or folding it as needed.
  std::uint32_t* dense_for(std::size_t n);
  // Counts n <= 4096 keys. Deltas of bf16 weights are mostly a few units in the last place of
  // the base: zero and a handful of powers of two (K = 10 family: 55% in one bucket, 90% in six).
  // Counting them one by one made ~1 G keys/s per core whatever the lanes (2 lanes 1.03, 8 lanes
  // 1.34), a few increments of the same counters in flight at once. So the keys of the sketch's
  // kHotKeys most frequent buckets (chosen from its first step, again when most of a large step
  // misses them) are counted with vector compares, and only the others one by one: 1.47 G/s.
  void count(const std::uint16_t* keys, std::size_t n);
  void choose_hot_keys(const std::uint16_t* keys, std::size_t n);
  void fold_dense();
  void dense_as_sparse(std::vector<std::uint16_t>& keys, std::vector<std::uint64_t>& counts) const;
  static void merge_sorted(std::span<const std::uint16_t> a_keys,
                           std::span<const std::uint64_t> a_counts,
                           std::span<const std::uint16_t> b_keys,
                           std::span<const std::uint64_t> b_counts,
                           std::vector<std::uint16_t>& keys, std::vector<std::uint64_t>& counts);
  void merge_sparse(std::span<const std::uint16_t> keys, std::span<const std::uint64_t> counts);
  // The sum of both parts as a sparse list.
  void combined(std::vector<std::uint16_t>& keys, std::vector<std::uint64_t>& counts) const;
  // The same sum to read: the sparse part itself when the dense part is empty (every sketch of a
  // loaded catalog), else combined() into the storage given. A K = 20 TIES plan spent 3 ms of its
  // 7 copying 1.8 M buckets for 6,220 thresholds.
  std::pair<std::span<const std::uint16_t>, std::span<const std::uint64_t>> sparse_view(
      std::vector<std::uint16_t>& key_storage, std::vector<std::uint64_t>& count_storage) const;

  std::array<std::uint16_t, kHotKeys> hot_{};  // distinct keys, valid when has_hot_
  bool has_hot_ = false;
  std::vector<std::uint32_t> dense_;  // kLanes counters per bucket while adding, else empty
  std::uint64_t dense_count_ = 0;     // values counted in dense_
  std::vector<std::uint16_t> keys_;   // sparse part: ascending non-empty buckets
  std::vector<std::uint64_t> counts_;
  std::uint64_t total_ = 0;
};

}  // namespace mergepipe
