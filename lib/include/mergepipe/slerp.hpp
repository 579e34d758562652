#pragma once
// mergekit's slerp of two models, per tensor: the whole tensor is one vector, v0 the base and v1
// the other model, each normalised (left as it is when its norm is <= 1e-8), cos Ω = v0·v1.
// When |cos Ω| > 0.9995 the result is the plain lerp (1 − t)·θ0 + t·θ1; else
// s0·θ0 + s1·θ1 with s0 = sin((1 − t)Ω)/sin Ω and s1 = sin(tΩ)/sin Ω, on the unnormalised
// tensors. Both are linear in the two models, so with Δ = θ1 − θ0 the merge is
// (s0 + s1)·θ0 + s1·Δ: a per-tensor linear form whose two scalars need only ‖θ0‖², ‖θ1‖² and
// θ0·θ1, which the tensor's Gram of θ0 and Δ gives (tensor_gram.hpp).
#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

// What slerp decided for a tensor, in mergekit's terms.
struct SlerpDecision {
  double cos_omega = 0;   // v0·v1 of the normalised tensors
  bool lerp = false;      // |cos Ω| > 0.9995: plain linear interpolation
  double omega = 0;       // arccos(cos Ω), when not lerp
  double s0 = 0, s1 = 0;  // out = s0·θ0 + s1·θ1
};
// `gram` holds θ0 and one expert's delta.
SlerpDecision slerp_decision(const TensorGram& gram, double t);

// The decision as merge_block's linear form: base_scale = s0 + s1, alpha = {s1}, each rounded
// once to fp32 from fp64.
OperatorConfig::LinearForm slerp_linear_form(const SlerpDecision& decision);

}  // namespace mergepipe
