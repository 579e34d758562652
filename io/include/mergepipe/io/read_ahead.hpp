#pragma once
// Reads byte ranges of files into the page cache on a background thread, in order, until it is
// stopped or has read its cap. A merge uses it to put rank 0's idle disk to work while it loads
// the catalog and plans: the base is read in full by every merge, and its first blocks are rank
// 0's first reads.
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mergepipe/checkpoint.hpp"

namespace mergepipe::io {

struct FileRange {
  std::string path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  bool operator==(const FileRange&) const = default;
};

// The tensor bytes of `checkpoint` in the order a merge reads them (checkpoint order), adjacent
// tensors of a file joined into one range.
std::vector<FileRange> tensor_read_order(const Checkpoint& checkpoint);

// Bytes [begin, begin + length) of the concatenation of `ranges` (clipped at its end), as
// ranges in the same order.
std::vector<FileRange> slice_ranges(std::span<const FileRange> ranges, std::uint64_t begin,
                                    std::uint64_t length);

// Appends `more` to `ranges`, joining a range that continues the last one in the same file.
void append_ranges(std::vector<FileRange>& ranges, std::span<const FileRange> more);

// The equal shares of `ranges` (in order: rank r gets bytes [total·r/ranks, total·(r+1)/ranks))
// of the ranks in `chosen`, in the order given; ranks outside [0, ranks) are ignored.
std::vector<FileRange> rank_shares(std::span<const FileRange> ranges, int ranks,
                                   std::span<const int> chosen);

// The shares (positions for rank_shares) that the merge hands to rank 0's node, whose ranks are
// `node_ranks`: with the dynamic schedule each node takes a contiguous range in the order of
// its lowest rank, rank 0's first, so the first node_ranks.size() positions; with the static one
// each rank takes its own position. (Reading by rank number under --map-by node prefetched base
// bytes another node merges.)
std::vector<int> rank0_node_share_positions(std::span<const int> node_ranks, bool per_node_ranges);

// Total bytes of `ranges`.
std::uint64_t total_bytes(std::span<const FileRange> ranges);

// Whether a merge should let rank 0's base read-ahead finish before it starts, rather than stop
// it once the plan is made: when all `ranks` are among the `node_ranks` ranks of rank 0's node
// (no other node would idle meanwhile) and its `bytes` fit in a quarter of the node's `memory`
// (they stay cached until the merge reads them). Measured on one node, a merge that read the rest
// of the base itself, between its expert reads and writes, took longer than the read-ahead
// needed to finish it.
bool finish_read_ahead_first(std::size_t node_ranks, int ranks, std::uint64_t bytes,
                             std::uint64_t memory);

class BackgroundReadAhead {
 public:
  // Starts reading `ranges` in order, at most `max_bytes` in all; a range whose file is mostly
  // in the page cache already is skipped (and not counted). Failures (a missing file, a
  // read error) end the read-ahead quietly: it is a hint, and the merge's own read of the same
  // bytes reports the problem with its context.
  // `cpus`: where its thread may run (empty: where the caller may).
  BackgroundReadAhead(std::vector<FileRange> ranges, std::uint64_t max_bytes,
                      std::vector<int> cpus = {});
  ~BackgroundReadAhead();
  BackgroundReadAhead(const BackgroundReadAhead&) = delete;
  BackgroundReadAhead& operator=(const BackgroundReadAhead&) = delete;

  // Issues no further reads, waits for the one in flight, and returns the bytes read. Idempotent.
  std::uint64_t stop();
  // Waits until everything (up to the cap) is read, or a failure ended it; returns the bytes read.
  std::uint64_t wait();
  // Seconds from the start to the last completed read.
  double seconds() const { return seconds_.load(); }

 private:
  void run();

  std::vector<FileRange> ranges_;
  const std::uint64_t max_bytes_;
  const std::vector<int> cpus_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<double> seconds_{0};
  std::thread thread_;
};

}  // namespace mergepipe::io
