// Cross-checks merge_block against tests/python/operators_ref.py, an independent float64 numpy
// implementation of SPEC §3 (including the TIES sketch threshold and the DARE generator).
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/operators.hpp"

using namespace mergepipe;
namespace fs = std::filesystem;

namespace {

struct Case {
  MergeMethod method;
  bool normalize;
};

class ScratchDir {
 public:
  ScratchDir()
      : path_(fs::temp_directory_path() /
              ("mergepipe_operators_ref_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

float bf16_round(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<float>(u);
}

}  // namespace

TEST(OperatorsReference, MatchesIndependentPythonImplementation) {
  constexpr std::size_t kN = 60000;
  constexpr std::size_t kExperts = 3;
  constexpr std::size_t kBlock = 4096;  // the last block is partial
  constexpr std::size_t kBlocks = (kN + kBlock - 1) / kBlock;
  const std::vector<double> weights = {0.8, -0.35, 1.25};
  const std::vector<double> densities = {0.6, 0.35, 1.0};
  const double lambda = 0.9;
  const std::uint64_t seed = 0xC0FFEE;
  const std::uint64_t name_key = tensor_name_key("model.layers.7.mlp.down_proj.weight");

  // A bf16 family: base ~ N(0, 0.02), Δ ~ N(0, 1e-3) after bf16 rounding of θ_k (repeated
  // magnitudes, so TIES thresholds fall on ties), a run of exact zeros (a frozen region).
  std::mt19937 rng(2024);
  std::normal_distribution<float> wdist(0.0f, 0.02f), ddist(0.0f, 0.001f);
  std::vector<float> base(kN);
  for (auto& x : base) x = bf16_round(wdist(rng));
  std::vector<std::vector<float>> deltas(kExperts, std::vector<float>(kN));
  for (std::size_t k = 0; k < kExperts; ++k) {
    for (std::size_t i = 0; i < kN; ++i) {
      const bool frozen = k == 1 && i >= 10000 && i < 14000;
      deltas[k][i] = frozen ? 0.0f : bf16_round(base[i] + ddist(rng)) - base[i];
    }
  }
  // Access mask: ~70% of pairs read; block 0 fully read, block 1 fully omitted.
  std::vector<std::vector<int>> present(kExperts, std::vector<int>(kBlocks));
  std::bernoulli_distribution read(0.7);
  for (std::size_t k = 0; k < kExperts; ++k) {
    for (std::size_t b = 0; b < kBlocks; ++b) present[k][b] = b == 0 || (b != 1 && read(rng));
  }

  const std::vector<Case> cases = {
      {MergeMethod::kLinear, true},
      {MergeMethod::kLinear, false},
      {MergeMethod::kTaskArithmetic, false},
      {MergeMethod::kTaskArithmetic, true},
      {MergeMethod::kTies, true},
      {MergeMethod::kTies, false},
      {MergeMethod::kDareLinear, false},
      {MergeMethod::kDareLinear, true},
      {MergeMethod::kDareTies, false},
      {MergeMethod::kDareTies, true},
  };

  ScratchDir dir;
  {
    nlohmann::json meta;
    meta["n"] = kN;
    meta["experts"] = kExperts;
    meta["block"] = kBlock;
    meta["present"] = present;
    meta["weights"] = weights;
    meta["densities"] = densities;
    meta["lambda"] = lambda;
    meta["seed"] = seed;
    meta["name_key"] = name_key;
    for (const Case& c : cases) {
      meta["configs"].push_back(
          {{"method", std::string(merge_method_name(c.method))}, {"normalize", c.normalize}});
    }
    std::ofstream(dir.path() / "input.json") << meta.dump();
    std::ofstream bin(dir.path() / "input.bin", std::ios::binary);
    bin.write(reinterpret_cast<const char*>(base.data()), kN * sizeof(float));
    for (const auto& d : deltas) bin.write(reinterpret_cast<const char*>(d.data()), kN * 4);
    ASSERT_TRUE(bin.good());
  }
  const std::string cmd = std::string(MERGEPIPE_TEST_PYTHON) + " '" + MERGEPIPE_TEST_SCRIPTS +
                          "/operators_ref.py' '" + dir.path().string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  nlohmann::json result;
  std::ifstream(dir.path() / "output.json") >> result;
  // The catalog's sketch threshold (C++) equals the Python recomputation of its definition.
  std::vector<float> thresholds;
  for (std::size_t k = 0; k < kExperts; ++k) {
    MagnitudeSketch sketch;
    sketch.add(deltas[k].data(), kN);
    thresholds.push_back(sketch.threshold(densities[k]));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(thresholds[k]),
              result["thresholds"][k].get<std::uint32_t>())
        << "expert " << k;
  }
  // DARE keep counts agree with the C++ generator over the whole tensor.
  for (std::size_t k = 0; k < kExperts; ++k) {
    std::uint64_t kept = 0;
    for (std::size_t i = 0; i < kN; ++i) {
      kept += dare_keep(seed, static_cast<std::uint32_t>(k), name_key, i,
                        static_cast<float>(densities[k]));
    }
    EXPECT_EQ(kept, result["kept"][k].get<std::uint64_t>()) << "expert " << k;
  }

  std::ifstream out_bin(dir.path() / "output.bin", std::ios::binary);
  for (const Case& c : cases) {
    std::vector<double> ref(kN), scale(kN), alt(kN);
    std::vector<std::uint8_t> fragile(kN);
    out_bin.read(reinterpret_cast<char*>(ref.data()), kN * sizeof(double));
    out_bin.read(reinterpret_cast<char*>(scale.data()), kN * sizeof(double));
    out_bin.read(reinterpret_cast<char*>(fragile.data()), kN);
    out_bin.read(reinterpret_cast<char*>(alt.data()), kN * sizeof(double));
    ASSERT_TRUE(out_bin.good()) << "output.bin is short";

    OperatorConfig cfg;
    cfg.method = c.method;
    cfg.normalize = c.normalize;
    cfg.lambda = lambda;
    cfg.seed = seed;
    for (std::size_t k = 0; k < kExperts; ++k) {
      cfg.weights.push_back(static_cast<float>(weights[k]));
      cfg.densities.push_back(static_cast<float>(densities[k]));
    }
    const TensorContext tctx{name_key, thresholds};
    // Merge block by block, as the executor does, omitting unread pairs.
    std::vector<float> out(kN);
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const std::size_t begin = b * kBlock, count = std::min(kBlock, kN - begin);
      std::vector<const float*> d(kExperts);
      for (std::size_t k = 0; k < kExperts; ++k) {
        d[k] = present[k][b] ? deltas[k].data() + begin : nullptr;
      }
      merge_block(cfg, tctx, begin, count, base.data() + begin, d, out.data() + begin);
    }

    const std::string label =
        std::string(merge_method_name(c.method)) + (c.normalize ? " normalize" : " no-normalize");
    std::size_t bad = 0, near_zero = 0, exact = 0;
    double worst = 0;
    for (std::size_t i = 0; i < kN; ++i) {
      // fp32 rounding of a sum of a few terms: well below 1e-6 of the terms' magnitude. Where
      // the weighted sum is within rounding of 0, either sign election is accepted.
      const double x = out[i];
      double rel = std::fabs(x - ref[i]) / std::max(scale[i], 1e-30);
      if (fragile[i]) {
        ++near_zero;
        rel = std::min(rel, std::fabs(x - alt[i]) / std::max(scale[i], 1e-30));
      }
      worst = std::max(worst, rel);
      exact += static_cast<float>(ref[i]) == out[i];
      if (rel > 1e-6 && ++bad <= 5) {
        ADD_FAILURE() << label << " element " << i << ": C++ " << out[i] << ", reference " << ref[i]
                      << " (scale " << scale[i] << ")";
      }
    }
    EXPECT_EQ(bad, 0u) << label;
    EXPECT_LT(near_zero, kN / 1000) << label << ": too many near-zero sign elections";
    // Most elements round to the same fp32 value (a systematic error would break this).
    EXPECT_GT(exact, kN / 2) << label;
    std::printf(
        "  %-30s worst rel. error %.2e, %5.1f%% equal to the rounded reference, %zu "
        "near-zero elections\n",
        label.c_str(), worst, 100.0 * static_cast<double>(exact) / kN, near_zero);
  }
}
