// O_DIRECT reads at any offset and length (through the aligned scratch), their errors, and the
// page-cache probe that decides when --input-io auto reads around the cache.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/page_residency.hpp"

namespace mergepipe::io {
namespace {

std::string pattern(std::size_t n) {
  std::string bytes(n, '\0');
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + i / 4096) % 251);
  return bytes;
}

// A file synced to disk and dropped from the page cache.
std::string cold_file(const test::TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("data.bin");
  test::write_file(path, bytes);
  File f(path, File::Mode::kRead);
  f.sync();
  f.drop_cache();
  return path;
}

TEST(DirectRead, MatchesTheFileAtUnalignedOffsetsAndLengths) {
  test::TempDir dir;
  const std::string bytes = pattern(3 * 4096 + 777);
  const std::string path = cold_file(dir, bytes);
  File direct = File::open_direct(path);
  if (!direct.is_open())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  AlignedBuffer scratch;
  const std::vector<std::pair<std::size_t, std::size_t>> ranges = {
      {0, 1},    {1, 4095},     {4095, 2},   {4096, 4096},          {100, 3 * 4096},
      {0, 4096}, {12000, 1000}, {12287, 10}, {bytes.size() - 5, 5}, {0, bytes.size()}};
  for (const auto& [offset, length] : ranges) {
    std::vector<std::byte> out(length, std::byte{0xee});
    ASSERT_TRUE(direct.read_at_direct(offset, out, scratch));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), length),
              bytes.substr(offset, length))
        << "offset " << offset << " length " << length;
  }
  EXPECT_EQ(scratch.capacity() % kDirectAlignment, 0u);
}

TEST(DirectRead, PastTheEndIsAnInputErrorNamingTheFile) {
  test::TempDir dir;
  const std::string bytes = pattern(5000);
  const std::string path = cold_file(dir, bytes);
  File direct = File::open_direct(path);
  if (!direct.is_open())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  AlignedBuffer scratch;
  std::vector<std::byte> out(20);
  try {
    direct.read_at_direct(4990, out, scratch);
    FAIL() << "read past the end succeeded";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("file ends at offset 5000 but 10 more bytes"), std::string::npos)
        << message;
  }
}

TEST(DirectRead, BypassesThePageCacheThatBufferedReadsFill) {
  test::TempDir dir;
  const std::string bytes = pattern(16 * 4096);
  const std::string path = cold_file(dir, bytes);
  File buffered(path, File::Mode::kRead);
  if (cached_bytes(buffered) != 0) GTEST_SKIP() << "this file system keeps files in memory";
  File direct = File::open_direct(path);
  if (!direct.is_open())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  AlignedBuffer scratch;
  std::vector<std::byte> out(bytes.size());
  ASSERT_TRUE(direct.read_at_direct(0, out, scratch));
  EXPECT_EQ(cached_bytes(buffered), 0u);
  buffered.read_at(0, std::span(out).subspan(0, 8 * 4096));
  EXPECT_GE(cached_bytes(buffered), 8u * 4096);
}

TEST(DirectRead, CachedBytesOfAnEmptyFileIsZero) {
  test::TempDir dir;
  test::write_file(dir.file("empty"), "");
  EXPECT_EQ(cached_bytes(File(dir.file("empty"), File::Mode::kRead)), 0u);
  EXPECT_FALSE(mostly_cached(File(dir.file("empty"), File::Mode::kRead)));
}

TEST(DirectRead, MostlyCachedSamplesTheWholeFile) {
  test::TempDir dir;
  const std::string bytes = pattern(256 * 4096);
  const std::string path = cold_file(dir, bytes);
  File file(path, File::Mode::kRead);
  file.advise_random();  // read exactly what is asked, so the cached share is ours
  if (cached_bytes(file) != 0) GTEST_SKIP() << "this file system keeps files in memory";
  EXPECT_FALSE(mostly_cached(file));
  std::vector<std::byte> out(bytes.size());
  file.read_at(0, std::span(out).subspan(0, 96 * 4096));  // the first 37.5%
  EXPECT_FALSE(mostly_cached(file));
  file.read_at(96 * 4096, std::span(out).subspan(0, 64 * 4096));  // now 62.5%
  EXPECT_TRUE(mostly_cached(file));
  file.read_at(0, out);
  EXPECT_TRUE(mostly_cached(file));
  EXPECT_EQ(cached_bytes(file), bytes.size());
}

}  // namespace
}  // namespace mergepipe::io
