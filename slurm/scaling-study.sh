#!/usr/bin/env bash
# Scaling study of `mergepipe merge` on a Slurm cluster: node counts x ranks per node x budgets.
# For every (node count N, ranks per node R) one job array is submitted,
#   sbatch --nodes=N --ntasks-per-node=R --cpus-per-task=T --array=0-(B-1) scaling-task.sbatch
# (a job array shares one resource request, so each node count is its own submission), whose
# task i merges at budget i through merge.sbatch. The script waits for all jobs (polling squeue;
# no accounting database needed), then collects STUDY/scaling.csv and plots STUDY/scaling.png.
#
#   slurm/scaling-study.sh --config merge.yaml --catalog fam.catalog --out study \
#       --nodes "1 2 4 8" --ranks-per-node 4 --threads 4 --budgets "10% 25% 100%" \
#       [--partition P] [--account A] [--time 01:00:00] [--sbatch-args "--constraint=..."] \
#       [--mergepipe PATH] [--format hdf5] [--mpiio-hints "striping_factor=8"] \
#       [--extra-args "--prefetch 4"] [--work-dir /lustre/scratch/study-out] [--keep-outputs] \
#       [--shared] [--timeout SECONDS] [--collect-only]
#
# Lists take spaces or commas. Rank counts can be swept on one node with --nodes 1
# --ranks-per-node "1 2 4". Jobs are --exclusive unless --shared, so cells do not share nodes and
# run one after the other where nodes are few. Merged outputs go to --work-dir (default
# STUDY/out) and are deleted after their manifest is saved, unless --keep-outputs.
# Exit code: 0 when every cell succeeded; 1 when one failed (the CSV still lists it); 2 usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "scaling-study: error: $*" >&2
  exit 2
}

