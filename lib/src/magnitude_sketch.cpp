#include "mergepipe/magnitude_sketch.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "mergepipe/error.hpp"

namespace mergepipe {

namespace {
constexpr std::size_t kBuckets = std::size_t{1} << 16;
}

float bucket_lower_edge(std::uint16_t bucket) {
  const std::uint32_t bits = static_cast<std::uint32_t>(bucket) << 15;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void MagnitudeSketch::make_dense() {
  if (!dense_.empty()) return;
  dense_.assign(kBuckets, 0);
  for (std::size_t i = 0; i < keys_.size(); ++i) dense_[keys_[i]] += counts_[i];
  keys_.clear();
  counts_.clear();
}

void MagnitudeSketch::add(const float* values, std::size_t n) {
  if (n == 0) return;
  make_dense();
  for (std::size_t i = 0; i < n; ++i) ++dense_[magnitude_bucket(values[i])];
  total_ += n;
}

void MagnitudeSketch::add_zeros(std::size_t n) {
  if (n == 0) return;
  make_dense();
  dense_[magnitude_bucket(0.0f)] += n;
  total_ += n;
}

void MagnitudeSketch::merge(const MagnitudeSketch& other) {
  if (other.total_ == 0) return;
  if (dense_.empty() && other.dense_.empty()) {
    // Sorted merge of two sparse lists.
    std::vector<std::uint16_t> keys;
    std::vector<std::uint64_t> counts;
    std::size_t i = 0, j = 0;
    while (i < keys_.size() || j < other.keys_.size()) {
      if (j == other.keys_.size() || (i < keys_.size() && keys_[i] < other.keys_[j])) {
        keys.push_back(keys_[i]);
        counts.push_back(counts_[i++]);
      } else if (i == keys_.size() || other.keys_[j] < keys_[i]) {
        keys.push_back(other.keys_[j]);
        counts.push_back(other.counts_[j++]);
      } else {
        keys.push_back(keys_[i]);
        counts.push_back(counts_[i++] + other.counts_[j++]);
      }
    }
    keys_ = std::move(keys);
    counts_ = std::move(counts);
    total_ += other.total_;
    return;
  }
  make_dense();
  if (!other.dense_.empty()) {
    for (std::size_t b = 0; b < kBuckets; ++b) dense_[b] += other.dense_[b];
  } else {
    for (std::size_t i = 0; i < other.keys_.size(); ++i) dense_[other.keys_[i]] += other.counts_[i];
  }
  total_ += other.total_;
}

void MagnitudeSketch::compact() {
  if (dense_.empty()) return;
  keys_ = keys();
  counts_ = counts();
  dense_.clear();
  dense_.shrink_to_fit();
}

float MagnitudeSketch::threshold(double density) const {
  if (density >= 1.0) return 0.0f;
  const auto k = static_cast<std::uint64_t>(std::floor(density * static_cast<double>(total_)));
  if (k == 0) return std::numeric_limits<float>::infinity();
  std::uint64_t seen = 0;
  if (!dense_.empty()) {
    for (std::size_t b = kBuckets; b-- > 0;) {
      seen += dense_[b];
      if (seen >= k) return bucket_lower_edge(static_cast<std::uint16_t>(b));
    }
  } else {
    for (std::size_t i = keys_.size(); i-- > 0;) {
      seen += counts_[i];
      if (seen >= k) return bucket_lower_edge(keys_[i]);
    }
  }
  return 0.0f;
}

std::uint64_t MagnitudeSketch::kept_count(float threshold) const {
  if (std::isinf(threshold)) return 0;
  const std::uint16_t first = magnitude_bucket(threshold);
  std::uint64_t kept = 0;
  if (!dense_.empty()) {
    for (std::size_t b = first; b < kBuckets; ++b) kept += dense_[b];
  } else {
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] >= first) kept += counts_[i];
  }
  return kept;
}

std::vector<std::uint16_t> MagnitudeSketch::keys() const {
  if (dense_.empty()) return keys_;
  std::vector<std::uint16_t> out;
  for (std::size_t b = 0; b < kBuckets; ++b)
    if (dense_[b]) out.push_back(static_cast<std::uint16_t>(b));
  return out;
}

std::vector<std::uint64_t> MagnitudeSketch::counts() const {
  if (dense_.empty()) return counts_;
  std::vector<std::uint64_t> out;
  for (std::uint64_t c : dense_)
    if (c) out.push_back(c);
  return out;
}

bool MagnitudeSketch::operator==(const MagnitudeSketch& other) const {
  return total_ == other.total_ && keys() == other.keys() && counts() == other.counts();
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
