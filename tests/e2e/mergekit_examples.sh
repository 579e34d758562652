#!/usr/bin/env bash
# mergekit's own example configs (tests/data/mergekit-examples, byte for byte as mergekit ships
# them) run unchanged: every model id resolves from a local Hugging Face cache holding synthetic
# checkpoints in the cache's real layout (snapshots of symlinks into blobs/). Each runs through
# plan, merge --full-read and a budgeted merge; the full budget equals the full read bit for bit
# and the numpy reference of mergekit's semantics. Configs that need what is not built yet fail
# with the one line that says so.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"
EXAMPLES="$TESTS_DIR/data/mergekit-examples"

"$MERGEPIPE" synth --preset tiny --experts 4 --seed 29 --out fam >/dev/null
export HF_HOME="$TEST_SCRATCH/hf"
unset HF_HUB_CACHE
# cache_model ID FOLDER: the folder's files as the hub cache stores them.
cache_model() {
  local id="$1" src="$2" commit repo f blob
  commit="$(printf '%s' "$id" | sha1sum | cut -c1-40)"
  repo="$HF_HOME/hub/models--${id//\//--}"
  mkdir -p "$repo/refs" "$repo/blobs" "$repo/snapshots/$commit"
  printf '%s' "$commit" >"$repo/refs/main"
  for f in "$src"/*; do
    blob="$(sha256sum "$f" | cut -c1-64)"
    cp "$f" "$repo/blobs/$blob"
    ln -s "../../blobs/$blob" "$repo/snapshots/$commit/$(basename "$f")"
  done
  echo "$repo/snapshots/$commit"
}
TB="$(cache_model TheBloke/Llama-2-13B-fp16 fam/base)"
MB="$(cache_model mistralai/Mistral-7B-v0.1 fam/base)"
ORCA="$(cache_model psmathur/orca_mini_v3_13b fam/expert00)"
PLATY="$(cache_model garage-bAInd/Platypus2-13B fam/expert01)"
WLM="$(cache_model WizardLM/WizardLM-13B-V1.2 fam/expert02)"
WMATH="$(cache_model WizardLM/WizardMath-13B-V1.0 fam/expert03)"
MI="$(cache_model mistralai/Mistral-7B-Instruct-v0.2 fam/expert02)"
BIO="$(cache_model BioMistral/BioMistral-7B fam/expert03)"

# example CONFIG BASE EXPERTS...: a catalog of the cached folders, then plan, a full read, a
# full budget and a 40% budget of the config as shipped.
example() {
  local name="$1" base="$2"
  shift 2
  cp "$EXAMPLES/$name.yml" .
  run_np 2 catalog --base "$base" --experts "$@" --out "cat-$name" >/dev/null
  "$MERGEPIPE" plan --config "$name.yml" --catalog "cat-$name" --budget 40% >"plan-$name.txt"
  run_np 2 merge "$name.yml" "$name-full" --full-read --quiet
  run_np 2 merge "$name.yml" "$name-100" --catalog "cat-$name" --budget 100% --quiet
  same_model_files "$name-full" "$name-100"
  "$PYTHON" "$REF" "$name.yml" "$name-100"
  run_np 1 merge "$name.yml" "$name-40" --catalog "cat-$name" --budget 40% --quiet
  cmp -s "$name.yml" "$name-40/mergekit_config.yml" || fail "$name: the config copy differs"
  echo "$name.yml: ok"
}
example linear "$ORCA" "$WLM" "$PLATY"
example bio-merge "$MB" "$MI" "$BIO"
example ties "$TB" "$ORCA" "$PLATY" "$WMATH"
# fp16 as the config asks, and the model card names the hub ids as written.
grep -q '"torch_dtype": "float16"' ties-100/config.json || fail "ties.yml: dtype float16 not in config.json"
grep -q 'TheBloke/Llama-2-13B-fp16' ties-40/README.md || fail "the model card lacks the base's id"

# The frankenmerge (passthrough slices: 24 + 20 layers of two 40-layer models), from a cache of
# 40-layer models; a copy, so nothing to budget: plan refuses, the merge needs no flag.
"$MERGEPIPE" synth --preset tiny --layers 40 --hidden 32 --experts 1 --seed 31 --out fam40 >/dev/null
HF_HOME="$TEST_SCRATCH/hf40" cache_model psmathur/orca_mini_v3_13b fam40/base >/dev/null
HF_HOME="$TEST_SCRATCH/hf40" cache_model garage-bAInd/Platypus2-13B fam40/expert00 >/dev/null
cp "$EXAMPLES/orcamini-platy-44layer.yml" .
HF_HOME="$TEST_SCRATCH/hf40" run_np 2 merge orcamini-platy-44layer.yml platy44 --quiet
HF_HOME="$TEST_SCRATCH/hf40" run_np 1 merge orcamini-platy-44layer.yml platy44-1 --quiet
same_model_files platy44 platy44-1
[[ "$(json_get platy44/config.json num_hidden_layers)" == 44 ]] || fail "44-layer example: $(json_get platy44/config.json num_hidden_layers) layers"
"$PYTHON" - platy44 fam40/base fam40/expert00 <<'PY'
import sys
sys.path.insert(0, __import__("os").environ["TESTS_DIR"] + "/python")
from merge_ref import read_folder
import numpy as np
out, a, b = (read_folder(p) for p in sys.argv[1:4])
for name, (arr, _) in out.items():
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        l = int(parts[2])
        src, at = (a, l) if l < 24 else (b, l - 24 + 20)
        ref = src[name.replace(f"layers.{l}.", f"layers.{at}.", 1)][0]
    else:
        ref = (a if "embed" in name else b)[name][0]
    # fp16 as the config asks: the bf16 sources rounded once.
    assert np.array_equal(arr, ref.astype(np.float16).astype(np.float32)), name
print("orcamini-platy-44layer.yml: 44 layers, each the right source layer")
PY
HF_HOME="$TEST_SCRATCH/hf40" expect_exit 2 "passthrough copies tensors and merges no expert: there is nothing to budget" \
  "$MERGEPIPE" plan --config orcamini-platy-44layer.yml --catalog cat-ties
echo "orcamini-platy-44layer.yml: ok"

# slerp, written as one slice of all 40 layers of both models, with mergekit's 'pattern:' key
# (which mergekit drops, so its first t gradient applies to every tensor: said as a warning). Its
# coefficients need whole-tensor statistics: a full read; a budget is refused with the reason.
cp "$EXAMPLES/gradient-slerp.yml" .
HF_HOME="$TEST_SCRATCH/hf40" run_np 2 merge gradient-slerp.yml slerp40 --full-read 2>slerp40.err >/dev/null
grep -q "t\[0\]\.pattern' is not a key mergekit reads" slerp40.err || fail "no warning about 'pattern': $(cat slerp40.err)"
HF_HOME="$TEST_SCRATCH/hf40" "$PYTHON" "$REF" gradient-slerp.yml slerp40
HF_HOME="$TEST_SCRATCH/hf40" run_np 3 merge gradient-slerp.yml slerp40-3 --quiet  # as mergekit-yaml CONFIG OUT
same_model_files slerp40 slerp40-3
HF_HOME="$TEST_SCRATCH/hf40" run_np 1 catalog --base "$(HF_HOME=$TEST_SCRATCH/hf40 cache_model psmathur/orca_mini_v3_13b fam40/base)" \
  --experts "$(HF_HOME=$TEST_SCRATCH/hf40 cache_model garage-bAInd/Platypus2-13B fam40/expert00)" --out cat-slerp >/dev/null
HF_HOME="$TEST_SCRATCH/hf40" expect_exit 2 "slerp's coefficients depend on both models' norms" \
  "$MERGEPIPE" plan --config gradient-slerp.yml --catalog cat-slerp --budget 40%
# The slice must be every layer: [0, 20] of 40-layer models is a per-slice merge.
sed 's/layer_range: \[0, 40\]/layer_range: [0, 20]/' gradient-slerp.yml >slerp-half.yml
HF_HOME="$TEST_SCRATCH/hf40" expect_exit 2 "layer_range \[0, 20\] is not every layer of .* \(it has 40\)" \
  "$MERGEPIPE" merge slerp-half.yml slerp-half --full-read
echo "gradient-slerp.yml: ok"

# An id that is not in the cache: what to do about it, in one line.
sed 's|BioMistral/BioMistral-7B|BioMistral/BioMistral-7B-DARE|' bio-merge.yml >missing.yml
expect_exit 2 "model 'BioMistral/BioMistral-7B-DARE' is neither a folder of the current directory nor in the Hugging Face cache \($HF_HOME/hub\).*huggingface-cli download BioMistral/BioMistral-7B-DARE" \
  run_np 1 merge missing.yml out-missing --full-read
echo "mergekit examples: ok"
