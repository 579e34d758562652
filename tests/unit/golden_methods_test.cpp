// The golden vectors of tests/data/golden (produced by running mergekit's own method code, see its
// README) replayed through merge_block. Each case is either checked, or skipped for a reason
// named in kSkipped / skip_reason(); docs/operators.md lists the same differences. A case that
// is neither (a new case, or a method that lands) fails the test, so the list stays true.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/karcher.hpp"
#include "mergepipe/layer_names.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/model_stock.hpp"
#include "mergepipe/multislerp.hpp"
#include "mergepipe/nuslerp.hpp"
#include "mergepipe/operators.hpp"
#include "mergepipe/parameter_setting.hpp"
#include "mergepipe/slerp.hpp"
#include "mergepipe/tensor_statistics.hpp"
#include "mergepipe/trim_band.hpp"

using namespace mergepipe;
using nlohmann::json;

namespace {

const json& golden() {
  static const json data = [] {
    std::ifstream in(std::string(MERGEPIPE_TEST_DATA) + "/golden/mergekit-methods.json");
    if (!in) throw std::runtime_error("cannot open the golden vectors");
    return json::parse(in);
  }();
  return data;
}

void flatten_into(const json& v, std::vector<float>& out) {
  if (v.is_array()) {
    for (const json& x : v) flatten_into(x, out);
  } else {
    out.push_back(static_cast<float>(v.get<double>()));  // exact fp32 values written as doubles
  }
}
std::vector<float> flat(const json& v) {
  std::vector<float> out;
  flatten_into(v, out);
  return out;
}

double as_number(const json& v) {
  return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
}

// Cases skipped on purpose, with the reason (docs/operators.md, "Where we differ from mergekit").
const std::map<std::string, std::string>& skipped_cases() {
  static const std::map<std::string, std::string> cases = {
      {"task_arithmetic/zero_weight_sum_normalize",
       "normalize with weights summing to 0 is a usage error here; mergekit divides by 1"},
      {"task_arithmetic/shape_mismatch_skipped",
       "an expert of another shape is refused (exit 3) here; mergekit skips it with a warning"},
  };
  return cases;
}

// Methods whose operator does not exist yet (issue 38); their cases are counted, not checked.
bool method_missing(const std::string& method) {
  static const std::vector<std::string> available = {
      "linear",     "task_arithmetic", "ties",        "dare_linear",      "dare_ties",
      "nearswap",   "passthrough",     "slerp",       "model_stock",      "karcher",
      "multislerp", "nuslerp",         "breadcrumbs", "breadcrumbs_ties", "ram"};
  return std::find(available.begin(), available.end(), method) == available.end();
}

// Why a case of an available method cannot be replayed, or nothing.
std::optional<std::string> skip_reason(const json& c) {
  if (const auto it = skipped_cases().find(c["id"].get<std::string>()); it != skipped_cases().end())
    return it->second;
  if (c.contains("expected_error")) return "an error case (config validation)";
  if (c["expert_names"].empty()) return "a config without an expert is a usage error here";
  const json& global = c["resolved_parameters"]["global"];
  if (c["method"] == "model_stock" && global.contains("filter_wise") &&
      as_number(global["filter_wise"]) != 0.0)
    return "model_stock's filter_wise (one t per row) is not built yet";
  // nuslerp_flatten: false slerps each row (each column with row_wise); a 1-D tensor's one row
  // is the whole tensor, as flattened.
  if (c["method"] == "nuslerp" && global.contains("nuslerp_flatten") &&
      as_number(global["nuslerp_flatten"]) == 0.0 && c["expected_shape"].size() > 1)
    return "nuslerp_flatten: false on a matrix (one slerp per row) is not built yet";
  if ((c["method"] == "ties" || c["method"] == "breadcrumbs" ||
       c["method"] == "breadcrumbs_ties") &&
      global.contains("rescale") && as_number(global["rescale"]) != 0.0)
    return "rescale: true on a trim (the trimmed delta scaled by its L1 ratio) is not built yet";
  const std::size_t n =
      flat(c.contains("base") && !c["base"].is_null() ? c["base"] : c["experts"][0]).size();
  for (const json& e : c["experts"]) {
    if (flat(e).size() != n)
      return "models of different shapes (vocabulary mismatch: the config issue, 37)";
  }
  return std::nullopt;
}

// Relative L2 distance, or the largest absolute difference when the reference is all zeros.
double distance(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0, worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    worst = std::max(worst, std::fabs(d));
  }
  return norm > 0 ? std::sqrt(diff / norm) : worst;
}

