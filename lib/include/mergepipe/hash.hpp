#pragma once
// Content hashes (XXH3). Fast, stable across platforms and versions of the library.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace mergepipe {

std::uint64_t hash64(const void* data, std::size_t size, std::uint64_t seed = 0);
inline std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0) {
  return hash64(s.data(), s.size(), seed);
}
// 128-bit hash as 32 lowercase hex digits (plan hashes, file content hashes).
std::string hash128_hex(const void* data, std::size_t size);
// 64-bit value as 16 lowercase hex digits.
std::string hex64(std::uint64_t value);

namespace detail {
// Owns an XXH3_state_t, opaque to keep xxhash.h out of this header.
struct XxhStateFree {
  void operator()(void* state) const;
};
using XxhState = std::unique_ptr<void, XxhStateFree>;
XxhState new_xxh_state();
}  // namespace detail

// Incremental 64-bit hasher: the same value as hash64 (seed 0) of the concatenated updates.
class Hasher64 {
 public:
  Hasher64();
  void reset();
  void update(const void* data, std::size_t size);
  std::uint64_t digest() const;

 private:
  detail::XxhState state_;
};

// Incremental 128-bit hasher for long streams.
class Hasher128 {
 public:
  Hasher128();
  void update(const void* data, std::size_t size);
  std::string hex() const;

 private:
  detail::XxhState state_;
};

}  // namespace mergepipe
