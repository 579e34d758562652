#!/usr/bin/env bash
# slerp (mergekit's spherical interpolation of the base and one other model, per tensor) through
# the streaming executor: against an independent numpy reference, with t as a number and as
# mergekit's filtered gradients; the same bytes on 1, 2 and 3 ranks and after a replay; a budget
# refused with the reason.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 5 --out fam >/dev/null
# A fine-tune is so close to its base (cos > 0.9995) that slerp takes mergekit's lerp branch on
# nearly every tensor; an unrelated model of the same shapes (another seed's base) takes the
# spherical branch on most.
"$MERGEPIPE" synth --preset tiny --experts 0 --seed 6 --out far >/dev/null

# The base listed among the models, as mergekit's slerp configs do.
cat >slerp.yaml <<YAML
merge_method: slerp
base_model: fam/base
models:
  - model: fam/base
  - model: fam/expert00
parameters:
  t: 0.35
dtype: float32
YAML
run_np 2 merge slerp.yaml --full-read --out s-2 --quiet
"$PYTHON" "$REF" slerp.yaml s-2
run_np 1 merge slerp.yaml --full-read --out s-1 --quiet
same_model_files s-2 s-1
run_np 3 merge slerp.yaml --full-read --out s-3 --quiet --threads 2
same_model_files s-2 s-3
# The output is not the base and not the other model, and moves every changed tensor.
"$PYTHON" - fam/base fam/expert00 s-2 "$TESTS_DIR/python" <<'PY'
import sys
sys.path.insert(0, sys.argv[4])
from merge_ref import read_folder
import numpy as np
base, other, out = (read_folder(p) for p in sys.argv[1:4])
moved = 0
for name, (t0, _) in base.items():
    t1, got = other[name][0], out[name][0].astype(np.float32)
    if (t1 != t0).any():
        assert (got != t0).any() and (got != t1).any(), name
        moved += 1
assert moved > 0
print(f"slerp moved {moved} tensors between the models")
PY

# The spherical branch: the reference, rank counts, and the plan's per-tensor coefficients
# (base scale s0 + s1, then s1), from which a replay reproduces the bytes.
sed 's|model: fam/expert00|model: far/base|' slerp.yaml >slerp-far.yaml
run_np 2 merge slerp-far.yaml --full-read --out f-2 --quiet
"$PYTHON" "$REF" slerp-far.yaml f-2
run_np 3 merge slerp-far.yaml --full-read --out f-3 --quiet
same_model_files f-2 f-3
"$PYTHON" - f-2/mergepipe.manifest.json <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]
forms = [t["linear_form"] for t in plan["tensors"]]
assert all(len(f) == 2 for f in forms), forms[:3]
spherical = sum(1 for f in forms if abs(f[0] - 1.0) > 1e-3)
assert spherical > len(forms) // 2, f"only {spherical} of {len(forms)} tensors took the spherical branch"
print(f"slerp: {spherical} of {len(forms)} tensors spherical")
PY
"$MERGEPIPE" replay f-2/mergepipe.manifest.json --out f-replay --quiet
same_model_files f-2 f-replay

# t as mergekit's filtered gradients (its README's slerp example), in bf16.
cat >slerp-grad.yaml <<YAML
merge_method: slerp
base_model: fam/base
models:
  - model: fam/expert00
parameters:
  t:
    - filter: self_attn
      value: [0, 0.5, 0.3, 0.7, 1]
    - filter: mlp
      value: [1, 0.5, 0.7, 0.3, 0]
    - value: 0.5
dtype: bfloat16
YAML
run_np 2 merge slerp-grad.yaml --full-read --out sg-2 --quiet
"$PYTHON" "$REF" slerp-grad.yaml sg-2

# A budget needs statistics the catalog does not hold: refused, saying what to run.
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 --out cat >/dev/null
expect_exit 2 "slerp\.yaml: --catalog: slerp's coefficients depend on both models' norms.*runs as a full read" \
  run_np 1 merge slerp.yaml --catalog cat --budget 50% --out s-bad
expect_exit 2 "slerp's coefficients depend on both models' norms.*--full-read" \
  "$MERGEPIPE" plan --config slerp.yaml --catalog cat --budget 50%
# Without a flag it runs as the full read it is (as mergekit-yaml CONFIG OUT would).
run_np 2 merge slerp.yaml s-plain --quiet
same_model_files s-2 s-plain
# mergekit's rules: one other model, and t.
{ sed '/^parameters/,$d' slerp.yaml; echo "  - model: fam/expert01"; echo "parameters: {t: 0.5}"; } >slerp-three.yaml
expect_exit 2 "slerp interpolates between the base and one other model, but 'models' lists 2" \
  run_np 1 merge slerp-three.yaml --full-read --out s-bad
sed '/^parameters/,$d' slerp.yaml >slerp-no-t.yaml
expect_exit 2 "slerp needs parameter 't'" run_np 1 merge slerp-no-t.yaml --full-read --out s-bad
echo "slerp: ok"
