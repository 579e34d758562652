#include "mergepipe/io/architecture_check.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

namespace {

// What makes two checkpoints one family; the rest of config.json (dtype, rope scaling, token
// ids) may differ between fine-tunes.
constexpr const char* kCompared[] = {
    "architectures",       "model_type",          "hidden_size",       "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"};

}  // namespace

std::optional<ArchitectureFacts> read_architecture(const std::string& folder) {
  const std::string path = folder + "/config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!config.is_object()) throw InputError(path + ": expected a JSON object");
  // Multimodal configs keep the language model's sizes in text_config.
  const nlohmann::json& text = config.contains("text_config") && config["text_config"].is_object()
                                   ? config["text_config"]
                                   : config;
  ArchitectureFacts facts;
  for (const char* key : kCompared) {
    const nlohmann::json& from = config.contains(key) ? config : text;
    if (from.contains(key)) facts.facts.emplace_back(key, from[key].dump());
  }
  return facts;
}

std::string architecture_difference(const ArchitectureFacts& base, const ArchitectureFacts& other) {
  std::string out;
  for (const auto& [key, value] : other.facts) {
    for (const auto& [base_key, base_value] : base.facts) {
      if (base_key != key || base_value == value) continue;
      out += (out.empty() ? "" : ", ") + key + " " + value + " (base " + base_value + ")";
    }
  }
  return out;
}

}  // namespace mergepipe::io
