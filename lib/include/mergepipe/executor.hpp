#pragma once
// The per-rank streaming executor: for each block of a list it reads the base block and the
// admitted expert blocks (through a BlockStream: several I/O threads, a bounded number of blocks
// ahead, so reads overlap compute), merges in fp32 chunk by chunk over worker threads, converts
// to the output dtype and hands the bytes to an OutputSink on the calling thread. Storage and MPI
// stay behind the interfaces (io/ and mpi/ implement them).
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/blocking.hpp"
#include "mergepipe/operators.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe {

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Output bytes of elements [elem_begin, elem_begin + n) of tensor `tensor`, in its output dtype.
  // Called on the thread that runs execute_blocks.
  virtual void write(std::uint32_t tensor, std::uint64_t elem_begin,
                     std::span<const std::byte> bytes) = 0;
};

// Told about every finished block, and asked between blocks whether to go on. Both calls happen
// on the thread that runs execute_blocks.
class ExecutionObserver {
 public:
  virtual ~ExecutionObserver() = default;
  // Block `block`'s output is with the sink; `output_hash` = hash64 of its bytes; `bytes_moved` =
  // its base, expert and output bytes.
  virtual void block_done(std::uint32_t block, std::uint64_t output_hash,
                          std::uint64_t bytes_moved) = 0;
  // True ends the run before the next block (e.g. another rank failed); execute_blocks then
  // returns with ExecutionStats::stopped set.
  virtual bool stop_requested() { return false; }
};

struct ExecutionJob {
  const Blocking* blocking = nullptr;
  const std::vector<TensorInfo>* tensors = nullptr;  // input tensors (base dtypes)
  std::vector<DType> out_dtypes;                     // per tensor
  OperatorConfig op;
  // Per tensor, when the merge's parameters vary by tensor (gradients, filters); else empty.
  std::vector<OperatorConfig> tensor_ops;
  const OperatorConfig& op_for(std::size_t tensor) const {
    return tensor_ops.empty() ? op : tensor_ops[tensor];
  }
  std::vector<std::uint64_t> name_keys;  // per tensor: tensor_name_key(name)
  std::vector<float> thresholds;         // [expert][tensor]; empty when unused
  std::size_t experts = 0;
  // admitted(k, b): read expert k's block b. Must be pure (called from several threads).
  std::function<bool(std::size_t, std::size_t)> admitted;
  int threads = 1;                         // compute threads
  int io_threads = 4;                      // concurrent reads
  int prefetch_depth = 2;                  // slices read ahead
  std::uint64_t slice_bytes = 128u << 10;  // reads and compute steps within a block (0: whole)
  bool allow_nonfinite = false;            // otherwise a NaN/Inf in the output is an InputError
  // Optional check of reads, e.g. against catalog hashes. Both are called on the executing thread.
  struct ReadCheck {
    // At a block's start: check this source's read of the block?
    std::function<bool(SourceId, std::uint32_t block)> wanted;
    // Once the block is read: `hash` is the XXH3-64 of all its bytes from `source`; may throw.
    std::function<void(SourceId, std::uint32_t block, std::uint64_t hash)> verify;
  };
  ReadCheck check_read;
  BlockPool* pool = nullptr;  // block buffers to reuse across calls (optional)
};

struct ExecutionStats {
  std::vector<std::uint64_t> block_hashes;  // parallel to the block list: hash64 of the output
  std::size_t blocks_done = 0;              // < list size only when stopped
  bool stopped = false;                     // the observer asked to stop
  std::uint64_t base_bytes = 0, expert_bytes = 0, output_bytes = 0;
  std::uint64_t nonfinite = 0;
  double read_wait_seconds = 0, compute_seconds = 0, write_seconds = 0;
};

// Merges the blocks of `blocks` (indices into job.blocking, in the order given).
ExecutionStats execute_blocks(const ExecutionJob& job, const std::vector<std::uint32_t>& blocks,
                              BlockReader& reader, OutputSink& sink,
                              ExecutionObserver* observer = nullptr);

// Bytes block `b` moves when merged: base read + admitted expert reads + output write.
std::uint64_t block_cost(const ExecutionJob& job, std::uint32_t b);

// Combines per-block output hashes of one tensor (in block order) into the tensor's hash:
// hash128_hex over the little-endian 64-bit block hashes. Zero-block tensors hash "".
std::string combine_block_hashes(std::span<const std::uint64_t> block_hashes);

}  // namespace mergepipe
