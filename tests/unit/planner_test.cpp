// Planner properties over many random catalogs, the worked example of docs/planner.md, error
// cases, plan serialisation round trips, planner quality on mixed experts, and planning time
// on a Llama-3.1-8B-shaped catalog.
#include "mergepipe/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "mergepipe/error.hpp"
#include "plan_test_util.hpp"

using namespace mergepipe;
using namespace mergepipe::test;

namespace {

// ---------------------------------------------------------------------------------------------
// Random catalogs: small tensors with real deltas (zero tensors, zero rows, sparse entries,
// quantised magnitudes so scores tie, duplicated experts so whole experts tie).
struct RandomCase {
  Catalog catalog;
  MergeSpec spec;
};

RandomCase random_case(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };

  std::vector<TensorInfo> tensors;
  const int tensor_count = pick(1, 6);
  for (int t = 0; t < tensor_count; ++t) {
    TensorInfo info{"t" + std::to_string(t), pick(0, 1) ? DType::kBF16 : DType::kF32, {}};
    if (pick(0, 4) == 0) {
      info.shape = {static_cast<std::uint64_t>(pick(1, 40))};
    } else {
      info.shape = {static_cast<std::uint64_t>(pick(1, 24)),
                    static_cast<std::uint64_t>(pick(1, 16))};
    }
    tensors.push_back(info);
  }
  const std::uint64_t block_bytes_choices[] = {8, 32, 64, 256, 1024};
  const std::uint64_t block_bytes = block_bytes_choices[pick(0, 4)];
  auto method = static_cast<MergeMethod>(pick(0, 4));
  // A third of the trimmed cases each are breadcrumbs' bands (chosen from the seed, so the
  // draws of the others stay as they were).
  if (method == MergeMethod::kTies && seed % 3 != 0)
    method = seed % 3 == 1 ? MergeMethod::kBreadcrumbs : MergeMethod::kBreadcrumbsTies;
  const int experts = pick(1, 5);

  std::vector<std::vector<std::vector<float>>> deltas(static_cast<std::size_t>(experts));
  for (int k = 0; k < experts; ++k) {
    if (k > 0 && pick(0, 4) == 0) {  // an exact copy of the previous expert: equal scores
      deltas[k] = deltas[k - 1];
      continue;
    }
    for (const TensorInfo& info : tensors) {
      const std::uint64_t n = info.numel();
      const std::uint64_t row = info.shape.size() == 2 ? info.shape[1] : 1;
      std::vector<float> d(n, 0.0f);
      const int kind = pick(0, 9);
      const double scale = std::pow(10.0, uniform(-4, -1));
      const bool quantise = pick(0, 2) == 0;
      std::normal_distribution<double> normal(0.0, scale);
      for (std::uint64_t i = 0; i < n; ++i) {
        if (kind <= 1) break;  // the whole tensor unchanged
        if (kind <= 3 && ((i / row) * 2654435761u + seed) % 3 == 0) continue;  // frozen rows
        if (kind <= 5 && pick(0, 9) < 7) continue;                             // sparse entries
        double v = normal(rng);
        if (quantise) v = std::round(v / (scale / 4)) * (scale / 4);
        d[i] = static_cast<float>(v);
      }
      deltas[k].push_back(std::move(d));
    }
  }
  RandomCase rc;
  rc.catalog = catalog_from_deltas(tensors, block_bytes, deltas, uses_magnitude_trim(method));
  std::vector<double> weights, densities;
  for (int k = 0; k < experts; ++k) {
    double w = method == MergeMethod::kLinear ? uniform(0.1, 2.0) : uniform(-1.0, 2.0);
    if (method != MergeMethod::kLinear && pick(0, 9) == 0) w = 0.0;  // a zero weight: zero gains
    weights.push_back(w);
    densities.push_back(pick(0, 3) == 0 ? 1.0 : uniform(0.05, 1.0));
  }
  rc.spec = spec_for(rc.catalog, method, weights, densities);
  if (uses_band_trim(method)) {
    const double gammas[] = {0.0, 0.01, 0.1, 0.3};
    for (ExpertSpec& e : rc.spec.experts) e.gamma = gammas[(seed / 3 + e.path.size()) % 4];
  }
  rc.spec.lambda = uniform(0.3, 1.5);
  rc.spec.seed = seed;
  return rc;
}

// An independent statement of the gains (the terms of the bound).
double reference_gain(const RandomCase& rc, std::size_t k, std::size_t b,
                      const std::vector<double>& alpha) {
  const BlockStats& s = rc.catalog.experts[k].blocks[b];
  if (s.nonzero == 0) return 0.0;
  const double a = std::fabs(alpha[k]);
  const double d = rc.spec.experts[k].density;
  switch (rc.spec.method) {
    case MergeMethod::kLinear:
    case MergeMethod::kTaskArithmetic:
      return a * s.l2;
    case MergeMethod::kDareLinear:
    case MergeMethod::kDareTies:
      return rc.spec.effective_rescale() ? a * s.l2 / std::sqrt(d) : a * s.l2 * std::sqrt(d);
    case MergeMethod::kRam:  // its whole delta where it moves an entry alone
      return a * s.l2;
    case MergeMethod::kNearswap:
      return a * std::min(s.l2, *rc.spec.t * std::sqrt(static_cast<double>(s.nonzero)));
    case MergeMethod::kTies: {
      const std::uint32_t t = rc.catalog.blocking.blocks[b].tensor;
      return a * trimmed_norm_estimate(s, rc.catalog.experts[k].sketches[t].threshold(d));
    }
    case MergeMethod::kBreadcrumbs:
    case MergeMethod::kBreadcrumbsTies: {
      // What the band keeps: all at or above its lower edge, less all at or above its upper.
      const std::uint32_t t = rc.catalog.blocking.blocks[b].tensor;
      const TrimBand band = rc.catalog.experts[k].sketches[t].band(d, rc.spec.experts[k].gamma);
      const double kept = trimmed_norm_estimate(s, band.lower);
      const double above = band.upper > 0.0f ? trimmed_norm_estimate(s, band.upper) : 0.0;
      return a *
             std::sqrt(std::max(0.0, kept * kept - std::min(above, kept) * std::min(above, kept)));
    }
    case MergeMethod::kPassthrough:
    case MergeMethod::kSlerp:
    case MergeMethod::kModelStock:
    case MergeMethod::kKarcher:
    case MergeMethod::kMultislerp:
    case MergeMethod::kNuslerp:
      return 0.0;  // no expert, or read whole (--full-read): never planned
  }
  return 0.0;
}

