#include "mergepipe/multislerp.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mergepipe/error.hpp"
#include "mergepipe/karcher.hpp"  // points_linear_form

namespace mergepipe {

namespace {

struct SmallGram {
  std::size_t n;
  std::vector<double> m;  // row-major
  double at(std::size_t i, std::size_t j) const { return m[i * n + j]; }
  double dot(const std::vector<double>& a, const std::vector<double>& b) const {
    double d = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double row = 0;
      for (std::size_t j = 0; j < n; ++j) row += at(i, j) * b[j];
      d += a[i] * row;
    }
    return d;
  }
  double norm(const std::vector<double>& a) const { return std::sqrt(std::max(0.0, dot(a, a))); }
};

}  // namespace

MultislerpDecision multislerp_decision(const TensorGram& gram, const MultislerpInputs& in,
                                       std::string_view tensor) {
  // The vectors' Gram: the models' (no base), or the deltas' (index k ↔ Gram index k + 1).
  const std::size_t n = in.vectors_are_models ? gram.vectors : gram.experts();
  if (in.weights.size() != n) throw std::invalid_argument("multislerp: one weight per vector");
  SmallGram x{n, std::vector<double>(n * n)};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      x.m[i * n + j] = in.vectors_are_models ? gram.model_dot(i, j) : gram.at(i + 1, j + 1);
  MultislerpDecision d;
  d.beta.assign(n, 0.0);
  if (n == 1) {  // nothing to interpolate: the one vector
    d.beta[0] = 1.0;
    return d;
  }
  std::vector<double> w = in.weights;
  if (in.normalize_weights) {
    double sum = 0;
    for (double v : w) sum += v;
    for (double& v : w) v /= sum;
  }
  std::vector<double> scale(n);  // u_i = x_i · scale_i
  for (std::size_t i = 0; i < n; ++i) {
    d.norms.push_back(std::sqrt(std::max(0.0, x.at(i, i))));
    scale[i] = 1.0 / (d.norms[i] + in.eps);
  }
  // Every vector zero (a tensor no expert changed): the result is zero, so the base is kept.
  // mergekit raises its "weighted sum is zero" error here for 3+ vectors; that would make a
  // merge of experts that leave some tensors untouched impossible (docs/operators.md).
  if (std::all_of(d.norms.begin(), d.norms.end(), [](double v) { return v == 0.0; })) return d;
  SmallGram u{n, std::vector<double>(n * n)};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) u.m[i * n + j] = x.at(i, j) * scale[i] * scale[j];
  std::vector<double> mean = w;  // coefficients over the units
  d.mean_norm = u.norm(mean);
  if (d.mean_norm < in.eps) {
    if (n == 2) {
      d.linear_fallback = true;
      d.beta = w;
      return d;
    }
    throw InputError("multislerp: tensor '" + std::string(tensor) +
                     "': the weighted sum of the models' unit vectors is zero (antipodal "
                     "models whose weights balance out); try other weights");
  }
  for (double& c : mean) c /= d.mean_norm;
  // τ = Σ_i w_i (u_i − (u_i·m) m): coefficient j is w_j − (Σ_i w_i (u_i·m))·m_j.
  std::vector<double> e(n, 0.0);
  double weighted_dots = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::fill(e.begin(), e.end(), 0.0);
    e[i] = 1.0;
    weighted_dots += w[i] * u.dot(e, mean);
  }
  std::vector<double> tangent(n);
  for (std::size_t j = 0; j < n; ++j) tangent[j] = w[j] - weighted_dots * mean[j];
  const double tangent_norm = u.norm(tangent) + in.eps;
  double avg_norm = 0;
  for (std::size_t i = 0; i < n; ++i) avg_norm += d.norms[i] * w[i];
  const double c = std::cos(tangent_norm), s = std::sin(tangent_norm) / tangent_norm;
  for (std::size_t i = 0; i < n; ++i)
    d.beta[i] = avg_norm * (c * mean[i] + s * tangent[i]) * scale[i];
  return d;
}

OperatorConfig::LinearForm multislerp_linear_form(const MultislerpDecision& decision,
                                                  const MultislerpInputs& in) {
  if (in.vectors_are_models) return points_linear_form(decision.beta);
  OperatorConfig::LinearForm form;  // θ0 + Σ β_k Δ_k
  for (double b : decision.beta) form.alpha.push_back(static_cast<float>(b));
  return form;
}

}  // namespace mergepipe
