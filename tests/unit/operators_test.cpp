#include "mergepipe/operators.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "mergepipe/dare_mask.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/merge_spec.hpp"

using namespace mergepipe;

namespace {

// Golden inputs of reference/merging.md (base = 0).
const std::vector<float> kTau1 = {.9f, -.1f, .5f, -.7f, .2f, .05f, -.3f, .6f};
const std::vector<float> kTau2 = {-.4f, .8f, .45f, .1f, -.6f, -.25f, .35f, -.15f};

OperatorConfig make_config(MergeMethod method, std::vector<float> weights, bool normalize,
                           double lambda = 1.0, std::vector<float> densities = {},
                           std::uint64_t seed = 0) {
  OperatorConfig cfg;
  cfg.method = method;
  cfg.normalize = normalize;
  cfg.lambda = lambda;
  if (densities.empty()) densities.assign(weights.size(), 1.0f);
  cfg.weights = std::move(weights);
  cfg.densities = std::move(densities);
  cfg.seed = seed;
  return cfg;
}

// Runs merge_block over the whole tensor in one call.
std::vector<float> merge_all(const OperatorConfig& cfg, const TensorContext& tctx,
                             const std::vector<float>& base,
                             const std::vector<const float*>& deltas) {
  std::vector<float> out(base.size());
  merge_block(cfg, tctx, 0, base.size(), base.data(), deltas, out.data());
  return out;
}

float sketch_threshold(const std::vector<float>& delta, double density) {
  MagnitudeSketch sketch;
  sketch.add(delta.data(), delta.size());
  return sketch.threshold(density);
}

std::uint32_t bits_of(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differing += bits_of(a[i]) != bits_of(b[i]);
  EXPECT_EQ(differing, 0u) << what;
}

struct RandomFamily {
  std::vector<float> base;
  std::vector<std::vector<float>> deltas;
};

// bf16-like family: θ rounded to bf16, Δ = θ_k − θ0 in fp32 (many repeated magnitudes, as in
// real fine-tunes, so ties at a TIES threshold occur), plus a run of exact zeros.
RandomFamily random_family(std::size_t n, std::size_t experts, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> w(0.0f, 0.02f), d(0.0f, 0.001f);
  auto bf16 = [](float x) {
    std::uint32_t u = bits_of(x);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return std::bit_cast<float>(u);
  };
  RandomFamily f;
  f.base.resize(n);
  for (auto& x : f.base) x = bf16(w(rng));
  f.deltas.assign(experts, std::vector<float>(n));
  for (std::size_t k = 0; k < experts; ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      const bool frozen = i >= n / 3 && i < n / 3 + 500;
      f.deltas[k][i] = frozen ? 0.0f : bf16(f.base[i] + d(rng)) - f.base[i];
    }
  }
  return f;
}

std::vector<const float*> pointers(const RandomFamily& f) {
  std::vector<const float*> p;
  for (const auto& d : f.deltas) p.push_back(d.data());
  return p;
}

const MergeMethod kAllMethods[] = {MergeMethod::kLinear,
                                   MergeMethod::kTaskArithmetic,
                                   MergeMethod::kTies,
                                   MergeMethod::kDareLinear,
                                   MergeMethod::kDareTies,
                                   MergeMethod::kBreadcrumbs,
                                   MergeMethod::kBreadcrumbsTies,
                                   MergeMethod::kRam};

// The thresholds merge_block takes for method m: `ties` (one per expert) as they are, or for the
// band methods each expert's band from its sketch at its density, gamma 0.02 + 0.04·k (K lower
// thresholds, then K upper).
std::vector<float> thresholds_for(MergeMethod m, const std::vector<float>& ties,
                                  const std::vector<std::vector<float>>& deltas,
                                  const std::vector<float>& densities) {
  if (!uses_band_trim(m)) return ties;
  const std::size_t K = deltas.size();
  std::vector<float> out(2 * K);
  for (std::size_t k = 0; k < K; ++k) {
    MagnitudeSketch sketch;
    sketch.add(deltas[k].data(), deltas[k].size());
    const TrimBand b = sketch.band(densities[k], 0.02 + 0.04 * static_cast<double>(k));
    out[k] = b.lower;
    out[K + k] = b.upper;
  }
  return out;
}

}  // namespace

// ---- golden vectors of reference/merging.md ----

