#include "mergepipe/operators.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mergepipe/hash.hpp"

namespace mergepipe {

namespace {

// Elements per inner pass: the per-chunk accumulators stay in L1 while the experts' slices are
// streamed once.
constexpr std::size_t kChunk = 1024;
// Experts folded into the accumulators per pass: each pass loads and stores the accumulators
// once for up to kGroup experts, added one after the other (so the order stays k = 0..K-1).
constexpr std::size_t kGroup = 4;

// The inner loops select with bit masks instead of `c ? x : 0.0f`: under GCC's default
// -ftrapping-math a conditional float multiply or an ordered compare stops if-conversion, and
// the loop would stay scalar. All of these are exact (they only pick bits).
inline std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}
inline std::uint32_t lane_mask(bool c) {
  return 0u - static_cast<std::uint32_t>(c);
}
inline float masked(float x, std::uint32_t mask) {
  return std::bit_cast<float>(bits(x) & mask);
}
// a where mask is all ones, else b.
inline float select(std::uint32_t mask, float a, float b) {
  return std::bit_cast<float>((bits(a) & mask) | (bits(b) & ~mask));
}

// How an expert's delta becomes its term, per method:
//   kPlain  c·Δ                          (linear, task_arithmetic)
//   kTrim   c·Δ where |Δ| >= t, else +0  (ties)
//   kDare   c·(Δ/density) where kept, else +0  (dare_*; density 1 keeps all and Δ/1 == Δ)
//   kBand   c·Δ where t <= |Δ| <= ceiling, else +0  (breadcrumbs*)
enum class TermKind { kPlain, kTrim, kDare, kBand };

// One read expert within a chunk.
struct ExpertTerm {
  const float* delta = nullptr;         // the chunk's Δ_k
  float coef = 0;                       // α_k (additive) or w_k (sign election)
  float weight = 0;                     // w_k, for the TIES divisor
  std::uint32_t trim = 0;               // |Δ| >= t as bit patterns (kTrim, kBand)
  std::uint32_t ceiling = 0x7fffffffu;  // |Δ| <= ceiling as bit patterns (kBand)
  float density = 1;                    // kDare
  const std::uint32_t* keep = nullptr;  // kDare: the chunk's keep mask
};

// The G terms of one element, in expert order, handed to `use(term, weight)`.
template <TermKind kKind, std::size_t G, typename Use>
inline void for_each_term(const float* const* d, const float* coef, const float* weight,
                          const std::uint32_t* trim, const std::uint32_t* ceiling,
                          const float* density, const std::uint32_t* const* keep, std::size_t i,
                          Use&& use) {
#pragma GCC unroll 4
  for (std::size_t j = 0; j < G; ++j) {
    float v;
    if constexpr (kKind == TermKind::kPlain) {
      v = coef[j] * d[j][i];
    } else if constexpr (kKind == TermKind::kTrim) {
      // |Δ| >= t on the bit patterns (same order for non-negative floats); both fit in int32,
      // so the compare is a signed one, which SSE2 has.
      const auto magnitude = static_cast<std::int32_t>(bits(d[j][i]) & 0x7fffffffu);
      v = masked(coef[j] * d[j][i], lane_mask(magnitude >= static_cast<std::int32_t>(trim[j])));
    } else if constexpr (kKind == TermKind::kBand) {
      const auto magnitude = static_cast<std::int32_t>(bits(d[j][i]) & 0x7fffffffu);
      v = masked(coef[j] * d[j][i],
                 lane_mask(magnitude >= static_cast<std::int32_t>(trim[j])) &
                     lane_mask(magnitude <= static_cast<std::int32_t>(ceiling[j])));
    } else {
      v = masked(coef[j] * (d[j][i] / density[j]), keep[j][i]);
    }
    use(v, weight[j]);
  }
}

// Unpacks G terms into local arrays so the compiler sees loop-invariant pointers and scalars.
template <std::size_t G>
struct GroupView {
  const float* d[G];
  float coef[G], weight[G], density[G];
  std::uint32_t trim[G], ceiling[G];
  const std::uint32_t* keep[G];
  explicit GroupView(const ExpertTerm* t) {
    for (std::size_t j = 0; j < G; ++j) {
      d[j] = t[j].delta;
      coef[j] = t[j].coef;
      weight[j] = t[j].weight;
      density[j] = t[j].density;
      trim[j] = t[j].trim;
      ceiling[j] = t[j].ceiling;
      keep[j] = t[j].keep;
    }
  }
};

// acc[i] += term_0 + ... (left to right).
template <TermKind kKind, std::size_t G>
void add_group(float* acc, std::size_t len, const ExpertTerm* terms) {
  const GroupView<G> g(terms);
  for (std::size_t i = 0; i < len; ++i) {
    float x = acc[i];
    for_each_term<kKind, G>(g.d, g.coef, g.weight, g.trim, g.ceiling, g.density, g.keep, i,
                            [&](float v, float) { x += v; });
    acc[i] = x;
  }
}

// Per-element sums of the sign election for one chunk, accumulated k = 0..K-1:
//   pos = Σ v_k [v_k > 0], neg = Σ v_k [v_k < 0], and the weights of each side.
// The elected sign is that of Σ_k v_k evaluated as pos + neg (a zero sum elects +), and
// merged = Σ_k v_k [agree] in expert order is then exactly pos (+) or neg (−): the same
// additions in the same order, non-agreeing terms being +0 (an exact no-op, as no accumulator
// can hold −0). One pass over the experts.
struct ElectionSums {
  float pos[kChunk];
  float neg[kChunk];
  float wpos[kChunk];
  float wneg[kChunk];

