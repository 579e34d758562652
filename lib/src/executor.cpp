#include "mergepipe/executor.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/worker_pool.hpp"

namespace mergepipe {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Elements merged per step: small enough that base, K deltas and the output of a chunk stay in
// L2 cache for K around 20, large enough to amortise the per-chunk work.
constexpr std::size_t kChunkElems = 2048;

// Raw bytes of one block: the base and every admitted expert.
struct LoadedBlock {
  std::uint32_t block = 0;
  std::vector<std::byte> base;
  std::vector<std::vector<std::byte>> experts;
  std::vector<char> present;
};

// Reads blocks [begin, end) in order on its own thread, at most `depth` ahead of the consumer.
class Prefetcher {
 public:
  Prefetcher(const ExecutionJob& job, std::uint32_t begin, std::uint32_t end, BlockReader& reader)
      : job_(job),
        begin_(begin),
        end_(end),
        reader_(reader),
        depth_(std::max(1, job.prefetch_depth)) {
    for (int i = 0; i < depth_ + 1; ++i) free_.push_back(std::make_unique<LoadedBlock>());
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::unique_ptr<LoadedBlock> pop(double& waited) {
    const auto t0 = Clock::now();
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return !ready_.empty() || error_; });
    waited += seconds_since(t0);
    if (ready_.empty() && error_) std::rethrow_exception(error_);
    auto block = std::move(ready_.front());
    ready_.pop_front();
    return block;
  }
  void recycle(std::unique_ptr<LoadedBlock> block) {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(std::move(block));
    }
    cv_.notify_all();
  }
  std::uint64_t base_bytes() const { return base_bytes_; }
  std::uint64_t expert_bytes() const { return expert_bytes_; }

 private:
  void run() {
    try {
      for (std::uint32_t b = begin_; b < end_; ++b) {
        std::unique_ptr<LoadedBlock> slot;
        {
          std::unique_lock lock(mutex_);
          cv_.wait(lock, [this] {
            return stopping_ || (!free_.empty() && ready_.size() < std::size_t(depth_));
          });
          if (stopping_) return;
          slot = std::move(free_.back());
          free_.pop_back();
        }
        load(b, *slot);
        {
          std::lock_guard lock(mutex_);
          ready_.push_back(std::move(slot));
        }
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  void load(std::uint32_t b, LoadedBlock& slot) {
    const Block& blk = job_.blocking->blocks[b];
    slot.block = b;
    slot.base.resize(blk.byte_length);
    reader_.read(SourceId{}, blk.tensor, blk.byte_begin, slot.base);
    base_bytes_ += blk.byte_length;
    slot.experts.resize(job_.experts);
    slot.present.assign(job_.experts, 0);
    for (std::size_t k = 0; k < job_.experts; ++k) {
      if (!job_.admitted(k, b)) continue;
      slot.experts[k].resize(blk.byte_length);
      reader_.read(SourceId{static_cast<int>(k)}, blk.tensor, blk.byte_begin, slot.experts[k]);
      slot.present[k] = 1;
      expert_bytes_ += blk.byte_length;
    }
  }

  const ExecutionJob& job_;
  const std::uint32_t begin_, end_;
  BlockReader& reader_;
  const int depth_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<LoadedBlock>> ready_, free_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::uint64_t base_bytes_ = 0, expert_bytes_ = 0;  // written by the prefetch thread only
};

// Per-worker scratch for one chunk.
struct Scratch {
  std::vector<float> base, out;
  std::vector<float> deltas;  // experts x kChunkElems
  std::vector<const float*> pointers;
  std::uint64_t nonfinite = 0;
};

}  // namespace

ExecutionStats execute_blocks(const ExecutionJob& job, std::uint32_t block_begin,
                              std::uint32_t block_end, BlockReader& reader, OutputSink& sink) {
  ExecutionStats stats;
  stats.block_hashes.assign(block_end - block_begin, 0);
  if (block_begin >= block_end) return stats;

  WorkerPool pool(job.threads);
  std::vector<Scratch> scratch(static_cast<std::size_t>(pool.size()));
  for (auto& s : scratch) {
    s.base.resize(kChunkElems);
    s.out.resize(kChunkElems);
    s.deltas.resize(job.experts * kChunkElems);
    s.pointers.resize(job.experts);
  }
  std::vector<std::byte> out_bytes;
  Prefetcher prefetcher(job, block_begin, block_end, reader);

  for (std::uint32_t b = block_begin; b < block_end; ++b) {
    auto loaded = prefetcher.pop(stats.read_wait_seconds);
    const Block& blk = job.blocking->blocks[b];
    const TensorInfo& tensor = (*job.tensors)[blk.tensor];
    const DType in_type = tensor.dtype;
    const std::size_t in_size = dtype_size(in_type);
    const DType out_type = job.out_dtypes[blk.tensor];
    const std::size_t out_size = dtype_size(out_type);
    out_bytes.resize(blk.elem_count * out_size);

    TensorContext tctx{job.name_keys[blk.tensor], {}};
    if (!job.thresholds.empty()) {
      // thresholds are [expert][tensor]; gather this tensor's column.
      static thread_local std::vector<float> column;
      column.resize(job.experts);
      const std::size_t tensors = job.tensors->size();
      for (std::size_t k = 0; k < job.experts; ++k)
        column[k] = job.thresholds[k * tensors + blk.tensor];
      tctx.thresholds = column;
    }

    const auto t0 = Clock::now();
    const std::size_t chunks = (blk.elem_count + kChunkElems - 1) / kChunkElems;
    pool.run([&](int worker) {
      Scratch& s = scratch[static_cast<std::size_t>(worker)];
      for (std::size_t c = static_cast<std::size_t>(worker); c < chunks;
           c += static_cast<std::size_t>(pool.size())) {
        const std::size_t first = c * kChunkElems;
        const std::size_t n =
            std::min(kChunkElems, static_cast<std::size_t>(blk.elem_count) - first);
        convert_to_f32(in_type, loaded->base.data() + first * in_size, s.base.data(), n);
        for (std::size_t k = 0; k < job.experts; ++k) {
          if (!loaded->present[k]) {
            s.pointers[k] = nullptr;
            continue;
          }
          float* d = s.deltas.data() + k * kChunkElems;
          convert_to_f32(in_type, loaded->experts[k].data() + first * in_size, d, n);
          // Δ = float(θ_k) − float(θ_0): the catalog's definition, so thresholds agree exactly.
          for (std::size_t i = 0; i < n; ++i) d[i] -= s.base[i];
          s.pointers[k] = d;
        }
        merge_block(job.op, tctx, blk.elem_begin + first, n, s.base.data(), s.pointers,
                    s.out.data());
        std::uint64_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(s.out[i]);
        s.nonfinite += bad;
        convert_from_f32(out_type, s.out.data(), out_bytes.data() + first * out_size, n);
      }
    });
    stats.compute_seconds += seconds_since(t0);

    std::uint64_t nonfinite = 0;
    for (auto& s : scratch) nonfinite += std::exchange(s.nonfinite, 0);
    if (nonfinite && !job.allow_nonfinite) {
      throw InputError(
          "tensor '" + tensor.name + "': the merge produced " + std::to_string(nonfinite) +
          " NaN/Inf values (an input holds non-finite weights; --allow-nonfinite to proceed)");
    }
    stats.nonfinite += nonfinite;
    stats.block_hashes[b - block_begin] = hash64(out_bytes.data(), out_bytes.size());
    prefetcher.recycle(std::move(loaded));

    const auto t1 = Clock::now();
    sink.write(blk.tensor, blk.elem_begin, out_bytes);
    stats.write_seconds += seconds_since(t1);
    stats.output_bytes += out_bytes.size();
  }
  stats.base_bytes = prefetcher.base_bytes();
  stats.expert_bytes = prefetcher.expert_bytes();
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
