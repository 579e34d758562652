#pragma once
// Deterministic values of a synthetic checkpoint family: one base and K experts whose deltas
// look like real fine-tunes (see shared/reference/checkpoints.md, "What fine-tuning deltas look
// like"). Every value comes from a counter-based generator keyed by (seed, model, tensor name,
// element or row index), so any split of the work over threads or chunks gives the same bytes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mergepipe/dtype.hpp"
#include "mergepipe/synth/presets.hpp"

namespace mergepipe::synth {

// How an expert differs from the base.
//  full:    dense delta everywhere (low-rank part + gaussian + sparse spikes), per-layer norm
//           profile, relative Frobenius norm 1e-3..1e-2, larger on q/k and mid-layer MLPs.
//  lora:    merged LoRA: q_proj and v_proj change by an exact rank-r product B·A, nothing else.
//  partial: full-style deltas on the top layers only (the bottom ones were frozen).
//  vocab:   only some rows of embed_tokens (and of a stored lm_head) change: sampled tokens plus
//           the trailing rows of newly added tokens.
//  rl:      sparse: 5-30% of the entries of every layer matrix change, nearly full rank.
enum class ExpertKind : std::uint8_t { kFull, kLora, kPartial, kVocab, kRl };

std::string_view kind_name(ExpertKind kind);
std::optional<ExpertKind> parse_kind(std::string_view name);
// Parses a comma-separated list ("full,lora,rl"); UsageError naming a bad or empty entry.
std::vector<ExpertKind> parse_kind_list(std::string_view list);
// The cycle used when none is given: full, lora, rl, partial, vocab.
const std::vector<ExpertKind>& default_kinds();

struct FamilyOptions {
  ModelPreset preset;
  DType dtype = DType::kBF16;
  std::uint64_t seed = 0;
  int experts = 0;
  std::vector<ExpertKind> kinds;  // cycled over the experts; empty means default_kinds()
};

// What one expert changes; drawn from (seed, expert index) before any value is generated.
struct ExpertSpec {
  int index = 0;
  ExpertKind kind = ExpertKind::kFull;
  double strength = 1.0;       // full, partial, lora: scales every delta norm
  int rank = 0;                // full: rank of the low-rank part; lora: r
  int first_layer = 0;         // partial: layers >= first_layer change
  double density = 0.0;        // rl: fraction of entries changed; vocab: fraction of rows
  std::uint64_t new_rows = 0;  // vocab: trailing (added-token) rows that always change
  std::vector<bool> touches;   // per tensor: whether the delta is non-zero there
};

// Per-thread working memory for FamilyGenerator::generate_rows (reused across calls).
struct GeneratorScratch {
  std::vector<float> base, values, a, lowrank;
};

class FamilyGenerator {
 public:
  // UsageError for a non-mergeable dtype or a negative / absurd expert count.
  explicit FamilyGenerator(FamilyOptions options);

  const FamilyOptions& options() const noexcept { return options_; }
  const std::vector<SynthTensor>& tensors() const noexcept { return tensors_; }
  std::vector<TensorInfo> tensor_infos() const;
  const std::vector<ExpertSpec>& experts() const noexcept { return experts_; }

  // A tensor is generated as rows x cols (a 1-D tensor is one row).
  std::uint64_t rows(std::size_t t) const;
  std::uint64_t cols(std::size_t t) const;

  // Generates rows [row_begin, row_end) of tensor t. Writes the base's stored bytes to
  // `base_out` and, for every expert e that touches t and whose `expert_out[e]` is non-empty,
  // that expert's stored bytes: round(stored base as fp32 + delta). Experts that do not touch t
  // are left alone: their bytes are the base's (copy them). Spans must hold
  // (row_end - row_begin) * cols(t) elements of the family dtype.
  void generate_rows(std::size_t t, std::uint64_t row_begin, std::uint64_t row_end,
                     std::span<std::byte> base_out,
                     std::span<const std::span<std::byte>> expert_out,
                     GeneratorScratch& scratch) const;

  // Stored bytes of a whole tensor of one model (model -1 = base, otherwise an expert index).
  std::vector<std::byte> tensor_bytes(int model, std::size_t t) const;

 private:
  void add_delta(const ExpertSpec& e, std::size_t t, std::uint64_t row_begin, std::uint64_t row_end,
                 float* values, GeneratorScratch& scratch) const;

  FamilyOptions options_;
  std::vector<SynthTensor> tensors_;
  std::vector<std::size_t> value_source_;  // tensor whose values t repeats (tied lm_head)
  std::vector<std::uint64_t> name_hash_;   // of value_source_'s name
  std::uint64_t row_select_hash_ = 0;      // embed name: vocab experts pick the same rows
  std::vector<ExpertSpec> experts_;
};

// Number of elements whose stored bytes differ between `a` and `b` (same dtype and length).
std::uint64_t count_changed_elements(DType dtype, std::span<const std::byte> a,
                                     std::span<const std::byte> b);

// Folder name of expert `index` in a family of `count`: expert00, expert01, ... (more digits
// when count > 100).
std::string expert_dir_name(int index, int count);

// family.json: preset, shape, dtype, seed, and per expert its kind, parameters and the tensors
// whose stored bytes differ from the base (with changed element counts, [expert][tensor]).
std::string make_family_json(const FamilyGenerator& family,
                             const std::vector<std::vector<std::uint64_t>>& changed_elements);

}  // namespace mergepipe::synth