TEST(Operators, TiesGoldenNormalized) {
  const std::vector<float> t = {sketch_threshold(kTau1, 0.5), sketch_threshold(kTau2, 0.5)};
  const std::vector<float> base(8, 0.0f);
  const auto cfg = make_config(MergeMethod::kTies, {1.0f, 0.5f}, true, 1.0, {0.5f, 0.5f});
  const auto out = merge_all(cfg, {tensor_name_key("w"), t}, base, {kTau1.data(), kTau2.data()});
  const float expected[] = {.9f, .8f, .483333f, -.7f, -.6f, 0, 0, .6f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(Operators, TiesGoldenUnnormalized) {
  const std::vector<float> t = {sketch_threshold(kTau1, 0.5), sketch_threshold(kTau2, 0.5)};
  const std::vector<float> base(8, 0.0f);
  const auto cfg = make_config(MergeMethod::kTies, {1.0f, 0.5f}, false, 1.0, {0.5f, 0.5f});
  const auto out = merge_all(cfg, {0, t}, base, {kTau1.data(), kTau2.data()});
  const float expected[] = {.9f, .4f, .725f, -.7f, -.3f, 0, 0, .6f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(Operators, TaskArithmeticGolden) {
  const std::vector<float> base(8, 0.0f);
  const auto cfg = make_config(MergeMethod::kTaskArithmetic, {1.0f, 0.5f}, false, 0.5);
  const auto out = merge_all(cfg, {}, base, {kTau1.data(), kTau2.data()});
  const float expected[] = {.35f, .15f, .3625f, -.325f, -.05f, -.0375f, -.0625f, .2625f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], expected[i], 1e-7) << i;
}

TEST(Operators, MagnitudeTrimGolden) {
  // One expert, weight 1, no normalisation: TIES reduces to the per-tensor trim itself.
  const float t = sketch_threshold(kTau1, 0.5);
  const std::vector<float> base(8, 0.0f);
  const auto cfg = make_config(MergeMethod::kTies, {1.0f}, false, 1.0, {0.5f});
  const auto out = merge_all(cfg, {0, std::span<const float>(&t, 1)}, base, {kTau1.data()});
  const std::vector<float> expected = {.9f, 0, .5f, -.7f, 0, 0, 0, .6f};
  expect_same_bits(out, expected, "trim of tau1 at density .5");
}

TEST(Operators, TiesKeepsEveryEntryAtTheThreshold) {
  // Four entries share the 2nd largest magnitude: top-k with k = 2 keeps all of them.
  const std::vector<float> d = {.5f, -.25f, .25f, .25f, -.25f, .125f};
  const float t = sketch_threshold(d, 0.34);
  EXPECT_EQ(t, .25f);
  const std::vector<float> base(6, 1.0f);
  const auto cfg = make_config(MergeMethod::kTies, {1.0f}, false, 1.0, {0.34f});
  const auto out = merge_all(cfg, {0, std::span<const float>(&t, 1)}, base, {d.data()});
  const std::vector<float> expected = {1.5f, .75f, 1.25f, 1.25f, .75f, 1.0f};
  expect_same_bits(out, expected, "ties at threshold");
}

// ---- exact semantics of each method on small hand-computed inputs ----

TEST(Operators, LinearBothForms) {
  const std::vector<float> base = {1.0f, -2.0f, 0.5f};
  const std::vector<float> d0 = {0.5f, 1.0f, -0.5f}, d1 = {-1.0f, 2.0f, 0.25f};
  // normalize: (1·θ0' + 3·θ1') / 4 with θk' = θ0 + Δk.
  auto out = merge_all(make_config(MergeMethod::kLinear, {1.0f, 3.0f}, true), {}, base,
                       {d0.data(), d1.data()});
  for (int i = 0; i < 3; ++i) {
    const double ref = (1.0 * (base[i] + d0[i]) + 3.0 * (base[i] + d1[i])) / 4.0;
    EXPECT_NEAR(out[i], ref, 1e-6) << i;
  }
  // no normalize: Σ w θ = 4 θ0 + Δ0 + 3 Δ1; λ does not apply to linear.
  out = merge_all(make_config(MergeMethod::kLinear, {1.0f, 3.0f}, false, 7.0), {}, base,
                  {d0.data(), d1.data()});
  for (int i = 0; i < 3; ++i) {
    const double ref = 1.0 * (base[i] + d0[i]) + 3.0 * (base[i] + d1[i]);
    EXPECT_NEAR(out[i], ref, 1e-6) << i;
  }
}

TEST(Operators, TaskArithmeticNormalizedDividesBySumOfWeights) {
  const std::vector<float> base = {1.0f, 2.0f};
  const std::vector<float> d0 = {0.5f, -1.0f}, d1 = {1.5f, 1.0f};
  const auto out = merge_all(make_config(MergeMethod::kTaskArithmetic, {1.0f, 3.0f}, true, 2.0), {},
                             base, {d0.data(), d1.data()});
  EXPECT_FLOAT_EQ(out[0], 1.0f + 2.0f * (0.5f + 4.5f) / 4.0f);
  EXPECT_FLOAT_EQ(out[1], 2.0f + 2.0f * (-1.0f + 3.0f) / 4.0f);
}

TEST(Operators, ScalarsMatchThePlannerCoefficients) {
  // The omitted-update bound uses additive_coefficients; the operator must use the same α.
  for (MergeMethod m : {MergeMethod::kLinear, MergeMethod::kTaskArithmetic}) {
    for (bool normalize : {true, false}) {
      MergeSpec spec;
      spec.method = m;
      spec.normalize = normalize;
      spec.lambda = 0.7;
      spec.experts = {{"a", 0.75, 1.0}, {"b", -0.25, 0.5}, {"c", 1.5, 1.0}};
      const OperatorScalars sc = operator_scalars(OperatorConfig::from_spec(spec));
      const Coefficients c = additive_coefficients(spec);
      EXPECT_FLOAT_EQ(sc.base_scale, static_cast<float>(c.base_scale));
      ASSERT_EQ(sc.alpha.size(), 3u);
      for (int k = 0; k < 3; ++k) EXPECT_FLOAT_EQ(sc.alpha[k], static_cast<float>(c.alpha[k]));
    }
  }
}

TEST(Operators, DareAtDensityOneIsItsBaseMethod) {
  // Nothing dropped and Δ/1 == Δ: dare_linear is task arithmetic (normalize dividing by Σw
  // too) and dare_ties is TIES without trimming, bit for bit.
  const auto f = random_family(6000, 3, 5);
  const std::vector<float> w = {0.7f, -0.2f, 1.1f};
  const std::vector<float> no_trim = {0.0f, 0.0f, 0.0f};
  for (bool normalize : {true, false}) {
    const auto ta = merge_all(make_config(MergeMethod::kTaskArithmetic, w, normalize, 0.6), {},
                              f.base, pointers(f));
    const auto dl = merge_all(make_config(MergeMethod::kDareLinear, w, normalize, 0.6), {9, {}},
                              f.base, pointers(f));
    expect_same_bits(ta, dl, "dare_linear vs task_arithmetic");
    const auto ties = merge_all(make_config(MergeMethod::kTies, w, normalize, 0.6), {9, no_trim},
                                f.base, pointers(f));
    const auto dt = merge_all(make_config(MergeMethod::kDareTies, w, normalize, 0.6), {9, {}},
                              f.base, pointers(f));
    expect_same_bits(ties, dt, "dare_ties vs ties");
  }
}

TEST(Operators, FromSpecUsesEffectiveNormalize) {
  MergeSpec spec;
  spec.experts = {{"a", 2.0, 0.3}};
  spec.seed = 99;
  spec.lambda = 0.4;
  for (MergeMethod m : kAllMethods) {
    spec.method = m;
    const auto cfg = OperatorConfig::from_spec(spec);
    EXPECT_EQ(cfg.normalize, default_normalize(m));
    EXPECT_EQ(cfg.weights, std::vector<float>{2.0f});
    EXPECT_EQ(cfg.densities, std::vector<float>{0.3f});
    EXPECT_EQ(cfg.seed, 99u);
    EXPECT_EQ(cfg.lambda, 0.4);
  }
  spec.normalize = false;
  spec.method = MergeMethod::kTies;
  EXPECT_FALSE(OperatorConfig::from_spec(spec).normalize);
}

TEST(Operators, TiesZeroSumElectsPlus) {
  const std::vector<float> base = {0.0f};
  const std::vector<float> d0 = {0.5f}, d1 = {-0.5f};
  const std::vector<float> t = {0.0f, 0.0f};
  const auto out = merge_all(make_config(MergeMethod::kTies, {1.0f, 1.0f}, true), {0, t}, base,
                             {d0.data(), d1.data()});
  EXPECT_EQ(out[0], 0.5f);  // only the positive expert agrees; divisor 1
}

TEST(Operators, TiesZeroDivisorCountsAsOne) {
  // Weighted deltas 1·0.5 and −1·(−0.3) agree (+), but their weights sum to 0.
  const std::vector<float> base = {0.0f};
  const std::vector<float> d0 = {0.5f}, d1 = {-0.3f};
  const std::vector<float> t = {0.0f, 0.0f};
  const auto out = merge_all(make_config(MergeMethod::kTies, {1.0f, -1.0f}, true, 0.5), {0, t},
                             base, {d0.data(), d1.data()});
  EXPECT_FLOAT_EQ(out[0], 0.5f * 0.8f);
}

TEST(Operators, TiesWeightsDriveTheElection) {
  // Unweighted the negative delta wins (|−0.4| > 0.3); weighted 2·0.3 > 0.4 elects +.
  const std::vector<float> base = {1.0f};
  const std::vector<float> d0 = {0.3f}, d1 = {-0.4f};
  const std::vector<float> t = {0.0f, 0.0f};
  const auto out = merge_all(make_config(MergeMethod::kTies, {2.0f, 1.0f}, true), {0, t}, base,
                             {d0.data(), d1.data()});
  EXPECT_FLOAT_EQ(out[0], 1.0f + 2.0f * 0.3f / 2.0f);
}

TEST(Operators, DareTiesDensityOneIsSignElectionWithoutTrim) {
  const std::vector<float> base = {0.0f, 0.0f, 0.0f};
  const std::vector<float> d0 = {0.2f, -0.1f, 0.05f}, d1 = {0.1f, 0.3f, -0.2f};
  const auto out = merge_all(make_config(MergeMethod::kDareTies, {1.0f, 0.5f}, false, 2.0), {},
                             base, {d0.data(), d1.data()});
  EXPECT_FLOAT_EQ(out[0], 2.0f * (0.2f + 0.05f));  // both +
  EXPECT_FLOAT_EQ(out[1], 2.0f * 0.15f);           // sum −0.1 + 0.15 > 0: expert 1 only
  EXPECT_FLOAT_EQ(out[2], 2.0f * -0.1f);           // sum 0.05 − 0.1 < 0: expert 1 only
}

TEST(Operators, OutputMayAliasBase) {
  const auto f = random_family(5000, 3, 7);
  const auto cfg =
      make_config(MergeMethod::kDareTies, {1.0f, 0.5f, 2.0f}, true, 1.0, {0.5f, 0.9f, 0.2f}, 3);
  const auto expected = merge_all(cfg, {11, {}}, f.base, pointers(f));
  std::vector<float> inout = f.base;
  merge_block(cfg, {11, {}}, 0, inout.size(), inout.data(), pointers(f), inout.data());
  expect_same_bits(inout, expected, "aliased output");
}

TEST(Operators, MismatchedInputsThrow) {
  const std::vector<float> base(4), d(4);
  std::vector<float> out(4);
  const std::vector<const float*> one = {d.data()};
  auto cfg = make_config(MergeMethod::kLinear, {1.0f, 1.0f}, true);
  EXPECT_THROW(merge_block(cfg, {}, 0, 4, base.data(), one, out.data()), std::invalid_argument);
  cfg = make_config(MergeMethod::kTies, {1.0f}, true);
  EXPECT_THROW(merge_block(cfg, {}, 0, 4, base.data(), one, out.data()), std::invalid_argument);
  cfg = make_config(MergeMethod::kTaskArithmetic, {1.0f, -1.0f}, true);
  const std::vector<const float*> two = {d.data(), d.data()};
  EXPECT_THROW(merge_block(cfg, {}, 0, 4, base.data(), two, out.data()), std::invalid_argument);
}

// ---- mask-awareness ----

TEST(Operators, OmittedExpertEqualsZeroDeltaForEveryMethod) {
  const auto f = random_family(10000, 3, 11);
  const std::vector<float> zeros(f.base.size(), 0.0f);
  std::vector<float> t;
  for (const auto& d : f.deltas) t.push_back(sketch_threshold(d, 0.4));
  for (MergeMethod m : kAllMethods) {
    for (bool normalize : {true, false}) {
      const auto cfg = make_config(m, {0.8f, -0.3f, 1.2f}, normalize, 0.9, {0.4f, 0.7f, 0.5f}, 5);
      const std::vector<float> tm = thresholds_for(m, t, f.deltas, {0.4f, 0.7f, 0.5f});
      const TensorContext tctx{tensor_name_key("layers.0.w"), tm};
      const auto omitted =
          merge_all(cfg, tctx, f.base, {f.deltas[0].data(), nullptr, f.deltas[2].data()});
      const auto zero =
          merge_all(cfg, tctx, f.base, {f.deltas[0].data(), zeros.data(), f.deltas[2].data()});
      expect_same_bits(omitted, zero, merge_method_name(m).data());
      const auto full = merge_all(cfg, tctx, f.base, pointers(f));
      std::size_t changed = 0;
      for (std::size_t i = 0; i < full.size(); ++i) changed += full[i] != omitted[i];
      EXPECT_GT(changed, full.size() / 10) << "omitting an expert must matter";
    }
  }
}

TEST(Operators, LinearOmittedExpertKeepsItsCoefficient) {
  const std::vector<float> base = {1.0f, -0.5f, 2.0f};
  const std::vector<float> d0 = {0.25f, 0.5f, -1.0f}, d1 = {3.0f, 3.0f, 3.0f};
  const auto cfg = make_config(MergeMethod::kLinear, {1.0f, 3.0f}, true);
  const auto out = merge_all(cfg, {}, base, {d0.data(), nullptr});
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(out[i], base[i] + 0.25f * d0[i]) << i;  // α0 = 1/4
}

TEST(Operators, TiesOmittedExpertIsNotInTheDivisor) {
  const std::vector<float> base = {0.0f};
  const std::vector<float> d0 = {0.4f}, d1 = {0.2f};
  const std::vector<float> t = {0.0f, 0.0f};
  const auto cfg = make_config(MergeMethod::kTies, {1.0f, 3.0f}, true);
  EXPECT_FLOAT_EQ(merge_all(cfg, {0, t}, base, {d0.data(), d1.data()})[0], (0.4f + 0.6f) / 4.0f);
  EXPECT_FLOAT_EQ(merge_all(cfg, {0, t}, base, {d0.data(), nullptr})[0], 0.4f);
  EXPECT_FLOAT_EQ(merge_all(cfg, {0, t}, base, {nullptr, nullptr})[0], 0.0f);
}

TEST(Operators, OmittedBlocksDoNotChangeWhatReadBlocksKeep) {
  // TIES thresholds come from the whole tensor, so a block merged with one expert omitted in
  // another block equals the full merge on the blocks where every expert was read.
  const auto f = random_family(8192, 2, 13);
  const std::vector<float> t = {sketch_threshold(f.deltas[0], 0.3),
                                sketch_threshold(f.deltas[1], 0.3)};
  const auto cfg = make_config(MergeMethod::kTies, {1.0f, 1.0f}, true, 1.0, {0.3f, 0.3f});
  const TensorContext tctx{0, t};
  const auto full = merge_all(cfg, tctx, f.base, pointers(f));
  std::vector<float> masked(8192);
  merge_block(cfg, tctx, 0, 4096, f.base.data(),
              std::vector<const float*>{f.deltas[0].data(), f.deltas[1].data()}, masked.data());
  merge_block(cfg, tctx, 4096, 4096, f.base.data() + 4096,
              std::vector<const float*>{f.deltas[0].data() + 4096, nullptr}, masked.data() + 4096);
  EXPECT_EQ(std::memcmp(full.data(), masked.data(), 4096 * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(full.data() + 4096, masked.data() + 4096, 4096 * sizeof(float)), 0);
}

// ---- the documented fp32 evaluation order, many experts ----

namespace {
// Scalar fp32 transcription of docs/operators.md, one element at a time, experts k = 0..K-1.
float scalar_merge(const OperatorConfig& cfg, const TensorContext& tctx, std::uint64_t index,
                   float base, const std::vector<const float*>& deltas, std::size_t i) {
  const std::size_t K = cfg.weights.size();
  if (cfg.method == MergeMethod::kRam) {  // the mean of the deltas above epsilon, in order
    float sum = 0, count = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const float d = deltas[k] ? deltas[k][i] : 0.0f;
      if (std::fabs(d) > static_cast<float>(cfg.ram_epsilon)) sum += d, count += 1;
    }
    return base + sum / (count == 0 ? 1.0f : count);
  }
  const OperatorScalars sc = operator_scalars(cfg);
  auto kept = [&](std::size_t k) -> float {  // Δ'_k of this element
    const float d = deltas[k] ? deltas[k][i] : 0.0f;
    if (uses_dare(cfg.method)) {
      return dare_keep(cfg.seed, static_cast<std::uint32_t>(k), tctx.name_key, index,
                       cfg.densities[k])
                 ? d / cfg.densities[k]
                 : 0.0f;
    }
    if (uses_band_trim(cfg.method)) {
      const float upper = tctx.thresholds[K + k];  // 0: no upper cut
      return std::fabs(d) >= tctx.thresholds[k] && (upper <= 0.0f || std::fabs(d) < upper) ? d
                                                                                           : 0.0f;
    }
    if (uses_magnitude_trim(cfg.method)) return std::fabs(d) >= tctx.thresholds[k] ? d : 0.0f;
    return d;
  };
  if (!uses_sign_election(cfg.method)) {
    float acc = 0.0f;
    for (std::size_t k = 0; k < K; ++k) acc += sc.alpha[k] * kept(k);
    return sc.base_scale * base + acc;
  }
  float pos = 0, neg = 0, wpos = 0, wneg = 0;
  for (std::size_t k = 0; k < K; ++k) {
    const float v = cfg.weights[k] * kept(k);
    if (v > 0) pos += v, wpos += cfg.weights[k];
    if (v < 0) neg += v, wneg += cfg.weights[k];
  }
  const bool plus = pos + neg >= 0.0f;
  float merged = plus ? pos : neg;
  if (cfg.normalize) {
    const float q = plus ? wpos : wneg;
    merged /= q == 0.0f ? 1.0f : q;
  }
  return base + sc.lambda * merged;
}
}  // namespace

TEST(Operators, ManyExpertsFollowTheDocumentedOrderBitForBit) {
  // 12 experts, three omitted (9 read: kernel groups of 4, 4, 1 straddling the gaps), 3000
  // elements (chunks of 1024, the last partial) starting at an odd element index.
  const std::size_t n = 3000, K = 12;
  const auto f = random_family(n, K, 37);
  std::vector<const float*> d = pointers(f);
  d[2] = d[5] = d[6] = nullptr;
  std::vector<float> w, dens, t;
  for (std::size_t k = 0; k < K; ++k) {
    w.push_back(k % 3 == 1 ? -0.3f : 0.2f + 0.1f * static_cast<float>(k));
    dens.push_back(k % 4 == 3 ? 1.0f : 0.15f + 0.07f * static_cast<float>(k));
    t.push_back(sketch_threshold(f.deltas[k], dens.back()));
  }
  const std::uint64_t first = 777;
  for (MergeMethod m : kAllMethods) {
    for (bool normalize : {true, false}) {
      const auto cfg = make_config(m, w, normalize, 0.75, dens, 1234);
      const std::vector<float> tm = thresholds_for(m, t, f.deltas, dens);
      const TensorContext tctx{tensor_name_key("lm_head.weight"), tm};
      std::vector<float> out(n);
      merge_block(cfg, tctx, first, n, f.base.data(), d, out.data());
      std::size_t differing = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float ref = scalar_merge(cfg, tctx, first + i, f.base[i], d, i);
        differing += bits_of(ref) != bits_of(out[i]);
      }
      EXPECT_EQ(differing, 0u) << merge_method_name(m) << (normalize ? " normalize" : "");
    }
  }
}

// ---- blocking / thread invariance ----

TEST(Operators, AnySplitGivesTheSameBits) {
  const std::size_t n = 200003;
  const auto f = random_family(n, 4, 17);
  std::vector<float> t;
  for (const auto& d : f.deltas) t.push_back(sketch_threshold(d, 0.35));
  std::mt19937 rng(23);
  for (MergeMethod m : kAllMethods) {
    const auto cfg = make_config(m, {1.0f, 0.6f, -0.4f, 1.3f}, default_normalize(m), 0.8,
                                 {0.35f, 0.5f, 1.0f, 0.1f}, 42);
    const std::vector<float> tm = thresholds_for(m, t, f.deltas, {0.35f, 0.5f, 1.0f, 0.1f});
    const TensorContext tctx{tensor_name_key("model.layers.3.mlp.up_proj.weight"), tm};
    const auto whole = merge_all(cfg, tctx, f.base, pointers(f));
    std::vector<float> pieces(n);
    std::uniform_int_distribution<std::size_t> len(1, 5000);
    for (std::size_t begin = 0; begin < n;) {
      const std::size_t count = std::min(len(rng), n - begin);
      std::vector<const float*> d;
      for (const auto& dk : f.deltas) d.push_back(dk.data() + begin);
      merge_block(cfg, tctx, begin, count, f.base.data() + begin, d, pieces.data() + begin);
      begin += count;
    }
    expect_same_bits(whole, pieces, merge_method_name(m).data());
  }
}

// ---- DARE generator ----

TEST(DareMask, SplitMixMatchesPublishedOutputs) {
  // SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c): first outputs of seed 0 and of
  // seed 1234567.
  EXPECT_EQ(splitmix64_mix(0 + kSplitMixGamma), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64_mix(1234567 + kSplitMixGamma), 6457827717110365317ull);
  EXPECT_EQ(splitmix64_mix(1234567 + 2 * kSplitMixGamma), 3203168211198807973ull);
  EXPECT_EQ(dare_draw(0, 0), 0xE220A839u);
}

TEST(DareMask, ThresholdConversion) {
  EXPECT_EQ(dare_keep_threshold(1.0f), 1ull << 32);
  EXPECT_EQ(dare_keep_threshold(0.5f), 1ull << 31);
  EXPECT_EQ(dare_keep_threshold(0.25f), 1ull << 30);
  // 0.1f = 13421773·2^-27 -> floor(13421773·2^5) exactly.
  EXPECT_EQ(dare_keep_threshold(0.1f), 13421773ull << 5);
  EXPECT_EQ(dare_keep_threshold(std::ldexp(1.0f, -40)), 0u);
}

TEST(DareMask, MaskMatchesScalarDecision) {
  const std::uint64_t key = dare_stream_key(5, 2, 77);
  std::vector<std::uint32_t> mask(3000);
  dare_keep_mask(key, 1000, mask.size(), dare_keep_threshold(0.3f), mask.data());
  for (std::size_t i = 0; i < mask.size(); ++i) {
    ASSERT_TRUE(mask[i] == 0u || mask[i] == 0xFFFFFFFFu);
    ASSERT_EQ(mask[i] != 0, dare_keep(5, 2, 77, 1000 + i, 0.3f)) << i;
  }
}

namespace {
std::vector<bool> keep_vector(std::uint64_t seed, std::uint32_t expert, std::uint64_t name_key,
                              std::size_t n, float density) {
  std::vector<bool> keep(n);
  for (std::size_t i = 0; i < n; ++i) keep[i] = dare_keep(seed, expert, name_key, i, density);
  return keep;
}
double fraction_equal(const std::vector<bool>& a, const std::vector<bool>& b) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}
}  // namespace

TEST(DareMask, KeptFractionMatchesDensity) {
  const std::size_t n = 1u << 20;
  for (float p : {0.1f, 0.3f, 0.5f, 0.9f}) {
    const auto keep = keep_vector(1, 0, tensor_name_key("t"), n, p);
    std::size_t kept = 0;
    for (bool b : keep) kept += b;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(static_cast<double>(kept) / n, p, 5 * sigma) << p;
  }
  const auto all = keep_vector(1, 0, 3, 4096, 1.0f);
  for (bool b : all) ASSERT_TRUE(b);
}

TEST(DareMask, StreamsAreReproducibleAndIndependent) {
  const std::size_t n = 1u << 18;
  const float p = 0.3f;
  const std::uint64_t tk = tensor_name_key("model.layers.0.self_attn.q_proj.weight");
  const auto ref = keep_vector(42, 1, tk, n, p);
  EXPECT_EQ(ref, keep_vector(42, 1, tk, n, p));
  // Independent Bernoulli(p) streams agree on p² + (1−p)² of the entries.
  const double indep = p * p + (1 - p) * (1 - p);
  const double sigma = std::sqrt(indep * (1 - indep) / n);
  const std::vector<std::vector<bool>> others = {
      keep_vector(43, 1, tk, n, p),  // another seed
      keep_vector(42, 0, tk, n, p),  // another expert
      keep_vector(42, 2, tk, n, p),
      keep_vector(42, 1, tensor_name_key("model.layers.0.self_attn.k_proj.weight"), n, p)};
  for (const auto& o : others) EXPECT_NEAR(fraction_equal(ref, o), indep, 5 * sigma);
  // Shifted by one element the stream must not repeat itself either.
  std::vector<bool> shifted(ref.begin() + 1, ref.end());
  shifted.push_back(false);
  EXPECT_NEAR(fraction_equal(ref, shifted), indep, 5 * sigma);
}

TEST(DareMask, KeptValuesAreDeltaOverDensity) {
  const std::size_t n = 1u << 20;
  const auto f = random_family(n, 1, 29);
  const float density = 0.3f;
  const std::vector<float> base(n, 0.0f);
  const auto cfg = make_config(MergeMethod::kDareLinear, {1.0f}, false, 1.0, {density}, 8);
  const std::uint64_t tk = tensor_name_key("w");
  const auto out = merge_all(cfg, {tk, {}}, base, {f.deltas[0].data()});
  std::size_t kept = 0, nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = f.deltas[0][i];
    nonzero += d != 0.0f;
    if (dare_keep(8, 0, tk, i, density)) {
      ++kept;
      ASSERT_EQ(bits_of(out[i]), bits_of(d / density)) << i;
    } else {
      ASSERT_EQ(out[i], 0.0f) << i;
    }
  }
  const double sigma = std::sqrt(density * (1.0 - density) / n);
  EXPECT_NEAR(static_cast<double>(kept) / n, density, 5 * sigma);
  EXPECT_GT(nonzero, n / 2);
}

