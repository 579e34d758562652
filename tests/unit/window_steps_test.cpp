// window_steps: a full-read TIES share that fits is one held step; one that does not is cut into
// parts that fit, scanned first and merged after (the last scanned part merged while held), with
// exactly one combining step per window
// (a collective: a rank with two or none would hang the others). held_ranges: the ranges a
// held step reads, one per source for each run of a tensor's blocks.
#include "mergepipe/window_steps.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mergepipe {
namespace {

constexpr std::size_t kExperts = 3;

// Two tensors: "a" in 10 blocks of 100 bytes, "b" in 2 blocks of 100 bytes.
Blocking two_tensors() {
  return make_blocking({{"a", DType::kBF16, {10, 50}}, {"b", DType::kBF16, {2, 50}}}, 100);
}

// Bytes held for `blocks`: their ranges' lengths (no page rounding).
BlocksFootprint footprint_of(const Blocking& blocking) {
  return [&blocking](std::span<const std::uint32_t> blocks) {
    std::uint64_t total = 0;
    for (const HeldRange& r : held_ranges(blocking, blocks, kExperts)) total += r.length;
    return total;
  };
}

std::vector<std::uint32_t> blocks(std::uint32_t begin, std::uint32_t end) {
  return block_range(begin, end);
}

std::vector<std::uint32_t> concat(const std::vector<WindowStep>& steps, bool scan) {
  std::vector<std::uint32_t> all;
  for (const WindowStep& s : steps) {
    const auto& list = scan ? s.to_scan : s.to_merge;
    all.insert(all.end(), list.begin(), list.end());
  }
  return all;
}

int combining_steps(const std::vector<WindowStep>& steps) {
  int n = 0;
  for (const WindowStep& s : steps) n += s.combine;
  return n;
}

// One combining step that scans `to_scan` and merges `to_merge`.
void expect_one_step(const std::vector<WindowStep>& steps, bool held,
                     const std::vector<std::uint32_t>& to_scan,
                     const std::vector<std::uint32_t>& to_merge) {
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].held, held);
  EXPECT_TRUE(steps[0].combine);
  EXPECT_EQ(steps[0].to_scan, to_scan);
  EXPECT_EQ(steps[0].to_merge, to_merge);
}

TEST(WindowSteps, WithoutHoldingIsOneStepReadFromTheReader) {
  const Blocking blocking = two_tensors();
  expect_one_step(window_steps(blocks(0, 12), blocks(0, 12), footprint_of(blocking), 100, false),
                  false, blocks(0, 12), blocks(0, 12));
}

TEST(WindowSteps, ShareThatFitsIsOneHeldStep) {
  const Blocking blocking = two_tensors();
  // 12 blocks x 4 sources x 100 bytes = 4800; 5/4 of 4000 is enough.
  expect_one_step(window_steps(blocks(0, 12), blocks(2, 12), footprint_of(blocking), 4000, true),
                  true, blocks(0, 12), blocks(2, 12));
}

TEST(WindowSteps, LargerShareIsScannedInPartsThenMergedInParts) {
  const Blocking blocking = two_tensors();
  const auto footprint = footprint_of(blocking);
  // 1200 bytes: three blocks of four sources per part.
  const auto steps = window_steps(blocks(0, 12), blocks(1, 12), footprint, 1200, true);
  ASSERT_EQ(steps.size(), 4u + 3u);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const WindowStep& s = steps[i];
    EXPECT_TRUE(s.held);
    // Scans first, then merges; only the last scan merges too, what it holds.
    EXPECT_EQ(s.to_merge.empty(), i < 3) << i;
    EXPECT_EQ(s.to_scan.empty(), i >= 4) << i;
    EXPECT_LE(footprint(step_blocks(s)), 1200u) << i;
    // The sketches are complete after the last scan, before any merge.
    EXPECT_EQ(s.combine, i == 3) << i;
  }
  EXPECT_EQ(concat(steps, true), blocks(0, 12));
  // The last scanned part (blocks 9-11) is merged where it is, the rest in parts read again.
  EXPECT_EQ(steps[3].to_scan, blocks(9, 12));
  EXPECT_EQ(steps[3].to_merge, blocks(9, 12));
  std::vector<std::uint32_t> merged = concat(steps, false);
  std::sort(merged.begin(), merged.end());
  EXPECT_EQ(merged, blocks(1, 12));
  EXPECT_EQ(steps[4].to_merge, blocks(1, 3));  // cut from the end: the first part is the rest
  EXPECT_EQ(steps[5].to_merge, blocks(3, 6));
  EXPECT_EQ(steps[6].to_merge, blocks(6, 9));
}

