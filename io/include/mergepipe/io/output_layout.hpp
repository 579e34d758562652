#pragma once
// Layout of a merged Hugging Face folder: which shard holds each tensor and at which offset.
// A function of the output tensor list (from the plan) and the shard size only, never of the
// number of ranks, so every rank computes it and writes its byte ranges in place.
#include <cstdint>
#include <string>
#include <vector>

#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe::io {

inline constexpr std::uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;  // transformers 4.x

struct OutputLayout {
  std::vector<TensorInfo> tensors;       // output tensors in module (base) order
  std::vector<std::string> shard_names;  // model.safetensors or model-0000i-of-0000N...
  std::vector<SafetensorsLayout> shards;
  std::vector<std::uint32_t> tensor_shard;   // per tensor
  std::vector<std::uint64_t> tensor_offset;  // per tensor: absolute offset in its shard
  std::string index_json;                    // empty for a single shard
};

OutputLayout make_output_layout(const std::vector<TensorInfo>& tensors,
                                std::uint64_t max_shard_bytes);

}  // namespace mergepipe::io