struct Replay {
  std::vector<float> base;
  std::vector<std::vector<float>> deltas;
  std::vector<double> gammas;  // breadcrumbs, per expert
  OperatorConfig cfg;
};

// The case as merge_block inputs: experts in expert_names order, Δ = x − base in fp32. A method
// without a base model (linear) is merged against the first model (Σ w θ / Σ w = θ_ref + Σ w
// (θ − θ_ref) / Σ w), every model taking part with its weight, as the config issue specifies.
Replay replay_inputs(const json& c) {
  Replay r;
  const json& per_model = c["resolved_parameters"]["per_model"];
  const json& global = c["resolved_parameters"]["global"];
  std::vector<std::string> names = c["expert_names"].get<std::vector<std::string>>();
  std::vector<std::vector<float>> models;
  for (const json& e : c["experts"]) models.push_back(flat(e));
  if (c["method"] == "passthrough") {
    // A copy of its one model, times its scale: no delta.
    r.base = models.front();
    r.cfg.method = MergeMethod::kPassthrough;
    const json& scale = per_model[names.front()]["scale"];
    if (!scale.is_null()) r.cfg.scale = static_cast<float>(as_number(scale));
    return r;
  }
  const bool reference_methods =
      c["method"] == "karcher" || c["method"] == "multislerp" || c["method"] == "nuslerp";
  if (c["base_model"].is_null()) {
    r.base = models.front();
    if (reference_methods) {
      // As the config parser has it: the first model is the reference θ0 (with its weight),
      // the others are deltas against it.
      const json& p = per_model[names.front()];
      r.cfg.base_is_reference = true;
      r.cfg.base_weight = p.contains("weight") && !p["weight"].is_null()
                              ? static_cast<float>(as_number(p["weight"]))
                              : 1.0f;
      names.erase(names.begin());
      models.erase(models.begin());
    }
  } else {
    r.base = flat(c["base"]);
    // linear has no base semantics: a base given a weight is averaged like any other model.
    if (c["method"] == "linear") {
      names.push_back(c["base_model"].get<std::string>());
      models.push_back(r.base);
    }
  }
  r.cfg.method = *parse_merge_method(c["method"].get<std::string>());
  r.cfg.normalize = global.contains("normalize") ? as_number(global["normalize"]) != 0.0
                                                 : default_normalize(r.cfg.method);
  r.cfg.lambda = global.contains("lambda") ? as_number(global["lambda"]) : 1.0;
  if (global.contains("t")) r.cfg.t = static_cast<float>(as_number(global["t"]));
  if (global.contains("rescale")) r.cfg.rescale = as_number(global["rescale"]) != 0.0;
  if (c["method"] == "slerp") r.cfg.t = static_cast<float>(as_number(global["t"]));
  if (global.contains("normalize_weights"))
    r.cfg.normalize = as_number(global["normalize_weights"]) != 0.0;
  if (global.contains("max_iter")) r.cfg.max_iter = static_cast<int>(as_number(global["max_iter"]));
  if (global.contains("tol")) r.cfg.tol = as_number(global["tol"]);
  if (global.contains("eps")) r.cfg.eps = as_number(global["eps"]);
  if (global.contains("epsilon")) r.cfg.ram_epsilon = as_number(global["epsilon"]);
  for (std::size_t k = 0; k < names.size(); ++k) {
    const json& p = per_model[names[k]];
    r.cfg.weights.push_back(p.contains("weight") && !p["weight"].is_null()
                                ? static_cast<float>(as_number(p["weight"]))
                                : 1.0f);
    r.cfg.densities.push_back(p.contains("density") ? static_cast<float>(as_number(p["density"]))
                                                    : 1.0f);
    r.gammas.push_back(p.contains("gamma") && !p["gamma"].is_null() ? as_number(p["gamma"]) : 0.01);
    std::vector<float> d(r.base.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = models[k][i] - r.base[i];
    r.deltas.push_back(std::move(d));
  }
  return r;
}

// mergekit's magnitude trim keeps the k = int(density·n) largest |Δ| (torch.topk). As a
// threshold for merge_block (|Δ| >= t kept): the k-th largest |Δ|, +inf for k = 0. Ties at the
// k-th value would keep more than k here: such a case is reported, not checked.
std::optional<float> exact_trim_threshold(const std::vector<float>& delta, double density) {
  if (density >= 1.0) return 0.0f;
  const auto k = static_cast<std::size_t>(density * static_cast<double>(delta.size()));
  if (k == 0) return INFINITY;
  std::vector<float> mag;
  for (float d : delta) mag.push_back(std::fabs(d));
  std::sort(mag.begin(), mag.end(), std::greater<>());
  const float t = mag[k - 1];
  if (k < mag.size() && mag[k] == t) return std::nullopt;
  return t;
}

// mergekit's breadcrumbs keeps the ascending ranks [bottom, n - top) of |Δ| (breadcrumbs_counts).
// As merge_block's band (lower <= |Δ| < upper): lower the (top + keep)-th largest |Δ|, upper the
// top-th largest. Equal magnitudes at either cut would keep or drop all of them here, part of
// them there (an unstable sort): nullopt.
std::optional<TrimBand> exact_band(const std::vector<float>& delta, double density, double gamma) {
  const BreadcrumbsCounts counts = breadcrumbs_counts(delta.size(), density, gamma);
  if (counts.keep_all) return TrimBand{};
  if (counts.keeps_nothing()) return TrimBand{INFINITY, INFINITY};
  std::vector<float> mag;
  for (float d : delta) mag.push_back(std::fabs(d));
  std::sort(mag.begin(), mag.end(), std::greater<>());
  const std::size_t top = counts.top, last = counts.top + counts.keep;  // ranks (top, last]
  if (mag[top - 1] == mag[top]) return std::nullopt;
  if (last < mag.size() && mag[last - 1] == mag[last]) return std::nullopt;
  return TrimBand{mag[last - 1], mag[top - 1]};
}

// The Gram of the case's base and deltas, accumulated in two uneven parts (as blocks and slices
// would split it).
TensorGram gram_of(const Replay& r) {
  GramAccumulator acc(r.deltas.size());
  const std::size_t n = r.base.size(), half = n / 2 + 1;
  for (const auto& [first, count] : {std::pair{std::size_t{0}, std::min(half, n)},
                                     std::pair{std::min(half, n), n - std::min(half, n)}}) {
    std::vector<const float*> deltas;
    for (const auto& d : r.deltas) deltas.push_back(d.data() + first);
    acc.add(r.base.data() + first, deltas, count);
  }
  return acc.totals();
}

std::vector<float> run(const Replay& r, const std::vector<float>& thresholds) {
  TensorContext tensor;
  tensor.name_key = 0;
  tensor.thresholds = thresholds;
  std::vector<const float*> deltas;
  for (const auto& d : r.deltas) deltas.push_back(d.data());
  std::vector<float> out(r.base.size());
  merge_block(r.cfg, tensor, 0, out.size(), r.base.data(), deltas, out.data());
  return out;
}

}  // namespace

