#pragma once
// The catalog on disk (schema: docs/formats.md, section "Catalog"): a folder holding
// `catalog.h5` (numeric arrays, chunked datasets) and `catalog.json` (summary, folders and file
// identities). Written by one process with the serial HDF5 driver: the arrays are tiny next to
// the weights they describe.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/merge_spec.hpp"

namespace mergepipe::io {

inline constexpr const char* kCatalogH5Name = "catalog.h5";
inline constexpr const char* kCatalogJsonName = "catalog.json";

// The experts a caller needs, by folder (matched as Catalog::find_expert matches); std::nullopt
// means every expert.
using ExpertSelection = std::optional<std::vector<std::string>>;

// What load_catalog makes of the selected experts' magnitude sketches. Only a TIES plan uses
// them, and it needs one threshold per sketch. Building and keeping every sketch of the K = 20
// Qwen3-0.6B family (1.84 M buckets, 18 MB in 12,440 lists, first-touched page by page) made a cold
// merge's catalog phase 0.22-0.28 s; computing the thresholds from buffers reused expert after
// expert, with 32-bit counts in the file, 0.14-0.20 s (8 alternated runs each; 0.08 s without
// sketches). At a density on the catalog's grid (kTrimGridSteps) the thresholds are read as
// stored, one row per expert, and no sketch is read: the load took 36 instead of 103 ms.
struct SketchLoad {
  enum class Kind {
    kNone,        // no sketches (methods that do not trim)
    kSketches,    // every sketch, as ExpertCatalog::sketches
    kThresholds,  // ExpertCatalog::thresholds at the densities below, no sketches
  };
  Kind kind = Kind::kSketches;
  // kThresholds: the density of each folder of the selection, in its order (a folder listed
  // twice may have two).
  std::vector<double> densities;

  static SketchLoad none() { return {Kind::kNone, {}}; }
  static SketchLoad sketches() { return {Kind::kSketches, {}}; }
  static SketchLoad thresholds(std::vector<double> densities) {
    return {Kind::kThresholds, std::move(densities)};
  }
};

// Share `index` of `count` of a list of files: every count-th, from the index-th.
struct FileShare {
  std::size_t index = 0;
  std::size_t count = 1;
};

// What a plan of `spec` needs: the thresholds at its experts' densities for a method that trims
// by magnitude (in the order of spec.expert_paths()), else no sketches.
SketchLoad sketch_load_for(const MergeSpec& spec);

// Reads a catalog folder. Throws InputError when content is missing, malformed or inconsistent
// (naming the file and the dataset), IoError when the storage fails. Counts the bytes of both
// files under ByteCategory::kCatalog.
// With a selection, every expert's location is read but block statistics and magnitude sketches
// only for the selected ones; the others are left without (the planner refuses to use them). A
// merge of 2 experts from a catalog of 20 then skips inflating 18 experts' sketches (0.3 s).
// SketchLoad::thresholds needs a selection with one density per folder (std::invalid_argument).
Catalog load_catalog(const std::string& path, const ExpertSelection& only = std::nullopt,
                     const SketchLoad& sketches = SketchLoad::sketches());

// selected[k]: expert k of `c` is in `only` (every expert when there is no selection).
std::vector<bool> selected_experts(const Catalog& c, const ExpertSelection& only);

// Reads catalog.json alone: format, family, blocking and the base's and experts' locations (their
// file identities), without the arrays of catalog.h5. Throws as load_catalog does.
Catalog load_catalog_summary(const std::string& path);

// Writes a catalog folder atomically: into a temporary folder next to `path`, fsynced, then
// swapped into place (an existing catalog at `path` is replaced as a whole). Refuses (UsageError)
// to replace a `path` that exists and is not a catalog folder.
void save_catalog(const Catalog& catalog, const std::string& path);

// True when `path` is a folder holding catalog.json.
bool is_catalog_folder(const std::string& path);

// Bytes of catalog.h5 + catalog.json in `path`.
std::uint64_t catalog_size_bytes(const std::string& path);

// Compares every base file and every (selected) expert file with its recorded identity (size,
// mtime, header hash). Throws InputError "stale catalog: FILE changed since it was catalogued
// (...)" on the first difference, or when a file is missing or unreadable. An expert a merge does
// not use may change without making the catalog stale for that merge. With a share, only that
// share of the files, listed base first and then the selected experts' in catalog order.
// mtime can be put back (touch -r): a file whose inode change time moved while size, mtime and
// header stayed is read in full and each block compared with the catalog's content hash (a chmod
// costs one read of the file; changed bytes are a stale catalog naming the block). The hashes
// come from `catalog`, or from catalog.h5 at `catalog_path` when it holds only the summary.
// `every_block`: every file of the share is read so (`merge --verify-reads all`).
void check_catalog_fresh(const Catalog& catalog, const ExpertSelection& only = std::nullopt,
                         FileShare share = {}, const std::string& catalog_path = "",
                         bool every_block = false);

// The files a merge of the `only` experts reads, base first and then the selected experts' in
// catalog order, as recorded in the catalog: `share` of them (what check_catalog_fresh checks).
// Throws std::invalid_argument for a share index out of range.
std::vector<FileIdentity> catalog_input_files(const Catalog& catalog, const ExpertSelection& only,
                                              FileShare share = {});

// Readable multi-line summary (for `mergepipe inspect CATALOG`).
std::string describe_catalog(const Catalog& catalog);

}  // namespace mergepipe::io
