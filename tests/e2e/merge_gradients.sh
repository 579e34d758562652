#!/usr/bin/env bash
# mergekit's gradients and per-tensor filters (issue 37): parameters that vary by layer and by
# tensor name, checked against an independent numpy reference of mergekit's lookup
# (tests/python/merge_ref.py), the full read equal to a full budget bit for bit, the same bytes
# on 1 and 2 ranks, budgets that honour the varying weights, and a replay of the manifest.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

"$MERGEPIPE" synth --preset tiny --experts 3 --seed 21 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat >/dev/null

# mergekit's examples/ties.yml shape: a density gradient and weights by filter.
cat >ties-grad.yaml <<YAML
models:
  - model: fam/expert00
    parameters:
      density: [1, 0.7, 0.1]
      weight: 1.0
  - model: fam/expert01
    parameters:
      density: 0.5
      weight: [0, 0.3, 0.7, 1]
  - model: fam/expert02
    parameters:
      density: 0.33
      weight:
        - filter: mlp
          value: 0.5
        - value: 0
merge_method: ties
base_model: fam/base
parameters:
  normalize: true
  int8_mask: true
dtype: float32
YAML
# task arithmetic with a filtered lambda and a top-level weight gradient, one model overriding it.
cat >ta-grad.yaml <<YAML
merge_method: task_arithmetic
base_model: fam/base
parameters:
  weight: [0.2, 0.8]
  lambda:
    - filter: self_attn
      value: [1.5, 0.5]
    - filter: embed
      value: 0
    - value: 1
models:
  - model: fam/expert00
  - model: fam/expert01
    parameters: {weight: 0.6}
  - model: fam/expert02
    parameters:
      weight: [{filter: o_proj, value: 2}]
dtype: float32
YAML
# linear without base_model, the reference model's weight graded too.
cat >lin-grad.yaml <<YAML
merge_method: linear
models:
  - model: fam/base
    parameters: {weight: [1, 0]}
  - model: fam/expert00
    parameters: {weight: [0, 1]}
  - model: fam/expert01
    parameters: {weight: 0.25}
dtype: float32
YAML

for cfg in ties-grad ta-grad lin-grad; do
  run_np 2 merge "$cfg.yaml" "$cfg-100" --catalog cat --budget 100% --quiet
  "$PYTHON" "$REF" "$cfg.yaml" "$cfg-100"
  run_np 1 merge "$cfg.yaml" "$cfg-full" --full-read --quiet
  same_model_files "$cfg-100" "$cfg-full"
  run_np 2 merge "$cfg.yaml" "$cfg-full2" --full-read --quiet
  same_model_files "$cfg-full" "$cfg-full2"
  "$MERGEPIPE" replay "$cfg-100/mergepipe.manifest.json" --out "$cfg-replay" --quiet
  same_model_files "$cfg-100" "$cfg-replay"
done

# The varying settings are part of the plan (its JSON and its hash) and of the manifest.
"$MERGEPIPE" plan --config ta-grad.yaml --catalog cat --budget 40% --out ta-plan.json >/dev/null
"$PYTHON" - ta-plan.json ta-grad-100/mergepipe.manifest.json <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
varying = plan["parameters"]["varying"]
assert varying["global"]["weight"] == [0.2, 0.8], varying
assert varying["models"][2]["weight"] == [{"filter": "o_proj", "value": 2.0}], varying
manifest = json.load(open(sys.argv[2]))
assert manifest["parameters"]["varying"] == varying, (manifest["parameters"]["varying"], varying)
PY
sed 's/value: \[1.5, 0.5\]/value: [1.5, 0.6]/' ta-grad.yaml >ta-grad2.yaml
"$MERGEPIPE" plan --config ta-grad2.yaml --catalog cat --budget 40% --out ta-plan2.json >/dev/null
[[ "$(json_get ta-plan.json plan_hash)" != "$(json_get ta-plan2.json plan_hash)" ]] ||
  fail "a different gradient gave the same plan hash"

# A budget follows the varying weights: the embeddings (lambda 0 there) are never read, and
# the bound holds against the full read.
run_np 2 merge ta-grad.yaml ta-30 --catalog cat --budget 30% --log-format json >ta-30.json
"$MERGEPIPE" plan --config ta-grad.yaml --catalog cat --budget 30% --out ta-plan30.json >/dev/null
"$MERGEPIPE" verify ta-30 --against ta-grad-full --json >ta-30-diff.json
"$PYTHON" - ta-30.json ta-30-diff.json ta-plan30.json <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
bound = [e for e in events if e.get("event") == "result"][-1]["error_bound"]
measured = json.load(open(sys.argv[2]))["abs_l2"]
assert measured > 0, "a 30% budget changed nothing: the test proves nothing"
assert measured <= bound * (1 + 1e-6) + 1e-12, (measured, bound)
plan = json.load(open(sys.argv[3]))
embed = [t for t in plan["tensors"] if t["name"] == "model.embed_tokens.weight"][0]
assert embed["nonzero_pairs"] > 0 and embed["admitted_pairs"] == 0, embed
print(f"task arithmetic with gradients at 30%: measured {measured:.4g} <= bound {bound:.4g}")
PY

# A gradient whose values leave (0, 1] for a density, and a normalised sum that is 0 at one
# layer only: usage errors that name the key, or the tensor.
sed 's/density: \[1, 0.7, 0.1\]/density: [1, 0.7, 0]/' ties-grad.yaml >bad-density.yaml
expect_exit 2 "bad-density\.yaml:4: key 'models\[0\]\.parameters\.density': density 0 is outside \(0, 1\]" \
  run_np 1 merge bad-density.yaml bad --catalog cat
cat >zero-sum.yaml <<YAML
merge_method: task_arithmetic
base_model: fam/base
parameters: {normalize: true}
models:
  - model: fam/expert00
    parameters: {weight: [1, -1]}
  - model: fam/expert01
    parameters: {weight: 1}
dtype: float32
YAML
expect_exit 2 "the weights sum to 0.*tensor 'model\.layers\.1\." run_np 1 merge zero-sum.yaml bad \
  --catalog cat
echo "gradients and filters: ok"
