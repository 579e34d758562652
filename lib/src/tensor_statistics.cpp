#include "mergepipe/tensor_statistics.hpp"

#include <stdexcept>
#include <string>

#include "mergepipe/karcher.hpp"
#include "mergepipe/model_stock.hpp"
#include "mergepipe/multislerp.hpp"
#include "mergepipe/nuslerp.hpp"
#include "mergepipe/slerp.hpp"

namespace mergepipe {

OperatorConfig::LinearForm linear_form_from_gram(const OperatorConfig& cfg, const TensorGram& gram,
                                                 std::string_view tensor) {
  if (gram.experts() != cfg.expert_count())
    throw std::invalid_argument("tensor statistics: the Gram's experts differ from the config's");
  switch (cfg.method) {
    case MergeMethod::kSlerp:
      return slerp_linear_form(slerp_decision(gram, cfg.t));
    case MergeMethod::kModelStock:
      return model_stock_linear_form(model_stock_decision(gram, tensor), cfg.expert_count());
    case MergeMethod::kKarcher:
      return points_linear_form(karcher_decision(gram, cfg.max_iter, cfg.tol).beta);
    case MergeMethod::kMultislerp: {
      MultislerpInputs in;
      in.vectors_are_models = cfg.base_is_reference;
      if (in.vectors_are_models) in.weights.push_back(cfg.base_weight);
      for (float w : cfg.weights) in.weights.push_back(w);
      in.normalize_weights = cfg.normalize;
      in.eps = cfg.eps;
      return multislerp_linear_form(multislerp_decision(gram, in, tensor), in);
    }
    case MergeMethod::kNuslerp: {
      const bool models = cfg.base_is_reference;
      const double wa = models ? cfg.base_weight : cfg.weights.at(0);
      const double wb = models ? cfg.weights.at(0) : cfg.weights.at(1);
      return nuslerp_linear_form(nuslerp_decision(gram, wa, wb, models), models);
    }
    default:
      throw std::invalid_argument(
          "tensor statistics: " + std::string(merge_method_name(cfg.method)) +
          " is not decided from a tensor's Gram");
  }
}

}  // namespace mergepipe
