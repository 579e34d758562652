#pragma once
// The Gram matrix of one tensor's vectors v_0 = θ0 (the base) and v_k = Δ_k (expert k's delta):
// every dot product v_i·v_j over the tensor's elements, in fp64. The methods whose coefficients
// depend on whole-tensor geometry (slerp, model_stock, karcher, multislerp) need nothing else,
// since their outputs are linear in the models: the products are accumulated block by block in
// one read, the coefficients decided per tensor, and then its blocks merged (no tensor is ever
// held whole).
//
// Determinism: a block's sums are accumulated by a GramAccumulator in four lanes by element
// position (element p goes to lane p % 4) and the lanes added in a fixed order at the end, so
// they do not depend on how the block was sliced, threaded or which rank read it; a tensor's
// Gram is its blocks' sums added in block order. Each product of two fp32 values is exact in
// fp64, so fused or separate multiply-adds give the same bits.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mergepipe {

// Index of pair (i, j), i <= j, in the upper triangle of an n × n symmetric matrix, row-major.
constexpr std::size_t gram_pair_index(std::size_t n, std::size_t i, std::size_t j) {
  return i * n - i * (i + 1) / 2 + j;
}
constexpr std::size_t gram_pair_count(std::size_t n) {
  return n * (n + 1) / 2;
}

// The sums of a tensor (or of a part of it: parts add).
struct TensorGram {
  TensorGram() = default;
  explicit TensorGram(std::size_t experts)
      : vectors(experts + 1), sums(gram_pair_count(experts + 1), 0.0) {}
  std::size_t vectors = 0;   // experts + 1
  std::vector<double> sums;  // upper triangle, gram_pair_index order
  std::size_t experts() const { return vectors ? vectors - 1 : 0; }
  // v_i·v_j (v_0 = θ0, v_k = Δ_k).
  double at(std::size_t i, std::size_t j) const {
    return i <= j ? sums[gram_pair_index(vectors, i, j)] : sums[gram_pair_index(vectors, j, i)];
  }
  // θ_i·θ_j of the models themselves: θ_0 = θ0, θ_k = θ0 + Δ_k.
  double model_dot(std::size_t i, std::size_t j) const;
  TensorGram& operator+=(const TensorGram& part);
  bool operator==(const TensorGram&) const = default;
};

// One block's sums, accumulated slice by slice in element order.
class GramAccumulator {
 public:
  static constexpr std::size_t kLanes = 4;
  explicit GramAccumulator(std::size_t experts = 0);
  std::size_t vectors() const { return vectors_; }
  std::size_t pair_count() const { return gram_pair_count(vectors_); }
  // Adds Σ x[e]·y_j[e] over e < n to the pairs (a, b_first + j), j < b_count, for elements at
  // positions position + e of the block (x = v_a and y_j = v_{b_first + j} there, as doubles:
  // fp32 values widened, so every product is exact). Different pairs may be added concurrently.
  void add_row(std::size_t a, std::size_t b_first, std::size_t b_count, const double* x,
               const double* const* ys, std::size_t n, std::uint64_t position);
  // Adds n elements at position `elements()` to every pair: deltas[k] = nullptr when Δ_k is
  // zero there (its products are zero: skipped, which gives the same bits).
  void add(const float* base, std::span<const float* const> deltas, std::size_t n);
  // Elements added so far through add() (or declared through advance() by callers of add_row).
  std::uint64_t elements() const { return elements_; }
  void advance(std::uint64_t n) { elements_ += n; }
  // The block's sums: each pair's lanes added in lane order.
  TensorGram totals() const;

 private:
  std::size_t vectors_ = 0;
  std::uint64_t elements_ = 0;
  std::vector<double> lanes_;  // [pair][lane]
};

}  // namespace mergepipe
