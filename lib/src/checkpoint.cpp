#include "mergepipe/checkpoint.hpp"

namespace mergepipe {

std::optional<std::size_t> Checkpoint::find(const std::string& name) const {
  auto it = by_name.find(name);
  if (it == by_name.end()) return std::nullopt;
  return it->second;
}

std::vector<TensorInfo> Checkpoint::tensor_infos() const {
  std::vector<TensorInfo> infos;
  infos.reserve(tensors.size());
  for (const auto& t : tensors) infos.push_back(t.info);
  return infos;
}

std::uint64_t Checkpoint::total_bytes() const {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.length;
  return total;
}

}  // namespace mergepipe
