#pragma once
// A frankenmerge's input (mergekit's passthrough `slices`): the output's tensors, each a tensor
// of one source model at its renumbered layer, and where each lies, as one checkpoint location
// over the source models' files. The merge then copies it like any base.
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/merge_spec.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe::io {

struct SliceComposition {
  std::vector<TensorInfo> tensors;  // output order: embeddings, layers 0..n-1, the rest
  CheckpointLocation location;      // dir: the models' common folder; shards relative to it
};

// The embeddings come from the first slice's model, the tensors outside the layers that are no
// embeddings (final norm, head) from the last slice's. UsageError for a layer range beyond a
// model's layers; InputError for slices whose layers differ in tensors, shapes or dtypes.
SliceComposition compose_slices(const MergeSpec& spec);

// A merge given as one slice of layers [first, end) of every model (merge_layer_range): a
// UsageError unless that is every layer of each model (per-slice merges of part of the layers
// are not supported yet). Nothing to check without it.
void check_whole_model_slice(const MergeSpec& spec);

// The output's config.json: `config_json` (the base's) with num_hidden_layers the slices' total
// and, when the sources' configs list `layer_types` per layer, that list for the output's
// layers. InputError naming the file when a config is not valid JSON.
std::string rewrite_config_layers(const std::string& config_json, const MergeSpec& spec);

}  // namespace mergepipe::io
