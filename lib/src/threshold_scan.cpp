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
// Elements of a slice widened at once by a Gram scan ((experts + 1) fp64 copies of them, 5.5 MB
// at K = 20), and per accumulation chunk (their 21 copies stay in L2).
constexpr std::size_t kGramStepElems = 32768;
constexpr std::size_t kGramChunkElems = 2048;

StreamOptions stream_options(const ThresholdScan& scan) {
  StreamOptions options;
  options.io_threads = scan.io_threads;
  options.depth = scan.prefetch_depth;
  options.slice_bytes = scan.slice_bytes;
  options.pool = scan.pool;
  return options;
}

// The Gram scan: per slice step, every expert's deltas converted (workers own experts), then
// the products accumulated in cache-sized chunks (workers own tiles of up to four pairs of one
// row), each pair in element order.
ScanResult scan_grams(const ThresholdScan& scan, const std::vector<std::uint32_t>& blocks,
                      BlockReader& reader) {
  const Blocking& blocking = *scan.blocking;
  const std::size_t experts = scan.densities.size(), vectors = experts + 1;
  BlockStream stream(blocking, blocks, experts, reader, stream_options(scan));
  WorkerPool pool(scan.threads);
  const auto workers = static_cast<std::size_t>(pool.size());
  constexpr std::size_t kChunks = kGramStepElems / kGramChunkElems;
  // The vectors of the current step as doubles (exact), and which chunks of a delta are zero.
  std::vector<std::vector<double>> wide(vectors, std::vector<double>(kGramStepElems));
  std::vector<float> base_f32(kGramChunkElems * workers), delta_f32(kGramChunkElems * workers);
  std::vector<char> unchanged(experts * kChunks);  // [expert][chunk] of the current step
  struct Tile {
    std::size_t a, b_first, count;
  };
  std::vector<Tile> tiles;
  for (std::size_t a = 0; a < vectors; ++a)
    for (std::size_t b = a; b < vectors; b += 4)
      tiles.push_back({a, b, std::min<std::size_t>(4, vectors - b)});
  ScanResult result;
  std::vector<char> slice_changed(experts);
  GramAccumulator block_gram(experts);
  for (std::size_t i = 0; i < blocks.size();) {
    if (scan.stop_requested && scan.stop_requested()) {
      result.complete = false;
      break;
    }
    auto loaded = stream.next(result.read_wait_seconds);
    const DType dtype = (*scan.tensors)[blocking.blocks[loaded->block].tensor].dtype;
    const std::size_t size = dtype_size(dtype);
    std::fill(slice_changed.begin(), slice_changed.end(), 0);
    for (std::uint64_t step = 0; step < loaded->elem_count; step += kGramStepElems) {
      const std::size_t n = std::min<std::uint64_t>(kGramStepElems, loaded->elem_count - step);
      const std::byte* base_bytes = loaded->base.data() + step * size;
      pool.run([&](int worker) {
        const auto w = static_cast<std::size_t>(worker);
        float* const local_base = base_f32.data() + w * kGramChunkElems;
        float* const local_delta = delta_f32.data() + w * kGramChunkElems;
        // Worker 0 widens the base; every worker checks and widens its experts' deltas, chunk
        // by chunk (the zero check compares bytes, the conversion needs the base in fp32).
        for (std::size_t c = 0; c * kGramChunkElems < n; ++c) {
          const std::size_t first = c * kGramChunkElems, m = std::min(kGramChunkElems, n - first);
          const std::byte* chunk_base = base_bytes + first * size;
          convert_to_f32(dtype, chunk_base, local_base, m);
          if (w == 0) std::copy_n(local_base, m, wide[0].data() + first);
          ZeroDeltaCheck same(chunk_base, m * size, local_base, m);
          for (std::size_t k = w; k < experts; k += workers) {
            const std::byte* expert_bytes = loaded->experts[k].data() + (step + first) * size;
            unchanged[k * kChunks + c] = same(expert_bytes) ? 1 : 0;
            if (unchanged[k * kChunks + c]) continue;
            slice_changed[k] = 1;
            convert_delta_to_f32(dtype, expert_bytes, local_base, local_delta, m);
            std::copy_n(local_delta, m, wide[k + 1].data() + first);
          }
        }
      });
      const std::uint64_t position = block_gram.elements();
      pool.run([&](int worker) {
        std::vector<const double*> ys(4);
        for (std::size_t c = 0; c * kGramChunkElems < n; ++c) {
          const std::size_t first = c * kGramChunkElems, m = std::min(kGramChunkElems, n - first);
          const auto zero = [&](std::size_t v) {
            return v > 0 && unchanged[(v - 1) * kChunks + c];
          };
          for (std::size_t t = static_cast<std::size_t>(worker); t < tiles.size(); t += workers) {
            const Tile& tile = tiles[t];
            if (zero(tile.a)) continue;  // a zero delta's products are zero: skipped (same bits)
            // Runs of non-zero vectors within the tile.
            for (std::size_t j = 0; j < tile.count;) {
              if (zero(tile.b_first + j)) {
                ++j;
                continue;
              }
              std::size_t run = 0;
              while (j + run < tile.count && !zero(tile.b_first + j + run)) {
                ys[run] = wide[tile.b_first + j + run].data() + first;
                ++run;
              }
              block_gram.add_row(tile.a, tile.b_first + j, run, wide[tile.a].data() + first,
                                 ys.data(), m, position + first);
              j += run;
            }
          }
        }
      });
      block_gram.advance(n);
    }
    const bool last_slice = loaded->last_slice;
    const std::uint32_t block = loaded->block;
    const std::uint64_t bytes = loaded->byte_length * (experts + 1);
    std::vector<char>& changed = result.changed[block];
    changed.resize(experts, 0);
    for (std::size_t k = 0; k < experts; ++k) changed[k] |= slice_changed[k];
    stream.recycle(std::move(loaded));
    if (scan.on_block) scan.on_block(bytes);
    if (!last_slice) continue;
    result.grams[block] = block_gram.totals();
    block_gram = GramAccumulator(experts);
    ++i;
  }
  return result;
}

}  // namespace

