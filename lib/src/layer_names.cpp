#include "mergepipe/layer_names.hpp"

#include <cctype>

namespace mergepipe {
namespace {

// Where the layer number lies in the name: [begin, end) of its digits.
struct Digits {
  std::size_t begin = 0, end = 0;
};

std::optional<Digits> find_layer_digits(std::string_view name) {
  for (std::string_view marker : {"layers.", "h.", "blocks."}) {
    for (std::size_t pos = name.find(marker); pos != std::string_view::npos;
         pos = name.find(marker, pos + 1)) {
      if (pos != 0 && name[pos - 1] != '.') continue;  // a whole name component
      const std::size_t begin = pos + marker.size();
      std::size_t end = begin;
      while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
      if (end > begin && (end == name.size() || name[end] == '.')) return Digits{begin, end};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::size_t> tensor_layer(std::string_view name) {
  const auto digits = find_layer_digits(name);
  if (!digits) return std::nullopt;
  std::size_t layer = 0;
  for (std::size_t i = digits->begin; i < digits->end; ++i)
    layer = layer * 10 + static_cast<std::size_t>(name[i] - '0');
  return layer;
}

std::string renumber_layer(std::string_view name, std::size_t layer) {
  const auto digits = find_layer_digits(name);
  if (!digits) return std::string(name);
  return std::string(name.substr(0, digits->begin)) + std::to_string(layer) +
         std::string(name.substr(digits->end));
}

}  // namespace mergepipe
