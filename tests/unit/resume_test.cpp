// Resume bookkeeping: the journal's records survive a round trip, a torn tail or contradicting
// claims never turn into trusted claims, and a staging folder is kept only for the same task.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint_test_util.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/resume_journal.hpp"
#include "mergepipe/io/staging.hpp"

using namespace mergepipe;
using mergepipe::test::TempDir;
namespace fs = std::filesystem;

TEST(ResumeJournal, RoundTripOfBlocksAndThresholdsAcrossRanks) {
  TempDir dir;
  {
    io::JournalWriter r0(dir.path(), 0), r1(dir.path(), 1);
    r0.thresholds(2, std::vector<float>{0.5f, 0.25f, 1e-3f});
    r0.block_done(7, 0x1111);
    r1.block_done(9, 0x2222);
    r0.block_done(8, 0x3333);
    r1.thresholds(0, std::vector<float>{0.0f, 1.0f, 2.0f});
  }
  const io::JournalContents c = io::read_journals(dir.path(), 100, 5, 3);
  EXPECT_EQ(c.records, 5u);
  EXPECT_EQ(c.discarded, 0u);
  EXPECT_EQ(c.blocks,
            (std::map<std::uint32_t, std::uint64_t>{{7, 0x1111}, {8, 0x3333}, {9, 0x2222}}));
  ASSERT_EQ(c.thresholds.size(), 2u);
  EXPECT_EQ(c.thresholds.at(2), (std::vector<float>{0.5f, 0.25f, 1e-3f}));
  EXPECT_EQ(c.thresholds.at(0), (std::vector<float>{0.0f, 1.0f, 2.0f}));
}

TEST(ResumeJournal, TornTailIsIgnoredAndEarlierRecordsKept) {
  TempDir dir;
  {
    io::JournalWriter w(dir.path(), 0);
    for (std::uint32_t b = 0; b < 10; ++b) w.block_done(b, 100 + b);
  }
  const std::string path = dir.file("journal-0.bin");
  // A run killed in the middle of an append leaves part of a record.
  fs::resize_file(path, fs::file_size(path) - 5);
  io::JournalContents c = io::read_journals(dir.path(), 100, 1, 0);
  EXPECT_EQ(c.blocks.size(), 9u);
  EXPECT_EQ(c.blocks.count(9), 0u);
  EXPECT_EQ(c.discarded, 1u);
  // A flipped bit inside a record ends the trusted part of that file there.
  std::string bytes = test::read_file(path);
  bytes[32 * 4 + 4] ^= 0x04;  // the fifth record's block index (records are 32 bytes)
  test::write_file(path, bytes);
  c = io::read_journals(dir.path(), 100, 1, 0);
  EXPECT_EQ(c.blocks.size(), 4u);
}

TEST(ResumeJournal, ContradictingOrOutOfRangeClaimsAreDropped) {
  TempDir dir;
  {
    io::JournalWriter a(dir.path(), 0), b(dir.path(), 3);
    a.block_done(5, 1);
    b.block_done(5, 2);  // same block, another hash: trust neither
    a.block_done(6, 7);
    b.block_done(6, 7);                         // agreeing claims are fine
    a.block_done(500, 9);                       // beyond the blocking
    a.thresholds(1, std::vector<float>{1.0f});  // wrong expert count
  }
  const io::JournalContents c = io::read_journals(dir.path(), 100, 4, 2);
  EXPECT_EQ(c.blocks, (std::map<std::uint32_t, std::uint64_t>{{6, 7}}));
  EXPECT_TRUE(c.thresholds.empty());
  EXPECT_EQ(c.discarded, 3u);
}

TEST(Staging, LeftoverIsKeptOnlyForTheSameTask) {
  TempDir dir;
  const std::string target = dir.file("out");
  const std::string staged = io::staging_path_for(target);
  {
    io::StagingFolder first(target, io::StagingOptions{false, true, "task-a"});
    EXPECT_FALSE(first.resumed());
    test::write_file(staged + "/model.safetensors", "partial");
    io::JournalWriter(staged, 0).block_done(1, 2);
    // Simulate a killed run: the destructor of a live run would clean up, so copy the state
    // aside and put it back after.
    fs::copy(staged, dir.file("saved"), fs::copy_options::recursive);
  }
  EXPECT_FALSE(fs::exists(staged)) << "a run that ends without publishing removes its staging";
  fs::rename(dir.file("saved"), staged);
  {
    io::StagingFolder again(target, io::StagingOptions{false, true, "task-a"});
    EXPECT_TRUE(again.resumed());
    EXPECT_EQ(test::read_file(staged + "/model.safetensors"), "partial");
    fs::copy(staged, dir.file("saved"), fs::copy_options::recursive);
  }
  fs::rename(dir.file("saved"), staged);
  {
    io::StagingFolder other(target, io::StagingOptions{false, true, "task-b"});
    EXPECT_FALSE(other.resumed());
    EXPECT_FALSE(fs::exists(staged + "/model.safetensors")) << "another task's leftover was kept";
    fs::copy(staged, dir.file("saved"), fs::copy_options::recursive);
  }
  fs::rename(dir.file("saved"), staged);
  {
    io::StagingFolder fresh(target, io::StagingOptions{false, false, "task-b"});
    EXPECT_FALSE(fresh.resumed()) << "--no-resume kept the leftover";
  }
}

TEST(Staging, PublishLeavesNoBookkeepingInTheOutput) {
  TempDir dir;
  const std::string target = dir.file("out");
  {
    io::StagingFolder s(target, io::StagingOptions{false, true, "task"});
    test::write_file(s.path() + "/model.safetensors", "data");
    io::JournalWriter(s.path(), 0).block_done(0, 1);
    io::JournalWriter(s.path(), 1).block_done(1, 1);
    s.publish();
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(target)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(io::staging_path_for(target)));
}

TEST(Staging, ASecondWriterOfTheSameTargetIsRefusedAndLeavesTheFirstAlone) {
  TempDir dir;
  const std::string target = dir.file("out");
  io::StagingFolder first(target, io::StagingOptions{false, true, "task"});
  test::write_file(first.path() + "/model.safetensors", "first");
  try {
    io::StagingFolder second(target, io::StagingOptions{false, true, "task"});
    FAIL() << "the second writer got the lock";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("another merge is writing"), std::string::npos);
  }
  EXPECT_EQ(test::read_file(first.path() + "/model.safetensors"), "first");
}
