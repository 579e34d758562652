#include "mergepipe/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "mergepipe/block_stats.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/worker_pool.hpp"
#include "mergepipe/zero_delta.hpp"

namespace mergepipe {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Elements merged per step: small enough that base, K deltas and the output of a chunk stay in
// L2 cache for K around 20, large enough to amortise the per-chunk work.
constexpr std::size_t kChunkElems = 2048;

// Per-worker scratch for one chunk.
struct Scratch {
  std::vector<float> base, out;
  std::vector<float> deltas;  // experts x kChunkElems
  std::vector<const float*> pointers;
  std::uint64_t nonfinite = 0;
};

// The error for a block whose merged values hold NaN/Inf, naming the input that holds them (the
// base's or an expert's file and byte range) or, when every input is finite, the overflow.
[[noreturn]] void throw_nonfinite(const ExecutionJob& job, const LoadedBlock& loaded,
                                  const BlockReader& reader, std::uint64_t count) {
  const Block& blk = job.blocking->blocks[loaded.block];
  const TensorInfo& tensor = (*job.tensors)[blk.tensor];
  std::vector<float> values(loaded.elem_count);
  auto nonfinite_in = [&](const ByteBuffer& bytes) {
    convert_to_f32(tensor.dtype, bytes.data(), values.data(), values.size());
    return count_nonfinite(values) > 0;
  };
  std::string where;
  if (nonfinite_in(loaded.base)) {
    where = reader.describe(SourceId{}, blk.tensor, blk.byte_begin + loaded.byte_offset,
                            loaded.byte_length) +
            ": tensor '" + tensor.name + "' of the base holds NaN/Inf values";
  }
  for (std::size_t k = 0; k < job.experts && where.empty(); ++k) {
    if (loaded.present[k] && nonfinite_in(loaded.experts[k])) {
      where = reader.describe(SourceId{static_cast<int>(k)}, blk.tensor,
                              blk.byte_begin + loaded.byte_offset, loaded.byte_length) +
              ": tensor '" + tensor.name + "' of expert " + std::to_string(k) +
              " holds NaN/Inf values";
    }
  }
  if (where.empty()) {
    where = "tensor '" + tensor.name + "': merging finite inputs overflowed to " +
            std::to_string(count) + " NaN/Inf values (check the weights and lambda)";
  }
  throw InputError(where + "; --allow-nonfinite writes them anyway");
}

}  // namespace

std::uint64_t block_cost(const ExecutionJob& job, std::uint32_t b) {
  const Block& blk = job.blocking->blocks[b];
  std::uint64_t cost = blk.byte_length + blk.elem_count * dtype_size(job.out_dtypes[blk.tensor]);
  for (std::size_t k = 0; k < job.experts; ++k)
    if (job.admitted(k, b)) cost += blk.byte_length;
  return cost;
}

