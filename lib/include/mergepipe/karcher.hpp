#pragma once
// mergekit's karcher: the weighted Karcher (Fréchet) mean of the models on the unit sphere, per
// tensor, scaled by their mean norm. The points are the base θ0 (mergekit gathers it as an
// ordinary model; without base_model it is the first model) and θ_k = θ0 + Δ_k, with equal
// weights 1/n (karcher takes no weights). Each model is normalised (dropped from the direction
// when its norm is <= tol; it still counts, with norm 0, in the scale); the direction starts at
// the normalised mean of the unit vectors and takes at most max_iter Riemannian steps until the
// tangent's norm is < tol; the output is (Σ norms / n)·direction.
//
// Every iterate is a combination of the unit vectors, and every quantity the iteration needs is
// a dot product of such combinations, so it runs on the n × n Gram of the models: the result is
// Σ β_i θ_i, a linear form, decided per tensor without holding it.
#include <vector>

#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

struct KarcherDecision {
  std::vector<double> norms;  // ‖θ_i‖, i = 0 (the base) .. K
  double scale = 0;           // Σ norms / n
  std::vector<double> beta;   // output = Σ β_i θ_i
  int iterations = 0;
};
KarcherDecision karcher_decision(const TensorGram& gram, int max_iter, double tol);
// Σ β_i θ_i = (Σ β_i)·θ0 + Σ_k β_k Δ_k.
OperatorConfig::LinearForm points_linear_form(const std::vector<double>& beta);

}  // namespace mergepipe
