#include "mergepipe/blocking.hpp"

#include <gtest/gtest.h>

using namespace mergepipe;

TEST(Blocking, WholeRowsNeverSpanTensors) {
  std::vector<TensorInfo> tensors = {
      {"a", DType::kBF16, {10, 4}},  // rows of 8 bytes
      {"b", DType::kF32, {3}},       // 1-D: one-element rows
      {"empty", DType::kBF16, {0, 4}},
      {"s", DType::kF32, {}},  // scalar
  };
  Blocking b = make_blocking(tensors, 20);
  ASSERT_EQ(b.first_block.size(), 4u);
  // a: 2 rows (16 bytes) per block -> 5 blocks of 8 elements.
  EXPECT_EQ(b.block_count[0], 5u);
  EXPECT_EQ(b.blocks[0].elem_count, 8u);
  EXPECT_EQ(b.blocks[4].elem_begin, 32u);
  EXPECT_EQ(b.blocks[4].byte_begin, 64u);
  // b: 5 one-element rows fit in 20 bytes -> one block of 3.
  EXPECT_EQ(b.block_count[1], 1u);
  EXPECT_EQ(b.blocks[b.first_block[1]].elem_count, 3u);
  EXPECT_EQ(b.block_count[2], 0u);
  EXPECT_EQ(b.block_count[3], 1u);
  for (const Block& blk : b.blocks) EXPECT_LE(blk.byte_length, 20u);
}

TEST(Blocking, RowLargerThanBlockGetsItsOwnBlock) {
  Blocking b = make_blocking({{"w", DType::kBF16, {3, 100}}}, 64);
  ASSERT_EQ(b.blocks.size(), 3u);
  EXPECT_EQ(b.blocks[1].byte_length, 200u);
}
