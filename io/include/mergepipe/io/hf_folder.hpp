#pragma once
// Hugging Face model folders: `model.safetensors`, or shards + `model.safetensors.index.json`.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mergepipe/checkpoint.hpp"

namespace mergepipe::io {

// Opens and validates a folder: every shard's header, the index (entries must be plain file
// names inside the folder that exist, no `..`, no absolute paths, no symlink leaving the folder;
// every weight_map entry must match the tensors found), duplicate tensors across shards.
// Throws InputError / IoError naming the folder and file.
Checkpoint open_checkpoint(const std::string& dir);

// The weight_map of `model.safetensors.index.json` text (tensor name -> shard file name), without
// touching the file system: strict JSON (no duplicate keys), a non-empty object of strings, each
// a plain file name (no separator, no `..`, not absolute, not empty). Throws InputError naming
// `index_path` and the tensor. open_checkpoint then checks that the files exist inside the folder.
std::map<std::string, std::string> parse_index_weight_map(std::string_view text,
                                                          const std::string& index_path);

// Files carried from a base to outputs: tokenizer*, special_tokens_map.json, vocab/merges,
// chat_template*, generation_config.json and the processor configs (preprocessor_config.json,
// processor_config.json, video_preprocessor_config.json). (config.json is rewritten.)
bool is_carried_file(const std::string& file_name);
// The carried files that make up the tokenizer (what --no-copy-tokenizer leaves out).
bool is_tokenizer_file(const std::string& file_name);

// Shard names as transformers writes them: "model-00001-of-00004.safetensors" (1-based).
std::string shard_file_name(std::size_t index, std::size_t count);

// Assigns tensors (given in module order) to shards: a shard is closed when the next tensor would
// push it over max_shard_bytes (a single larger tensor gets a shard of its own). Returns, per
// shard, the indices of its tensors.
std::vector<std::vector<std::size_t>> assign_shards(const std::vector<TensorInfo>& tensors,
                                                    std::uint64_t max_shard_bytes);

// Writes `model.safetensors.index.json` for the given shards (weight_map sorted by tensor name,
// metadata.total_size = data bytes).
std::string make_index_json(const std::vector<std::string>& shard_names,
                            const std::vector<std::vector<TensorInfo>>& shard_tensors);

// config.json of an output: the base's text with `torch_dtype` and `dtype` set to `dtype_name`
// ("bfloat16", "float16", "float32"); key order otherwise preserved.
std::string rewrite_config_dtype(const std::string& config_json,
                                 const std::string& torch_dtype_name);

}  // namespace mergepipe::io
