#include "mergepipe/magnitude_sketch.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "mergepipe/error.hpp"

// Key kernels: written so GCC vectorises each loop; compiled for the baseline ISA and for
// AVX2/AVX-512 and picked at load time (as in dtype.cpp).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MERGEPIPE_SKETCH_KERNEL __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MERGEPIPE_SKETCH_KERNEL
#endif

namespace mergepipe {

namespace {
constexpr std::size_t kBuckets = std::size_t{1} << 16;
// Keys counted per step: 8 KiB of keys and 4 KiB of flags, in L1; small enough that 16-bit sums
// of a step cannot overflow.
constexpr std::size_t kStep = 4096;

// keys[i] = magnitude_bucket(float(expert[i]) - base[i]) for bf16 expert values.
MERGEPIPE_SKETCH_KERNEL void bf16_delta_keys(const std::byte* __restrict expert,
                                             const float* __restrict base,
                                             std::uint16_t* __restrict keys, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, expert + 2 * i, sizeof h);
    const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    keys[i] = magnitude_bucket(value - base[i]);
  }
}

MERGEPIPE_SKETCH_KERNEL void float_keys(const float* __restrict values,
                                        std::uint16_t* __restrict keys, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) keys[i] = magnitude_bucket(values[i]);
}

// counts[h] = how many of the n <= kStep keys equal hot[h] (distinct keys); cold[i] = 1 when
// keys[i] is none of them, else 0.
MERGEPIPE_SKETCH_KERNEL void count_hot_keys(const std::uint16_t* __restrict keys, std::size_t n,
                                            const std::uint16_t* __restrict hot,
                                            std::uint32_t* __restrict counts,
                                            std::uint8_t* __restrict cold) {
  constexpr std::size_t kHot = MagnitudeSketch::kHotKeys;
  std::uint16_t h[kHot];
  std::memcpy(h, hot, sizeof h);
  std::uint16_t c[kHot] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t k = keys[i];
    std::uint8_t is_hot = 0;
    for (std::size_t j = 0; j < kHot; ++j) {
      const bool equal = k == h[j];
      c[j] = static_cast<std::uint16_t>(c[j] + equal);
      is_hot |= static_cast<std::uint8_t>(equal);
    }
    cold[i] = static_cast<std::uint8_t>(is_hot ^ 1u);
  }
  for (std::size_t j = 0; j < kHot; ++j) counts[j] = c[j];
}

// Bit i of the result is flags[i] (each 0 or 1), for 64 flags.
inline std::uint64_t flag_bits(const std::uint8_t* flags) {
  std::uint64_t bits = 0;
  for (int group = 0; group < 8; ++group) {
    std::uint64_t eight;
    std::memcpy(&eight, flags + 8 * group, sizeof eight);
    // Byte b of `eight` lands on bit 56 + b of the product, with no carries between them.
    bits |= ((eight * 0x0102040810204080ull) >> 56) << (8 * group);
  }
  return bits;
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
  std::uint16_t keys[kStep];
  for (std::size_t done = 0; done < n; done += kStep) {
    const std::size_t m = std::min(n - done, kStep);
    float_keys(values + done, keys, m);
    count(keys, m);
  }
}

void MagnitudeSketch::add_bf16_deltas(const std::byte* expert_bf16, const float* base,
                                      std::size_t n) {
  std::uint16_t keys[kStep];
  for (std::size_t done = 0; done < n; done += kStep) {
    const std::size_t m = std::min(n - done, kStep);
    bf16_delta_keys(expert_bf16 + 2 * done, base + done, keys, m);
    count(keys, m);
  }
}

void MagnitudeSketch::count(const std::uint16_t* keys, std::size_t n) {
  std::uint32_t* counters = dense_for(n);
  if (!has_hot_) {
    count_keys<kLanes>(counters, n, [keys](std::size_t i) { return keys[i]; });
    choose_hot_keys(keys, n);
    return;
  }
  std::uint32_t hot_counts[kHotKeys];
  alignas(64) std::uint8_t cold[kStep + 64];
  count_hot_keys(keys, n, hot_.data(), hot_counts, cold);
  std::size_t cold_count = n;
  for (std::size_t j = 0; j < kHotKeys; ++j) {
    counters[kLanes * hot_[j]] += hot_counts[j];
    cold_count -= hot_counts[j];
  }
  const std::size_t padded = (n + 63) / 64 * 64;
  std::fill(cold + n, cold + padded, std::uint8_t{0});
  for (std::size_t first = 0; first < n; first += 64) {
    for (std::uint64_t bits = flag_bits(cold + first); bits != 0; bits &= bits - 1) {
      const auto i = static_cast<std::size_t>(std::countr_zero(bits));
      ++counters[kLanes * keys[first + i] + i % kLanes];
    }
  }
  // The deltas moved to other magnitudes (another part of the tensor): choose again, from a
  // step large enough to tell.
  if (n >= kStep / 4 && 2 * cold_count > n) choose_hot_keys(keys, n);
}

void MagnitudeSketch::choose_hot_keys(const std::uint16_t* keys, std::size_t n) {
  // The most frequent keys of this step by their counts so far (already counted), distinct.
  std::array<std::uint64_t, kHotKeys> best_counts{};
  std::array<std::uint16_t, kHotKeys> best{};
  std::size_t found = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t k = keys[i];
    if (std::find(best.begin(), best.begin() + found, k) != best.begin() + found) continue;
    std::uint64_t c = 0;
    for (std::size_t lane = 0; lane < kLanes; ++lane) c += dense_[kLanes * k + lane];
    std::size_t at = found;
    if (found < kHotKeys) {
      ++found;
    } else if (c <= best_counts[kHotKeys - 1]) {
      continue;
    } else {
      at = kHotKeys - 1;
    }
    for (; at > 0 && best_counts[at - 1] < c; --at) {
      best_counts[at] = best_counts[at - 1];
      best[at] = best[at - 1];
    }
    best_counts[at] = c;
    best[at] = k;
  }
  // Fewer distinct keys than slots: the rest get other distinct keys (counting their values
  // there is still exact).
  for (std::uint16_t filler = 0xffff; found < kHotKeys; --filler)
    if (std::find(best.begin(), best.begin() + found, filler) == best.begin() + found)
      best[found++] = filler;
  hot_ = best;
  has_hot_ = true;
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

