#include "mergepipe/mpi/partition.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

using mergepipe::mpi::partition_by_cost;

TEST(Partition, ContiguousCoveringAndBalanced) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::uint64_t> costs(std::uniform_int_distribution<int>(0, 300)(rng));
    for (auto& c : costs) c = std::uniform_int_distribution<std::uint64_t>(0, 1000)(rng);
    const int parts = std::uniform_int_distribution<int>(1, 7)(rng);
    const auto ranges = partition_by_cost(costs, parts);
    ASSERT_EQ(ranges.size(), std::size_t(parts));
    std::uint32_t expect = 0;
    std::uint64_t biggest = 0;
    for (const auto& r : ranges) {
      ASSERT_EQ(r.begin, expect);
      ASSERT_LE(r.begin, r.end);
      expect = r.end;
      biggest = std::max(biggest, std::accumulate(costs.begin() + r.begin, costs.begin() + r.end,
                                                  std::uint64_t{0}));
    }
    ASSERT_EQ(expect, costs.size());
    const std::uint64_t total = std::accumulate(costs.begin(), costs.end(), std::uint64_t{0});
    const std::uint64_t max_item =
        costs.empty() ? 0 : *std::max_element(costs.begin(), costs.end());
    // No part exceeds its fair share by more than one block.
    EXPECT_LE(biggest, total / parts + max_item + 1);
  }
}

TEST(Partition, SameInputSamePartition) {
  std::vector<std::uint64_t> costs{5, 1, 9, 3, 3, 3, 8};
  EXPECT_EQ(partition_by_cost(costs, 3)[1].begin, partition_by_cost(costs, 3)[1].begin);
  const auto r = partition_by_cost(costs, 1);
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, costs.size());
}
