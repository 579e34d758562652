#pragma once
// An access plan: which (expert, block) pairs are read, and what that costs and risks (SPEC §1–2).
// Produced by the planner on rank 0, broadcast to every rank, recorded in the manifest.
// docs/planner.md describes the fields, the hash and the JSON form.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mergepipe/merge_spec.hpp"

namespace mergepipe {

inline constexpr const char* kPlanFormat = "mergepipe-plan-1";

// Per-expert bitmap over blocks; bit b of word b/64 set when (expert, b) is admitted.
struct ExpertMask {
  std::vector<std::uint64_t> words;
  bool test(std::size_t block) const { return (words[block >> 6] >> (block & 63)) & 1u; }
  void set(std::size_t block) { words[block >> 6] |= std::uint64_t{1} << (block & 63); }
  std::size_t count() const;
  // An all-clear mask for `blocks` blocks.
  static ExpertMask empty(std::uint64_t blocks);
  bool operator==(const ExpertMask&) const = default;
};

// Admitted versus useful reads of one plan expert or one tensor (all plan experts).
// "nonzero" counts the pairs whose delta is not exactly zero: the most a plan ever reads.
struct Coverage {
  std::uint64_t admitted_pairs = 0;
  std::uint64_t nonzero_pairs = 0;
  std::uint64_t total_pairs = 0;
  std::uint64_t admitted_bytes = 0;
  std::uint64_t nonzero_bytes = 0;
  std::uint64_t total_bytes = 0;
  // admitted_bytes / nonzero_bytes; 1 when nothing is non-zero (nothing was left out).
  double fraction() const {
    return nonzero_bytes ? static_cast<double>(admitted_bytes) / static_cast<double>(nonzero_bytes)
                         : 1.0;
  }
  bool operator==(const Coverage&) const = default;
};

struct Plan {
  std::string family_id;  // catalog family this plan is for
  std::string method;     // merge_method_name
  std::string base_dir;   // the catalog's base folder
  // Plan experts are the config's experts in config order; these are parallel to them.
  std::vector<std::string> expert_dirs;       // the catalog's folder of each plan expert
  std::vector<std::uint32_t> catalog_expert;  // index into Catalog::experts
  std::vector<double> weights;                // w_k as configured
  std::vector<double> densities;              // density_k as configured
  std::vector<double> gammas;  // breadcrumbs*: gamma_k as configured; empty for other methods
  std::vector<double> alpha;   // α_k (signed); the scores and the bound use |α_k|
  double lambda = 1.0;
  bool normalize = false;  // effective value
  std::uint64_t seed = 0;
  bool rescale = true;      // DARE's rescale (effective value)
  std::optional<double> t;  // nearswap's threshold
  // linear: the base's weight in the average, and whether the base is the config's first model
  // (a config without base_model); see MergeSpec.
  std::optional<double> base_weight;
  bool base_is_reference = false;
  // Parameters that vary by tensor (MergeSpec::varying_json, compact JSON), "" when none; the
  // per-expert weights and densities above are then the defaults those settings fall back to.
  std::string varying_parameters;
  std::optional<double> scale;                   // passthrough's factor, when given
  std::map<std::string, double> method_options;  // MergeSpec::method_options

  std::uint64_t tensor_count = 0;
  std::uint64_t block_count = 0;
  std::uint64_t budget_bytes = 0;
  std::optional<double> max_error;  // --max-error, when given
  std::uint64_t planned_expert_bytes = 0;
  std::uint64_t full_expert_bytes = 0;  // every block of every plan expert
  double error_bound = 0.0;         // Σ_{(k,b)∉A} |α_k|·‖Δ_{k,b}‖₂ (additive methods)
  bool bound_is_guarantee = true;   // false for TIES/DARE: an estimate, not a bound
  double deviation_estimate = 0.0;  // sqrt(Σ_{∉A} α_k² ‖Δ_{k,b}‖²) (orthogonal deltas)
  std::uint64_t pairs_admitted = 0;
  std::uint64_t pairs_total = 0;  // experts × blocks
  std::uint64_t pairs_zero = 0;   // pairs skipped because their delta is exactly zero
  std::vector<ExpertMask> mask;   // per plan expert
  // Per plan expert and tensor, the trimming thresholds from the catalog sketch: ties' (|Δ| >= t
  // kept), or breadcrumbs' band (lower rows 0..K-1, then upper rows K..2K-1: lower <= |Δ| <
  // upper kept); 0 when the method does not trim by magnitude. threshold_rows() rows of
  // tensor_count, row-major. Empty only in a --full-read plan before its thresholds are
  // computed from the data.
  std::vector<float> thresholds;
  // Gram methods (slerp, model_stock, karcher, multislerp): per tensor, the linear form
  // merge_block applies (base_scale, then alpha per expert:
  // tensor_count × (experts + 1), row-major), computed from the data by the --full-read pass.
  // Empty for the other methods, and before that pass.
  std::vector<float> linear_forms;
  std::vector<Coverage> expert_coverage;  // per plan expert
  std::vector<std::string> tensor_names;  // catalog tensor order
  std::vector<Coverage> tensor_coverage;  // per tensor, over all plan experts

  std::string hash;               // hash over the canonical serialisation
  double planning_seconds = 0.0;  // timing: not part of the hash

  bool admitted(std::size_t expert, std::size_t block) const { return mask[expert].test(block); }
  std::size_t expert_count() const { return expert_dirs.size(); }
  float threshold(std::size_t expert, std::size_t tensor) const {
    return thresholds[expert * tensor_count + tensor];
  }
  // Rows of `thresholds` per expert: 2 for the band methods, else 1 (zeros where nothing trims).
  std::size_t threshold_rows() const;
  float upper_threshold(std::size_t expert, std::size_t tensor) const {
    return thresholds[(expert_count() + expert) * tensor_count + tensor];
  }
};

// Canonical byte serialisation (Cereal portable binary) of everything that defines the plan
// except `hash` and `planning_seconds`; the plan hash is hash128_hex of it.
std::string canonical_plan_bytes(const Plan& plan);
std::string compute_plan_hash(const Plan& plan);

// Full round trip (hash and timing included), e.g. to broadcast the plan to every rank.
// deserialize_plan throws InputError when the bytes are malformed or the hash does not match.
std::string serialize_plan(const Plan& plan);
Plan deserialize_plan(const std::string& bytes);

// JSON form (docs/planner.md lists the keys). plan_from_json reads it back exactly (the hash is
// recomputed and must match `plan_hash`); errors are InputError naming `source`.
nlohmann::json plan_to_json(const Plan& plan);
Plan plan_from_json(const nlohmann::json& json, const std::string& source = "plan");

// Access-mask encodings used in the JSON (and by the manifest).
// Hex: the bitmap as bytes, byte i = blocks 8i..8i+7 (bit j = block 8i+j), ceil(blocks/8) bytes,
// two lowercase hex digits per byte. Runs: [first, count] of each maximal run of admitted blocks.
std::string mask_to_hex(const ExpertMask& mask, std::uint64_t blocks);
ExpertMask mask_from_hex(const std::string& hex, std::uint64_t blocks);  // throws InputError
std::vector<std::pair<std::uint64_t, std::uint64_t>> mask_runs(const ExpertMask& mask,
                                                               std::uint64_t blocks);

}  // namespace mergepipe
