#pragma once
// mergekit's model_stock (Jang et al., "Model Stock"), per tensor: with the experts' deltas
// Δ_k (k = 1..N, N >= 2) as whole vectors, cos θ is the mean over pairs i < j of
// Δ_i·Δ_j / max(‖Δ_i‖·‖Δ_j‖, 1e-6), clamped to [−1, 1]; t = N·cos θ / (1 + (N − 1)·cos θ) (not
// clamped: a negative cosine moves away from the average); the output is
// t·(Σ θ_k / N) + (1 − t)·θ0 = θ0 + (t/N)·Σ Δ_k, a linear form of the deltas.
// (mergekit's filter_wise, one t per row, is not built here.)
#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

struct ModelStockDecision {
  double cos_theta = 0;  // the mean pairwise cosine
  double t = 0;          // the weight of the experts' average
};
// Throws InputError when t is not finite (cos θ = −1/(N − 1)); `tensor` names it.
ModelStockDecision model_stock_decision(const TensorGram& gram, std::string_view tensor);
// base_scale 1, alpha_k = t/N each, rounded once to fp32.
OperatorConfig::LinearForm model_stock_linear_form(const ModelStockDecision& decision,
                                                   std::size_t experts);

}  // namespace mergepipe
