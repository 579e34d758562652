#pragma once
// Mask-aware merge operators Ψ_op of SPEC §3, applied to one run of consecutive elements of one
// tensor. Pure arithmetic (no I/O). docs/operators.md gives the exact semantics.
//
// Everything is fp32 with a fixed order: experts are visited k = 0..K-1 and each output element
// depends only on that element's inputs, so any split of a tensor over blocks, chunks, ranks or
// threads gives the same bits.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "mergepipe/dare_mask.hpp"  // dare_keep and the generator behind it
#include "mergepipe/merge_spec.hpp"

namespace mergepipe {

struct OperatorConfig {
  MergeMethod method = MergeMethod::kLinear;
  bool normalize = true;  // effective value (MergeSpec::effective_normalize)
  double lambda = 1.0;
  std::vector<float> weights;    // w_k per expert (plan order)
  std::vector<float> densities;  // per expert, in (0, 1]
  std::uint64_t seed = 0;
  bool rescale = true;    // DARE: kept deltas divided by the density (mergekit's `rescale`)
  float t = 0;            // nearswap's threshold
  float base_weight = 0;  // linear: the base's weight in the average (0: not averaged)
  float scale = 1;        // passthrough: out = scale·θ0
  bool base_is_reference = false;  // no base_model: θ0 is the config's first model
  int max_iter = 10;               // karcher
  double tol = 1e-5;               // karcher
  double eps = 1e-8;               // multislerp
  double ram_epsilon = 1e-5;       // ram: |Δ| above it makes an expert take part in an entry
  // The methods of uses_tensor_statistics (slerp, model_stock, karcher, multislerp):
  // out = base_scale·θ0 + Σ alpha_k Δ_k, set per tensor from that tensor's Gram
  // (tensor_statistics.hpp) before any of its blocks is merged. merge_block refuses them
  // without it.
  struct LinearForm {
    float base_scale = 1;
    std::vector<float> alpha;  // per expert
    bool operator==(const LinearForm&) const = default;
  };
  std::optional<LinearForm> linear_form;

  static OperatorConfig from_spec(const MergeSpec& spec);
  std::size_t expert_count() const { return weights.size(); }
};

// Per-tensor inputs that do not depend on blocking.
struct TensorContext {
  std::uint64_t name_key = 0;  // tensor_name_key(name): keys the DARE stream
  // Per expert, for the methods that trim by magnitude (trim_threshold_rows): ties the threshold
  // t_k (|Δ| >= t_k kept); breadcrumbs* K lower thresholds, then K upper ones (trim_band.hpp:
  // lower_k <= |Δ| < upper_k kept, upper 0 cuts nothing). Ignored by the other methods.
  std::span<const float> thresholds;
};

// Stable 64-bit key of a tensor name: XXH3-64 of its bytes with seed 0.
std::uint64_t tensor_name_key(std::string_view tensor_name);

// The per-expert scalars merge_block uses, derived from a config (exposed for tests and docs).
//  linear:          out = base_scale·θ0 + Σ alpha_k Δ_k
//  task_arithmetic: out = θ0 + Σ alpha_k Δ_k            (alpha_k = λ·w_k [/Σw])
//  dare_linear:     out = θ0 + Σ alpha_k Δ'_k            (same alpha as task_arithmetic)
//  breadcrumbs:     out = θ0 + Σ alpha_k Δ'_k            (Δ' the band-trimmed Δ)
//  ties, dare_ties, breadcrumbs_ties: v_k = w_k·Δ'_k, out = θ0 + lambda·merged
//  nearswap:        out = θ0 + w·Δ with w = min(1, t / max(|Δ|, 1e-6)) per element (one expert)
//  passthrough:     out = scale·θ0 (no expert; scale 1 copies the bits)
//  ram:             out = θ0 + (Σ_k Δ_k [|Δ_k| > ε]) / max(1, Σ_k [|Δ_k| > ε]) per element
//  slerp, model_stock, karcher, multislerp:
//                   out = base_scale·θ0 + Σ alpha_k Δ_k, the tensor's linear_form
// Sums and quotients are formed in double from the fp32 weights, then rounded once to fp32.
struct OperatorScalars {
  float base_scale = 1.0f;
  std::vector<float> alpha;
  float lambda = 1.0f;
};
OperatorScalars operator_scalars(const OperatorConfig& cfg);

// Merges n consecutive elements of one tensor starting at element index elem_begin.
// base[i] = θ0 (fp32); deltas[k] = pointer to n fp32 deltas Δ_k = float(θ_k) - float(θ0), or
// nullptr when the pair (k, block) is omitted by the access mask (Δ treated as 0, coefficients
// unchanged: no renormalisation over what was read). A delta of n exact +0 values gives the same
// bits as nullptr, which lets callers skip experts that leave a stretch unchanged (zero_delta.hpp).
// out[i] = merged fp32 value; out may alias
// base. Throws std::invalid_argument only on input a validated spec cannot produce: spans that
// do not match the config, a NaN TIES threshold, normalize with Σw = 0 (linear, task_arithmetic,
// dare_linear).
void merge_block(const OperatorConfig& cfg, const TensorContext& tensor, std::uint64_t elem_begin,
                 std::size_t n, const float* base, std::span<const float* const> deltas,
                 float* out);

}  // namespace mergepipe
