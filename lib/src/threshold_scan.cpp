#include "mergepipe/threshold_scan.hpp"

#include "mergepipe/dtype.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/worker_pool.hpp"

namespace mergepipe {

namespace {
// Elements per step: base and one delta chunk stay in L1/L2.
constexpr std::size_t kChunkElems = 4096;
}  // namespace

std::vector<std::vector<float>> scan_thresholds(const ThresholdScan& scan,
                                                const std::vector<std::uint32_t>& tensor_list,
                                                BlockReader& reader) {
  const Blocking& blocking = *scan.blocking;
  const std::size_t experts = scan.densities.size();
  std::vector<std::uint32_t> blocks;
  for (std::uint32_t t : tensor_list)
    for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i)
      blocks.push_back(blocking.first_block[t] + i);

  StreamOptions options;
  options.io_threads = scan.io_threads;
  options.depth = scan.prefetch_depth;
  BlockStream stream(blocking, blocks, experts, reader, std::move(options));
  WorkerPool pool(scan.threads);
  // Each worker owns the experts k with k % workers == worker: no sketch is shared.
  std::vector<std::vector<float>> base(static_cast<std::size_t>(pool.size()),
                                       std::vector<float>(kChunkElems)),
      delta = base;

  std::vector<std::vector<float>> result;
  std::vector<MagnitudeSketch> sketches(experts);
  double waited = 0;
  for (std::uint32_t t : tensor_list) {
    for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i) {
      if (scan.stop_requested && scan.stop_requested()) return result;
      auto loaded = stream.next(waited);
      const Block& blk = blocking.blocks[loaded->block];
      const DType dtype = (*scan.tensors)[blk.tensor].dtype;
      const std::size_t size = dtype_size(dtype);
      pool.run([&](int worker) {
        const auto w = static_cast<std::size_t>(worker);
        for (std::size_t first = 0; first < blk.elem_count; first += kChunkElems) {
          const std::size_t n = std::min<std::size_t>(kChunkElems, blk.elem_count - first);
          convert_to_f32(dtype, loaded->base.data() + first * size, base[w].data(), n);
          for (std::size_t k = w; k < experts; k += static_cast<std::size_t>(pool.size())) {
            convert_delta_to_f32(dtype, loaded->experts[k].data() + first * size, base[w].data(),
                                 delta[w].data(), n);
            sketches[k].add(delta[w].data(), n);
          }
        }
      });
      stream.recycle(std::move(loaded));
      if (scan.on_block) scan.on_block(blk.byte_length * (experts + 1));
    }
    std::vector<float> thresholds(experts);
    for (std::size_t k = 0; k < experts; ++k) {
      thresholds[k] = sketches[k].threshold(scan.densities[k]);
      sketches[k] = MagnitudeSketch();
    }
    result.push_back(std::move(thresholds));
  }
  return result;
}

}  // namespace mergepipe
