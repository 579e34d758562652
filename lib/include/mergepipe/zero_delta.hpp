#pragma once
// Whether an expert leaves a stretch of the base unchanged, so that every delta
// Δ = float(θ_k) − float(θ_0) in it is exactly +0: the stored bytes are equal and the base
// values finite (NaN − NaN and Inf − Inf are NaN, not 0). Fine-tuned experts leave whole tensors
// and rows bit-identical to the base; a zero Δ adds nothing to a sketch but its count and is an
// exact no-op in every operator, so callers skip converting and merging it. Comparing bytes stops
// at the first difference, so a changed stretch costs a few loads.
#include <cstddef>
#include <cstring>

#include "mergepipe/block_stats.hpp"

namespace mergepipe {

class ZeroDeltaCheck {
 public:
  // `base_values` are the n base values already converted to fp32; `base_bytes` their stored
  // bytes (`bytes` long). Both must outlive the check.
  ZeroDeltaCheck(const std::byte* base_bytes, std::size_t bytes, const float* base_values,
                 std::size_t n)
      : base_bytes_(base_bytes), bytes_(bytes), base_values_(base_values), n_(n) {}

  // True when every Δ of the expert's stored bytes (as long as the base's) is exactly +0.
  bool operator()(const std::byte* expert_bytes) {
    if (std::memcmp(expert_bytes, base_bytes_, bytes_) != 0) return false;
    if (base_finite_ < 0)  // checked once, and only when some expert matches
      base_finite_ = count_nonfinite({base_values_, n_}) == 0 ? 1 : 0;
    return base_finite_ == 1;
  }

 private:
  const std::byte* base_bytes_;
  std::size_t bytes_;
  const float* base_values_;
  std::size_t n_;
  int base_finite_ = -1;  // unknown until an expert's bytes match
};

}  // namespace mergepipe
