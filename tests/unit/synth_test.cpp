// mergepipe synth: preset shapes, generator determinism and the structure of each expert kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <unistd.h>

#include "mergepipe/error.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/io/synth_family.hpp"
#include "mergepipe/synth/generator.hpp"
#include "mergepipe/synth/presets.hpp"

using namespace mergepipe;
using namespace mergepipe::synth;
namespace fs = std::filesystem;

namespace {

std::uint64_t total_bytes(const std::vector<SynthTensor>& tensors) {
  std::uint64_t b = 0;
  for (const auto& t : tensors) b += t.info.nbytes();
  return b;
}

const SynthTensor* find_tensor(const std::vector<SynthTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors)
    if (t.info.name == name) return &t;
  return nullptr;
}

std::size_t index_of(const FamilyGenerator& g, const std::string& name) {
  for (std::size_t i = 0; i < g.tensors().size(); ++i)
    if (g.tensors()[i].info.name == name) return i;
  ADD_FAILURE() << "no tensor " << name;
  return 0;
}

FamilyGenerator make_family(const std::string& preset, DType dtype, std::uint64_t seed, int experts,
                            std::vector<ExpertKind> kinds = {},
                            std::optional<std::uint64_t> layers = std::nullopt) {
  FamilyOptions o;
  o.preset = scale_preset(find_preset(preset), layers, std::nullopt);
  o.dtype = dtype;
  o.seed = seed;
  o.experts = experts;
  o.kinds = std::move(kinds);
  return FamilyGenerator(o);
}

std::vector<double> decode(DType dtype, const std::vector<std::byte>& bytes) {
  const std::size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> f(n);
  convert_to_f32(dtype, bytes.data(), f.data(), n);
  return {f.begin(), f.end()};
}

// Singular values of a rows x cols row-major matrix (one-sided Jacobi, double), descending.
std::vector<double> singular_values(std::vector<double> a, std::size_t rows, std::size_t cols) {
  // Work on columns of A^T when rows < cols so the column count is the smaller dimension.
  if (rows < cols) {
    std::vector<double> t(a.size());
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
    a.swap(t);
    std::swap(rows, cols);
  }
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (std::size_t p = 0; p + 1 < cols; ++p) {
      for (std::size_t q = p + 1; q < cols; ++q) {
        double alpha = 0, beta = 0, gamma = 0;
        for (std::size_t i = 0; i < rows; ++i) {
          const double x = a[i * cols + p], y = a[i * cols + q];
          alpha += x * x;
          beta += y * y;
          gamma += x * y;
        }
        if (gamma == 0 || std::fabs(gamma) < 1e-300) continue;
        off = std::max(off, std::fabs(gamma) / std::sqrt(alpha * beta));
        const double zeta = (beta - alpha) / (2 * gamma);
        const double t = std::copysign(1.0, zeta) / (std::fabs(zeta) + std::sqrt(1 + zeta * zeta));
        const double c = 1 / std::sqrt(1 + t * t), s = c * t;
        for (std::size_t i = 0; i < rows; ++i) {
          const double x = a[i * cols + p], y = a[i * cols + q];
          a[i * cols + p] = c * x - s * y;
          a[i * cols + q] = s * x + c * y;
        }
      }
    }
    if (off < 1e-15) break;
  }
  std::vector<double> sv(cols);
  for (std::size_t j = 0; j < cols; ++j) {
    double n = 0;
    for (std::size_t i = 0; i < rows; ++i) n += a[i * cols + j] * a[i * cols + j];
    sv[j] = std::sqrt(n);
  }
  std::sort(sv.rbegin(), sv.rend());
  return sv;
}

