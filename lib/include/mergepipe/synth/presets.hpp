#pragma once
// Model presets for `mergepipe synth`: real architectures' tensor names, shapes (linear weights
// are [out, in]) and module order, plus the text of the small JSON files a Hugging Face folder
// carries. Pure data: no file I/O here.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mergepipe/dtype.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe::synth {

struct ModelPreset {
  std::string name;          // preset name ("qwen3-0.6b")
  std::string architecture;  // "Qwen3ForCausalLM"
  std::string model_type;    // "qwen3", "qwen2", "llama"
  std::uint64_t hidden_size = 0;
  std::uint64_t intermediate_size = 0;
  std::uint64_t num_layers = 0;
  std::uint64_t num_heads = 0;
  std::uint64_t num_kv_heads = 0;
  std::uint64_t head_dim = 0;
  std::uint64_t vocab_size = 0;
  std::uint64_t max_position_embeddings = 0;
  bool qk_norm = false;              // per-layer q_norm / k_norm of size head_dim (Qwen3)
  bool qkv_bias = false;             // q/k/v projection biases (Qwen2.5)
  bool tie_word_embeddings = false;  // config flag
  bool stores_lm_head = true;        // lm_head.weight present in the files (tied Qwen3 stores it)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  std::int64_t bos_token_id = 0;
  std::vector<std::int64_t> eos_token_ids;  // one id is written as a number, several as a list
  bool tiny = false;                        // test-sized: small default shard size
};

// What a tensor is in the model; the generator picks value statistics and deltas by role.
enum class TensorRole : std::uint8_t {
  kEmbed,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kQBias,
  kKBias,
  kVBias,
  kQNorm,
  kKNorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kInputNorm,
  kPostAttentionNorm,
  kFinalNorm,
  kLmHead,
};

struct SynthTensor {
  TensorInfo info;
  TensorRole role = TensorRole::kEmbed;
  int layer = -1;  // decoder layer, -1 for embed / final norm / lm_head
};

// Names accepted by find_preset, in a stable order.
std::vector<std::string> preset_names();
// The preset called `name`; UsageError naming it (and listing the valid ones) otherwise.
ModelPreset find_preset(std::string_view name);

// Scales a preset down (or up): `layers` replaces the layer count; `hidden` replaces the hidden
// size, keeping head_dim and scaling heads, kv heads (kept a divisor of heads) and the
// intermediate size by the same ratio; `vocab` replaces the vocabulary size (embed_tokens and
// lm_head rows: most of a scaled-down model's bytes otherwise). UsageError for out-of-range values.
ModelPreset scale_preset(ModelPreset preset, std::optional<std::uint64_t> layers,
                         std::optional<std::uint64_t> hidden,
                         std::optional<std::uint64_t> vocab = std::nullopt);

// Every tensor of the model in module order (embed, layers 0..L-1, norm, lm_head), all of
// `dtype`.
std::vector<SynthTensor> model_tensors(const ModelPreset& preset, DType dtype);

// config.json, tokenizer_config.json and generation_config.json text for the preset.
std::string make_config_json(const ModelPreset& preset, DType dtype);
std::string make_tokenizer_config_json(const ModelPreset& preset);
std::string make_generation_config_json(const ModelPreset& preset);

// Default maximum shard size: transformers' 5 GB for real presets, 100 kB for tiny ones so that
// tests exercise sharding.
std::uint64_t default_max_shard_bytes(const ModelPreset& preset);

}  // namespace mergepipe::synth
