#pragma once
// mergepipe.manifest.json: the replayable record of one merge (SPEC §2 "Manifest").
// Stable top-level keys: tool_version, plan_hash, method, parameters, seed, budget_bytes,
// planned_expert_bytes, full_expert_bytes, bytes_read{base, expert, catalog, output_written},
// error_bound, access_mask, inputs, outputs, lineage, ranks, threads, timings. docs/formats.md
// documents every key.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mergepipe/merge_task.hpp"

namespace mergepipe {

inline constexpr const char* kManifestFileName = "mergepipe.manifest.json";
inline constexpr const char* kManifestFormat = "mergepipe-manifest-1";
inline constexpr const char* kOutputHashScheme =
    "xxh3-128 over xxh3-64 of each block's output bytes";

struct ManifestRecord {
  const MergeTask* task = nullptr;
  nlohmann::json plan_json;  // plan_to_json of task->plan (mask, thresholds, ...)
  std::string catalog_path;  // "" for --full-read and replays without catalog
  std::uint64_t bytes_base = 0, bytes_expert = 0, bytes_catalog = 0, bytes_output = 0;
  std::vector<std::string> tensor_hashes;  // per task tensor
  std::vector<std::string> output_files;
  int ranks = 1;
  int threads = 1;
  std::map<std::string, double> timings;  // seconds
  std::uint64_t max_rss_bytes = 0;
  nlohmann::json lineage_parents = nlohmann::json::array();  // manifests of merged inputs
  std::string replay_of;  // plan hash of the manifest replayed, if any
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more top-level keys
};

nlohmann::ordered_json make_manifest(const ManifestRecord& record);

// What a manifest says about a merge, enough to re-run it.
struct ManifestReplayInfo {
  MergeSpec spec;
  nlohmann::json plan_json;
  std::vector<TensorInfo> tensors;
  std::vector<DType> out_dtypes;
  std::uint64_t block_bytes = 0;
  std::uint64_t max_shard_bytes = 0;
  OutputFormat format = OutputFormat::kSafetensors;
  bool full_read = false;
  CheckpointLocation base;  // identities as recorded
  std::vector<CheckpointLocation> experts;
  std::map<std::string, std::string> tensor_hashes;
  std::string plan_hash;
  // The output folder's extra files as the merge wrote them (manifests before they were
  // recorded: the tokenizer copied, no model card, no config copy).
  bool copy_tokenizer = true;
  bool write_model_card = false;
  std::string config_text;
  std::string card_title;
};

// Parses a manifest; InputError naming `source` for anything missing or malformed.
ManifestReplayInfo parse_manifest(const std::string& text, const std::string& source);

}  // namespace mergepipe
