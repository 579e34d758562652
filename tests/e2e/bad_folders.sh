#!/usr/bin/env bash
# Hostile checkpoint folders and families (docs/reliability.md, "Bad checkpoints"): index files
# naming missing shards or paths outside the folder, escaping symlinks, experts whose tensors
# differ from the base, NaN/Inf weights. Each is refused by `catalog` and `merge --full-read` on 2
# ranks with exit 3 and one line naming the file and the tensor; nothing is left at either output
# (see bad_family.bash). --allow-nonfinite then lets the non-finite expert through.
source "$(dirname "$0")/bad_family.bash"

index="f/expert01/model\.safetensors\.index\.json: weight_map entry for tensor 'model\.norm\.weight'"
fresh && corrupt index-entry f/expert01 model.norm.weight model-00009-of-00004.safetensors
reject "index naming a missing shard" \
  "$index: file 'model-00009-of-00004\.safetensors' does not exist in .*/f/expert01"
fresh && corrupt index-entry f/expert01 model.norm.weight ../expert00/model-00003-of-00004.safetensors
reject "index path with ../" "$index \('\.\./expert00/model-00003-of-00004\.safetensors'\) refers outside the folder"
fresh && corrupt index-entry f/expert01 model.norm.weight "$PWD/fam/expert01/model-00003-of-00004.safetensors"
reject "index with an absolute path" "$index \('/.*'\) is an absolute path"
fresh && mv f/expert01/model-00003-of-00004.safetensors outside.safetensors &&
  ln -s ../../outside.safetensors f/expert01/model-00003-of-00004.safetensors
reject "shard symlink leaving the folder" \
  "f/expert01/model\.safetensors\.index\.json: weight_map entry for tensor '[^']+': 'model-00003-of-00004\.safetensors' is a symlink to .*/outside\.safetensors, outside the folder .*/f/expert01"
fresh && rm f/expert01/model.safetensors.index.json
reject "sharded checkpoint without its index" \
  "f/expert01: not a Hugging Face checkpoint folder: .* \(4 other \.safetensors files are present"

# Experts that do not share the base's coordinates: the first mismatch in base order. `merge
# --full-read` names the expert folder (or the file), `catalog` the file holding the tensor.
down="model.layers.0.mlp.down_proj.weight"
fresh && corrupt set "$shard" "$down" shape '[192, 64]'
reject "expert with another shape" \
  "$file|f/expert01/model-00002-of-00004\.safetensors: tensor '$down' has shape \[192, 64\] but the base has \[64, 192\]" \
  "f/expert01(/model-00002-of-00004\.safetensors)?: tensor '$down':? has shape \[192, 64\] but the base has \[64, 192\]"
fresh && corrupt set "$shard" "$down" dtype '"F16"'
reject "expert with another dtype" \
  "f/expert01/model-00002-of-00004\.safetensors: tensor '$down' has dtype F16 but the base has BF16" \
  "f/expert01(/model-00002-of-00004\.safetensors)?: tensor '$down':? has dtype F16 but the base has BF16"
fresh && corrupt rename f/expert01 "$down" model.layers.0.mlp.down.weight
reject "expert lacking a tensor" \
  "f/expert01: tensor '$down' is missing \(the base has it\)" \
  "f/expert01: tensor '$down':? is missing \(the base has it\)"
fresh && corrupt add f/expert01 extra.bias
reject "expert with an extra tensor" \
  "f/expert01/model-00004-of-00004\.safetensors: tensor 'extra\.bias' is not in the base" \
  "f/expert01(/model-00004-of-00004\.safetensors)?: tensor 'extra\.bias':? is not in the base"

# NaN/Inf in an expert: refused by default (naming file, tensor and expert), accepted with
# --allow-nonfinite.
norm_file="f/expert01/model-00003-of-00004\.safetensors"
for value in nan inf; do
  fresh && corrupt nonfinite f/expert01 model.norm.weight "$value"
  reject "$value in an expert" \
    "$norm_file: tensor 'model\.norm\.weight' of expert .*/f/expert01 holds NaN or Inf values \(--allow-nonfinite" \
    "tensor 'model\.norm\.weight'.* NaN/Inf .*--allow-nonfinite"
done
run_np 2 merge c.yaml --full-read --allow-nonfinite --out out --quiet ||
  fail "--allow-nonfinite did not merge an expert holding Inf"
"$MERGEPIPE" verify out >/dev/null || fail "the --allow-nonfinite output does not verify"
run_np 2 catalog --base f/base --experts f/expert00 f/expert01 --out cat --allow-nonfinite \
  >/dev/null || fail "catalog --allow-nonfinite refused an expert holding Inf"
expect_exit 3 "catalog: expert '.*/f/expert01' holds [0-9]+ NaN/Inf values" \
  run_np 2 merge c.yaml --catalog cat --out out2
expect_one_error
expect_no_output out2
echo "bad checkpoint folders: ok"
