// The output writer of a safetensors merge: every range lands where it was asked to, the
// background fdatasync runs as promised, and failures surface from finish() instead of being
// lost (or hanging the writer).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
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

// Whole pages of each range inside [begin, end).
std::uint64_t whole_pages(std::uint64_t begin, std::uint64_t end) {
  const std::uint64_t first = (begin + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  const std::uint64_t last = end / kDirectAlignment * kDirectAlignment;
  return last > first ? last - first : 0;
}

// Two writers on one file (two ranks' writers on a shared shard) with ranges cut at arbitrary
// bytes, so that most pages are shared by two ranges of different writers: a direct write of a
// partial page would overwrite its neighbour's bytes with the stale ones it read.
TEST(AsyncWriter, DirectWritesOfTwoWritersInterleavedLandExactly) {
  test::TempDir dir;
  const std::string path = dir.file("shard.bin");
  test::write_file(path, "");
  const bool direct_possible = File::open_direct_write(path).is_open();
  const std::size_t size = 3 * kMiB + 1234;
  std::mt19937 rng(7);
  std::vector<std::uint64_t> cuts = {0, size, 4096, 8192, 8193, 8194, 12288 + 4095};
  while (cuts.size() < 60) cuts.push_back(rng() % size);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) ranges.emplace_back(cuts[i], cuts[i + 1]);
  std::shuffle(ranges.begin(), ranges.end(), rng);

  const std::vector<std::byte> bytes = pattern(size, 9);
  std::uint64_t expect_direct[2] = {0, 0};
  {
    File(path, File::Mode::kReadWrite).preallocate(size);
    AsyncFileWriter first({path}, 2, kMiB, OutputIo::kDirect);
    AsyncFileWriter second({path}, 3, 0, OutputIo::kDirect);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const auto [begin, end] = ranges[i];
      (i % 2 ? second : first).write(0, begin, std::span(bytes).subspan(begin, end - begin));
      expect_direct[i % 2] += whole_pages(begin, end);
    }
    first.finish();
    second.finish();
    if (direct_possible) {
      EXPECT_EQ(first.direct_bytes(), expect_direct[0]);
      EXPECT_EQ(second.direct_bytes(), expect_direct[1]);
      EXPECT_GT(first.direct_bytes() + second.direct_bytes(), size / 2);
    } else {
      EXPECT_EQ(first.direct_bytes() + second.direct_bytes(), 0u);
    }
  }
  EXPECT_EQ(test::read_file(path), as_string(bytes));
}

TEST(AsyncWriter, BufferedModeWritesNothingDirect) {
  test::TempDir dir;
  const std::string path = dir.file("a.bin");
  test::write_file(path, "");
  const std::vector<std::byte> bytes = pattern(kMiB, 4);
  AsyncFileWriter writer({path}, 2, 0, OutputIo::kBuffered);
  writer.write(0, 0, bytes);
  writer.finish();
  EXPECT_EQ(writer.direct_bytes(), 0u);
  EXPECT_EQ(test::read_file(path), as_string(bytes));
}

TEST(FileWrite, PreallocateReservesBlocksAndKeepsWhatIsThere) {
  test::TempDir dir;
  const std::string path = dir.file("a.bin");
  test::write_file(path, "header");
  File f(path, File::Mode::kReadWrite);
  f.preallocate(5 * kMiB);
  EXPECT_EQ(f.size(), 5 * kMiB);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // st_blocks counts 512-byte units; a file system without fallocate leaves a 6-byte file.
  if (st.st_blocks > 0 && std::uint64_t(st.st_blocks) * 512 < kMiB)
    GTEST_SKIP() << "no fallocate under " << dir.path();
  EXPECT_GE(std::uint64_t(st.st_blocks) * 512, 5 * kMiB);
  EXPECT_EQ(test::read_file(path).substr(0, 6), "header");
  f.preallocate(kMiB);  // smaller: nothing shrinks
  EXPECT_EQ(f.size(), 5 * kMiB);
}

TEST(FileWrite, AnUnalignedDirectWriteIsRefusedAndWritesNothing) {
  test::TempDir dir;
  const std::string path = dir.file("a.bin");
  test::write_file(path, std::string(8192, 'x'));
  File direct = File::open_direct_write(path);
  if (!direct.is_open())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  AlignedBuffer page;
  page.reserve(4096);
  std::memset(page.data(), 'y', 4096);
  EXPECT_FALSE(direct.write_direct_at(1, std::span<const std::byte>(page.data(), 4096)));
  EXPECT_EQ(test::read_file(path), std::string(8192, 'x'));
  EXPECT_TRUE(direct.write_direct_at(4096, std::span<const std::byte>(page.data(), 4096)));
  EXPECT_EQ(test::read_file(path), std::string(4096, 'x') + std::string(4096, 'y'));
}

TEST(OutputIoChoice, AutoIsDirectUnlessTheInputsStreamThroughTheCache) {
  EXPECT_EQ(resolve_output_io(OutputIo::kAuto, false), OutputIo::kDirect);
  EXPECT_EQ(resolve_output_io(OutputIo::kAuto, true), OutputIo::kBuffered);
  for (bool streams : {false, true}) {
    EXPECT_EQ(resolve_output_io(OutputIo::kDirect, streams), OutputIo::kDirect);
    EXPECT_EQ(resolve_output_io(OutputIo::kBuffered, streams), OutputIo::kBuffered);
  }
  EXPECT_EQ(output_io_name(OutputIo::kAuto), "auto");
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
