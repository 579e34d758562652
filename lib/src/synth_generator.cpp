#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/synth/generator.hpp"

namespace mergepipe::synth {

namespace {

using ojson = nlohmann::ordered_json;

// ---- Counter-based random numbers -------------------------------------------------------------
// splitmix64: draw(key, i) is the i-th output of the stream seeded by key, computable for any i
// on its own, so values never depend on how the work is split.
constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline std::uint64_t draw(std::uint64_t key, std::uint64_t i) {
  return mix64(key + (i + 1) * kGolden);
}

enum class Stream : std::uint64_t {
  kBaseValues = 1,
  kNoise,
  kLowRankA,
  kLowRankB,
  kLoraA,
  kLoraB,
  kRows,
  kRl,
  kParams
};

// model -1 is the base, e >= 0 expert e.
std::uint64_t stream_key(std::uint64_t seed, int model, std::uint64_t name_hash, Stream s) {
  std::uint64_t k = mix64(seed ^ 0x5eed5eed5eed5eedull);
  k = mix64(k ^ (static_cast<std::uint64_t>(model + 1) * kGolden));
  k = mix64(k ^ name_hash);
  return mix64(k ^ (static_cast<std::uint64_t>(s) * 0xd1b54a32d192ed03ull));
}

// Gaussian-like draws: sums of 16-bit uniforms (Irwin-Hall), mean 0, standard deviation 1.
// Cheap, vectorisable and exactly reproducible (integer sums, one rounding).
inline float gauss4(std::uint64_t h) {
  const std::uint64_t s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
  return (static_cast<float>(s) - 131070.0f) * (1.0f / 37837.227f);  // sd of the sum: 65536/sqrt(3)
}
// Uses bits 0..47 only; bits 48..63 stay free for a second decision.
inline float gauss3(std::uint64_t h) {
  const std::uint64_t s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff);
  return (static_cast<float>(s) - 98302.5f) * (1.0f / 32768.0f);  // sd of the sum: 65536/2
}
inline double uniform01(std::uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1p-53;
}

// ---- What the tensors look like -----------------------------------------------------------------
bool is_norm(TensorRole r) {
  return r == TensorRole::kQNorm || r == TensorRole::kKNorm || r == TensorRole::kInputNorm ||
         r == TensorRole::kPostAttentionNorm || r == TensorRole::kFinalNorm;
}
bool is_bias(TensorRole r) {
  return r == TensorRole::kQBias || r == TensorRole::kKBias || r == TensorRole::kVBias;
}
bool is_layer_matrix(TensorRole r) {
  switch (r) {
    case TensorRole::kQProj:
    case TensorRole::kKProj:
    case TensorRole::kVProj:
    case TensorRole::kOProj:
    case TensorRole::kGateProj:
    case TensorRole::kUpProj:
    case TensorRole::kDownProj:
      return true;
    default:
      return false;
  }
}

// Base weights: matrices and embeddings ~N(0, 0.02^2), norms ~1 with small noise.
float base_mean(TensorRole r) {
  return is_norm(r) ? 1.0f : 0.0f;
}
float base_std(TensorRole r) {
  return is_bias(r) ? 0.05f : 0.02f;
}

// Target relative Frobenius norm of a full fine-tune's delta per tensor (before `strength`):
// q/k change most, MLPs peak mid-depth, attention grows slightly with depth.
constexpr double kFullRelative = 3e-3;
double full_relative(TensorRole r, int layer, std::uint64_t layers) {
  const double depth =
      layers > 1 ? static_cast<double>(layer) / static_cast<double>(layers - 1) : 0.5;
  const double mid = (static_cast<double>(layer) + 0.5) / static_cast<double>(layers) - 0.5;
  const double bump = std::exp(-0.5 * mid * mid / (0.2 * 0.2));
  switch (r) {
    case TensorRole::kQProj:
    case TensorRole::kKProj:
      return kFullRelative * 1.8 * (0.8 + 0.4 * depth);
    case TensorRole::kVProj:
    case TensorRole::kOProj:
      return kFullRelative * (0.8 + 0.4 * depth);
    case TensorRole::kGateProj:
    case TensorRole::kUpProj:
    case TensorRole::kDownProj:
      return kFullRelative * (1.0 + bump);
    case TensorRole::kEmbed:
    case TensorRole::kLmHead:
      return kFullRelative * 0.8;
    default:
      return kFullRelative * 0.5;  // norms, biases
  }
}
constexpr double kLoraRelative = 4e-3;    // of a 0.02-scale matrix
constexpr double kVocabRowStd = 1e-3;     // retrained embedding rows move by ~5% of their scale
constexpr float kRlStep = 1.0f / 256.0f;  // RL steps of 0.4-0.8 % of |w|: one bf16 step or more
constexpr std::uint64_t kSpikeThreshold = 66;  // of 65536: ~1e-3 of entries get a 6-sigma spike

bool touches(ExpertKind kind, const SynthTensor& t, int first_layer) {
  switch (kind) {
    case ExpertKind::kFull:
      return true;
    case ExpertKind::kLora:
      return t.role == TensorRole::kQProj || t.role == TensorRole::kVProj;
    case ExpertKind::kPartial:
      return t.layer >= first_layer;
    case ExpertKind::kVocab:
      return t.role == TensorRole::kEmbed || t.role == TensorRole::kLmHead;
    case ExpertKind::kRl:
      return is_layer_matrix(t.role);
  }
  return false;
}

}  // namespace

