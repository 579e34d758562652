#pragma once
// mergekit's multislerp: barycentric interpolation of several vectors on a sphere, per tensor.
// The vectors are the experts' deltas Δ_k when the config has a base_model (the output is
// θ0 + the result), else the models themselves (the first one, the reference, is θ0). With
// weights w (divided by their sum unless normalize_weights is false), norms n_i and units
// u_i = x_i / (n_i + eps): m = Σ w_i u_i / ‖Σ w_i u_i‖, tangent τ = Σ w_i (u_i − (u_i·m)·m),
// result = (Σ w_i n_i)·(cos‖τ‖'·m + τ·sin‖τ‖'/‖τ‖') with ‖τ‖' = ‖τ‖ + eps. When ‖Σ w_i u_i‖ < eps,
// two vectors fall back to w_0 x_0 + w_1 x_1 and more are an error (mergekit's rules), except
// when every vector is zero (no expert changed the tensor): then the result is zero (the base).
// Every step is a combination of the vectors, so it runs on their Gram: a linear form.
#include <string_view>
#include <vector>

#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

struct MultislerpInputs {
  std::vector<double> weights;      // per vector (the reference model's first when no base)
  bool vectors_are_models = false;  // no base_model: x_0 = θ0, x_k = θ0 + Δ_k; else x_k = Δ_k
  bool normalize_weights = true;
  double eps = 1e-8;
};
struct MultislerpDecision {
  std::vector<double> norms;
  double mean_norm = 0;
  bool linear_fallback = false;
  std::vector<double> beta;  // result = Σ β_i x_i
};
// Throws InputError (naming `tensor`) when the weighted unit mean vanishes for 3+ vectors.
MultislerpDecision multislerp_decision(const TensorGram& gram, const MultislerpInputs& in,
                                       std::string_view tensor);
OperatorConfig::LinearForm multislerp_linear_form(const MultislerpDecision& decision,
                                                  const MultislerpInputs& in);

}  // namespace mergepipe
