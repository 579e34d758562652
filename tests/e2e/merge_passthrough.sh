#!/usr/bin/env bash
# passthrough (issues 37, 38): mergekit's frankenmerges, slices of layer ranges from different
# models stacked and renumbered, and a whole model copied with a scale. Checked tensor by tensor
# against the sources (an independent reading of the safetensors files), on 1 and 2 ranks, with
# the output's config.json layer count, a replay, and the usage errors.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --layers 6 --experts 1 --seed 5 --out fam >/dev/null
cat >franken.yml <<YAML
slices:
  - sources:
    - model: fam/base
      layer_range: [0, 4]
  - sources:
    - model: fam/expert00
      layer_range: [2, 6]
merge_method: passthrough
dtype: bfloat16
YAML
# No catalog and no --full-read: copies have nothing to budget.
run_np 2 merge franken.yml out2 >franken.txt
run_np 1 merge franken.yml out1 --quiet
same_model_files out1 out2
"$PYTHON" - out2 fam/base fam/expert00 <<'PY'
import json, sys
sys.path.insert(0, __import__("os").environ["TESTS_DIR"] + "/python")
from merge_ref import read_folder
import numpy as np
out, a, b = (read_folder(p) for p in sys.argv[1:4])
expect = {}
def layer_of(name):
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else None
for name, v in a.items():
    l = layer_of(name)
    if l is None and "embed" in name:
        expect[name] = v
    elif l is not None and l < 4:
        expect[name] = v
for name, v in b.items():
    l = layer_of(name)
    if l is None and "embed" not in name:
        expect[name] = v
    elif l is not None and 2 <= l < 6:
        expect[name.replace(f"model.layers.{l}.", f"model.layers.{l + 2}.", 1)] = v
assert set(out) == set(expect), (sorted(set(out) ^ set(expect)))[:5]
for name, (arr, dtype) in out.items():
    ref, ref_dtype = expect[name]
    assert dtype == ref_dtype and arr.shape == ref.shape, name
    assert np.array_equal(arr.view(np.uint32), ref.view(np.uint32)), f"{name} is not a copy"
config = json.load(open(sys.argv[1] + "/config.json"))
assert config["num_hidden_layers"] == 8, config["num_hidden_layers"]
print(f"passthrough slices: {len(out)} tensors copied bit for bit, 8 layers")
PY
grep -q "layers" out2/mergepipe.manifest.json || fail "the manifest does not record the slices"
"$MERGEPIPE" replay out2/mergepipe.manifest.json --out again --quiet
same_model_files out2 again

# A whole model with a scale (mergekit's passthrough parameter).
cat >scaled.yml <<YAML
models:
  - model: fam/expert00
merge_method: passthrough
parameters: {scale: 0.5}
dtype: float32
YAML
run_np 2 merge scaled.yml scaled --quiet
"$PYTHON" - scaled fam/expert00 <<'PY'
import sys
sys.path.insert(0, __import__("os").environ["TESTS_DIR"] + "/python")
from merge_ref import read_folder
import numpy as np
out, src = read_folder(sys.argv[1]), read_folder(sys.argv[2])
assert set(out) == set(src)
for name, (arr, dtype) in out.items():
    assert dtype == "F32", dtype
    assert np.array_equal(arr, np.float32(0.5) * src[name][0]), name
print("passthrough scale: ok")
PY

# What passthrough cannot do, one line each.
expect_exit 2 "franken\.yml: passthrough copies tensors and merges no expert, so --catalog has nothing to budget" \
  "$MERGEPIPE" merge franken.yml x --catalog cat
sed 's/\[2, 6\]/[2, 7]/' franken.yml >beyond.yml
expect_exit 2 "slices\[1\]: layer_range \[2, 7\] of '.*fam/expert00': the model has 6 layers" \
  "$MERGEPIPE" merge beyond.yml x
expect_no_output x
cat >two.yml <<YAML
slices:
  - sources:
    - model: fam/base
      layer_range: [0, 6]
    - model: fam/expert00
      layer_range: [0, 6]
merge_method: passthrough
YAML
expect_exit 2 "two\.yml:3: key 'slices\[0\]\.sources': passthrough copies one source per slice; a slice of 2 sources merges them" \
  "$MERGEPIPE" merge two.yml x
# A method's merge written as one slice of every layer (mergekit's slerp examples) is the merge of
# its sources, bit for bit the same as under 'models'; part of the layers, several slices, or
# sources with different ranges are per-slice merges: refused.
{ sed 's/merge_method: passthrough/merge_method: task_arithmetic/' two.yml; echo "base_model: fam/base"; } >ta-slice.yml
printf 'merge_method: task_arithmetic
base_model: fam/base
models: [fam/base, fam/expert00]
' >ta-models.yml
"$MERGEPIPE" merge ta-slice.yml ta-slice --full-read --quiet
"$MERGEPIPE" merge ta-models.yml ta-models --full-read --quiet
same_model_files ta-slice ta-models
sed 's/\[0, 6\]/[0, 4]/g' ta-slice.yml >ta-part.yml
expect_exit 2 "layer_range \[0, 4\] is not every layer of .* \(it has 6\)" \
  "$MERGEPIPE" merge ta-part.yml x --full-read
sed '0,/\[0, 6\]/s//[0, 3]/' ta-slice.yml >ta-ranges.yml
expect_exit 2 "slices\[0\]\.sources\[1\]\.layer_range': differs from the first source's" \
  "$MERGEPIPE" merge ta-ranges.yml x --full-read
sed 's/^merge_method: passthrough/merge_method: ties\nbase_model: fam\/base/' franken.yml >ties-slices.yml
expect_exit 2 "key 'slices': 2 slices merged by ties \(per-slice merges\) are not supported yet" \
  "$MERGEPIPE" merge ties-slices.yml x
expect_no_output x
printf 'merge_method: passthrough\nmodels: [fam/base, fam/expert00]\n' >many.yml
expect_exit 2 "passthrough copies one model's tensors \(or slices of layers\), but 'models' lists 2" \
  "$MERGEPIPE" merge many.yml x
printf 'merge_method: ties\nbase_model: fam/base\nmodels: [fam/expert00]\nparameters: {scale: 2}\n' >scale-ties.yml
expect_exit 2 "parameter 'scale' belongs to passthrough; ties does not take it" \
  "$MERGEPIPE" merge scale-ties.yml x --full-read
echo "passthrough: ok"
