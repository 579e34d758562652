#!/usr/bin/env bash
# mergepipe inspect on every kind of path: checkpoint folder, .safetensors file, catalog, plan
# JSON and manifest; unknown paths are usage errors.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 3 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml task_arithmetic fam 2
"$MERGEPIPE" plan c.yaml --catalog cat --budget 60% --out plan.json >/dev/null
run_np 2 merge c.yaml --catalog cat --budget 60% --out merged --quiet

"$MERGEPIPE" inspect fam/base >ckpt.txt
grep -q "model.embed_tokens.weight" ckpt.txt || fail "checkpoint listing lacks the embedding"
"$MERGEPIPE" inspect fam/base --json | "$PYTHON" -c "import json,sys; d=json.load(sys.stdin); assert d['kind']=='checkpoint', d['kind']"
shard="$(ls fam/base/*.safetensors | head -1)"
"$MERGEPIPE" inspect "$shard" | grep -q "BF16" || fail "single-file listing lacks dtypes"
"$MERGEPIPE" inspect cat | grep -q "experts: 2" || fail "catalog summary lacks the expert count"
hash="$(json_get plan.json plan_hash)"
"$MERGEPIPE" inspect plan.json | grep -q "$hash" || fail "plan summary lacks the plan hash"
"$MERGEPIPE" inspect merged/mergepipe.manifest.json >man.txt
grep -q "$hash" man.txt || fail "manifest summary lacks the plan hash of the same budget"
grep -q "expert bytes read" man.txt || fail "manifest summary lacks bytes read"
echo '{"hello": 1}' >other.json
expect_exit 2 "not a checkpoint, catalog, plan or manifest" "$MERGEPIPE" inspect other.json
expect_exit 2 "no such file" "$MERGEPIPE" inspect does-not-exist
echo "inspect: ok"
