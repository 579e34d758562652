#include "mergepipe/io/tokenizer_files.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"

namespace mergepipe::io {
namespace {

namespace fs = std::filesystem;

// The standard ChatML turn format.
constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::optional<nlohmann::json> read_json(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    return nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}

std::optional<std::string> vocab_size(const std::string& folder) {
  const auto config = read_json(folder + "/config.json");
  if (!config || !config->is_object()) return std::nullopt;
  if (config->contains("vocab_size")) return (*config)["vocab_size"].dump();
  if (config->contains("text_config") && (*config)["text_config"].contains("vocab_size"))
    return (*config)["text_config"]["vocab_size"].dump();
  return std::nullopt;
}

// The folder's tokenizer files, name -> content.
std::map<std::string, std::string> tokenizer_files(const std::string& folder) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && is_tokenizer_file(name))
      files[name] = read_text_file(entry.path().string());
  }
  return files;
}

}  // namespace

std::string tokenizer_folder(const MergeSpec& spec) {
  const std::string source = spec.tokenizer_source.value_or("base");
  if (source == "base") return spec.base_model;
  if (source == "union") {
    // mergekit builds a vocabulary of every model's tokens and maps embedding rows by token;
    // over identical tokenizers that is the base's, which is all that is supported so far.
    const auto base = tokenizer_files(spec.base_model);
    for (const ExpertSpec& e : spec.experts) {
      if (tokenizer_files(e.path) != base) {
        throw UsageError("tokenizer_source: union: the tokenizer of '" + e.path +
                         "' differs from the base's; a union of different vocabularies (with "
                         "embedding rows mapped by token) is not supported yet");
      }
    }
    return spec.base_model;
  }
  if (tokenizer_files(source).empty())
    throw UsageError("tokenizer_source: '" + source + "' holds no tokenizer files");
  const auto theirs = vocab_size(source), ours = vocab_size(spec.base_model);
  if (theirs && ours && *theirs != *ours) {
    throw UsageError("tokenizer_source: '" + source + "' has a vocabulary of " + *theirs +
                     " tokens, the merged embeddings have " + *ours +
                     " rows; resizing the embeddings to another vocabulary is not supported yet");
  }
  return source;
}

std::string resolve_chat_template(const MergeSpec& spec) {
  if (!spec.chat_template) return "";
  if (*spec.chat_template == "chatml") return kChatml;
  if (*spec.chat_template != "auto") return *spec.chat_template;
  std::vector<std::string> folders{spec.base_model};
  for (const ExpertSpec& e : spec.experts) folders.push_back(e.path);
  std::vector<std::pair<std::string, int>> counts;  // in config order
  for (const std::string& f : folders) {
    const auto config = read_json(f + "/tokenizer_config.json");
    if (!config || !config->is_object() || !config->contains("chat_template") ||
        !(*config)["chat_template"].is_string())
      continue;
    const std::string t = (*config)["chat_template"].get<std::string>();
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == t; });
    if (it == counts.end()) {
      counts.emplace_back(t, 1);
    } else {
      ++it->second;
    }
  }
  if (counts.empty()) return "";
  return std::max_element(counts.begin(), counts.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

std::string with_chat_template(const std::string& tokenizer_config_json,
                               const std::string& chat_template, const std::string& source) {
  nlohmann::ordered_json config;
  try {
    config = tokenizer_config_json.empty() ? nlohmann::ordered_json::object()
                                           : nlohmann::ordered_json::parse(tokenizer_config_json);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": not valid JSON: " + e.what());
  }
  if (!config.is_object()) throw InputError(source + ": expected a JSON object");
  config["chat_template"] = chat_template;
  return config.dump(2) + "\n";
}

}  // namespace mergepipe::io