// ---- Kinds --------------------------------------------------------------------------------------
std::string_view kind_name(ExpertKind kind) {
  switch (kind) {
    case ExpertKind::kFull:
      return "full";
    case ExpertKind::kLora:
      return "lora";
    case ExpertKind::kPartial:
      return "partial";
    case ExpertKind::kVocab:
      return "vocab";
    case ExpertKind::kRl:
      return "rl";
  }
  return "?";
}

std::optional<ExpertKind> parse_kind(std::string_view name) {
  for (ExpertKind k : {ExpertKind::kFull, ExpertKind::kLora, ExpertKind::kPartial,
                       ExpertKind::kVocab, ExpertKind::kRl})
    if (kind_name(k) == name) return k;
  return std::nullopt;
}

std::vector<ExpertKind> parse_kind_list(std::string_view list) {
  std::vector<ExpertKind> kinds;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    const std::string_view item = list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const auto kind = parse_kind(item);
    if (!kind)
      throw UsageError("unknown expert kind '" + std::string(item) +
                       "' in --kinds (valid: full, lora, partial, vocab, rl)");
    kinds.push_back(*kind);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return kinds;
}

const std::vector<ExpertKind>& default_kinds() {
  static const std::vector<ExpertKind> kinds = {ExpertKind::kFull, ExpertKind::kLora,
                                                ExpertKind::kRl, ExpertKind::kPartial,
                                                ExpertKind::kVocab};
  return kinds;
}