TEST(GoldenMergekit, EveryDeterministicCaseOfAnAvailableMethodMatches) {
  std::size_t checked = 0, missing = 0, skipped = 0, combine_only = 0;
  std::map<std::string, std::size_t> checked_per_method;
  for (const json& c : golden()["cases"]) {
    const std::string id = c["id"], method = c["method"];
    if (method_missing(method)) {
      ++missing;
      continue;
    }
    if (!c["deterministic"].get<bool>()) continue;  // the stochastic test below
    if (const auto why = skip_reason(c)) {
      ++skipped;
      continue;
    }
    Replay r = replay_inputs(c);
    std::vector<float> thresholds(r.deltas.size(), 0.0f);
    if (method == "ties") {
      bool exact = true;
      for (std::size_t k = 0; k < r.deltas.size(); ++k) {
        const auto t = exact_trim_threshold(r.deltas[k], r.cfg.densities[k]);
        exact = exact && t.has_value();
        thresholds[k] = t.value_or(0.0f);
      }
      if (!exact) {
        // Equal magnitudes at the cut: torch.topk keeps k of them in an unspecified order, a
        // threshold keeps all. The election and the sum are still checked, on mergekit's own
        // trimmed deltas (threshold 0 keeps them as they are).
        const json& sparsified = c["intermediates"]["sparsified_deltas"];
        for (std::size_t k = 0; k < r.deltas.size(); ++k) r.deltas[k] = flat(sparsified[k]);
        std::fill(thresholds.begin(), thresholds.end(), 0.0f);
        ++combine_only;
      }
    }
    if (uses_band_trim(r.cfg.method)) {
      const std::size_t experts = r.deltas.size();
      thresholds.assign(2 * experts, 0.0f);
      bool exact = true;
      for (std::size_t k = 0; k < experts; ++k) {
        const auto band = exact_band(r.deltas[k], r.cfg.densities[k], r.gammas[k]);
        exact = exact && band.has_value();
        thresholds[k] = band.value_or(TrimBand{}).lower;
        thresholds[experts + k] = band.value_or(TrimBand{}).upper;
      }
      if (!exact) {
        // Ties at a cut: checked on mergekit's own trimmed deltas, as for ties above.
        const json& sparsified = c["intermediates"]["sparsified_deltas"];
        for (std::size_t k = 0; k < experts; ++k) r.deltas[k] = flat(sparsified[k]);
        std::fill(thresholds.begin(), thresholds.end(), 0.0f);
        ++combine_only;
      }
    }
    if (uses_tensor_statistics(r.cfg.method)) {
      // The tensor's Gram (what the engine accumulates block by block), then its linear form;
      // mergekit's intermediates checked on the way.
      const TensorGram gram = gram_of(r);
      const json& mid = c["intermediates"];
      if (method == "slerp") {
        const SlerpDecision d =
            slerp_decision(gram, as_number(c["resolved_parameters"]["global"]["t"]));
        EXPECT_EQ(d.lerp, mid["branch"] != "slerp") << id << ": " << mid["branch"];
        EXPECT_NEAR(d.cos_omega, mid["dot_of_normalized"].get<double>(), 1e-6) << id;
        if (!d.lerp) {
          EXPECT_NEAR(d.s0, mid["s0"].get<double>(), 1e-6) << id;
          EXPECT_NEAR(d.s1, mid["s1"].get<double>(), 1e-6) << id;
        }
      } else if (method == "model_stock") {
        const ModelStockDecision d = model_stock_decision(gram, id);
        EXPECT_NEAR(d.cos_theta, mid["cos_theta"][0].get<double>(), 1e-6) << id;
        EXPECT_NEAR(d.t, mid["t"][0].get<double>(), 1e-5 * std::max(1.0, std::fabs(d.t))) << id;
      } else if (method == "karcher") {
        const KarcherDecision d = karcher_decision(gram, r.cfg.max_iter, r.cfg.tol);
        // The base first here, in model order there: compared as sets.
        std::vector<double> norms = mid["norms"].get<std::vector<double>>(), got = d.norms;
        std::sort(norms.begin(), norms.end());
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got.size(), norms.size()) << id;
        for (std::size_t i = 0; i < norms.size(); ++i)
          EXPECT_NEAR(got[i], norms[i], 1e-6 * std::max(1.0, norms[i])) << id;
        EXPECT_NEAR(d.scale, mid["scale_s"].get<double>(), 1e-6 * d.scale) << id;
      } else if (method == "multislerp") {
        MultislerpInputs in;
        in.vectors_are_models = r.cfg.base_is_reference;
        if (in.vectors_are_models) in.weights.push_back(r.cfg.base_weight);
        for (float w : r.cfg.weights) in.weights.push_back(w);
        in.normalize_weights = r.cfg.normalize;
        in.eps = r.cfg.eps;
        const MultislerpDecision d = multislerp_decision(gram, in, id);
        EXPECT_EQ(d.linear_fallback, mid["branch"] != "tangent-space") << id;
        EXPECT_NEAR(d.mean_norm, mid["mean_norm"].get<double>(), 1e-6) << id;
        // mergekit lists the norms in its own model order: compared as sets.
        std::vector<double> got = d.norms, want = mid["norms"].get<std::vector<double>>();
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        ASSERT_EQ(got.size(), want.size()) << id;
        for (std::size_t i = 0; i < got.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(1.0, want[i])) << id;
      }
      if (method == "nuslerp") {
        const bool models = r.cfg.base_is_reference;
        const NuslerpDecision d =
            nuslerp_decision(gram, models ? r.cfg.base_weight : r.cfg.weights[0],
                             models ? r.cfg.weights[0] : r.cfg.weights[1], models);
        EXPECT_NEAR(d.t, mid["t"].get<double>(), 1e-7) << id;
        EXPECT_NEAR(d.cos_theta, mid["cos_theta"][0].get<double>(), 1e-6) << id;
        EXPECT_EQ(d.colinear, mid["colinear_lerp_used"][0].get<int>() != 0) << id;
      }
      r.cfg.linear_form = linear_form_from_gram(r.cfg, gram, id);
    }
    const std::vector<float> want = flat(c["expected"]);
    const std::vector<float> got = run(r, thresholds);
    ASSERT_EQ(got.size(), want.size()) << id;
    EXPECT_LE(distance(got, want), 1e-6) << id << ": " << c["description"];
    ++checked;
    ++checked_per_method[method];
  }
  // Every available method is exercised, and nothing is skipped without a listed reason.
  for (const char* m : {"linear", "task_arithmetic", "ties", "dare_linear", "dare_ties", "nearswap",
                        "passthrough", "slerp", "model_stock", "karcher", "multislerp", "nuslerp",
                        "breadcrumbs", "breadcrumbs_ties", "ram"})
    EXPECT_GT(checked_per_method[m], 0u) << m;
  EXPECT_GE(checked, 123u);  // 74, then model_stock 7, karcher 10, multislerp 7, nuslerp 7,
                             // breadcrumbs 8, breadcrumbs_ties 6, ram 4
  RecordProperty("checked", static_cast<int>(checked));
  RecordProperty("skipped", static_cast<int>(skipped));
  RecordProperty("missing_method", static_cast<int>(missing));
  EXPECT_LE(combine_only, 6u);  // the cases built with ties at the cut, no more
  std::printf(
      "golden: %zu cases checked (%zu on mergekit's trimmed deltas), %zu skipped (listed), %zu "
      "of methods not built yet\n",
      checked, combine_only, skipped, missing);
}

