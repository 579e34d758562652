#pragma once
// What an interrupted merge had finished, kept in its staging folder so that running the same
// command again continues where it stopped (a run killed by the scheduler, preemption, node
// loss). Every rank appends records to its own file `journal-<rank>.bin` after the bytes they
// describe went to the output, so no locking is needed and a record is never ahead of its data
// in program order. Nothing is fsynced: the records are claims that the resumed run checks
// against the staged output before trusting them (a block whose bytes do not hash to its record
// is merged again), so a lost or torn record only costs work, never correctness.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

class JournalWriter {
 public:
  // Opens (creates) `dir/journal-<rank>.bin` for appending.
  JournalWriter(const std::string& dir, int rank);
  // Output block `block` is written and its bytes hash to `output_hash` (hash64).
  void block_done(std::uint32_t block, std::uint64_t output_hash);
  // The TIES trimming thresholds of tensor `tensor`, one per expert (full reads compute them).
  void thresholds(std::uint32_t tensor, std::span<const float> per_expert);

 private:
  File file_;
};

struct JournalContents {
  std::map<std::uint32_t, std::uint64_t> blocks;           // block -> output hash
  std::map<std::uint32_t, std::vector<float>> thresholds;  // tensor -> per expert
  std::uint64_t records = 0;
  std::uint64_t discarded = 0;  // torn records, or claims that contradict each other
};

// Reads every journal file in `dir`. Records for blocks >= block_count, tensors >= tensor_count
// or with a threshold count other than `experts` are discarded, as are blocks claimed with two
// different hashes; a file's torn tail is ignored.
JournalContents read_journals(const std::string& dir, std::uint32_t block_count,
                              std::uint32_t tensor_count, std::size_t experts);

}  // namespace mergepipe::io
