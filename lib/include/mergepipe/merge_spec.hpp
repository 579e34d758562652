#pragma once
// A merge description: operator, parameters, inputs. Parsed from YAML by io/, overridden by flags.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mergepipe/dtype.hpp"
#include "mergepipe/parameter_setting.hpp"

namespace mergepipe {

enum class MergeMethod {
  kLinear,
  kTaskArithmetic,
  kTies,
  kDareLinear,
  kDareTies,
  kNearswap,
  kPassthrough,
  kSlerp,
  kModelStock,
  kKarcher,
  kMultislerp,
  kNuslerp,
  kBreadcrumbs,
  kBreadcrumbsTies,
  kRam
};

std::optional<MergeMethod> parse_merge_method(std::string_view name);
std::string_view merge_method_name(MergeMethod method);
// Default of `normalize` per method (SPEC §3): linear and ties true, the others false.
bool default_normalize(MergeMethod method);
// True for methods whose output is a fixed-coefficient sum of deltas (linear, task arithmetic).
bool is_additive(MergeMethod method);
// ties and breadcrumbs*: entries kept by |Δ| against per-(expert, tensor) thresholds.
bool uses_magnitude_trim(MergeMethod method);
// breadcrumbs, breadcrumbs_ties: the kept entries are a band, lower <= |Δ| < upper (the largest
// ones are dropped too), so each (expert, tensor) has two thresholds (trim_threshold_rows).
bool uses_band_trim(MergeMethod method);
// Thresholds per (expert, tensor): 0 (no trim), 1 (ties: the lower one), 2 (the band methods:
// lower, then upper). Plans hold them as rows·K rows of T: row r·K + k for expert k.
std::size_t trim_threshold_rows(MergeMethod method);
bool uses_sign_election(MergeMethod method);  // ties, dare_ties, breadcrumbs_ties
bool uses_dare(MergeMethod method);           // dare_linear, dare_ties: Bernoulli drop + 1/density
// True when the omitted-update bound Σ|α_k|·‖Δ_k omitted‖ is a guarantee: the additive methods,
// and nearswap, whose term w·Δ (0 ≤ w ≤ 1) is never larger than Δ.
bool has_guaranteed_bound(MergeMethod method);
// True for methods whose coefficients come from the geometry of whole tensors (slerp, model_stock,
// karcher, multislerp: norms and dot products of the models, tensor_gram.hpp), known only once
// every block of a tensor was seen.
bool uses_tensor_statistics(MergeMethod method);
// For those methods, what their coefficients depend on, for messages ("slerp's coefficients
// depend on both models' norms and dot product per tensor").
std::string tensor_statistics_needed(MergeMethod method);
// The methods' names, comma separated, for messages.
std::string supported_method_names();

struct ExpertSpec {
  ExpertSpec() = default;
  ExpertSpec(std::string model_path, double w = 1.0, double d = 1.0)
      : path(std::move(model_path)), weight(w), density(d) {}
  std::string path;
  double weight = 1.0;
  double density = 1.0;  // in (0, 1]
  double gamma = 0.01;   // breadcrumbs: the share of largest |Δ| dropped, in [0, 1]
  // This model's settings of the parameters that vary by tensor (see MergeSpec::varying).
  ParameterTable varying;
};

// One slice of a frankenmerge (mergekit's `slices` with passthrough): layers [first, end) of one
// model, renumbered after the slices before it.
struct SliceSource {
  std::string model;
  std::uint64_t first_layer = 0, end_layer = 0;
  bool operator==(const SliceSource&) const = default;
};

struct MergeSpec {
  MergeMethod method = MergeMethod::kLinear;
  std::string base_model;
  std::vector<ExpertSpec> experts;
  std::optional<bool> normalize;  // unset: default_normalize(method)
  double lambda = 1.0;
  std::optional<DType> out_dtype;  // unset: the base's dtype per tensor
  std::uint64_t seed = 0;
  std::optional<std::string> budget;  // as written ("25%", "12GiB", ...)
  std::optional<bool> rescale;        // DARE: divide kept deltas by the density (default true)
  std::optional<double> t;  // nearswap: the similarity threshold; slerp: the interpolation point
  std::optional<double> scale;  // passthrough: a factor on every copied value
  // Scalar options of one method, by mergekit's name: karcher's max_iter and tol, multislerp's
  // eps, model_stock's filter_wise, nuslerp's nuslerp_flatten and nuslerp_row_wise (flags: 0 or
  // 1), ram's epsilon. Absent: the method's default.
  std::map<std::string, double> method_options;
  double option(const std::string& name, double fallback) const {
    const auto it = method_options.find(name);
    return it == method_options.end() ? fallback : it->second;
  }
  // passthrough: the output's layers from these slices in order (the embeddings from the first
  // slice's model, the final norm and head from the last's); empty: base_model copied whole.
  std::vector<SliceSource> slices;
  // A merge written as one slice of layers [first, end) of every model (mergekit's slerp
  // examples): checked on rank 0 to be all of the models' layers (io::check_whole_model_slice)
  // before the task is built; not sent to the ranks.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> merge_layer_range;
  // linear: the base's own weight when it takes part in the average (listed among the models,
  // or the reference model of a config without base_model); unset: the base is not averaged.
  std::optional<double> base_weight;
  bool base_is_reference = false;  // the config had no base_model: base_model is its first model
  // Parameters that vary by tensor (gradients, filters): for such a parameter every level's
  // setting is here (the model's first, then this top level, as mergekit looks them up) and the
  // scalar fields above hold the default the lookup falls back to. Empty for most configs.
  ParameterTable varying;
  ParameterTable base_varying;  // the base's own settings when it takes part (base_weight)
  // The output folder's tokenizer (mergekit's tokenizer_source): unset or "base" the base's,
  // "union" the models' shared tokenizer (refused when they differ), else a model's folder.
  std::optional<std::string> tokenizer_source;
  // mergekit's chat_template: "auto" (the one most of the models carry), "chatml", or a Jinja
  // template; written into the output's tokenizer_config.json. Unset: as the tokenizer has it.
  std::optional<std::string> chat_template;
  // The models as the config named them (folder -> reference, e.g. a hub id), for the card.
  std::map<std::string, std::string> model_names;
  // What rank 0 prints as warnings about the config, one line each: keys that change nothing
  // for this method, paths resolved differently from mergekit. Not part of the merge's identity.
  std::vector<std::string> config_warnings;