struct Reference {
  std::vector<double> gain;  // [k * B + b]
  std::vector<std::tuple<double, std::uint64_t, std::size_t, std::size_t>>
      order;                                // -score, bytes, k, b
  std::vector<std::uint64_t> prefix_bytes;  // bytes of the first p candidates
};

Reference reference_for(const RandomCase& rc) {
  const std::size_t K = rc.spec.experts.size(), B = rc.catalog.block_count();
  const std::vector<double> alpha = additive_coefficients(rc.spec).alpha;
  Reference r;
  r.gain.assign(K * B, 0.0);
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t b = 0; b < B; ++b) {
      r.gain[k * B + b] = reference_gain(rc, k, b, alpha);
      if (rc.catalog.experts[k].blocks[b].nonzero == 0) continue;
      const std::uint64_t bytes = rc.catalog.blocking.blocks[b].byte_length;
      r.order.emplace_back(-(r.gain[k * B + b] / static_cast<double>(bytes)), bytes, k, b);
    }
  }
  std::sort(r.order.begin(), r.order.end());
  r.prefix_bytes.push_back(0);
  for (const auto& c : r.order) r.prefix_bytes.push_back(r.prefix_bytes.back() + std::get<1>(c));
  return r;
}

// Σ gains of the pairs not in `admitted`, in (expert, block) order.
double brute_force_bound(const Reference& r, std::size_t K, std::size_t B,
                         const std::function<bool(std::size_t, std::size_t)>& admitted) {
  double sum = 0;
  for (std::size_t k = 0; k < K; ++k)
    for (std::size_t b = 0; b < B; ++b)
      if (!admitted(k, b)) sum += r.gain[k * B + b];
  return sum;
}

double prefix_bound(const Reference& r, std::size_t B, std::size_t p) {
  double sum = 0;
  for (std::size_t i = p; i < r.order.size(); ++i) {
    sum += r.gain[std::get<2>(r.order[i]) * B + std::get<3>(r.order[i])];
  }
  return sum;
}

bool near(double a, double b) {
  return std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b)) + 1e-300;
}

// Checks one plan against the reference: prefix of the reference order, soundness, bound,
// zero pairs, thresholds, coverage and counters.
void check_plan(const RandomCase& rc, const Reference& ref, const Plan& plan,
                std::size_t expected_prefix) {
  const std::size_t K = rc.spec.experts.size(), B = rc.catalog.block_count(),
                    T = rc.catalog.tensors.size();
  ASSERT_EQ(plan.mask.size(), K);
  ASSERT_EQ(plan.block_count, B);
  EXPECT_LE(plan.planned_expert_bytes, plan.budget_bytes);
  EXPECT_EQ(plan.pairs_admitted, expected_prefix);
  EXPECT_EQ(plan.planned_expert_bytes, ref.prefix_bytes[expected_prefix]);
  std::vector<char> want(K * B, 0);
  for (std::size_t i = 0; i < expected_prefix; ++i)
    want[std::get<2>(ref.order[i]) * B + std::get<3>(ref.order[i])] = 1;
  std::uint64_t zero = 0, admitted_bytes = 0, admitted = 0;
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t b = 0; b < B; ++b) {
      const bool is_zero = rc.catalog.experts[k].blocks[b].nonzero == 0;
      zero += is_zero;
      ASSERT_EQ(plan.admitted(k, b), want[k * B + b] != 0) << "expert " << k << " block " << b;
      if (plan.admitted(k, b)) {
        EXPECT_FALSE(is_zero) << "a zero pair was admitted";
        admitted_bytes += rc.catalog.blocking.blocks[b].byte_length;
        ++admitted;
      }
    }
  }
  EXPECT_EQ(plan.pairs_zero, zero);
  EXPECT_EQ(plan.pairs_total, K * B);
  EXPECT_EQ(admitted_bytes, plan.planned_expert_bytes);
  const double bound = brute_force_bound(
      ref, K, B, [&](std::size_t k, std::size_t b) { return plan.admitted(k, b); });
  EXPECT_TRUE(near(plan.error_bound, bound)) << plan.error_bound << " vs brute force " << bound;
  double sq = 0;
  for (std::size_t k = 0; k < K; ++k)
    for (std::size_t b = 0; b < B; ++b)
      if (!plan.admitted(k, b)) sq += ref.gain[k * B + b] * ref.gain[k * B + b];
  EXPECT_TRUE(near(plan.deviation_estimate, std::sqrt(sq)));
  EXPECT_EQ(plan.bound_is_guarantee, is_additive(rc.spec.method));
  const bool band = uses_band_trim(rc.spec.method);
  ASSERT_EQ(plan.thresholds.size(), (band ? 2 : 1) * K * T);
  ASSERT_EQ(plan.gammas.size(), band ? K : 0);
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t t = 0; t < T; ++t) {
      const MagnitudeSketch& sketch = rc.catalog.experts[k].sketches[t];
      const ExpertSpec& e = rc.spec.experts[k];
      if (band) {
        const TrimBand want = sketch.band(e.density, e.gamma);
        EXPECT_EQ(plan.threshold(k, t), want.lower);
        EXPECT_EQ(plan.upper_threshold(k, t), want.upper);
        EXPECT_EQ(plan.gammas[k], e.gamma);
        continue;
      }
      const float want_t = uses_magnitude_trim(rc.spec.method) ? sketch.threshold(e.density) : 0.0f;
      EXPECT_EQ(plan.threshold(k, t), want_t);
    }
  }
  std::uint64_t cov_bytes = 0, cov_pairs = 0, cov_nonzero = 0;
  for (const Coverage& c : plan.expert_coverage) cov_bytes += c.admitted_bytes;
  for (const Coverage& c : plan.tensor_coverage) {
    cov_pairs += c.admitted_pairs;
    cov_nonzero += c.nonzero_pairs;
    EXPECT_LE(c.admitted_bytes, c.nonzero_bytes);
  }
  EXPECT_EQ(cov_bytes, plan.planned_expert_bytes);
  EXPECT_EQ(cov_pairs, admitted);
  EXPECT_EQ(cov_nonzero, K * B - zero);
  EXPECT_EQ(plan.hash, compute_plan_hash(plan));
}

