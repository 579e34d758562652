#pragma once
// Checks that a checkpoint shares the base's weight coordinates: the same tensor names, shapes and
// dtypes (order may differ: shards of an expert may be laid out differently).
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/tensor.hpp"

namespace mergepipe {

struct StructureMismatch {
  std::string tensor;                      // the tensor's name
  std::optional<std::size_t> other_index;  // index into `other` when it has the tensor
  std::string what;                        // e.g. "has shape [4, 8] but the base has [4, 16]"
};

// The first mismatch, in base order (a base tensor missing from `other`, or with another shape or
// dtype), then the first tensor of `other` absent from the base; nullopt when they match.
std::optional<StructureMismatch> find_structure_mismatch(const std::vector<TensorInfo>& base,
                                                         const std::vector<TensorInfo>& other);

}  // namespace mergepipe
