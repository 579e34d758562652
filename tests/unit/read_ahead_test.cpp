// The background read-ahead that fills rank 0's idle time before a merge: it loads exactly the
// ranges it is given into the page cache, in order, within its cap, and never fails the merge.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint_test_util.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/page_residency.hpp"
#include "mergepipe/io/read_ahead.hpp"

namespace mergepipe::io {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

std::string cold_file(const test::TempDir& dir, const std::string& name, std::uint64_t size) {
  const std::string path = dir.file(name);
  test::write_file(path, std::string(size, 'x'));
  File f(path, File::Mode::kRead);
  f.sync();
  f.drop_cache();
  return path;
}

std::uint64_t cached(const std::string& path) {
  return cached_bytes(File(path, File::Mode::kRead));
}

TEST(ReadAhead, LoadsTheRangesIntoThePageCache) {
  test::TempDir dir;
  const std::string a = cold_file(dir, "a.bin", 10 * kMiB);
  const std::string b = cold_file(dir, "b.bin", 10 * kMiB);
  if (cached(a) > kMiB) GTEST_SKIP() << "this file system keeps dropped pages cached";
  BackgroundReadAhead read_ahead({{a, kMiB, 6 * kMiB}, {b, 0, 3 * kMiB}}, 100 * kMiB);
  EXPECT_EQ(read_ahead.wait(), 9 * kMiB);
  // Page-granular, plus what the kernel reads ahead on its own; never the whole of b.
  EXPECT_GE(cached(a), 6 * kMiB);
  EXPECT_GE(cached(b), 3 * kMiB);
  EXPECT_LT(cached(b), 10 * kMiB);
  EXPECT_GT(read_ahead.seconds(), 0.0);
}

TEST(ReadAhead, StopsAtItsCapInRangeOrder) {
  test::TempDir dir;
  const std::string a = cold_file(dir, "a.bin", 6 * kMiB);
  const std::string b = cold_file(dir, "b.bin", 6 * kMiB);
  if (cached(a) > kMiB) GTEST_SKIP() << "this file system keeps dropped pages cached";
  BackgroundReadAhead read_ahead({{a, 0, 6 * kMiB}, {b, 0, 6 * kMiB}}, 7 * kMiB + 4096);
  EXPECT_EQ(read_ahead.wait(), 7 * kMiB + 4096);
  EXPECT_GE(cached(a), 6 * kMiB);
  EXPECT_GE(cached(b), kMiB + 4096);
}

TEST(ReadAhead, SkipsFilesAlreadyCached) {
  test::TempDir dir;
  const std::string path = dir.file("warm.bin");
  test::write_file(path, std::string(4 * kMiB, 'x'));  // freshly written: in the page cache
  if (!mostly_cached(File(path, File::Mode::kRead))) GTEST_SKIP() << "written pages not cached";
  BackgroundReadAhead read_ahead({{path, 0, 4 * kMiB}}, 100 * kMiB);
  EXPECT_EQ(read_ahead.wait(), 0u);
}

TEST(ReadAhead, AMissingFileEndsItQuietly) {
  test::TempDir dir;
  const std::string a = cold_file(dir, "a.bin", 2 * kMiB);
  BackgroundReadAhead read_ahead({{dir.file("missing.bin"), 0, kMiB}, {a, 0, 2 * kMiB}}, kMiB);
  EXPECT_EQ(read_ahead.stop(), 0u);
  EXPECT_EQ(read_ahead.stop(), 0u);  // idempotent
}

TEST(ReadAhead, JoinsTensorsThatAreAdjacentInAFile) {
  Checkpoint c;
  auto tensor = [](const std::string& file, std::uint64_t offset, std::uint64_t length) {
    StoredTensor t;
    t.file = file;
    t.offset = offset;
    t.length = length;
    return t;
  };
  c.tensors = {tensor("x", 100, 50), tensor("x", 150, 25), tensor("x", 200, 10),
               tensor("y", 8, 0),    tensor("y", 8, 40),   tensor("y", 48, 2)};
  const auto ranges = tensor_read_order(c);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].path, "x");
  EXPECT_EQ(ranges[0].offset, 100u);
  EXPECT_EQ(ranges[0].length, 75u);
  EXPECT_EQ(ranges[1].offset, 200u);
  EXPECT_EQ(ranges[1].length, 10u);
  EXPECT_EQ(ranges[2].path, "y");
  EXPECT_EQ(ranges[2].offset, 8u);
  EXPECT_EQ(ranges[2].length, 42u);
}

// Ranges x[100, 175) y[8, 50) z[0, 30): 75 + 42 + 30 = 147 bytes in all.
const std::vector<FileRange> kThreeFiles = {{"x", 100, 75}, {"y", 8, 42}, {"z", 0, 30}};