// mergekit's trim decisions (its sparsified deltas) match ours at the exact threshold.
TEST(GoldenMergekit, TiesTrimKeepsWhatMergekitKeeps) {
  std::size_t compared = 0;
  for (const json& c : golden()["cases"]) {
    if (c["method"] != "ties" || skip_reason(c) ||
        !c["intermediates"].contains("sparsified_deltas"))
      continue;
    const Replay r = replay_inputs(c);
    const json& sparsified = c["intermediates"]["sparsified_deltas"];
    for (std::size_t k = 0; k < r.deltas.size(); ++k) {
      const auto t = exact_trim_threshold(r.deltas[k], r.cfg.densities[k]);
      if (!t) continue;  // ties at the cut: see above
      const std::vector<float> want = flat(sparsified[k]);
      for (std::size_t i = 0; i < want.size(); ++i) {
        const bool kept = std::fabs(r.deltas[k][i]) >= *t && r.deltas[k][i] != 0.0f;
        EXPECT_EQ(kept, want[i] != 0.0f) << c["id"] << " expert " << k << " entry " << i;
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 20u);
}

// mergekit's breadcrumbs trim decisions match our band at the exact thresholds, and the band of
// a sketch (what the engine plans with) holds every entry mergekit keeps.
TEST(GoldenMergekit, BreadcrumbsBandKeepsWhatMergekitKeeps) {
  std::size_t compared = 0, sketched = 0;
  for (const json& c : golden()["cases"]) {
    const std::string method = c["method"];
    if ((method != "breadcrumbs" && method != "breadcrumbs_ties") || skip_reason(c)) continue;
    const Replay r = replay_inputs(c);
    const json& sparsified = c["intermediates"]["sparsified_deltas"];
    for (std::size_t k = 0; k < r.deltas.size(); ++k) {
      const std::vector<float> want = flat(sparsified[k]);
      MagnitudeSketch sketch;
      sketch.add(r.deltas[k].data(), r.deltas[k].size());
      const TrimBand wide = sketch.band(r.cfg.densities[k], r.gammas[k]);
      const auto in = [](float d, const TrimBand& b) {
        const float m = std::fabs(d);
        return m >= b.lower && (b.upper <= 0.0f || m < b.upper);
      };
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (want[i] != 0.0f) {
          EXPECT_TRUE(in(r.deltas[k][i], wide)) << c["id"] << " expert " << k << " entry " << i;
        }
      }
      ++sketched;
      const auto band = exact_band(r.deltas[k], r.cfg.densities[k], r.gammas[k]);
      if (!band) continue;  // ties at a cut
      for (std::size_t i = 0; i < want.size(); ++i) {
        const bool kept = in(r.deltas[k][i], *band) && r.deltas[k][i] != 0.0f;
        EXPECT_EQ(kept, want[i] != 0.0f) << c["id"] << " expert " << k << " entry " << i;
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 25u);
  EXPECT_GE(sketched, 35u);
}

// The random methods: our DARE draws its own counter-based masks, so the samples differ from
// mergekit's; the distribution must not. Per entry, the mean over 4000 of our seeds lies within
// 4 standard errors (both runs') of mergekit's Monte-Carlo mean.
TEST(GoldenMergekit, DareMeansMatchMergekitsMonteCarlo) {
  std::size_t cases = 0, differ_on_purpose = 0;
  for (const json& c : golden()["cases"]) {
    const std::string method = c["method"];
    if ((method != "dare_linear" && method != "dare_ties") || c["deterministic"].get<bool>())
      continue;
    if (skip_reason(c)) continue;
    Replay r = replay_inputs(c);
    // mergekit rescales the kept deltas by L1(Δ)/L1(kept) of the whole tensor, we by
    // 1/density: equal in the limit of large tensors (the law of large numbers; relative spread
    // about √((1−d)/(d·n))), measurably different at 32 entries. docs/operators.md says so.
    if (r.cfg.rescale) {
      ++differ_on_purpose;
      continue;
    }
    const json& mc = c["stochastic"]["mc"];
    const std::vector<float> want = flat(mc["mean"]), want_se = flat(mc["stderr"]);
    const std::size_t n = want.size(), runs = 4000;
    std::vector<double> sum(n, 0.0), sum_sq(n, 0.0);
    for (std::size_t s = 0; s < runs; ++s) {
      r.cfg.seed = 1000 + s;
      const std::vector<float> got = run(r, std::vector<float>(r.deltas.size(), 0.0f));
      for (std::size_t i = 0; i < n; ++i) {
        sum[i] += got[i];
        sum_sq[i] += static_cast<double>(got[i]) * got[i];
      }
    }
    double worst_z = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double mean = sum[i] / runs;
      const double var = std::max(0.0, sum_sq[i] / runs - mean * mean);
      const double se = std::sqrt(var / runs + static_cast<double>(want_se[i]) * want_se[i]);
      const double z = se > 0 ? std::fabs(mean - want[i]) / se : std::fabs(mean - want[i]) * 1e12;
      worst_z = std::max(worst_z, z);
    }
    EXPECT_LE(worst_z, 4.0) << c["id"] << ": " << c["description"];
    ++cases;
  }
  EXPECT_EQ(cases, 2u);
  EXPECT_EQ(differ_on_purpose, 7u);
}

// What the L1 rescale converges to: on a large tensor mergekit's factor L1(Δ)/L1(kept) is
// 1/density to within its spread, so our 1/density is its limit (the assumption above).
TEST(GoldenMergekit, DareL1RescaleTendsToOneOverDensity) {
  const std::size_t n = 1u << 20;
  std::vector<float> delta(n);
  std::uint64_t x = 88172645463325252ull;
  for (float& d : delta) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    d = static_cast<float>(static_cast<double>(x >> 11) * 0x1p-53 - 0.5);
  }
  for (double density : {0.1, 0.5, 0.9}) {
    double all = 0, kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      all += std::fabs(delta[i]);
      if (dare_keep(7, 0, 0, i, static_cast<float>(density))) kept += std::fabs(delta[i]);
    }
    const double spread = std::sqrt((1 - density) / (density * static_cast<double>(n)));
    EXPECT_NEAR(all / kept * density, 1.0, 4 * spread) << density;
  }
}

