#pragma once
// Where each tensor of an opened checkpoint lies, in a given tensor order (the base's), as the
// catalog, the executor and the manifest record it.
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/checkpoint.hpp"

namespace mergepipe::io {

// InputError naming the folder when a tensor is missing.
CheckpointLocation locate_tensors(const Checkpoint& checkpoint,
                                  const std::vector<TensorInfo>& tensors);

}  // namespace mergepipe::io
