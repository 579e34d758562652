#include "mergepipe/tensor.hpp"

#include "mergepipe/error.hpp"

namespace mergepipe {

std::uint64_t TensorInfo::numel() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) {
      throw InputError("tensor '" + name + "': shape " + format_shape(shape) + " overflows");
    }
    n *= d;
  }
  return n;
}

std::uint64_t TensorInfo::nbytes() const {
  const std::uint64_t n = numel();
  const std::uint64_t size = dtype_size(dtype);
  if (n > UINT64_MAX / size) {
    throw InputError("tensor '" + name + "': byte size of shape " + format_shape(shape) +
                     " overflows");
  }
  return n * size;
}

std::string format_shape(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace mergepipe
