# Helpers of the hostile-checkpoint tests (sourced by bad_safetensors.sh and bad_folders.sh): a
# tiny synthetic family in fam/, a copy to damage in f/, and `reject`, which runs a 2-rank
# `catalog` build and a 2-rank `merge --full-read` on f/ and expects each to fail with exit 3,
# one error line matching a pattern, and nothing left at its output (no folder, no staging or
# temporary folder). Damage is crafted by tests/python/corrupt_checkpoint.py, one fault at a time.
source "$(dirname "$0")/common.bash"

corrupt() { "$PYTHON" "$TESTS_DIR/python/corrupt_checkpoint.py" "$@" >/dev/null; }

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 3 --out fam >/dev/null
printf 'merge_method: linear\nbase_model: f/base\nmodels: [f/expert00, f/expert01]\n' >c.yaml

# A fresh copy of the family in f/ for the next case.
fresh() {
  rm -rf f outside.safetensors
  cp -r fam f
}

# reject NAME CATALOG_PATTERN [MERGE_PATTERN]: both commands refuse f/ as described above.
reject() {
  local name="$1" catalog_pattern="$2" merge_pattern="${3:-$2}"
  expect_exit 3 "$catalog_pattern" run_np 2 catalog --base f/base --experts f/expert00 f/expert01 \
    --out cat
  expect_one_error
  expect_no_catalog cat
  expect_exit 3 "$merge_pattern" run_np 2 merge c.yaml --full-read --out out
  expect_one_error
  expect_no_output out
  echo "ok: $name"
}

shard=f/expert01/model-00002-of-00004.safetensors
file="f/expert01/model-00002-of-00004\.safetensors: invalid safetensors file"
first="model.layers.0.input_layernorm.weight" # first tensor of $shard by offset
last="model.layers.1.self_attn.v_proj.weight" # last tensor of $shard by offset
