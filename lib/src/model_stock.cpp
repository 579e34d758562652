#include "mergepipe/model_stock.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "mergepipe/error.hpp"

namespace mergepipe {

namespace {
constexpr double kNormProductFloor = 1e-6;  // mergekit's clamp of ‖Δ_i‖·‖Δ_j‖
}  // namespace

ModelStockDecision model_stock_decision(const TensorGram& gram, std::string_view tensor) {
  const std::size_t n = gram.experts();
  double cos_sum = 0;
  std::size_t pairs = 0;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = i + 1; j <= n; ++j) {
      const double norms = std::sqrt(gram.at(i, i)) * std::sqrt(gram.at(j, j));
      cos_sum += std::clamp(gram.at(i, j) / std::max(norms, kNormProductFloor), -1.0, 1.0);
      ++pairs;
    }
  }
  ModelStockDecision d;
  d.cos_theta = pairs ? cos_sum / static_cast<double>(pairs) : 0.0;
  const double nd = static_cast<double>(n);
  d.t = nd * d.cos_theta / (1.0 + (nd - 1.0) * d.cos_theta);
  if (!std::isfinite(d.t) || !std::isfinite(static_cast<float>(d.t / nd))) {
    throw InputError(
        "model_stock: tensor '" + std::string(tensor) + "': the experts' mean cosine " +
        std::to_string(d.cos_theta) +
        " makes t = N·cos/(1 + (N-1)·cos) unbounded (mergekit would write inf or NaN)");
  }
  return d;
}

OperatorConfig::LinearForm model_stock_linear_form(const ModelStockDecision& decision,
                                                   std::size_t experts) {
  OperatorConfig::LinearForm form;
  form.base_scale = 1.0f;
  form.alpha.assign(experts, static_cast<float>(decision.t / static_cast<double>(experts)));
  return form;
}

}  // namespace mergepipe
