#pragma once
// Tensor descriptions shared by every layer.
#include <cstdint>
#include <string>
#include <vector>

#include "mergepipe/dtype.hpp"

namespace mergepipe {

// Name, element type and row-major shape of one tensor (independent of where it is stored).
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::uint64_t> shape;

  // Product of the shape (1 for a scalar). Throws InputError on overflow.
  std::uint64_t numel() const;
  // numel() * dtype_size(dtype). Throws InputError on overflow.
  std::uint64_t nbytes() const;
  bool operator==(const TensorInfo&) const = default;
};

// A tensor as found in a checkpoint: which file and where its bytes lie (absolute file offset).
struct StoredTensor {
  TensorInfo info;
  std::string file;          // absolute or folder-relative path as opened by the reader
  std::uint64_t offset = 0;  // absolute byte offset of the first element in `file`
  std::uint64_t length = 0;  // byte length, == info.nbytes()
};

// Formats a shape as "[2048, 1024]" for messages.
std::string format_shape(const std::vector<std::uint64_t>& shape);

}  // namespace mergepipe