double relative_delta_norm(const std::vector<double>& base, const std::vector<double>& expert) {
  double d = 0, b = 0;
  for (std::size_t i = 0; i < base.size(); ++i) {
    d += (expert[i] - base[i]) * (expert[i] - base[i]);
    b += base[i] * base[i];
  }
  return std::sqrt(d / b);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

// ---- Presets ------------------------------------------------------------------------------------

TEST(SynthPresets, Qwen3SmallMatchesTheRealModel) {
  const auto tensors = model_tensors(find_preset("qwen3-0.6b"), DType::kBF16);
  EXPECT_EQ(tensors.size(), 311u);
  EXPECT_EQ(total_bytes(tensors), 1'503'264'768ull);
  const auto* q = find_tensor(tensors, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->info.shape, (std::vector<std::uint64_t>{2048, 1024}));
  EXPECT_EQ(find_tensor(tensors, "model.layers.27.self_attn.k_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{1024, 1024}));
  EXPECT_EQ(find_tensor(tensors, "model.layers.3.self_attn.o_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{1024, 2048}));
  EXPECT_EQ(find_tensor(tensors, "model.layers.3.self_attn.q_norm.weight")->info.shape,
            (std::vector<std::uint64_t>{128}));
  EXPECT_EQ(find_tensor(tensors, "model.layers.3.mlp.down_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{1024, 3072}));
  EXPECT_EQ(find_tensor(tensors, "lm_head.weight")->info.shape,
            (std::vector<std::uint64_t>{151936, 1024}));
  // Module order: embed, layer by layer (q,k,v,o,q_norm,k_norm,gate,up,down,norms), norm, lm_head.
  const std::vector<std::string> expected_start = {"model.embed_tokens.weight",
                                                   "model.layers.0.self_attn.q_proj.weight",
                                                   "model.layers.0.self_attn.k_proj.weight",
                                                   "model.layers.0.self_attn.v_proj.weight",
                                                   "model.layers.0.self_attn.o_proj.weight",
                                                   "model.layers.0.self_attn.q_norm.weight",
                                                   "model.layers.0.self_attn.k_norm.weight",
                                                   "model.layers.0.mlp.gate_proj.weight",
                                                   "model.layers.0.mlp.up_proj.weight",
                                                   "model.layers.0.mlp.down_proj.weight",
                                                   "model.layers.0.input_layernorm.weight",
                                                   "model.layers.0.post_attention_layernorm.weight",
                                                   "model.layers.1.self_attn.q_proj.weight"};
  for (std::size_t i = 0; i < expected_start.size(); ++i)
    EXPECT_EQ(tensors[i].info.name, expected_start[i]);
  EXPECT_EQ(tensors[309].info.name, "model.norm.weight");
  EXPECT_EQ(tensors[310].info.name, "lm_head.weight");
  EXPECT_EQ(tensors[1].layer, 0);
  EXPECT_EQ(tensors[300].layer, 27);
  EXPECT_EQ(tensors[310].layer, -1);
}

TEST(SynthPresets, LlamaAndQwen25MatchTheRealModels) {
  const auto l8 = model_tensors(find_preset("llama-3.1-8b"), DType::kBF16);
  EXPECT_EQ(l8.size(), 291u);
  EXPECT_EQ(total_bytes(l8), 16'060'522'496ull);
  EXPECT_EQ(find_tensor(l8, "model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ(find_tensor(l8, "model.layers.31.self_attn.k_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{1024, 4096}));
  EXPECT_EQ(find_tensor(l8, "model.layers.31.mlp.gate_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{14336, 4096}));
  EXPECT_EQ(l8.back().info.name, "lm_head.weight");

  // Tied, no lm_head in the file.
  const auto l1 = model_tensors(find_preset("llama-3.2-1b"), DType::kBF16);
  EXPECT_EQ(l1.size(), 16u * 9 + 2);
  EXPECT_EQ(total_bytes(l1), 2'471'628'800ull);
  EXPECT_EQ(find_tensor(l1, "lm_head.weight"), nullptr);
  EXPECT_EQ(find_tensor(l1, "model.layers.0.self_attn.q_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{2048, 2048}));

  const auto q7 = model_tensors(find_preset("qwen2.5-7b"), DType::kBF16);
  EXPECT_EQ(q7.size(), 339u);
  EXPECT_EQ(total_bytes(q7), 15'231'233'024ull);
  EXPECT_EQ(q7[2].info.name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(q7[2].info.shape, (std::vector<std::uint64_t>{3584}));
}

TEST(SynthPresets, TinyPresetsAreSmallAndShaped) {
  const auto tiny = model_tensors(find_preset("tiny"), DType::kBF16);
  EXPECT_LT(total_bytes(tiny), 4'000'000u);
  EXPECT_NE(find_tensor(tiny, "model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_NE(find_tensor(tiny, "lm_head.weight"), nullptr);
  EXPECT_TRUE(find_preset("tiny").tie_word_embeddings);
  const auto tl = model_tensors(find_preset("tiny-llama"), DType::kF32);
  EXPECT_EQ(find_tensor(tl, "model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_NE(find_tensor(tl, "lm_head.weight"), nullptr);
  EXPECT_FALSE(find_preset("tiny-llama").tie_word_embeddings);
  EXPECT_EQ(tl[0].info.dtype, DType::kF32);
  // Tiny presets default to small shards so every test exercises sharding.
  EXPECT_LT(default_max_shard_bytes(find_preset("tiny")), total_bytes(tiny));
  EXPECT_EQ(default_max_shard_bytes(find_preset("qwen3-0.6b")), 5'000'000'000ull);
}

TEST(SynthPresets, UnknownPresetIsAUsageErrorNamingIt) {
  try {
    find_preset("qwen9-huge");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("qwen9-huge"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("qwen3-0.6b"), std::string::npos);  // lists valid ones
  }
  for (const auto& name : preset_names()) EXPECT_EQ(find_preset(name).name, name);
}

TEST(SynthPresets, OverridesScaleDownKeepingHeadDim) {
  const ModelPreset p = scale_preset(find_preset("qwen3-0.6b"), 2, 256);
  EXPECT_EQ(p.num_layers, 2u);
  EXPECT_EQ(p.hidden_size, 256u);
  EXPECT_EQ(p.head_dim, 128u);
  EXPECT_EQ(p.num_heads, 4u);
  EXPECT_EQ(p.num_kv_heads, 2u);
  EXPECT_EQ(p.intermediate_size, 768u);
  const auto t = model_tensors(p, DType::kBF16);
  EXPECT_EQ(t.size(), 2u * 11 + 3);
  EXPECT_EQ(find_tensor(t, "model.layers.1.self_attn.q_proj.weight")->info.shape,
            (std::vector<std::uint64_t>{512, 256}));
  const ModelPreset l = scale_preset(find_preset("llama-3.1-8b"), std::nullopt, 512);
  EXPECT_EQ(l.num_heads, 4u);
  EXPECT_EQ(l.num_kv_heads, 1u);
  EXPECT_EQ(l.num_heads % l.num_kv_heads, 0u);
  EXPECT_EQ(l.intermediate_size, 1792u);
  EXPECT_EQ(l.num_layers, 32u);
  EXPECT_THROW(scale_preset(find_preset("tiny"), 0, std::nullopt), UsageError);
  EXPECT_THROW(scale_preset(find_preset("tiny"), std::nullopt, 30), UsageError);
}

TEST(SynthPresets, VocabOverrideSetsTheRowsOfEmbedAndLmHead) {
  const ModelPreset p = scale_preset(find_preset("tiny-llama"), std::nullopt, std::nullopt, 96);
  EXPECT_EQ(p.vocab_size, 96u);
  const auto t = model_tensors(p, DType::kBF16);
  EXPECT_EQ(find_tensor(t, "model.embed_tokens.weight")->info.shape[0], 96u);
  EXPECT_EQ(find_tensor(t, "lm_head.weight")->info.shape[0], 96u);
  EXPECT_EQ(nlohmann::json::parse(make_config_json(p, DType::kBF16))["vocab_size"], 96);
  const ModelPreset q = scale_preset(find_preset("qwen3-0.6b"), std::nullopt, std::nullopt, 4096);
  EXPECT_EQ(q.bos_token_id, 4095);  // special tokens moved inside the vocabulary
  EXPECT_EQ(q.eos_token_ids, (std::vector<std::int64_t>{4094}));
  EXPECT_EQ(scale_preset(find_preset("qwen3-0.6b"), std::nullopt, std::nullopt).vocab_size,
            151936u);
  EXPECT_THROW(scale_preset(find_preset("tiny"), std::nullopt, std::nullopt, 31), UsageError);
  EXPECT_THROW(
      scale_preset(find_preset("tiny"), std::nullopt, std::nullopt, (std::uint64_t{1} << 24) + 1),
      UsageError);
}

TEST(SynthPresets, ConfigJsonHasRealKeys) {
  const auto c = nlohmann::json::parse(make_config_json(find_preset("qwen3-0.6b"), DType::kBF16));
  EXPECT_EQ(c["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(c["model_type"], "qwen3");
  EXPECT_EQ(c["hidden_size"], 1024);
  EXPECT_EQ(c["intermediate_size"], 3072);
  EXPECT_EQ(c["num_hidden_layers"], 28);
  EXPECT_EQ(c["num_attention_heads"], 16);
  EXPECT_EQ(c["num_key_value_heads"], 8);
  EXPECT_EQ(c["head_dim"], 128);
  EXPECT_EQ(c["vocab_size"], 151936);
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["rope_theta"], 1000000);
  EXPECT_DOUBLE_EQ(c["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(c["bos_token_id"], 151643);
  EXPECT_EQ(c["eos_token_id"], 151645);
  const auto l = nlohmann::json::parse(make_config_json(find_preset("llama-3.1-8b"), DType::kF16));
  EXPECT_EQ(l["torch_dtype"], "float16");
  EXPECT_EQ(l["tie_word_embeddings"], false);
  EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(l["eos_token_id"].size(), 3u);
  const auto scaled = nlohmann::json::parse(
      make_config_json(scale_preset(find_preset("tiny"), 3, 128), DType::kF32));
  EXPECT_EQ(scaled["num_hidden_layers"], 3);
  EXPECT_EQ(scaled["hidden_size"], 128);
  EXPECT_EQ(scaled["torch_dtype"], "float32");
  EXPECT_TRUE(nlohmann::json::parse(make_generation_config_json(find_preset("tiny")))
                  .contains("eos_token_id"));
  EXPECT_TRUE(nlohmann::json::parse(make_tokenizer_config_json(find_preset("tiny")))
                  .contains("tokenizer_class"));
}

// ---- Generator ----------------------------------------------------------------------------------

TEST(SynthGenerator, KindsCycleAndParse) {
  EXPECT_EQ(parse_kind_list("lora,rl"),
            (std::vector<ExpertKind>{ExpertKind::kLora, ExpertKind::kRl}));
  EXPECT_THROW(parse_kind_list("full,,rl"), UsageError);
  try {
    parse_kind_list("full,dpo");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("dpo"), std::string::npos);
  }
  const auto g = make_family("tiny", DType::kBF16, 1, 7, {ExpertKind::kLora, ExpertKind::kFull});
  ASSERT_EQ(g.experts().size(), 7u);
  for (int e = 0; e < 7; ++e)
    EXPECT_EQ(g.experts()[static_cast<std::size_t>(e)].kind,
              e % 2 ? ExpertKind::kFull : ExpertKind::kLora);
  EXPECT_EQ(expert_dir_name(3, 10), "expert03");
  EXPECT_EQ(expert_dir_name(7, 250), "expert007");
}

TEST(SynthGenerator, SameSeedSameBytesDifferentSeedDifferentBytes) {
  const auto a = make_family("tiny", DType::kBF16, 7, 5);
  const auto b = make_family("tiny", DType::kBF16, 7, 5);
  const auto c = make_family("tiny", DType::kBF16, 8, 5);
  for (std::size_t t = 0; t < a.tensors().size(); ++t) {
    for (int m = -1; m < 5; ++m)
      ASSERT_EQ(a.tensor_bytes(m, t), b.tensor_bytes(m, t)) << t << " " << m;
    EXPECT_NE(a.tensor_bytes(-1, t), c.tensor_bytes(-1, t)) << a.tensors()[t].info.name;
  }
  // Expert parameters are drawn from the seed too.
  EXPECT_NE(a.experts()[0].strength, c.experts()[0].strength);
}

TEST(SynthGenerator, RowChunkingDoesNotChangeValues) {
  const auto g = make_family("tiny-llama", DType::kF16, 3, 5);
  for (std::size_t t : {std::size_t{0}, std::size_t{1}, std::size_t{7}, g.tensors().size() - 1}) {
    const std::uint64_t rows = g.rows(t), cols = g.cols(t);
    const std::size_t row_bytes = static_cast<std::size_t>(cols * 2);
    std::vector<std::vector<std::byte>> whole;
    for (int m = -1; m < 5; ++m) whole.push_back(g.tensor_bytes(m, t));
    for (std::uint64_t step : {std::uint64_t{1}, std::uint64_t{7}, rows}) {
      std::vector<std::vector<std::byte>> pieces(6, std::vector<std::byte>(whole[0].size()));
      GeneratorScratch scratch;
      for (std::uint64_t r = 0; r < rows; r += step) {
        const std::uint64_t end = std::min(rows, r + step);
        const std::size_t off = static_cast<std::size_t>(r) * row_bytes;
        const std::size_t len = static_cast<std::size_t>(end - r) * row_bytes;
        std::vector<std::span<std::byte>> outs;
        for (int e = 0; e < 5; ++e)
          outs.emplace_back(pieces[static_cast<std::size_t>(e + 1)].data() + off, len);
        g.generate_rows(t, r, end, std::span(pieces[0].data() + off, len), outs, scratch);
        for (int e = 0; e < 5; ++e)  // untouched: caller copies the base
          if (!g.experts()[static_cast<std::size_t>(e)].touches[t])
            std::memcpy(pieces[static_cast<std::size_t>(e + 1)].data() + off,
                        pieces[0].data() + off, len);
      }
      for (std::size_t m = 0; m < 6; ++m)
        ASSERT_EQ(pieces[m], whole[m]) << "tensor " << t << " step " << step;
    }
  }
}

TEST(SynthGenerator, UntouchedTensorsAreBitIdenticalToTheBase) {
  const auto g = make_family("tiny", DType::kBF16, 11, 5);  // one expert of each kind
  for (const ExpertSpec& e : g.experts()) {
    for (std::size_t t = 0; t < g.tensors().size(); ++t) {
      const auto base = g.tensor_bytes(-1, t), mine = g.tensor_bytes(e.index, t);
      if (!e.touches[t]) {
        ASSERT_EQ(mine, base) << kind_name(e.kind) << " " << g.tensors()[t].info.name;
      } else if (g.tensors()[t].info.shape.size() == 2) {
        EXPECT_NE(mine, base) << kind_name(e.kind) << " " << g.tensors()[t].info.name;
      }
    }
  }
}

TEST(SynthGenerator, TiedStoredLmHeadIsACopyOfTheEmbedding) {
  const auto g = make_family("tiny", DType::kBF16, 5, 5);
  const std::size_t embed = index_of(g, "model.embed_tokens.weight"),
                    head = index_of(g, "lm_head.weight");
  for (int m = -1; m < 5; ++m) EXPECT_EQ(g.tensor_bytes(m, embed), g.tensor_bytes(m, head)) << m;
  const auto u = make_family("tiny-llama", DType::kBF16, 5, 1);
  EXPECT_NE(u.tensor_bytes(-1, index_of(u, "model.embed_tokens.weight")),
            u.tensor_bytes(-1, index_of(u, "lm_head.weight")));
}

TEST(SynthGenerator, BaseLooksLikeTrainedWeights) {
  const auto g = make_family("tiny", DType::kF32, 2, 0);
  const auto q = decode(DType::kF32,
                        g.tensor_bytes(-1, index_of(g, "model.layers.0.self_attn.q_proj.weight")));
  double sum = 0, sq = 0;
  for (double v : q) {
    sum += v;
    sq += v * v;
  }
  const double mean = sum / static_cast<double>(q.size());
  const double sd = std::sqrt(sq / static_cast<double>(q.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.002);
  const auto norm = decode(DType::kF32, g.tensor_bytes(-1, index_of(g, "model.norm.weight")));
  for (double v : norm) EXPECT_NEAR(v, 1.0, 0.1);
}

TEST(SynthGenerator, LoraChangesOnlyQAndVByAnExactRankRProduct) {
  const auto g = make_family("tiny", DType::kF32, 21, 3, {ExpertKind::kLora});
  for (const ExpertSpec& e : g.experts()) {
    ASSERT_TRUE(e.rank == 4 || e.rank == 8 || e.rank == 16) << e.rank;
    for (std::size_t t = 0; t < g.tensors().size(); ++t) {
      const SynthTensor& st = g.tensors()[t];
      const bool qv = st.role == TensorRole::kQProj || st.role == TensorRole::kVProj;
      const auto base = g.tensor_bytes(-1, t), mine = g.tensor_bytes(e.index, t);
      if (!qv) {
        ASSERT_EQ(mine, base) << st.info.name;
        continue;
      }
      const auto b = decode(DType::kF32, base), x = decode(DType::kF32, mine);
      std::vector<double> delta(b.size());
      for (std::size_t i = 0; i < b.size(); ++i) delta[i] = x[i] - b[i];
      const auto sv = singular_values(delta, st.info.shape[0], st.info.shape[1]);
      const auto r = static_cast<std::size_t>(e.rank);
      ASSERT_GT(sv.size(), r);
      EXPECT_GT(sv[r - 1] / sv[0], 1e-2) << st.info.name << " rank " << r;
      EXPECT_LT(sv[r] / sv[0], 1e-4) << st.info.name << " rank " << r;
    }
  }
}

TEST(SynthGenerator, PartialExpertsChangeOnlyTheTopLayers) {
  const auto g = make_family("tiny-llama", DType::kBF16, 4, 3, {ExpertKind::kPartial}, 8);
  for (const ExpertSpec& e : g.experts()) {
    EXPECT_GE(e.first_layer, 4);  // top quarter to half of 8 layers
    EXPECT_LE(e.first_layer, 6);
    for (std::size_t t = 0; t < g.tensors().size(); ++t) {
      const SynthTensor& st = g.tensors()[t];
      const bool same = g.tensor_bytes(e.index, t) == g.tensor_bytes(-1, t);
      if (st.layer < e.first_layer) {
        EXPECT_TRUE(same) << st.info.name;
      } else if (st.info.shape.size() == 2) {
        EXPECT_FALSE(same) << st.info.name;
      }
    }
  }
}

TEST(SynthGenerator, VocabExpertsChangeOnlySomeEmbeddingRows) {
  for (const char* preset : {"tiny", "tiny-llama"}) {
    const auto g = make_family(preset, DType::kBF16, 9, 2, {ExpertKind::kVocab});
    for (const ExpertSpec& e : g.experts()) {
      for (std::size_t t = 0; t < g.tensors().size(); ++t) {
        const SynthTensor& st = g.tensors()[t];
        const auto base = g.tensor_bytes(-1, t), mine = g.tensor_bytes(e.index, t);
        if (st.role != TensorRole::kEmbed && st.role != TensorRole::kLmHead) {
          ASSERT_EQ(mine, base) << st.info.name;
          continue;
        }
        const std::size_t rows = static_cast<std::size_t>(g.rows(t)),
                          row_bytes = base.size() / rows;
        std::size_t changed_rows = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          const bool changed =
              std::memcmp(base.data() + r * row_bytes, mine.data() + r * row_bytes, row_bytes) != 0;
          changed_rows += changed;
          if (r + e.new_rows >= rows) {
            EXPECT_TRUE(changed) << "added-token row " << r;
          }
        }
        EXPECT_GT(changed_rows, e.new_rows) << st.info.name;
        EXPECT_LT(changed_rows, rows / 8) << st.info.name;
      }
    }
  }
}

TEST(SynthGenerator, RlExpertsAreSparseAndNearlyFullRank) {
  const auto g = make_family("tiny", DType::kBF16, 13, 3, {ExpertKind::kRl});
  for (const ExpertSpec& e : g.experts()) {
    EXPECT_GE(e.density, 0.05);
    EXPECT_LE(e.density, 0.30);
    for (std::size_t t = 0; t < g.tensors().size(); ++t) {
      const SynthTensor& st = g.tensors()[t];
      const auto base = g.tensor_bytes(-1, t), mine = g.tensor_bytes(e.index, t);
      if (st.layer < 0 || st.info.shape.size() != 2) {
        ASSERT_EQ(mine, base) << st.info.name;
        continue;
      }
      const double frac = static_cast<double>(count_changed_elements(DType::kBF16, base, mine)) /
                          static_cast<double>(st.info.numel());
      EXPECT_NEAR(frac, e.density, 0.02 + 0.1 * e.density) << st.info.name;
      EXPECT_GE(frac, 0.04);
      EXPECT_LE(frac, 0.33);
      if (st.role == TensorRole::kQProj) {
        const auto b = decode(DType::kBF16, base), x = decode(DType::kBF16, mine);
        std::vector<double> delta(b.size());
        for (std::size_t i = 0; i < b.size(); ++i) delta[i] = x[i] - b[i];
        const auto sv = singular_values(delta, st.info.shape[0], st.info.shape[1]);
        // Numerically full rank, and most of the spectrum well above the noise floor.
        EXPECT_GT(sv.back() / sv[0], 1e-6) << "full rank expected";
        const auto strong =
            std::count_if(sv.begin(), sv.end(), [&](double v) { return v > 1e-2 * sv[0]; });
        EXPECT_GE(static_cast<std::size_t>(strong), sv.size() * 3 / 4);
      }
    }
  }
}

TEST(SynthGenerator, FullExpertsHaveRealisticDeltaNorms) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const auto g = make_family("tiny-llama", dtype, 17, 4, {ExpertKind::kFull}, 6);
    double qk = 0, vo = 0;
    int nqk = 0, nvo = 0;
    for (const ExpertSpec& e : g.experts()) {
      EXPECT_GE(e.rank, 4);
      EXPECT_LE(e.rank, 8);
      std::uint64_t unchanged = 0, total = 0;
      for (std::size_t t = 0; t < g.tensors().size(); ++t) {
        const SynthTensor& st = g.tensors()[t];
        if (st.info.shape.size() != 2) continue;
        const auto base_bytes = g.tensor_bytes(-1, t), bytes = g.tensor_bytes(e.index, t);
        const double rel = relative_delta_norm(decode(dtype, base_bytes), decode(dtype, bytes));
        EXPECT_GE(rel, 1e-3) << dtype_name(dtype) << " " << st.info.name;
        EXPECT_LE(rel, 1e-2) << dtype_name(dtype) << " " << st.info.name;
        if (st.role == TensorRole::kQProj || st.role == TensorRole::kKProj) qk += rel, ++nqk;
        if (st.role == TensorRole::kVProj || st.role == TensorRole::kOProj) vo += rel, ++nvo;
        unchanged += st.info.numel() - count_changed_elements(dtype, base_bytes, bytes);
        total += st.info.numel();
      }
      // bf16 hides small updates: many entries stay bit-identical, as in real fine-tunes.
      const double unchanged_fraction = static_cast<double>(unchanged) / static_cast<double>(total);
      if (dtype == DType::kBF16) {
        EXPECT_GT(unchanged_fraction, 0.1);
      } else {
        EXPECT_LT(unchanged_fraction, 0.01);
      }
    }
    EXPECT_GT(qk / nqk, 1.5 * (vo / nvo)) << "q/k should change most";
  }
}

TEST(SynthGenerator, FullDeltaIsNotLowRank) {
  const auto g = make_family("tiny", DType::kF32, 19, 1, {ExpertKind::kFull});
  const std::size_t t = index_of(g, "model.layers.1.self_attn.q_proj.weight");
  const auto b = decode(DType::kF32, g.tensor_bytes(-1, t)),
             x = decode(DType::kF32, g.tensor_bytes(0, t));
  std::vector<double> delta(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) delta[i] = x[i] - b[i];
  const auto sv = singular_values(delta, 64, 64);
  const auto r = static_cast<std::size_t>(g.experts()[0].rank);
  // A fast head (the low-rank part) and a long tail (the dense part): not rank r.
  EXPECT_GT(sv[r + 4] / sv[0], 0.05);
  EXPECT_GT(sv[0] / sv[32], 2.0);
}

// ---- Writing a family ---------------------------------------------------------------------------

TEST(SynthFamilyWriter, FilesAreIdenticalForAnyThreadCountAndDescribeTheFamily) {
  const fs::path root =
      fs::temp_directory_path() / ("mergepipe_synth_test_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  const auto g = make_family("tiny", DType::kBF16, 7, 5);
  io::SynthWriteOptions o1, o3;
  o1.max_shard_bytes = o3.max_shard_bytes = 100'000;
  o1.threads = 1;
  o3.threads = 3;
  o3.chunk_elements = 1000;  // many small units, finished in any order
  const auto r1 = io::write_synth_family(g, (root / "a").string(), o1);
  const auto r3 = io::write_synth_family(g, (root / "b").string(), o3);
  EXPECT_EQ(r1.bytes, r3.bytes);
  EXPECT_EQ(r1.files, r3.files);
  EXPECT_EQ(r1.changed_elements, r3.changed_elements);

  std::size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "a")) {
    if (!entry.is_regular_file()) continue;
    ++files;
    const fs::path rel = fs::relative(entry.path(), root / "a");
    ASSERT_TRUE(fs::exists(root / "b" / rel)) << rel;
    ASSERT_EQ(read_file(entry.path()), read_file(root / "b" / rel)) << rel;
  }
  EXPECT_EQ(files, r1.files);

  // Sharded (the tiny preset is ~330 kB), with an index; every tensor's bytes as generated.
  const fs::path base = root / "a" / "base";
  EXPECT_TRUE(fs::exists(base / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(base / "config.json"));
  EXPECT_TRUE(fs::exists(base / "tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(base / "generation_config.json"));
  const auto index = nlohmann::json::parse(read_file(base / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), g.tensors().size());
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 3u);
  const std::size_t q = index_of(g, "model.layers.1.self_attn.q_proj.weight");
  for (int m : {-1, 1}) {
    const fs::path dir = root / "a" / (m < 0 ? "base" : expert_dir_name(m, 5));
    const std::string shard = index["weight_map"][g.tensors()[q].info.name];
    const auto header = io::read_safetensors_header((dir / shard).string());
    bool found = false;
    for (const auto& st : header.tensors) {
      if (st.info.name != g.tensors()[q].info.name) continue;
      found = true;
      const std::string data = read_file(dir / shard).substr(st.offset, st.length);
      const auto want = g.tensor_bytes(m, q);
      ASSERT_EQ(data.size(), want.size());
      EXPECT_EQ(std::memcmp(data.data(), want.data(), want.size()), 0);
    }
    EXPECT_TRUE(found);
  }

  const auto family = nlohmann::json::parse(read_file(root / "a" / "family.json"));
  EXPECT_EQ(family["preset"], "tiny");
  EXPECT_EQ(family["seed"], 7);
  ASSERT_EQ(family["experts"].size(), 5u);
  const std::vector<std::string> kinds = {"full", "lora", "rl", "partial", "vocab"};
  for (std::size_t e = 0; e < 5; ++e) {
    const auto& x = family["experts"][e];
    EXPECT_EQ(x["kind"], kinds[e]);
    EXPECT_EQ(x["name"], expert_dir_name(static_cast<int>(e), 5));
    for (const auto& [name, count] : x["changed_tensors"].items()) {
      const std::size_t t = index_of(g, name);
      EXPECT_TRUE(g.experts()[e].touches[t]) << name;
      EXPECT_EQ(count.get<std::uint64_t>(), r1.changed_elements[e][t]);
      EXPECT_GT(count.get<std::uint64_t>(), 0u);
    }
  }
  // The lora expert lists exactly the q/v projections.
  EXPECT_EQ(family["experts"][1]["changed_tensors"].size(), 2u * 2);
  fs::remove_all(root);
}
