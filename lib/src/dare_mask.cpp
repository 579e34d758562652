#include "mergepipe/dare_mask.hpp"

#include <cmath>

namespace mergepipe {

std::uint64_t dare_keep_threshold(float density) {
  // double(density) · 2^32 is exact (a float has 24 significant bits), so floor is exact too.
  const double scaled = std::ldexp(static_cast<double>(density), 32);
  if (!(scaled > 0.0)) return 0;
  if (scaled >= 4294967296.0) return 4294967296ull;
  return static_cast<std::uint64_t>(std::floor(scaled));
}

bool dare_keep(std::uint64_t seed, std::uint32_t expert, std::uint64_t name_key,
               std::uint64_t index, float density) {
  return dare_draw(dare_stream_key(seed, expert, name_key), index) < dare_keep_threshold(density);
}

// 64-bit multiplies vectorise only with AVX2 (emulated) or AVX-512DQ, not with the x86-64
// baseline, so the mask generator is compiled for several targets and picked at load time.
// Integer arithmetic: every clone gives the same bits, so mixed nodes stay deterministic.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MERGEPIPE_GENERATOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MERGEPIPE_GENERATOR_CLONES
#endif

MERGEPIPE_GENERATOR_CLONES
void dare_keep_mask(std::uint64_t key, std::uint64_t index_begin, std::size_t n,
                    std::uint64_t threshold, std::uint32_t* mask) {
  // The counter for element i is key + (index_begin + i + 1)·γ; step it by γ per element.
  const std::uint64_t start = key + (index_begin + 1) * kSplitMixGamma;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t u = splitmix64_mix(start + i * kSplitMixGamma) >> 32;
    mask[i] = 0u - static_cast<std::uint32_t>(u < threshold);
  }
}

}  // namespace mergepipe
