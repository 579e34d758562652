#include "mergepipe/karcher.hpp"

#include <algorithm>
#include <cmath>

namespace mergepipe {

namespace {

// x·y for x = Σ a_i u_i, y = Σ b_i u_i, with u's Gram `unit_gram` (m × m, row-major).
double combo_dot(const std::vector<double>& unit_gram, const std::vector<double>& a,
                 const std::vector<double>& b) {
  const std::size_t m = a.size();
  double d = 0;
  for (std::size_t i = 0; i < m; ++i) {
    double row = 0;
    for (std::size_t j = 0; j < m; ++j) row += unit_gram[i * m + j] * b[j];
    d += a[i] * row;
  }
  return d;
}
double combo_norm(const std::vector<double>& unit_gram, const std::vector<double>& a) {
  return std::sqrt(std::max(0.0, combo_dot(unit_gram, a, a)));
}

}  // namespace

KarcherDecision karcher_decision(const TensorGram& gram, int max_iter, double tol) {
  const std::size_t n = gram.vectors;
  KarcherDecision d;
  d.beta.assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) d.norms.push_back(std::sqrt(gram.model_dot(i, i)));
  const double alpha = 1.0 / static_cast<double>(n);
  for (double norm : d.norms) d.scale += alpha * norm;
  std::vector<std::size_t> valid;
  for (std::size_t i = 0; i < n; ++i)
    if (d.norms[i] > tol) valid.push_back(i);
  if (valid.empty()) return d;  // every model is zero: so is the output
  const std::size_t m = valid.size();
  std::vector<double> unit_gram(m * m);
  for (std::size_t a = 0; a < m; ++a)
    for (std::size_t b = 0; b < m; ++b)
      unit_gram[a * m + b] =
          gram.model_dot(valid[a], valid[b]) / (d.norms[valid[a]] * d.norms[valid[b]]);
  const double weight = 1.0 / static_cast<double>(m);  // the valid points' normalised weights
  // The direction as coefficients over the valid unit vectors.
  std::vector<double> mean(m, weight);
  const double mean_norm = combo_norm(unit_gram, mean);
  if (mean_norm < tol) {
    std::fill(mean.begin(), mean.end(), 0.0);
    mean[0] = 1.0;
  } else {
    for (double& c : mean) c /= mean_norm;
  }
  std::vector<double> tangent(m), e(m);
  for (int iter = 0; iter < max_iter; ++iter) {
    std::fill(tangent.begin(), tangent.end(), 0.0);
    for (std::size_t a = 0; a < m; ++a) {
      std::fill(e.begin(), e.end(), 0.0);
      e[a] = 1.0;
      const double dot = std::clamp(combo_dot(unit_gram, mean, e), -1.0, 1.0);
      const double theta = std::acos(dot);
      if (theta < tol) continue;
      const double f = weight * theta / std::sin(theta);
      for (std::size_t b = 0; b < m; ++b) tangent[b] += f * (e[b] - dot * mean[b]);
    }
    const double tangent_norm = combo_norm(unit_gram, tangent);
    if (tangent_norm < tol) break;
    ++d.iterations;
    const double c = std::cos(tangent_norm), s = std::sin(tangent_norm) / tangent_norm;
    for (std::size_t b = 0; b < m; ++b) mean[b] = c * mean[b] + s * tangent[b];
    const double unit_norm = combo_norm(unit_gram, mean);
    if (unit_norm > tol)
      for (double& x : mean) x /= unit_norm;
  }
  for (std::size_t a = 0; a < m; ++a) d.beta[valid[a]] = d.scale * mean[a] / d.norms[valid[a]];
  return d;
}

OperatorConfig::LinearForm points_linear_form(const std::vector<double>& beta) {
  OperatorConfig::LinearForm form;
  double base_scale = 0;
  for (double b : beta) base_scale += b;
  form.base_scale = static_cast<float>(base_scale);
  for (std::size_t k = 1; k < beta.size(); ++k) form.alpha.push_back(static_cast<float>(beta[k]));
  return form;
}

}  // namespace mergepipe
