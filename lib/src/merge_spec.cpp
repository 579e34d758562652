#include "mergepipe/merge_spec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mergepipe/error.hpp"
#include "mergepipe/number_text.hpp"

namespace mergepipe {

std::optional<MergeMethod> parse_merge_method(std::string_view name) {
  if (name == "linear") return MergeMethod::kLinear;
  if (name == "task_arithmetic") return MergeMethod::kTaskArithmetic;
  if (name == "ties") return MergeMethod::kTies;
  if (name == "dare_linear") return MergeMethod::kDareLinear;
  if (name == "dare_ties") return MergeMethod::kDareTies;
  if (name == "nearswap") return MergeMethod::kNearswap;
  if (name == "passthrough") return MergeMethod::kPassthrough;
  if (name == "slerp") return MergeMethod::kSlerp;
  if (name == "model_stock") return MergeMethod::kModelStock;
  if (name == "karcher") return MergeMethod::kKarcher;
  if (name == "multislerp") return MergeMethod::kMultislerp;
  if (name == "nuslerp") return MergeMethod::kNuslerp;
  if (name == "breadcrumbs") return MergeMethod::kBreadcrumbs;
  if (name == "breadcrumbs_ties") return MergeMethod::kBreadcrumbsTies;
  if (name == "ram") return MergeMethod::kRam;
  return std::nullopt;
}

std::string_view merge_method_name(MergeMethod method) {
  switch (method) {
    case MergeMethod::kLinear:
      return "linear";
    case MergeMethod::kTaskArithmetic:
      return "task_arithmetic";
    case MergeMethod::kTies:
      return "ties";
    case MergeMethod::kDareLinear:
      return "dare_linear";
    case MergeMethod::kDareTies:
      return "dare_ties";
    case MergeMethod::kNearswap:
      return "nearswap";
    case MergeMethod::kPassthrough:
      return "passthrough";
    case MergeMethod::kSlerp:
      return "slerp";
    case MergeMethod::kModelStock:
      return "model_stock";
    case MergeMethod::kKarcher:
      return "karcher";
    case MergeMethod::kMultislerp:
      return "multislerp";
    case MergeMethod::kNuslerp:
      return "nuslerp";
    case MergeMethod::kBreadcrumbs:
      return "breadcrumbs";
    case MergeMethod::kBreadcrumbsTies:
      return "breadcrumbs_ties";
    case MergeMethod::kRam:
      return "ram";
  }
  return "?";
}

std::string supported_method_names() {
  return "linear, task_arithmetic, ties, dare_linear, dare_ties, nearswap, passthrough, slerp, "
         "model_stock, karcher, multislerp, nuslerp, breadcrumbs, breadcrumbs_ties, ram";
}

bool default_normalize(MergeMethod method) {
  // multislerp's normalize_weights defaults to true too.
  return method == MergeMethod::kLinear || method == MergeMethod::kTies ||
         method == MergeMethod::kMultislerp;
}
bool is_additive(MergeMethod method) {
  return method == MergeMethod::kLinear || method == MergeMethod::kTaskArithmetic;
}
bool uses_magnitude_trim(MergeMethod method) {
  return method == MergeMethod::kTies || uses_band_trim(method);
}
bool uses_band_trim(MergeMethod method) {
  return method == MergeMethod::kBreadcrumbs || method == MergeMethod::kBreadcrumbsTies;
}
std::size_t trim_threshold_rows(MergeMethod method) {
  return uses_band_trim(method) ? 2 : uses_magnitude_trim(method) ? 1 : 0;
}
bool uses_sign_election(MergeMethod method) {
  return method == MergeMethod::kTies || method == MergeMethod::kDareTies ||
         method == MergeMethod::kBreadcrumbsTies;
}
bool uses_dare(MergeMethod method) {
  return method == MergeMethod::kDareLinear || method == MergeMethod::kDareTies;
}
bool uses_tensor_statistics(MergeMethod method) {
  return method == MergeMethod::kSlerp || method == MergeMethod::kModelStock ||
         method == MergeMethod::kKarcher || method == MergeMethod::kMultislerp ||
         method == MergeMethod::kNuslerp;
}
std::string tensor_statistics_needed(MergeMethod method) {
  switch (method) {
    case MergeMethod::kSlerp:
      return "slerp's coefficients depend on both models' norms and dot product per tensor";
    case MergeMethod::kModelStock:
      return "model_stock's coefficients depend on the angles between the experts' deltas per "
             "tensor";
    case MergeMethod::kKarcher:
      return "karcher's coefficients depend on the norms and angles of all the models per tensor";
    case MergeMethod::kMultislerp:
      return "multislerp's coefficients depend on the norms and angles of all the models per "
             "tensor";
    case MergeMethod::kNuslerp:
      return "nuslerp's coefficients depend on the two models' norms and dot product per tensor";
    default:
      return std::string(merge_method_name(method)) + " needs no per-tensor statistics";
  }
}

bool has_guaranteed_bound(MergeMethod method) {
  return is_additive(method) || method == MergeMethod::kNearswap ||
         method == MergeMethod::kPassthrough;
}

std::vector<std::string> MergeSpec::expert_paths() const {
  std::vector<std::string> paths;
  paths.reserve(experts.size());
  for (const ExpertSpec& e : experts) paths.push_back(e.path);
  return paths;
}

double MergeSpec::weight_scale() const {
  double largest = base_weight && std::isfinite(*base_weight) ? std::fabs(*base_weight) : 0.0;
  for (const auto& e : experts)
    if (std::isfinite(e.weight)) largest = std::max(largest, std::fabs(e.weight));
  // Ordinary weights are left as they are (their plans and bounds do not change).
  if (!effective_normalize() || largest == 0.0 ||
      (largest >= std::ldexp(1.0, -60) && largest <= std::ldexp(1.0, 60)))
    return 1.0;
  return std::ldexp(1.0, -std::ilogb(largest));
}

bool MergeSpec::varies_by_tensor() const {
  if (!varying.empty() || !base_varying.empty()) return true;
  return std::any_of(experts.begin(), experts.end(),
                     [](const ExpertSpec& e) { return !e.varying.empty(); });
}

namespace {

// mergekit's lookup: the model's own setting, then the top level; nullopt falls back to the
// scalar default.
std::optional<double> look_up(const ParameterTable* model, const ParameterTable& top,
                              const std::string& name, std::string_view tensor, double t) {
  if (model) {
    if (auto it = model->find(name); it != model->end())
      if (auto v = it->second.evaluate(tensor, t)) return v;
  }
  if (auto it = top.find(name); it != top.end())
    if (auto v = it->second.evaluate(tensor, t)) return v;
  return std::nullopt;
}

}  // namespace

MergeSpec MergeSpec::for_tensor(std::string_view tensor_name, double t_pos) const {
  MergeSpec out = *this;
  if (!varies_by_tensor()) return out;
  out.varying.clear();
  out.base_varying.clear();
  for (ExpertSpec& e : out.experts) {
    e.weight = look_up(&e.varying, varying, "weight", tensor_name, t_pos).value_or(e.weight);
    e.density = look_up(&e.varying, varying, "density", tensor_name, t_pos).value_or(e.density);
    e.gamma = look_up(&e.varying, varying, "gamma", tensor_name, t_pos).value_or(e.gamma);
    e.varying.clear();
  }
  if (out.base_weight)
    out.base_weight =
        look_up(&base_varying, varying, "weight", tensor_name, t_pos).value_or(*base_weight);
  out.lambda = look_up(nullptr, varying, "lambda", tensor_name, t_pos).value_or(lambda);
  if (auto v = look_up(nullptr, varying, "t", tensor_name, t_pos)) out.t = v;
  if (auto v = look_up(nullptr, varying, "scale", tensor_name, t_pos)) out.scale = v;
  return out;
}

nlohmann::json MergeSpec::varying_json() const {
  if (!varies_by_tensor()) return nullptr;
  nlohmann::json models = nlohmann::json::array();
  for (const ExpertSpec& e : experts) models.push_back(table_to_json(e.varying));
  return {{"global", table_to_json(varying)},
          {"base", table_to_json(base_varying)},
          {"models", models}};
}

void MergeSpec::set_varying(const nlohmann::json& json) {
  varying.clear();
  base_varying.clear();
  for (ExpertSpec& e : experts) e.varying.clear();
  if (json.is_null()) return;
  if (!json.is_object() || !json.contains("models") || !json["models"].is_array() ||
      json["models"].size() != experts.size())
    throw std::invalid_argument(
        "varying parameters: expected global, base and one table per model");
  varying = table_from_json(json.value("global", nlohmann::json::object()));
  base_varying = table_from_json(json.value("base", nlohmann::json::object()));
  for (std::size_t k = 0; k < experts.size(); ++k)
    experts[k].varying = table_from_json(json["models"][k]);
}

std::vector<MergeSpec> specs_by_tensor(const MergeSpec& spec,
                                       const std::vector<std::string>& tensor_names) {
  const std::vector<double> positions = gradient_positions(tensor_names);
  std::vector<MergeSpec> out;
  out.reserve(tensor_names.size());
  const bool varies = spec.varies_by_tensor();
  for (std::size_t i = 0; i < tensor_names.size(); ++i) {
    out.push_back(spec.for_tensor(tensor_names[i], positions[i]));
    if (!varies) continue;
    try {
      out.back().validate();
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) + " (tensor '" + tensor_names[i] + "')");
    }
  }
  return out;
}