  void clear(std::size_t len) {
    for (float* a : {pos, neg, wpos, wneg}) std::fill_n(a, len, 0.0f);
  }
};

template <TermKind kKind, bool kWeights, std::size_t G>
void vote_group(ElectionSums& e, std::size_t len, const ExpertTerm* terms) {
  const GroupView<G> g(terms);
  for (std::size_t i = 0; i < len; ++i) {
    float p = e.pos[i], n = e.neg[i], wp = e.wpos[i], wn = e.wneg[i];
    for_each_term<kKind, G>(
        g.d, g.coef, g.weight, g.trim, g.ceiling, g.density, g.keep, i, [&](float v, float w) {
          // As int32, a float's bits are > 0 exactly when it is > +0, and
          // with the sign flipped exactly when it is < −0: zeros vote for
          // neither side.
          const std::uint32_t vb = bits(v);
          const std::uint32_t is_pos = lane_mask(static_cast<std::int32_t>(vb) > 0);
          const std::uint32_t is_neg = lane_mask(static_cast<std::int32_t>(vb ^ 0x80000000u) > 0);
          p += masked(v, is_pos);
          n += masked(v, is_neg);
          if constexpr (kWeights) {
            wp += masked(w, is_pos);
            wn += masked(w, is_neg);
          }
        });
    e.pos[i] = p;
    e.neg[i] = n;
    if constexpr (kWeights) {
      e.wpos[i] = wp;
      e.wneg[i] = wn;
    }
  }
}

// Calls fold(group, size) on consecutive groups of at most kGroup read experts (expert order),
// generating each DARE expert's keep mask for the chunk first.
template <typename Fold>
void for_each_group(std::vector<ExpertTerm>& terms, const std::vector<std::uint64_t>& dare_key,
                    const std::vector<std::uint64_t>& dare_threshold,
                    const std::vector<std::uint32_t>& term_expert, std::uint64_t index_begin,
                    std::size_t len, std::uint32_t (*keep)[kChunk], Fold&& fold) {
  for (std::size_t g0 = 0; g0 < terms.size(); g0 += kGroup) {
    const std::size_t size = std::min(kGroup, terms.size() - g0);
    if (!dare_key.empty()) {
      for (std::size_t j = 0; j < size; ++j) {
        const std::uint32_t k = term_expert[g0 + j];
        if (dare_threshold[k] >= (std::uint64_t{1} << 32)) {
          std::fill_n(keep[j], len, 0xFFFFFFFFu);  // density 1: keep all, no draws needed
        } else {
          dare_keep_mask(dare_key[k], index_begin, len, dare_threshold[k], keep[j]);
        }
        terms[g0 + j].keep = keep[j];
      }
    }
    fold(terms.data() + g0, size);
  }
}

template <std::size_t G = kGroup, typename Body>
void dispatch_group_size(std::size_t size, Body&& body) {
  if constexpr (G > 0) {
    if (size == G) return body(std::integral_constant<std::size_t, G>{});
    dispatch_group_size<G - 1>(size, body);
  }
}

// Everything merge_block derives from the config and tensor once per call.
struct CallPlan {
  TermKind kind = TermKind::kPlain;
  std::vector<ExpertTerm> terms;                        // read experts only, expert order
  std::vector<std::uint32_t> term_expert;               // expert index of each term
  std::vector<std::uint64_t> dare_key, dare_threshold;  // per expert; empty unless DARE
};

template <TermKind kKind>
void merge_additive(const CallPlan& plan, float base_scale, std::uint64_t elem_begin, std::size_t n,
                    const float* base, std::span<const float* const> deltas, float* out) {
  float acc[kChunk];
  std::uint32_t keep[kGroup][kChunk];
  std::vector<ExpertTerm> terms = plan.terms;
  for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::size_t len = std::min(kChunk, n - c0);
    std::fill_n(acc, len, 0.0f);  // omitted experts add nothing (acc starts +0, never −0)
    for (std::size_t t = 0; t < terms.size(); ++t)
      terms[t].delta = deltas[plan.term_expert[t]] + c0;
    for_each_group(terms, plan.dare_key, plan.dare_threshold, plan.term_expert, elem_begin + c0,
                   len, keep, [&](const ExpertTerm* group, std::size_t size) {
                     dispatch_group_size(size, [&](auto g) {
                       add_group<kKind, decltype(g)::value>(acc, len, group);
                     });
                   });
    const float* b = base + c0;
    float* o = out + c0;
    for (std::size_t i = 0; i < len; ++i) o[i] = base_scale * b[i] + acc[i];
  }
}

