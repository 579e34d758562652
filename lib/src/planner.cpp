#include "mergepipe/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "mergepipe/error.hpp"
#include "mergepipe/number_text.hpp"

namespace mergepipe {
namespace {

std::string num(double v) {
  return number_text(v);
}

// Every shape the planner indexes must agree, or the catalog is corrupt.
// `densities`: [expert][tensor] density when the plan trims by magnitude, else empty.
// `band`: the plan needs every tensor's sketch (breadcrumbs' two thresholds come from it).
void check_catalog_shape(const Catalog& catalog, const std::vector<std::uint32_t>& catalog_expert,
                         const std::vector<std::vector<double>>& densities, bool band) {
  const std::size_t blocks = catalog.block_count();
  for (const Block& blk : catalog.blocking.blocks) {
    if (blk.tensor >= catalog.tensors.size()) {
      throw InputError("catalog: a block refers to tensor " + std::to_string(blk.tensor) + " of " +
                       std::to_string(catalog.tensors.size()));
    }
  }
  for (std::size_t k = 0; k < catalog_expert.size(); ++k) {
    const ExpertCatalog& e = catalog.experts[catalog_expert[k]];
    if (e.blocks.size() != blocks) {
      throw InputError("catalog: expert '" + e.location.dir + "' has statistics for " +
                       std::to_string(e.blocks.size()) + " blocks, the blocking has " +
                       std::to_string(blocks));
    }
    const auto lacks = [&](double d) {
      return band ? e.sketches.size() != catalog.tensors.size()
                  : !e.has_trim_thresholds(d, catalog.tensors.size());
    };
    if (!densities.empty() && std::any_of(densities[k].begin(), densities[k].end(), lacks)) {
      throw InputError("catalog: expert '" + e.location.dir + "' has " +
                       std::to_string(e.sketches.size()) + " magnitude sketches for " +
                       std::to_string(catalog.tensors.size()) + " tensors");
    }
    if (e.nonfinite != 0) {
      throw InputError("catalog: expert '" + e.location.dir + "' holds " +
                       std::to_string(e.nonfinite) +
                       " NaN/Inf values, so its blocks cannot be ranked (fix the checkpoint, or "
                       "merge it with --full-read --allow-nonfinite)");
    }
  }
}

}  // namespace

bool candidate_before(const Candidate& a, const Candidate& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.bytes != b.bytes) return a.bytes < b.bytes;
  if (a.expert != b.expert) return a.expert < b.expert;
  return a.block < b.block;
}

double trimmed_norm_estimate(const BlockStats& stats, float threshold) {
  if (!(threshold > 0.0f)) return stats.l2;  // t = 0 keeps every entry
  if (std::isinf(threshold)) return 0.0;     // keeps nothing
  int exponent = 0;
  std::frexp(static_cast<double>(threshold), &exponent);  // t in [2^(e-1), 2^e)
  const int octave = std::clamp(exponent - 1 + kOctaveBias, 0, kNormOctaves - 1);
  const double lo = std::ldexp(1.0, octave - kOctaveBias);
  const double hi = 2.0 * lo;
  // Share of the octave's magnitude range at or above t (1 when t lies below octave 0's range,
  // whose entries all count: octave 0 also holds everything smaller).
  const double share = std::clamp((hi - static_cast<double>(threshold)) / (hi - lo), 0.0, 1.0);
  double kept = share * static_cast<double>(stats.octave_sumsq[static_cast<std::size_t>(octave)]);
  for (int o = octave + 1; o < kNormOctaves; ++o) {
    kept += static_cast<double>(stats.octave_sumsq[static_cast<std::size_t>(o)]);
  }
  return std::min(std::sqrt(kept), stats.l2);
}

double band_norm_estimate(const BlockStats& stats, float lower, float upper) {
  const double kept = trimmed_norm_estimate(stats, lower);
  if (!(upper > 0.0f) || kept == 0.0) return kept;  // no upper cut
  const double above = trimmed_norm_estimate(stats, upper);
  return std::sqrt(std::max(0.0, kept * kept - above * above));
}

std::vector<MergeSpec> specs_by_catalog_tensor(const Catalog& catalog, const MergeSpec& spec) {
  std::vector<std::string> names;
  for (const TensorInfo& t : catalog.tensors) names.push_back(t.name);
  return specs_by_tensor(spec, names);
}

