#pragma once
// mergekit's nuslerp: the slerp of two vectors with t from the models' weights, t = w_b/(w_a + w_b)
// (0.5 when |w_a + w_b| < 1e-6). With base_model the vectors are the two experts' deltas and the
// output is θ0 + the result; without, the two models themselves (the first is θ0). Each vector is
// normalised with its norm clamped at 1e-7; θ = arccos(clamp(v0·v1)); when |sin θ| < 1e-8 the
// result is the lerp (1 − t)·v0 + t·v1, else (sin((1 − t)θ)·v0 + sin(tθ)·v1)/sin θ. The whole
// tensor is one vector (mergekit's nuslerp_flatten, its default; one slerp per row is not built).
// Linear in the two vectors: a per-tensor linear form from the tensor's Gram.
#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

struct NuslerpDecision {
  double t = 0.5;
  double cos_theta = 0;
  bool colinear = false;
  double c0 = 0, c1 = 0;  // result = c0·v0 + c1·v1
};
// weight_a and weight_b: the first and second model's weights; vectors_are_models: no base_model
// (v0 = θ0, v1 = θ0 + Δ_1), else v0 = Δ_1 and v1 = Δ_2.
NuslerpDecision nuslerp_decision(const TensorGram& gram, double weight_a, double weight_b,
                                 bool vectors_are_models);
OperatorConfig::LinearForm nuslerp_linear_form(const NuslerpDecision& decision,
                                               bool vectors_are_models);

}  // namespace mergepipe