TEST(DareMask, MergeUsesThePerExpertStreams) {
  // dare_ties with one expert: out = θ0 + λ·(w·Δ/density) where kept, else θ0 (a zero never
  // agrees); the stream is the one of expert index 1, not 0.
  const std::size_t n = 4096;
  const auto f = random_family(n, 2, 31);
  const auto cfg = make_config(MergeMethod::kDareTies, {1.0f, 2.0f}, false, 0.5, {1.0f, 0.6f}, 9);
  const auto out = merge_all(cfg, {77, {}}, f.base, {nullptr, f.deltas[1].data()});
  for (std::size_t i = 0; i < n; ++i) {
    const float d = f.deltas[1][i];
    const float v = 2.0f * (d / 0.6f);
    const float expected =
        dare_keep(9, 1, 77, i, 0.6f) && v != 0.0f ? f.base[i] + 0.5f * v : f.base[i] + 0.5f * 0.0f;
    ASSERT_EQ(bits_of(out[i]), bits_of(expected)) << i;
  }
}

// normalize makes a merge invariant to the weights' scale: weights whose fp32 values would
// underflow (1e-50) or overflow (1e308) merge bit for bit as the same weights near 1.
TEST(Operators, NormalizedWeightsOfAnyScaleMergeAsScaledCopies) {
  const std::vector<float> base = {.25f, -.5f, 1.f, 0.f, .125f, -2.f, .75f, .5f};
  const std::vector<const float*> deltas = {kTau1.data(), kTau2.data()};
  for (MergeMethod method : {MergeMethod::kLinear, MergeMethod::kTaskArithmetic, MergeMethod::kTies,
                             MergeMethod::kDareTies}) {
    const auto merge_with = [&](double w0, double w1) {
      MergeSpec spec;
      spec.method = method;
      spec.normalize = true;
      spec.experts = {{"a", w0, 1.0}, {"b", w1, 1.0}};
      spec.validate();
      const OperatorConfig cfg = OperatorConfig::from_spec(spec);
      for (float w : cfg.weights) EXPECT_TRUE(std::isfinite(w) && w != 0.0f) << w;
      const std::vector<float> thresholds = {0.2f, 0.3f};
      TensorContext tctx;
      tctx.thresholds = thresholds;
      return merge_all(cfg, tctx, base, deltas);
    };
    const std::vector<float> reference = merge_with(1.0, 3.0);
    for (double scale : {0x1p-200, 0x1p200, 0x1p1000}) {
      expect_same_bits(merge_with(scale, 3 * scale), reference, "power-of-two scale");
    }
    // Scales that are not powers of two, whose sum overflows double unscaled: the same merge
    // up to the rounding of the weights' ratio.
    const std::vector<float> tiny = merge_with(1e-50, 3e-50), huge = merge_with(1e308, 1.5e308);
    const std::vector<float> near_huge = merge_with(1.0, 1.5);
    for (std::size_t i = 0; i < reference.size(); ++i) {
      EXPECT_NEAR(tiny[i], reference[i], 1e-6) << i;
      EXPECT_NEAR(huge[i], near_huge[i], 1e-6) << i;
    }
  }
}

// Without normalize the weights are used as given, so one beyond fp32 is refused up front.
TEST(Operators, UnnormalizedWeightBeyondFp32IsAUsageError) {
  MergeSpec spec;
  spec.method = MergeMethod::kTaskArithmetic;
  spec.normalize = false;
  spec.experts = {{"a", 1e300, 1.0}};
  EXPECT_THROW(spec.validate(), UsageError);
  spec.lambda = 1e-290;  // λ·w = 1e10 fits
  EXPECT_NO_THROW(spec.validate());
}