std::size_t longest_fitting_prefix(const Reference& ref, std::uint64_t budget) {
  std::size_t p = 0;
  while (p < ref.order.size() && ref.prefix_bytes[p + 1] <= budget) ++p;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(Planner, PropertiesOverRandomCatalogs) {
  int cases_with_ties = 0, cases_with_zero = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const RandomCase rc = random_case(seed);
    const Reference ref = reference_for(rc);
    std::uint64_t full_bytes = 0;
    for (const Block& b : rc.catalog.blocking.blocks)
      full_bytes += b.byte_length * rc.spec.experts.size();
    for (std::size_t i = 0; i + 1 < ref.order.size(); ++i) {
      if (std::get<0>(ref.order[i]) == std::get<0>(ref.order[i + 1])) ++cases_with_ties;
    }
    cases_with_zero += ref.order.size() < rc.spec.experts.size() * rc.catalog.block_count();

    // Budgets: none, one byte, fractions, random byte counts, exact prefix sums (and one byte
    // less), the full cost and more.
    std::mt19937_64 rng(seed * 7919);
    std::vector<Budget> budgets = {Budget::of_bytes(0),          Budget::of_bytes(1),
                                   Budget::of_fraction(1, 10),   Budget::of_fraction(1, 4),
                                   Budget::of_fraction(1, 2),    Budget::of_fraction(9, 10),
                                   Budget::of_fraction(1, 1),    Budget::of_fraction(3, 2),
                                   Budget::of_bytes(full_bytes), Budget::of_bytes(UINT64_MAX)};
    for (int i = 0; i < 6; ++i) {
      budgets.push_back(
          Budget::of_bytes(std::uniform_int_distribution<std::uint64_t>(0, full_bytes)(rng)));
      const std::size_t p = std::uniform_int_distribution<std::size_t>(0, ref.order.size())(rng);
      budgets.push_back(Budget::of_bytes(ref.prefix_bytes[p]));
      if (ref.prefix_bytes[p] > 0) budgets.push_back(Budget::of_bytes(ref.prefix_bytes[p] - 1));
    }
    std::vector<Plan> plans;
    for (const Budget& budget : budgets) {
      PlanRequest req;
      req.budget = budget;
      Plan plan = make_plan(rc.catalog, rc.spec, req);
      EXPECT_EQ(plan.full_expert_bytes, full_bytes);
      EXPECT_EQ(plan.budget_bytes, budget.resolve(full_bytes));
      check_plan(rc, ref, plan, longest_fitting_prefix(ref, plan.budget_bytes));
      if (plan.budget_bytes >= full_bytes) {
        EXPECT_EQ(plan.pairs_admitted, ref.order.size())
            << "full budget must admit every non-zero pair";
        EXPECT_EQ(plan.error_bound, 0.0);
        EXPECT_EQ(plan.deviation_estimate, 0.0);
      }
      // Determinism: the same inputs give the same bytes and hash.
      const Plan again = make_plan(rc.catalog, rc.spec, req);
      EXPECT_EQ(canonical_plan_bytes(again), canonical_plan_bytes(plan));
      EXPECT_EQ(again.hash, plan.hash);
      plans.push_back(std::move(plan));
    }
    // A larger budget never gives a larger bound, and its read set contains the smaller one's.
    std::sort(plans.begin(), plans.end(),
              [](const Plan& a, const Plan& b) { return a.budget_bytes < b.budget_bytes; });
    for (std::size_t i = 1; i < plans.size(); ++i) {
      EXPECT_LE(plans[i].error_bound, plans[i - 1].error_bound);
      EXPECT_LE(plans[i].deviation_estimate, plans[i - 1].deviation_estimate);
      for (std::size_t k = 0; k < plans[i].mask.size(); ++k) {
        for (std::size_t w = 0; w < plans[i].mask[k].words.size(); ++w) {
          EXPECT_EQ(plans[i - 1].mask[k].words[w] & ~plans[i].mask[k].words[w], 0u)
              << "plans are not nested";
        }
      }
    }
    // Round trips preserve every field and the hash.
    for (const Plan& plan : {plans.front(), plans[plans.size() / 2], plans.back()}) {
      const Plan bin = deserialize_plan(serialize_plan(plan));
      EXPECT_EQ(serialize_plan(bin), serialize_plan(plan));
      const Plan js = plan_from_json(nlohmann::json::parse(plan_to_json(plan).dump()));
      EXPECT_EQ(canonical_plan_bytes(js), canonical_plan_bytes(plan));
      EXPECT_EQ(js.hash, plan.hash);
    }

    // Max-error mode (additive methods): bound <= E, and the prefix one shorter exceeds E.
    if (is_additive(rc.spec.method)) {
      const double total = prefix_bound(ref, rc.catalog.block_count(), 0);
      std::vector<double> targets = {0.0, total, total * 2, total * 0.5, total * 0.1};
      for (int i = 0; i < 4 && !ref.order.empty(); ++i) {
        const std::size_t p =
            std::uniform_int_distribution<std::size_t>(0, ref.order.size() - 1)(rng);
        targets.push_back(0.5 * (prefix_bound(ref, rc.catalog.block_count(), p) +
                                 prefix_bound(ref, rc.catalog.block_count(), p + 1)));
      }
      for (double e : targets) {
        PlanRequest req;
        req.max_error = e;
        const Plan plan = make_plan(rc.catalog, rc.spec, req);
        EXPECT_LE(plan.error_bound, e);
        const std::size_t p = plan.pairs_admitted;
        check_plan(rc, ref, plan, p);
        if (p > 0) {
          EXPECT_GT(prefix_bound(ref, rc.catalog.block_count(), p - 1), e * (1 - 1e-12))
              << "a shorter prefix already meets E = " << e;
        }
        // With a budget too: the same plan when the budget allows it, an error when it does not.
        PlanRequest both = req;
        both.budget = Budget::of_bytes(plan.planned_expert_bytes);
        EXPECT_EQ(make_plan(rc.catalog, rc.spec, both).pairs_admitted, p);
        if (plan.planned_expert_bytes > 0) {
          both.budget = Budget::of_bytes(plan.planned_expert_bytes - 1);
          EXPECT_THROW(make_plan(rc.catalog, rc.spec, both), UsageError);
        }
      }
    }
  }
  // The generator must exercise the tie-breaks and the zero pairs.
  EXPECT_GT(cases_with_ties, 20);
  EXPECT_GT(cases_with_zero, 100);
}

