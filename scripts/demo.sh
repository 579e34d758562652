#!/usr/bin/env bash
# The main job end to end on an embedded default: installs what it needs, builds, generates a
# small synthetic Qwen3-shaped family (base + 8 experts of mixed kinds), catalogs it on 2 MPI
# ranks, runs a TIES merge under a 25% expert-read budget on 2 ranks, runs the naive full-read
# merge for comparison, and prints bytes read, wall time, the bound and the measured deviation.
# Environment: MERGEPIPE_DEMO_DIR (default ./demo-out), DEMO_BUDGET (default 25%).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
scripts/setup-deps.sh
scripts/build.sh release >/dev/null
MP="$PWD/build/bin/mergepipe"
DIR="${MERGEPIPE_DEMO_DIR:-$PWD/demo-out}"
BUDGET="${DEMO_BUDGET:-25%}"
K=8
rm -rf "$DIR"
mkdir -p "$DIR"
cd "$DIR"

echo "== 1. synthetic family: qwen3-0.6b names, 4 layers, hidden 256, $K experts"
"$MP" synth --preset qwen3-0.6b --layers 4 --hidden 256 --experts $K --seed 1 --out family
experts=(family/expert*)

echo "== 2. catalog (2 ranks)"
mpirun -np 2 "$MP" catalog --base family/base --experts "${experts[@]}" --out family.catalog

{
  echo "merge_method: ties"
  echo "base_model: family/base"
  echo "models:"
  for e in "${experts[@]}"; do echo "  - {model: $e, parameters: {weight: 1.0, density: 0.5}}"; done
  echo "parameters: {normalize: true, lambda: 1.0}"
  echo "dtype: bfloat16"
  echo "seed: 0"
} >merge.yaml

echo "== 3. plan at $BUDGET (no expert weights read)"
"$MP" plan merge.yaml --catalog family.catalog --budget "$BUDGET" --out plan.json | head -12

echo "== 4. budgeted merge, 2 ranks"
mpirun -np 2 "$MP" merge merge.yaml --catalog family.catalog --budget "$BUDGET" --out merged --threads 1

echo "== 5. naive full-read merge, 2 ranks"
mpirun -np 2 "$MP" merge merge.yaml --full-read --out merged-full --threads 1

echo "== 6. deviation of the budgeted merge from the full read"
"$MP" verify merged --against merged-full --json >deviation.json
"$MP" verify merged >/dev/null

python3 - <<'PY'
import json
m = json.load(open("merged/mergepipe.manifest.json"))
f = json.load(open("merged-full/mergepipe.manifest.json"))
d = json.load(open("deviation.json"))
gb = lambda x: x / 1e9
print()
print("summary")
full = m['full_expert_bytes']
print(f"  expert bytes read   budgeted {gb(m['bytes_read']['expert']):.3f} GB of {gb(full):.3f} GB in the experts"
      f" ({full / max(1, m['bytes_read']['expert']):.1f}x fewer than one full read; budget {gb(m['budget_bytes']):.3f} GB)")
print(f"                      naive full read: {gb(f['bytes_read']['expert']):.3f} GB"
      + (" (TIES reads every expert twice without a catalog: thresholds, then the merge)" if f['bytes_read']['expert'] > full else ""))
print(f"  wall time           budgeted {m['timings']['total']:.2f} s  vs  full read {f['timings']['total']:.2f} s")
print(f"  omitted-update bound {m['error_bound']:.4g} (TIES: estimate)   measured ||M - M_full||_2 {d['abs_l2']:.4g}")
print(f"  relative deviation  {d['relative_l2']:.3e}   max |diff| {d['max_abs']:.3e}")
print(f"  plan hash           {m['plan_hash']}")
PY
