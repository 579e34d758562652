#pragma once
// Counter-based DARE keep mask (SPEC §3): the keep decision of element i of tensor t of expert k
// is a pure function of (seed, k, t, i), so it does not depend on blocking, ranks or threads.
//
// Definition (docs/operators.md repeats it; tests/python/operators_ref.py re-implements it):
//   mix(z)       = SplitMix64 finaliser: z ^= z>>30; z *= 0xBF58476D1CE4E5B9;
//                  z ^= z>>27; z *= 0x94D049BB133111EB; z ^= z>>31   (all mod 2^64)
//   γ            = 0x9E3779B97F4A7C15 (the SplitMix64 increment)
//   key          = mix((mix((mix(seed + γ) ^ name_key) + γ) ^ expert) + γ)
//   draw(i)      = mix(key + (i + 1)·γ) >> 32          (the i-th SplitMix64 output, top 32 bits)
//   threshold    = floor(double(density_f32) · 2^32)    (an integer in [1, 2^32])
//   keep(i)      = draw(i) < threshold                  (P(keep) = threshold / 2^32)
// density 1 gives threshold 2^32: every element is kept.
#include <cstddef>
#include <cstdint>

namespace mergepipe {

inline constexpr std::uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

inline constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Stream key of one (seed, expert, tensor): three chained SplitMix64 steps.
inline constexpr std::uint64_t dare_stream_key(std::uint64_t seed, std::uint32_t expert,
                                               std::uint64_t name_key) {
  std::uint64_t k = splitmix64_mix(seed + kSplitMixGamma);
  k = splitmix64_mix((k ^ name_key) + kSplitMixGamma);
  return splitmix64_mix((k ^ static_cast<std::uint64_t>(expert)) + kSplitMixGamma);
}

// 32-bit uniform draw of element `index` in the stream `key`.
inline constexpr std::uint32_t dare_draw(std::uint64_t key, std::uint64_t index) {
  return static_cast<std::uint32_t>(splitmix64_mix(key + (index + 1) * kSplitMixGamma) >> 32);
}

// Keep threshold of a density in (0, 1]: floor(density · 2^32), computed exactly in double.
std::uint64_t dare_keep_threshold(float density);

// Keep decision of element `index` of tensor `name_key` of expert `expert`.
bool dare_keep(std::uint64_t seed, std::uint32_t expert, std::uint64_t name_key,
               std::uint64_t index, float density);

// Keep decisions of n consecutive elements [index_begin, index_begin + n) of one stream, as
// 32-bit lane masks: 0xFFFFFFFF keeps, 0 drops (ANDed with a float's bits by the operators).
void dare_keep_mask(std::uint64_t key, std::uint64_t index_begin, std::size_t n,
                    std::uint64_t threshold, std::uint32_t* mask);

}  // namespace mergepipe