void MergeSpec::validate() const {
  if (experts.empty() && base_is_reference) {
    throw UsageError("config: a " + std::string(merge_method_name(method)) +
                     " merge without base_model needs two models or more (it "
                     "averages them; one is a copy)");
  }
  if (method == MergeMethod::kPassthrough) {
    // Copies: no expert, nothing to weigh; only `scale` applies.
    if (!experts.empty()) {
      throw UsageError(
          "config: passthrough copies one model's tensors (or slices of layers), "
          "but 'models' lists " +
          std::to_string(experts.size() + 1) + "; a merge of several needs another method");
    }
    if (scale && !std::isfinite(*scale))
      throw UsageError("config: parameter 'scale' is not finite");
    return;
  }
  if (scale || varying.count("scale"))
    throw UsageError("config: parameter 'scale' belongs to passthrough; " +
                     std::string(merge_method_name(method)) + " does not take it");
  if (!slices.empty())
    throw UsageError(
        "config: slices of layers are copied by passthrough only; per-slice "
        "merges are not supported yet");
  if (experts.empty()) throw UsageError("config: 'models' lists no expert to merge");
  for (const auto& e : experts) {
    if (!std::isfinite(e.weight))
      throw UsageError("config: model '" + e.path + "': weight is not finite");
    if (!(e.density > 0.0 && e.density <= 1.0)) {
      throw UsageError("config: model '" + e.path + "': density " + std::to_string(e.density) +
                       " is outside (0, 1]");
    }
    if (!(e.gamma >= 0.0 && e.gamma <= 1.0)) {
      throw UsageError("config: model '" + e.path + "': gamma " + number_text(e.gamma) +
                       " is outside [0, 1]");
    }
  }
  if (!std::isfinite(lambda)) throw UsageError("config: parameter 'lambda' is not finite");
  // Varying settings: every listed value in range (interpolation stays between them).
  const auto check_table = [&](const ParameterTable& table, const std::string& owner) {
    for (const auto& [name, setting] : table) {
      for (double v : setting.listed_values()) {
        if (!std::isfinite(v))
          throw UsageError("config: " + owner + "parameter '" + name +
                           "' has a value that is not finite");
        if (name == "density" && !(v > 0.0 && v <= 1.0))
          throw UsageError("config: " + owner + "density " + number_text(v) + " is outside (0, 1]");
        if (name == "gamma" && !(v >= 0.0 && v <= 1.0))
          throw UsageError("config: " + owner + "gamma " + number_text(v) + " is outside [0, 1]");
      }
    }
  };
  check_table(varying, "");
  check_table(base_varying, "the base model's ");
  for (const auto& e : experts) check_table(e.varying, "model '" + e.path + "': ");
  if (base_weight && !std::isfinite(*base_weight))
    throw UsageError("config: the base model's weight is not finite");
  // The base takes part as a weighted model in linear (and is multislerp's first vector, and an
  // unweighted point of karcher's mean, when the config has no base_model).
  if (base_weight && method != MergeMethod::kLinear &&
      !(base_is_reference && (method == MergeMethod::kMultislerp ||
                              method == MergeMethod::kKarcher || method == MergeMethod::kNuslerp)))
    throw UsageError("config: a weight for the base model applies to linear only");
  validate_method_options();
  const std::string name(merge_method_name(method));
  if (method == MergeMethod::kNearswap) {
    if (experts.size() != 1) {
      throw UsageError("config: nearswap merges one model into the base, but 'models' lists " +
                       std::to_string(experts.size()));
    }
    if (!t && !varying.count("t"))
      throw UsageError("config: nearswap needs parameter 't' (the similarity threshold)");
    if (t && (!std::isfinite(*t) || *t < 0))
      throw UsageError("config: parameter 't' must be a finite number >= 0");
  } else if (method == MergeMethod::kSlerp) {
    if (experts.size() != 1) {
      throw UsageError(
          "config: slerp interpolates between the base and one other model, but 'models' lists " +
          std::to_string(experts.size()) + " besides the base" +
          (experts.size() > 1 ? " (several models: multislerp, karcher or linear)" : ""));
    }
    if (!t && !varying.count("t"))
      throw UsageError("config: slerp needs parameter 't' (0 keeps the base, 1 the other model)");
    if (t && !std::isfinite(*t)) throw UsageError("config: parameter 't' is not finite");
  } else if (method == MergeMethod::kNuslerp) {
    if (experts.size() != (base_is_reference ? 1u : 2u)) {
      throw UsageError(
          "config: nuslerp interpolates between two models (plus an optional base_model, not one "
          "of them), but 'models' lists " +
          std::to_string(experts.size() + (base_is_reference ? 1 : 0)) +
          (base_is_reference ? "" : " besides the base"));
    }
  } else if (method == MergeMethod::kModelStock) {
    if (experts.size() < 2) {
      throw UsageError(
          "config: model_stock needs the base and two models or more (their deltas' angles "
          "decide the merge), but 'models' lists " +
          std::to_string(experts.size()) + " besides the base");
    }
  }
  if (t || varying.count("t")) {
    if (method != MergeMethod::kNearswap && method != MergeMethod::kSlerp)
      throw UsageError("config: parameter 't' belongs to nearswap and slerp; " + name +
                       " does not take it");
  }
  // ties and breadcrumbs* take mergekit's rescale too (default false there): false is accepted,
  // true (the trimmed delta scaled by its L1 ratio) is not built.
  const bool rescales_trim = uses_magnitude_trim(method);
  if (rescale && !uses_dare(method) && method != MergeMethod::kTaskArithmetic &&
      !(rescales_trim && !*rescale)) {
    throw UsageError("config: parameter 'rescale' applies to dare_linear and dare_ties (" + name +
                     (rescales_trim ? " rescales its trimmed deltas in mergekit; that is not built "
                                      "yet, rescale: false is accepted)"
                                    : " does not take it)"));
  }
  const auto gives_gamma = [](const ExpertSpec& e) {
    return e.gamma != ExpertSpec{}.gamma || e.varying.count("gamma") != 0;
  };
  if (!uses_band_trim(method) &&
      (varying.count("gamma") || std::any_of(experts.begin(), experts.end(), gives_gamma)))
    throw UsageError("config: parameter 'gamma' belongs to breadcrumbs and breadcrumbs_ties; " +
                     name + " does not take it");
  const double scale = weight_scale();
  double weight_sum = 0;
  for (const auto& e : experts) {
    const double w = e.weight * scale;
    // Unnormalised, each term λ·w·Δ is formed in fp32 (and linear scales the base by Σw).
    if (scale == 1.0 && std::fabs(w * (method == MergeMethod::kLinear ? 1.0 : lambda)) >
                            static_cast<double>(std::numeric_limits<float>::max())) {
      throw UsageError("config: model '" + e.path + "': weight " + number_text(e.weight) +
                       " is beyond fp32 range without 'normalize: true'");
    }
    weight_sum += w;
  }
  weight_sum += base_weight.value_or(0.0) * scale;
  if (!std::isfinite(weight_sum) ||
      (scale == 1.0 && method == MergeMethod::kLinear &&
       std::fabs(weight_sum) > static_cast<double>(std::numeric_limits<float>::max())))
    throw UsageError("config: the weights are too large: their sum overflows");
  // TIES and DARE-TIES divide by the weights of the agreeing experts (a zero divisor counts as 1);
  // the other methods divide by the whole sum.
  if (effective_normalize() && weight_sum == 0.0 && !uses_sign_election(method)) {
    throw UsageError("config: the weights sum to 0, so 'normalize: true' cannot divide by them");
  }
}

