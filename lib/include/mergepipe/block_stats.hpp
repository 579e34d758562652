#pragma once
// Per (expert, block) delta statistics for the catalog (SPEC §2). Pure arithmetic on fp32 values
// already converted with convert_to_f32; the caller does the I/O.
//
// The delta is the executor's, bit for bit: Δ = float(θ_k) − float(θ0), one fp32 subtraction per
// element. Statistics of a block depend only on that block's values, never on how blocks were
// spread over ranks or threads.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mergepipe/catalog.hpp"

namespace mergepipe {

// delta[i] = expert[i] - base[i] in fp32. `delta` may alias `expert`.
void compute_delta(const float* base, const float* expert, float* delta, std::size_t n);

// Octave of a magnitude for BlockStats::octave_sumsq: floor(log2 |x|) + kOctaveBias, clamped to
// [0, kNormOctaves). Zero and subnormals fall into octave 0.
int norm_octave(float magnitude);

// Statistics of one block from its fp32 deltas and the expert's stored bytes of the block.
// l2 = sqrt(Σ Δ²) in fp64, element i added to accumulator i mod 8 and the eight combined as
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)): a fixed order, so a block gives the same bits on any rank
// or thread. max_abs, nonzero (Δ != 0), hash = XXH3-64 (seed 0) of `stored`, octave_sumsq[o] =
// Σ Δ² over entries of octave o (fp64, element i into partial table i mod 4, combined as
// (t0+t1)+(t2+t3), then rounded to fp32). A NaN or ±Inf delta makes l2, max_abs and the last
// octave +Inf (omitting such a block can change the output without bound) and counts as non-zero.
BlockStats compute_block_stats(std::span<const float> delta, std::span<const std::byte> stored);

// Number of NaN and ±Inf values.
std::uint64_t count_nonfinite(std::span<const float> values);

}  // namespace mergepipe
