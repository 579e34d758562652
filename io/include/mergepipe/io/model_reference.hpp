#pragma once
// mergekit's model references: a local folder, a Hugging Face hub id resolved from the local
// Hugging Face cache (there is no network), or `model+adapter` (refused until adapters land).
#include <optional>
#include <string>

namespace mergepipe::io {

struct ResolvedModel {
  std::string path;                    // absolute, normalised
  std::optional<std::string> warning;  // one line when resolved otherwise than mergekit would
};

// Resolution order: an absolute path; a path relative to the current directory (as mergekit
// resolves it); one relative to `config_folder` (with a warning: mergekit would not find it);
// a hub id `org/name` or `org/name@revision` in the cache ($HF_HUB_CACHE, else $HF_HOME/hub,
// else ~/.cache/huggingface/hub: models--org--name/snapshots/<commit>, the revision from
// refs/<revision> or a commit prefix, refs/main by default). A reference none of these finds is
// returned relative to the current directory when it names a path, and a UsageError saying how
// to download it when it looks like a hub id. `model+adapter` is a UsageError.
ResolvedModel resolve_model_reference(const std::string& reference,
                                      const std::string& config_folder);

// The Hugging Face hub cache folder the environment names (see above).
std::string hugging_face_cache_dir();

}  // namespace mergepipe::io
