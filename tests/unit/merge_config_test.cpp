// The YAML merge config: the toolkit's form, our keys, defaults, paths and every error case.
#include "mergepipe/io/merge_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/operators.hpp"

using namespace mergepipe;

namespace {

std::string usage_error(const std::string& yaml, const std::string& source = "/cfg/merge.yaml") {
  try {
    io::parse_merge_config(yaml, source);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kValid = R"(
merge_method: ties
base_model: /models/base
models:
  - model: /models/expert00
    parameters: {weight: 1.0, density: 0.5}
  - model: /models/expert01
    parameters:
      weight: 0.5
parameters: {normalize: false, lambda: 0.8, density: 0.3}
dtype: bf16
budget: 25%
seed: 42
)";

}  // namespace

TEST(MergeConfig, ToolkitStyleConfig) {
  const MergeSpec s = io::parse_merge_config(kValid, "/cfg/merge.yaml");
  EXPECT_EQ(s.method, MergeMethod::kTies);
  EXPECT_EQ(s.base_model, "/models/base");
  ASSERT_EQ(s.experts.size(), 2u);
  EXPECT_EQ(s.experts[0].path, "/models/expert00");
  EXPECT_EQ(s.experts[0].weight, 1.0);
  EXPECT_EQ(s.experts[0].density, 0.5);
  EXPECT_EQ(s.experts[1].weight, 0.5);
  EXPECT_EQ(s.experts[1].density, 0.3);  // the global default
  ASSERT_TRUE(s.normalize.has_value());
  EXPECT_FALSE(*s.normalize);
  EXPECT_EQ(s.lambda, 0.8);
  EXPECT_EQ(s.out_dtype, DType::kBF16);
  EXPECT_EQ(s.budget, "25%");
  EXPECT_EQ(s.seed, 42u);
}

// mergekit's method parameters that mean something here, and int8_mask, which changes nothing.
TEST(MergeConfig, MethodParameters) {
  const MergeSpec dare = io::parse_merge_config(
      "merge_method: dare_ties\nbase_model: /b\nmodels: [/a]\n"
      "parameters: {rescale: false, int8_mask: true}\n",
      "c.yaml");
  ASSERT_TRUE(dare.rescale.has_value());
  EXPECT_FALSE(dare.effective_rescale());
  EXPECT_FALSE(OperatorConfig::from_spec(dare).rescale);
  const MergeSpec plain =
      io::parse_merge_config("merge_method: dare_ties\nbase_model: /b\nmodels: [/a]\n", "c.yaml");
  EXPECT_TRUE(plain.effective_rescale());
  const MergeSpec ns = io::parse_merge_config(
      "merge_method: nearswap\nbase_model: /b\nmodels: [/a]\nparameters: {t: 0.25}\n", "c.yaml");
  EXPECT_EQ(ns.method, MergeMethod::kNearswap);
  EXPECT_EQ(ns.t, 0.25);
  EXPECT_EQ(OperatorConfig::from_spec(ns).t, 0.25f);
}

// The geometric methods' own parameters, under mergekit's names.
TEST(MergeConfig, GeometricMethodParameters) {
  const MergeSpec karcher = io::parse_merge_config(
      "merge_method: karcher\nmodels: [/m0, /m1, /m2]\nparameters: {max_iter: 3, tol: 1.0e-9}\n",
      "c.yaml");
  EXPECT_TRUE(karcher.base_is_reference);
  EXPECT_EQ(karcher.base_model, "/m0");
  const OperatorConfig kc = OperatorConfig::from_spec(karcher);
  EXPECT_EQ(kc.max_iter, 3);
  EXPECT_EQ(kc.tol, 1e-9);
  EXPECT_EQ(OperatorConfig::from_spec(
                io::parse_merge_config("merge_method: karcher\nmodels: [/m0, /m1]\n", "c.yaml"))
                .max_iter,
            10);  // mergekit's default
  // multislerp: normalize_weights is its normalize (default true); `normalize` changes nothing.
  const MergeSpec ms = io::parse_merge_config(
      "merge_method: multislerp\nbase_model: /b\nmodels: [/a, /c]\n"
      "parameters: {normalize_weights: false, normalize: true, eps: 0.01}\n",
      "c.yaml");
  EXPECT_FALSE(ms.effective_normalize());
  EXPECT_EQ(OperatorConfig::from_spec(ms).eps, 0.01);
  EXPECT_FALSE(OperatorConfig::from_spec(ms).base_is_reference);
  ASSERT_EQ(ms.config_warnings.size(), 1u);
  EXPECT_NE(ms.config_warnings[0].find("'normalize' changes nothing for multislerp"),
            std::string::npos);
  EXPECT_TRUE(io::parse_merge_config("merge_method: multislerp\nmodels: [/a, /c]\n", "c.yaml")
                  .effective_normalize());
  // nuslerp: two models without a base (the first is the reference, with its weight);
  // row_wise changes nothing while flatten is true, and says so.
  const MergeSpec nu = io::parse_merge_config(
      "merge_method: nuslerp\nmodels:\n  - model: /a\n    parameters: {weight: 0.3}\n"
      "  - model: /c\n    parameters: {weight: 0.7}\nparameters: {nuslerp_row_wise: true}\n",
      "c.yaml");
  EXPECT_TRUE(nu.base_is_reference);
  EXPECT_EQ(nu.base_weight, 0.3);
  ASSERT_EQ(nu.experts.size(), 1u);
  EXPECT_EQ(nu.experts[0].weight, 0.7);
  ASSERT_EQ(nu.config_warnings.size(), 1u);
  EXPECT_NE(nu.config_warnings[0].find("'nuslerp_row_wise' changes nothing"), std::string::npos);
  // model_stock drops the base listed among its models, as mergekit gathers it apart.
  const MergeSpec stock = io::parse_merge_config(
      "merge_method: model_stock\nbase_model: /b\nmodels: [/b, /a, /c]\n", "c.yaml");
  EXPECT_EQ(stock.experts.size(), 2u);
  EXPECT_FALSE(stock.base_weight.has_value());
}

// linear without base_model: the first model is the reference (averaged with its weight);
// the base listed among the models: averaged by linear, dropped by the task-vector methods.
TEST(MergeConfig, BaseOptionalForLinearAndBaseAmongTheModels) {
  const MergeSpec avg = io::parse_merge_config(
      "merge_method: linear\nmodels:\n  - model: /m0\n    parameters: {weight: 2}\n"
      "  - model: /m1\n    parameters: {weight: 1}\n  - model: /m2\n    parameters: {weight: 1}\n",
      "c.yaml");
  EXPECT_TRUE(avg.base_is_reference);
  EXPECT_EQ(avg.base_model, "/m0");
  EXPECT_EQ(avg.base_weight, 2.0);
  ASSERT_EQ(avg.experts.size(), 2u);
  // Σ w θ / Σ w = θ0 + Σ (w_k / 4) Δ_k
  const Coefficients c = additive_coefficients(avg);
  EXPECT_DOUBLE_EQ(c.alpha[0], 0.25);
  EXPECT_DOUBLE_EQ(c.base_scale, 1.0);
  MergeSpec sum = avg;
  sum.normalize = false;  // Σ w θ = 4·θ0 + Σ w_k Δ_k
  EXPECT_DOUBLE_EQ(additive_coefficients(sum).base_scale, 4.0);
  EXPECT_FLOAT_EQ(operator_scalars(OperatorConfig::from_spec(sum)).base_scale, 4.0f);

  const MergeSpec ties = io::parse_merge_config(
      "merge_method: ties\nbase_model: /b\nmodels:\n  - /a\n  - model: /b\n"
      "    parameters: {weight: 5}\n",
      "c.yaml");
  ASSERT_EQ(ties.experts.size(), 1u);
  EXPECT_EQ(ties.experts[0].path, "/a");
  EXPECT_FALSE(ties.base_weight.has_value());
  const MergeSpec lin = io::parse_merge_config(
      "merge_method: linear\nbase_model: /b\nmodels:\n  - /a\n  - model: /b\n"
      "    parameters: {weight: 5}\n",
      "c.yaml");
  EXPECT_FALSE(lin.base_is_reference);
  EXPECT_EQ(lin.base_weight, 5.0);
  EXPECT_DOUBLE_EQ(additive_coefficients(lin).alpha[0], 1.0 / 6.0);
}

TEST(MergeConfig, DefaultsAndStringModels) {
  const MergeSpec s = io::parse_merge_config(R"(
merge_method: linear
base_model: /m/base
models: [/m/a, /m/b/]
)",
                                             "/cfg/x.yaml");
  EXPECT_EQ(s.method, MergeMethod::kLinear);
  ASSERT_EQ(s.experts.size(), 2u);
  EXPECT_EQ(s.experts[1].path, "/m/b");
  EXPECT_EQ(s.experts[0].weight, 1.0);
  EXPECT_EQ(s.experts[0].density, 1.0);
  EXPECT_FALSE(s.normalize.has_value());
  EXPECT_TRUE(s.effective_normalize());  // linear's default
  EXPECT_EQ(s.lambda, 1.0);
  EXPECT_FALSE(s.out_dtype.has_value());
  EXPECT_FALSE(s.budget.has_value());
  EXPECT_EQ(s.seed, 0u);
  // Global weight default, per-model override; dtype spellings.
  const MergeSpec t = io::parse_merge_config(R"(
merge_method: task_arithmetic
base_model: /m/base
models:
  - /m/a
  - model: /m/b
    parameters: {weight: -0.25}
parameters: {weight: 2}
dtype: float32
)",
                                             "x.yaml");
  EXPECT_EQ(t.experts[0].weight, 2.0);
  EXPECT_EQ(t.experts[1].weight, -0.25);
  EXPECT_EQ(t.out_dtype, DType::kF32);
}

