#include "mergepipe/tensor_gram.hpp"

#include <algorithm>
#include <stdexcept>

namespace mergepipe {

double TensorGram::model_dot(std::size_t i, std::size_t j) const {
  // (θ0 + Δ_i)·(θ0 + Δ_j) with Δ_0 = 0: formed from the delta products, which keeps the small
  // deltas' contribution exact instead of cancelling it out of two large model norms.
  double d = at(0, 0);
  if (i > 0) d += at(0, i);
  if (j > 0) d += at(0, j);
  if (i > 0 && j > 0) d += at(i, j);
  return d;
}

TensorGram& TensorGram::operator+=(const TensorGram& part) {
  if (vectors == 0 && sums.empty()) {
    *this = part;
    return *this;
  }
  if (part.vectors != vectors) throw std::invalid_argument("tensor Gram: parts of other sizes");
  for (std::size_t p = 0; p < sums.size(); ++p) sums[p] += part.sums[p];
  return *this;
}

GramAccumulator::GramAccumulator(std::size_t experts)
    : vectors_(experts + 1), lanes_(gram_pair_count(experts + 1) * kLanes, 0.0) {}

namespace {

// Adds x·y_j of n elements to the lanes of `count` (<= 4) pairs, element e to lane
// (position + e) % 4 of each. Several pairs at once share the loads of x; each pair's lanes see
// the same additions in the same order however the pairs are grouped.
template <std::size_t kCount>
void add_tile(double* lanes, const double* x, const double* const* y, std::size_t n,
              std::uint64_t position) {
  constexpr std::size_t L = GramAccumulator::kLanes;
  std::size_t e = 0;
  for (; e < n && (position + e) % L != 0; ++e)
    for (std::size_t j = 0; j < kCount; ++j) lanes[j * L + (position + e) % L] += x[e] * y[j][e];
  double acc[kCount][L];
  for (std::size_t j = 0; j < kCount; ++j)
    for (std::size_t i = 0; i < L; ++i) acc[j][i] = lanes[j * L + i];
  for (; e + L <= n; e += L)
    for (std::size_t j = 0; j < kCount; ++j)
      for (std::size_t i = 0; i < L; ++i) acc[j][i] += x[e + i] * y[j][e + i];
  for (std::size_t j = 0; j < kCount; ++j)
    for (std::size_t i = 0; i < L; ++i) lanes[j * L + i] = acc[j][i];
  for (; e < n; ++e)
    for (std::size_t j = 0; j < kCount; ++j) lanes[j * L + (position + e) % L] += x[e] * y[j][e];
}

}  // namespace

void GramAccumulator::add_row(std::size_t a, std::size_t b_first, std::size_t b_count,
                              const double* x, const double* const* ys, std::size_t n,
                              std::uint64_t position) {
  double* lanes = lanes_.data() + gram_pair_index(vectors_, a, b_first) * kLanes;
  std::size_t j = 0;
  for (; j + 4 <= b_count; j += 4) add_tile<4>(lanes + j * kLanes, x, ys + j, n, position);
  switch (b_count - j) {
    case 3:
      return add_tile<3>(lanes + j * kLanes, x, ys + j, n, position);
    case 2:
      return add_tile<2>(lanes + j * kLanes, x, ys + j, n, position);
    case 1:
      return add_tile<1>(lanes + j * kLanes, x, ys + j, n, position);
    default:
      return;
  }
}

void GramAccumulator::add(const float* base, std::span<const float* const> deltas, std::size_t n) {
  if (deltas.size() + 1 != vectors_)
    throw std::invalid_argument("tensor Gram: wrong number of deltas");
  // Present vectors in double; a zero (nullptr) delta's products are zero: skipped.
  std::vector<std::vector<double>> wide;
  std::vector<std::size_t> index;
  for (std::size_t i = 0; i < vectors_; ++i) {
    const float* v = i == 0 ? base : deltas[i - 1];
    if (!v) continue;
    wide.emplace_back(v, v + n);
    index.push_back(i);
  }
  for (std::size_t r = 0; r < index.size(); ++r)
    for (std::size_t c = r; c < index.size(); ++c) {
      const double* y = wide[c].data();
      add_row(index[r], index[c], 1, wide[r].data(), &y, n, elements_);
    }
  elements_ += n;
}

TensorGram GramAccumulator::totals() const {
  TensorGram g(vectors_ - 1);
  for (std::size_t p = 0; p < g.sums.size(); ++p) {
    // Pairwise, in a fixed order.
    double level[kLanes];
    std::copy_n(lanes_.data() + p * kLanes, kLanes, level);
    for (std::size_t width = kLanes / 2; width > 0; width /= 2)
      for (std::size_t i = 0; i < width; ++i) level[i] = level[2 * i] + level[2 * i + 1];
    g.sums[p] = level[0];
  }
  return g;
}

}  // namespace mergepipe