PairGains compute_pair_gains(const Catalog& catalog, const MergeSpec& spec,
                             const std::vector<std::uint32_t>& catalog_expert) {
  const bool trims = uses_magnitude_trim(spec.method), band = uses_band_trim(spec.method);
  const std::size_t tensors = catalog.tensors.size();
  // Parameters per tensor: one resolution when nothing varies, else one per tensor.
  const bool varies = spec.varies_by_tensor();
  const std::vector<MergeSpec> tensor_specs =
      varies ? specs_by_catalog_tensor(catalog, spec) : std::vector<MergeSpec>{spec};
  const auto spec_of = [&](std::size_t t) -> const MergeSpec& {
    return tensor_specs[varies ? t : 0];
  };
  std::vector<std::vector<double>> densities;
  if (trims) {
    densities.assign(spec.experts.size(), {});
    for (std::size_t k = 0; k < spec.experts.size(); ++k)
      for (std::size_t t = 0; t < (varies ? tensors : 1); ++t)
        densities[k].push_back(spec_of(t).experts[k].density);
  }
  check_catalog_shape(catalog, catalog_expert, densities, band);
  std::vector<Coefficients> coefficients;
  for (const MergeSpec& s : tensor_specs) coefficients.push_back(additive_coefficients(s));
  PairGains g;
  g.experts = spec.experts.size();
  g.blocks = catalog.block_count();
  g.gain.assign(g.experts * g.blocks, 0.0);
  g.thresholds.assign((band ? 2 : 1) * g.experts * tensors, 0.0f);
  const auto upper_of = [&](std::size_t k, std::size_t t) -> float& {
    return g.thresholds[(g.experts + k) * tensors + t];
  };
  for (std::size_t k = 0; k < g.experts; ++k) {
    const ExpertCatalog& e = catalog.experts[catalog_expert[k]];
    for (std::size_t t = 0; trims && t < tensors; ++t) {
      const ExpertSpec& es = spec_of(t).experts[k];
      if (band) {
        const TrimBand b = e.trim_band(t, es.density, es.gamma);
        g.thresholds[k * tensors + t] = b.lower;
        upper_of(k, t) = b.upper;
      } else {
        g.thresholds[k * tensors + t] = e.trim_threshold(t, es.density);
      }
    }
    for (std::size_t b = 0; b < g.blocks; ++b) {
      const BlockStats& s = e.blocks[b];
      if (s.nonzero == 0) continue;
      const std::size_t tensor = catalog.blocking.blocks[b].tensor;
      const MergeSpec& ts = spec_of(tensor);
      const double alpha = std::fabs(coefficients[varies ? tensor : 0].alpha[k]);
      const double density = ts.experts[k].density;
      // DARE keeps each entry with probability d and scales it by 1/d: E‖Δ'‖² = ‖Δ‖²/d.
      // Without rescale the kept entries stay as they are: E‖Δ'‖² = d·‖Δ‖².
      const double dare_scale = !uses_dare(spec.method)  ? 1.0
                                : ts.effective_rescale() ? 1.0 / std::sqrt(density)
                                                         : std::sqrt(density);
      double norm = s.l2;
      if (trims) norm = trimmed_norm_estimate(s, g.thresholds[k * tensors + tensor]);
      if (band)
        norm = band_norm_estimate(s, g.thresholds[k * tensors + tensor], upper_of(k, tensor));
      // nearswap's term w·Δ has |w·Δ| <= min(|Δ|, t) per entry.
      if (spec.method == MergeMethod::kNearswap)
        norm = std::min(norm, *ts.t * std::sqrt(static_cast<double>(s.nonzero)));
      const double gain = alpha * norm * dare_scale;
      if (!std::isfinite(gain) || gain < 0) {
        throw InputError("catalog: expert '" + e.location.dir + "' block " + std::to_string(b) +
                         ": delta norm " + num(s.l2) + " is not a finite non-negative number");
      }
      g.gain[k * g.blocks + b] = gain;
    }
  }
  return g;
}

