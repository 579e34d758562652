#pragma once
// Writes a synthetic checkpoint family to disk: DIR/base, DIR/expert00, ... as Hugging Face
// folders and DIR/family.json. Work is split into (tensor, row chunk) units over threads; each
// unit generates the base rows once and every expert's rows from them, so the base is never
// regenerated and memory stays at a few chunks per thread whatever the model size.
#include <cstdint>
#include <string>
#include <vector>

#include "mergepipe/synth/generator.hpp"

namespace mergepipe::io {

struct SynthWriteOptions {
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
  int threads = 1;
  // Elements per work unit (whole rows; a row longer than this is one unit). About 1M keeps a
  // unit's fp32 working set in the last-level cache while amortising per-unit setup.
  std::uint64_t chunk_elements = 1ull << 20;
};

struct SynthWriteResult {
  std::size_t files = 0;
  std::uint64_t bytes = 0;  // all files written
  double seconds = 0;
  // [expert][tensor]: elements whose stored bytes differ from the base.
  std::vector<std::vector<std::uint64_t>> changed_elements;
};

// `dir` must exist and be empty (the caller publishes it atomically). Files are identical for any
// `threads`. Throws IoError / UsageError naming the path.
SynthWriteResult write_synth_family(const synth::FamilyGenerator& family, const std::string& dir,
                                    const SynthWriteOptions& options);

}  // namespace mergepipe::io
