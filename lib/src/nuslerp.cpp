#include "mergepipe/nuslerp.hpp"

#include <algorithm>
#include <cmath>

namespace mergepipe {

namespace {
constexpr double kWeightSumFloor = 1e-6;  // below it mergekit takes t = 0.5
constexpr double kNormFloor = 1e-7;       // mergekit's clamp of each norm
constexpr double kColinear = 1e-8;        // |sin θ| below it: the lerp
}  // namespace

NuslerpDecision nuslerp_decision(const TensorGram& gram, double weight_a, double weight_b,
                                 bool vectors_are_models) {
  // The two vectors' products: the models' (no base), else the two deltas'.
  const auto dot = [&](std::size_t i, std::size_t j) {
    return vectors_are_models ? gram.model_dot(i, j) : gram.at(i + 1, j + 1);
  };
  NuslerpDecision d;
  const double sum = weight_a + weight_b;
  d.t = std::fabs(sum) < kWeightSumFloor ? 0.5 : weight_b / sum;
  const double n0 = std::max(std::sqrt(std::max(0.0, dot(0, 0))), kNormFloor);
  const double n1 = std::max(std::sqrt(std::max(0.0, dot(1, 1))), kNormFloor);
  d.cos_theta = dot(0, 1) / (n0 * n1);
  const double theta = std::acos(std::clamp(d.cos_theta, -1.0, 1.0));
  const double sin_theta = std::sin(theta);
  d.colinear = std::fabs(sin_theta) < kColinear;
  if (d.colinear) {
    d.c0 = 1.0 - d.t;
    d.c1 = d.t;
  } else {
    d.c0 = std::sin((1.0 - d.t) * theta) / sin_theta;
    d.c1 = std::sin(d.t * theta) / sin_theta;
  }
  return d;
}

OperatorConfig::LinearForm nuslerp_linear_form(const NuslerpDecision& decision,
                                               bool vectors_are_models) {
  OperatorConfig::LinearForm form;
  if (vectors_are_models) {  // c0·θ0 + c1·(θ0 + Δ)
    form.base_scale = static_cast<float>(decision.c0 + decision.c1);
    form.alpha = {static_cast<float>(decision.c1)};
  } else {  // θ0 + c0·Δ_1 + c1·Δ_2
    form.alpha = {static_cast<float>(decision.c0), static_cast<float>(decision.c1)};
  }
  return form;
}

}  // namespace mergepipe
