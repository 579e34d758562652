// The per-tensor Gram the geometric methods decide from, and those decisions on cases whose
// answer is known without mergekit (golden_methods_test.cpp checks mergekit's own numbers).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "mergepipe/error.hpp"
#include "mergepipe/karcher.hpp"
#include "mergepipe/model_stock.hpp"
#include "mergepipe/multislerp.hpp"
#include "mergepipe/tensor_gram.hpp"
#include "mergepipe/tensor_statistics.hpp"

using namespace mergepipe;

namespace {

struct Family {
  std::vector<float> base;
  std::vector<std::vector<float>> deltas;
};

Family random_family(std::size_t experts, std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Family f;
  for (std::size_t i = 0; i < n; ++i) f.base.push_back(dist(rng));
  f.deltas.assign(experts, std::vector<float>(n));
  for (auto& d : f.deltas)
    for (float& x : d) x = 0.01f * dist(rng);
  return f;
}

// Accumulated in pieces of the given sizes (cycled), as slices of a block arrive.
TensorGram accumulate(const Family& f, const std::vector<std::size_t>& pieces) {
  GramAccumulator acc(f.deltas.size());
  std::size_t first = 0;
  for (std::size_t p = 0; first < f.base.size(); ++p) {
    const std::size_t n = std::min(pieces[p % pieces.size()], f.base.size() - first);
    std::vector<const float*> deltas;
    for (const auto& d : f.deltas) deltas.push_back(d.data() + first);
    acc.add(f.base.data() + first, deltas, n);
    first += n;
  }
  return acc.totals();
}

}  // namespace

TEST(TensorGram, SumsAreTheDotProducts) {
  const Family f = random_family(3, 1001, 1);
  const TensorGram g = accumulate(f, {1001});
  ASSERT_EQ(g.vectors, 4u);
  ASSERT_EQ(g.sums.size(), 10u);
  const auto vec = [&](std::size_t i) { return i == 0 ? f.base : f.deltas[i - 1]; };
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      double want = 0;
      for (std::size_t e = 0; e < f.base.size(); ++e)
        want += static_cast<double>(vec(i)[e]) * vec(j)[e];
      EXPECT_NEAR(g.at(i, j), want, 1e-9 * std::max(1.0, std::fabs(want))) << i << "," << j;
    }
  }
  // θ_i·θ_j of the models, from the delta products.
  double want = 0;
  for (std::size_t e = 0; e < f.base.size(); ++e)
    want += (static_cast<double>(f.base[e]) + f.deltas[0][e]) *
            (static_cast<double>(f.base[e]) + f.deltas[2][e]);
  EXPECT_NEAR(g.model_dot(1, 3), want, 1e-9 * std::fabs(want));
}

TEST(TensorGram, BitsDoNotDependOnHowTheBlockIsSliced) {
  const Family f = random_family(4, 10007, 2);
  const TensorGram whole = accumulate(f, {10007});
  for (const std::vector<std::size_t>& pieces :
       std::vector<std::vector<std::size_t>>{{1}, {3}, {4096}, {5, 7, 4001}, {2, 1}})
    EXPECT_EQ(accumulate(f, pieces).sums, whole.sums);  // exact, not near
  // Pairs added in tiles at explicit positions (the scan's workers) give the same bits too,
  // whatever the grouping of a row's pairs and the order of rows.
  GramAccumulator by_pair(4);
  for (std::size_t first = 0; first < f.base.size(); first += 999) {
    const std::size_t n = std::min<std::size_t>(999, f.base.size() - first);
    std::vector<std::vector<double>> wide;
    for (std::size_t i = 0; i < 5; ++i) {
      const float* v = (i == 0 ? f.base.data() : f.deltas[i - 1].data()) + first;
      wide.emplace_back(v, v + n);
    }
    for (std::size_t a = 5; a-- > 0;) {
      for (std::size_t b = a; b < 5;) {
        const std::size_t count = std::min<std::size_t>(1 + (a + b) % 3, 5 - b);
        std::vector<const double*> ys;
        for (std::size_t j = 0; j < count; ++j) ys.push_back(wide[b + j].data());
        by_pair.add_row(a, b, count, wide[a].data(), ys.data(), n, by_pair.elements());
        b += count;
      }
    }
    by_pair.advance(n);
  }
  EXPECT_EQ(by_pair.totals().sums, whole.sums);
}

TEST(TensorGram, AZeroDeltaSkippedGivesTheSameBitsAsItsZeros) {
  Family f = random_family(2, 777, 3);
  std::fill(f.deltas[1].begin() + 100, f.deltas[1].begin() + 500, 0.0f);
  const TensorGram dense = accumulate(f, {777});
  GramAccumulator acc(2);
  std::vector<const float*> d{f.deltas[0].data(), f.deltas[1].data()};
  acc.add(f.base.data(), d, 100);
  d = {f.deltas[0].data() + 100, nullptr};
  acc.add(f.base.data() + 100, d, 400);
  d = {f.deltas[0].data() + 500, f.deltas[1].data() + 500};
  acc.add(f.base.data() + 500, d, 277);
  EXPECT_EQ(acc.totals().sums, dense.sums);
}

TEST(TensorGram, PartsAddInOrder) {
  const Family f = random_family(1, 64, 4);
  TensorGram sum;
  sum += accumulate(f, {64});
  sum += accumulate(f, {64});
  EXPECT_DOUBLE_EQ(sum.at(0, 1), 2 * accumulate(f, {64}).at(0, 1));
  EXPECT_THROW(sum += TensorGram(3), std::invalid_argument);
}

