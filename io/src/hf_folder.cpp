#include "mergepipe/io/hf_folder.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "strict_json.hpp"

namespace mergepipe::io {

namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kConfigFile = "config.json";

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_within(const fs::path& target, const fs::path& root) {
  auto [root_end, target_pos] =
      std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  (void)target_pos;
  return root_end == root.end();
}

bool exists_no_follow(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

// Where a folder's files may live: the folder itself, and for a Hugging Face hub cache snapshot
// (…/models--org--name/snapshots/REV, whose files are symlinks to ../../blobs/HASH) that
// repository's blobs folder.
struct AllowedRoots {
  fs::path folder;
  std::optional<fs::path> hub_blobs;
};

AllowedRoots allowed_roots(const std::string& dir) {
  std::error_code ec;
  AllowedRoots roots;
  roots.folder = fs::canonical(dir, ec);
  if (ec) throw IoError(dir + ": cannot resolve folder: " + ec.message());
  const fs::path parent = roots.folder.parent_path();
  if (parent.filename() == "snapshots") roots.hub_blobs = parent.parent_path() / "blobs";
  return roots;
}

// Checks that `name` inside `dir` is a regular file (possibly through a symlink) that resolves
// inside the allowed roots. `referrer` is named in errors (the index file or the folder).
void check_inside_folder(const std::string& dir, const AllowedRoots& roots, const std::string& name,
                         const std::string& referrer) {
  const std::string path = join(dir, name);
  std::error_code ec;
  const fs::file_status link_status = fs::symlink_status(path, ec);
  if (!fs::exists(link_status)) {
    throw InputError(referrer + ": file '" + detail::printable(name) + "' does not exist in " +
                     dir);
  }
  const fs::path resolved = fs::canonical(path, ec);
  if (ec) {
    throw InputError(referrer + ": '" + detail::printable(name) +
                     "' is a symlink that cannot be resolved (" + ec.message() + ")");
  }
  if (!is_within(resolved, roots.folder) &&
      !(roots.hub_blobs && is_within(resolved, *roots.hub_blobs))) {
    throw InputError(referrer + ": '" + detail::printable(name) + "' is a symlink to " +
                     resolved.string() + ", outside the folder " + roots.folder.string());
  }
  if (!fs::is_regular_file(resolved, ec)) {
    throw InputError(referrer + ": '" + detail::printable(name) + "' is not a regular file");
  }
}

// A weight_map file name must be a plain file name: loaders reject path components.
void check_plain_file_name(const std::string& index_path, const std::string& tensor,
                           const std::string& file) {
  const std::string where = "weight_map entry for tensor '" + detail::printable(tensor) + "' ('" +
                            detail::printable(file) + "')";
  if (file.empty()) throw InputError(index_path + ": " + where + " is an empty file name");
  if (file.front() == '/') throw InputError(index_path + ": " + where + " is an absolute path");
  if (file.find("..") != std::string::npos || file == ".") {
    throw InputError(index_path + ": " + where + " refers outside the folder ('..')");
  }
  if (file.find('/') != std::string::npos || file.find('\\') != std::string::npos) {
    throw InputError(index_path + ": " + where + " contains a path separator");
  }
}

// The index and config.json of a folder: real ones are kilobytes, so a huge one is refused
// before it is read (the same limit as a safetensors header).
std::string read_folder_json(const std::string& path) {
  const std::uint64_t size = stat_identity(path).size;
  if (size > kMaxHeaderBytes) {
    throw InputError(path + ": " + std::to_string(size) + " bytes, more than the limit of " +
                     std::to_string(kMaxHeaderBytes) + " for this file");
  }
  return read_text_file(path);
}

[[noreturn]] void throw_not_a_checkpoint(const std::string& dir) {
  std::size_t other_shards = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") ++other_shards;
  }
  std::string msg = dir + ": not a Hugging Face checkpoint folder: neither " +
                    std::string(kSingleFile) + " nor " + kIndexFile + " found";
  if (other_shards > 0) {
    msg += " (" + std::to_string(other_shards) +
           " other .safetensors files are present: a sharded checkpoint missing its index?)";
  }
  throw InputError(msg);
}

}  // namespace

