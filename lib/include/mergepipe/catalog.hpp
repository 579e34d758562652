#pragma once
// The catalog: a checkpoint family as block-structured data (SPEC §2). Built once per family by
// reading every expert once; every later plan uses only this, never the expert weights.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mergepipe/blocking.hpp"
#include "mergepipe/checkpoint.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe {

inline constexpr const char* kCatalogFormat = "mergepipe-catalog-1";

// Σ Δ² of one (expert, block) split by octave of |Δ|: octave o holds entries with
// |Δ| in [2^(o-kOctaveBias), 2^(o-kOctaveBias+1)); o = 0 also holds everything smaller and the
// last octave everything larger. Lets the planner estimate what trimming keeps of a block.
inline constexpr int kNormOctaves = 48;
inline constexpr int kOctaveBias = 40;

struct BlockStats {
  double l2 = 0.0;            // ‖Δ_{k,b}‖₂, accumulated in fp64
  float max_abs = 0.0f;       // max |Δ|
  std::uint64_t nonzero = 0;  // entries with Δ != 0
  std::uint64_t hash = 0;     // XXH3-64 of the expert block's stored bytes
  std::array<float, kNormOctaves> octave_sumsq{};
  bool operator==(const BlockStats&) const = default;
};

// Where one checkpoint's tensors lie (base or expert), plus file identities to detect staleness.
struct CheckpointLocation {
  std::string dir;
  std::vector<std::string> shard_names;      // file names inside dir
  std::vector<FileIdentity> files;           // parallel to shard_names
  std::vector<std::uint32_t> tensor_file;    // per catalog tensor: index into files
  std::vector<std::uint64_t> tensor_offset;  // per catalog tensor: absolute offset in its file
  bool operator==(const CheckpointLocation&) const = default;
};

// The densities whose TIES thresholds a catalog stores for every (expert, tensor), computed from
// the sketches when it is saved: i / kTrimGridSteps, i = 1..kTrimGridSteps. A plan at one of
// them (0.5, 0.2, 0.35...) reads those instead of inflating the sketches: the K = 20 Qwen3-0.6B
// family's 1.84 M buckets (11 MB) for 6,220 floats per density.
inline constexpr std::size_t kTrimGridSteps = 100;
// The step i of `density` on that grid (density == i / kTrimGridSteps exactly), or 0.
std::size_t trim_grid_step(double density);

// An expert's TIES threshold of every tensor at one density.
struct DensityThresholds {
  double density = 1.0;
  std::vector<float> by_tensor;  // MagnitudeSketch::threshold(density) of each tensor's sketch
  bool operator==(const DensityThresholds&) const = default;
};

struct ExpertCatalog {
  CheckpointLocation location;
  std::vector<BlockStats> blocks;         // per block of the shared blocking
  std::vector<MagnitudeSketch> sketches;  // per tensor: |Δ| histogram (TIES/DARE thresholds)
  // What a plan needs of the sketches, when a load computed it instead of keeping them: a few
  // KiB per (expert, tensor) that a plan reduces to one float (see io::SketchLoad).
  std::vector<DensityThresholds> thresholds;
  std::uint64_t nonfinite = 0;  // NaN/Inf entries seen in this expert
  bool operator==(const ExpertCatalog&) const = default;

  // Whether trim_threshold(t, density) is known for every tensor of `tensors`.
  bool has_trim_thresholds(double density, std::size_t tensors) const;
  // The TIES threshold of tensor t at `density`: from `thresholds` when loaded for it, else from
  // the tensor's sketch. std::out_of_range when neither is there.
  float trim_threshold(std::size_t tensor, double density) const;
  // breadcrumbs' band of tensor t (MagnitudeSketch::band): needs the sketches.
  // std::out_of_range when they are not loaded.
  TrimBand trim_band(std::size_t tensor, double density, double gamma) const;
};

struct Catalog {
  std::string format = kCatalogFormat;
  std::string family_id;  // hash of base tensor infos and base header hashes
  CheckpointLocation base;
  // XXH3-64 of each base block's stored bytes, so merges can check base reads too; empty in
  // catalogs written before it was recorded.
  std::vector<std::uint64_t> base_block_hashes;
  std::vector<TensorInfo> tensors;  // base order (shard order, then offset)
  Blocking blocking;
  std::vector<ExpertCatalog> experts;  // in the order they were added
  double build_seconds = 0.0;          // wall time of the last build or extension

  std::size_t expert_count() const { return experts.size(); }
  std::size_t block_count() const { return blocking.blocks.size(); }
  // Bytes one full read of every expert costs (every block of every expert).
  std::uint64_t full_expert_bytes() const;
  // Index of the expert whose folder is `dir` (after path normalisation), or -1.
  int find_expert(const std::string& dir) const;
  // find_expert of each of `dirs`, normalising every folder once: normalising resolves symlinks
  // with a stat per path component, which for K experts looked up one by one made a K = 20 plan
  // spend 2 ms of its 7 in lstat.
  std::vector<int> find_experts(const std::vector<std::string>& dirs) const;
  // Sizes of the base's and every expert's files (what the catalog is a summary of).
  std::uint64_t family_bytes() const;
};

// Absolute, lexically normal form of a checkpoint folder (symlinks resolved where the path
// exists, no trailing separator): how the catalog records and compares folders.
std::string normalize_checkpoint_dir(const std::string& dir);

// Computes family_id from the base's tensor infos and file header hashes.
std::string compute_family_id(const std::vector<TensorInfo>& tensors,
                              const std::vector<FileIdentity>& base_files);

}  // namespace mergepipe
