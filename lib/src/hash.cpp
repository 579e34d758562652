#include "mergepipe/hash.hpp"

#include <xxhash.h>

#include <cstdio>
#include <new>

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

namespace detail {
void XxhStateFree::operator()(void* state) const {
  XXH3_freeState(static_cast<XXH3_state_t*>(state));
}
XxhState new_xxh_state() {
  XxhState state(XXH3_createState());
  if (!state) throw std::bad_alloc();
  return state;
}
}  // namespace detail

static XXH3_state_t* xxh(const detail::XxhState& state) {
  return static_cast<XXH3_state_t*>(state.get());
}

Hasher64::Hasher64() : state_(detail::new_xxh_state()) {
  reset();
}
void Hasher64::reset() {
  XXH3_64bits_reset(xxh(state_));
}
void Hasher64::update(const void* data, std::size_t size) {
  XXH3_64bits_update(xxh(state_), data, size);
}
std::uint64_t Hasher64::digest() const {
  return XXH3_64bits_digest(xxh(state_));
}

Hasher128::Hasher128() : state_(detail::new_xxh_state()) {
  XXH3_128bits_reset(xxh(state_));
}
void Hasher128::update(const void* data, std::size_t size) {
  XXH3_128bits_update(xxh(state_), data, size);
}
std::string Hasher128::hex() const {
  return hex128(XXH3_128bits_digest(xxh(state_)));
}

}  // namespace mergepipe