// mergekit's evaluate_setting: scalars, gradients and conditional lists, each at the recorded t.
TEST(GoldenMergekit, ParameterSettingsResolveAsMergekitResolvesThem) {
  std::size_t checked = 0;
  for (const json& c : golden().at("parameter_resolution")) {
    const ParameterSetting setting = setting_from_json(c.at("setting"));
    const std::string tensor = c.at("tensor_name").get<std::string>();
    for (const json& v : c.at("values")) {
      const double t = v.at("t").get<double>();
      const std::optional<double> got = setting.evaluate(tensor, t);
      SCOPED_TRACE(c.at("label").get<std::string>() + " " + tensor + " t=" + std::to_string(t));
      if (v.at("value").is_null()) {
        EXPECT_FALSE(got.has_value());
      } else {
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ(*got, v.at("value").get<double>());  // the same double arithmetic, exactly
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 40u);
}

// mergekit's t per layer of a slice: i / (n - 1), and 1 for a one-layer slice.
TEST(GoldenMergekit, LayerPositionsFollowMergekitsRule) {
  for (const json& c : golden().at("layer_t_rule")) {
    const std::size_t n = c.at("num_layers_in_slice").get<std::size_t>();
    std::vector<std::string> names;
    for (std::size_t i = 0; i < n; ++i)
      names.push_back("model.layers." + std::to_string(i) + ".mlp.up_proj.weight");
    names.push_back("model.embed_tokens.weight");
    names.push_back("model.norm.weight");
    const std::vector<double> t = gradient_positions(names);
    const auto expected = c.at("t_per_layer").get<std::vector<double>>();
    ASSERT_EQ(expected.size(), n);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(t[i], expected[i]) << "layer " << i << " of " << n;
    EXPECT_EQ(t[n], 0.0);      // embeddings: mergekit's pre-weights, at t = 0
    EXPECT_EQ(t[n + 1], 0.0);  // final norm: a post-weight, planned at t = 0 too
  }
}

TEST(ParameterSetting, LayerIndexIsAWholeNameComponent) {
  EXPECT_EQ(tensor_layer("model.layers.12.mlp.up_proj.weight"), std::optional<std::size_t>(12));
  EXPECT_EQ(tensor_layer("transformer.h.3.attn.c_attn.weight"), std::optional<std::size_t>(3));
  EXPECT_EQ(tensor_layer("model.norm.weight"), std::nullopt);
  EXPECT_EQ(tensor_layer("model.sublayers.2x.weight"), std::nullopt);
  EXPECT_EQ(tensor_layer("model.layers.x.weight"), std::nullopt);
}
