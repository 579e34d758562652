#pragma once
// Flat packing of values and vectors into a byte string for gathers and broadcasts between the
// ranks of one job (all ranks run the same binary, so the host layout is the wire layout).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mergepipe::mpi {

class Packer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<std::uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string out;
};

class Unpacker {
 public:
  // `what` names the message in the error a short input raises.
  Unpacker(const std::string& in, const char* what) : in_(in), what_(what) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const auto n = get<std::uint64_t>();
    if (n > (in_.size() - pos_) / sizeof(T)) need(in_.size() + 1);
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  void need(std::size_t n) const {
    if (in_.size() - pos_ < n) throw std::runtime_error(std::string(what_) + ": truncated data");
  }
  const std::string& in_;
  const char* what_;
  std::size_t pos_ = 0;
};

}  // namespace mergepipe::mpi
