#pragma once
// mergekit's slerp of two models, per tensor: the whole tensor is one vector, v0 the base and v1
// the other model, each normalised (left as it is when its norm is <= 1e-8), cos Ω = v0·v1.
// When |cos Ω| > 0.9995 the result is the plain lerp (1 − t)·θ0 + t·θ1; else
// s0·θ0 + s1·θ1 with s0 = sin((1 − t)Ω)/sin Ω and s1 = sin(tΩ)/sin Ω, on the unnormalised
// tensors. Both are linear in the two models, so with Δ = θ1 − θ0 the merge is
// (s0 + s1)·θ0 + s1·Δ: a per-tensor linear form whose two scalars need only three sums over the
// tensor (‖θ0‖², ‖θ1‖², θ0·θ1). Those are accumulated block by block (in one read of both
// models) and the blocks merged afterwards, so no tensor is ever held whole.
#include <cstddef>
#include <cstdint>

#include "mergepipe/operators.hpp"

namespace mergepipe {

// The sums slerp needs over one tensor (or a part of it: parts add), in fp64.
struct SlerpSums {
  double base_sq = 0;   // Σ θ0²
  double other_sq = 0;  // Σ θ1²
  double dot = 0;       // Σ θ0·θ1
  void add(const float* base, const float* other, std::size_t n);
  // An unchanged stretch: θ1 == θ0 there.
  void add_unchanged(const float* base, std::size_t n);
  SlerpSums& operator+=(const SlerpSums& part);
  bool operator==(const SlerpSums&) const = default;
};

// What slerp decided for a tensor, in mergekit's terms.
struct SlerpDecision {
  double cos_omega = 0;   // v0·v1 of the normalised tensors
  bool lerp = false;      // |cos Ω| > 0.9995: plain linear interpolation
  double omega = 0;       // arccos(cos Ω), when not lerp
  double s0 = 0, s1 = 0;  // out = s0·θ0 + s1·θ1
};
SlerpDecision slerp_decision(const SlerpSums& sums, double t);

// The decision as merge_block's linear form: base_scale = s0 + s1, alpha = {s1}, each rounded
// once to fp32 from fp64.
OperatorConfig::LinearForm slerp_linear_form(const SlerpDecision& decision);

}  // namespace mergepipe
