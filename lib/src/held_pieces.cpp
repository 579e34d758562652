#include "mergepipe/held_pieces.hpp"

#include <array>
#include <chrono>
#include <deque>
#include <future>
#include <string>

#include "mergepipe/thread_name.hpp"

namespace mergepipe {

std::vector<HeldPiece> cut_held_pieces(
    const Blocking& blocking, std::span<const std::uint32_t> blocks, std::size_t experts,
    const std::function<bool(std::size_t, std::size_t)>& admitted, std::uint64_t piece_bytes,
    bool with_base) {
  std::vector<HeldPiece> pieces;
  // Per source (the base, then expert k at k + 1): its latest range in the open piece.
  std::vector<std::ptrdiff_t> last_range;
  std::uint64_t open_bytes = 0;  // bytes the open piece holds (or would, if alone)
  auto open_piece = [&] {
    pieces.emplace_back();
    last_range.assign(experts + 1, -1);
    open_bytes = 0;
  };
  for (std::uint32_t b : blocks) {
    const Block& blk = blocking.blocks[b];
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < experts; ++k)
      if (admitted(k, b)) bytes += blk.byte_length;
    const std::uint64_t held = bytes + (with_base ? blk.byte_length : 0);
    const bool alone = held > piece_bytes;
    // After a piece alone over the limit, a new one: its open_bytes > piece_bytes.
    if (pieces.empty() || alone || open_bytes + held > piece_bytes) open_piece();
    HeldPiece& piece = pieces.back();
    piece.blocks.push_back(b);
    piece.expert_bytes += bytes;
    open_bytes += held;
    if (alone) continue;  // not held: its piece gets no ranges
    for (int source = with_base ? SourceId::kBase : 0; source < static_cast<int>(experts);
         ++source) {
      if (source != SourceId::kBase && !admitted(static_cast<std::size_t>(source), b)) continue;
      std::ptrdiff_t& last = last_range[static_cast<std::size_t>(source + 1)];
      if (last >= 0) {
        HeldRange& r = piece.ranges[static_cast<std::size_t>(last)];
        if (r.tensor == blk.tensor && r.byte_begin + r.length == blk.byte_begin) {
          r.length += blk.byte_length;
          continue;
        }
      }
      last = static_cast<std::ptrdiff_t>(piece.ranges.size());
      piece.ranges.push_back({SourceId{source}, blk.tensor, blk.byte_begin, blk.byte_length});
    }
  }
  return pieces;
}

void HeldExpertsReader::read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                             std::span<std::byte> dst) {
  if (source.expert == SourceId::kBase && !base_held_)
    return storage_.read(source, tensor, byte_begin, dst);
  experts_.read(source, tensor, byte_begin, dst);
}

std::byte* HeldExpertsReader::view(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                   std::uint64_t length) {
  if (source.expert == SourceId::kBase && !base_held_)
    return storage_.view(source, tensor, byte_begin, length);
  return experts_.view(source, tensor, byte_begin, length);
}

void HeldExpertsReader::prefetch(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                 std::uint64_t length) {
  if (source.expert == SourceId::kBase && !base_held_)
    storage_.prefetch(source, tensor, byte_begin, length);
}

std::string HeldExpertsReader::describe(SourceId source, std::uint32_t tensor,
                                        std::uint64_t byte_begin, std::uint64_t length) const {
  return storage_.describe(source, tensor, byte_begin, length);
}

void accumulate(ExecutionStats& into, const ExecutionStats& s) {
  into.blocks_done += s.blocks_done;
  into.base_bytes += s.base_bytes;
  into.expert_bytes += s.expert_bytes;
  into.output_bytes += s.output_bytes;
  into.nonfinite += s.nonfinite;
  into.read_wait_seconds += s.read_wait_seconds;
  into.compute_seconds += s.compute_seconds;
  into.write_seconds += s.write_seconds;
  into.stopped = into.stopped || s.stopped;
}

ExecutionStats execute_in_held_pieces(
    const ExecutionJob& job,
    const std::function<std::optional<std::vector<std::uint32_t>>()>& next_list,
    BlockReader& storage, OutputSink& sink, ExecutionObserver* observer,
    const HeldPieceOptions& options, HeldPieceStats* held_stats) {
  ExecutionStats stats;
  HeldPieceStats held;
  if (options.piece_bytes == 0) {
    while (!stats.stopped) {
      const std::optional<std::vector<std::uint32_t>> list = next_list();
      if (!list) break;
      accumulate(stats, execute_blocks(job, *list, storage, sink, observer));
    }
    if (held_stats) *held_stats = held;
    return stats;
  }
  // Pieces cut from the lists drawn so far, not yet merged.
  std::deque<HeldPiece> queued;
  auto next_piece = [&]() -> std::optional<HeldPiece> {
    while (queued.empty()) {
      const std::optional<std::vector<std::uint32_t>> list = next_list();
      if (!list) return std::nullopt;
      for (HeldPiece& p : cut_held_pieces(*job.blocking, *list, job.experts, job.admitted,
                                          options.piece_bytes, options.hold_base))
        queued.push_back(std::move(p));
    }
    HeldPiece piece = std::move(queued.front());
    queued.pop_front();
    return piece;
  };
  std::array<RetainedWindow, 2> windows;  // piece i in windows[i % 2]
  // A piece that holds the base too has every byte in memory: its stream finds them on its own
  // thread (see StreamOptions::io_threads).
  ExecutionJob in_memory = job;
  in_memory.io_threads = 0;
  auto fill = [&](const HeldPiece& piece, RetainedWindow& window) {
    name_this_thread("mp-fill");
    window.fill(storage, piece.ranges, options.fill_threads, options.request_bytes);
  };
  using Clock = std::chrono::steady_clock;
  std::optional<HeldPiece> next = next_piece();
  std::future<void> filling;  // declared after what it uses: its destructor waits for it
  if (next) filling = std::async(std::launch::async, fill, std::cref(*next), std::ref(windows[0]));
  for (std::size_t i = 0; next; ++i) {
    const auto t0 = Clock::now();
    filling.get();  // this piece's reads; rethrows their error
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    held.fill_wait_seconds += waited;
    stats.read_wait_seconds += waited;
    const HeldPiece piece = std::move(*next);
    RetainedWindow& window = windows[i % 2];
    ++held.pieces;
    if (!piece.ranges.empty()) {
      ++held.held_pieces;
      held.held_bytes += piece.expert_bytes;
    }
    next = next_piece();
    if (next)
      filling =
          std::async(std::launch::async, fill, std::cref(*next), std::ref(windows[(i + 1) % 2]));
    if (piece.ranges.empty()) {
      accumulate(stats, execute_blocks(job, piece.blocks, storage, sink, observer));
    } else {
      HeldExpertsReader reader(storage, window, options.hold_base);
      accumulate(stats, execute_blocks(options.hold_base ? in_memory : job, piece.blocks, reader,
                                       sink, observer));
    }
    if (stats.stopped) break;
  }
  if (held_stats) *held_stats = held;
  return stats;
}

}  // namespace mergepipe