ExecutionStats execute_blocks(const ExecutionJob& job, const std::vector<std::uint32_t>& blocks,
                              BlockReader& reader, OutputSink& sink, ExecutionObserver* observer) {
  ExecutionStats stats;
  stats.block_hashes.assign(blocks.size(), 0);
  if (blocks.empty()) return stats;

  WorkerPool pool(job.threads);
  std::vector<Scratch> scratch(static_cast<std::size_t>(pool.size()));
  for (auto& s : scratch) {
    s.base.resize(kChunkElems);
    s.out.resize(kChunkElems);
    s.deltas.resize(job.experts * kChunkElems);
    s.pointers.resize(job.experts);
  }
  // One per expert and threshold row (ties 1, breadcrumbs' band 2).
  std::vector<float> threshold_column;
  std::vector<std::byte> out_bytes;
  // Read checks hash each source's slices of a block in order: one state per source.
  std::vector<Hasher64> read_hashes(job.check_read.wanted ? job.experts + 1 : 0);
  std::vector<char> checking(read_hashes.size(), 0);
  StreamOptions stream_options;
  stream_options.io_threads = job.io_threads;
  stream_options.depth = job.prefetch_depth;
  stream_options.slice_bytes = job.slice_bytes;
  stream_options.wanted = job.admitted;
  stream_options.pool = job.pool;
  BlockStream stream(*job.blocking, blocks, job.experts, reader, std::move(stream_options));

  std::size_t i = 0;        // index in `blocks` of the block being merged
  std::uint64_t moved = 0;  // bytes the current block moved so far, over its slices
  bool mid_block = false;   // some slices of blocks[i] are merged, others are still to come
  std::unique_ptr<LoadedBlock> loaded;
  for (;;) {
    if (loaded) stream.recycle(std::move(loaded));
    if (i == blocks.size()) break;
    const std::uint32_t b = blocks[i];
    const Block& blk = job.blocking->blocks[b];
    // A stop is honoured between blocks only: a block's output is written whole or not at all.
    if (!mid_block && observer && observer->stop_requested()) {
      stats.stopped = true;
      break;
    }
    loaded = stream.next(stats.read_wait_seconds);
    const TensorInfo& tensor = (*job.tensors)[blk.tensor];
    const DType in_type = tensor.dtype;
    const std::size_t in_size = dtype_size(in_type);
    const DType out_type = job.out_dtypes[blk.tensor];
    const std::size_t out_size = dtype_size(out_type);
    if (loaded->first_slice) {
      out_bytes.resize(blk.elem_count * out_size);
      for (std::size_t src = 0; src < checking.size(); ++src) {
        const SourceId source{static_cast<int>(src) - 1};
        checking[src] = (source.expert == SourceId::kBase || loaded->present[src - 1]) &&
                        job.check_read.wanted(source, b);
        if (checking[src]) read_hashes[src].reset();
      }
    }

    TensorContext tctx{job.name_keys[blk.tensor], {}};
    if (!job.thresholds.empty()) {
      // thresholds are [row][tensor], a row per expert and threshold; gather this tensor's
      // column.
      const std::size_t tensors = job.tensors->size(), rows = job.thresholds.size() / tensors;
      threshold_column.resize(rows);
      for (std::size_t r = 0; r < rows; ++r)
        threshold_column[r] = job.thresholds[r * tensors + blk.tensor];
      tctx.thresholds = threshold_column;
    }

    const auto t0 = Clock::now();
    const std::uint64_t slice_elems = loaded->elem_count;
    const std::size_t chunks = (slice_elems + kChunkElems - 1) / kChunkElems;
    std::byte* out = out_bytes.data() + loaded->elem_offset * out_size;
    const std::uint64_t elem_begin = blk.elem_begin + loaded->elem_offset;
    // Items of work: the read checks' hashes of this slice (one per source, each in order), then
    // the chunks. Claimed by whichever worker is free: a per-slice fork-join that waited for
    // every thread cost more than the second thread gained (1 rank x 2 threads, K = 20 TIES
    // 10%: compute 1.7-1.9 s against 1.2-1.3 s with one thread).
    const std::size_t hashes = checking.size();
    pool.for_each(hashes + chunks, [&](int worker, std::size_t item) {
      if (item < hashes) {
        if (!checking[item]) return;
        const ByteBuffer& bytes = item == 0 ? loaded->base : loaded->experts[item - 1];
        read_hashes[item].update(bytes.data(), bytes.size());
        return;
      }
      Scratch& s = scratch[static_cast<std::size_t>(worker)];
      const std::size_t first = (item - hashes) * kChunkElems;
      const std::size_t n = std::min<std::size_t>(kChunkElems, slice_elems - first);
      const std::byte* base_bytes = loaded->base.data() + first * in_size;
      convert_to_f32(in_type, base_bytes, s.base.data(), n);
      ZeroDeltaCheck unchanged(base_bytes, n * in_size, s.base.data(), n);
      for (std::size_t k = 0; k < job.experts; ++k) {
        const std::byte* expert_bytes =
            loaded->present[k] ? loaded->experts[k].data() + first * in_size : nullptr;
        // An expert that changes nothing here merges like an omitted one: every operator
        // treats a +0 delta as an exact no-op (see operators.hpp).
        if (!expert_bytes || unchanged(expert_bytes)) {
          s.pointers[k] = nullptr;
          continue;
        }
        float* d = s.deltas.data() + k * kChunkElems;
        // Δ = float(θ_k) − float(θ0): the catalog's definition, so thresholds agree exactly.
        convert_delta_to_f32(in_type, expert_bytes, s.base.data(), d, n);
        s.pointers[k] = d;
      }
      merge_block(job.op_for(blk.tensor), tctx, elem_begin + first, n, s.base.data(), s.pointers,
                  s.out.data());
      s.nonfinite += count_nonfinite(std::span<const float>(s.out.data(), n));
      convert_from_f32(out_type, s.out.data(), out + first * out_size, n);
    });
    stats.compute_seconds += seconds_since(t0);

    std::uint64_t nonfinite = 0;
    for (auto& s : scratch) nonfinite += std::exchange(s.nonfinite, 0);
    if (nonfinite && !job.allow_nonfinite) throw_nonfinite(job, *loaded, reader, nonfinite);
    stats.nonfinite += nonfinite;
    moved += loaded->byte_length + slice_elems * out_size;
    for (std::size_t k = 0; k < job.experts; ++k)
      moved += loaded->present[k] ? loaded->byte_length : 0;
    mid_block = !loaded->last_slice;
    if (mid_block) continue;

    // The whole block is merged and read: check the reads, hash and hand over the output.
    for (std::size_t src = 0; src < checking.size(); ++src)
      if (checking[src])
        job.check_read.verify(SourceId{static_cast<int>(src) - 1}, b, read_hashes[src].digest());
    const std::uint64_t hash = hash64(out_bytes.data(), out_bytes.size());
    stats.block_hashes[i] = hash;
    const auto t1 = Clock::now();
    sink.write(blk.tensor, blk.elem_begin, out_bytes);
    stats.write_seconds += seconds_since(t1);
    stats.output_bytes += out_bytes.size();
    ++stats.blocks_done;
    if (observer) observer->block_done(b, hash, moved);
    moved = 0;
    ++i;
  }
  stats.base_bytes = stream.base_bytes();
  stats.expert_bytes = stream.expert_bytes();
  return stats;
}

std::string combine_block_hashes(std::span<const std::uint64_t> block_hashes) {
  if (block_hashes.empty()) return "";
  std::vector<unsigned char> bytes(block_hashes.size() * 8);
  for (std::size_t i = 0; i < block_hashes.size(); ++i)
    for (int j = 0; j < 8; ++j)
      bytes[i * 8 + j] = static_cast<unsigned char>(block_hashes[i] >> (8 * j));
  return hash128_hex(bytes.data(), bytes.size());
}

}  // namespace mergepipe
