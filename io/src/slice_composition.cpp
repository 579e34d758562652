#include "mergepipe/io/slice_composition.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "mergepipe/error.hpp"
#include "mergepipe/io/checkpoint_location.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/layer_names.hpp"

namespace mergepipe::io {
namespace {

namespace fs = std::filesystem;

bool is_embedding(const std::string& name) {
  return name.find("embed") != std::string::npos || name.find("wte") != std::string::npos ||
         name.find("wpe") != std::string::npos;
}

std::size_t layer_count(const Checkpoint& c) {
  std::size_t n = 0;
  for (const StoredTensor& t : c.tensors)
    if (auto l = tensor_layer(t.info.name)) n = std::max(n, *l + 1);
  return n;
}

// The deepest folder holding every path.
fs::path common_folder(const std::vector<std::string>& dirs) {
  fs::path common = fs::path(dirs.front()).lexically_normal();
  for (const std::string& d : dirs) {
    const fs::path p = fs::path(d).lexically_normal();
    fs::path shared;
    for (auto a = common.begin(), b = p.begin(); a != common.end() && b != p.end() && *a == *b;
         ++a, ++b)
      shared /= *a;
    common = shared;
  }
  return common.empty() ? fs::path("/") : common;
}

}  // namespace

SliceComposition compose_slices(const MergeSpec& spec) {
  if (spec.slices.empty()) throw std::invalid_argument("compose_slices: no slices");
  std::map<std::string, Checkpoint> models;
  for (const SliceSource& s : spec.slices)
    if (!models.count(s.model)) models.emplace(s.model, open_checkpoint(s.model));

  // (model, tensor name in it) of each output tensor.
  std::vector<std::pair<const Checkpoint*, std::string>> picks;
  SliceComposition out;
  const auto take = [&](const Checkpoint& from, const std::string& source_name,
                        const std::string& output_name) {
    const StoredTensor& st = from.tensors[*from.find(source_name)];
    out.tensors.push_back({output_name, st.info.dtype, st.info.shape});
    picks.emplace_back(&from, source_name);
  };
  const Checkpoint& first = models.at(spec.slices.front().model);
  const Checkpoint& last = models.at(spec.slices.back().model);
  for (const StoredTensor& t : first.tensors)
    if (!tensor_layer(t.info.name) && is_embedding(t.info.name))
      take(first, t.info.name, t.info.name);

  // Layers: every slice's tensors of each layer, renumbered; each output layer must hold the
  // same tensors (by name within the layer), shapes and dtypes as the first.
  std::size_t next = 0;
  std::vector<TensorInfo> layout;  // layer 0's tensors, renumbered to 0
  for (std::size_t i = 0; i < spec.slices.size(); ++i) {
    const SliceSource& s = spec.slices[i];
    const Checkpoint& c = models.at(s.model);
    const std::size_t layers = layer_count(c);
    if (s.end_layer > layers) {
      throw UsageError("slices[" + std::to_string(i) + "]: layer_range [" +
                       std::to_string(s.first_layer) + ", " + std::to_string(s.end_layer) +
                       "] of '" + s.model + "': the model has " + std::to_string(layers) +
                       " layers");
    }
    for (std::size_t layer = s.first_layer; layer < s.end_layer; ++layer, ++next) {
      std::vector<TensorInfo> these;
      for (const StoredTensor& t : c.tensors) {
        if (tensor_layer(t.info.name) != layer) continue;
        take(c, t.info.name, renumber_layer(t.info.name, next));
        these.push_back({renumber_layer(t.info.name, 0), t.info.dtype, t.info.shape});
      }
      std::sort(these.begin(), these.end(),
                [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
      if (layout.empty()) {
        layout = these;
      } else if (these != layout) {
        throw InputError("slices[" + std::to_string(i) + "]: layer " + std::to_string(layer) +
                         " of '" + s.model +
                         "' differs from the first slice's layers in its tensors, shapes or "
                         "dtypes: the slices are not of one architecture");
      }
    }
  }
  for (const StoredTensor& t : last.tensors)
    if (!tensor_layer(t.info.name) && !is_embedding(t.info.name))
      take(last, t.info.name, t.info.name);

  // One location over the models' files, named relative to their common folder.
  std::vector<std::string> dirs;
  for (const auto& [dir, c] : models) dirs.push_back(c.dir);
  const fs::path root = common_folder(dirs);
  CheckpointLocation& loc = out.location;
  loc.dir = root.string();
  std::map<std::string, std::uint32_t> file_index;
  for (const auto& [dir, c] : models) {
    for (const FileIdentity& f : c.files) {
      file_index.emplace(f.path, static_cast<std::uint32_t>(loc.files.size()));
      loc.files.push_back(f);
      loc.shard_names.push_back(
          fs::path(f.path).lexically_normal().lexically_relative(root).string());
    }
  }
  for (const auto& [from, name] : picks) {
    const StoredTensor& st = from->tensors[*from->find(name)];
    loc.tensor_file.push_back(file_index.at(st.file));
    loc.tensor_offset.push_back(st.offset);
  }
  return out;
}

void check_whole_model_slice(const MergeSpec& spec) {
  if (!spec.merge_layer_range) return;
  const auto [first, end] = *spec.merge_layer_range;
  std::vector<std::string> models{spec.base_model};
  for (const ExpertSpec& e : spec.experts) models.push_back(e.path);
  for (const std::string& m : models) {
    const std::size_t layers = layer_count(open_checkpoint(m));
    if (first != 0 || end != layers) {
      throw UsageError("config: the slice's layer_range [" + std::to_string(first) + ", " +
                       std::to_string(end) + "] is not every layer of '" + m + "' (it has " +
                       std::to_string(layers) +
                       "): merging part of the layers (a per-slice merge) is not supported yet; "
                       "give [0, " +
                       std::to_string(layers) + "] or use passthrough slices");
    }
  }
}

std::string rewrite_config_layers(const std::string& config_json, const MergeSpec& spec) {
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(spec.base_model + "/config.json: not valid JSON: " + e.what());
  }
  std::uint64_t layers = 0;
  for (const SliceSource& s : spec.slices) layers += s.end_layer - s.first_layer;
  nlohmann::ordered_json& target = config.contains("text_config") &&
                                           config["text_config"].is_object() &&
                                           config["text_config"].contains("num_hidden_layers")
                                       ? config["text_config"]
                                       : config;
  target["num_hidden_layers"] = layers;
  if (target.contains("layer_types") && target["layer_types"].is_array()) {
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (const SliceSource& s : spec.slices) {
      const std::string path = s.model + "/config.json";
      nlohmann::ordered_json theirs;
      try {
        theirs = nlohmann::ordered_json::parse(read_text_file(path));
      } catch (const nlohmann::json::exception& e) {
        throw InputError(path + ": not valid JSON: " + e.what());
      }
      if (theirs.contains("text_config")) theirs = theirs["text_config"];
      for (std::uint64_t l = s.first_layer; l < s.end_layer; ++l) {
        if (!theirs.contains("layer_types") || l >= theirs["layer_types"].size())
          throw InputError(path + ": layer_types does not list layer " + std::to_string(l));
        types.push_back(theirs["layer_types"][l]);
      }
    }
    target["layer_types"] = types;
  }
  return config.dump(2) + "\n";
}

}  // namespace mergepipe::io