std::map<std::string, std::string> parse_index_weight_map(std::string_view text,
                                                          const std::string& index_path) {
  const nlohmann::json index = detail::parse_strict_json(text, index_path, "key");
  if (!index.is_object()) throw InputError(index_path + ": not a JSON object");
  const auto wm = index.find("weight_map");
  if (wm == index.end()) throw InputError(index_path + ": no \"weight_map\"");
  if (!wm->is_object()) throw InputError(index_path + ": \"weight_map\" is not an object");
  if (wm->empty()) throw InputError(index_path + ": \"weight_map\" is empty");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string()) {
      throw InputError(index_path + ": weight_map entry for tensor '" + detail::printable(tensor) +
                       "' is not a file name: " + detail::brief_dump(file));
    }
    check_plain_file_name(index_path, tensor, file.get<std::string>());
    out.emplace(tensor, file.get<std::string>());
  }
  return out;
}

Checkpoint open_checkpoint(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) throw InputError(dir + ": no such checkpoint folder");
  if (!fs::is_directory(st)) throw InputError(dir + ": not a folder");
  const AllowedRoots roots = allowed_roots(dir);

  Checkpoint ckpt;
  ckpt.dir = dir;
  std::optional<std::map<std::string, std::string>> weight_map;
  std::string index_path;
  // transformers prefers the single file when both are present.
  if (exists_no_follow(join(dir, kSingleFile))) {
    check_inside_folder(dir, roots, kSingleFile, dir);
    ckpt.shard_names.push_back(kSingleFile);
  } else if (exists_no_follow(join(dir, kIndexFile))) {
    index_path = join(dir, kIndexFile);
    check_inside_folder(dir, roots, kIndexFile, dir);
    weight_map = parse_index_weight_map(read_folder_json(index_path), index_path);
    // Each shard once, named in errors with the first tensor the index puts in it.
    std::map<std::string, std::string> first_tensor_of_shard;
    for (const auto& [tensor, file] : *weight_map) first_tensor_of_shard.emplace(file, tensor);
    for (const auto& [file, tensor] : first_tensor_of_shard) {
      check_inside_folder(
          dir, roots, file,
          index_path + ": weight_map entry for tensor '" + detail::printable(tensor) + "'");
      ckpt.shard_names.push_back(file);
    }
  } else {
    throw_not_a_checkpoint(dir);
  }

  for (const std::string& shard : ckpt.shard_names) {
    const std::string path = join(dir, shard);
    SafetensorsHeader header = read_safetensors_header(path);
    FileIdentity identity = stat_identity(path);
    identity.header_hash = header.header_hash;
    ckpt.files.push_back(std::move(identity));
    for (StoredTensor& t : header.tensors) {
      const std::string& name = t.info.name;
      const auto [it, inserted] = ckpt.by_name.emplace(name, ckpt.tensors.size());
      if (!inserted) {
        throw InputError(dir + ": tensor '" + detail::printable(name) + "' appears in both " +
                         ckpt.tensors[it->second].file + " and " + path);
      }
      if (weight_map) {
        const auto listed = weight_map->find(name);
        if (listed == weight_map->end()) {
          throw InputError(index_path + ": tensor '" + detail::printable(name) + "' of " + shard +
                           " is not listed in weight_map");
        }
        if (listed->second != shard) {
          throw InputError(index_path + ": weight_map puts tensor '" + detail::printable(name) +
                           "' in " + listed->second + " but it is stored in " + shard);
        }
      }
      ckpt.tensors.push_back(std::move(t));
    }
  }
  if (weight_map) {
    for (const auto& [tensor, file] : *weight_map) {
      if (!ckpt.by_name.count(tensor)) {
        throw InputError(index_path + ": weight_map lists tensor '" + detail::printable(tensor) +
                         "' in " + file + " but " + file + " does not contain it");
      }
    }
  }

  if (exists_no_follow(join(dir, kConfigFile))) {
    check_inside_folder(dir, roots, kConfigFile, dir);
    ckpt.config_json = read_folder_json(join(dir, kConfigFile));
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_carried_file(name)) continue;
    check_inside_folder(dir, roots, name, dir);
    ckpt.extra_files.push_back(name);
  }
  if (ec) throw IoError(dir + ": cannot list folder: " + ec.message());
  std::sort(ckpt.extra_files.begin(), ckpt.extra_files.end());
  return ckpt;
}

