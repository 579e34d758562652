#include "mergepipe/magnitude_sketch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mergepipe/error.hpp"

namespace mergepipe {

namespace {
constexpr std::size_t kBuckets = std::size_t{1} << 16;

inline float bf16_value(const std::byte* p) {
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

float bucket_lower_edge(std::uint16_t bucket) {
  const std::uint32_t bits = static_cast<std::uint32_t>(bucket) << 15;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint32_t* MagnitudeSketch::dense_for(std::size_t n) {
  if (dense_.empty()) dense_.assign(kBuckets * kLanes, 0);
  if (dense_count_ + n > kDenseCapacity) fold_dense();
  dense_count_ += n;
  total_ += n;
  return dense_.data();
}

void MagnitudeSketch::add(const float* values, std::size_t n) {
  // Pieces small enough that no counter can overflow between folds.
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min<std::size_t>(n - done, kDenseCapacity);
    std::uint32_t* h = dense_for(m);
    const float* v = values + done;
    std::size_t i = 0;
    for (; i + kLanes <= m; i += kLanes) {
      ++h[kLanes * magnitude_bucket(v[i])];
      ++h[kLanes * magnitude_bucket(v[i + 1]) + 1];
    }
    if (i < m) ++h[kLanes * magnitude_bucket(v[i])];
    done += m;
  }
}

void MagnitudeSketch::add_bf16_deltas(const std::byte* expert_bf16, const float* base,
                                      std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min<std::size_t>(n - done, kDenseCapacity);
    std::uint32_t* h = dense_for(m);
    const std::byte* e = expert_bf16 + 2 * done;
    const float* b = base + done;
    std::size_t i = 0;
    for (; i + kLanes <= m; i += kLanes) {
      ++h[kLanes * magnitude_bucket(bf16_value(e + 2 * i) - b[i])];
      ++h[kLanes * magnitude_bucket(bf16_value(e + 2 * i + 2) - b[i + 1]) + 1];
    }
    if (i < m) ++h[kLanes * magnitude_bucket(bf16_value(e + 2 * i) - b[i])];
    done += m;
  }
}

void MagnitudeSketch::add_zeros(std::size_t n) {
  if (n == 0) return;
  const std::uint16_t zero = magnitude_bucket(0.0f);
  const std::uint64_t count = n;
  merge_sparse(std::span(&zero, 1), std::span(&count, 1));
  total_ += n;
}

void MagnitudeSketch::fold_dense() {
  if (dense_count_ == 0) return;
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  dense_as_sparse(keys, counts);
  merge_sparse(keys, counts);
  std::fill(dense_.begin(), dense_.end(), 0u);
  dense_count_ = 0;
}

void MagnitudeSketch::dense_as_sparse(std::vector<std::uint16_t>& keys,
                                      std::vector<std::uint64_t>& counts) const {
  keys.clear();
  counts.clear();
  if (dense_count_ == 0) return;
  for (std::size_t b = 0; b < kBuckets; ++b) {
    std::uint64_t c = 0;
    for (std::size_t lane = 0; lane < kLanes; ++lane) c += dense_[b * kLanes + lane];
    if (c) {
      keys.push_back(static_cast<std::uint16_t>(b));
      counts.push_back(c);
    }
  }
}

void MagnitudeSketch::merge_sorted(std::span<const std::uint16_t> a_keys,
                                   std::span<const std::uint64_t> a_counts,
                                   std::span<const std::uint16_t> b_keys,
                                   std::span<const std::uint64_t> b_counts,
                                   std::vector<std::uint16_t>& keys,
                                   std::vector<std::uint64_t>& counts) {
  keys.clear();
  counts.clear();
  keys.reserve(a_keys.size() + b_keys.size());
  counts.reserve(a_keys.size() + b_keys.size());
  std::size_t i = 0, j = 0;
  while (i < a_keys.size() || j < b_keys.size()) {
    if (j == b_keys.size() || (i < a_keys.size() && a_keys[i] < b_keys[j])) {
      keys.push_back(a_keys[i]);
      counts.push_back(a_counts[i++]);
    } else if (i == a_keys.size() || b_keys[j] < a_keys[i]) {
      keys.push_back(b_keys[j]);
      counts.push_back(b_counts[j++]);
    } else {
      keys.push_back(a_keys[i]);
      counts.push_back(a_counts[i++] + b_counts[j++]);
    }
  }
}

void MagnitudeSketch::merge_sparse(std::span<const std::uint16_t> keys,
                                   std::span<const std::uint64_t> counts) {
  if (keys.empty()) return;
  std::vector<std::uint16_t> k;
  std::vector<std::uint64_t> c;
  merge_sorted(keys_, counts_, keys, counts, k, c);
  keys_ = std::move(k);
  counts_ = std::move(c);
}

void MagnitudeSketch::merge(const MagnitudeSketch& other) {
  if (other.total_ == 0) return;
  if (other.dense_count_ > 0) {
    if (dense_.empty()) dense_.assign(kBuckets * kLanes, 0);
    if (dense_count_ + other.dense_count_ > kDenseCapacity) fold_dense();
    for (std::size_t i = 0; i < dense_.size(); ++i) dense_[i] += other.dense_[i];
    dense_count_ += other.dense_count_;
  }
  merge_sparse(other.keys_, other.counts_);
  total_ += other.total_;
}

void MagnitudeSketch::compact() {
  fold_dense();
  dense_.clear();
  dense_.shrink_to_fit();
}

void MagnitudeSketch::combined(std::vector<std::uint16_t>& keys,
                               std::vector<std::uint64_t>& counts) const {
  std::vector<std::uint16_t> dense_keys;
  std::vector<std::uint64_t> dense_counts;
  dense_as_sparse(dense_keys, dense_counts);
  merge_sorted(keys_, counts_, dense_keys, dense_counts, keys, counts);
}

float MagnitudeSketch::threshold(double density) const {
  if (density >= 1.0) return 0.0f;
  const auto k = static_cast<std::uint64_t>(std::floor(density * static_cast<double>(total_)));
  if (k == 0) return std::numeric_limits<float>::infinity();
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  combined(keys, counts);
  std::uint64_t seen = 0;
  for (std::size_t i = keys.size(); i-- > 0;) {
    seen += counts[i];
    if (seen >= k) return bucket_lower_edge(keys[i]);
  }
  return 0.0f;
}

std::uint64_t MagnitudeSketch::kept_count(float threshold) const {
  if (std::isinf(threshold)) return 0;
  const std::uint16_t first = magnitude_bucket(threshold);
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  combined(keys, counts);
  std::uint64_t kept = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] >= first) kept += counts[i];
  return kept;
}

std::vector<std::uint16_t> MagnitudeSketch::keys() const {
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  combined(keys, counts);
  return keys;
}

std::vector<std::uint64_t> MagnitudeSketch::counts() const {
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  combined(keys, counts);
  return counts;
}

bool MagnitudeSketch::operator==(const MagnitudeSketch& other) const {
  if (total_ != other.total_) return false;
  std::vector<std::uint16_t> ka, kb;
  std::vector<std::uint64_t> ca, cb;
  combined(ka, ca);
  other.combined(kb, cb);
  return ka == kb && ca == cb;
}

MagnitudeSketch MagnitudeSketch::from_sparse(std::span<const std::uint16_t> keys,
                                             std::span<const std::uint64_t> counts) {
  if (keys.size() != counts.size())
    throw InputError("magnitude sketch: keys and counts differ in length");
  MagnitudeSketch s;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] <= keys[i - 1])
      throw InputError("magnitude sketch: bucket keys are not ascending");
    if (counts[i] == 0) continue;
    s.keys_.push_back(keys[i]);
    s.counts_.push_back(counts[i]);
    s.total_ += counts[i];
  }
  return s;
}

}  // namespace mergepipe