void MergeSpec::validate_method_options() const {
  struct Option {
    const char* name;
    MergeMethod method;
    bool integer;
    double largest;  // flags 1; max_iter bounded so it converts to int
  };
  constexpr double kAny = std::numeric_limits<double>::max();
  static constexpr Option kOptions[] = {{"max_iter", MergeMethod::kKarcher, true, 1e6},
                                        {"tol", MergeMethod::kKarcher, false, kAny},
                                        {"eps", MergeMethod::kMultislerp, false, kAny},
                                        {"filter_wise", MergeMethod::kModelStock, true, 1},
                                        {"nuslerp_flatten", MergeMethod::kNuslerp, true, 1},
                                        {"nuslerp_row_wise", MergeMethod::kNuslerp, true, 1},
                                        {"epsilon", MergeMethod::kRam, false, kAny}};
  for (const auto& [key, value] : method_options) {
    const Option* option = nullptr;
    for (const Option& o : kOptions)
      if (key == o.name) option = &o;
    if (!option) throw UsageError("config: unknown method parameter '" + key + "'");
    if (option->method != method)
      throw UsageError("config: parameter '" + key + "' belongs to " +
                       std::string(merge_method_name(option->method)) + "; " +
                       std::string(merge_method_name(method)) + " does not take it");
    if (!std::isfinite(value) || value < 0 || (option->integer && value != std::floor(value)))
      throw UsageError("config: parameter '" + key + "' must be a " +
                       (option->integer ? "whole number" : "finite number") + " >= 0");
    if (value > option->largest)
      throw UsageError("config: parameter '" + key + "' is " + number_text(value) +
                       ", above its largest value " + number_text(option->largest));
  }
  if (option("filter_wise", 0) != 0)
    throw UsageError(
        "config: model_stock's filter_wise (one t per row of each tensor) is not supported yet; "
        "without it each tensor takes one t");
  if (option("nuslerp_flatten", 1) == 0)
    throw UsageError(
        "config: nuslerp_flatten: false (one slerp per row, or per column with "
        "nuslerp_row_wise) is not supported yet; with the default (true) each tensor is one "
        "vector");
}