// ---- Family -------------------------------------------------------------------------------------
FamilyGenerator::FamilyGenerator(FamilyOptions options) : options_(std::move(options)) {
  if (!is_mergeable(options_.dtype))
    throw UsageError("synth: cannot generate " + std::string(dtype_name(options_.dtype)) +
                     " weights");
  if (options_.experts < 0 || options_.experts > 10000)
    throw UsageError("synth: expert count " + std::to_string(options_.experts) +
                     " out of range (0..10000)");
  if (options_.kinds.empty()) options_.kinds = default_kinds();
  tensors_ = model_tensors(options_.preset, options_.dtype);

  const ModelPreset& p = options_.preset;
  std::size_t embed = 0;
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    if (tensors_[t].role == TensorRole::kEmbed) embed = t;
    // A tied lm_head stored in the file is a copy of the embedding, in the base and every expert.
    const bool tied_copy = tensors_[t].role == TensorRole::kLmHead && p.tie_word_embeddings;
    value_source_.push_back(tied_copy ? embed : t);
    name_hash_.push_back(hash64(tensors_[value_source_.back()].info.name));
  }
  row_select_hash_ = hash64(tensors_[embed].info.name);

  // Smallest dimension of q/v: a LoRA rank must not exceed it.
  std::uint64_t lora_cap = 16;
  for (const auto& t : tensors_)
    if (t.role == TensorRole::kQProj || t.role == TensorRole::kVProj)
      lora_cap = std::min({lora_cap, t.info.shape[0], t.info.shape[1]});

  const std::uint64_t layers = p.num_layers;
  for (int e = 0; e < options_.experts; ++e) {
    ExpertSpec spec;
    spec.index = e;
    spec.kind = options_.kinds[static_cast<std::size_t>(e) % options_.kinds.size()];
    const std::uint64_t k = stream_key(options_.seed, e, 0, Stream::kParams);
    auto u = [&](std::uint64_t i) { return uniform01(draw(k, i)); };
    spec.strength = 0.7 + 0.6 * u(0);
    switch (spec.kind) {
      case ExpertKind::kFull:
      case ExpertKind::kPartial:
        spec.rank = 4 + static_cast<int>(u(1) * 5.0);
        break;
      case ExpertKind::kLora: {
        const int ranks[] = {4, 8, 16};
        spec.rank = static_cast<int>(std::min<std::uint64_t>(
            lora_cap, static_cast<std::uint64_t>(ranks[static_cast<int>(u(1) * 3.0)])));
        break;
      }
      case ExpertKind::kVocab:
        spec.density = 0.01 + 0.04 * u(2);
        spec.new_rows = std::min<std::uint64_t>(16, p.vocab_size / 32);
        break;
      case ExpertKind::kRl:
        spec.density = 0.05 + 0.25 * u(2);
        break;
    }
    if (spec.kind == ExpertKind::kPartial) {
      // Top quarter to half of the layers; at least one layer stays frozen when there are two.
      const double top = std::round(static_cast<double>(layers) * (0.25 + 0.25 * u(3)));
      const std::uint64_t max_top = layers > 1 ? layers - 1 : 1;
      const std::uint64_t n_top =
          std::clamp<std::uint64_t>(static_cast<std::uint64_t>(top), 1, max_top);
      spec.first_layer = static_cast<int>(layers - n_top);
    }
    for (const auto& t : tensors_) spec.touches.push_back(touches(spec.kind, t, spec.first_layer));
    experts_.push_back(std::move(spec));
  }
}

std::vector<TensorInfo> FamilyGenerator::tensor_infos() const {
  std::vector<TensorInfo> v;
  for (const auto& t : tensors_) v.push_back(t.info);
  return v;
}

std::uint64_t FamilyGenerator::rows(std::size_t t) const {
  const auto& shape = tensors_.at(t).info.shape;
  return shape.size() >= 2 ? shape[0] : 1;
}

std::uint64_t FamilyGenerator::cols(std::size_t t) const {
  const auto& shape = tensors_.at(t).info.shape;
  if (shape.size() >= 2) return tensors_[t].info.numel() / shape[0];
  return shape.empty() ? 1 : shape[0];
}