// The worked example of docs/planner.md.
TEST(Planner, WorkedExampleFromTheDocs) {
  // One F32 tensor [4, 256]: 4 blocks of one row (1 KiB each); two experts, task arithmetic,
  // w = (1, 0.5), λ = 1: α = (1, 0.5).
  Catalog c = catalog_skeleton({{"w", DType::kF32, {4, 256}}}, 2, 1024);
  const double l2[2][4] = {{4.0, 1.0, 0.0, 2.0}, {6.0, 0.0, 3.0, 1.0}};
  for (int k = 0; k < 2; ++k) {
    for (int b = 0; b < 4; ++b) {
      c.experts[k].blocks[b].l2 = l2[k][b];
      c.experts[k].blocks[b].nonzero = l2[k][b] > 0 ? 256 : 0;
    }
  }
  MergeSpec spec = spec_for(c, MergeMethod::kTaskArithmetic, {1.0, 0.5}, {});
  // Gains: e0 = (4, 1, -, 2), e1 = (3, -, 1.5, 0.5); total 12; 2 zero pairs.
  // Order: (0,0) 4, (1,0) 3, (0,3) 2, (1,2) 1.5, (0,1) 1, (1,3) 0.5.
  PlanRequest req;
  req.budget = Budget::parse("3KiB");
  Plan p = make_plan(c, spec, req);
  EXPECT_EQ(p.pairs_admitted, 3u);
  EXPECT_EQ(p.pairs_zero, 2u);
  EXPECT_EQ(p.planned_expert_bytes, 3072u);
  EXPECT_DOUBLE_EQ(p.error_bound, 3.0);  // 1.5 + 1 + 0.5
  EXPECT_DOUBLE_EQ(p.deviation_estimate, std::sqrt(1.5 * 1.5 + 1.0 + 0.25));
  EXPECT_TRUE(p.admitted(0, 0) && p.admitted(1, 0) && p.admitted(0, 3));
  req.budget = Budget::parse("50%");  // 4 KiB of 8 KiB
  EXPECT_DOUBLE_EQ(make_plan(c, spec, req).error_bound, 1.5);
  req.budget = Budget::parse("100%");
  EXPECT_EQ(make_plan(c, spec, req).planned_expert_bytes, 6144u);  // zero pairs are never read
  req.max_error = 2.0;
  p = make_plan(c, spec, req);
  EXPECT_EQ(p.pairs_admitted, 4u);  // bound 1.5 after 4 pairs, 3.0 after 3
  EXPECT_DOUBLE_EQ(p.error_bound, 1.5);
}

TEST(Planner, TiesTrimmedNormEstimateBracketsTheExactNorm) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<float> d(4096);
  for (float& v : d) v = normal(rng);
  const BlockStats s = compute_block_stats(d, std::as_bytes(std::span<const float>(d)));
  auto exact_kept = [&](double lower) {
    double sq = 0;
    for (float v : d)
      if (std::fabs(v) >= lower) sq += double(v) * v;
    return std::sqrt(sq);
  };
  EXPECT_DOUBLE_EQ(trimmed_norm_estimate(s, 0.0f), s.l2);
  EXPECT_EQ(trimmed_norm_estimate(s, std::numeric_limits<float>::infinity()), 0.0);
  // At an octave edge the estimate is exact (up to the fp32 octave sums).
  for (float t : {0.001953125f, 0.00390625f, 0.0078125f, 0.015625f}) {
    EXPECT_NEAR(trimmed_norm_estimate(s, t), exact_kept(t), 1e-6 * s.l2) << t;
  }
  // Inside an octave it lies between the octaves above t and the octaves from t's octave on
  // (the pro-rata share is a heuristic: the figures show how close it is on a Gaussian).
  for (float t : {0.003f, 0.006f, 0.011f, 0.02f}) {
    const double lo = std::exp2(std::floor(std::log2(double(t))));
    const double est = trimmed_norm_estimate(s, t);
    EXPECT_GE(est, exact_kept(2 * lo) * (1 - 1e-6)) << t;
    EXPECT_LE(est, exact_kept(lo) * (1 + 1e-6)) << t;
    EXPECT_LT(est, exact_kept(lo) * (1 - 1e-3)) << "the share of t's octave must be partial";
    std::printf(
        "[ties-estimate] t = %.4f (sigma 0.01): estimate %.5f, exact %.5f, octave bracket [%.5f, "
        "%.5f]\n",
        double(t), est, exact_kept(t), exact_kept(2 * lo), exact_kept(lo));
  }
}

