#pragma once
// Layer indices in tensor names ("model.layers.12.mlp.up_proj.weight"), as mergekit's
// architectures name them: the number after a "layers.", "h." or "blocks." name component.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mergepipe {

// The layer of a tensor, or nullopt for the embeddings, final norm, head and the like.
std::optional<std::size_t> tensor_layer(std::string_view tensor_name);

// The same name with its layer index replaced by `layer` (the name itself when it has none).
std::string renumber_layer(std::string_view tensor_name, std::size_t layer);

}  // namespace mergepipe
