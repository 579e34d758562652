#!/usr/bin/env bash
# breadcrumbs and breadcrumbs_ties (mergekit's magnitude-outlier trim: the largest gamma share of
# each tensor's |Δ| dropped, the next `density` share kept) through the engine: against an
# independent numpy reference in fp32 and bf16, with gradients; budgeted (the band from the
# catalog's sketches) at 100% equal to --full-read (the band from the data); the same bytes on 1,
# 2 and 3 ranks; a smaller budget reads less and stays close; mergekit's rules on the parameters.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

"$MERGEPIPE" synth --preset tiny --experts 3 --seed 17 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat \
  --block-bytes 16KiB >/dev/null

# crumbs_config FILE METHOD DTYPE [TOP-LEVEL PARAMETERS]: three experts with their own densities
# and gammas (the third takes the top level's gamma, or mergekit's default 0.01).
crumbs_config() {
  cat >"$1" <<YAML
merge_method: $2
base_model: fam/base
models:
  - model: fam/expert00
    parameters: {weight: 1.0, density: 0.6, gamma: 0.05}
  - model: fam/expert01
    parameters: {weight: 0.7, density: 0.4, gamma: 0.2}
  - model: fam/expert02
    parameters: {weight: 0.4, density: 0.8}
${4:+parameters: {$4\}}
dtype: $3
YAML
}

for method in breadcrumbs breadcrumbs_ties; do
  for dtype in float32 bfloat16; do
    crumbs_config "$method-$dtype.yaml" "$method" "$dtype" "lambda: 0.9"
    run_np 2 merge "$method-$dtype.yaml" --catalog cat --budget 100% --out "out-$method-$dtype" --quiet
    "$PYTHON" "$REF" "$method-$dtype.yaml" "out-$method-$dtype"
  done
  # The full read decides the same bands from the data it reads: the same bytes, on any ranks.
  for np in 1 3; do
    run_np "$np" merge "$method-float32.yaml" --full-read --block-bytes 16KiB --out "full$np-$method" --quiet
    same_model_files "out-$method-float32" "full$np-$method"
  done
  run_np 1 merge "$method-float32.yaml" --catalog cat --budget 100% --out "one-$method" --quiet
  same_model_files "out-$method-float32" "one-$method"
  # The plan records each expert's gamma and both thresholds of every tensor.
  "$PYTHON" - "out-$method-float32/mergepipe.manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
experts = m["plan"]["experts"]
assert [e["gamma"] for e in experts] == [0.05, 0.2, 0.01], [e.get("gamma") for e in experts]
for e in experts:
    lower, upper = e["thresholds"], e["upper_thresholds"]
    assert len(lower) == len(upper) > 0
    assert any(u != 0 for u in upper), "no tensor has an upper cut"
    for lo, up in zip(lower, upper):
        assert up == 0 or up == "inf" or (lo != "inf" and float(lo) < float(up)), (lo, up)
assert [x["gamma"] for x in m["parameters"]["models"]] == [0.05, 0.2, 0.01]
PY
done

# normalize (mergekit's default is false for both) and gamma as a gradient over the layers.
crumbs_config norm.yaml breadcrumbs float32 "normalize: true, gamma: [0.0, 0.1]"
run_np 2 merge norm.yaml --catalog cat --out out-norm --quiet
"$PYTHON" "$REF" norm.yaml out-norm
crumbs_config tnorm.yaml breadcrumbs_ties float32 "normalize: true, gamma: [0.02, 0.3]"
run_np 2 merge tnorm.yaml --full-read --out out-tnorm --quiet
"$PYTHON" "$REF" tnorm.yaml out-tnorm

# A smaller budget reads less and leaves out only the pairs the planner ranks lowest.
run_np 2 merge breadcrumbs-float32.yaml --catalog cat --budget 30% --out out-30 >b30.txt
read30=$(json_get out-30/mergepipe.manifest.json bytes_read.expert)
read100=$(json_get out-breadcrumbs-float32/mergepipe.manifest.json bytes_read.expert)
budget=$(json_get out-30/mergepipe.manifest.json plan.budget_bytes)
((read30 <= budget && read30 < read100)) ||
  fail "the 30% breadcrumbs merge read $read30 expert bytes (budget $budget, full $read100)"
"$PYTHON" - fam/base out-breadcrumbs-float32 out-30 "$TESTS_DIR/python" <<'PY'
import sys
sys.path.insert(0, sys.argv[4])
from merge_ref import read_folder
import numpy as np
base, full, part = (read_folder(p) for p in sys.argv[1:4])
num = den = 0.0
for name, (t0, _) in base.items():
    f, p = full[name][0].astype(np.float64), part[name][0].astype(np.float64)
    num += float(np.sum((p - f) ** 2))
    den += float(np.sum((f - t0) ** 2))
dev = (num / den) ** 0.5
print(f"breadcrumbs at 30%: deviation {dev:.3f} of the full merge's update")
assert 0 < dev < 0.9, dev
PY

# mergekit's parameters: rescale false is its default, true is not built; gamma outside [0, 1]
# and on another method are refused.
crumbs_config plain.yaml breadcrumbs float32
crumbs_config resc.yaml breadcrumbs float32 "rescale: false"
run_np 1 merge plain.yaml --catalog cat --out out-plain --quiet
run_np 1 merge resc.yaml --catalog cat --out out-resc --quiet
same_model_files out-plain out-resc
crumbs_config resc-on.yaml breadcrumbs float32 "rescale: true"
expect_exit 2 "rescales its trimmed deltas in mergekit; that is not built yet" \
  run_np 1 merge resc-on.yaml --catalog cat --out out-resc-on
crumbs_config big.yaml breadcrumbs float32 "gamma: 1.5"
expect_exit 2 "gamma 1.5 is outside \\[0, 1\\]" run_np 1 merge big.yaml --catalog cat --out out-big
sed 's/merge_method: breadcrumbs/merge_method: ties/' norm.yaml >ties-gamma.yaml
expect_exit 2 "'gamma' belongs to breadcrumbs and breadcrumbs_ties; ties does not take it" \
  run_np 1 merge ties-gamma.yaml --catalog cat --out out-tg
echo "breadcrumbs: ok"
