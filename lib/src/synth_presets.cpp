#include <cmath>
#include <nlohmann/json.hpp>

#include "mergepipe/error.hpp"
#include "mergepipe/synth/presets.hpp"

namespace mergepipe::synth {

namespace {

using ojson = nlohmann::ordered_json;

// rope_scaling of the Llama 3.x presets ("llama3" type); 0 means null.
double llama3_rope_factor(const ModelPreset& p) {
  if (p.name.starts_with("llama-3.2")) return 32.0;
  if (p.name.starts_with("llama-3.1")) return 8.0;
  return 0.0;
}

std::vector<ModelPreset> all_presets() {
  std::vector<ModelPreset> v;
  {
    ModelPreset p;
    p.name = "qwen3-0.6b";
    p.architecture = "Qwen3ForCausalLM";
    p.model_type = "qwen3";
    p.hidden_size = 1024;
    p.intermediate_size = 3072;
    p.num_layers = 28;
    p.num_heads = 16;
    p.num_kv_heads = 8;
    p.head_dim = 128;
    p.vocab_size = 151936;
    p.max_position_embeddings = 40960;
    p.qk_norm = true;
    p.tie_word_embeddings = true;
    p.stores_lm_head = true;  // Qwen3-0.6B ships a materialised lm_head (311 tensors)
    p.rope_theta = 1000000;
    p.rms_norm_eps = 1e-6;
    p.bos_token_id = 151643;
    p.eos_token_ids = {151645};
    v.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "llama-3.2-1b";
    p.architecture = "LlamaForCausalLM";
    p.model_type = "llama";
    p.hidden_size = 2048;
    p.intermediate_size = 8192;
    p.num_layers = 16;
    p.num_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim = 64;
    p.vocab_size = 128256;
    p.max_position_embeddings = 131072;
    p.tie_word_embeddings = true;
    p.stores_lm_head = false;
    p.rope_theta = 500000;
    p.rms_norm_eps = 1e-5;
    p.bos_token_id = 128000;
    p.eos_token_ids = {128001, 128008, 128009};
    v.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "llama-3.1-8b";
    p.architecture = "LlamaForCausalLM";
    p.model_type = "llama";
    p.hidden_size = 4096;
    p.intermediate_size = 14336;
    p.num_layers = 32;
    p.num_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim = 128;
    p.vocab_size = 128256;
    p.max_position_embeddings = 131072;
    p.rope_theta = 500000;
    p.rms_norm_eps = 1e-5;
    p.bos_token_id = 128000;
    p.eos_token_ids = {128001, 128008, 128009};
    v.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "qwen2.5-7b";
    p.architecture = "Qwen2ForCausalLM";
    p.model_type = "qwen2";
    p.hidden_size = 3584;
    p.intermediate_size = 18944;
    p.num_layers = 28;
    p.num_heads = 28;
    p.num_kv_heads = 4;
    p.head_dim = 128;
    p.vocab_size = 152064;
    p.max_position_embeddings = 131072;
    p.qkv_bias = true;
    p.rope_theta = 1000000;
    p.rms_norm_eps = 1e-6;
    p.bos_token_id = 151643;
    p.eos_token_ids = {151643};
    v.push_back(p);
  }
  {
    // Qwen3-like: q/k norms and a stored lm_head tied to the embedding.
    ModelPreset p;
    p.name = "tiny";
    p.architecture = "Qwen3ForCausalLM";
    p.model_type = "qwen3";
    p.hidden_size = 64;
    p.intermediate_size = 192;
    p.num_layers = 2;
    p.num_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim = 16;
    p.vocab_size = 512;
    p.max_position_embeddings = 2048;
    p.qk_norm = true;
    p.tie_word_embeddings = true;
    p.stores_lm_head = true;
    p.rope_theta = 1000000;
    p.rms_norm_eps = 1e-6;
    p.bos_token_id = 1;
    p.eos_token_ids = {2};
    p.tiny = true;
    v.push_back(p);
  }
  {
    // Llama-like: untied lm_head, no q/k norms.
    ModelPreset p;
    p.name = "tiny-llama";
    p.architecture = "LlamaForCausalLM";
    p.model_type = "llama";
    p.hidden_size = 64;
    p.intermediate_size = 192;
    p.num_layers = 4;
    p.num_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim = 16;
    p.vocab_size = 512;
    p.max_position_embeddings = 2048;
    p.rope_theta = 500000;
    p.rms_norm_eps = 1e-5;
    p.bos_token_id = 1;
    p.eos_token_ids = {2};
    p.tiny = true;
    v.push_back(p);
  }
  return v;
}

// Whole numbers are written as JSON integers (as the real configs do: "rope_theta": 1000000).
ojson number(double x) {
  if (std::floor(x) == x && std::fabs(x) < 1e15) return static_cast<std::int64_t>(x);
  return x;
}

ojson eos_json(const ModelPreset& p) {
  if (p.eos_token_ids.size() == 1) return p.eos_token_ids[0];
  return p.eos_token_ids;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : all_presets()) names.push_back(p.name);
  return names;
}

ModelPreset find_preset(std::string_view name) {
  std::string valid;
  for (const auto& p : all_presets()) {
    if (p.name == name) return p;
    valid += (valid.empty() ? "" : ", ") + p.name;
  }
  throw UsageError("unknown preset '" + std::string(name) + "' (valid presets: " + valid + ")");
}

ModelPreset scale_preset(ModelPreset p, std::optional<std::uint64_t> layers,
                         std::optional<std::uint64_t> hidden, std::optional<std::uint64_t> vocab) {
  if (vocab) {
    // At least 32 rows: a 'vocab' expert adds vocab / 32 (at most 16) new token rows.
    if (*vocab < 32 || *vocab > (std::uint64_t{1} << 24))
      throw UsageError("--vocab " + std::to_string(*vocab) + ": must be between 32 and 16777216");
    p.vocab_size = *vocab;
    // Special tokens beyond the new vocabulary move to its last rows, so config.json stays valid.
    const auto in_vocab = [&](std::int64_t id, std::int64_t from_end) {
      const auto size = static_cast<std::int64_t>(*vocab);
      return id < size ? id : size - 1 - from_end;
    };
    p.bos_token_id = in_vocab(p.bos_token_id, 0);
    for (std::size_t i = 0; i < p.eos_token_ids.size(); ++i)
      p.eos_token_ids[i] = in_vocab(p.eos_token_ids[i], static_cast<std::int64_t>(i) + 1);
  }
  if (layers) {
    if (*layers < 1 || *layers > 1024)
      throw UsageError("--layers " + std::to_string(*layers) + ": must be between 1 and 1024");
    p.num_layers = *layers;
  }
  if (hidden && *hidden != p.hidden_size) {
    if (*hidden < 8 || *hidden > 65536 || *hidden % 8 != 0)
      throw UsageError("--hidden " + std::to_string(*hidden) +
                       ": must be a multiple of 8 between 8 and 65536");
    const double ratio = static_cast<double>(*hidden) / static_cast<double>(p.hidden_size);
    auto scaled = [&](std::uint64_t v, std::uint64_t multiple) {
      const double r = std::round(static_cast<double>(v) * ratio / static_cast<double>(multiple));
      return std::max<std::uint64_t>(multiple, static_cast<std::uint64_t>(r) * multiple);
    };
    p.hidden_size = *hidden;
    p.num_heads = scaled(p.num_heads, 1);
    p.num_kv_heads = std::min(p.num_heads, scaled(p.num_kv_heads, 1));
    while (p.num_heads % p.num_kv_heads != 0) --p.num_kv_heads;  // grouped-query attention
    p.intermediate_size = scaled(p.intermediate_size, 8);
  }
  return p;
}

std::vector<SynthTensor> model_tensors(const ModelPreset& p, DType dtype) {
  std::vector<SynthTensor> t;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape, TensorRole role, int layer) {
    t.push_back(SynthTensor{TensorInfo{std::move(name), dtype, std::move(shape)}, role, layer});
  };
  const std::uint64_t h = p.hidden_size;
  const std::uint64_t q_out = p.num_heads * p.head_dim;
  const std::uint64_t kv_out = p.num_kv_heads * p.head_dim;
  add("model.embed_tokens.weight", {p.vocab_size, h}, TensorRole::kEmbed, -1);
  for (std::uint64_t l = 0; l < p.num_layers; ++l) {
    const int layer = static_cast<int>(l);
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    add(pre + "self_attn.q_proj.weight", {q_out, h}, TensorRole::kQProj, layer);
    if (p.qkv_bias) add(pre + "self_attn.q_proj.bias", {q_out}, TensorRole::kQBias, layer);
    add(pre + "self_attn.k_proj.weight", {kv_out, h}, TensorRole::kKProj, layer);
    if (p.qkv_bias) add(pre + "self_attn.k_proj.bias", {kv_out}, TensorRole::kKBias, layer);
    add(pre + "self_attn.v_proj.weight", {kv_out, h}, TensorRole::kVProj, layer);
    if (p.qkv_bias) add(pre + "self_attn.v_proj.bias", {kv_out}, TensorRole::kVBias, layer);
    add(pre + "self_attn.o_proj.weight", {h, q_out}, TensorRole::kOProj, layer);
    if (p.qk_norm) {
      add(pre + "self_attn.q_norm.weight", {p.head_dim}, TensorRole::kQNorm, layer);
      add(pre + "self_attn.k_norm.weight", {p.head_dim}, TensorRole::kKNorm, layer);
    }
    add(pre + "mlp.gate_proj.weight", {p.intermediate_size, h}, TensorRole::kGateProj, layer);
    add(pre + "mlp.up_proj.weight", {p.intermediate_size, h}, TensorRole::kUpProj, layer);
    add(pre + "mlp.down_proj.weight", {h, p.intermediate_size}, TensorRole::kDownProj, layer);
    add(pre + "input_layernorm.weight", {h}, TensorRole::kInputNorm, layer);
    add(pre + "post_attention_layernorm.weight", {h}, TensorRole::kPostAttentionNorm, layer);
  }
  add("model.norm.weight", {h}, TensorRole::kFinalNorm, -1);
  if (p.stores_lm_head) add("lm_head.weight", {p.vocab_size, h}, TensorRole::kLmHead, -1);
  return t;
}

