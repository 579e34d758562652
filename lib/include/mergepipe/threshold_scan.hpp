#pragma once
// TIES trimming thresholds computed from the data, for merges that have no catalog (--full-read):
// the same magnitude sketch and the same definition as the catalog (SPEC §3), so a full read
// and a 100%-budget merge agree bit for bit. Reads the base and every expert block of the given
// tensors once (through a BlockStream) and keeps one sketch per expert of the current tensor.
#include <cstdint>
#include <functional>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe {

struct ThresholdScan {
  const Blocking* blocking = nullptr;
  const std::vector<TensorInfo>* tensors = nullptr;
  std::vector<double> densities;  // per expert
  int threads = 1;                // compute threads
  int io_threads = 4;
  int prefetch_depth = 2;
  // Called on the calling thread after each block with the bytes it read.
  std::function<void(std::uint64_t)> on_block;
  // Polled between blocks; true abandons the scan (the result is then incomplete).
  std::function<bool()> stop_requested;
};

// Thresholds of `tensor_list` (indices into *scan.tensors): result[i][k] is tensor_list[i]'s
// threshold for expert k (|Δ| >= t kept). Throws what the reader throws.
std::vector<std::vector<float>> scan_thresholds(const ThresholdScan& scan,
                                                const std::vector<std::uint32_t>& tensor_list,
                                                BlockReader& reader);

}  // namespace mergepipe
