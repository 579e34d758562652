// The output writer of a safetensors merge: every range lands where it was asked to, the
// background fdatasync runs as promised, and failures surface from finish() instead of being
// lost (or hanging the writer).
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/async_writer.hpp"

namespace mergepipe::io {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed * 7) & 0xff);
  return v;
}

std::string as_string(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

TEST(AsyncWriter, EveryRangeLandsAtItsOffsetInItsFile) {
  test::TempDir dir;
  const std::string a = dir.file("a.bin"), b = dir.file("b.bin");
  test::write_file(a, "");
  test::write_file(b, "");
  const std::size_t piece = 256 * 1024;
  std::string expect_a(8 * piece, '\0'), expect_b(4 * piece, '\0');
  {
    AsyncFileWriter writer({a, b}, 2, kMiB);
    // Out of order, both files, more pieces than buffers: the caller's buffer is reused at once.
    std::vector<std::byte> buffer;
    for (unsigned i : {5u, 0u, 7u, 2u, 1u, 6u, 3u, 4u}) {
      buffer = pattern(piece, i);
      writer.write(0, i * piece, buffer);
      expect_a.replace(i * piece, piece, as_string(buffer));
      if (i < 4) {
        buffer = pattern(piece, 100 + i);
        writer.write(1, i * piece, buffer);
        expect_b.replace(i * piece, piece, as_string(buffer));
      }
    }
    writer.finish();
    // 3 MiB written with a flush every 1 MiB: at least one background round, whatever the timing
    // (finish() lets the flusher run the round it owes before it stops).
    EXPECT_GE(writer.background_flushes(), 1u);
  }
  EXPECT_EQ(test::read_file(a), expect_a);
  EXPECT_EQ(test::read_file(b), expect_b);
}

TEST(AsyncWriter, NoBackgroundFlushWhenTurnedOffOrBelowTheThreshold) {
  test::TempDir dir;
  const std::string a = dir.file("a.bin");
  test::write_file(a, "");
  const std::vector<std::byte> bytes = pattern(kMiB, 1);
  {
    AsyncFileWriter off({a}, 4, 0);
    for (int i = 0; i < 4; ++i) off.write(0, i * kMiB, bytes);
    off.finish();
    EXPECT_EQ(off.background_flushes(), 0u);
  }
  {
    AsyncFileWriter below({a}, 4, 64 * kMiB);
    below.write(0, 0, bytes);
    below.finish();
    EXPECT_EQ(below.background_flushes(), 0u);
  }
  EXPECT_EQ(std::filesystem::file_size(a), 4 * kMiB);
}

TEST(AsyncWriter, DestroyedWithoutFinishEndsItsThreads) {
  test::TempDir dir;
  const std::string a = dir.file("a.bin");
  test::write_file(a, "");
  const std::vector<std::byte> bytes = pattern(kMiB, 2);
  AsyncFileWriter writer({a}, 2, kMiB);
  for (int i = 0; i < 8; ++i) writer.write(0, i * kMiB, bytes);
  // The destructor (an error elsewhere in the merge) must return: the test would time out.
}

TEST(AsyncWriter, AFailedWriteIsReportedByFinishWithTheFile) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  AsyncFileWriter writer({"/dev/full"}, 2, kMiB);
  const std::vector<std::byte> bytes = pattern(kMiB, 3);
  try {
    writer.write(0, 0, bytes);
    writer.write(0, kMiB, bytes);  // may already report the first failure
    writer.finish();
    FAIL() << "writing to /dev/full succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mergepipe::io