TEST(Planner, GainsFollowTheOperator) {
  Catalog c = catalog_skeleton({{"w", DType::kF32, {2, 4}}}, 2, 16);
  for (auto& e : c.experts) {
    e.blocks[0].l2 = 2.0;
    e.blocks[0].nonzero = 4;
    e.blocks[1].l2 = 0.0;
  }
  MergeSpec spec = spec_for(c, MergeMethod::kLinear, {1.0, 3.0}, {});
  PairGains g = compute_pair_gains(c, spec, {0, 1});
  EXPECT_DOUBLE_EQ(g.at(0, 0), 0.25 * 2.0);  // α = w/Σw
  EXPECT_DOUBLE_EQ(g.at(1, 0), 0.75 * 2.0);
  EXPECT_EQ(g.at(0, 1), 0.0);
  spec.normalize = false;
  g = compute_pair_gains(c, spec, {0, 1});
  EXPECT_DOUBLE_EQ(g.at(1, 0), 6.0);
  spec = spec_for(c, MergeMethod::kDareLinear, {-2.0, 1.0}, {0.25, 1.0});
  spec.lambda = 0.5;
  g = compute_pair_gains(c, spec, {0, 1});
  EXPECT_DOUBLE_EQ(g.at(0, 0), 1.0 * 2.0 / 0.5);  // |λw|·‖Δ‖/sqrt(d)
  EXPECT_DOUBLE_EQ(g.at(1, 0), 0.5 * 2.0);
}

TEST(Planner, ErrorsNameTheProblem) {
  Catalog c = catalog_skeleton({{"w", DType::kF32, {2, 4}}}, 2, 16);
  c.experts[0].blocks[0] = {1.0, 0.5f, 4, 0, {}};
  MergeSpec spec = spec_for(c, MergeMethod::kLinear, {1.0, 1.0}, {});
  auto message = [&](const MergeSpec& s, const PlanRequest& r) -> std::string {
    try {
      make_plan(c, s, r);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  MergeSpec missing = spec;
  missing.experts[1].path = "/elsewhere/expert-x";
  EXPECT_NE(message(missing, {}).find("/elsewhere/expert-x"), std::string::npos);
  MergeSpec other_base = spec;
  other_base.base_model = "/elsewhere/base";
  EXPECT_NE(message(other_base, {}).find("/elsewhere/base"), std::string::npos);
  EXPECT_THROW(make_plan(c, other_base, {}), InputError);  // a catalog of another family
  PlanRequest bad_error;
  bad_error.max_error = -1.0;
  EXPECT_NE(message(spec, bad_error).find("max-error"), std::string::npos);
  bad_error.max_error = std::nan("");
  EXPECT_NE(message(spec, bad_error).find("max-error"), std::string::npos);
  MergeSpec ties = spec;
  ties.method = MergeMethod::kTies;
  for (auto& e : c.experts) e.sketches.resize(1);
  PlanRequest ok_error;
  ok_error.max_error = 1.0;
  EXPECT_NE(message(ties, ok_error).find("bound is a guarantee"), std::string::npos);
  c.experts[1].nonfinite = 3;
  EXPECT_THROW(make_plan(c, spec, {}), InputError);
  c.experts[1].nonfinite = 0;
  c.experts[1].blocks.pop_back();
  EXPECT_THROW(make_plan(c, spec, {}), InputError);
}

TEST(Planner, PathsMatchAfterNormalisation) {
  Catalog c = catalog_skeleton({{"w", DType::kF32, {2, 4}}}, 2, 16);
  MergeSpec spec = spec_for(c, MergeMethod::kLinear, {1.0, 1.0}, {});
  spec.base_model += "/";
  spec.experts[0].path = "/mergepipe-test-family/x/../expert01";  // the second catalog expert
  spec.experts[1].path = test_expert_dir(0) + "/.";
  const Plan p = make_plan(c, spec, {});
  EXPECT_EQ(p.catalog_expert, (std::vector<std::uint32_t>{1, 0}));
  EXPECT_EQ(p.expert_dirs[0], test_expert_dir(1));
}

TEST(PlanSerialisation, CorruptionIsDetected) {
  const RandomCase rc = random_case(42);
  PlanRequest req;
  req.budget = Budget::of_fraction(1, 3);
  Plan plan = make_plan(rc.catalog, rc.spec, req);
  plan.planning_seconds = 0.125;
  const std::string bytes = serialize_plan(plan);
  EXPECT_EQ(deserialize_plan(bytes).planning_seconds, 0.125);
  EXPECT_THROW(deserialize_plan(bytes.substr(0, bytes.size() / 2)), InputError);
  EXPECT_THROW(deserialize_plan(bytes + "x"), InputError);
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  EXPECT_THROW(deserialize_plan(flipped), InputError);

  nlohmann::json j = plan_to_json(plan);
  EXPECT_EQ(j["plan_hash"], plan.hash);
  for (const char* key :
       {"budget_bytes", "planned_expert_bytes", "full_expert_bytes", "error_bound",
        "pairs_admitted", "pairs_total", "bound_is_guarantee", "deviation_estimate", "pairs_zero",
        "method", "family_id", "experts", "tensors", "access_mask"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  nlohmann::json edited = j;
  edited["error_bound"] = plan.error_bound + 1.0;
  EXPECT_THROW(plan_from_json(edited), InputError);
  edited = j;
  std::string hex = edited["access_mask"]["experts"][0]["bitmap_hex"];
  hex[0] = hex[0] == '0' ? '1' : '0';
  edited["access_mask"]["experts"][0]["bitmap_hex"] = hex;
  EXPECT_THROW(plan_from_json(edited), InputError);
  edited = j;
  edited.erase("pairs_total");
  EXPECT_THROW(plan_from_json(edited), InputError);
}

TEST(PlanSerialisation, MaskEncodings) {
  ExpertMask m = ExpertMask::empty(70);
  for (std::size_t b : {0, 1, 2, 9, 63, 64, 65, 69}) m.set(b);
  EXPECT_EQ(mask_to_hex(m, 70), "070200000000008023");  // ceil(70 / 8) = 9 bytes
  EXPECT_EQ(mask_from_hex(mask_to_hex(m, 70), 70), m);
  const auto runs = mask_runs(m, 70);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0], (std::pair<std::uint64_t, std::uint64_t>{0, 3}));
  EXPECT_EQ(runs[2], (std::pair<std::uint64_t, std::uint64_t>{63, 3}));
  EXPECT_THROW(mask_from_hex("ff", 3), InputError);  // bits beyond the last block
  EXPECT_THROW(mask_from_hex("0G", 8), InputError);
  EXPECT_THROW(mask_from_hex("00", 9), InputError);  // too short
}

TEST(Planner, FullReadPlanAdmitsEverything) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kBF16, {8, 4}}, {"b", DType::kF32, {3}}};
  const Blocking blocking = make_blocking(tensors, 16);
  MergeSpec spec;
  spec.method = MergeMethod::kTies;
  spec.base_model = "/b";
  spec.experts = {{"/e0", 1.0, 0.5}, {"/e1", 1.0, 0.5}};
  Plan p = make_full_read_plan(spec, tensors, blocking, "fam");
  EXPECT_EQ(p.pairs_admitted, 2 * blocking.blocks.size());
  EXPECT_EQ(p.planned_expert_bytes, 2u * (64 + 12));
  EXPECT_TRUE(p.thresholds.empty());  // computed from the data later
  EXPECT_EQ(deserialize_plan(serialize_plan(p)).hash, p.hash);
  EXPECT_EQ(plan_from_json(plan_to_json(p)).hash, p.hash);
  p.thresholds.assign(2 * tensors.size(), 0.25f);
  p.hash = compute_plan_hash(p);
  EXPECT_EQ(plan_from_json(nlohmann::json::parse(plan_to_json(p).dump())).hash, p.hash);
}