template <TermKind kKind, bool kNormalize>
void merge_sign_elected(const CallPlan& plan, float lambda, std::uint64_t elem_begin, std::size_t n,
                        const float* base, std::span<const float* const> deltas, float* out) {
  ElectionSums e;
  std::uint32_t keep[kGroup][kChunk];
  std::vector<ExpertTerm> terms = plan.terms;
  for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::size_t len = std::min(kChunk, n - c0);
    e.clear(len);  // omitted experts: v = 0, never agree, not in the divisor
    for (std::size_t t = 0; t < terms.size(); ++t)
      terms[t].delta = deltas[plan.term_expert[t]] + c0;
    for_each_group(terms, plan.dare_key, plan.dare_threshold, plan.term_expert, elem_begin + c0,
                   len, keep, [&](const ExpertTerm* group, std::size_t size) {
                     dispatch_group_size(size, [&](auto g) {
                       vote_group<kKind, kNormalize, decltype(g)::value>(e, len, group);
                     });
                   });
    const float* b = base + c0;
    float* o = out + c0;
    for (std::size_t i = 0; i < len; ++i) {
      // + elected unless pos + neg is negative and non-zero
      const std::uint32_t sb = bits(e.pos[i] + e.neg[i]);
      const std::uint32_t plus =
          lane_mask(((sb >> 31) & static_cast<std::uint32_t>((sb << 1) != 0)) == 0);
      float merged = select(plus, e.pos[i], e.neg[i]);
      if constexpr (kNormalize) {
        const float q = select(plus, e.wpos[i], e.wneg[i]);
        merged = merged / select(lane_mask((bits(q) << 1) == 0), 1.0f, q);  // 0 counts as 1
      }
      o[i] = b[i] + lambda * merged;
    }
  }
}

// The merge loops compiled for the baseline ISA and for AVX2/AVX-512, picked at load time (as
// the dtype kernels): each entry point inlines its whole loop nest, so every clone is vectorised
// for its ISA. The results are bit-identical: element-wise operations in the same order, and
// -ffp-contract=off keeps a*b+c from becoming an FMA.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MERGEPIPE_OPERATOR_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
#else
#define MERGEPIPE_OPERATOR_KERNEL
#endif

