#pragma once
// Parallel catalog build (SPEC §2 "Catalog"): the blocks are split over ranks in contiguous
// ranges balanced by bytes; each rank reads its part of the base once and the same part of every
// new expert once (so every expert byte is read exactly once overall), computes the block
// statistics and partial magnitude sketches, and rank 0 gathers and assembles them (they are
// small: a few hundred bytes per block).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/progress.hpp"

namespace mergepipe::mpi {

struct CatalogBuildOptions {
  std::string base_dir;
  std::vector<std::string> expert_dirs;            // new experts, in the order they are added
  std::uint64_t block_bytes = kDefaultBlockBytes;  // ignored when extending `existing`
  std::optional<Catalog> existing;                 // extend this catalog instead of starting anew
  bool allow_nonfinite = false;                    // otherwise a NaN/Inf expert value is an error
  int threads = 0;                                 // compute threads per rank; 0: cores / ranks
  std::uint64_t read_bytes = 32ull << 20;          // bytes per read request (whole blocks)
  ProgressListener* progress = nullptr;            // rank 0: bytes read over all ranks
};

// Collective. Opens the base and the new experts, checks that every expert has the base's tensor
// names, shapes and dtypes (InputError naming the file, tensor and difference of the first
// mismatch), and computes their statistics. When extending, the base must be the catalog's
// (same family id) and only the new experts are read. Expert folders already in the catalog or
// listed twice are a UsageError. Any rank's failure ends every rank with that message.
//
// Returns the complete catalog on rank 0; on other ranks the new experts' `blocks` and `sketches`
// are left empty. Bytes read are counted in io::global_byte_counters() (kBase, kExpert).
Catalog build_catalog(const Comm& comm, const CatalogBuildOptions& options);

}  // namespace mergepipe::mpi