  bool effective_normalize() const { return normalize.value_or(default_normalize(method)); }
  bool effective_rescale() const { return rescale.value_or(true); }
  // When normalize makes the merge invariant to the weights' scale and the largest |weight| is
  // outside [2^-60, 2^60]: the power of two that brings it into [1, 2), else 1. Weights of 1e-50
  // or 1e308 then merge in fp32 exactly as their scaled copies would.
  double weight_scale() const;
  bool varies_by_tensor() const;
  // The spec with every parameter resolved for one tensor at gradient position t
  // (gradient_positions): scalars only, nothing left varying.
  MergeSpec for_tensor(std::string_view tensor_name, double t) const;
  // The varying settings as one JSON object {"global", "base", "models"} (null when none): what
  // plans hash and manifests record. set_varying reads it back (std::invalid_argument).
  nlohmann::json varying_json() const;
  void set_varying(const nlohmann::json& json);
  // The experts' folders, in config order.
  std::vector<std::string> expert_paths() const;
  // Throws UsageError naming the problem: no experts, weight not finite, density outside (0, 1],
  // lambda not finite, a zero weight sum where normalize needs it, a parameter the method does
  // not take (or lacks: nearswap's t), nearswap with other than one model.
  void validate() const;

 private:
  void validate_method_options() const;
};

// Fixed coefficients of the delta form `s·θ0 + Σ α_k Δ_k` (linear, task arithmetic) and the
// per-expert multipliers used by the bound and the planner's scores for every method.
struct Coefficients {
  double base_scale = 1.0;    // s
  std::vector<double> alpha;  // α_k
};
Coefficients additive_coefficients(const MergeSpec& spec);

// The spec resolved for each tensor (for_tensor at its gradient position), each validated: a
// UsageError names the tensor. One entry per name; all equal to `spec` when nothing varies.
std::vector<MergeSpec> specs_by_tensor(const MergeSpec& spec,
                                       const std::vector<std::string>& tensor_names);

}  // namespace mergepipe