TEST(ModelStock, EqualDeltasKeepTheirAverageAndOrthogonalOnesShrinkToTheBase) {
  // Δ_1 = Δ_2: cos 1, t = 1, out = θ0 + Δ.  Orthogonal deltas: cos 0, t = 0, out = θ0.
  TensorGram g(2);
  g.sums = {10.0, 0.0, 0.0, 4.0, 4.0, 4.0};  // (0,0) (0,1) (0,2) (1,1) (1,2) (2,2)
  ModelStockDecision d = model_stock_decision(g, "x");
  EXPECT_DOUBLE_EQ(d.cos_theta, 1.0);
  EXPECT_DOUBLE_EQ(d.t, 1.0);
  const OperatorConfig::LinearForm form = model_stock_linear_form(d, 2);
  EXPECT_EQ(form.base_scale, 1.0f);
  EXPECT_EQ(form.alpha, (std::vector<float>{0.5f, 0.5f}));
  g.sums = {10.0, 0.0, 0.0, 4.0, 0.0, 9.0};
  d = model_stock_decision(g, "x");
  EXPECT_EQ(d.t, 0.0);
  // cos = −1 with N = 2: t = 2·(−1)/(1 − 1) is unbounded, an error naming the tensor.
  g.sums = {10.0, 0.0, 0.0, 4.0, -4.0, 4.0};
  EXPECT_THROW(
      {
        try {
          model_stock_decision(g, "model.layers.3.mlp.up_proj.weight");
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("model.layers.3.mlp.up_proj.weight"),
                    std::string::npos);
          throw;
        }
      },
      InputError);
}

TEST(Karcher, ModelsOfOneDirectionGiveTheirMeanNormAlongIt) {
  // θ1 = 3·θ0: the mean direction is θ0's; the scale is (‖θ0‖ + 3‖θ0‖)/2 = 2‖θ0‖: out = 2·θ0.
  TensorGram g(1);
  g.sums = {4.0, 8.0, 16.0};  // Δ = 2·θ0
  const KarcherDecision d = karcher_decision(g, 10, 1e-5);
  const OperatorConfig::LinearForm form = points_linear_form(d.beta);
  // out = base_scale·θ0 + alpha·Δ = (base_scale + 2·alpha)·θ0.
  EXPECT_NEAR(form.base_scale + 2.0f * form.alpha[0], 2.0, 1e-6);
  EXPECT_NEAR(d.scale, 4.0, 1e-12);
}

TEST(Karcher, TwoModelsMeetHalfWayOnTheSphere) {
  // Orthogonal unit models: the Karcher mean is the bisector, out = (θ0 + θ1)/√2 · 1.
  TensorGram g(1);
  g.sums = {1.0, -1.0, 2.0};  // θ0 = e0, Δ = e1 − e0
  const KarcherDecision d = karcher_decision(g, 10, 1e-5);
  EXPECT_NEAR(d.beta[0], 1.0 / std::sqrt(2.0), 1e-9);
  EXPECT_NEAR(d.beta[1], 1.0 / std::sqrt(2.0), 1e-9);
}

TEST(Multislerp, ThreeBalancedAntipodesAreAnErrorAndTwoFallBackToTheLine) {
  // Deltas a, −a (against a base): the unit mean vanishes; two vectors take the weighted sum.
  TensorGram g(2);
  g.sums = {1.0, 0.0, 0.0, 1.0, -1.0, 1.0};
  MultislerpInputs in;
  in.weights = {1.0, 1.0};
  MultislerpDecision d = multislerp_decision(g, in, "t");
  EXPECT_TRUE(d.linear_fallback);
  EXPECT_EQ(d.beta, (std::vector<double>{0.5, 0.5}));
  // Three: a, −a, and a zero delta (its unit is 0): still balanced, an error.
  TensorGram three(3);
  three.sums = {1.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 1.0, 0.0, 0.0};
  in.weights = {1.0, 1.0, 1.0};
  EXPECT_THROW(multislerp_decision(three, in, "t"), InputError);
  // Three zero deltas (a tensor no expert changed): the base, where mergekit raises.
  TensorGram untouched(3);
  untouched.sums.assign(10, 0.0);
  untouched.sums[0] = 5.0;
  d = multislerp_decision(untouched, in, "t");
  EXPECT_EQ(d.beta, (std::vector<double>{0.0, 0.0, 0.0}));
}

TEST(TensorStatistics, DispatchesByMethodAndChecksTheExpertCount) {
  OperatorConfig cfg;
  cfg.method = MergeMethod::kModelStock;
  cfg.weights = {1.0f, 1.0f};
  cfg.densities = {1.0f, 1.0f};
  TensorGram g(2);
  g.sums = {10.0, 0.0, 0.0, 4.0, 4.0, 4.0};
  EXPECT_EQ(linear_form_from_gram(cfg, g, "x").alpha, (std::vector<float>{0.5f, 0.5f}));
  EXPECT_THROW(linear_form_from_gram(cfg, TensorGram(3), "x"), std::invalid_argument);
  cfg.method = MergeMethod::kTies;
  EXPECT_THROW(linear_form_from_gram(cfg, g, "x"), std::invalid_argument);
}
