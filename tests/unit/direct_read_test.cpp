// O_DIRECT reads at any offset and length (through the aligned scratch), their errors, and the
// page-cache probe that decides when --input-io auto reads around the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/checkpoint_reader.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/page_residency.hpp"
#include "mergepipe/retained_window.hpp"

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

// A one-shard checkpoint in `dir`: file `name`, tensor t at byte offsets[t].
CheckpointLocation one_shard(const test::TempDir& dir, const std::string& name,
                             std::vector<std::uint64_t> offsets) {
  CheckpointLocation loc;
  loc.dir = dir.path();
  loc.shard_names = {name};
  loc.files = {stat_identity(dir.file(name))};
  loc.tensor_file.assign(offsets.size(), 0);
  loc.tensor_offset = std::move(offsets);
  return loc;
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

// In place: the device writes the enclosing pages into the caller's aligned memory, and the
// requested bytes land at the requested address (the ones around it are the file's too).
TEST(DirectRead, InPlaceLandsTheBytesWhereAskedAndOnlyInTheirPages) {
  test::TempDir dir;
  const std::string bytes = pattern(5 * 4096 + 321);
  const std::string path = cold_file(dir, bytes);
  File direct = File::open_direct(path);
  if (!direct.is_open())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  AlignedBuffer memory;
  memory.reserve(8 * 4096);
  const std::vector<std::pair<std::size_t, std::size_t>> ranges = {
      {0, 1}, {1, 4095}, {4095, 2}, {4096, 4096}, {100, 3 * 4096}, {bytes.size() - 7, 7}};
  for (const auto& [offset, length] : ranges) {
    std::fill(memory.data(), memory.data() + 8 * 4096, std::byte{0xee});
    // Page 1 of `memory` corresponds to the file page holding `offset`.
    std::byte* dst = memory.data() + 4096 + offset % 4096;
    ASSERT_TRUE(direct.read_direct_in_place(offset, std::span(dst, length)));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst), length), bytes.substr(offset, length))
        << "offset " << offset << " length " << length;
    EXPECT_EQ(memory.data()[4095], std::byte{0xee}) << "wrote before its first page";
    const std::size_t pages = (offset % 4096 + length + 4095) / 4096;
    EXPECT_EQ(memory.data()[4096 + pages * 4096], std::byte{0xee}) << "wrote past its last page";
  }
  std::byte* misaligned = memory.data() + 4096 + 1;
  EXPECT_THROW(direct.read_direct_in_place(0, std::span(misaligned, 10)), IoError);
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

// A held window filled by the held-windows reader (O_DIRECT in place where the file system
// allows it) holds what plain reads return, and the bytes are counted once, as base and expert.
TEST(DirectRead, HeldWindowsHoldWhatPlainReadsReturn) {
  test::TempDir dir;
  const std::string base_bytes = pattern(40000), expert_bytes = pattern(40000 + 13).substr(13);
  test::write_file(dir.file("base.bin"), base_bytes);
  test::write_file(dir.file("expert.bin"), expert_bytes);
  // Tensor 1 starts 808 bytes into a page. The readers keep pointers to the locations.
  const CheckpointLocation base = one_shard(dir, "base.bin", {100, 9000});
  const std::vector<CheckpointLocation> experts = {one_shard(dir, "expert.bin", {100, 9000})};
  ByteCounters counters;
  CheckpointBlockReader held(base, experts, counters,
                             CheckpointBlockReader::ExpertAccess::kHeldWindows, InputIo::kDirect);
  ByteCounters plain_counters;
  CheckpointBlockReader plain(base, experts, plain_counters);
  EXPECT_EQ(held.in_place_phase(SourceId{0}, 1), 9000u % 4096);
  const std::vector<HeldRange> ranges = {{SourceId{SourceId::kBase}, 0, 0, 8900},
                                         {SourceId{0}, 1, 5, 20000},
                                         {SourceId{SourceId::kBase}, 1, 20000, 11000}};
  RetainedWindow window;
  window.fill(held, ranges, 3, 8192);
  std::uint64_t base_total = 0, expert_total = 0;
  for (const HeldRange& r : ranges) {
    std::vector<std::byte> expected(r.length);
    plain.read(r.source, r.tensor, r.byte_begin, expected);
    EXPECT_EQ(std::memcmp(window.view(r.source, r.tensor, r.byte_begin, r.length), expected.data(),
                          r.length),
              0)
        << "tensor " << r.tensor << " from " << r.byte_begin;
    (r.source.expert == SourceId::kBase ? base_total : expert_total) += r.length;
  }
  EXPECT_EQ(counters.snapshot().base, base_total);
  EXPECT_EQ(counters.snapshot().expert, expert_total);
}

