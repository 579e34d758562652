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
if diff -rq --exclude=mergepipe.manifest.json dare-a dare-c >/dev/null; then fail "another seed gave the same DARE masks"; fi
echo "operators: ok"
