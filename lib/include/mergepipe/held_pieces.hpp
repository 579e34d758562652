#pragma once
// A budgeted merge with its expert blocks read ahead in pieces held in memory. The executor's
// stream reads each admitted expert block in compute-sized slices (128 KiB), one request per
// slice; a direct request that small gets a fraction of what the device delivers to large ones
// (bench/direct_memory_bench: 1.70 GB/s at 128 KiB, 4.91 GB/s at 4 MiB, 8 threads, huge-page
// memory), and larger slices cost more in the merge than they gain (cache misses). So reading
// and merging are decoupled the way the full-read TIES windows are: the blocks are cut into
// pieces of at most `piece_bytes` of admitted expert bytes; the next piece is read into a
// RetainedWindow in large requests while this one merges from views of the other. With
// `hold_base` (what merges whose experts are read around the page cache do) the pieces hold
// their blocks' base bytes too; else the base streams from the storage reader.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "mergepipe/executor.hpp"
#include "mergepipe/retained_window.hpp"

namespace mergepipe {

struct HeldPiece {
  std::vector<std::uint32_t> blocks;  // consecutive blocks of the list it was cut from
  std::vector<HeldRange> ranges;   // their admitted expert (and held base) bytes; empty: not held
  std::uint64_t expert_bytes = 0;  // admitted expert bytes of the blocks
};

// Cuts `blocks` (merged in this order) into pieces of whole blocks whose admitted expert bytes
// are at most `piece_bytes`; adjacent bytes of one expert's tensor are one range. A block whose
// admitted bytes alone exceed `piece_bytes` is a piece of its own that is not held (its expert
// slices are read as it merges), so held memory stays bounded by the limit. With `with_base`,
// a held piece also holds its blocks' base bytes, and the limit counts them (at K = 2 they
// are a third of a piece).
std::vector<HeldPiece> cut_held_pieces(
    const Blocking& blocking, std::span<const std::uint32_t> blocks, std::size_t experts,
    const std::function<bool(std::size_t, std::size_t)>& admitted, std::uint64_t piece_bytes,
    bool with_base = false);

// Expert bytes from a held piece; base bytes from the piece too when it holds them, else from
// a storage reader.
class HeldExpertsReader final : public BlockReader {
 public:
  HeldExpertsReader(BlockReader& storage, RetainedWindow& experts, bool base_held = false)
      : storage_(storage), experts_(experts), base_held_(base_held) {}
  void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
            std::span<std::byte> dst) override;
  std::byte* view(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                  std::uint64_t length) override;
  void prefetch(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                std::uint64_t length) override;
  std::string describe(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                       std::uint64_t length) const override;

 private:
  BlockReader& storage_;
  RetainedWindow& experts_;
  bool base_held_;
};

struct HeldPieceOptions {
  std::uint64_t piece_bytes = std::uint64_t{64} << 20;   // 0: no pieces, slices read as merged
  int fill_threads = 4;                                  // concurrent requests of a fill
  std::uint64_t request_bytes = std::uint64_t{4} << 20;  // largest request of a fill
  // Hold each held piece's base bytes too: streamed through the page cache, the base cost a
  // cold K = 10 linear full read ~2 s of CPU in copies alone, a K = 20 TIES 10% merge 17% of
  // its CPU samples. The storage reader should then read its base around the page cache.
  bool hold_base = false;
};

struct HeldPieceStats {
  std::uint64_t pieces = 0, held_pieces = 0, held_bytes = 0;
  double fill_wait_seconds = 0;  // waiting for a piece's reads (also in read_wait_seconds)
};

// Merges the block lists `next_list` hands out, in turn, until it returns nothing (or the
// observer asks to stop). While a piece merges, the next one is read, also across lists: the
// next list is asked for when the current one's last piece starts. Rethrows the first read or
// merge error after the reads in flight have ended.
ExecutionStats execute_in_held_pieces(
    const ExecutionJob& job,
    const std::function<std::optional<std::vector<std::uint32_t>>()>& next_list,
    BlockReader& storage, OutputSink& sink, ExecutionObserver* observer,
    const HeldPieceOptions& options, HeldPieceStats* held_stats = nullptr);

// Adds `s`'s counts and times to `into` (not its block hashes).
void accumulate(ExecutionStats& into, const ExecutionStats& s);

}  // namespace mergepipe