void FamilyGenerator::generate_rows(std::size_t t, std::uint64_t row_begin, std::uint64_t row_end,
                                    std::span<std::byte> base_out,
                                    std::span<const std::span<std::byte>> expert_out,
                                    GeneratorScratch& scratch) const {
  if (t >= tensors_.size() || row_begin > row_end || row_end > rows(t))
    throw std::invalid_argument("generate_rows: rows out of range");
  const DType dtype = options_.dtype;
  const std::uint64_t c = cols(t);
  const std::size_t n = static_cast<std::size_t>((row_end - row_begin) * c);
  const std::size_t nbytes = n * dtype_size(dtype);
  if (base_out.size() != nbytes) throw std::invalid_argument("generate_rows: base buffer size");
  if (!expert_out.empty() && expert_out.size() != experts_.size())
    throw std::invalid_argument("generate_rows: one output per expert expected");

  const SynthTensor& src = tensors_[value_source_[t]];
  const std::uint64_t first = row_begin * c;
  scratch.base.resize(n);
  {
    const std::uint64_t key = stream_key(options_.seed, -1, name_hash_[t], Stream::kBaseValues);
    const float mean = base_mean(src.role), sd = base_std(src.role);
    float* b = scratch.base.data();
    for (std::size_t i = 0; i < n; ++i) b[i] = mean + sd * gauss4(draw(key, first + i));
  }
  // The stored base, and the fp32 values it decodes to (exact), which every expert starts from.
  convert_from_f32(dtype, scratch.base.data(), base_out.data(), n);
  convert_to_f32(dtype, base_out.data(), scratch.base.data(), n);

  for (std::size_t e = 0; e < expert_out.size(); ++e) {
    if (expert_out[e].empty() || !experts_[e].touches[t]) continue;
    if (expert_out[e].size() != nbytes)
      throw std::invalid_argument("generate_rows: expert buffer size");
    scratch.values.assign(scratch.base.begin(), scratch.base.end());
    add_delta(experts_[e], t, row_begin, row_end, scratch.values.data(), scratch);
    convert_from_f32(dtype, scratch.values.data(), expert_out[e].data(), n);
  }
}

void FamilyGenerator::add_delta(const ExpertSpec& e, std::size_t t, std::uint64_t row_begin,
                                std::uint64_t row_end, float* values,
                                GeneratorScratch& scratch) const {
  const SynthTensor& src = tensors_[value_source_[t]];
  const std::uint64_t c = cols(t);
  const std::size_t n = static_cast<std::size_t>((row_end - row_begin) * c);
  const std::uint64_t first = row_begin * c;
  const bool matrix = src.info.shape.size() == 2;
  auto key = [&](Stream s) { return stream_key(options_.seed, e.index, name_hash_[t], s); };

  // values[row, :] += scale * (b_row · A) for a rank-r product with gaussian factors.
  auto add_low_rank = [&](Stream a_stream, Stream b_stream, int r, float scale) {
    const std::uint64_t ka = key(a_stream), kb = key(b_stream);
    const auto ur = static_cast<std::uint64_t>(r);
    scratch.a.resize(static_cast<std::size_t>(ur * c));
    for (std::uint64_t i = 0; i < ur * c; ++i) scratch.a[i] = gauss4(draw(ka, i));
    scratch.lowrank.resize(static_cast<std::size_t>(c));
    for (std::uint64_t row = row_begin; row < row_end; ++row) {
      float* lr = scratch.lowrank.data();
      std::fill(lr, lr + c, 0.0f);
      for (std::uint64_t j = 0; j < ur; ++j) {
        const float bj = gauss4(draw(kb, row * ur + j)) * scale;
        const float* aj = scratch.a.data() + j * c;
        for (std::uint64_t col = 0; col < c; ++col) lr[col] += bj * aj[col];
      }
      float* v = values + (row - row_begin) * c;
      for (std::uint64_t col = 0; col < c; ++col) v[col] += lr[col];
    }
  };

  switch (e.kind) {
    case ExpertKind::kFull:
    case ExpertKind::kPartial: {
      const double scale_of_values = is_norm(src.role) ? 1.0 : base_std(src.role);
      const auto sigma = static_cast<float>(
          scale_of_values * full_relative(src.role, src.layer, options_.preset.num_layers) *
          e.strength);
      // Dense gaussian part with rare spikes; the low-rank part (matrices only) carries ~56 % of
      // the energy so the spectrum has a fast head and a long tail.
      const float noise_weight = matrix ? 0.66f : 1.0f;
      const std::uint64_t kn = key(Stream::kNoise);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t h = draw(kn, first + i);
        const float g = gauss3(h);
        const float spike = (h >> 48) < kSpikeThreshold ? std::copysign(6.0f, g) : 0.0f;
        values[i] += sigma * (noise_weight * g + spike);
      }
      if (matrix)
        add_low_rank(Stream::kLowRankA, Stream::kLowRankB, e.rank,
                     sigma * 0.75f / std::sqrt(static_cast<float>(e.rank)));
      break;
    }
    case ExpertKind::kLora: {
      const auto sigma = static_cast<float>(0.02 * kLoraRelative * e.strength);
      add_low_rank(Stream::kLoraA, Stream::kLoraB, e.rank,
                   sigma / std::sqrt(static_cast<float>(e.rank)));
      break;
    }
    case ExpertKind::kVocab: {
      // Rows picked by the embedding's name, so an untied lm_head retrains the same tokens.
      const std::uint64_t krow =
          stream_key(options_.seed, e.index, row_select_hash_, Stream::kRows);
      const auto threshold = static_cast<std::uint64_t>(e.density * 0x1p64);
      const std::uint64_t vocab = rows(t);
      const std::uint64_t kn = key(Stream::kNoise);
      for (std::uint64_t row = row_begin; row < row_end; ++row) {
        if (row + e.new_rows < vocab && draw(krow, row) >= threshold) continue;
        float* v = values + (row - row_begin) * c;
        for (std::uint64_t col = 0; col < c; ++col)
          v[col] += static_cast<float>(kVocabRowStd) * gauss3(draw(kn, row * c + col));
      }
      break;
    }
    case ExpertKind::kRl: {
      // Each selected entry moves by 0.4-0.8 % of its own magnitude: at least half a bf16 step, so
      // (ties aside) it always changes after rounding.
      const std::uint64_t kr = key(Stream::kRl);
      const auto threshold = static_cast<std::uint64_t>(e.density * 0x1p24);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t h = draw(kr, first + i);
        const float step = kRlStep * (1.0f + static_cast<float>(h & 0xffff) * (1.0f / 65536.0f));
        const float signed_step = (h >> 39) & 1 ? -step : step;
        values[i] += (h >> 40) < threshold ? values[i] * signed_step : 0.0f;
      }
      break;
    }
  }
}

