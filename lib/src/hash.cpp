#include "mergepipe/hash.hpp"

#include <xxhash.h>

#include <cstdio>

namespace mergepipe {

std::uint64_t hash64(const void* data, std::size_t size, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

std::string hex64(std::uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

static std::string hex128(XXH128_hash_t h) {
  return hex64(h.high64) + hex64(h.low64);
}

std::string hash128_hex(const void* data, std::size_t size) {
  return hex128(XXH3_128bits(data, size));
}

Hasher64::Hasher64() : state_(XXH3_createState()) {
  reset();
}
Hasher64::~Hasher64() {
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
Hasher64::Hasher64(Hasher64&& other) noexcept : state_(other.state_) {
  other.state_ = nullptr;
}
Hasher64& Hasher64::operator=(Hasher64&& other) noexcept {
  if (this != &other) {
    if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
    state_ = other.state_;
    other.state_ = nullptr;
  }
  return *this;
}
void Hasher64::reset() {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
void Hasher64::update(const void* data, std::size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
std::uint64_t Hasher64::digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

Hasher128::Hasher128() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher128::~Hasher128() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void Hasher128::update(const void* data, std::size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
std::string Hasher128::hex() const {
  return hex128(XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
}

}  // namespace mergepipe
