#include "mergepipe/slerp.hpp"

#include <cmath>

namespace mergepipe {

namespace {
constexpr double kNormEpsilon = 1e-8;      // mergekit's normalize(): smaller norms stay as they are
constexpr double kLerpThreshold = 0.9995;  // mergekit's DOT_THRESHOLD
}  // namespace

SlerpDecision slerp_decision(const TensorGram& gram, double t) {
  const double n0 = std::sqrt(gram.model_dot(0, 0)), n1 = std::sqrt(gram.model_dot(1, 1));
  SlerpDecision d;
  d.cos_omega =
      gram.model_dot(0, 1) / ((n0 > kNormEpsilon ? n0 : 1.0) * (n1 > kNormEpsilon ? n1 : 1.0));
  if (std::fabs(d.cos_omega) > kLerpThreshold) {
    d.lerp = true;
    d.s0 = 1.0 - t;
    d.s1 = t;
    return d;
  }
  d.omega = std::acos(d.cos_omega);
  const double sin_omega = std::sin(d.omega);
  d.s0 = std::sin(d.omega - d.omega * t) / sin_omega;
  d.s1 = std::sin(d.omega * t) / sin_omega;
  return d;
}

OperatorConfig::LinearForm slerp_linear_form(const SlerpDecision& decision) {
  OperatorConfig::LinearForm form;
  form.base_scale = static_cast<float>(decision.s0 + decision.s1);
  form.alpha = {static_cast<float>(decision.s1)};
  return form;
}

}  // namespace mergepipe