MERGEPIPE_OPERATOR_KERNEL void additive_plain(const CallPlan& plan, float base_scale,
                                              std::uint64_t elem_begin, std::size_t n,
                                              const float* base,
                                              std::span<const float* const> deltas, float* out) {
  merge_additive<TermKind::kPlain>(plan, base_scale, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void additive_dare(const CallPlan& plan, float base_scale,
                                             std::uint64_t elem_begin, std::size_t n,
                                             const float* base,
                                             std::span<const float* const> deltas, float* out) {
  merge_additive<TermKind::kDare>(plan, base_scale, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_trim(const CallPlan& plan, float lambda,
                                            std::uint64_t elem_begin, std::size_t n,
                                            const float* base, std::span<const float* const> deltas,
                                            float* out) {
  merge_sign_elected<TermKind::kTrim, false>(plan, lambda, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_trim_normalized(const CallPlan& plan, float lambda,
                                                       std::uint64_t elem_begin, std::size_t n,
                                                       const float* base,
                                                       std::span<const float* const> deltas,
                                                       float* out) {
  merge_sign_elected<TermKind::kTrim, true>(plan, lambda, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void additive_band(const CallPlan& plan, float base_scale,
                                             std::uint64_t elem_begin, std::size_t n,
                                             const float* base,
                                             std::span<const float* const> deltas, float* out) {
  merge_additive<TermKind::kBand>(plan, base_scale, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_band(const CallPlan& plan, float lambda,
                                            std::uint64_t elem_begin, std::size_t n,
                                            const float* base, std::span<const float* const> deltas,
                                            float* out) {
  merge_sign_elected<TermKind::kBand, false>(plan, lambda, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_band_normalized(const CallPlan& plan, float lambda,
                                                       std::uint64_t elem_begin, std::size_t n,
                                                       const float* base,
                                                       std::span<const float* const> deltas,
                                                       float* out) {
  merge_sign_elected<TermKind::kBand, true>(plan, lambda, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_dare(const CallPlan& plan, float lambda,
                                            std::uint64_t elem_begin, std::size_t n,
                                            const float* base, std::span<const float* const> deltas,
                                            float* out) {
  merge_sign_elected<TermKind::kDare, false>(plan, lambda, elem_begin, n, base, deltas, out);
}
MERGEPIPE_OPERATOR_KERNEL void elected_dare_normalized(const CallPlan& plan, float lambda,
                                                       std::uint64_t elem_begin, std::size_t n,
                                                       const float* base,
                                                       std::span<const float* const> deltas,
                                                       float* out) {
  merge_sign_elected<TermKind::kDare, true>(plan, lambda, elem_begin, n, base, deltas, out);
}

// mergekit's nearswap: w = clamp(t / max(|θ0 − θ1|, 1e-6), 0, 1), out = w·θ1 + (1 − w)·θ0,
// written as θ0 + w·Δ (the same value up to fp32 rounding; |θ0 − θ1| is |Δ|). An omitted
// expert block (nullptr) leaves the base.
MERGEPIPE_OPERATOR_KERNEL void nearswap(float t, std::size_t n, const float* base,
                                        const float* delta, float* out) {
  if (delta == nullptr) {
    std::copy_n(base, n, out);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float distance = std::max(std::fabs(delta[i]), 1e-6f);
    const float w = std::min(t / distance, 1.0f);
    out[i] = base[i] + w * delta[i];
  }
}

// mergekit's ram: per entry, the mean of the deltas that move it by more than epsilon (the
// others take no part; none: the base). An entry one expert moves alone takes all of its delta.
// |Δ| > ε on the bit patterns (ε >= 0), and the delta times its 0/1 activity, so a NaN delta
// stays NaN as in mergekit; an omitted expert (nullptr) or a zero delta is never active.
MERGEPIPE_OPERATOR_KERNEL void ram_mean(float epsilon, std::size_t n, const float* base,
                                        std::span<const float* const> deltas, float* out) {
  float acc[kChunk], count[kChunk];
  const auto limit = static_cast<std::int32_t>(bits(epsilon) & 0x7fffffffu);
  for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::size_t len = std::min(kChunk, n - c0);
    std::fill_n(acc, len, 0.0f);
    std::fill_n(count, len, 0.0f);
    for (const float* delta : deltas) {
      if (delta == nullptr) continue;
      const float* d = delta + c0;
      for (std::size_t i = 0; i < len; ++i) {
        const auto magnitude = static_cast<std::int32_t>(bits(d[i]) & 0x7fffffffu);
        const float active = masked(1.0f, lane_mask(magnitude > limit));
        acc[i] += d[i] * active;
        count[i] += active;
      }
    }
    const float* b = base + c0;
    float* o = out + c0;
    for (std::size_t i = 0; i < len; ++i)
      o[i] = b[i] + acc[i] / select(lane_mask(bits(count[i]) == 0), 1.0f, count[i]);
  }
}

}  // namespace

OperatorConfig OperatorConfig::from_spec(const MergeSpec& spec) {
  OperatorConfig cfg;
  cfg.method = spec.method;
  cfg.normalize = spec.effective_normalize();
  cfg.lambda = spec.lambda;
  cfg.seed = spec.seed;
  cfg.rescale = spec.effective_rescale();
  cfg.t = static_cast<float>(spec.t.value_or(0.0));
  cfg.base_weight = static_cast<float>(spec.base_weight.value_or(0.0) * spec.weight_scale());
  cfg.scale = static_cast<float>(spec.scale.value_or(1.0));
  cfg.base_is_reference = spec.base_is_reference;
  cfg.max_iter = static_cast<int>(spec.option("max_iter", cfg.max_iter));
  cfg.tol = spec.option("tol", cfg.tol);
  cfg.eps = spec.option("eps", cfg.eps);
  cfg.ram_epsilon = spec.option("epsilon", cfg.ram_epsilon);
  cfg.weights.reserve(spec.experts.size());
  cfg.densities.reserve(spec.experts.size());
  const double scale = spec.weight_scale();
  for (const ExpertSpec& e : spec.experts) {
    cfg.weights.push_back(static_cast<float>(e.weight * scale));
    cfg.densities.push_back(static_cast<float>(e.density));
  }
  return cfg;
}

std::uint64_t tensor_name_key(std::string_view tensor_name) {
  return hash64(tensor_name, 0);
}

OperatorScalars operator_scalars(const OperatorConfig& cfg) {
  OperatorScalars sc;
  if (uses_tensor_statistics(cfg.method)) {
    if (!cfg.linear_form || cfg.linear_form->alpha.size() != cfg.weights.size())
      throw std::invalid_argument("merge operator: " + std::string(merge_method_name(cfg.method)) +
                                  " needs the tensor's coefficients (from its statistics)");
    sc.base_scale = cfg.linear_form->base_scale;
    sc.alpha = cfg.linear_form->alpha;
    return sc;
  }
  double weight_sum = 0;
  for (float w : cfg.weights) weight_sum += static_cast<double>(w);
  if (cfg.method == MergeMethod::kLinear) weight_sum += static_cast<double>(cfg.base_weight);
  // Normalisation by Σw for the fixed-coefficient sums; TIES-style methods divide per element.
  const bool divide = cfg.normalize && !uses_sign_election(cfg.method);
  if (divide && weight_sum == 0.0) {
    throw std::invalid_argument("merge operator: normalize needs a non-zero sum of weights");
  }
  sc.lambda = static_cast<float>(cfg.lambda);
  sc.alpha.reserve(cfg.weights.size());
  for (float w : cfg.weights) {
    double a = static_cast<double>(w);
    if (cfg.method == MergeMethod::kLinear) {
      if (cfg.normalize) a /= weight_sum;
    } else {
      a *= cfg.lambda;
      if (divide) a /= weight_sum;  // ties, dare_ties: α_k = λ·w_k, unused by merge_block
    }
    sc.alpha.push_back(static_cast<float>(a));
  }
  sc.base_scale =
      cfg.method == MergeMethod::kLinear && !cfg.normalize ? static_cast<float>(weight_sum) : 1.0f;
  return sc;
}

void merge_block(const OperatorConfig& cfg, const TensorContext& tensor, std::uint64_t elem_begin,
                 std::size_t n, const float* base, std::span<const float* const> deltas,
                 float* out) {
  const std::size_t k_count = cfg.expert_count();
  if (deltas.size() != k_count || cfg.densities.size() != k_count) {
    throw std::invalid_argument("merge operator: " + std::to_string(deltas.size()) +
                                " delta slices, " + std::to_string(k_count) + " weights and " +
                                std::to_string(cfg.densities.size()) + " densities disagree");
  }
  const std::size_t rows = trim_threshold_rows(cfg.method);
  if (rows != 0 && tensor.thresholds.size() != rows * k_count) {
    throw std::invalid_argument(
        "merge operator: " + std::string(merge_method_name(cfg.method)) + " needs " +
        std::to_string(rows) + " threshold(s) per expert, got " +
        std::to_string(tensor.thresholds.size()) + " for " + std::to_string(k_count));
  }
  if (n == 0) return;
  if (cfg.method == MergeMethod::kPassthrough) {
    if (k_count != 0) throw std::invalid_argument("merge operator: passthrough takes no expert");
    if (cfg.scale == 1.0f) {
      std::copy_n(base, n, out);
    } else {
      for (std::size_t i = 0; i < n; ++i) out[i] = cfg.scale * base[i];
    }
    return;
  }
  if (cfg.method == MergeMethod::kNearswap) {
    if (k_count != 1) throw std::invalid_argument("merge operator: nearswap takes one expert");
    return nearswap(cfg.t, n, base, deltas[0], out);
  }
  if (cfg.method == MergeMethod::kRam)
    return ram_mean(static_cast<float>(cfg.ram_epsilon), n, base, deltas, out);
  const OperatorScalars sc = operator_scalars(cfg);
  const bool elect = uses_sign_election(cfg.method);
  CallPlan plan;
  plan.kind = uses_dare(cfg.method)             ? TermKind::kDare
              : uses_band_trim(cfg.method)      ? TermKind::kBand
              : uses_magnitude_trim(cfg.method) ? TermKind::kTrim
                                                : TermKind::kPlain;
  if (plan.kind == TermKind::kDare) {
    for (std::size_t k = 0; k < k_count; ++k) {
      plan.dare_key.push_back(
          dare_stream_key(cfg.seed, static_cast<std::uint32_t>(k), tensor.name_key));
      plan.dare_threshold.push_back(dare_keep_threshold(cfg.densities[k]));
    }
  }
  for (std::size_t k = 0; k < k_count; ++k) {
    if (deltas[k] == nullptr) continue;  // omitted by the access mask: absent
    ExpertTerm t;
    t.coef = elect ? cfg.weights[k] : sc.alpha[k];
    t.weight = cfg.weights[k];
    // Without rescale the kept deltas stay as they are (Δ/1 == Δ).
    t.density = plan.kind == TermKind::kDare && cfg.rescale ? cfg.densities[k] : 1.0f;
    if (plan.kind == TermKind::kTrim || plan.kind == TermKind::kBand) {
      const float th = tensor.thresholds[k];
      if (std::isnan(th)) throw std::invalid_argument("merge operator: a trim threshold is NaN");
      t.trim = th > 0.0f ? bits(th) : 0u;  // t <= 0 keeps everything
    }
    if (plan.kind == TermKind::kBand) {
      // The band's upper end, exclusive: 0 (or below) cuts nothing, NaN is refused.
      const float upper = tensor.thresholds[k_count + k];
      if (std::isnan(upper))
        throw std::invalid_argument("merge operator: an upper trim threshold is NaN");
      if (upper > 0.0f) t.ceiling = bits(upper) - 1u;
    }
    plan.terms.push_back(t);
    plan.term_expert.push_back(static_cast<std::uint32_t>(k));
  }
  switch (plan.kind) {
    case TermKind::kPlain:
      return additive_plain(plan, sc.base_scale, elem_begin, n, base, deltas, out);
    case TermKind::kTrim:
      return (cfg.normalize ? elected_trim_normalized : elected_trim)(plan, sc.lambda, elem_begin,
                                                                      n, base, deltas, out);
    case TermKind::kBand:
      if (!elect) return additive_band(plan, sc.base_scale, elem_begin, n, base, deltas, out);
      return (cfg.normalize ? elected_band_normalized : elected_band)(plan, sc.lambda, elem_begin,
                                                                      n, base, deltas, out);
    case TermKind::kDare:
      if (!elect) return additive_dare(plan, sc.base_scale, elem_begin, n, base, deltas, out);
      return (cfg.normalize ? elected_dare_normalized : elected_dare)(plan, sc.lambda, elem_begin,
                                                                      n, base, deltas, out);
  }
}

}  // namespace mergepipe
