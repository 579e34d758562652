#pragma once
// Magnitude sketch of one (expert, tensor) delta: a sparse histogram of |Δ| over buckets of
// relative width 2^-8 (a bucket = the fp32 exponent and the top 8 mantissa bits). It gives the
// TIES/DARE top-k trimming threshold for any density, rounded toward keeping more (SPEC §3).
#include <cstdint>
#include <span>
#include <vector>

namespace mergepipe {

// Bucket key of |x|: bits 30..15 of the fp32 pattern of |x| (exponent + top 8 mantissa bits).
inline std::uint16_t magnitude_bucket(float x) {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  return static_cast<std::uint16_t>((bits & 0x7fffffffu) >> 15);
}
// Smallest |x| in a bucket (its lower edge), as a float.
float bucket_lower_edge(std::uint16_t bucket);

// Two representations with the same meaning: dense (65,536 counters, used while values are
// added) and sparse (sorted non-empty buckets, what a loaded catalog holds: a few KiB instead of
// 512 KiB per expert and tensor). Merging two sparse sketches stays sparse.
class MagnitudeSketch {
 public:
  MagnitudeSketch() = default;
  // Adds n values (deltas). Switches to the dense form.
  void add(const float* values, std::size_t n);
  // Adds n deltas that are exactly zero (what add() of n zeros does, without reading them).
  void add_zeros(std::size_t n);
  void merge(const MagnitudeSketch& other);
  // Switches to the sparse form (after the last add) to release the dense counters.
  void compact();

  // Threshold t for density d: with k = floor(d·n), t is the lower edge of the bucket holding
  // the k-th largest |Δ|; keep entries with |Δ| >= t (this keeps at least k). d >= 1 gives 0
  // (keep everything); k == 0 gives +infinity (keep nothing).
  float threshold(double density) const;
  // Number of entries an entry-wise `|Δ| >= threshold(d)` keeps.
  std::uint64_t kept_count(float threshold) const;

  std::uint64_t total() const { return total_; }
  // Sparse form for storage: ascending bucket keys with their counts.
  std::vector<std::uint16_t> keys() const;
  std::vector<std::uint64_t> counts() const;
  static MagnitudeSketch from_sparse(std::span<const std::uint16_t> keys,
                                     std::span<const std::uint64_t> counts);
  bool operator==(const MagnitudeSketch& other) const;

 private:
  void make_dense();

  std::vector<std::uint64_t> dense_;  // 65536 buckets while adding, else empty
  std::vector<std::uint16_t> keys_;   // sparse form: ascending non-empty buckets
  std::vector<std::uint64_t> counts_;
  std::uint64_t total_ = 0;
};

}  // namespace mergepipe