TEST(WindowSteps, PartsAreCutFromTheEndSoTheLastScanHoldsAFullPart) {
  const Blocking blocking = two_tensors();
  const auto footprint = footprint_of(blocking);
  // 11 blocks, three per part: 2 + 3 + 3 + 3, the short part first.
  const auto steps = window_steps(blocks(0, 11), blocks(0, 11), footprint, 1200, true);
  ASSERT_EQ(steps.size(), 4u + 3u);
  EXPECT_EQ(steps[0].to_scan, blocks(0, 2));
  EXPECT_EQ(steps[3].to_scan, blocks(8, 11));
  EXPECT_EQ(steps[3].to_merge, blocks(8, 11));
  EXPECT_EQ(combining_steps(steps), 1);
  EXPECT_TRUE(steps[3].combine);
}

TEST(WindowSteps, LastScanMergesOnlyBlocksStillToMerge) {
  const Blocking blocking = two_tensors();
  // Blocks 10 and 11 were merged before (a resumed run): the last scan merges only block 9,
  // and blocks the merge needs but no scan holds (none here) would come in parts after it.
  std::vector<std::uint32_t> to_merge = blocks(0, 10);
  const auto steps = window_steps(blocks(0, 12), to_merge, footprint_of(blocking), 1200, true);
  ASSERT_EQ(steps.size(), 4u + 3u);
  EXPECT_EQ(steps[3].to_merge, std::vector<std::uint32_t>{9});
  std::vector<std::uint32_t> merged = concat(steps, false);
  std::sort(merged.begin(), merged.end());
  EXPECT_EQ(merged, to_merge);
}

TEST(WindowSteps, WithoutScansTheFirstMergeCombines) {
  const Blocking blocking = two_tensors();
  const auto steps = window_steps({}, blocks(0, 12), footprint_of(blocking), 800, true);
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_EQ(combining_steps(steps), 1);
  EXPECT_TRUE(steps[0].combine);
  EXPECT_EQ(concat(steps, false), blocks(0, 12));
}

TEST(WindowSteps, EmptyShareStillCombines) {
  const Blocking blocking = two_tensors();
  const auto steps = window_steps({}, {}, footprint_of(blocking), 800, true);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(steps[0].combine);
  EXPECT_FALSE(steps[0].held);  // nothing to read
}

TEST(WindowSteps, BlockLargerThanTheLimitIsAPartOfItsOwn) {
  const Blocking blocking = two_tensors();
  const auto steps = window_steps(blocks(0, 3), {}, footprint_of(blocking), 100, true);
  ASSERT_EQ(steps.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) EXPECT_EQ(steps[i].to_scan, blocks(i, i + 1));
  EXPECT_EQ(combining_steps(steps), 1);
  EXPECT_TRUE(steps[2].combine);
}

// Speculating, each scan part but the last merges its own blocks at once (the guess checked at
// the combine), and the merge's parts after the combine only recheck what a guess got wrong.
TEST(WindowSteps, SpeculatingScanPartsMergeTheirBlocksAndLaterPartsRecheck) {
  const Blocking blocking = two_tensors();
  // Block 0 was merged before (a resumed run): no part merges it.
  const auto steps =
      window_steps(blocks(0, 12), blocks(1, 12), footprint_of(blocking), 1200, true, true);
  ASSERT_EQ(steps.size(), 4u + 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(steps[i].speculative) << i;
    EXPECT_FALSE(steps[i].combine) << i;
  }
  EXPECT_EQ(steps[0].to_merge, blocks(1, 3));
  EXPECT_EQ(steps[1].to_merge, steps[1].to_scan);
  EXPECT_EQ(steps[2].to_merge, blocks(6, 9));
  // The last scanned part merges with the combined thresholds, no guess.
  EXPECT_TRUE(steps[3].combine);
  EXPECT_FALSE(steps[3].speculative);
  EXPECT_EQ(steps[3].to_merge, blocks(9, 12));
  // The same parts as without speculating follow, each merging only what a check rejects.
  const auto plain = window_steps(blocks(0, 12), blocks(1, 12), footprint_of(blocking), 1200, true);
  for (std::size_t i = 4; i < steps.size(); ++i) {
    EXPECT_TRUE(steps[i].recheck) << i;
    EXPECT_FALSE(steps[i].speculative || steps[i].combine) << i;
    EXPECT_TRUE(steps[i].to_scan.empty()) << i;
    EXPECT_EQ(steps[i].to_merge, plain[i].to_merge) << i;
    EXPECT_FALSE(plain[i].recheck || plain[i].speculative) << i;
  }
  for (const WindowStep& s : plain) EXPECT_FALSE(s.speculative) << "without speculating";
}

