#pragma once
// Synthetic catalogs for the planner tests: built from explicit fp32 deltas (statistics and
// sketches computed exactly as the catalog builder does), or from random statistics for
// model-sized catalogs whose deltas would not fit in memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/block_stats.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/merge_spec.hpp"

namespace mergepipe::test {

inline std::string test_base_dir() {
  return "/mergepipe-test-family/base";
}
inline std::string test_expert_dir(std::size_t k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/mergepipe-test-family/expert%02zu", k);
  return buf;
}

// A catalog skeleton (tensors, blocking, folders) with `experts` experts and no statistics.
inline Catalog catalog_skeleton(const std::vector<TensorInfo>& tensors, std::size_t experts,
                                std::uint64_t block_bytes) {
  Catalog c;
  c.family_id = "test-family";
  c.base.dir = test_base_dir();
  c.tensors = tensors;
  c.blocking = make_blocking(tensors, block_bytes);
  c.experts.resize(experts);
  for (std::size_t k = 0; k < experts; ++k) {
    c.experts[k].location.dir = test_expert_dir(k);
    c.experts[k].blocks.resize(c.block_count());
  }
  return c;
}

// deltas[k][t]: expert k's fp32 deltas of tensor t (numel entries). Sketches (512 KiB each)
// are only built when asked for: only TIES needs them.
inline Catalog catalog_from_deltas(const std::vector<TensorInfo>& tensors,
                                   std::uint64_t block_bytes,
                                   const std::vector<std::vector<std::vector<float>>>& deltas,
                                   bool with_sketches = true) {
  Catalog c = catalog_skeleton(tensors, deltas.size(), block_bytes);
  for (std::size_t k = 0; k < deltas.size(); ++k) {
    ExpertCatalog& e = c.experts[k];
    e.sketches.resize(tensors.size());
    for (std::size_t t = 0; t < tensors.size() && with_sketches; ++t) {
      e.sketches[t].add(deltas[k][t].data(), deltas[k][t].size());
    }
    for (std::size_t b = 0; b < c.block_count(); ++b) {
      const Block& blk = c.blocking.blocks[b];
      std::span<const float> d(deltas[k][blk.tensor].data() + blk.elem_begin, blk.elem_count);
      e.blocks[b] = compute_block_stats(d, std::as_bytes(d));
    }
  }
  return c;
}

inline MergeSpec spec_for(const Catalog& c, MergeMethod method, const std::vector<double>& weights,
                          const std::vector<double>& densities) {
  MergeSpec s;
  s.method = method;
  s.base_model = c.base.dir;
  for (std::size_t k = 0; k < weights.size(); ++k) {
    s.experts.push_back(
        {c.experts[k].location.dir, weights[k], densities.empty() ? 1.0 : densities[k]});
  }
  return s;
}

// Llama-3.1-8B's 291 tensors in module order (checkpoints.md: 16,060,522,496 bf16 bytes).
inline std::vector<TensorInfo> llama31_8b_tensors() {
  const std::uint64_t h = 4096, inter = 14336, kv = 1024, vocab = 128256;
  std::vector<TensorInfo> t;
  t.push_back({"model.embed_tokens.weight", DType::kBF16, {vocab, h}});
  for (int l = 0; l < 32; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "self_attn.q_proj.weight", DType::kBF16, {h, h}});
    t.push_back({p + "self_attn.k_proj.weight", DType::kBF16, {kv, h}});
    t.push_back({p + "self_attn.v_proj.weight", DType::kBF16, {kv, h}});
    t.push_back({p + "self_attn.o_proj.weight", DType::kBF16, {h, h}});
    t.push_back({p + "mlp.gate_proj.weight", DType::kBF16, {inter, h}});
    t.push_back({p + "mlp.up_proj.weight", DType::kBF16, {inter, h}});
    t.push_back({p + "mlp.down_proj.weight", DType::kBF16, {h, inter}});
    t.push_back({p + "input_layernorm.weight", DType::kBF16, {h}});
    t.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {h}});
  }
  t.push_back({"model.norm.weight", DType::kBF16, {h}});
  t.push_back({"lm_head.weight", DType::kBF16, {vocab, h}});
  return t;
}

// Plausible statistics for a block of n entries whose deltas have RMS `rms` and a fraction
// `changed` of non-zero entries: l2, nonzero, and the sum of squares spread over the octaves
// of a Gaussian's magnitudes (about 3 octaves below the RMS to 2 above).
inline BlockStats random_block_stats(std::uint64_t n, double rms, double changed,
                                     std::mt19937_64& rng) {
  BlockStats s;
  s.nonzero = static_cast<std::uint64_t>(std::llround(changed * static_cast<double>(n)));
  if (s.nonzero == 0 || rms <= 0) {
    s.nonzero = 0;
    return s;
  }
  const double sumsq = rms * rms * static_cast<double>(s.nonzero);
  s.l2 = std::sqrt(sumsq);
  const int top = norm_octave(static_cast<float>(rms));
  const double shares[] = {0.02, 0.08, 0.25, 0.40, 0.20, 0.05};  // octaves top-3 .. top+2
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  double placed = 0;
  for (int i = 0; i < 6; ++i) {
    const int o = std::clamp(top - 3 + i, 0, kNormOctaves - 1);
    const double part = i == 5 ? sumsq - placed : shares[i] * sumsq * jitter(rng);
    s.octave_sumsq[static_cast<std::size_t>(o)] += static_cast<float>(std::max(0.0, part));
    placed += part;
  }
  s.max_abs = static_cast<float>(4 * rms);
  return s;
}

}  // namespace mergepipe::test
