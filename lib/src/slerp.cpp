#include "mergepipe/slerp.hpp"

#include <cmath>

namespace mergepipe {

namespace {
constexpr double kNormEpsilon = 1e-8;      // mergekit's normalize(): smaller norms stay as they are
constexpr double kLerpThreshold = 0.9995;  // mergekit's DOT_THRESHOLD
}  // namespace

void SlerpSums::add(const float* base, const float* other, std::size_t n) {
  // Element order, so a block's sums do not depend on threads or ranks.
  for (std::size_t i = 0; i < n; ++i) {
    const double b = base[i], o = other[i];
    base_sq += b * b;
    other_sq += o * o;
    dot += b * o;
  }
}

void SlerpSums::add_unchanged(const float* base, std::size_t n) {
  // The same sums, in the same order, as add(base, base, n).
  for (std::size_t i = 0; i < n; ++i) {
    const double sq = static_cast<double>(base[i]) * base[i];
    base_sq += sq;
    other_sq += sq;
    dot += sq;
  }
}

SlerpSums& SlerpSums::operator+=(const SlerpSums& part) {
  base_sq += part.base_sq;
  other_sq += part.other_sq;
  dot += part.dot;
  return *this;
}

SlerpDecision slerp_decision(const SlerpSums& sums, double t) {
  const double n0 = std::sqrt(sums.base_sq), n1 = std::sqrt(sums.other_sq);
  SlerpDecision d;
  d.cos_omega = sums.dot / ((n0 > kNormEpsilon ? n0 : 1.0) * (n1 > kNormEpsilon ? n1 : 1.0));
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