std::vector<std::byte> FamilyGenerator::tensor_bytes(int model, std::size_t t) const {
  if (model < -1 || model >= static_cast<int>(experts_.size()))
    throw std::invalid_argument("tensor_bytes: no such model");
  const std::size_t nbytes = static_cast<std::size_t>(tensors_.at(t).info.nbytes());
  std::vector<std::byte> base(nbytes);
  std::vector<std::byte> mine(model >= 0 ? nbytes : 0);
  std::vector<std::span<std::byte>> outs(model >= 0 ? experts_.size() : 0);
  if (model >= 0) outs[static_cast<std::size_t>(model)] = mine;
  GeneratorScratch scratch;
  generate_rows(t, 0, rows(t), base, outs, scratch);
  if (model < 0 || !experts_[static_cast<std::size_t>(model)].touches[t]) return base;
  return mine;
}

std::uint64_t count_changed_elements(DType dtype, std::span<const std::byte> a,
                                     std::span<const std::byte> b) {
  if (a.size() != b.size()) throw std::invalid_argument("count_changed_elements: sizes differ");
  const std::size_t size = dtype_size(dtype);
  const std::size_t n = a.size() / size;
  std::uint64_t changed = 0;
  if (size == 2) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t x, y;
      std::memcpy(&x, a.data() + 2 * i, 2);
      std::memcpy(&y, b.data() + 2 * i, 2);
      changed += x != y;
    }
  } else {
    for (std::size_t i = 0; i < n; ++i)
      changed += std::memcmp(a.data() + size * i, b.data() + size * i, size) != 0;
  }
  return changed;
}

