#include "mergepipe/blocking.hpp"

#include <algorithm>

#include "mergepipe/error.hpp"

namespace mergepipe {

Blocking make_blocking(const std::vector<TensorInfo>& tensors, std::uint64_t block_bytes) {
  if (block_bytes == 0) throw UsageError("block size must be positive");
  Blocking blocking;
  blocking.block_bytes = block_bytes;
  blocking.first_block.reserve(tensors.size());
  blocking.block_count.reserve(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& info = tensors[t];
    const std::uint64_t numel = info.numel();
    const std::uint64_t elem_size = dtype_size(info.dtype);
    std::uint64_t row = 1;
    if (info.shape.size() >= 2)
      row = info.shape.empty() || info.shape[0] == 0 ? 0 : numel / info.shape[0];
    blocking.first_block.push_back(static_cast<std::uint32_t>(blocking.blocks.size()));
    std::uint32_t count = 0;
    if (numel > 0) {
      const std::uint64_t row_bytes = row * elem_size;
      const std::uint64_t rows_per_block = std::max<std::uint64_t>(1, block_bytes / row_bytes);
      const std::uint64_t elems_per_block = rows_per_block * row;
      for (std::uint64_t begin = 0; begin < numel; begin += elems_per_block) {
        Block b;
        b.tensor = static_cast<std::uint32_t>(t);
        b.elem_begin = begin;
        b.elem_count = std::min(elems_per_block, numel - begin);
        b.byte_begin = begin * elem_size;
        b.byte_length = b.elem_count * elem_size;
        blocking.blocks.push_back(b);
        ++count;
      }
    }
    blocking.block_count.push_back(count);
  }
  return blocking;
}

std::vector<std::uint32_t> block_range(std::uint32_t begin, std::uint32_t end) {
  std::vector<std::uint32_t> blocks;
  for (std::uint32_t b = begin; b < end; ++b) blocks.push_back(b);
  return blocks;
}

}  // namespace mergepipe
