#!/usr/bin/env bash
# Bad merge configs and options (docs/reliability.md, "Bad configs and options"): each exits 2
# with one line naming the config file (with line and key where there is one), and no output or
# staging folder appears. A few cases run on 2 ranks, where only rank 0 reads the config. An
# existing output folder is refused and left exactly as it was.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 7 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
head='merge_method: linear\nbase_model: fam/base\n'

# refused NP PATTERN YAML [merge options...]: the config YAML (printf format) is refused.
refused() {
  local np="$1" pattern="$2" yaml="$3"
  shift 3
  printf "$yaml" >bad.yaml
  if ((np == 1)); then
    expect_exit 2 "$pattern" "$MERGEPIPE" merge bad.yaml --catalog cat --out out "$@"
  else
    expect_exit 2 "$pattern" run_np "$np" merge bad.yaml --catalog cat --out out "$@"
  fi
  expect_one_error
  expect_no_output out
}

refused 2 "bad\.yaml:[0-9]+: not valid YAML: end of sequence flow not found" "${head}models: [fam/expert00\n"
refused 1 "bad\.yaml:2: not valid YAML: illegal map value" "merge_method: linear\n  base_model: x\n"
refused 1 "bad\.yaml: expected a mapping with merge_method, base_model and models" "[1, 2]\n"
refused 1 "bad\.yaml: expected a mapping" ""
expect_exit 2 "missing\.yaml: no such config file" "$MERGEPIPE" merge missing.yaml --catalog cat --out out
expect_one_error
expect_no_output out
echo "ok: bad YAML"

refused 2 "bad\.yaml:4: key 'bogus_key': unknown key \(expected one of: base_model, budget, chat_template, dtype, merge_method, models, modules, out_dtype, parameters, seed, slices, tokenizer, tokenizer_source\)" \
  "${head}models: [fam/expert00]\nbogus_key: 1\n"
refused 1 "bad\.yaml:4: key 'models\[0\]\.parameters\.densty': unknown key \(expected one of: density, gamma, weight\)" \
  "${head}models:\n  - {model: fam/expert00, parameters: {weight: 1, densty: 0.5}}\n"
refused 1 "bad\.yaml:4: key 'parameters\.alpha': unknown key" "${head}models: [fam/expert00]\nparameters: {alpha: 1}\n"
refused 1 "bad\.yaml:4: key 'models\[0\]\.mdoel': unknown key" "${head}models:\n  - {mdoel: fam/expert00}\n"
refused 1 "bad\.yaml:4: key 'merge_method': given twice" "${head}models: [fam/expert00]\nmerge_method: ties\n"
refused 1 "bad\.yaml:1: key 'merge_method': unsupported method 'sce'" \
  "merge_method: sce\nbase_model: fam/base\nmodels: [fam/expert00]\n"
refused 1 "bad\.yaml:.*key 'base_model': missing \(ties merges deltas against a base; only linear, karcher, multislerp and nuslerp take none\)" "merge_method: ties\nmodels: [fam/expert00]\n"
refused 1 "bad\.yaml: config: a linear merge without base_model needs two models or more" "merge_method: linear\nmodels: [fam/expert00]\n"
refused 1 "bad\.yaml: config: 'models' lists no expert to merge" "${head}models: []\n"
refused 1 "bad\.yaml:4: key 'dtype': unsupported dtype 'int8'" "${head}models: [fam/expert00]\ndtype: int8\n"
refused 1 "bad\.yaml:4: key 'seed': expected a non-negative integer, got '-1'" "${head}models: [fam/expert00]\nseed: -1\n"
echo "ok: unknown and missing keys, bad values"

w='models:\n  - {model: fam/expert00, parameters: {weight: %s}}\n  - {model: fam/expert01, parameters: {weight: %s}}\n'
refused 2 "bad\.yaml:4: key 'models\[0\]\.parameters\.weight': '\.inf' is not a finite number" "${head}$(printf "$w" .inf 1)"
refused 1 "bad\.yaml:5: key 'models\[1\]\.parameters\.weight': '1e999' is not a finite number" "${head}$(printf "$w" 1 1e999)"
refused 1 "bad\.yaml:4: key 'models\[0\]\.parameters\.weight': expected a number, got 'heavy'" "${head}$(printf "$w" heavy 1)"
refused 1 "bad\.yaml: config: model '.*/fam/expert00': weight 1e\+300 is beyond fp32 range without 'normalize: true'" \
  "${head}parameters: {normalize: false}\n$(printf "$w" 1e300 1)"
refused 1 "bad\.yaml: config: the weights are too large: their sum overflows" \
  "merge_method: task_arithmetic\nbase_model: fam/base\nparameters: {lambda: 1e-300}\n$(printf "$w" 1e308 1e308)"
