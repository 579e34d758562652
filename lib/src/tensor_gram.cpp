#include "mergepipe/tensor_gram.hpp"

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

void GramAccumulator::add_pair(std::size_t pair, const float* x, const float* y, std::size_t n,
                               std::uint64_t position) {
  double* lane = lanes_.data() + pair * kLanes;
  std::size_t e = 0;
  // Up to the next multiple of four, then four lanes at a time (vectorisable), then the rest.
  for (; e < n && (position + e) % kLanes != 0; ++e)
    lane[(position + e) % kLanes] += static_cast<double>(x[e]) * static_cast<double>(y[e]);
  double l0 = lane[0], l1 = lane[1], l2 = lane[2], l3 = lane[3];
  for (; e + kLanes <= n; e += kLanes) {
    l0 += static_cast<double>(x[e]) * static_cast<double>(y[e]);
    l1 += static_cast<double>(x[e + 1]) * static_cast<double>(y[e + 1]);
    l2 += static_cast<double>(x[e + 2]) * static_cast<double>(y[e + 2]);
    l3 += static_cast<double>(x[e + 3]) * static_cast<double>(y[e + 3]);
  }
  lane[0] = l0;
  lane[1] = l1;
  lane[2] = l2;
  lane[3] = l3;
  for (; e < n; ++e)
    lane[(position + e) % kLanes] += static_cast<double>(x[e]) * static_cast<double>(y[e]);
}

void GramAccumulator::add(const float* base, std::span<const float* const> deltas, std::size_t n) {
  if (deltas.size() + 1 != vectors_)
    throw std::invalid_argument("tensor Gram: wrong number of deltas");
  const auto vector = [&](std::size_t i) { return i == 0 ? base : deltas[i - 1]; };
  for (std::size_t i = 0; i < vectors_; ++i) {
    if (!vector(i)) continue;
    for (std::size_t j = i; j < vectors_; ++j)
      if (vector(j)) add_pair(gram_pair_index(vectors_, i, j), vector(i), vector(j), n, elements_);
  }
  elements_ += n;
}

TensorGram GramAccumulator::totals() const {
  TensorGram g(vectors_ - 1);
  for (std::size_t p = 0; p < g.sums.size(); ++p) {
    const double* lane = lanes_.data() + p * kLanes;
    g.sums[p] = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  }
  return g;
}

}  // namespace mergepipe