TEST(ReadAhead, SlicesCrossFileBoundaries) {
  // Bytes 70..129 of the concatenation: the last 5 of x, all of y, the first 13 of z.
  EXPECT_EQ(slice_ranges(kThreeFiles, 70, 60),
            (std::vector<FileRange>{{"x", 170, 5}, {"y", 8, 42}, {"z", 0, 13}}));
  // Inside one range, at its start, and clipped at the end of the concatenation.
  EXPECT_EQ(slice_ranges(kThreeFiles, 80, 10), (std::vector<FileRange>{{"y", 13, 10}}));
  EXPECT_EQ(slice_ranges(kThreeFiles, 75, 1), (std::vector<FileRange>{{"y", 8, 1}}));
  EXPECT_EQ(slice_ranges(kThreeFiles, 140, 100), (std::vector<FileRange>{{"z", 23, 7}}));
  EXPECT_TRUE(slice_ranges(kThreeFiles, 147, 10).empty());
  EXPECT_TRUE(slice_ranges(kThreeFiles, 10, 0).empty());
}

TEST(ReadAhead, ConsecutiveSlicesRejoinIntoTheWhole) {
  // Shares of 4 ranks (as a node holding all of them reads them), cut at uneven points.
  std::vector<FileRange> joined;
  const std::uint64_t cuts[] = {0, 36, 75, 76, 147};
  for (int r = 0; r < 4; ++r)
    append_ranges(joined, slice_ranges(kThreeFiles, cuts[r], cuts[r + 1] - cuts[r]));
  EXPECT_EQ(joined, kThreeFiles);
  // Shares that are not adjacent stay apart.
  std::vector<FileRange> gapped;
  append_ranges(gapped, slice_ranges(kThreeFiles, 0, 20));
  append_ranges(gapped, slice_ranges(kThreeFiles, 40, 20));
  EXPECT_EQ(gapped, (std::vector<FileRange>{{"x", 100, 20}, {"x", 140, 20}}));
}

TEST(ReadAhead, Rank0sNodeReadsWhatTheMergeGivesIt) {
  // --map-by node on 2 nodes of 2 ranks: rank 0's node holds ranks 0 and 2. The dynamic schedule
  // gives that node the first half of the blocks, the static one ranks 0 and 2 their own.
  const std::vector<int> node{0, 2};
  EXPECT_EQ(rank0_node_share_positions(node, true), (std::vector<int>{0, 1}));
  EXPECT_EQ(rank0_node_share_positions(node, false), (std::vector<int>{0, 2}));
  EXPECT_EQ(rank0_node_share_positions({}, true), (std::vector<int>{0}));
  const std::vector<int> first_half = rank0_node_share_positions(node, true);
  EXPECT_EQ(total_bytes(rank_shares(kThreeFiles, 4, first_half)), 73u);  // 147·2/4, floored
}

TEST(ReadAhead, RankSharesAreEqualCutsInRankOrder) {
  // 147 bytes over 3 ranks: cuts at 49 and 98.
  const std::vector<int> first{0};
  EXPECT_EQ(rank_shares(kThreeFiles, 3, first), (std::vector<FileRange>{{"x", 100, 49}}));
  const std::vector<int> node{0, 1};  // two ranks of one node: one run of 98 bytes
  EXPECT_EQ(rank_shares(kThreeFiles, 3, node),
            (std::vector<FileRange>{{"x", 100, 75}, {"y", 8, 23}}));
  const std::vector<int> apart{0, 2, 7};  // a node holding ranks 0 and 2 (7 does not exist)
  EXPECT_EQ(rank_shares(kThreeFiles, 3, apart),
            (std::vector<FileRange>{{"x", 100, 49}, {"y", 31, 19}, {"z", 0, 30}}));
  EXPECT_EQ(total_bytes(rank_shares(kThreeFiles, 3, std::vector<int>{2, 1, 0})), 147u);
  EXPECT_EQ(total_bytes(kThreeFiles), 147u);
}

TEST(ReadAhead, FinishedFirstOnlyOnASingleNodeAndWhenItFitsInMemory) {
  constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
  EXPECT_TRUE(finish_read_ahead_first(2, 2, kGiB, 24 * kGiB));
  EXPECT_TRUE(finish_read_ahead_first(1, 1, 6 * kGiB, 24 * kGiB));   // a quarter exactly
  EXPECT_FALSE(finish_read_ahead_first(1, 1, 7 * kGiB, 24 * kGiB));  // more than a quarter
  EXPECT_FALSE(finish_read_ahead_first(2, 4, kGiB, 24 * kGiB));      // other nodes would idle
  EXPECT_FALSE(finish_read_ahead_first(0, 2, kGiB, 24 * kGiB));      // placement unknown
  EXPECT_FALSE(finish_read_ahead_first(0, 0, 0, 24 * kGiB));
}

}  // namespace
}  // namespace mergepipe::io