// mergekit resolves model paths against the current directory; a folder found only beside the
// config is used with a warning that says so; hub ids come from the local Hugging Face cache.
TEST(MergeConfig, ModelReferencesResolveAsMergekitResolvesThem) {
  test::TempDir dir;
  namespace fs = std::filesystem;
  for (const char* d :
       {"configs/e1", "configs/e2", "configs/sub", "models/base", "cwd/e1", "cwd/configs"})
    fs::create_directories(dir.path() + "/" + d);
  const std::string path = dir.file("configs/merge.yaml");
  test::write_file(path,
                   "merge_method: dare_linear\nbase_model: ../models/base\nmodels:\n  - ./e1\n"
                   "  - model: sub/../e2\n    parameters: {density: 0.1}\n");
  const fs::path previous = fs::current_path();
  fs::current_path(dir.path() + "/cwd");
  const MergeSpec s = io::load_merge_config(path);
  fs::current_path(previous);
  EXPECT_EQ(s.base_model, dir.path() + "/models/base");      // ../models/base from cwd/ is the same
  EXPECT_EQ(s.experts[0].path, dir.path() + "/cwd/e1");      // the current directory first
  EXPECT_EQ(s.experts[1].path, dir.path() + "/configs/e2");  // found beside the config only
  EXPECT_EQ(s.experts[1].density, 0.1);
  ASSERT_EQ(s.config_warnings.size(), 1u);
  EXPECT_NE(s.config_warnings[0].find("'sub/../e2' is not a folder of the current directory"),
            std::string::npos)
      << s.config_warnings[0];
  EXPECT_THROW(io::load_merge_config(dir.file("missing.yaml")), UsageError);

  // A hub id from the cache: refs/main, a branch, a commit prefix; and a clear miss.
  const std::string repo = dir.path() + "/hf/hub/models--org--tiny";
  fs::create_directories(repo + "/snapshots/aaaaaaaa11111111");
  fs::create_directories(repo + "/snapshots/bbbbbbbb22222222");
  fs::create_directories(repo + "/refs");
  test::write_file(repo + "/refs/main", "aaaaaaaa11111111\n");
  test::write_file(repo + "/refs/v2", "bbbbbbbb22222222");
  setenv("HF_HOME", (dir.path() + "/hf").c_str(), 1);
  unsetenv("HF_HUB_CACHE");
  const auto base_of = [&](const std::string& ref) {
    return io::parse_merge_config(
               "merge_method: task_arithmetic\nbase_model: " + ref + "\nmodels: [/m/a]\n",
               "/cfg/m.yaml")
        .base_model;
  };
  EXPECT_EQ(base_of("org/tiny"), repo + "/snapshots/aaaaaaaa11111111");
  EXPECT_EQ(base_of("org/tiny@v2"), repo + "/snapshots/bbbbbbbb22222222");
  EXPECT_EQ(base_of("org/tiny@bbbbbbbb2"), repo + "/snapshots/bbbbbbbb22222222");
  const std::string miss =
      usage_error("merge_method: task_arithmetic\nbase_model: org/absent@v1\nmodels: [/m/a]\n");
  EXPECT_NE(miss.find("/cfg/merge.yaml:2: key 'base_model'"), std::string::npos) << miss;
  EXPECT_NE(miss.find("nor in the Hugging Face cache (" + dir.path() + "/hf/hub)"),
            std::string::npos)
      << miss;
  EXPECT_NE(miss.find("huggingface-cli download org/absent --revision v1"), std::string::npos)
      << miss;
  const std::string lora = usage_error(
      "merge_method: task_arithmetic\nbase_model: /m/b\nmodels: [org/tiny+org/adapter]\n");
  EXPECT_NE(lora.find("model+adapter) is not supported yet"), std::string::npos) << lora;
  unsetenv("HF_HOME");
}

