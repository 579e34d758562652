#pragma once
// Partition of blocks over ranks: contiguous ranges in block order (so each rank's reads stay
// sequential within every file), balanced by the bytes each block moves. Pure: every rank
// computes the same partition from the same plan, no communication needed.
#include <cstdint>
#include <span>
#include <vector>

namespace mergepipe::mpi {

struct BlockRange {
  std::uint32_t begin = 0;  // first block
  std::uint32_t end = 0;    // one past the last block
};

// costs[b] = bytes block b moves (base read + admitted expert reads + output write).
// Returns `parts` ranges covering [0, costs.size()) in order; rank r gets ranges[r].
std::vector<BlockRange> partition_by_cost(std::span<const std::uint64_t> costs, int parts);

// Guided self-scheduling of `range` for `workers` drawing chunks in turn: contiguous chunks in
// order, each about the cost left divided by 2 × workers but at least `min_cost` (and one
// block), so the first chunks are large (few hand-overs) and the last ones small (whoever
// finishes first takes them, and all finish close together).
std::vector<BlockRange> guided_chunks(std::span<const std::uint64_t> costs, BlockRange range,
                                      int workers, std::uint64_t min_cost);

}  // namespace mergepipe::mpi
