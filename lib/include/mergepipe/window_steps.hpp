#pragma once
// The order in which one rank scans and merges its share of a full-read TIES window.
//
// A share that fits in a retained window is one step: read once into memory, scanned, and merged
// after the ranks have combined the window's sketches. A share larger than that (an embedding
// matrix: 21 x 311 MB for K = 20 Qwen3-0.6B, 3.3 GB per rank at 2 ranks) is cut into parts that
// fit. Each part is read with O_DIRECT, scanned, and (speculating) merged at once with thresholds
// guessed from this rank's sketches so far; once the tensor's thresholds are known, a part whose
// own sketch shows a value that the guess trimmed differently is read again and merged anew
// (recheck steps), the others are done. A TIES threshold is a bucket edge of the sketch, so a
// guess from part of a tensor is usually the tensor's own. Without speculating, every part but
// the last is read twice: for the scan, and for the merge. The alternative to both, reading it
// through the page cache and then again from the cache, took 12 of the 22.7 s of a cold K = 20
// full-read TIES on the test VM, whose page cache path is several times slower than O_DIRECT.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mergepipe/blocking.hpp"
#include "mergepipe/retained_window.hpp"

namespace mergepipe {

// The default full-read TIES window (input bytes per rank): 24 MiB of each of the K + 1 inputs,
// between 128 and 256 MiB. Its two buffers are memory a run faults in once, at a cost that does not
// shrink with K (on the test VM, whose host backs guest memory on first touch, ~2 ms per MiB);
// sized by the inputs it stays the same share of the work. Cold full-read TIES, 128 against 256 MiB
// (bench/ab.py, 4 alternated reps): K = 2 0.934x, K = 5 0.976x, K = 10 1.043x.
std::uint64_t full_read_window_bytes(std::size_t experts);

struct WindowStep {
  std::vector<std::uint32_t> to_scan, to_merge;  // blocks, ascending
  bool held = false;                             // its blocks are read into a retained window first
  // The window's sketches are complete after this step's scan: combine them (a collective)
  // before this step's merge. Exactly one step of every window has it.
  bool combine = false;
  // Merges to_merge right after its scan, before the combine, with thresholds guessed from the
  // sketches so far; the guess is checked once the window's thresholds are known.
  bool speculative = false;
  // After the combine: merges only those of to_merge that no speculative step merged with the
  // thresholds the combine gave (or that its check could not prove alike); none left: skipped.
  bool recheck = false;
};

// The blocks a step reads: those it scans or merges, ascending.
std::vector<std::uint32_t> step_blocks(const WindowStep& step);

// Memory a list of blocks (ascending) needs when held, e.g. RetainedWindow::footprint of
// held_ranges() of the blocks.
using BlocksFootprint = std::function<std::uint64_t(std::span<const std::uint32_t>)>;

// Steps of one share: to_scan and to_merge ascending. Not `hold`: one step, read from wherever
// the reader reads. Otherwise one held step when the blocks of both lists fit in `limit` x 5/4,
// else held parts of at most `limit` bytes (at least one block each, cut from the end so the
// last part is a full one): the scan's parts, the last of which also merges its blocks once the
// sketches are combined (it is still in memory), then the merge's parts of the other blocks.
// `speculate`: every other scan part also merges its blocks to merge (speculative), and the
// merge's parts are recheck steps. Never empty: a share with nothing to do is one step that only
// combines.
std::vector<WindowStep> window_steps(const std::vector<std::uint32_t>& to_scan,
                                     const std::vector<std::uint32_t>& to_merge,
                                     const BlocksFootprint& footprint, std::uint64_t limit,
                                     bool hold, bool speculate = false);

// The byte ranges that hold `blocks` (ascending): one per source for each run of consecutive
// blocks of a tensor, base first; sources are the base and `experts` experts. A pair with
// wanted(expert, block) false is left out (the base is always in).
std::vector<HeldRange> held_ranges(
    const Blocking& blocking, std::span<const std::uint32_t> blocks, std::size_t experts,
    const std::function<bool(std::size_t expert, std::uint32_t block)>& wanted = {});

}  // namespace mergepipe
