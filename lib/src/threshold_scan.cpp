#include "mergepipe/threshold_scan.hpp"

#include <algorithm>
#include <stdexcept>

#include "mergepipe/dtype.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/worker_pool.hpp"
#include "mergepipe/zero_delta.hpp"

namespace mergepipe {

namespace {
// Elements per step: base and one delta chunk stay in L1/L2.
constexpr std::size_t kChunkElems = 4096;
}  // namespace

ScanResult scan_sketches(const ThresholdScan& scan, const std::vector<std::uint32_t>& blocks,
                         BlockReader& reader) {
  const Blocking& blocking = *scan.blocking;
  const std::size_t experts = scan.densities.size();
  StreamOptions options;
  options.io_threads = scan.io_threads;
  options.depth = scan.prefetch_depth;
  options.slice_bytes = scan.slice_bytes;
  options.pool = scan.pool;
  BlockStream stream(blocking, blocks, experts, reader, std::move(options));
  WorkerPool pool(scan.threads);
  // Each worker owns the experts k with k % workers == worker: no sketch is shared.
  std::vector<std::vector<float>> base(static_cast<std::size_t>(pool.size()),
                                       std::vector<float>(kChunkElems)),
      delta = base, other = base;
  if (scan.slerp_sums && experts != 1)
    throw std::invalid_argument("threshold scan: slerp's sums take one expert");

  ScanResult result;
  result.sketches.assign(scan.tensors->size(), std::vector<MagnitudeSketch>(experts));
  std::vector<char> slice_changed(experts);  // element k written by expert k's worker only
  for (std::size_t i = 0; i < blocks.size();) {
    if (scan.stop_requested && scan.stop_requested()) {
      result.complete = false;
      break;
    }
    auto loaded = stream.next(result.read_wait_seconds);
    const Block& blk = blocking.blocks[loaded->block];
    const std::uint64_t slice_elems = loaded->elem_count;
    const DType dtype = (*scan.tensors)[blk.tensor].dtype;
    const std::size_t size = dtype_size(dtype);
    std::vector<MagnitudeSketch>& sketches = result.sketches[blk.tensor];
    std::fill(slice_changed.begin(), slice_changed.end(), 0);
    SlerpSums* const sums = scan.slerp_sums ? &result.slerp_sums[loaded->block] : nullptr;
    pool.run([&](int worker) {
      const auto w = static_cast<std::size_t>(worker);
      for (std::size_t first = 0; first < slice_elems; first += kChunkElems) {
        const std::size_t n = std::min<std::size_t>(kChunkElems, slice_elems - first);
        const std::byte* base_bytes = loaded->base.data() + first * size;
        convert_to_f32(dtype, base_bytes, base[w].data(), n);
        ZeroDeltaCheck unchanged(base_bytes, n * size, base[w].data(), n);
        for (std::size_t k = w; k < experts; k += static_cast<std::size_t>(pool.size())) {
          const std::byte* expert_bytes = loaded->experts[k].data() + first * size;
          if (unchanged(expert_bytes)) {
            if (scan.sketch) sketches[k].add_zeros(n);
            if (sums) sums->add_unchanged(base[w].data(), n);  // expert 0's worker, in order
            continue;
          }
          slice_changed[k] = 1;
          if (sums) {
            convert_to_f32(dtype, expert_bytes, other[w].data(), n);
            sums->add(base[w].data(), other[w].data(), n);
          }
          if (!scan.sketch) continue;
          if (dtype == DType::kBF16) {
            sketches[k].add_bf16_deltas(expert_bytes, base[w].data(), n);
            continue;
          }
          convert_delta_to_f32(dtype, expert_bytes, base[w].data(), delta[w].data(), n);
          sketches[k].add(delta[w].data(), n);
        }
      }
    });
    const bool last_slice = loaded->last_slice;
    const std::uint64_t bytes = loaded->byte_length * (experts + 1);
    std::vector<char>& changed = result.changed[loaded->block];
    changed.resize(experts, 0);
    for (std::size_t k = 0; k < experts; ++k) changed[k] |= slice_changed[k];
    stream.recycle(std::move(loaded));
    if (scan.on_block) scan.on_block(bytes);
    if (!last_slice) continue;
    // A tensor's last block in the list: its dense counters (512 KiB each) go sparse now.
    if (i + 1 == blocks.size() || blocking.blocks[blocks[i + 1]].tensor != blk.tensor)
      for (MagnitudeSketch& s : sketches) s.compact();
    ++i;
  }
  return result;
}

std::vector<std::vector<float>> scan_thresholds(const ThresholdScan& scan,
                                                const std::vector<std::uint32_t>& tensor_list,
                                                BlockReader& reader) {
  const Blocking& blocking = *scan.blocking;
  std::vector<std::uint32_t> blocks;
  for (std::uint32_t t : tensor_list)
    for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i)
      blocks.push_back(blocking.first_block[t] + i);
  const ScanResult scanned = scan_sketches(scan, blocks, reader);
  std::vector<std::vector<float>> result;
  if (!scanned.complete) return result;
  for (std::uint32_t t : tensor_list) {
    std::vector<float> row;
    for (std::size_t k = 0; k < scan.densities.size(); ++k)
      row.push_back(scanned.sketches[t][k].threshold(scan.density(t, k)));
    result.push_back(std::move(row));
  }
  return result;
}

}  // namespace mergepipe
