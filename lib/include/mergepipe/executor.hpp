#pragma once
// The per-rank streaming executor: for each block of a contiguous range it reads the base block
// and the admitted expert blocks (through BlockReader, on a prefetch thread so reads overlap
// compute), merges in fp32 chunk by chunk over worker threads, converts to the output dtype and
// hands the bytes to an OutputSink on the calling thread. Storage and MPI stay behind the two
// interfaces (io/ and mpi/ implement them).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mergepipe/blocking.hpp"
#include "mergepipe/operators.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe {

// Which checkpoint a read is for: the base or expert k (plan order).
struct SourceId {
  static constexpr int kBase = -1;
  int expert = kBase;
};

class BlockReader {
 public:
  virtual ~BlockReader() = default;
  // Reads dst.size() bytes of tensor `tensor` of `source`, starting `byte_begin` bytes into the
  // tensor. Called from the prefetch thread; must be thread-compatible with the sink's thread.
  virtual void read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                    std::span<std::byte> dst) = 0;
};

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Output bytes of elements [elem_begin, elem_begin + n) of tensor `tensor`, in its output dtype.
  // Called on the thread that runs execute_blocks.
  virtual void write(std::uint32_t tensor, std::uint64_t elem_begin,
                     std::span<const std::byte> bytes) = 0;
};

struct ExecutionJob {
  const Blocking* blocking = nullptr;
  const std::vector<TensorInfo>* tensors = nullptr;  // input tensors (base dtypes)
  std::vector<DType> out_dtypes;                     // per tensor
  OperatorConfig op;
  std::vector<std::uint64_t> name_keys;  // per tensor: tensor_name_key(name)
  std::vector<float> thresholds;         // [expert][tensor]; empty when unused
  std::size_t experts = 0;
  // admitted(k, b): read expert k's block b. Must be pure (called from several threads).
  std::function<bool(std::size_t, std::size_t)> admitted;
  int threads = 1;               // compute threads
  int prefetch_depth = 2;        // blocks read ahead
  bool allow_nonfinite = false;  // otherwise a NaN/Inf in the output is an InputError
};

struct ExecutionStats {
  std::vector<std::uint64_t> block_hashes;  // per block of the range: hash64 of its output bytes
  std::uint64_t base_bytes = 0, expert_bytes = 0, output_bytes = 0;
  std::uint64_t nonfinite = 0;
  double read_wait_seconds = 0, compute_seconds = 0, write_seconds = 0;
};

ExecutionStats execute_blocks(const ExecutionJob& job, std::uint32_t block_begin,
                              std::uint32_t block_end, BlockReader& reader, OutputSink& sink);

// Combines per-block output hashes of one tensor (in block order) into the tensor's hash:
// hash128_hex over the little-endian 64-bit block hashes. Zero-block tensors hash "".
std::string combine_block_hashes(std::span<const std::uint64_t> block_hashes);

}  // namespace mergepipe
