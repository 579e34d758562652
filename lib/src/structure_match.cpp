#include "mergepipe/structure_match.hpp"

#include <string_view>
#include <unordered_map>

namespace mergepipe {

std::optional<StructureMismatch> find_structure_mismatch(const std::vector<TensorInfo>& base,
                                                         const std::vector<TensorInfo>& other) {
  std::unordered_map<std::string_view, std::size_t> other_by_name;
  other_by_name.reserve(other.size());
  for (std::size_t i = 0; i < other.size(); ++i) other_by_name.emplace(other[i].name, i);

  for (const TensorInfo& want : base) {
    auto it = other_by_name.find(want.name);
    if (it == other_by_name.end()) {
      return StructureMismatch{want.name, std::nullopt, "is missing (the base has it)"};
    }
    const TensorInfo& got = other[it->second];
    if (got.shape != want.shape) {
      return StructureMismatch{
          want.name, it->second,
          "has shape " + format_shape(got.shape) + " but the base has " + format_shape(want.shape)};
    }
    if (got.dtype != want.dtype) {
      return StructureMismatch{want.name, it->second,
                               "has dtype " + std::string(dtype_name(got.dtype)) +
                                   " but the base has " + std::string(dtype_name(want.dtype))};
    }
  }
  if (other.size() != base.size()) {
    std::unordered_map<std::string_view, std::size_t> base_names;
    for (std::size_t i = 0; i < base.size(); ++i) base_names.emplace(base[i].name, i);
    for (std::size_t i = 0; i < other.size(); ++i) {
      if (!base_names.count(other[i].name)) {
        return StructureMismatch{other[i].name, i, "is not in the base"};
      }
    }
  }
  return std::nullopt;
}

}  // namespace mergepipe
