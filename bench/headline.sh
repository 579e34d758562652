#!/usr/bin/env bash
# Cold-cache, side-by-side comparison on one synthetic family: budgeted merges at several budgets,
# the naive --full-read merge, and a plain `cat` of the same input files, all in one run so the
# ratios hold on a noisy machine. Prints a markdown table and writes CSV.
# Environment: PRESET (qwen3-0.6b), K (8), METHOD (ties), BUDGETS ("100% 50% 25% 10%"), NP (2),
# THREADS (1), BENCH_DIR (/tmp/mergepipe-bench), CSV (bench-headline.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml="${OMPI_MCA_pml:-^cm}"  # cm's PSM transports wait ~0.2 s without hardware
MP="$PWD/build/bin/mergepipe"
PRESET="${PRESET:-qwen3-0.6b}" K="${K:-8}" METHOD="${METHOD:-ties}" NP="${NP:-2}" THREADS="${THREADS:-1}"
BUDGETS="${BUDGETS:-100% 50% 25% 10%}"
DIR="${BENCH_DIR:-/tmp/mergepipe-bench}"
CSV="${CSV:-$PWD/bench-headline.csv}"
[[ -x "$MP" ]] || { echo "build first: scripts/build.sh release" >&2; exit 2; }
command -v vmtouch >/dev/null || { echo "needs vmtouch (scripts/setup-deps.sh)" >&2; exit 2; }
mkdir -p "$DIR"
cd "$DIR"
fam="fam-$PRESET-$K"
if [[ ! -f "$fam/family.json" ]]; then "$MP" synth --preset "$PRESET" --experts "$K" --seed 1 --out "$fam" --force; fi
experts=("$fam"/expert*)
if [[ ! -f "$fam.catalog/catalog.json" ]]; then mpirun -np "$NP" "$MP" catalog --base "$fam/base" --experts "${experts[@]}" --out "$fam.catalog"; fi
{
  echo "merge_method: $METHOD"
  echo "base_model: $fam/base"
  echo "models:"
  for e in "${experts[@]}"; do echo "  - {model: $e, parameters: {weight: 1.0, density: 0.5}}"; done
} >bench.yaml

evict() { sync; vmtouch -q -e "$fam" "$@" >/dev/null 2>&1 || true; }
now() { date +%s.%N; }
echo "config,wall_s,expert_bytes,base_bytes,output_bytes,peak_rss_bytes,plan_s" >"$CSV"
run_merge() {  # name, extra args...
  local name="$1"
  shift
  rm -rf "out-$name"
  evict
  local t0 t1
  t0=$(now)
  mpirun -np "$NP" "$MP" merge bench.yaml "$@" --out "out-$name" --threads "$THREADS" --quiet
  sync
  t1=$(now)
  python3 - "$name" "$t0" "$t1" "out-$name/mergepipe.manifest.json" >>"$CSV" <<'PY'
import json, sys
name, t0, t1, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
m = json.load(open(path)); b = m["bytes_read"]
print(f"{name},{t1 - t0:.3f},{b['expert']},{b['base']},{b['output_written']},{m['peak_rss_bytes']},{m['timings']['plan']:.4f}")
PY
  evict "out-$name"
}
for budget in $BUDGETS; do run_merge "budget-${budget%\%}" --catalog "$fam.catalog" --budget "$budget"; done
run_merge full-read --full-read
evict
t0=$(now)
cat $(find "$fam" -name '*.safetensors') >/dev/null
t1=$(now)
total=$(find "$fam" -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s}')
echo "cat-inputs,$(python3 -c "print(f'{$t1 - $t0:.3f}')"),$total,0,0,0,0" >>"$CSV"
python3 - "$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
full = next(r for r in rows if r["config"] == "full-read")
cat = next(r for r in rows if r["config"] == "cat-inputs")
bw = float(cat["expert_bytes"]) / float(cat["wall_s"])
print(f"storage read bandwidth from cat: {bw / 1e9:.2f} GB/s")
print("| config | wall s | expert GB read | bytes moved GB | lower bound s | wall / bound | speedup vs full-read | peak RSS MiB |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    if r["config"] == "cat-inputs":
        continue
    moved = sum(float(r[k]) for k in ("expert_bytes", "base_bytes", "output_bytes"))
    bound = moved / bw
    print(f"| {r['config']} | {float(r['wall_s']):.2f} | {float(r['expert_bytes']) / 1e9:.3f} | {moved / 1e9:.3f} | {bound:.2f} | "
          f"{float(r['wall_s']) / bound:.2f} | {float(full['wall_s']) / float(r['wall_s']):.2f}x | {float(r['peak_rss_bytes']) / 2**20:.0f} |")
print(f"| cat of all inputs | {float(cat['wall_s']):.2f} | - | {float(cat['expert_bytes']) / 1e9:.3f} | - | - | - | - |")
PY