PlanRequest plan_request_for(const MergeSpec& spec, const std::string& budget_flag,
                             std::optional<double> max_error) {
  PlanRequest request;
  const std::string text = !budget_flag.empty() ? budget_flag : spec.budget.value_or("100%");
  request.budget = Budget::parse(text);
  if (request.budget.kind == Budget::Kind::kFraction &&
      request.budget.numerator > request.budget.denominator) {
    throw UsageError("budget '" + text +
                     "' is above 100%: no budget reads more than every expert block (100%)");
  }
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
    request.bare_bytes_text = text;
  request.max_error = max_error;
  return request;
}

Plan make_plan(const Catalog& catalog, const MergeSpec& spec, const PlanRequest& request) {
  spec.validate();
  if (spec.method == MergeMethod::kPassthrough) {
    throw UsageError(
        "passthrough copies tensors and merges no expert: there is nothing to "
        "budget (run it without --catalog and --budget)");
  }
  if (uses_tensor_statistics(spec.method)) {
    throw UsageError(tensor_statistics_needed(spec.method) +
                     ", which the catalog does not hold yet, so it cannot be budgeted: run it "
                     "with --full-read (it reads every model once, at the I/O bound)");
  }
  const bool additive = has_guaranteed_bound(spec.method);
  if (request.max_error) {
    if (!additive) {
      throw UsageError(
          "--max-error needs a method whose bound is a guarantee (linear, "
          "task_arithmetic, nearswap): for " +
          std::string(merge_method_name(spec.method)) +
          " the omitted-update figure is an estimate, not a bound");
    }
    if (!std::isfinite(*request.max_error) || *request.max_error < 0) {
      throw UsageError("--max-error " + num(*request.max_error) + ": must be a finite number >= 0");
    }
  }
  if (normalize_checkpoint_dir(spec.base_model) != normalize_checkpoint_dir(catalog.base.dir)) {
    if (spec.base_is_reference) {
      throw InputError("the config has no base_model, so its first model '" + spec.base_model +
                       "' is the reference the others are budgeted against, but the catalog's "
                       "base is '" +
                       catalog.base.dir + "': build the catalog with --base " + spec.base_model);
    }
    throw InputError("config base_model '" + spec.base_model + "' is not the catalog's base '" +
                     catalog.base.dir + "' (a catalog of another family?)");
  }

  // The catalog's block size, not its smallest block: norm vectors make blocks of a few hundred
  // bytes, which such a budget reads and nothing more.
  const std::uint64_t one_block = catalog.blocking.block_bytes;
  if (!request.bare_bytes_text.empty() && request.budget.bytes > 0 &&
      request.budget.bytes < one_block) {
    throw UsageError("budget '" + request.bare_bytes_text + "' is " + request.bare_bytes_text +
                     " bytes, less than one block of the catalog (" + std::to_string(one_block) +
                     " bytes), so next to nothing would be read; for a share of the full read "
                     "write '" +
                     request.bare_bytes_text + "%', for bytes a unit ('" + request.bare_bytes_text +
                     "MiB')");
  }

  Plan plan;
  plan.family_id = catalog.family_id;
  plan.method = std::string(merge_method_name(spec.method));
  plan.base_dir = catalog.base.dir;
  const Coefficients coefficients = additive_coefficients(spec);
  const std::vector<int> found = catalog.find_experts(spec.expert_paths());
  for (std::size_t k = 0; k < spec.experts.size(); ++k) {
    const ExpertSpec& e = spec.experts[k];
    const int idx = found[k];
    if (idx < 0) {
      throw UsageError(
          "config model '" + e.path + "' is not in the catalog (" +
          std::to_string(catalog.expert_count()) +
          " experts); add it with 'mergepipe catalog --base BASE --experts DIR --out CAT'");
    }
    plan.catalog_expert.push_back(static_cast<std::uint32_t>(idx));
    plan.expert_dirs.push_back(catalog.experts[static_cast<std::size_t>(idx)].location.dir);
    plan.weights.push_back(e.weight);
    plan.densities.push_back(e.density);
    if (uses_band_trim(spec.method)) plan.gammas.push_back(e.gamma);
    plan.alpha.push_back(coefficients.alpha[k]);
  }
  plan.lambda = spec.lambda;
  plan.normalize = spec.effective_normalize();
  plan.seed = spec.seed;
  plan.rescale = spec.effective_rescale();
  plan.t = spec.t;
  plan.base_weight = spec.base_weight;
  plan.base_is_reference = spec.base_is_reference;
  plan.varying_parameters = spec.varies_by_tensor() ? spec.varying_json().dump() : "";
  plan.method_options = spec.method_options;

  const PairGains gains = compute_pair_gains(catalog, spec, plan.catalog_expert);
  const std::size_t K = gains.experts, B = gains.blocks, T = catalog.tensors.size();
  const auto& blocks = catalog.blocking.blocks;
  plan.tensor_count = T;
  plan.block_count = B;
  plan.pairs_total = K * B;
  plan.thresholds = gains.thresholds;
  plan.bound_is_guarantee = additive;

  std::uint64_t bytes_per_expert = 0;
  for (const Block& blk : blocks) bytes_per_expert += blk.byte_length;
  plan.full_expert_bytes = bytes_per_expert * K;
  plan.budget_bytes = request.budget.resolve(plan.full_expert_bytes);
  plan.max_error = request.max_error;

  // Candidates: every pair whose delta is not exactly zero (zero pairs cost nothing to skip and
  // lose nothing, so they are never read at any budget).
  std::vector<Candidate> cands;
  cands.reserve(K * B);
  for (std::size_t k = 0; k < K; ++k) {
    const ExpertCatalog& e = catalog.experts[plan.catalog_expert[k]];
    for (std::size_t b = 0; b < B; ++b) {
      if (e.blocks[b].nonzero == 0) {
        ++plan.pairs_zero;
        continue;
      }
      const std::uint64_t bytes = blocks[b].byte_length;
      if (bytes == 0)
        throw InputError("catalog: block " + std::to_string(b) +
                         " has non-zero entries but 0 bytes");
      cands.push_back({gains.gain[k * B + b] / static_cast<double>(bytes), bytes,
                       static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(b)});
    }
  }
  std::sort(cands.begin(), cands.end(), candidate_before);

  // omitted[p] = bound when the first p candidates are admitted, summed from the last candidate
  // backwards (a fixed order): admitting a longer prefix removes terms, so it never grows.
  const std::size_t N = cands.size();
  std::vector<double> omitted(N + 1, 0.0), omitted_sq(N + 1, 0.0);
  for (std::size_t p = N; p-- > 0;) {
    const double g = gains.gain[cands[p].expert * B + cands[p].block];
    omitted[p] = omitted[p + 1] + g;
    omitted_sq[p] = omitted_sq[p + 1] + g * g;
  }
  // Longest prefix that fits the budget.
  std::size_t p_budget = 0;
  std::uint64_t used = 0;
  while (p_budget < N && cands[p_budget].bytes <= plan.budget_bytes - used)
    used += cands[p_budget++].bytes;
  std::size_t p = p_budget;
  if (request.max_error) {
    // Shortest prefix whose bound is <= E (omitted[] is non-increasing and omitted[N] = 0).
    const std::size_t p_error = static_cast<std::size_t>(
        std::partition_point(omitted.begin(), omitted.end(),
                             [&](double v) { return v > *request.max_error; }) -
        omitted.begin());
    if (p_error > p_budget) {
      std::uint64_t needed = 0;
      for (std::size_t i = 0; i < p_error; ++i) needed += cands[i].bytes;
      throw UsageError("--max-error " + num(*request.max_error) + " needs " + format_bytes(needed) +
                       " of expert reads, but the budget " + request.budget.to_string() +
                       " allows " + format_bytes(plan.budget_bytes) + " (bound " +
                       num(omitted[p_budget]) + " at the budget); raise --budget or --max-error");
    }
    p = p_error;
  }

  plan.mask.assign(K, ExpertMask::empty(B));
  for (std::size_t i = 0; i < p; ++i) {
    plan.mask[cands[i].expert].set(cands[i].block);
    plan.planned_expert_bytes += cands[i].bytes;
  }
  plan.pairs_admitted = p;
  plan.error_bound = omitted[p];
  plan.deviation_estimate = std::sqrt(omitted_sq[p]);

  // Coverage per expert and per tensor, from the mask and the zero statistics.
  plan.expert_coverage.assign(K, Coverage{});
  plan.tensor_coverage.assign(T, Coverage{});
  for (const TensorInfo& t : catalog.tensors) plan.tensor_names.push_back(t.name);
  for (std::size_t k = 0; k < K; ++k) {
    const ExpertCatalog& e = catalog.experts[plan.catalog_expert[k]];
    for (std::size_t b = 0; b < B; ++b) {
      const std::uint64_t bytes = blocks[b].byte_length;
      const bool nonzero = e.blocks[b].nonzero != 0;
      const bool admitted = plan.mask[k].test(b);
      for (Coverage* c : {&plan.expert_coverage[k], &plan.tensor_coverage[blocks[b].tensor]}) {
        ++c->total_pairs;
        c->total_bytes += bytes;
        if (nonzero) {
          ++c->nonzero_pairs;
          c->nonzero_bytes += bytes;
        }
        if (admitted) {
          ++c->admitted_pairs;
          c->admitted_bytes += bytes;
        }
      }
    }
  }
  plan.hash = compute_plan_hash(plan);
  return plan;
}

