#include "mergepipe/magnitude_sketch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

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

// Counts the keys key_of(0..n) into lanes-wide dense counters, element i in lane i % lanes.
// Unrolled by the lane count, so the increments of one iteration never share a counter.
template <std::size_t lanes, class KeyOf>
inline void count_keys(std::uint32_t* counters, std::size_t n, KeyOf key_of) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t lane = 0; lane < lanes; ++lane) ++counters[lanes * key_of(i + lane) + lane];
  for (; i < n; ++i) ++counters[lanes * key_of(i) + i % lanes];
}

// Zeroed dense counter arrays, kept when a sketch goes sparse. A scan makes one sketch per
// expert and tensor: allocating and clearing 512 KiB for each cost a memset and often fresh
// pages (glibc trims its heap when a tensor's arrays are freed together), which the test VM
// faults in at about 1 GB/s. A cold K = 10 full-read TIES took 129 k page faults, 43 k with it.
class CounterPool {
 public:
  std::vector<std::uint32_t> take(std::size_t size) {
    {
      std::lock_guard lock(mutex_);
      while (!free_.empty()) {
        std::vector<std::uint32_t> counters = std::move(free_.back());
        free_.pop_back();
        if (counters.size() == size) return counters;
      }
    }
    return std::vector<std::uint32_t>(size, 0u);
  }
  // `counters` must be all zero.
  void give_back(std::vector<std::uint32_t>&& counters) {
    std::lock_guard lock(mutex_);
    if (free_.size() < kKept) free_.push_back(std::move(counters));
  }

 private:
  // Enough for the sketches of one tensor's experts in flight at K = 64 (32-64 MiB).
  static constexpr std::size_t kKept = 64;
  std::mutex mutex_;
  std::vector<std::vector<std::uint32_t>> free_;
};

CounterPool& counter_pool() {
  static CounterPool pool;
  return pool;
}
}  // namespace

float bucket_lower_edge(std::uint16_t bucket) {
  const std::uint32_t bits = static_cast<std::uint32_t>(bucket) << 15;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint32_t* MagnitudeSketch::dense_for(std::size_t n) {
  if (dense_.empty()) dense_ = counter_pool().take(kBuckets * kLanes);
  if (dense_count_ + n > kDenseCapacity) fold_dense();
  dense_count_ += n;
  total_ += n;
  return dense_.data();
}

void MagnitudeSketch::add(const float* values, std::size_t n) {
  // Pieces small enough that no counter can overflow between folds.
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min<std::size_t>(n - done, kDenseCapacity);
    const float* v = values + done;
    count_keys<kLanes>(dense_for(m), m, [v](std::size_t i) { return magnitude_bucket(v[i]); });
    done += m;
  }
}

void MagnitudeSketch::add_bf16_deltas(const std::byte* expert_bf16, const float* base,
                                      std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min<std::size_t>(n - done, kDenseCapacity);
    const std::byte* e = expert_bf16 + 2 * done;
    const float* b = base + done;
    count_keys<kLanes>(dense_for(m), m, [e, b](std::size_t i) {
      return magnitude_bucket(bf16_value(e + 2 * i) - b[i]);
    });
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
  // Reads every counter and clears only those in use, in the same pass.
  for (std::size_t b = 0; b < kBuckets; ++b) {
    std::uint32_t* lanes = dense_.data() + b * kLanes;
    std::uint64_t c = 0;
    for (std::size_t lane = 0; lane < kLanes; ++lane) c += lanes[lane];
    if (c) {
      keys.push_back(static_cast<std::uint16_t>(b));
      counts.push_back(c);
      std::fill(lanes, lanes + kLanes, 0u);
    }
  }
  merge_sparse(keys, counts);
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
    if (dense_.empty()) dense_ = counter_pool().take(kBuckets * kLanes);
    if (dense_count_ + other.dense_count_ > kDenseCapacity) fold_dense();
    for (std::size_t i = 0; i < dense_.size(); ++i) dense_[i] += other.dense_[i];
    dense_count_ += other.dense_count_;
  }
  merge_sparse(other.keys_, other.counts_);
  total_ += other.total_;
}

void MagnitudeSketch::compact() {
  if (dense_.empty()) return;
  fold_dense();
  counter_pool().give_back(std::move(dense_));
  dense_ = {};
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
