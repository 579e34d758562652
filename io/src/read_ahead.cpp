#include "mergepipe/io/read_ahead.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <span>

#include "mergepipe/io/aligned_buffer.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/page_residency.hpp"
#include "mergepipe/thread_name.hpp"

namespace mergepipe::io {

namespace {
// Each read is one chunk; the kernel is asked for the chunk kChunksAhead beyond it meanwhile, so
// the device always has work queued (one synchronous reader alone leaves it idle between
// requests). Measured: having the kernel fill the cache alone (WILLNEED, then a one-byte read
// to wait) slowed the catalog load running beside it more than these copies do.
constexpr std::uint64_t kChunkBytes = 4 << 20;
constexpr std::uint64_t kChunksAhead = 3;
}  // namespace

std::vector<FileRange> tensor_read_order(const Checkpoint& checkpoint) {
  std::vector<FileRange> ranges;
  for (const StoredTensor& t : checkpoint.tensors) {
    if (t.length == 0) continue;
    const FileRange range{t.file, t.offset, t.length};
    append_ranges(ranges, std::span(&range, 1));
  }
  return ranges;
}

std::vector<FileRange> slice_ranges(std::span<const FileRange> ranges, std::uint64_t begin,
                                    std::uint64_t length) {
  std::vector<FileRange> slice;
  std::uint64_t at = 0;  // where the current range starts in the concatenation
  for (const FileRange& r : ranges) {
    if (length == 0) break;
    if (begin < at + r.length) {
      const std::uint64_t skip = begin > at ? begin - at : 0;
      const std::uint64_t take = std::min(r.length - skip, length);
      slice.push_back({r.path, r.offset + skip, take});
      length -= take;
      begin += take;
    }
    at += r.length;
  }
  return slice;
}

void append_ranges(std::vector<FileRange>& ranges, std::span<const FileRange> more) {
  for (const FileRange& r : more) {
    if (r.length == 0) continue;
    if (!ranges.empty() && ranges.back().path == r.path &&
        ranges.back().offset + ranges.back().length == r.offset) {
      ranges.back().length += r.length;
    } else {
      ranges.push_back(r);
    }
  }
}

std::vector<FileRange> rank_shares(std::span<const FileRange> ranges, int ranks,
                                   std::span<const int> chosen) {
  const std::uint64_t total = total_bytes(ranges);
  const auto share_start = [&](int rank) {
    return static_cast<std::uint64_t>(static_cast<long double>(total) * rank / ranks);
  };
  std::vector<FileRange> shares;
  for (int rank : chosen) {
    if (rank < 0 || rank >= ranks) continue;
    const std::uint64_t begin = share_start(rank);
    append_ranges(shares, slice_ranges(ranges, begin, share_start(rank + 1) - begin));
  }
  return shares;
}

std::vector<int> rank0_node_share_positions(std::span<const int> node_ranks, bool per_node_ranges) {
  if (node_ranks.empty()) return {0};
  if (!per_node_ranges) return {node_ranks.begin(), node_ranks.end()};
  std::vector<int> positions(node_ranks.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int>(i);
  return positions;
}

std::uint64_t total_bytes(std::span<const FileRange> ranges) {
  std::uint64_t total = 0;
  for (const FileRange& r : ranges) total += r.length;
  return total;
}

bool finish_read_ahead_first(std::size_t node_ranks, int ranks, std::uint64_t bytes,
                             std::uint64_t memory) {
  return ranks > 0 && node_ranks == static_cast<std::size_t>(ranks) && bytes <= memory / 4;
}

BackgroundReadAhead::BackgroundReadAhead(std::vector<FileRange> ranges, std::uint64_t max_bytes,
                                         std::vector<int> cpus)
    : ranges_(std::move(ranges)), max_bytes_(max_bytes), cpus_(std::move(cpus)) {
  thread_ = std::thread([this] { run(); });
}

BackgroundReadAhead::~BackgroundReadAhead() {
  stop();
}

std::uint64_t BackgroundReadAhead::stop() {
  stop_ = true;
  return wait();
}

std::uint64_t BackgroundReadAhead::wait() {
  if (thread_.joinable()) thread_.join();
  return bytes_.load();
}

void BackgroundReadAhead::run() {
  name_this_thread("mp-readahead");
  if (!cpus_.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus_)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    (void)::sched_setaffinity(0, sizeof set, &set);  // a hint too: stay put if refused
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    AlignedBuffer buffer;
    buffer.reserve(kChunkBytes);
    std::uint64_t left = max_bytes_;
    for (const FileRange& range : ranges_) {
      if (stop_ || left == 0) return;
      const File file(range.path, File::Mode::kRead);
      // A file already in the page cache (a repeated merge) gains nothing: skip the copies.
      if (mostly_cached(file)) continue;
      const std::uint64_t end = range.offset + std::min(range.length, left);
      for (std::uint64_t at = range.offset; at < end && !stop_; at += kChunkBytes) {
        const std::uint64_t ahead = at + kChunksAhead * kChunkBytes;
        if (ahead < end) file.will_need(ahead, std::min(kChunkBytes, end - ahead));
        const std::uint64_t n = std::min(kChunkBytes, end - at);
        file.read_at(at, std::span(buffer.data(), n));
        bytes_ += n;
        left -= n;
        seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
  } catch (const std::exception&) {
    // A hint only: the merge reads these bytes itself and reports any problem in context.
  }
}

}  // namespace mergepipe::io
