#include "mergepipe/io/checkpoint_location.hpp"

#include <map>

#include "mergepipe/error.hpp"

namespace mergepipe::io {

CheckpointLocation locate_tensors(const Checkpoint& checkpoint,
                                  const std::vector<TensorInfo>& tensors) {
  CheckpointLocation loc;
  loc.dir = checkpoint.dir;
  loc.shard_names = checkpoint.shard_names;
  loc.files = checkpoint.files;
  std::map<std::string, std::uint32_t> file_index;
  for (std::size_t i = 0; i < checkpoint.files.size(); ++i) {
    file_index[checkpoint.files[i].path] = static_cast<std::uint32_t>(i);
  }
  for (const auto& t : tensors) {
    const auto idx = checkpoint.find(t.name);
    if (!idx) throw InputError(checkpoint.dir + ": tensor '" + t.name + "' is missing");
    const StoredTensor& st = checkpoint.tensors[*idx];
    const auto it = file_index.find(st.file);
    if (it == file_index.end()) {
      throw InputError(checkpoint.dir + ": tensor '" + t.name + "' lies in an unknown file " +
                       st.file);
    }
    loc.tensor_file.push_back(it->second);
    loc.tensor_offset.push_back(st.offset);
  }
  return loc;
}

}  // namespace mergepipe::io
