#include "mergepipe/hash.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

using namespace mergepipe;

namespace {

std::vector<unsigned char> counting_bytes(std::size_t n) {
  std::vector<unsigned char> bytes(n);
  std::iota(bytes.begin(), bytes.end(), static_cast<unsigned char>(7));
  return bytes;
}

}  // namespace

// Catalog block hashes are one-shot hash64 values; reads check them with the streaming hasher,
// so the two must agree however a block is cut into slices.
TEST(Hasher64, PiecesHashLikeTheWhole) {
  const auto bytes = counting_bytes(100'003);
  const std::uint64_t whole = hash64(bytes.data(), bytes.size());
  for (std::size_t piece : {1u, 255u, 4096u, 65'536u, 100'003u}) {
    Hasher64 h;
    for (std::size_t at = 0; at < bytes.size(); at += piece)
      h.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    EXPECT_EQ(h.digest(), whole) << "piece " << piece;
  }
}

TEST(Hasher64, ResetForgetsEarlierBytes) {
  const auto bytes = counting_bytes(1000);
  Hasher64 h;
  h.update("stale", 5);
  h.reset();
  h.update(bytes.data(), bytes.size());
  EXPECT_EQ(h.digest(), hash64(bytes.data(), bytes.size()));
  Hasher64 moved = std::move(h);  // hashers live in vectors: a move keeps the state
  EXPECT_EQ(moved.digest(), hash64(bytes.data(), bytes.size()));
}

TEST(Hasher128, PiecesHashLikeTheWhole) {
  const auto bytes = counting_bytes(70'000);
  Hasher128 a, b;
  a.update(bytes.data(), bytes.size());
  b.update(bytes.data(), 12'345);
  b.update(bytes.data() + 12'345, bytes.size() - 12'345);
  EXPECT_EQ(a.hex(), b.hex());
  EXPECT_EQ(a.hex(), hash128_hex(bytes.data(), bytes.size()));
  EXPECT_EQ(a.hex().size(), 32u);
  EXPECT_NE(a.hex(), Hasher128().hex());
}