TEST(MergeConfig, ErrorsNameFileKeyAndLine) {
  struct Case {
    const char* yaml;
    std::vector<const char*> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nfoo: 1\n",
       {"/cfg/merge.yaml:4", "'foo'", "unknown key"}},
      {"merge_method: karcher\nmodels: [/a, /c]\nparameters: {normalize_weights: false}\n",
       {"normalize_weights' belongs to multislerp; karcher does not take it"}},
      {"merge_method: karcher\nmodels: [/a, /c]\nparameters: {max_iter: -1}\n",
       {"'max_iter' must be a whole number >= 0"}},
      {"merge_method: karcher\nmodels: [/a, /c]\nparameters: {max_iter: 1.0e12}\n",
       {"'max_iter' is 1e+12, above its largest value 1e+06"}},
      {"merge_method: multislerp\nmodels: [/a, /c]\nparameters: {tol: 0.1}\n",
       {"'tol' belongs to karcher; multislerp does not take it"}},
      {"merge_method: nuslerp\nbase_model: /b\nmodels: [/a]\n",
       {"nuslerp interpolates between two models", "lists 1 besides the base"}},
      {"merge_method: nuslerp\nmodels: [/a, /c]\nparameters: {nuslerp_flatten: false}\n",
       {"nuslerp_flatten: false", "is not supported yet"}},
      {"merge_method: model_stock\nbase_model: /b\nmodels: [/a]\n",
       {"model_stock needs the base and two models or more"}},
      {"merge_method: sce\nbase_model: /b\nmodels: [/a]\n",
       {":1", "merge_method", "unsupported method 'sce'"}},
      {"base_model: /b\nmodels: [/a]\n", {"merge_method", "missing"}},
      {"merge_method: ties\nmodels: [/a]\n", {"base_model", "missing"}},
      {"merge_method: ties\nbase_model: /b\n", {"models", "missing"}},
      {"merge_method: ties\nbase_model: /b\nmodels: /a\n", {":3", "models", "expected a list"}},
      {"merge_method: ties\nbase_model: /b\nmodels: []\n", {"/cfg/merge.yaml", "no expert"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       "abc}\n",
       {":5", "models[0].parameters.weight", "expected a number, got 'abc'"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       ".inf}\n",
       {"models[0].parameters.weight", "not a finite number"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       ".nan}\n",
       {"models[0].parameters.weight", "not a finite number"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {density: 0}\n",
       {"models[0].parameters.density", "outside (0, 1]"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {density: "
       "1.5}\n",
       {"density", "outside (0, 1]"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {density: "
       "[0.1, 1.5]}\n",
       {"models[0].parameters.density", "density 1.5 is outside (0, 1]"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       "[{filter: mlp, value: 1}, 0.5]}\n",
       {"models[0].parameters.weight", "mixes conditionals"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       "[{filter: mlp}]}\n",
       {"models[0].parameters.weight[0].value", "missing"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       "[{filter: mlp, value: 1, when: 2}]}\n",
       {"when", "unknown key"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: "
       "[[1, 2]]}\n",
       {"models[0].parameters.weight", "a gradient is a list of numbers"}},
      {"merge_method: ties\nbase_model: /b\nparameters: {normalize: [true, false]}\nmodels:\n"
       "  - model: /a\n",
       {"parameters.normalize", "takes true or false"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {zeta: 1}\n",
       {"models[0].parameters.zeta", "unknown key"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {gamma: "
       "0.01}\n",
       {"/cfg/merge.yaml", "'gamma' belongs to breadcrumbs", "ties does not take it"}},
      {"merge_method: breadcrumbs\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {gamma: "
       "[0.1, 1.5]}\n",
       {":5", "models[0].parameters.gamma", "gamma 1.5 is outside [0, 1]"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - modle: /a\n",
       {":4", "models[0].modle", "unknown key"}},
      {"merge_method: ties\nbase_model: /b\nmodels:\n  - parameters: {weight: 1}\n",
       {"models[0].model", "missing"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nparameters: {normalize: maybe}\n",
       {":4", "parameters.normalize", "expected true or false"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nparameters: {lambda: x}\n",
       {"parameters.lambda"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nparameters: {int8_mask: maybe}\n",
       {":4", "parameters.int8_mask", "expected true or false"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nparameters: {rescale: true}\n",
       {"/cfg/merge.yaml", "'rescale' applies to dare_linear and dare_ties", "not built yet"}},
      {"merge_method: nearswap\nbase_model: /b\nmodels: [/a]\n",
       {"/cfg/merge.yaml", "nearswap needs parameter 't'"}},
      {"merge_method: nearswap\nbase_model: /b\nmodels: [/a]\nparameters: {t: -1}\n",
       {"'t' must be a finite number >= 0"}},
      {"merge_method: linear\nbase_model: /b\nmodels: [/a]\nparameters: {t: 0.5}\n",
       {"'t' belongs to nearswap and slerp; linear does not take it"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nparameters: {bogus: true}\n",
       {"parameters.bogus", "unknown key"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\ndtype: int8\n",
       {":4", "dtype", "unsupported dtype 'int8'"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nbudget: 12XB\n",
       {":4", "budget", "unknown unit"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nseed: -3\n",
       {":4", "seed", "non-negative integer"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a]\nseed: 99999999999999999999999\n",
       {"seed", "64 bits"}},
      {"merge_method: ties\nbase_model: /b\nbase_model: /c\nmodels: [/a]\n",
       {":3", "base_model", "given twice"}},
      {"merge_method: ties\nbase_model: [/b]\nmodels: [/a]\n",
       {":2", "base_model", "expected a string"}},
      {"merge_method: linear\nbase_model: /b\nmodels:\n  - model: /a\n    parameters: {weight: 1}\n"
       "  - model: /c\n    parameters: {weight: -1}\n",
       {"/cfg/merge.yaml", "sum to 0"}},
      {"merge_method: ties\nbase_model: /b\nmodels: [/a\n", {"/cfg/merge.yaml:", "not valid YAML"}},
      {"- just\n- a list\n", {"/cfg/merge.yaml", "expected a mapping"}},
      {"", {"/cfg/merge.yaml", "expected a mapping"}},
  };
  for (const Case& c : cases) {
    const std::string msg = usage_error(c.yaml);
    for (const char* part : c.expect) {
      EXPECT_NE(msg.find(part), std::string::npos)
          << "config:\n"
          << c.yaml << "message: " << msg << "\nmissing: " << part;
    }
  }
}

// mergekit's gradients and filters: what varies by tensor stays a setting, the rest folds into
// the scalars exactly as before.
TEST(MergeConfig, GradientsAndFiltersVaryByTensor) {
  const MergeSpec spec = io::parse_merge_config(R"(
merge_method: ties
base_model: /m/base
parameters:
  weight: 0.5
  density: [0.2, 0.5, 0.8]
  lambda: [{filter: mlp, value: 2}, {value: 1}]
models:
  - model: /m/a
    parameters:
      density: [{filter: self_attn, value: 0.9}]
  - model: /m/b
    parameters: {weight: [0, 1]}
)",
                                                "/cfg/m.yaml");
  ASSERT_TRUE(spec.varies_by_tensor());
  EXPECT_EQ(spec.varying.count("density"), 1u);
  EXPECT_EQ(spec.varying.count("lambda"), 1u);
  EXPECT_EQ(spec.varying.count("weight"), 1u);  // model b's gradient keeps the top level's 0.5
  EXPECT_EQ(spec.experts[0].varying.count("density"), 1u);
  EXPECT_EQ(spec.experts[0].varying.count("weight"), 0u);

  // Layer 0 of 3 layers (t = 0), an attention tensor: a's own filter wins.
  const std::vector<std::string> names = {
      "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
      "model.layers.1.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight", "lm_head.weight"};
  const std::vector<MergeSpec> per = specs_by_tensor(spec, names);
  ASSERT_EQ(per.size(), names.size());
  EXPECT_DOUBLE_EQ(per[1].experts[0].density, 0.9);
  EXPECT_DOUBLE_EQ(per[1].experts[1].density, 0.2);
  // Layer 1 (t = 0.5): a's filter does not match an MLP tensor, so the top gradient gives 0.5.
  EXPECT_DOUBLE_EQ(per[2].experts[0].density, 0.5);
  EXPECT_DOUBLE_EQ(per[2].experts[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(per[2].experts[1].weight, 0.5);  // b's [0, 1] at t = 0.5
  EXPECT_DOUBLE_EQ(per[2].lambda, 2.0);
  EXPECT_DOUBLE_EQ(per[1].lambda, 1.0);
  EXPECT_DOUBLE_EQ(per[3].experts[0].density, 0.8);
  EXPECT_DOUBLE_EQ(per[3].experts[1].weight, 1.0);
  // Embeddings and the head sit at t = 0 (mergekit plans pre- and post-weights there).
  EXPECT_DOUBLE_EQ(per[0].experts[1].weight, 0.0);
  EXPECT_DOUBLE_EQ(per[4].experts[1].weight, 0.0);
  EXPECT_DOUBLE_EQ(per[4].experts[0].density, 0.2);
  for (const MergeSpec& s : per) EXPECT_FALSE(s.varies_by_tensor());

  // The settings survive the JSON form that plans and manifests carry.
  MergeSpec copy = spec;
  copy.set_varying(nullptr);
  EXPECT_FALSE(copy.varies_by_tensor());
  copy.set_varying(spec.varying_json());
  EXPECT_EQ(copy.varying_json(), spec.varying_json());
  EXPECT_DOUBLE_EQ(specs_by_tensor(copy, names)[2].experts[0].density, 0.5);
}

TEST(MergeConfig, ConstantSettingsFoldIntoTheScalars) {
  // A one-element gradient and a catch-all-only filter list are still one number.
  const MergeSpec spec = io::parse_merge_config(R"(
merge_method: ties
base_model: /m/base
parameters: {density: 0.3, weight: 2, lambda: 1.5}
models:
  - model: /m/a
    parameters: {density: 0.6}
  - model: /m/b
)",
                                                "/cfg/m.yaml");
  EXPECT_FALSE(spec.varies_by_tensor());
  EXPECT_DOUBLE_EQ(spec.experts[0].density, 0.6);
  EXPECT_DOUBLE_EQ(spec.experts[1].density, 0.3);
  EXPECT_DOUBLE_EQ(spec.experts[1].weight, 2.0);
  EXPECT_DOUBLE_EQ(spec.lambda, 1.5);
  // A filter list whose lookup finds nothing falls through to the top level, then the default.
  const MergeSpec fall = io::parse_merge_config(R"(
merge_method: task_arithmetic
base_model: /m/base
parameters: {weight: [{filter: mlp, value: 0.25}]}
models:
  - model: /m/a
    parameters: {weight: [{filter: self_attn, value: 3}]}
)",
                                                "/cfg/m.yaml");
  const auto per =
      specs_by_tensor(fall, {"model.layers.0.self_attn.k_proj.weight",
                             "model.layers.0.mlp.up_proj.weight", "model.norm.weight"});
  EXPECT_DOUBLE_EQ(per[0].experts[0].weight, 3.0);
  EXPECT_DOUBLE_EQ(per[1].experts[0].weight, 0.25);
  EXPECT_DOUBLE_EQ(per[2].experts[0].weight, 1.0);
}

TEST(MergeConfig, LinearWithoutBaseGradesTheReferenceWeightToo) {
  const MergeSpec spec = io::parse_merge_config(R"(
merge_method: linear
models:
  - model: /m/a
    parameters: {weight: [1, 0]}
  - model: /m/b
    parameters: {weight: [0, 1]}
)",
                                                "/cfg/m.yaml");
  ASSERT_TRUE(spec.base_is_reference);
  ASSERT_TRUE(spec.varies_by_tensor());
  const auto per = specs_by_tensor(
      spec, {"model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"});
  ASSERT_TRUE(per[0].base_weight.has_value());
  EXPECT_DOUBLE_EQ(*per[0].base_weight, 1.0);
  EXPECT_DOUBLE_EQ(per[0].experts[0].weight, 0.0);
  EXPECT_DOUBLE_EQ(*per[1].base_weight, 0.0);
  EXPECT_DOUBLE_EQ(per[1].experts[0].weight, 1.0);
}

TEST(MergeConfig, AGradientThatMakesATensorInvalidNamesTheTensor) {
  // normalize with weights summing to 0 at one layer only.
  const MergeSpec spec = io::parse_merge_config(R"(
merge_method: task_arithmetic
base_model: /m/base
parameters: {normalize: true}
models:
  - model: /m/a
    parameters: {weight: [1, -1]}
  - model: /m/b
    parameters: {weight: [1, 1]}
)",
                                                "/cfg/m.yaml");
  try {
    specs_by_tensor(spec,
                    {"model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"});
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}