// A geometric method's plan: its options and per-tensor linear forms survive both encodings,
// enter the hash, and leave the hashes of plans without them as they were.
TEST(Planner, FullReadPlanKeepsMethodOptionsAndLinearForms) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kBF16, {8, 4}}, {"b", DType::kF32, {3}}};
  const Blocking blocking = make_blocking(tensors, 16);
  MergeSpec spec;
  spec.method = MergeMethod::kKarcher;
  spec.base_model = "/b";
  spec.experts = {{"/e0"}, {"/e1"}};
  const Plan plain = make_full_read_plan(spec, tensors, blocking, "fam");
  spec.method_options = {{"max_iter", 20.0}, {"tol", 1e-7}};
  Plan p = make_full_read_plan(spec, tensors, blocking, "fam");
  EXPECT_NE(p.hash, plain.hash);
  EXPECT_EQ(p.method_options, spec.method_options);
  p.linear_forms = {0.5f, 0.25f, 0.25f, 1.0f, 0.0f, 0.0f};  // 2 tensors x (1 + 2 experts)
  const std::string before = p.hash;
  p.hash = compute_plan_hash(p);
  EXPECT_NE(p.hash, before);
  for (const Plan& back : {deserialize_plan(serialize_plan(p)),
                           plan_from_json(nlohmann::json::parse(plan_to_json(p).dump()))}) {
    EXPECT_EQ(back.hash, p.hash);
    EXPECT_EQ(back.method_options, p.method_options);
    EXPECT_EQ(back.linear_forms, p.linear_forms);
  }
  // Another max_iter is another plan.
  Plan other = p;
  other.method_options["max_iter"] = 10.0;
  EXPECT_NE(compute_plan_hash(other), p.hash);
}

