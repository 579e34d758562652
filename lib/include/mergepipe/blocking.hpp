#pragma once
// Blocks: the unit of access. A block is a run of whole rows of one tensor (never spanning
// tensors); the same blocking applies to the base and every expert because they share shapes.
#include <cstdint>
#include <vector>

#include "mergepipe/tensor.hpp"

namespace mergepipe {

struct Block {
  std::uint32_t tensor = 0;       // index into the tensor list the blocking was made from
  std::uint64_t elem_begin = 0;   // first element (row-major) within the tensor
  std::uint64_t elem_count = 0;   // number of elements
  std::uint64_t byte_begin = 0;   // elem_begin * dtype size: offset within the tensor's bytes
  std::uint64_t byte_length = 0;  // elem_count * dtype size
};

struct Blocking {
  std::uint64_t block_bytes = 0;           // target block size the blocking was made with
  std::vector<Block> blocks;               // ordered by tensor, then element
  std::vector<std::uint32_t> first_block;  // per tensor: index of its first block
  std::vector<std::uint32_t> block_count;  // per tensor: number of blocks (0 for empty tensors)
};

// Default target block size; see docs/formats.md for why.
inline constexpr std::uint64_t kDefaultBlockBytes = 4ull << 20;

// Splits each tensor into blocks of whole rows (a row = product of shape[1:] elements; 1-D
// tensors have one-element rows) of at most max(block_bytes, one row) bytes. Deterministic.
Blocking make_blocking(const std::vector<TensorInfo>& tensors, std::uint64_t block_bytes);

// The block indices [begin, end), e.g. a rank's share, as a list for the streaming code.
std::vector<std::uint32_t> block_range(std::uint32_t begin, std::uint32_t end);

}  // namespace mergepipe
