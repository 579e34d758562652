#include "mergepipe/mpi/partition.hpp"

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

}  // namespace mergepipe::mpi
