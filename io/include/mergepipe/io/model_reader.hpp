#pragma once
// Reads tensors of a model folder, whichever format MergePipe wrote it in: safetensors shards
// (any Hugging Face folder) or a single model.h5 from `--format hdf5`. Used by `verify`.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/tensor.hpp"

namespace mergepipe::io {

class ModelReader {
 public:
  virtual ~ModelReader() = default;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // Raw little-endian bytes of elements [elem_begin, elem_begin + n) of tensor `index`.
  virtual void read(std::size_t index, std::uint64_t elem_begin, std::uint64_t n,
                    std::span<std::byte> dst) = 0;
  // Index of a tensor by name, or -1.
  long find(const std::string& name) const;
};

// Opens DIR: model.h5 if present, else the safetensors folder. Throws InputError/IoError.
std::unique_ptr<ModelReader> open_model(const std::string& dir);

}  // namespace mergepipe::io