std::string expert_dir_name(int index, int count) {
  int digits = 2;
  for (int c = count - 1; c >= 100; c /= 10) ++digits;
  std::string number = std::to_string(index);
  if (number.size() < static_cast<std::size_t>(digits))
    number.insert(0, static_cast<std::size_t>(digits) - number.size(), '0');
  return "expert" + number;
}

std::string make_family_json(const FamilyGenerator& family,
                             const std::vector<std::vector<std::uint64_t>>& changed_elements) {
  const FamilyOptions& o = family.options();
  const ModelPreset& p = o.preset;
  const auto& tensors = family.tensors();
  if (changed_elements.size() != family.experts().size())
    throw std::invalid_argument("make_family_json: one change count row per expert expected");

  std::uint64_t elements = 0, bytes = 0;
  for (const auto& t : tensors) {
    elements += t.info.numel();
    bytes += t.info.nbytes();
  }
  ojson j;
  j["format"] = "mergepipe-synth-family";
  j["version"] = 1;
  j["preset"] = p.name;
  j["architecture"] = p.architecture;
  j["model_type"] = p.model_type;
  j["shape"] = {{"hidden_size", p.hidden_size},
                {"intermediate_size", p.intermediate_size},
                {"num_hidden_layers", p.num_layers},
                {"num_attention_heads", p.num_heads},
                {"num_key_value_heads", p.num_kv_heads},
                {"head_dim", p.head_dim},
                {"vocab_size", p.vocab_size},
                {"tie_word_embeddings", p.tie_word_embeddings},
                {"stores_lm_head", p.stores_lm_head}};
  j["dtype"] = std::string(dtype_name(o.dtype));
  j["seed"] = o.seed;
  ojson kinds = ojson::array();
  for (ExpertKind k : o.kinds) kinds.push_back(std::string(kind_name(k)));
  j["kinds"] = kinds;
  j["tensors"] = tensors.size();
  j["elements_per_model"] = elements;
  j["bytes_per_model"] = bytes;
  j["base"] = "base";
  ojson experts = ojson::array();
  const int count = static_cast<int>(family.experts().size());
  for (const ExpertSpec& e : family.experts()) {
    ojson x;
    x["name"] = expert_dir_name(e.index, count);
    x["kind"] = std::string(kind_name(e.kind));
    ojson params = ojson::object();
    switch (e.kind) {
      case ExpertKind::kFull:
        params["strength"] = e.strength;
        params["low_rank"] = e.rank;
        break;
      case ExpertKind::kPartial:
        params["strength"] = e.strength;
        params["low_rank"] = e.rank;
        params["first_layer"] = e.first_layer;
        break;
      case ExpertKind::kLora:
        params["strength"] = e.strength;
        params["rank"] = e.rank;
        params["targets"] = {"q_proj", "v_proj"};
        break;
      case ExpertKind::kVocab:
        params["row_fraction"] = e.density;
        params["new_rows"] = e.new_rows;
        break;
      case ExpertKind::kRl:
        params["density"] = e.density;
        break;
    }
    x["parameters"] = params;
    const auto& counts = changed_elements[static_cast<std::size_t>(e.index)];
    if (counts.size() != tensors.size())
      throw std::invalid_argument("make_family_json: one change count per tensor expected");
    ojson changed = ojson::object();
    std::uint64_t total = 0;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (counts[t] == 0) continue;
      changed[tensors[t].info.name] = counts[t];
      total += counts[t];
    }
    x["changed_tensor_count"] = changed.size();
    x["changed_elements"] = total;
    x["changed_fraction"] =
        elements ? static_cast<double>(total) / static_cast<double>(elements) : 0.0;
    x["changed_tensors"] = std::move(changed);
    experts.push_back(std::move(x));
  }
  j["experts"] = std::move(experts);
  return j.dump(2) + "\n";
}

}  // namespace mergepipe::synth