Coefficients additive_coefficients(const MergeSpec& spec) {
  Coefficients c;
  double weight_sum = 0;
  // Normalised coefficients are formed from the scaled weights: w/Σw does not depend on it, and
  // Σw can then neither overflow nor underflow.
  const double scale = spec.weight_scale();
  for (const auto& e : spec.experts) weight_sum += e.weight * scale;
  // linear with the base averaged in: Σ w θ / Σ w over the base and the experts alike.
  weight_sum += spec.base_weight.value_or(0.0) * scale;
  const bool normalize = spec.effective_normalize();
  c.alpha.reserve(spec.experts.size());
  switch (spec.method) {
    case MergeMethod::kLinear:
      // Σ w θ / Σ w = θ0 + Σ (w/Σw) Δ;  Σ w θ = (Σw) θ0 + Σ w Δ.
      c.base_scale = normalize ? 1.0 : weight_sum;
      for (const auto& e : spec.experts)
        c.alpha.push_back(normalize ? e.weight * scale / weight_sum : e.weight);
      break;
    case MergeMethod::kNearswap:
      c.alpha.assign(spec.experts.size(), 1.0);  // θ0 + w·Δ, 0 <= w <= 1
      break;
    case MergeMethod::kRam:
      // θ0 + the mean of the active deltas: an entry only this expert moves takes all of it.
      c.alpha.assign(spec.experts.size(), 1.0);
      break;
    default:
      // θ0 + λ Σ w Δ (/Σw when normalized; dare_linear is task arithmetic on the rescaled
      // deltas). For TIES/DARE-TIES this is the per-expert multiplier of the kept delta before
      // sign election; the planner uses it as |α_k|.
      c.base_scale = 1.0;
      for (const auto& e : spec.experts) {
        double a = spec.lambda * (e.weight * scale);
        if (normalize && !uses_sign_election(spec.method))
          a = spec.lambda * (e.weight * scale) / weight_sum;  // task arithmetic, dare_linear
        c.alpha.push_back(a);
      }
      break;
  }
  return c;
}

}  // namespace mergepipe
