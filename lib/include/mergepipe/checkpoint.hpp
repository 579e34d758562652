#pragma once
// A checkpoint (Hugging Face model folder) as the core sees it: files with their identities and
// tensors with their byte locations. io/ fills it from disk; nothing here knows the file format.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/tensor.hpp"

namespace mergepipe {

// What identifies a file's content cheaply: used to detect a stale catalog or manifest input.
struct FileIdentity {
  std::string path;  // as given (folder + file name)
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::string header_hash;  // hash128_hex of the safetensors header bytes (8 + N)
  // Inode change time: moves on every write and cannot be set back (touch -r restores mtime
  // only). 0: not recorded (catalogs from before it was).
  std::int64_t ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

struct Checkpoint {
  std::string dir;                       // the folder
  std::vector<std::string> shard_names;  // file names inside dir, in shard order
  std::vector<FileIdentity> files;       // parallel to shard_names
  std::vector<StoredTensor> tensors;     // in checkpoint order: shard order, then offset
  std::string config_json;               // raw config.json text ("" when absent)
  std::vector<std::string> extra_files;  // tokenizer/generation files to carry to outputs

  // Index into `tensors` by name, nullopt when absent.
  std::optional<std::size_t> find(const std::string& name) const;
  std::vector<TensorInfo> tensor_infos() const;
  std::uint64_t total_bytes() const;  // sum of tensor byte lengths

  // Built by io when the checkpoint is opened.
  std::map<std::string, std::size_t> by_name;
};

}  // namespace mergepipe
