#pragma once
// The budget planner (SPEC §2): a pure, deterministic function (catalog, merge spec, budget) ->
// access plan. It reads only catalog statistics, never expert weights. docs/planner.md explains
// the scores, the prefix admission rule, the bound and the max-error mode.
#include <cstdint>
#include <optional>
#include <vector>

#include "mergepipe/budget.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/merge_spec.hpp"
#include "mergepipe/plan.hpp"

namespace mergepipe {

struct PlanRequest {
  Budget budget;  // default: 100% of the full expert read
  std::optional<double>
      max_error;  // additive methods only: stop at the first prefix whose bound <= E
  // The budget as written when it was a bare number of bytes ("50"): make_plan refuses one
  // smaller than a block, which reads nothing (the user almost always meant "50%").
  std::string bare_bytes_text;
};

// The request a command line makes: the --budget flag when given, else the config's `budget`,
// else 100%; UsageError for a budget that does not parse or is above 100%.
PlanRequest plan_request_for(const MergeSpec& spec, const std::string& budget_flag,
                             std::optional<double> max_error);

// Plan experts are spec.experts in config order, each matched to a catalog expert by folder.
// Throws UsageError for an expert or base the catalog does not hold, a bad max_error, or a
// budget and max_error no plan can satisfy together; InputError for an inconsistent catalog.
Plan make_plan(const Catalog& catalog, const MergeSpec& spec, const PlanRequest& request);

// Plan::catalog_expert of a plan made without a catalog.
inline constexpr std::uint32_t kNoCatalogExpert = 0xffffffffu;

// The plan of the naive baseline (`merge --full-read`, no catalog): every pair admitted, bound 0,
// no zero pairs known. Thresholds are left empty for TIES (the caller computes them from the
// data and then recomputes the hash) and are zeros otherwise.
Plan make_full_read_plan(const MergeSpec& spec, const std::vector<TensorInfo>& tensors,
                         const Blocking& blocking, const std::string& family_id);

// The planner's internal quantities, exposed for tests and diagnostics.
// gain(k, b): what omitting pair (k, b) can cost, the term of the bound:
//   linear, task_arithmetic: |α_k|·‖Δ_{k,b}‖₂
//   ties:                   |λ w_k|·(estimated ‖Δ_{k,b}‖₂ of the entries trimming keeps)
//   breadcrumbs*:           |α_k|·(estimated ‖Δ_{k,b}‖₂ of the entries in the band)
//   dare_linear, dare_ties: |λ w_k|·‖Δ_{k,b}‖₂ / sqrt(density_k)
// (k indexes the plan's experts.)
struct PairGains {
  std::size_t experts = 0, blocks = 0;
  std::vector<double> gain;       // [k * blocks + b]
  std::vector<float> thresholds;  // [row * tensors + t], as in Plan::thresholds
  double at(std::size_t k, std::size_t b) const { return gain[k * blocks + b]; }
};
// The same for breadcrumbs' band lower <= |Δ| < upper: what is kept at or above lower less what
// lies at or above upper (upper 0: no upper cut).
double band_norm_estimate(const BlockStats& stats, float lower, float upper);
PairGains compute_pair_gains(const Catalog& catalog, const MergeSpec& spec,
                             const std::vector<std::uint32_t>& catalog_expert);

// Estimated ‖Δ‖₂ of the entries of a block with |Δ| >= t, from its octave sums of squares:
// octaves wholly above t count fully, the octave containing t pro rata to the part of its
// magnitude range above t. Never more than stats.l2.
double trimmed_norm_estimate(const BlockStats& stats, float threshold);

// Orders candidate pairs: score descending, then smaller bytes, then expert, then block.
struct Candidate {
  double score = 0;
  std::uint64_t bytes = 0;
  std::uint32_t expert = 0;
  std::uint32_t block = 0;
};
bool candidate_before(const Candidate& a, const Candidate& b);

}  // namespace mergepipe
