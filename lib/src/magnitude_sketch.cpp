#include "mergepipe/magnitude_sketch.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "mergepipe/error.hpp"

namespace mergepipe {

float bucket_lower_edge(std::uint16_t bucket) {
  const std::uint32_t bits = static_cast<std::uint32_t>(bucket) << 15;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void MagnitudeSketch::add(const float* values, std::size_t n) {
  if (n == 0) return;
  if (dense_.empty()) dense_.assign(1u << 16, 0);
  for (std::size_t i = 0; i < n; ++i) ++dense_[magnitude_bucket(values[i])];
  total_ += n;
}

void MagnitudeSketch::merge(const MagnitudeSketch& other) {
  if (other.total_ == 0) return;
  if (dense_.empty()) dense_.assign(1u << 16, 0);
  for (std::size_t b = 0; b < other.dense_.size(); ++b) dense_[b] += other.dense_[b];
  total_ += other.total_;
}

float MagnitudeSketch::threshold(double density) const {
  if (density >= 1.0) return 0.0f;
  const auto k = static_cast<std::uint64_t>(std::floor(density * static_cast<double>(total_)));
  if (k == 0) return std::numeric_limits<float>::infinity();
  std::uint64_t seen = 0;
  for (std::size_t b = dense_.size(); b-- > 0;) {
    seen += dense_[b];
    if (seen >= k) return bucket_lower_edge(static_cast<std::uint16_t>(b));
  }
  return 0.0f;
}

std::uint64_t MagnitudeSketch::kept_count(float threshold) const {
  if (std::isinf(threshold)) return 0;
  const std::uint16_t first = magnitude_bucket(threshold);
  std::uint64_t kept = 0;
  for (std::size_t b = first; b < dense_.size(); ++b) kept += dense_[b];
  return kept;
}

std::vector<std::uint16_t> MagnitudeSketch::keys() const {
  std::vector<std::uint16_t> out;
  for (std::size_t b = 0; b < dense_.size(); ++b)
    if (dense_[b]) out.push_back(static_cast<std::uint16_t>(b));
  return out;
}

std::vector<std::uint64_t> MagnitudeSketch::counts() const {
  std::vector<std::uint64_t> out;
  for (std::uint64_t c : dense_)
    if (c) out.push_back(c);
  return out;
}

MagnitudeSketch MagnitudeSketch::from_sparse(std::span<const std::uint16_t> keys,
                                             std::span<const std::uint64_t> counts) {
  if (keys.size() != counts.size()) throw InputError("magnitude sketch: keys and counts differ in length");
  MagnitudeSketch s;
  if (keys.empty()) return s;
  s.dense_.assign(1u << 16, 0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    s.dense_[keys[i]] += counts[i];
    s.total_ += counts[i];
  }
  return s;
}

}  // namespace mergepipe
