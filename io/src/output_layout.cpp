#include "mergepipe/io/output_layout.hpp"

#include "mergepipe/error.hpp"
#include "mergepipe/io/hf_folder.hpp"

namespace mergepipe::io {

OutputLayout make_output_layout(const std::vector<TensorInfo>& tensors,
                                std::uint64_t max_shard_bytes) {
  OutputLayout layout;
  layout.tensors = tensors;
  layout.tensor_shard.assign(tensors.size(), 0);
  layout.tensor_offset.assign(tensors.size(), 0);
  const auto groups = assign_shards(tensors, max_shard_bytes);
  std::vector<std::vector<TensorInfo>> shard_tensors;
  for (std::size_t s = 0; s < groups.size(); ++s) {
    layout.shard_names.push_back(groups.size() == 1 ? "model.safetensors"
                                                    : shard_file_name(s + 1, groups.size()));
    std::vector<TensorInfo> infos;
    for (std::size_t t : groups[s]) infos.push_back(tensors[t]);
    SafetensorsLayout st = layout_safetensors(infos);
    for (std::size_t t : groups[s]) {
      layout.tensor_shard[t] = static_cast<std::uint32_t>(s);
      bool found = false;
      for (const auto& placed : st.tensors) {
        if (placed.info.name == tensors[t].name) {
          layout.tensor_offset[t] = placed.offset;
          found = true;
          break;
        }
      }
      if (!found) throw InputError("output layout lost tensor '" + tensors[t].name + "'");
    }
    layout.shards.push_back(std::move(st));
    shard_tensors.push_back(std::move(infos));
  }
  if (groups.size() > 1) layout.index_json = make_index_json(layout.shard_names, shard_tensors);
  return layout;
}

}  // namespace mergepipe::io
