#include "mergepipe/window_steps.hpp"

#include <algorithm>
#include <iterator>
#include <optional>

namespace mergepipe {

std::uint64_t full_read_window_bytes(std::size_t experts) {
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  return std::clamp<std::uint64_t>(24 * kMiB * (experts + 1), 128 * kMiB, 256 * kMiB);
}

namespace {

// Consecutive parts of `blocks`, each within `limit` bytes held (or a single block), filled
// from the end: the last part is a full one and the first takes what is left over.
std::vector<std::vector<std::uint32_t>> cut_parts(const std::vector<std::uint32_t>& blocks,
                                                  const BlocksFootprint& footprint,
                                                  std::uint64_t limit) {
  std::vector<std::vector<std::uint32_t>> parts;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (!parts.empty()) {
      std::vector<std::uint32_t>& part = parts.back();
      part.insert(part.begin(), *b);
      if (footprint(part) <= limit) continue;
      part.erase(part.begin());
    }
    parts.push_back({*b});
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::vector<std::uint32_t> step_blocks(const WindowStep& step) {
  std::vector<std::uint32_t> blocks;
  std::set_union(step.to_scan.begin(), step.to_scan.end(), step.to_merge.begin(),
                 step.to_merge.end(), std::back_inserter(blocks));
  return blocks;
}

std::vector<WindowStep> window_steps(const std::vector<std::uint32_t>& to_scan,
                                     const std::vector<std::uint32_t>& to_merge,
                                     const BlocksFootprint& footprint, std::uint64_t limit,
                                     bool hold, bool speculate) {
  WindowStep whole{to_scan, to_merge, false, true};
  const std::vector<std::uint32_t> all = step_blocks(whole);
  whole.held = hold && !all.empty();
  if (!hold || all.empty() || footprint(all) <= limit * 5 / 4) return {std::move(whole)};
  std::vector<WindowStep> steps;
  for (std::vector<std::uint32_t>& part : cut_parts(to_scan, footprint, limit)) {
    WindowStep& step = steps.emplace_back(WindowStep{std::move(part), {}, true, false});
    if (!speculate) continue;
    std::set_intersection(step.to_scan.begin(), step.to_scan.end(), to_merge.begin(),
                          to_merge.end(), std::back_inserter(step.to_merge));
    step.speculative = !step.to_merge.empty();
  }
  // The last scan completes the sketches; without a scan, the first merge combines.
  const std::size_t combining = steps.empty() ? 0 : steps.size() - 1;
  // The last scanned part is still in memory when the thresholds are known: it is merged there
  // and then, not read again.
  std::vector<std::uint32_t> rest = to_merge;
  if (!steps.empty()) {
    WindowStep& last = steps.back();
    last.to_merge.clear();
    last.speculative = false;  // merged with the combined thresholds
    std::set_intersection(last.to_scan.begin(), last.to_scan.end(), to_merge.begin(),
                          to_merge.end(), std::back_inserter(last.to_merge));
    rest.clear();
    std::set_difference(to_merge.begin(), to_merge.end(), last.to_merge.begin(),
                        last.to_merge.end(), std::back_inserter(rest));
  }
  const bool recheck = speculate && combining > 0;
  for (std::vector<std::uint32_t>& part : cut_parts(rest, footprint, limit))
    steps.push_back(WindowStep{{}, std::move(part), true, false, false, recheck});
  steps[combining].combine = true;
  return steps;
}

std::vector<HeldRange> held_ranges(
    const Blocking& blocking, std::span<const std::uint32_t> blocks, std::size_t experts,
    const std::function<bool(std::size_t expert, std::uint32_t block)>& wanted) {
  std::vector<HeldRange> ranges;
  // Per source (base first): the range the next block of the same tensor may extend.
  std::vector<std::optional<std::size_t>> open(experts + 1);
  for (std::uint32_t b : blocks) {
    const Block& blk = blocking.blocks[b];
    for (std::size_t s = 0; s <= experts; ++s) {
      const int expert = static_cast<int>(s) - 1;
      if (expert >= 0 && wanted && !wanted(static_cast<std::size_t>(expert), b)) {
        open[s].reset();
        continue;
      }
      if (open[s]) {
        HeldRange& r = ranges[*open[s]];
        if (r.tensor == blk.tensor && r.byte_begin + r.length == blk.byte_begin) {
          r.length += blk.byte_length;
          continue;
        }
      }
      open[s] = ranges.size();
      ranges.push_back({SourceId{expert}, blk.tensor, blk.byte_begin, blk.byte_length});
    }
  }
  return ranges;
}

}  // namespace mergepipe
