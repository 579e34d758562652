#pragma once
// Bit-level views of fp32 values (for vectorisable branch-free code and exact bucket keys).
#include <cstdint>
#include <cstring>

namespace mergepipe {

inline std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

inline float float_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

}  // namespace mergepipe