std::pair<std::span<const std::uint16_t>, std::span<const std::uint64_t>>
MagnitudeSketch::sparse_view(std::vector<std::uint16_t>& key_storage,
                             std::vector<std::uint64_t>& count_storage) const {
  if (dense_count_ == 0) return {keys_, counts_};
  combined(key_storage, count_storage);
  return {key_storage, count_storage};
}

float MagnitudeSketch::threshold(double density) const {
  if (density >= 1.0) return 0.0f;  // before the sparse view, which may have to be combined
  std::vector<std::uint16_t> key_storage;
  std::vector<std::uint64_t> count_storage;
  const auto [keys, counts] = sparse_view(key_storage, count_storage);
  return threshold(keys, counts, total_, density);
}

TrimBand MagnitudeSketch::band(double density, double gamma) const {
  if (density >= 1.0) return {};
  std::vector<std::uint16_t> key_storage;
  std::vector<std::uint64_t> count_storage;
  const auto [keys, counts] = sparse_view(key_storage, count_storage);
  return breadcrumbs_band(keys, counts, total_, density, gamma);
}

float MagnitudeSketch::threshold(std::span<const std::uint16_t> keys,
                                 std::span<const std::uint64_t> counts, std::uint64_t total,
                                 double density) {
  if (density >= 1.0) return 0.0f;
  const auto k = static_cast<std::uint64_t>(std::floor(density * static_cast<double>(total)));
  if (k == 0) return std::numeric_limits<float>::infinity();
  std::uint64_t seen = 0;
  for (std::size_t i = keys.size(); i-- > 0;) {
    seen += counts[i];
    if (seen >= k) return bucket_lower_edge(keys[i]);
  }
  return 0.0f;
}

std::vector<float> MagnitudeSketch::grid_thresholds(std::span<const std::uint16_t> keys,
                                                    std::span<const std::uint64_t> counts,
                                                    std::uint64_t total, std::size_t steps) {
  std::vector<float> out(steps, 0.0f);
  std::size_t i = keys.size();  // buckets above i are behind us, `seen` entries in them
  std::uint64_t seen = 0;
  for (std::size_t step = 1; step <= steps; ++step) {
    // The density as threshold() would be given it, and its k, computed alike.
    const double density = static_cast<double>(step) / static_cast<double>(steps);
    if (density >= 1.0) break;  // 0: keep everything
    const auto k = static_cast<std::uint64_t>(std::floor(density * static_cast<double>(total)));
    if (k == 0) {
      out[step - 1] = std::numeric_limits<float>::infinity();
      continue;
    }
    // k grows with the density: walk down from where the previous one stopped.
    while (seen < k && i > 0) seen += counts[--i];
    out[step - 1] = seen >= k ? bucket_lower_edge(keys[i]) : 0.0f;
  }
  return out;
}

std::uint64_t MagnitudeSketch::kept_count(float threshold) const {
  if (std::isinf(threshold)) return 0;
  const std::uint16_t first = magnitude_bucket(threshold);
  std::vector<std::uint16_t> key_storage;
  std::vector<std::uint64_t> count_storage;
  const auto [keys, counts] = sparse_view(key_storage, count_storage);
  std::uint64_t kept = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] >= first) kept += counts[i];
  return kept;
}

std::uint64_t MagnitudeSketch::decided_differently(float a, float b) const {
  // threshold() gives 0, +inf or a bucket's lower edge: on those, |x| >= t is exactly
  // bucket(x) >= bucket(t), for every x (the infinite edge is a bucket's too).
  const std::uint16_t key_a = magnitude_bucket(a), key_b = magnitude_bucket(b);
  const std::uint16_t low = std::min(key_a, key_b), high = std::max(key_a, key_b);
  std::vector<std::uint16_t> key_storage;
  std::vector<std::uint64_t> count_storage;
  const auto [keys, counts] = sparse_view(key_storage, count_storage);
  std::uint64_t between = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] >= low && keys[i] < high) between += counts[i];
  return between;
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

std::uint64_t MagnitudeSketch::check_sparse(std::span<const std::uint16_t> keys,
                                            std::span<const std::uint64_t> counts) {
  if (keys.size() != counts.size())
    throw InputError("magnitude sketch: keys and counts differ in length");
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] <= keys[i - 1])
      throw InputError("magnitude sketch: bucket keys are not ascending");
    if (counts[i] > std::numeric_limits<std::uint64_t>::max() - total)
      throw InputError("magnitude sketch: counts overflow 64 bits");
    total += counts[i];
  }
  return total;
}

MagnitudeSketch MagnitudeSketch::from_sparse(std::span<const std::uint16_t> keys,
                                             std::span<const std::uint64_t> counts) {
  MagnitudeSketch s;
  s.total_ = check_sparse(keys, counts);
  s.keys_.reserve(keys.size());
  s.counts_.reserve(counts.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (counts[i] == 0) continue;
    s.keys_.push_back(keys[i]);
    s.counts_.push_back(counts[i]);
  }
  return s;
}

}  // namespace mergepipe
