#!/usr/bin/env bash
# ram (mergekit's Reinforced Agent Merging: per entry, the mean of the experts' deltas larger than
# epsilon) through the engine: against an independent numpy reference in fp32 and bf16 on a
# family whose experts overlap only in part; a full budget equal to --full-read; the same bytes on
# 1, 2 and 3 ranks; a smaller budget reads less; the keys that change nothing reported.
source "$(dirname "$0")/common.bash"
REF="$TESTS_DIR/python/merge_ref.py"

# Partial fine-tunes: some tensors moved by one expert only (kept whole), some by several
# (averaged).
"$MERGEPIPE" synth --preset tiny --experts 3 --kinds partial,full,lora --seed 23 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat \
  --block-bytes 16KiB >/dev/null

ram_config() {  # FILE DTYPE [TOP-LEVEL PARAMETERS]
  cat >"$1" <<YAML
merge_method: ram
base_model: fam/base
models: [fam/expert00, fam/expert01, fam/expert02]
${3:+parameters: {$3\}}
dtype: $2
YAML
}
ram_config f32.yaml float32
ram_config bf16.yaml bfloat16
ram_config eps.yaml float32 "epsilon: 0.0005"
for c in f32 bf16 eps; do
  run_np 2 merge "$c.yaml" --catalog cat --budget 100% --out "out-$c" --quiet
  "$PYTHON" "$REF" "$c.yaml" "out-$c"
done
cmp -s out-f32/model.safetensors out-eps/model.safetensors && fail "epsilon changed nothing"
for np in 1 3; do
  run_np "$np" merge f32.yaml --full-read --block-bytes 16KiB --out "full$np" --quiet
  same_model_files out-f32 "full$np"
done
[[ "$(json_get out-eps/mergepipe.manifest.json plan.parameters.options.epsilon)" == 0.0005 ]] ||
  fail "the plan does not record epsilon"

# A budget: reads no more than it, and the entries it reads merge as in the full merge where
# every expert was read.
run_np 2 merge f32.yaml --catalog cat --budget 30% --out out-30 --quiet
read30=$(json_get out-30/mergepipe.manifest.json bytes_read.expert)
budget=$(json_get out-30/mergepipe.manifest.json plan.budget_bytes)
((read30 <= budget)) || fail "the 30% ram merge read $read30 expert bytes (budget $budget)"
[[ "$(json_get out-30/mergepipe.manifest.json plan.bound_is_guarantee)" == False ]] ||
  fail "ram's figure is an estimate (an omitted expert changes the others' divisor)"

# mergekit's keys that ram does not read are said once each.
cat >w.yaml <<YAML
merge_method: ram
base_model: fam/base
models:
  - model: fam/expert00
    parameters: {weight: 0.5, density: 0.3}
  - model: fam/expert01
parameters: {lambda: 2, normalize: true}
YAML
run_np 1 merge w.yaml --catalog cat --out out-w >w.txt 2>w.err
for key in weight density lambda normalize; do
  grep -q "'$key' changes nothing for ram" w.err || { cat w.err >&2; fail "no warning for $key"; }
done
sed 's/merge_method: ram/merge_method: ties/' eps.yaml >ties-eps.yaml
expect_exit 2 "parameter 'epsilon' belongs to ram; ties does not take it" \
  run_np 1 merge ties-eps.yaml --catalog cat --out out-te
echo "ram: ok"
