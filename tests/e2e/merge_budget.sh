#!/usr/bin/env bash
# Budget soundness measured from outside the program (page-cache residency after evicting the
# family), agreement of the manifest's counters, and the omitted-update bound against the
# measured deviation of linear and task-arithmetic merges (fp32 output) at 10/25/50%.
source "$(dirname "$0")/common.bash"
: "${PAGE_RESIDENCY:?page residency probe}"

"$MERGEPIPE" synth --preset tiny --experts 6 --seed 9 --out fam >/dev/null
experts=(fam/expert0{0..5})
run_np 2 catalog --base fam/base --experts "${experts[@]}" --out cat --block-bytes 65536 >/dev/null
write_config ta.yaml task_arithmetic fam 6 "lambda: 0.7"

expert_files() { ls fam/expert0*/*.safetensors; }
"$PAGE_RESIDENCY" --evict $(ls fam/*/*.safetensors) >/dev/null
before=$("$PAGE_RESIDENCY" $(expert_files) | awk '{s += $1} END {print s}')
[[ "$before" -eq 0 ]] || echo "note: $before expert bytes stayed cached after eviction"

run_np 2 merge ta.yaml --catalog cat --budget 25% --out m25 --quiet
after=$("$PAGE_RESIDENCY" $(expert_files) | awk '{s += $1} END {print s}')
m=m25/mergepipe.manifest.json
budget=$(json_get $m budget_bytes)
planned=$(json_get $m planned_expert_bytes)
read_expert=$(json_get $m bytes_read.expert)
full=$(json_get $m full_expert_bytes)
pairs=$(json_get $m plan.pairs_admitted)
[[ "$read_expert" -eq "$planned" ]] || fail "manifest: expert bytes read $read_expert != planned $planned"
[[ "$planned" -le "$budget" ]] || fail "planned $planned exceeds the budget $budget"
[[ $((budget * 4)) -le $((full + 3)) ]] || fail "25% budget $budget is not a quarter of $full"
# Headers are read to check the catalog is fresh: allow one 4 KiB page per header page touched
# (header + rounding) and one page of rounding at each end of each admitted block.
headers=$(for f in $(expert_files); do "$PYTHON" -c "import struct,sys; n=struct.unpack('<Q',open(sys.argv[1],'rb').read(8))[0]; print(((8+n)//4096+2)*4096)" "$f"; done | awk '{s += $1} END {print s}')
limit=$((budget + headers + pairs * 2 * 4096))
echo "expert bytes in page cache after the merge: $after (budget $budget, planned $planned, headers $headers, limit $limit)"
[[ "$before" -ne 0 || "$after" -le "$limit" ]] || fail "page cache holds $after expert bytes, more than budget+headers $limit"
[[ "$after" -ge $((planned / 2)) ]] || fail "page cache shows only $after of $planned planned bytes: the probe is not measuring"

# Omitted-update bound: measured ||M - M_A||_2 <= reported bound, fp32 output.
for method in linear task_arithmetic; do
  write_config b-$method.yaml $method fam 6 "" float32
  run_np 2 merge b-$method.yaml --catalog cat --budget 100% --out full-$method --quiet
  for pct in 10 25 50; do
    run_np 2 merge b-$method.yaml --catalog cat --budget $pct% --out b-$method-$pct --quiet
    "$MERGEPIPE" verify b-$method-$pct --against full-$method --json >d.json
    "$PYTHON" - "$method" "$pct" b-$method-$pct/mergepipe.manifest.json d.json <<'PY'
import json, sys
method, pct, manifest, diff = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
bound, measured = manifest["error_bound"], diff["abs_l2"]
# fp32 rounding of the two merges themselves: far below the bound unless the bound is ~0.
slack = 1e-6 * max(1.0, measured)
print(f"{method} {pct}%: measured {measured:.6g} <= bound {bound:.6g}")
assert bound > 0, "a partial budget must omit something"
assert measured <= bound + slack, (measured, bound)
PY
  done
done
echo "budget soundness and bound: ok"
