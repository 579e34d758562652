#!/usr/bin/env bash
# Operator semantics on a tiny synthetic family against an independent numpy reference
# (tests/python/merge_ref.py): linear, task arithmetic and TIES value by value, in fp32 and bf16;
# DARE statistically and by seed determinism.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

"$MERGEPIPE" synth --preset tiny --experts 3 --seed 21 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat >/dev/null

for method in linear task_arithmetic ties; do
  for dtype in float32 bfloat16; do
    write_config "$method-$dtype.yaml" "$method" fam 3 "lambda: 0.9" "$dtype"
    run_np 2 merge "$method-$dtype.yaml" --catalog cat --budget 100% --out "out-$method-$dtype" --quiet
    "$PYTHON" "$REF" "$method-$dtype.yaml" "out-$method-$dtype"
  done
done
# Normalisation off for TIES and on for task arithmetic.
write_config ties-sum.yaml ties fam 3 "normalize: false" float32
run_np 2 merge ties-sum.yaml --catalog cat --out out-ties-sum --quiet
"$PYTHON" "$REF" ties-sum.yaml out-ties-sum
write_config ta-norm.yaml task_arithmetic fam 3 "normalize: true, lambda: 1.5" float32
run_np 1 merge ta-norm.yaml --catalog cat --out out-ta-norm --quiet
"$PYTHON" "$REF" ta-norm.yaml out-ta-norm

# DARE on one full fine-tune expert: kept fraction ~ density, kept values = delta/density.
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 --out cat1 >/dev/null
cat >dare.yaml <<YAML
merge_method: dare_linear
base_model: fam/base
models:
  - model: fam/expert00
    parameters: {weight: 1.0, density: 0.3}
parameters: {lambda: 1.0}
dtype: float32
seed: 3
YAML
run_np 2 merge dare.yaml --catalog cat1 --out dare-a --quiet
"$PYTHON" "$REF" dare.yaml dare-a
run_np 1 merge dare.yaml --catalog cat1 --out dare-b --threads 1 --quiet
same_model_files dare-a dare-b
run_np 1 merge dare.yaml --catalog cat1 --out dare-c --seed 4 --quiet
if diff -rq --exclude=mergepipe.manifest.json --exclude=README.md --exclude=mergekit_config.yml dare-a dare-c >/dev/null; then fail "another seed gave the same DARE masks"; fi
echo "operators: ok"

# DARE without rescale (mergekit's `rescale: false`): kept values are the deltas as they are.
sed 's/parameters: {lambda: 1.0}/parameters: {lambda: 1.0, rescale: false}/' dare.yaml >dare-plain.yaml
run_np 2 merge dare-plain.yaml --catalog cat1 --out dare-plain --quiet
"$PYTHON" "$REF" dare-plain.yaml dare-plain
same_mask() { # the same seed keeps the same entries with and without rescale
  "$PYTHON" - "$@" <<'PY'
import sys
sys.path.insert(0, sys.argv[4])
from merge_ref import read_folder
import numpy as np
base, a, b = (read_folder(p) for p in sys.argv[1:4])
for name, (t0, _) in base.items():
    ka = a[name][0].astype(np.float32) != t0
    kb = b[name][0].astype(np.float32) != t0
    assert (ka == kb).all(), name
PY
}
same_mask fam/base dare-a dare-plain "$TESTS_DIR/python"

# nearswap (one model into the base): an independent reference, the full read equal to a full
# budget bit for bit, and the same bytes on 1, 2 and 3 ranks.
cat >nearswap.yaml <<YAML
merge_method: nearswap
base_model: fam/base
models:
  - model: fam/expert00