ScanResult scan_sketches(const ThresholdScan& scan, const std::vector<std::uint32_t>& blocks,
                         BlockReader& reader) {
  if (scan.gram) return scan_grams(scan, blocks, reader);
  const Blocking& blocking = *scan.blocking;
  const std::size_t experts = scan.densities.size();
  BlockStream stream(blocking, blocks, experts, reader, stream_options(scan));
  WorkerPool pool(scan.threads);
  // Each worker owns the experts k with k % workers == worker: no sketch is shared.
  std::vector<std::vector<float>> base(static_cast<std::size_t>(pool.size()),
                                       std::vector<float>(kChunkElems)),
      delta = base;

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
            sketches[k].add_zeros(n);
            continue;
          }
          slice_changed[k] = 1;
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
  for (std::uint32_t t : tensor_list)
    result.push_back(tensor_trim_thresholds(scan, t, scanned.sketches[t]));
  return result;
}

std::vector<float> tensor_trim_thresholds(const ThresholdScan& scan, std::size_t tensor,
                                          const std::vector<MagnitudeSketch>& whole) {
  const std::size_t experts = scan.densities.size();
  const bool band = !scan.gammas.empty();
  std::vector<float> values((band ? 2 : 1) * experts);
  for (std::size_t k = 0; k < experts; ++k) {
    if (band) {
      const TrimBand b = whole[k].band(scan.density(tensor, k), scan.gamma(tensor, k));
      values[k] = b.lower;
      values[experts + k] = b.upper;
    } else {
      values[k] = whole[k].threshold(scan.density(tensor, k));
    }
  }
  return values;
}

}  // namespace mergepipe
