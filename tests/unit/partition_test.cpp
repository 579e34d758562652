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

TEST(Partition, GuidedChunksCoverTheRangeAndShrink) {
  using mergepipe::mpi::BlockRange;
  using mergepipe::mpi::guided_chunks;
  // 1000 blocks of cost 10 (10000 in all), two workers: chunks of about a quarter of what is
  // left, never below 100.
  const std::vector<std::uint64_t> costs(1000, 10);
  const auto chunks = guided_chunks(costs, {100, 1000}, 2, 100);
  ASSERT_FALSE(chunks.empty());
  std::uint32_t expect = 100;
  for (const BlockRange& c : chunks) {
    ASSERT_EQ(c.begin, expect);
    ASSERT_LT(c.begin, c.end);
    expect = c.end;
  }
  EXPECT_EQ(expect, 1000u);
  EXPECT_EQ(chunks[0].end - chunks[0].begin, 225u);  // 9000 / 4 = 2250 of cost
  EXPECT_EQ(chunks[1].end - chunks[1].begin, 169u);  // 6750 / 4 = 1687.5: 169 blocks reach it
  // Near the end, chunks of the 100 minimum (10 blocks), then what remains.
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks[chunks.size() - 2].end - chunks[chunks.size() - 2].begin, 10u);
  EXPECT_LE(chunks.back().end - chunks.back().begin, 10u);
  for (std::size_t i = 1; i < chunks.size(); ++i)
    EXPECT_LE(chunks[i].end - chunks[i].begin, chunks[i - 1].end - chunks[i - 1].begin);
  // One worker still gets chunks (it draws them alone); an empty range has none; a block larger
  // than the target makes a chunk of its own.
  EXPECT_GT(guided_chunks(costs, {0, 1000}, 1, 100).size(), 1u);
  EXPECT_TRUE(guided_chunks(costs, {5, 5}, 2, 100).empty());
  const std::vector<std::uint64_t> lumpy{1, 5000, 1, 1};
  const auto lumps = guided_chunks(lumpy, {0, 4}, 2, 10);
  ASSERT_EQ(lumps.size(), 2u);
  EXPECT_EQ(lumps[0].end, 2u);  // 1 + 5000 reach 5003 / 4
  EXPECT_EQ(lumps[1].end, 4u);
}