parameters: {t: 0.002}
dtype: float32
YAML
run_np 2 merge nearswap.yaml --catalog cat1 --budget 100% --out ns-2 --quiet
"$PYTHON" "$REF" nearswap.yaml ns-2
run_np 1 merge nearswap.yaml --full-read --out ns-full --quiet
same_model_files ns-2 ns-full
run_np 3 merge nearswap.yaml --catalog cat1 --budget 100% --out ns-3 --quiet
same_model_files ns-2 ns-3
# Budgeted: a guaranteed bound, never below the measured deviation from the full read.
run_np 2 merge nearswap.yaml --catalog cat1 --budget 30% --out ns-30 --log-format json >ns-30.json
"$MERGEPIPE" verify ns-30 --against ns-full --json >ns-30-diff.json
"$PYTHON" - ns-30.json ns-30-diff.json <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
bound = [e for e in events if e.get("event") == "result"][-1]["error_bound"]
measured = json.load(open(sys.argv[2]))["abs_l2"]
assert measured > 0, "a 30% budget changed nothing: the test proves nothing"
assert measured <= bound * (1 + 1e-6) + 1e-12, (measured, bound)
print(f"nearswap at 30%: measured {measured:.4g} <= bound {bound:.4g}")
PY
# t is nearswap's, and nearswap takes exactly one model.
sed '/parameters: {t/d' nearswap.yaml >ns-no-t.yaml
expect_exit 2 "ns-no-t\.yaml: config: nearswap needs parameter 't'" run_np 1 merge ns-no-t.yaml \
  --catalog cat1 --out ns-bad
sed 's/merge_method: nearswap/merge_method: ties/' nearswap.yaml >ns-ties.yaml
expect_exit 2 "config: parameter 't' belongs to nearswap and slerp; ties does not take it" run_np 1 merge \
  ns-ties.yaml --catalog cat1 --out ns-bad
{ sed '/^parameters/,$d' nearswap.yaml; echo "  - model: fam/expert01"; echo "parameters: {t: 0.002}"; } >ns-two.yaml
expect_exit 2 "config: nearswap merges one model into the base, but 'models' lists 2" run_np 1 merge \
  ns-two.yaml --catalog cat --out ns-bad
echo "nearswap, dare without rescale: ok"

# linear without base_model (mergekit's examples/linear.yml form): the first model is the
# reference the others are budgeted against; the result is the plain weighted average. And the
# base listed among the models of a linear config is averaged with its weight.
cat >avg.yaml <<YAML
models:
  - model: fam/base
    parameters:
      weight: 1.0
  - model: fam/expert00
    parameters:
      weight: 0.3
  - model: fam/expert01
    parameters:
      weight: 0.5
merge_method: linear
dtype: float32
YAML
run_np 2 merge avg.yaml avg-100 --catalog cat --budget 100% >avg.txt
grep -q "reference model .*fam/base (the config has no base_model" avg.txt || fail "no reference line: $(cat avg.txt)"
"$PYTHON" "$REF" avg.yaml avg-100
run_np 1 merge avg.yaml avg-full --full-read --quiet
same_model_files avg-100 avg-full
[[ "$(json_get avg-100/mergepipe.manifest.json parameters.base_is_reference)" == True ]] ||
  fail "the manifest does not say the base is the reference"
"$MERGEPIPE" replay avg-100/mergepipe.manifest.json --out avg-replay --quiet
same_model_files avg-100 avg-replay
{ echo "base_model: fam/base"; cat avg.yaml; } >avg-base.yaml
run_np 2 merge avg-base.yaml avg-base --catalog cat --budget 100% --quiet
same_model_files avg-100 avg-base
# The same with a catalog of another base: the message says which base to catalog.
sed '0,/fam\/base/s//fam\/expert02/' avg.yaml >avg-other.yaml
expect_exit 3 "the config has no base_model, so its first model '.*/fam/expert02' is the reference .*build the catalog with --base .*/fam/expert02" \
  run_np 1 merge avg-other.yaml avg-bad --catalog cat
# ties with the base among its models: mergekit takes nothing from it; so does this.
write_config ties-b.yaml ties fam 2 "" float32
"$PYTHON" - ties-b.yaml <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c["models"].append({"model": "fam/base", "parameters": {"weight": 3.0, "density": 0.5}})
yaml.safe_dump(c, open(sys.argv[1].replace(".yaml", "-with-base.yaml"), "w"))
PY
run_np 2 merge ties-b.yaml tb --catalog cat --quiet
run_np 2 merge ties-b-with-base.yaml tbb --catalog cat --quiet
same_model_files tb tbb
echo "linear without a base, the base among the models: ok"