bool is_tokenizer_file(const std::string& file_name) {
  static const std::set<std::string> exact = {"special_tokens_map.json", "added_tokens.json",
                                              "vocab.json", "vocab.txt", "merges.txt"};
  return exact.count(file_name) || file_name.starts_with("tokenizer") ||
         file_name.starts_with("chat_template");
}

bool is_carried_file(const std::string& file_name) {
  // The processor files of multimodal bases travel with them, as mergekit copies them.
  static const std::set<std::string> exact = {"generation_config.json", "preprocessor_config.json",
                                              "processor_config.json",
                                              "video_preprocessor_config.json"};
  return exact.count(file_name) || is_tokenizer_file(file_name);
}

std::string shard_file_name(std::size_t index, std::size_t count) {
  if (index < 1 || index > count) {
    throw UsageError("shard_file_name: shard " + std::to_string(index) + " of " +
                     std::to_string(count) + " (indices are 1-based)");
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index, count);
  return buf;
}

std::vector<std::vector<std::size_t>> assign_shards(const std::vector<TensorInfo>& tensors,
                                                    std::uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) throw UsageError("maximum shard size must be positive");
  std::vector<std::vector<std::size_t>> shards;
  std::uint64_t current = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = tensors[i].nbytes();
    // As transformers' shard_checkpoint: start a new shard when this tensor would overflow a
    // non-empty one; a tensor larger than the maximum thus sits alone.
    const bool overflows = current > max_shard_bytes || bytes > max_shard_bytes - current;
    if (shards.empty() || (!shards.back().empty() && overflows)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += bytes;
  }
  return shards;
}

std::string make_index_json(const std::vector<std::string>& shard_names,
                            const std::vector<std::vector<TensorInfo>>& shard_tensors) {
  if (shard_names.size() != shard_tensors.size()) {
    throw UsageError("make_index_json: " + std::to_string(shard_names.size()) +
                     " shard names for " + std::to_string(shard_tensors.size()) + " shards");
  }
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total_size = 0, total_parameters = 0;
  for (std::size_t s = 0; s < shard_names.size(); ++s) {
    for (const TensorInfo& t : shard_tensors[s]) {
      if (weight_map.contains(t.name)) {
        throw UsageError("make_index_json: tensor '" + t.name + "' is in more than one shard");
      }
      weight_map[t.name] = shard_names[s];
      total_size += t.nbytes();
      total_parameters += t.numel();
    }
  }
  // nlohmann::json keeps keys sorted (byte-wise), as transformers' sort_keys=True does.
  nlohmann::json index;
  index["metadata"] = {{"total_parameters", total_parameters}, {"total_size", total_size}};
  index["weight_map"] = std::move(weight_map);
  return index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}

std::string rewrite_config_dtype(const std::string& config_json,
                                 const std::string& torch_dtype_name) {
  if (torch_dtype_name.empty()) throw UsageError("config.json: empty dtype name");
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (config_json.find_first_not_of(" \t\r\n") != std::string::npos) {
    try {
      config = nlohmann::ordered_json::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      throw InputError("config.json: not valid JSON: " + detail::json_error_text(e));
    }
    if (!config.is_object()) throw InputError("config.json: not a JSON object");
  }
  // Existing keys keep their place; missing ones are appended.
  config["torch_dtype"] = torch_dtype_name;
  config["dtype"] = torch_dtype_name;
  return config.dump(2) + "\n";
}

}  // namespace mergepipe::io
