#include "mergepipe/block_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mergepipe/float_bits.hpp"
#include "mergepipe/hash.hpp"

namespace mergepipe {

void compute_delta(const float* base, const float* expert, float* delta, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) delta[i] = expert[i] - base[i];
}

int norm_octave(float magnitude) {
  std::uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof bits);
  // Biased fp32 exponent: floor(log2 |x|) + 127 for normal numbers, 0 for zero and subnormals
  // (all far below 2^-kOctaveBias, so they land in octave 0 either way).
  const int exponent = static_cast<int>((bits >> 23) & 0xffu);
  if (exponent == 0) return 0;
  const int octave = exponent - 127 + kOctaveBias;
  if (octave < 0) return 0;
  if (octave >= kNormOctaves) return kNormOctaves - 1;
  return octave;
}

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MERGEPIPE_STATS_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define MERGEPIPE_STATS_KERNEL
#endif

constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kInfBits = 0x7f800000u;

struct Sums {
  double sumsq = 0.0;
  float max_abs = 0.0f;
  std::uint64_t nonzero = 0;
  bool nonfinite = false;
};

// Eight lanes written with GCC vector extensions: lane l takes elements i ≡ l (mod 8), so the
// order of every fp64 addition is fixed by the code, whatever ISA the compiler picks.
using V4f = float __attribute__((vector_size(16)));
using V4d = double __attribute__((vector_size(32)));
using V8f = float __attribute__((vector_size(32)));
using V8u = std::uint32_t __attribute__((vector_size(32)));

struct LaneState {
  V4d sumsq_lo = {0, 0, 0, 0}, sumsq_hi = {0, 0, 0, 0};
  V8f max_abs = {};
  V8u nonzero = {};  // flushed before it can wrap
  V8u nonfinite = {};
};

__attribute__((always_inline)) inline void accumulate8(const float* p, LaneState& s) {
  const V8u abs_mask = {kAbsMask, kAbsMask, kAbsMask, kAbsMask,
                        kAbsMask, kAbsMask, kAbsMask, kAbsMask};
  const V8u inf = {kInfBits, kInfBits, kInfBits, kInfBits, kInfBits, kInfBits, kInfBits, kInfBits};
  V8u bits;
  std::memcpy(&bits, p, sizeof bits);
  bits &= abs_mask;
  const V8u finite = reinterpret_cast<V8u>(bits < inf);  // all ones where finite
  s.nonfinite |= ~finite;
  s.nonzero -= reinterpret_cast<V8u>(bits != 0);  // NaN counts as non-zero, -0 does not
  const V8u kept = bits & finite;                 // non-finite entries count as 0 below
  V8f a;
  std::memcpy(&a, &kept, sizeof a);
  s.max_abs = a > s.max_abs ? a : s.max_abs;
  const V4f lo = {a[0], a[1], a[2], a[3]}, hi = {a[4], a[5], a[6], a[7]};
  const V4d dlo = __builtin_convertvector(lo, V4d), dhi = __builtin_convertvector(hi, V4d);
  s.sumsq_lo += dlo * dlo;
  s.sumsq_hi += dhi * dhi;
}

MERGEPIPE_STATS_KERNEL Sums lane_sums(const float* d, std::size_t n) {
  LaneState s;
  std::uint64_t nonzero = 0;
  constexpr std::size_t kFlush = std::size_t{1} << 31;  // elements per lane counter flush
  std::size_t i = 0;
  while (i + 8 <= n) {
    const std::size_t end = std::min(n - n % 8, i + kFlush);
    for (; i < end; i += 8) accumulate8(d + i, s);
    for (int l = 0; l < 8; ++l) nonzero += s.nonzero[l];
    s.nonzero = V8u{};
  }
  if (i < n) {  // tail padded with zeros, which add nothing
    float tail[8] = {};
    std::memcpy(tail, d + i, (n - i) * sizeof(float));
    accumulate8(tail, s);
    for (int l = 0; l < 8; ++l) nonzero += s.nonzero[l];
  }
  Sums out;
  const V4d& a = s.sumsq_lo;
  const V4d& b = s.sumsq_hi;
  out.sumsq = ((a[0] + a[1]) + (a[2] + a[3])) + ((b[0] + b[1]) + (b[2] + b[3]));
  std::uint32_t nonfinite = 0;
  for (int l = 0; l < 8; ++l) {
    out.max_abs = std::max(out.max_abs, s.max_abs[l]);
    nonfinite |= s.nonfinite[l];
  }
  out.nonzero = nonzero;
  out.nonfinite = nonfinite != 0;
  return out;
}

// Σ Δ² per octave over the finite entries; element i goes to table i mod 4 (fewer store-to-load
// stalls when neighbours share an octave), the tables combined in a fixed order.
__attribute__((always_inline)) inline void add_octave(double* table, float x) {
  const std::uint32_t abs_bits = bits_of(x) & kAbsMask;
  const std::uint32_t kept = abs_bits < kInfBits ? abs_bits : 0u;
  const float a = float_of(kept);
  int octave = static_cast<int>(abs_bits >> 23) - 127 + kOctaveBias;
  octave = octave < 0 ? 0 : (octave >= kNormOctaves ? kNormOctaves - 1 : octave);
  table[octave] += static_cast<double>(a) * static_cast<double>(a);
}

void octave_sums(const float* d, std::size_t n, std::array<double, kNormOctaves>& out) {
  double t0[kNormOctaves] = {}, t1[kNormOctaves] = {}, t2[kNormOctaves] = {}, t3[kNormOctaves] = {};
  double* tables[4] = {t0, t1, t2, t3};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    add_octave(t0, d[i]);
    add_octave(t1, d[i + 1]);
    add_octave(t2, d[i + 2]);
    add_octave(t3, d[i + 3]);
  }
  for (; i < n; ++i) add_octave(tables[i & 3], d[i]);
  for (int o = 0; o < kNormOctaves; ++o) out[o] = (t0[o] + t1[o]) + (t2[o] + t3[o]);
}

}  // namespace

BlockStats compute_block_stats(std::span<const float> delta, std::span<const std::byte> stored) {
  BlockStats stats;
  const Sums sums = lane_sums(delta.data(), delta.size());
  std::array<double, kNormOctaves> octaves{};
  octave_sums(delta.data(), delta.size(), octaves);
  stats.nonzero = sums.nonzero;
  for (int o = 0; o < kNormOctaves; ++o) stats.octave_sumsq[o] = static_cast<float>(octaves[o]);
  if (sums.nonfinite) {
    const float inf = std::numeric_limits<float>::infinity();
    stats.l2 = std::numeric_limits<double>::infinity();
    stats.max_abs = inf;
    stats.octave_sumsq[kNormOctaves - 1] = inf;
  } else {
    stats.l2 = std::sqrt(sums.sumsq);
    stats.max_abs = sums.max_abs;
  }
  stats.hash = hash64(stored.data(), stored.size());
  return stats;
}

namespace {
MERGEPIPE_STATS_KERNEL std::uint64_t nonfinite_kernel(const float* v, std::size_t n) {
  std::uint64_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += (bits_of(v[i]) & kAbsMask) >= kInfBits;
  return count;
}
}  // namespace

std::uint64_t count_nonfinite(std::span<const float> values) {
  return nonfinite_kernel(values.data(), values.size());
}

}  // namespace mergepipe