Plan make_full_read_plan(const MergeSpec& spec, const std::vector<TensorInfo>& tensors,
                         const Blocking& blocking, const std::string& family_id) {
  spec.validate();
  Plan plan;
  plan.family_id = family_id;
  plan.method = std::string(merge_method_name(spec.method));
  plan.base_dir = spec.base_model;
  const Coefficients coefficients = additive_coefficients(spec);
  const std::size_t K = spec.experts.size(), B = blocking.blocks.size(), T = tensors.size();
  for (std::size_t k = 0; k < K; ++k) {
    plan.expert_dirs.push_back(spec.experts[k].path);
    plan.catalog_expert.push_back(kNoCatalogExpert);
    plan.weights.push_back(spec.experts[k].weight);
    plan.densities.push_back(spec.experts[k].density);
    if (uses_band_trim(spec.method)) plan.gammas.push_back(spec.experts[k].gamma);
    plan.alpha.push_back(coefficients.alpha[k]);
  }
  plan.lambda = spec.lambda;
  plan.normalize = spec.effective_normalize();
  plan.seed = spec.seed;
  plan.rescale = spec.effective_rescale();
  plan.t = spec.t;
  plan.base_weight = spec.base_weight;
  plan.base_is_reference = spec.base_is_reference;
  plan.varying_parameters = spec.varies_by_tensor() ? spec.varying_json().dump() : "";
  plan.scale = spec.scale;
  plan.method_options = spec.method_options;
  if (spec.varies_by_tensor()) {
    std::vector<std::string> names;
    for (const TensorInfo& t : tensors) names.push_back(t.name);
    (void)specs_by_tensor(spec, names);  // every tensor's parameters valid, or a UsageError
  }
  plan.tensor_count = T;
  plan.block_count = B;
  plan.pairs_total = plan.pairs_admitted = K * B;
  plan.bound_is_guarantee = has_guaranteed_bound(spec.method);
  // TIES thresholds come from the data (a pre-pass); the other methods do not trim.
  if (!uses_magnitude_trim(spec.method)) plan.thresholds.assign(K * T, 0.0f);
  Coverage per_expert;
  plan.tensor_coverage.assign(T, Coverage{});
  for (const TensorInfo& t : tensors) plan.tensor_names.push_back(t.name);
  for (const Block& blk : blocking.blocks) {
    for (Coverage* c : {&per_expert, &plan.tensor_coverage[blk.tensor]}) {
      const std::uint64_t mult = c == &per_expert ? 1 : K;
      c->admitted_pairs += mult;
      c->nonzero_pairs += mult;
      c->total_pairs += mult;
      c->admitted_bytes += mult * blk.byte_length;
      c->nonzero_bytes += mult * blk.byte_length;
      c->total_bytes += mult * blk.byte_length;
    }
  }
  plan.expert_coverage.assign(K, per_expert);
  plan.full_expert_bytes = plan.budget_bytes = plan.planned_expert_bytes =
      per_expert.total_bytes * K;
  plan.mask.assign(K, ExpertMask::empty(B));
  for (auto& m : plan.mask) {
    for (std::size_t b = 0; b < B; ++b) m.set(b);
  }
  plan.hash = compute_plan_hash(plan);
  return plan;
}

}  // namespace mergepipe