std::string make_config_json(const ModelPreset& p, DType dtype) {
  const bool llama = p.model_type == "llama";
  ojson c;
  c["architectures"] = {p.architecture};
  if (p.model_type != "qwen2") c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = p.bos_token_id;
  c["eos_token_id"] = eos_json(p);
  if (p.model_type != "qwen2") c["head_dim"] = p.head_dim;
  c["hidden_act"] = "silu";
  c["hidden_size"] = p.hidden_size;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = p.intermediate_size;
  c["max_position_embeddings"] = p.max_position_embeddings;
  if (!llama) c["max_window_layers"] = p.num_layers;
  if (llama) c["mlp_bias"] = false;
  c["model_type"] = p.model_type;
  c["num_attention_heads"] = p.num_heads;
  c["num_hidden_layers"] = p.num_layers;
  c["num_key_value_heads"] = p.num_kv_heads;
  if (llama) c["pretraining_tp"] = 1;
  c["rms_norm_eps"] = p.rms_norm_eps;
  if (const double factor = llama3_rope_factor(p); factor > 0) {
    c["rope_scaling"] = {{"factor", factor},
                         {"high_freq_factor", 4.0},
                         {"low_freq_factor", 1.0},
                         {"original_max_position_embeddings", 8192},
                         {"rope_type", "llama3"}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["rope_theta"] = number(p.rope_theta);
  if (!llama)
    c["sliding_window"] = p.model_type == "qwen2" ? ojson(p.max_position_embeddings) : ojson();
  c["tie_word_embeddings"] = p.tie_word_embeddings;
  c["torch_dtype"] = torch_dtype_name(dtype);
  c["transformers_version"] = llama ? "4.45.0" : (p.model_type == "qwen2" ? "4.43.1" : "4.51.0");
  c["use_cache"] = true;
  if (!llama) c["use_sliding_window"] = false;
  c["vocab_size"] = p.vocab_size;
  return c.dump(2) + "\n";
}

std::string make_tokenizer_config_json(const ModelPreset& p) {
  ojson c;
  if (p.model_type == "llama") {
    c["bos_token"] = "<|begin_of_text|>";
    c["clean_up_tokenization_spaces"] = true;
    c["eos_token"] = "<|end_of_text|>";
    c["model_input_names"] = {"input_ids", "attention_mask"};
    c["model_max_length"] = p.max_position_embeddings;
    c["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else {
    c["add_prefix_space"] = false;
    c["bos_token"] = nullptr;
    c["clean_up_tokenization_spaces"] = false;
    c["eos_token"] = p.model_type == "qwen3" ? "<|im_end|>" : "<|endoftext|>";
    c["errors"] = "replace";
    c["model_max_length"] = p.max_position_embeddings;
    c["pad_token"] = "<|endoftext|>";
    c["split_special_tokens"] = false;
    c["tokenizer_class"] = "Qwen2Tokenizer";
    c["unk_token"] = nullptr;
  }
  return c.dump(2) + "\n";
}

std::string make_generation_config_json(const ModelPreset& p) {
  ojson c;
  c["bos_token_id"] = p.bos_token_id;
  c["do_sample"] = true;
  c["eos_token_id"] = eos_json(p);
  c["temperature"] = 0.6;
  c["top_p"] = 0.9;
  c["transformers_version"] = p.model_type == "llama" ? "4.45.0" : "4.51.0";
  return c.dump(2) + "\n";
}

std::uint64_t default_max_shard_bytes(const ModelPreset& p) {
  return p.tiny ? 100'000ull : 5'000'000'000ull;
}

}  // namespace mergepipe::synth