// A share held whole, or scanned in one part, has nothing to guess: one combine, then merges.
TEST(WindowSteps, SpeculatingChangesNothingWithoutSeveralScanParts) {
  const Blocking blocking = two_tensors();
  expect_one_step(
      window_steps(blocks(0, 12), blocks(0, 12), footprint_of(blocking), 4000, true, true), true,
      blocks(0, 12), blocks(0, 12));
  // One scan part (block 11) and merges of blocks no scan holds (thresholds known): no recheck.
  const auto steps =
      window_steps(blocks(11, 12), blocks(0, 12), footprint_of(blocking), 1200, true, true);
  ASSERT_GE(steps.size(), 2u);
  EXPECT_TRUE(steps[0].combine);
  for (const WindowStep& s : steps) EXPECT_FALSE(s.speculative || s.recheck);
}

TEST(HeldRanges, OneRangePerSourceForEachRunOfATensorsBlocks) {
  const Blocking blocking = two_tensors();
  // Blocks 2-4 of "a" (one run), 7 of "a" (another), 10-11 = all of "b" (a third tensor run).
  const std::vector<std::uint32_t> list = {2, 3, 4, 7, 10, 11};
  const auto ranges = held_ranges(blocking, list, kExperts);
  ASSERT_EQ(ranges.size(), 3u * (kExperts + 1));
  for (std::size_t run = 0; run < 3; ++run)
    for (std::size_t s = 0; s <= kExperts; ++s) {
      const HeldRange& r = ranges[run * (kExperts + 1) + s];
      EXPECT_EQ(r.source.expert, static_cast<int>(s) - 1);
      const std::uint32_t tensor = run == 2 ? 1 : 0;
      const std::uint64_t begin = run == 0 ? 200 : run == 1 ? 700 : 0;
      const std::uint64_t length = run == 0 ? 300 : run == 1 ? 100 : 200;
      EXPECT_EQ(r.tensor, tensor);
      EXPECT_EQ(r.byte_begin, begin);
      EXPECT_EQ(r.length, length);
    }
}

TEST(HeldRanges, UnwantedExpertBlocksAreLeftOutAndSplitTheirRun) {
  const Blocking blocking = two_tensors();
  // Expert 1 is not wanted in block 3: its run 2-4 becomes 2 and 4; the base always stays.
  const auto ranges =
      held_ranges(blocking, blocks(2, 5), kExperts,
                  [](std::size_t k, std::uint32_t b) { return !(k == 1 && b == 3); });
  std::uint64_t expert1_bytes = 0, base_bytes = 0;
  int expert1_ranges = 0;
  for (const HeldRange& r : ranges) {
    if (r.source.expert == 1) {
      ++expert1_ranges;
      expert1_bytes += r.length;
      EXPECT_TRUE(r.byte_begin == 200 || r.byte_begin == 400) << r.byte_begin;
    }
    if (r.source.expert == SourceId::kBase) base_bytes += r.length;
  }
  EXPECT_EQ(expert1_ranges, 2);
  EXPECT_EQ(expert1_bytes, 200u);
  EXPECT_EQ(base_bytes, 300u);
  EXPECT_EQ(ranges.size(), 1u + 1u + 2u + 1u);  // base, expert 0, expert 1 (split), expert 2
  // Not even the base is dropped when no expert is wanted.
  const auto base_only = held_ranges(blocking, blocks(0, 1), kExperts,
                                     [](std::size_t, std::uint32_t) { return false; });
  ASSERT_EQ(base_only.size(), 1u);
  EXPECT_EQ(base_only[0].source.expert, SourceId::kBase);
}

TEST(FullReadWindowBytes, HoldsAboutTheSameBytesOfEveryInputWithinItsBounds) {
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  EXPECT_EQ(full_read_window_bytes(1), 128 * kMiB);  // 48 MiB of inputs: the floor
  EXPECT_EQ(full_read_window_bytes(4), 128 * kMiB);  // 120 MiB
  EXPECT_EQ(full_read_window_bytes(5), 144 * kMiB);
  EXPECT_EQ(full_read_window_bytes(9), 240 * kMiB);
  EXPECT_EQ(full_read_window_bytes(10), 256 * kMiB);  // 264 MiB: the cap
  EXPECT_EQ(full_read_window_bytes(1000), 256 * kMiB);
}

}  // namespace
}  // namespace mergepipe
