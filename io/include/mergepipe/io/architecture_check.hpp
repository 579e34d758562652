#pragma once
// The architecture facts of a model folder's config.json, for refusing a merge of models that
// are not one family (mergekit's "crimes": another architecture, hidden size, layer count or
// vocabulary), before any weight is read.
#include <optional>
#include <string>
#include <vector>

namespace mergepipe::io {

// The keys compared, with their values as written (JSON text); nullopt when the folder has no
// config.json. InputError naming the file when it is not a JSON object.
struct ArchitectureFacts {
  std::vector<std::pair<std::string, std::string>> facts;  // key, value; absent keys left out
};
std::optional<ArchitectureFacts> read_architecture(const std::string& folder);

// "" when `other` agrees with `base` on every key both state; else the differences, e.g.
// "architectures [\"LlamaForCausalLM\"] (base [\"Qwen3ForCausalLM\"]), hidden_size 128 (base 64)".
std::string architecture_difference(const ArchitectureFacts& base, const ArchitectureFacts& other);

}  // namespace mergepipe::io