// ---------------------------------------------------------------------------------------------
// Planner quality: a family of realistic, very different experts (toy Llama-like shapes).
namespace {

struct QualityFamily {
  Catalog catalog;
};

QualityFamily quality_family(bool with_sketches) {
  const std::uint64_t h = 128, inter = 384, kv = 32, vocab = 2048, layers = 6;
  std::vector<TensorInfo> tensors;
  tensors.push_back({"model.embed_tokens.weight", DType::kBF16, {vocab, h}});
  for (std::uint64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "self_attn.q_proj.weight", DType::kBF16, {h, h}});
    tensors.push_back({p + "self_attn.k_proj.weight", DType::kBF16, {kv, h}});
    tensors.push_back({p + "self_attn.v_proj.weight", DType::kBF16, {kv, h}});
    tensors.push_back({p + "self_attn.o_proj.weight", DType::kBF16, {h, h}});
    tensors.push_back({p + "mlp.gate_proj.weight", DType::kBF16, {inter, h}});
    tensors.push_back({p + "mlp.up_proj.weight", DType::kBF16, {inter, h}});
    tensors.push_back({p + "mlp.down_proj.weight", DType::kBF16, {h, inter}});
    tensors.push_back({p + "input_layernorm.weight", DType::kBF16, {h}});
    tensors.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {h}});
  }
  tensors.push_back({"model.norm.weight", DType::kBF16, {h}});
  tensors.push_back({"lm_head.weight", DType::kBF16, {vocab, h}});

  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  auto layer_of = [](const std::string& name) -> int {
    const auto pos = name.find("layers.");
    return pos == std::string::npos ? -1 : std::stoi(name.substr(pos + 7));
  };
  auto has = [](const std::string& name, const char* part) {
    return name.find(part) != std::string::npos;
  };
  std::vector<std::vector<std::vector<float>>> deltas(6);
  for (const TensorInfo& t : tensors) {
    const std::uint64_t n = t.numel();
    const int l = layer_of(t.name);
    const bool matrix = t.shape.size() == 2;
    // 0: full fine-tune, mid layers and q/k move most, a third of entries round away in bf16.
    std::vector<float> full(n, 0.0f);
    const double profile = l < 0 ? 0.3 : 1.0 + 2.0 * std::sin(3.14159265 * l / double(layers - 1));
    const double qk = has(t.name, "q_proj") || has(t.name, "k_proj") ? 2.0 : 1.0;
    for (auto& v : full)
      if (u01(rng) > 0.33f) v = static_cast<float>(0.002 * profile * qk * normal(rng));
    // 1: merged LoRA rank 4 on q_proj and v_proj only.
    std::vector<float> lora(n, 0.0f);
    if (has(t.name, "q_proj") || has(t.name, "v_proj")) {
      const std::uint64_t rows = t.shape[0], cols = t.shape[1];
      std::vector<float> a(rows * 4), b(4 * cols);
      for (auto& v : a) v = 0.02f * normal(rng);
      for (auto& v : b) v = 0.02f * normal(rng);
      for (std::uint64_t i = 0; i < rows; ++i)
        for (std::uint64_t j = 0; j < cols; ++j)
          for (int r = 0; r < 4; ++r) lora[i * cols + j] += a[i * 4 + r] * b[r * cols + j];
    }
    // 2: partial fine-tune: upper half of the layers' MLPs only.
    std::vector<float> partial(n, 0.0f);
    if (l >= int(layers / 2) && has(t.name, "mlp"))
      for (auto& v : partial) v = 0.004f * normal(rng);
    // 3: vocabulary extension: 40 embedding and lm_head rows move a lot, nothing else.
    std::vector<float> vocab_e(n, 0.0f);
    if (l < 0 && matrix) {
      for (int r = 0; r < 40; ++r) {
        const std::uint64_t row = 1000 + static_cast<std::uint64_t>(r) * 7;
        for (std::uint64_t j = 0; j < h; ++j) vocab_e[row * h + j] = 0.05f * normal(rng);
      }
    }
    // 4: RL fine-tune: 10% of entries everywhere, small.
    std::vector<float> rl(n, 0.0f);
    for (auto& v : rl)
      if (u01(rng) < 0.1f) v = 3e-4f * normal(rng);
    // 5: a second full fine-tune (domain SFT): late layers and the MLPs move most.
    std::vector<float> domain(n, 0.0f);
    const double late = l < 0 ? 0.5 : 0.3 + 2.0 * double(l) / double(layers - 1);
    const double mlp = has(t.name, "mlp") ? 1.5 : 1.0;
    for (auto& v : domain)
      if (u01(rng) > 0.25f) v = static_cast<float>(0.003 * late * mlp * normal(rng));
    deltas[0].push_back(std::move(full));
    deltas[1].push_back(std::move(lora));
    deltas[2].push_back(std::move(partial));
    deltas[3].push_back(std::move(vocab_e));
    deltas[4].push_back(std::move(rl));
    deltas[5].push_back(std::move(domain));
  }
  return {catalog_from_deltas(tensors, 4096, deltas, with_sketches)};
}

// Mean bound of uniformly random read sets of at most `bytes` bytes, drawn among `pool` pairs.
double random_bound(const PairGains& g, const Catalog& c, std::uint64_t bytes, bool nonzero_only,
                    int draws) {
  std::vector<std::pair<std::size_t, std::size_t>> pool;
  for (std::size_t k = 0; k < g.experts; ++k)
    for (std::size_t b = 0; b < g.blocks; ++b)
      if (!nonzero_only || c.experts[k].blocks[b].nonzero != 0) pool.emplace_back(k, b);
  double total = 0;
  for (std::size_t k = 0; k < g.experts; ++k)
    for (std::size_t b = 0; b < g.blocks; ++b) total += g.at(k, b);
  std::mt19937_64 rng(99);
  double sum = 0;
  for (int d = 0; d < draws; ++d) {
    std::shuffle(pool.begin(), pool.end(), rng);
    std::uint64_t used = 0;
    double kept = 0;
    for (const auto& [k, b] : pool) {
      const std::uint64_t cost = c.blocking.blocks[b].byte_length;
      if (used + cost > bytes) continue;  // fill as many bytes as the planner used
      used += cost;
      kept += g.at(k, b);
    }
    sum += total - kept;
  }
  return sum / draws;
}

}  // namespace

