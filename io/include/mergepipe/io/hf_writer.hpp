#pragma once
// Writes one Hugging Face model folder whose tensor data arrive in pieces, from several threads
// at once, so no shard is ever held in memory: the layout (shards, offsets, index) is computed up
// front, each shard is created under a temporary name with its header, filled with positioned
// writes, then fsynced and renamed to its final name.
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/io/file.hpp"
#include "mergepipe/io/output_layout.hpp"

namespace mergepipe::io {

class HfFolderWriter {
 public:
  // Creates `dir` (its parent must exist, `dir` must not) and the temporary shard files.
  // Throws IoError naming the path.
  HfFolderWriter(std::string dir, const std::vector<TensorInfo>& tensors,
                 std::uint64_t max_shard_bytes);
  ~HfFolderWriter();  // removes the temporary shards of an unfinished folder
  HfFolderWriter(const HfFolderWriter&) = delete;
  HfFolderWriter& operator=(const HfFolderWriter&) = delete;

  const std::string& dir() const noexcept { return dir_; }
  const OutputLayout& layout() const noexcept { return layout_; }

  // Thread-safe: writes `bytes` at byte `offset` of tensor `tensor`'s data (tensor indices as
  // given to the constructor). std::out_of_range when the range leaves the tensor.
  void write_tensor(std::size_t tensor, std::uint64_t offset,
                    std::span<const std::byte> bytes) const;

  // Writes a small file (config.json, tokenizer_config.json, ...) into the folder, fsynced.
  void write_small_file(const std::string& name, const std::string& text);

  // fsyncs and renames the shards, writes model.safetensors.index.json when sharded, fsyncs the
  // folder. Nothing may be written afterwards.
  void finish();

  // Files in the folder once finished (shards, index, small files) and all bytes written.
  std::size_t file_count() const noexcept {
    return layout_.shards.size() + small_files_ + (layout_.index_json.empty() ? 0 : 1);
  }
  std::uint64_t bytes_written() const noexcept { return bytes_.load(); }

 private:
  std::string dir_;
  OutputLayout layout_;
  std::vector<File> shards_;
  std::vector<std::string> temp_paths_;
  std::size_t small_files_ = 0;
  bool finished_ = false;
  mutable std::atomic<std::uint64_t> bytes_{0};
};

}  // namespace mergepipe::io