TEST(DirectRead, CachedBytesOfAnEmptyFileIsZero) {
  test::TempDir dir;
  test::write_file(dir.file("empty"), "");
  EXPECT_EQ(cached_bytes(File(dir.file("empty"), File::Mode::kRead)), 0u);
  EXPECT_FALSE(mostly_cached(File(dir.file("empty"), File::Mode::kRead)));
  EXPECT_FALSE(fully_cached(File(dir.file("empty"), File::Mode::kRead)));
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
  EXPECT_FALSE(fully_cached(file));
  // All but the last two pages (page 254 is the last stretch's sample).
  file.read_at(160 * 4096, std::span(out).subspan(0, 94 * 4096));
  EXPECT_FALSE(fully_cached(file));
  file.read_at(0, out);
  EXPECT_TRUE(mostly_cached(file));
  EXPECT_TRUE(fully_cached(file));
  EXPECT_EQ(cached_bytes(file), bytes.size());
}

// --io-threads auto takes one reader only when every shard will be read from memory: each
// shard read through the page cache and all in it. One cold shard, or one read with O_DIRECT,
// and the device needs its queue of readers.
TEST(DirectRead, ReadsFromMemoryOnlyWhenEveryShardIsCachedAndBuffered) {
  test::TempDir dir;
  const std::string bytes = pattern(64 * 4096);
  test::write_file(dir.file("base.bin"), bytes);
  test::write_file(dir.file("expert.bin"), bytes);
  const CheckpointLocation base = one_shard(dir, "base.bin", {0});
  const std::vector<CheckpointLocation> experts = {one_shard(dir, "expert.bin", {0})};
  auto read_whole = [](const std::string& path) {
    File f(path, File::Mode::kRead);
    std::vector<std::byte> out(f.size());
    f.read_at(0, out);
  };
  read_whole(dir.file("base.bin"));
  read_whole(dir.file("expert.bin"));
  ByteCounters counters;
  if (!fully_cached(File(dir.file("expert.bin"), File::Mode::kRead)))
    GTEST_SKIP() << "pages just read are not reported cached here";
  using Access = CheckpointBlockReader::ExpertAccess;
  EXPECT_TRUE(CheckpointBlockReader(base, experts, counters, Access::kExactRanges, InputIo::kAuto)
                  .reads_from_memory());
  EXPECT_TRUE(
      CheckpointBlockReader(base, experts, counters, Access::kWholeFiles, InputIo::kBuffered)
          .reads_from_memory());
  const CheckpointBlockReader forced(base, experts, counters, Access::kExactRanges,
                                     InputIo::kDirect);
  EXPECT_EQ(forced.reads_from_memory(), forced.direct_files() == 0);

  {
    File expert(dir.file("expert.bin"), File::Mode::kRead);
    expert.sync();
    expert.drop_cache();
    if (cached_bytes(expert) != 0) GTEST_SKIP() << "this file system keeps files in memory";
  }
  EXPECT_FALSE(CheckpointBlockReader(base, experts, counters, Access::kExactRanges, InputIo::kAuto)
                   .reads_from_memory());
  EXPECT_FALSE(
      CheckpointBlockReader(base, experts, counters, Access::kWholeFiles, InputIo::kBuffered)
          .reads_from_memory());
}

}  // namespace
}  // namespace mergepipe::io
