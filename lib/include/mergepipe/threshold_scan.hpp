#pragma once
// TIES trimming thresholds (and the per-tensor Gram of the methods that need one,
// tensor_gram.hpp) computed from the data, for
// merges that have no catalog (--full-read):
// the same magnitude sketch and the same definition as the catalog (SPEC §3), so a full read
// and a 100%-budget merge agree bit for bit. A scan reads the base and every expert block of a
// list of blocks once (through a BlockStream) into per-(tensor, expert) sketches; sketches of the
// parts of a tensor (scanned by several ranks) merge exactly, since they are integer counts.
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "mergepipe/block_stream.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/tensor.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

struct ThresholdScan {
  // What the scan collects: magnitude sketches (TIES), or (gram) each block's Gram of the base
  // and the deltas (slerp, model_stock, karcher, multislerp).
  bool gram = false;
  const Blocking* blocking = nullptr;
  const std::vector<TensorInfo>* tensors = nullptr;
  std::vector<double> densities;  // per expert
  // [tensor * experts + k] when the densities vary by tensor (gradients, filters); else empty.
  std::vector<double> tensor_densities;
  double density(std::size_t tensor, std::size_t k) const {
    return tensor_densities.empty() ? densities[k]
                                    : tensor_densities[tensor * densities.size() + k];
  }
  // breadcrumbs' gamma per expert, and per tensor as the densities (empty for other methods).
  std::vector<double> gammas, tensor_gammas;
  double gamma(std::size_t tensor, std::size_t k) const {
    return tensor_gammas.empty() ? gammas[k] : tensor_gammas[tensor * gammas.size() + k];
  }
  int threads = 1;  // compute threads
  int io_threads = 4;
  int prefetch_depth = 2;
  std::uint64_t slice_bytes = 128u << 10;  // reads and compute steps within a block (0: whole)
  BlockPool* pool = nullptr;               // block buffers to reuse across scans (optional)
  // Called on the calling thread after each slice with the bytes it read.
  std::function<void(std::uint64_t)> on_block;
  // Polled between blocks; true abandons the scan (the result is then incomplete).
  std::function<bool()> stop_requested;
};

// Sparse sketches of the deltas in `blocks` (block order; they may cover only part of a tensor):
// sketches[t][k] for every tensor t touched, empty MagnitudeSketch for the rest. Returns early
// (incomplete) when stop_requested. Throws what the reader throws.
struct ScanResult {
  std::vector<std::vector<MagnitudeSketch>> sketches;  // [tensor][expert], sparse form
  // Per scanned block: changed[b][k] is 1 when expert k differs from the base somewhere in it.
  std::unordered_map<std::uint32_t, std::vector<char>> changed;
  // Per scanned block (gram scans), the Gram of the base and the deltas: the same bits whatever
  // the slicing, the threads or the rank (GramAccumulator), so a tensor's sum over its blocks
  // in block order is too.
  std::unordered_map<std::uint32_t, TensorGram> grams;
  bool complete = true;
  double read_wait_seconds = 0;  // time the scan waited for its reads
};
ScanResult scan_sketches(const ThresholdScan& scan, const std::vector<std::uint32_t>& blocks,
                         BlockReader& reader);

// The trim thresholds of one tensor from its whole sketches, as a plan holds them: one per expert
// (ties: |Δ| >= t kept), or with gammas the band's K lower thresholds then its K upper ones.
std::vector<float> tensor_trim_thresholds(const ThresholdScan& scan, std::size_t tensor,
                                          const std::vector<MagnitudeSketch>& whole);

// Thresholds of whole tensors: result[i] is tensor_list[i]'s tensor_trim_thresholds, from the
// sketch of all its blocks.
std::vector<std::vector<float>> scan_thresholds(const ThresholdScan& scan,
                                                const std::vector<std::uint32_t>& tensor_list,
                                                BlockReader& reader);

}  // namespace mergepipe