TEST(PlannerQuality, BeatsRandomReadSetsOnMixedExperts) {
  const QualityFamily fam = quality_family(true);
  const Catalog& c = fam.catalog;
  for (MergeMethod method :
       {MergeMethod::kTaskArithmetic, MergeMethod::kLinear, MergeMethod::kTies}) {
    MergeSpec spec = spec_for(c, method, {1, 1, 1, 1, 1, 1}, {0.3, 0.3, 0.3, 0.3, 0.3, 0.3});
    const PairGains g = compute_pair_gains(c, spec, {0, 1, 2, 3, 4, 5});
    PlanRequest req;
    req.budget = Budget::parse("50%");
    const Plan half = make_plan(c, spec, req);
    const double rnd_all = random_bound(g, c, half.planned_expert_bytes, false, 10);
    // Stricter: half of the non-zero bytes, against random sets of non-zero pairs only.
    std::uint64_t nonzero_bytes = 0;
    for (const Coverage& cov : half.expert_coverage) nonzero_bytes += cov.nonzero_bytes;
    ASSERT_GT(nonzero_bytes, half.budget_bytes) << "the family must not fit in half the full read";
    req.budget = Budget::of_bytes(nonzero_bytes / 2);
    const Plan strict = make_plan(c, spec, req);
    const double rnd_nonzero = random_bound(g, c, strict.planned_expert_bytes, true, 10);
    std::printf(
        "[quality] %-15s 50%% of full: bound %.4g vs random %.4g (ratio %.3f); "
        "50%% of non-zero: bound %.4g vs random non-zero %.4g (ratio %.3f)\n",
        std::string(merge_method_name(method)).c_str(), half.error_bound, rnd_all,
        half.error_bound / rnd_all, strict.error_bound, rnd_nonzero,
        strict.error_bound / rnd_nonzero);
    EXPECT_GT(half.error_bound, 0.0);
    EXPECT_LE(half.error_bound, 0.5 * rnd_all);
    EXPECT_LE(strict.error_bound, 0.5 * rnd_nonzero);
    EXPECT_GT(strict.error_bound, 0.0);  // the strict budget really leaves pairs out
  }
}

// ---------------------------------------------------------------------------------------------
// Planning time on a Llama-3.1-8B-shaped catalog, 25 experts, 4 MiB blocks, random statistics.
TEST(PlannerPerformance, Llama31_8B_25Experts) {
  const std::vector<TensorInfo> tensors = llama31_8b_tensors();
  ASSERT_EQ(tensors.size(), 291u);
  std::uint64_t bytes = 0;
  for (const TensorInfo& t : tensors) bytes += t.nbytes();
  ASSERT_EQ(bytes, 16060522496ull);  // checkpoints.md
  Catalog c = catalog_skeleton(tensors, 25, kDefaultBlockBytes);
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (std::size_t k = 0; k < 25; ++k) {
    const int kind = static_cast<int>(k % 5);  // full, lora, partial, vocab, rl
    for (std::size_t b = 0; b < c.block_count(); ++b) {
      const Block& blk = c.blocking.blocks[b];
      const std::string& name = tensors[blk.tensor].name;
      const bool qv =
          name.find("q_proj") != std::string::npos || name.find("v_proj") != std::string::npos;
      double changed = 1.0, rms = 0.002 * (0.5 + u01(rng));
      if (kind == 1 && !qv) changed = 0.0;
      if (kind == 2 && blk.tensor < 150) changed = 0.0;
      if (kind == 3 && (name.find("embed") == std::string::npos || u01(rng) > 0.05)) changed = 0.0;
      if (kind == 4) changed = 0.05 + 0.25 * u01(rng), rms = 3e-4;
      c.experts[k].blocks[b] = random_block_stats(blk.elem_count, rms, changed, rng);
    }
  }
  for (MergeMethod method : {MergeMethod::kLinear, MergeMethod::kDareTies}) {
    MergeSpec spec =
        spec_for(c, method, std::vector<double>(25, 1.0), std::vector<double>(25, 0.5));
    PlanRequest req;
    req.budget = Budget::parse("25%");
    const auto t0 = std::chrono::steady_clock::now();
    const Plan plan = make_plan(c, spec, req);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "[planning] Llama-3.1-8B shapes, 25 experts, %llu blocks (%llu pairs), %s at 25%%: %.3f s "
        "(%llu admitted, %llu zero)\n",
        static_cast<unsigned long long>(plan.block_count),
        static_cast<unsigned long long>(plan.pairs_total), plan.method.c_str(), seconds,
        static_cast<unsigned long long>(plan.pairs_admitted),
        static_cast<unsigned long long>(plan.pairs_zero));
    EXPECT_LE(plan.planned_expert_bytes, plan.budget_bytes);
    EXPECT_GT(plan.pairs_admitted, 0u);
    EXPECT_GT(plan.pairs_zero, 0u);
#ifdef NDEBUG
    EXPECT_LT(seconds, 1.0);
#endif
  }
}

TEST(PlannerPerformance, Llama31_8B_TiesThresholds) {
  // TIES adds one sketch scan per (expert, tensor). Sketches are sparse once built, as a loaded
  // catalog holds them, so the full 25 experts fit in memory here.
  constexpr std::size_t kExperts = 25;
  const std::vector<TensorInfo> tensors = llama31_8b_tensors();
  Catalog c = catalog_skeleton(tensors, kExperts, kDefaultBlockBytes);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.002f);
  std::vector<float> sample(20000);
  for (std::size_t k = 0; k < kExperts; ++k) {
    c.experts[k].sketches.resize(tensors.size());
    for (auto& s : c.experts[k].sketches) {
      for (float& v : sample) v = normal(rng);
      s.add(sample.data(), sample.size());
      s.compact();
    }
    for (std::size_t b = 0; b < c.block_count(); ++b) {
      c.experts[k].blocks[b] = random_block_stats(c.blocking.blocks[b].elem_count, 0.002, 1.0, rng);
    }
  }
  MergeSpec spec = spec_for(c, MergeMethod::kTies, std::vector<double>(kExperts, 1.0),
                            std::vector<double>(kExperts, 0.2));
  PlanRequest req;
  req.budget = Budget::parse("25%");
  const auto t0 = std::chrono::steady_clock::now();
  const Plan plan = make_plan(c, spec, req);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[planning] Llama-3.1-8B shapes, TIES, %zu experts, %llu pairs: %.3f s\n", kExperts,
              static_cast<unsigned long long>(plan.pairs_total), seconds);
  EXPECT_GT(plan.thresholds[0], 0.0f);
  EXPECT_LE(plan.planned_expert_bytes, plan.budget_bytes);
#ifdef NDEBUG
  EXPECT_LT(seconds, 1.0);
#endif
}
