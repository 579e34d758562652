#!/usr/bin/env bash
# `mergepipe plan`: the summary and JSON, budget soundness and monotonicity from outside, the
# max-error mode, rank-count invariance of the plan hash, agreement with `merge`, and errors.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 5 --seed 3 --out fam >/dev/null
experts=(fam/expert0{0..4})
run_np 2 catalog --base fam/base --experts "${experts[@]}" --out cat --block-bytes 4096 >/dev/null
write_config ta.yaml task_arithmetic fam 5 "lambda: 0.7"

"$MERGEPIPE" plan ta.yaml --catalog cat --budget 25% --out p25.json >summary.txt
grep -q "expert weights 0 B" summary.txt || fail "plan read expert weights: $(grep 'bytes read' summary.txt)"
grep -q "least-covered tensors" summary.txt || fail "summary lacks the tensor coverage"
"$PYTHON" - p25.json <<'PY' || fail "p25.json"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ["plan_hash", "budget_bytes", "planned_expert_bytes", "full_expert_bytes", "error_bound",
          "pairs_admitted", "pairs_total", "pairs_zero", "bound_is_guarantee", "deviation_estimate",
          "method", "family_id", "experts", "tensors", "access_mask"]:
    assert k in j, k
assert j["budget_bytes"] == j["full_expert_bytes"] // 4, (j["budget_bytes"], j["full_expert_bytes"])
assert j["planned_expert_bytes"] <= j["budget_bytes"]
assert j["bound_is_guarantee"] is True and j["error_bound"] > 0
assert sum(e["admitted"] for e in j["access_mask"]["experts"]) == j["pairs_admitted"]
assert sum(e["admitted_bytes"] for e in j["experts"]) == j["planned_expert_bytes"]
PY
hash25=$(json_get p25.json plan_hash)
grep -q "$hash25" summary.txt || fail "summary does not show the plan hash"

# The same plan on 1, 2 and 3 ranks (rank 0 plans; the others wait), and via --json.
for np in 1 2 3; do
  run_np $np plan ta.yaml --catalog cat --budget 25% --json >"json-$np.txt"
  [[ $(json_get "json-$np.txt" plan_hash) == "$hash25" ]] || fail "plan hash differs on $np ranks"
done

# Larger budgets never give larger bounds; 100% admits every non-zero pair with bound 0.
prev=""
for b in 0 5% 10% 25% 50% 75% 100%; do
  "$MERGEPIPE" plan ta.yaml --catalog cat --budget "$b" --out "p.json" >/dev/null
  bound=$(json_get p.json error_bound)
  [[ $(json_get p.json planned_expert_bytes) -le $(json_get p.json budget_bytes) ]] || fail "$b: over budget"
  if [[ -n "$prev" ]]; then
    "$PYTHON" -c "import sys; sys.exit(0 if float('$bound') <= float('$prev') else 1)" || fail "$b: bound $bound > $prev"
  fi
  prev=$bound
done
"$PYTHON" - p.json <<'PY' || fail "100% plan"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["error_bound"] == 0.0
assert j["pairs_admitted"] == j["pairs_total"] - j["pairs_zero"]
PY
# More than everything is a mistake, not a larger budget.
expect_exit 2 "budget '200%' is above 100%" "$MERGEPIPE" plan ta.yaml --catalog cat --budget 200%

# --max-error: the bound meets E (E = half the 25% bound; the config sets no budget).
target=$("$PYTHON" -c "print(float('$(json_get p25.json error_bound)') / 2)")
"$MERGEPIPE" plan ta.yaml --catalog cat --max-error "$target" --out pe.json >/dev/null
"$PYTHON" -c "import sys; sys.exit(0 if float('$(json_get pe.json error_bound)') <= $target else 1)" || fail "max-error bound"
[[ $(json_get pe.json planned_expert_bytes) -gt $(json_get p25.json planned_expert_bytes) ]] || fail "max-error read less than 25%"
expect_exit 2 "needs .* of expert reads" "$MERGEPIPE" plan ta.yaml --catalog cat --max-error "$target" --budget 25%

# merge plans exactly as plan does.
run_np 2 merge ta.yaml --catalog cat --budget 25% --out m25 --quiet
[[ $(json_get m25/mergepipe.manifest.json plan_hash) == "$hash25" ]] || fail "merge made a different plan"

# Errors: one line, the right exit code.
expect_exit 2 "budget '12XB': unknown unit" "$MERGEPIPE" plan ta.yaml --catalog cat --budget 12XB
expect_exit 2 "budget '-1GB'" "$MERGEPIPE" plan ta.yaml --catalog cat --budget -1GB
# A model the catalog lacks, and one that is no folder at all (nor a hub id in the cache).
cp -r fam/expert04 fam/expert09
sed 's/expert04/expert09/' ta.yaml >missing.yaml
expect_exit 2 "expert09' is not in the catalog" "$MERGEPIPE" plan missing.yaml --catalog cat
sed 's/expert04/expert10/' ta.yaml >absent.yaml
expect_exit 2 "absent\.yaml:[0-9]+: key 'models\[4\]\.model': model 'fam/expert10' is neither a folder of the current directory nor in the Hugging Face cache" \
  "$MERGEPIPE" plan absent.yaml --catalog cat
write_config ties.yaml ties fam 5
expect_exit 2 "--max-error needs a method whose bound is a guarantee \(linear, task_arithmetic, nearswap\): for ties" "$MERGEPIPE" plan ties.yaml --catalog cat --max-error 1
printf 'merge_method: ties\nbase_model: fam/base\nmodels: [fam/expert00]\nbogus: 1\n' >bogus.yaml
expect_exit 2 "bogus.yaml:4: key 'bogus': unknown key" "$MERGEPIPE" plan bogus.yaml --catalog cat
expect_exit 2 "nothere\.yaml: no such config file" "$MERGEPIPE" plan nothere.yaml --catalog cat
expect_exit 2 "catalog" "$MERGEPIPE" plan ta.yaml
touch -d '2001-01-01' fam/expert02/*.safetensors
expect_exit 3 "stale catalog" run_np 2 plan ta.yaml --catalog cat
echo "plan_cli: ok"