# normalize is invariant to the weights' scale: weights of 1e-50 or 1e308 (whose fp32 values
# underflow or overflow) merge exactly as weights of 1 do.
for scale in 1 1e-50 1e308; do
  printf "${head}$(printf "$w" "$scale" "$scale")" >"scale.yaml"
  "$MERGEPIPE" merge scale.yaml --catalog cat --budget 60% --out "scaled-$scale" --quiet ||
    fail "weights of $scale with normalize: exit $?"
done
for scale in 1e-50 1e308; do
  "$MERGEPIPE" verify "scaled-$scale" --against scaled-1 --max-rel-l2 0 >/dev/null ||
    fail "weights of $scale merged other values than weights of 1"
  cmp -s "scaled-$scale/model.safetensors" scaled-1/model.safetensors ||
    fail "weights of $scale: other bytes than weights of 1"
done
refused 1 "bad\.yaml: config: the weights sum to 0, so 'normalize: true' cannot divide by them" "${head}$(printf "$w" 1 -1)"
refused 1 "bad\.yaml:4: key 'parameters\.lambda': '\.nan' is not a finite number" "${head}models: [fam/expert00]\nparameters: {lambda: .nan}\n"
d='merge_method: ties\nbase_model: fam/base\nmodels:\n  - {model: fam/expert00, parameters: {density: %s}}\n'
refused 2 "bad\.yaml:4: key 'models\[0\]\.parameters\.density': density 0 is outside \(0, 1\]" "$(printf "$d" 0)"
refused 1 "bad\.yaml:4: key 'models\[0\]\.parameters\.density': density 1\.5 is outside \(0, 1\]" "$(printf "$d" 1.5)"
refused 1 "bad\.yaml:4: key 'models\[0\]\.parameters\.density': density -0\.1 is outside \(0, 1\]" "$(printf "$d" -0.1)"
refused 1 "bad\.yaml:4: key 'parameters\.density': density 2 is outside \(0, 1\]" \
  "merge_method: ties\nbase_model: fam/base\nmodels: [fam/expert00]\nparameters: {density: 2}\n"
echo "ok: weights and densities out of range"

refused 2 "bad\.yaml:4: key 'budget': budget '12XB': unknown unit 'XB'" "${head}models: [fam/expert00]\nbudget: 12XB\n"
refused 1 "bad\.yaml:4: key 'budget': budget '-5%': a budget cannot be negative" "${head}models: [fam/expert00]\nbudget: -5%%\n"
refused 1 "bad\.yaml:4: key 'budget': budget 'nan': not a finite number" "${head}models: [fam/expert00]\nbudget: nan\n"
good="${head}models: [fam/expert00]\n"
refused 2 "budget 'lots': no number" "$good" --budget lots
refused 1 "budget '1e3': unknown unit 'e3'" "$good" --budget 1e3
refused 1 "budget '99999999999999999999999999999GiB': too many digits" "$good" --budget 99999999999999999999999999999GiB
refused 1 "budget '20000000000000000000TiB': too large" "$good" --budget 20000000000000000000TiB
refused 1 "--max-shard-size '10%' must be a size, not a percentage" "$good" --max-shard-size 10%
echo "ok: unparsable budgets"

# An existing output folder is refused and left exactly as it was (no staging folder appears).
printf "$good" >good.yaml
run_np 2 merge good.yaml --catalog cat --out done --quiet || fail "a good merge failed"
(cd done && find . -type f -exec md5sum {} + | sort) >before.txt
expect_exit 2 "done: output folder already exists \(pass --force to replace it\)" \
  run_np 2 merge good.yaml --catalog cat --out done
expect_one_error
(cd done && find . -type f -exec md5sum {} + | sort) >after.txt
cmp -s before.txt after.txt || fail "the existing output folder was modified"
[[ ! -e .done.mergepipe-staging ]] || fail "a refused merge left a staging folder"
expect_exit 2 "already exists" "$MERGEPIPE" merge good.yaml --catalog cat --out done/
echo "ok: output target exists"
echo "bad configs: ok"

# A key that changes nothing for the method is said once, as a warning, and the merge runs.
printf "${head}models:\n  - {model: fam/expert00, parameters: {weight: 1, density: 0.5}}\nparameters: {lambda: 0.5, int8_mask: true}\n" >noop.yaml
"$MERGEPIPE" merge noop.yaml --catalog cat --out noop 2>noop.txt >/dev/null || fail "noop.yaml: $(cat noop.txt)"
for key in lambda density int8_mask; do
  [[ $(grep -c "warning: noop.yaml: '$key' changes nothing for linear" noop.txt) -eq 1 ]] ||
    fail "no single warning for $key: $(cat noop.txt)"
done
"$MERGEPIPE" plan noop.yaml --catalog cat 2>noop-plan.txt >/dev/null
grep -q "warning: noop.yaml: 'lambda' changes nothing for linear (a weighted average has no scale)" noop-plan.txt ||
  fail "plan does not warn: $(cat noop-plan.txt)"
echo "ok: keys that change nothing"