config="" catalog="" study="" nodes_list="1" rpn_list="1" threads=1 budgets="25% 100%"
mergepipe="${MERGEPIPE:-mergepipe}" format="" hints="" extra="" workdir="" keep=0 shared=0
partition="" account="" time_limit="" sbatch_args="" timeout=0 collect_only=0
while (($#)); do
  case "$1" in
    --config) config="$2" ;;
    --catalog) catalog="$2" ;;
    --out) study="$2" ;;
    --nodes) nodes_list="$2" ;;
    --ranks-per-node) rpn_list="$2" ;;
    --threads) threads="$2" ;;
    --budgets) budgets="$2" ;;
    --mergepipe) mergepipe="$2" ;;
    --format) format="$2" ;;
    --mpiio-hints) hints="$2" ;;
    --extra-args) extra="$2" ;;
    --work-dir) workdir="$2" ;;
    --partition) partition="$2" ;;
    --account) account="$2" ;;
    --time) time_limit="$2" ;;
    --sbatch-args) sbatch_args="$2" ;;
    --timeout) timeout="$2" ;;
    --keep-outputs) keep=1 && shift && continue ;;
    --shared) shared=1 && shift && continue ;;
    --collect-only) collect_only=1 && shift && continue ;;
    -h | --help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  (($# >= 2)) || die "$1 needs a value"
  shift 2
done
[[ -n "$study" ]] || die "--out STUDY_DIR is required"
study="$(realpath -m "$study")"
collect() {
  /usr/bin/python3 "$here/scaling_collect.py" "$study"
}
if ((collect_only)); then
  collect
  exit $?
fi

[[ -n "$config" && -f "$config" ]] || die "--config FILE is required (a merge config YAML): '${config}'"
[[ -n "$catalog" && -d "$catalog" ]] || die "--catalog DIR is required (made by catalog.sbatch): '${catalog}'"
mergepipe_path="$(command -v "$mergepipe" || true)"
[[ -n "$mergepipe_path" ]] || die "mergepipe binary '$mergepipe' not found (--mergepipe PATH)"
command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node (or start slurm/testing/local-cluster.sh)"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer"
read -r -a node_counts <<<"${nodes_list//,/ }"
read -r -a rpns <<<"${rpn_list//,/ }"
read -r -a budget_list <<<"${budgets//,/ }"
((${#node_counts[@]} && ${#rpns[@]} && ${#budget_list[@]})) || die "--nodes, --ranks-per-node and --budgets need at least one value each"
for x in "${node_counts[@]}" "${rpns[@]}"; do [[ "$x" =~ ^[1-9][0-9]*$ ]] || die "node and rank counts must be positive integers, not '$x'"; done

mkdir -p "$study/logs" "$study/results"
rm -f "$study"/results/*.json "$study/jobs.txt" "$study/expected.txt"
workdir="$(realpath -m "${workdir:-$study/out}")"

# Everything the array tasks need travels in the environment (--export=ALL, the default):
# --export=VAR=value lists cannot carry values with commas or spaces.
export STUDY_DIR="$study" STUDY_BUDGETS="${budget_list[*]}" STUDY_OUT_DIR="$workdir"
export STUDY_MERGE_SBATCH="$here/merge.sbatch" STUDY_KEEP_OUTPUTS="$keep"
CONFIG="$(realpath "$config")"
CATALOG="$(realpath "$catalog")"
export MERGEPIPE="$mergepipe_path" CONFIG CATALOG
export THREADS="$threads" FORMAT="$format" MPIIO_HINTS="$hints" EXTRA_ARGS="$extra"
{
  echo "config=$CONFIG"
  echo "catalog=$CATALOG"
  echo "mergepipe=$MERGEPIPE"
  echo "nodes=${node_counts[*]}"
  echo "ranks_per_node=${rpns[*]}"
  echo "threads=$threads"
  echo "budgets=${budget_list[*]}"
  echo "submitted=$(date -Is)"
} >"$study/study.txt"

common=(--parsable --cpus-per-task="$threads" --array="0-$((${#budget_list[@]} - 1))")
((shared)) || common+=(--exclusive)
[[ -n "$partition" ]] && common+=(--partition="$partition")
[[ -n "$account" ]] && common+=(--account="$account")
[[ -n "$time_limit" ]] && common+=(--time="$time_limit")
# shellcheck disable=SC2206
[[ -n "$sbatch_args" ]] && common+=($sbatch_args)

job_ids=()
for n in "${node_counts[@]}"; do
  for r in "${rpns[@]}"; do
    out_pattern="$study/logs/n$n-r$r-%A_%a.out"
    cmd=(sbatch "${common[@]}" --nodes="$n" --ntasks-per-node="$r" --job-name="mergepipe-scaling-n$n-r$r"
      --output="$out_pattern" "$here/scaling-task.sbatch")
    printf 'scaling-study: submitting:'
    printf ' %q' "${cmd[@]}"
    echo
    id="$(STUDY_NODES="$n" STUDY_RANKS_PER_NODE="$r" "${cmd[@]}")" || die "sbatch refused nodes=$n ranks-per-node=$r (see above)"
    id="${id%%;*}"
    job_ids+=("$id")
    echo "$id nodes=$n ranks_per_node=$r" >>"$study/jobs.txt"
    # The cells this array must produce (same tag as scaling-task.sbatch), so a task that never
    # ran still shows up in the CSV.
    for b in "${budget_list[@]}"; do
      printf 'n%s-r%s-b%s %s %s %s %s\n' "$n" "$r" "$(printf '%s' "$b" | sed 's/%/pct/g; s/[^A-Za-z0-9._-]/_/g')" \
        "$n" "$r" "$threads" "$b" >>"$study/expected.txt"
    done
  done
done
echo "scaling-study: ${#job_ids[@]} job array(s) of ${#budget_list[@]} task(s): ${job_ids[*]}; waiting"

# Our arrays' tasks still queued or running (squeue lists pending/running/completing jobs; jobs
# that are done simply drop out, so no accounting database is needed).
queued() {
  squeue -h --me -o '%A %i %T' | awk -v ids=" ${job_ids[*]} " 'index(ids, " " $1 " ") {print $2, $3}'
}
start=$SECONDS last="" failures=0
while :; do
  if ! pending="$(queued 2>"$study/squeue.err")"; then
    ((++failures < 30)) || die "squeue keeps failing: $(cat "$study/squeue.err")"
    sleep 2
    continue
  fi
  failures=0
  [[ -z "$pending" ]] && break
  summary="$(awk '{print $2}' <<<"$pending" | sort | uniq -c | awk '{printf "%s %s ", $1, $2}')"
  [[ "$summary" != "$last" ]] && echo "scaling-study: $(date +%T) ${summary% }"
  last="$summary"
  if ((timeout > 0 && SECONDS - start > timeout)); then
    echo "scaling-study: timeout after ${timeout}s; cancelling ${job_ids[*]}" >&2
    scancel "${job_ids[@]}" || true
    sleep 2
    break
  fi
  sleep 2
done
rm -f "$study/squeue.err"
echo "scaling-study: all jobs left the queue after $((SECONDS - start)) s; logs in $study/logs"
collect
