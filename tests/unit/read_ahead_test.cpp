// The background read-ahead that fills rank 0's idle time before a merge: it loads exactly the
// ranges it is given into the page cache, in order, within its cap, and never fails the merge.
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace mergepipe::io
