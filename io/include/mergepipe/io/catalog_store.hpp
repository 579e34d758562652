#pragma once
// The catalog on disk (schema: docs/formats.md, section "Catalog"): a folder holding
// `catalog.h5` (numeric arrays, chunked datasets) and `catalog.json` (summary, folders and file
// identities). Written by one process with the serial HDF5 driver: the arrays are tiny next to
// the weights they describe.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/catalog.hpp"

namespace mergepipe::io {

inline constexpr const char* kCatalogH5Name = "catalog.h5";
inline constexpr const char* kCatalogJsonName = "catalog.json";

// The experts a caller needs, by folder (matched as Catalog::find_expert matches); std::nullopt
// means every expert.
using ExpertSelection = std::optional<std::vector<std::string>>;

// Reads a catalog folder. Throws InputError when content is missing, malformed or inconsistent
// (naming the file and the dataset), IoError when the storage fails. Counts the bytes of both
// files under ByteCategory::kCatalog.
// With a selection, every expert's location is read but block statistics and magnitude sketches
// only for the selected ones; the others are left without (the planner refuses to use them). A
// merge of 2 experts from a catalog of 20 then skips inflating 18 experts' sketches (0.3 s).
// Without `sketches` no expert gets its magnitude sketches: only a TIES plan reads them, and
// the K = 20 Qwen3-0.6B family's 1.8 M buckets took 0.2 of a 0.25 s load to inflate.
Catalog load_catalog(const std::string& path, const ExpertSelection& only = std::nullopt,
                     bool sketches = true);

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
// not use may change without making the catalog stale for that merge.
void check_catalog_fresh(const Catalog& catalog, const ExpertSelection& only = std::nullopt);

// Readable multi-line summary (for `mergepipe inspect CATALOG`).
std::string describe_catalog(const Catalog& catalog);

}  // namespace mergepipe::io
