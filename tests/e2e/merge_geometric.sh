#!/usr/bin/env bash
# model_stock, karcher, multislerp and nuslerp (mergekit's methods whose coefficients come from each
# tensor's norms and angles) through the streaming executor: against an independent numpy
# reference, with and without base_model; the same bytes on 1, 2 and 3 ranks and after a replay;
# a budget refused with the reason; mergekit's rules on the models and parameters.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

"$MERGEPIPE" synth --preset tiny --experts 3 --seed 5 --out fam >/dev/null

cat >stock.yaml <<YAML
merge_method: model_stock
base_model: fam/base
models:
  - model: fam/base
  - model: fam/expert00
  - model: fam/expert01
  - model: fam/expert02
dtype: float32
YAML
# karcher without base_model: every model is a point of the mean, the first one included.
cat >karcher.yaml <<YAML
merge_method: karcher
models:
  - model: fam/expert00
  - model: fam/expert01
  - model: fam/base
parameters:
  max_iter: 20
  tol: 1.0e-7
dtype: float32
YAML
cat >mslerp.yaml <<YAML
merge_method: multislerp
base_model: fam/base
models:
  - model: fam/expert00
    parameters: {weight: 0.5}
  - model: fam/expert01
    parameters: {weight: 0.3}
  - model: fam/expert02
    parameters: {weight: 0.2}
dtype: float32
YAML
grep -v '^base_model' mslerp.yaml >mslerp-models.yaml
# nuslerp of two experts' deltas (with base_model), and of two models (without).
cat >nuslerp.yaml <<YAML
merge_method: nuslerp
base_model: fam/base
models:
  - model: fam/expert00
    parameters: {weight: 0.6}
  - model: fam/expert01
    parameters: {weight: 0.4}
dtype: float32
YAML
sed -e '/^base_model/d' -e 's|fam/expert00|fam/base|' nuslerp.yaml >nuslerp-models.yaml

for c in stock karcher mslerp mslerp-models nuslerp nuslerp-models; do
  run_np 2 merge $c.yaml --out $c-2 --quiet
  "$PYTHON" "$REF" $c.yaml $c-2
  run_np 1 merge $c.yaml --out $c-1 --quiet
  same_model_files $c-2 $c-1
  run_np 3 merge $c.yaml --out $c-3 --quiet --threads 2
  same_model_files $c-2 $c-3
done
# The output moves every tensor some expert changed, and each method differs from the others.
"$PYTHON" - fam/base stock-2 karcher-2 mslerp-2 "$TESTS_DIR/python" <<'PY'
import sys
sys.path.insert(0, sys.argv[5])
from merge_ref import read_folder
base, *outs = (read_folder(p) for p in sys.argv[1:5])
for out in outs:
    assert sum(1 for n in base if (out[n][0] != base[n][0]).any()) > 0
names = [n for n in base if (outs[0][n][0] != base[n][0]).any()]
assert any((outs[0][n][0] != outs[2][n][0]).any() for n in names)
print(f"geometric methods: {len(names)} tensors moved")
PY

# The plan records each tensor's linear form (base scale, one alpha per expert); a replay
# reproduces the bytes from it.
"$PYTHON" - stock-2/mergepipe.manifest.json <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]
forms = [t["linear_form"] for t in plan["tensors"]]
assert all(len(f) == 4 and f[0] == 1.0 and f[1] == f[2] == f[3] for f in forms), forms[:3]
print(f"model_stock: t/N between {min(f[1] for f in forms):.3f} and {max(f[1] for f in forms):.3f}")
PY
for c in stock karcher mslerp-models nuslerp; do
  "$MERGEPIPE" replay $c-2/mergepipe.manifest.json --out $c-replay --quiet
  same_model_files $c-2 $c-replay
done
json_get karcher-2/mergepipe.manifest.json plan.parameters.options.max_iter | grep -qx '20.0' ||
  fail "the plan does not record karcher's max_iter"

# bf16, the format the models come in.
sed 's/float32/bfloat16/' stock.yaml >stock-bf16.yaml
run_np 2 merge stock-bf16.yaml --out stock-bf16 --quiet
"$PYTHON" "$REF" stock-bf16.yaml stock-bf16

# A budget needs statistics the catalog does not hold: refused, saying why.
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat >/dev/null
expect_exit 2 "stock\.yaml: --catalog: model_stock's coefficients depend on the angles between the experts' deltas.*runs as a full read" \
  run_np 1 merge stock.yaml --catalog cat --budget 50% --out bad
expect_exit 2 "karcher's coefficients depend on the norms and angles of all the models.*--full-read" \
  "$MERGEPIPE" plan --config karcher.yaml --catalog cat --budget 50%
# mergekit's rules.
{ sed '/expert01/,$d' stock.yaml; echo "dtype: float32"; } >stock-one.yaml
expect_exit 2 "model_stock needs the base and two models or more.*lists 1 besides the base" \
  run_np 1 merge stock-one.yaml --out bad
{ cat stock.yaml; echo "parameters: {filter_wise: true}"; } >stock-filter.yaml
expect_exit 2 "model_stock's filter_wise .* is not supported yet" run_np 1 merge stock-filter.yaml --out bad
{ cat stock.yaml; echo "parameters: {eps: 0.001}"; } >stock-eps.yaml
expect_exit 2 "parameter 'eps' belongs to multislerp; model_stock does not take it" \
  run_np 1 merge stock-eps.yaml --out bad
{ cat nuslerp.yaml; echo "parameters: {nuslerp_flatten: false}"; } >nuslerp-rows.yaml
expect_exit 2 "nuslerp_flatten: false .* is not supported yet" run_np 1 merge nuslerp-rows.yaml --out bad
sed '/weight: 0.4/a\  - model: fam/expert02' nuslerp.yaml >nuslerp-three.yaml
expect_exit 2 "nuslerp interpolates between two models .*lists 3 besides the base" \
  run_np 1 merge nuslerp-three.yaml --out bad
sed 's/max_iter: 20/max_iter: 2.5/' karcher.yaml >karcher-iter.yaml
expect_exit 2 "parameter 'max_iter' must be a whole number >= 0" run_np 1 merge karcher-iter.yaml --out bad
grep -v '^base_model' stock.yaml >stock-no-base.yaml
expect_exit 2 "'base_model': missing \(model_stock merges deltas against a base" \
  run_np 1 merge stock-no-base.yaml --out bad
# Keys that change nothing are reported, as mergekit would silently ignore them.
{ sed '/^parameters/,$d' karcher.yaml; echo "parameters: {weight: 0.7, density: 0.5}"; } >karcher-weight.yaml
run_np 1 merge karcher-weight.yaml --out karcher-w >/dev/null 2>warnings.txt
grep -q "'weight' changes nothing for karcher (karcher weighs every model equally)" warnings.txt ||
  fail "no warning for karcher's weight: $(cat warnings.txt)"
echo "geometric methods: ok"
