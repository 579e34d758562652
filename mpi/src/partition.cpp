#include "mergepipe/mpi/partition.hpp"

#include <algorithm>

namespace mergepipe::mpi {

std::vector<BlockRange> partition_by_cost(std::span<const std::uint64_t> costs, int parts) {
  std::vector<BlockRange> ranges(static_cast<std::size_t>(parts));
  long double total = 0;
  for (std::uint64_t c : costs) total += static_cast<long double>(c);
  // Cut where the running cost first reaches r/parts of the total: prefix sums make the cuts
  // depend only on the costs, never on timing.
  std::uint32_t b = 0;
  long double running = 0;
  const auto n = static_cast<std::uint32_t>(costs.size());
  for (int r = 0; r < parts; ++r) {
    ranges[r].begin = b;
    const long double target = total * static_cast<long double>(r + 1) / parts;
    if (r == parts - 1) {
      b = n;
    } else {
      while (b < n && running + static_cast<long double>(costs[b]) / 2 < target) {
        running += static_cast<long double>(costs[b]);
        ++b;
      }
    }
    ranges[r].end = b;
  }
  return ranges;
}

std::vector<BlockRange> guided_chunks(std::span<const std::uint64_t> costs, BlockRange range,
                                      int workers, std::uint64_t min_cost) {
  std::uint64_t left = 0;
  for (std::uint32_t b = range.begin; b < range.end; ++b) left += costs[b];
  const std::uint64_t split = 2 * static_cast<std::uint64_t>(std::max(workers, 1));
  std::vector<BlockRange> chunks;
  for (std::uint32_t b = range.begin; b < range.end;) {
    const std::uint64_t target = std::max(min_cost, left / split);
    BlockRange chunk{b, b};
    std::uint64_t taken = 0;
    while (chunk.end < range.end && (chunk.end == b || taken < target)) {
      taken += costs[chunk.end];
      ++chunk.end;
    }
    left -= taken;
    chunks.push_back(chunk);
    b = chunk.end;
  }
  return chunks;
}

}  // namespace mergepipe::mpi
