#!/usr/bin/env bash
# The Slurm path against a real Slurm: starts a single-node cluster (slurm/testing/local-cluster.sh:
# munged, slurmctld, slurmd from Debian's slurm-wlm, config in a temp folder), submits
# slurm/catalog.sbatch and slurm/merge.sbatch with `sbatch` on 2 tasks, checks exit codes
# and job logs, checks the output byte for byte against direct `mpirun -np 2` runs, checks exit
# code propagation and the requeue path, and runs slurm/scaling-study.sh with 1 and 2 ranks on two
# budgets. The cluster is stopped in a trap, always.
# Skips (exit 77) only when the cluster cannot start here (Slurm not installed, not root, daemons
# failing); under CI (CI=true) or MERGEPIPE_REQUIRE_SLURM=1 that is a failure instead.
source "$(dirname "$0")/../e2e/common.bash"
SLURM_DIR="$(cd "${SLURM_SCRIPTS:-$TESTS_DIR/../slurm}" && pwd)"
CLUSTER_SH="$SLURM_DIR/testing/local-cluster.sh"
t_start=$SECONDS
# Every wait is bounded by one deadline well inside CTest's TIMEOUT, so the trap below always gets
# to stop the cluster (a test killed by CTest could not).
deadline=$((SECONDS + ${SLURM_TEST_SECONDS:-720}))
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }

# A short path: the munge and PMIx sockets live in the cluster folder (sun_path is 108 bytes).
CLUSTER="$(mktemp -d /tmp/mergepipe-slurm.XXXXXX)"
cleanup() {
  local rc=$?
  if ((rc != 0 && rc != 77)); then
    for f in "$CLUSTER"/log/slurmctld.log "$CLUSTER"/log/slurmd.log; do
      [[ -s "$f" ]] && { echo "---- tail of $f" >&2 && tail -n 20 "$f" >&2; }
    done
  fi
  bash "$CLUSTER_SH" stop "$CLUSTER" >/dev/null 2>&1 || echo "WARNING: stopping the cluster in $CLUSTER failed" >&2
  rm -rf "$CLUSTER" "$OMPI_MCA_orte_tmpdir_base"
  ((rc == 0)) && cd / && rm -rf "$TEST_SCRATCH"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

required=0
[[ "${CI:-}" == true || "${MERGEPIPE_REQUIRE_SLURM:-0}" == 1 ]] && required=1
rc=0
bash "$CLUSTER_SH" start "$CLUSTER" >cluster-start.txt 2>&1 || rc=$?
cat cluster-start.txt
if ((rc != 0)); then
  reason="$(grep -m1 'local-cluster:' cluster-start.txt || echo "local-cluster.sh start exited $rc")"
  ((required)) && fail "Slurm is required here (CI=true or MERGEPIPE_REQUIRE_SLURM=1) but did not start: $reason"
  echo "SKIP: no single-node Slurm cluster on this machine: $reason"
  exit 77
fi
eval "$(bash "$CLUSTER_SH" env "$CLUSTER")"
echo "cluster up after $((SECONDS - t_start)) s"

mkdir -p logs
"$MERGEPIPE" synth --preset tiny --experts 3 --seed 7 --out fam >/dev/null
write_config ties.yaml ties fam 3
export MERGEPIPE

# wait_for_job ID WHAT: until job ID has left the queue (squeue lists pending, running and
# completing jobs), polled every 0.2 s, within the test's deadline.
wait_for_job() {
  until [[ -z "$(squeue -h -j "$1" -o %T 2>/dev/null)" ]]; do
    ((SECONDS < deadline)) || fail "$2 did not finish before the test's deadline"
    sleep 0.2
  done
}

# submit NAME SCRIPT [sbatch options...]: submits the job and waits for it; its exit code in
# $job_rc, its id in $job_id, its log in logs/NAME.out. Polled every 0.2 s: `sbatch --wait` polls
# at 2, 4, ... up to 10 s, which cost seconds per job of a few hundred milliseconds.
submit() {
  local name="$1" script="$2"
  shift 2
  sbatch --parsable --output="$PWD/logs/$name.out" "$@" "$SLURM_DIR/$script" >"logs/$name.id" ||
    fail "sbatch of job $name failed"
  job_id="$(head -1 "logs/$name.id" | cut -d';' -f1)"
  wait_for_job "$job_id" "job $name"
  job_rc="$(scontrol show job "$job_id" | grep -o -m1 'ExitCode=[0-9]*' | cut -d= -f2)"
  [[ -n "$job_rc" ]] || fail "no exit code for job $name ($job_id)"
}
log_has() {
  grep -qF -- "$2" "logs/$1.out" || {
    cat "logs/$1.out" >&2
    fail "log of job $1 lacks '$2'"
  }
}

# 1. Catalog and budgeted merge through Slurm: 2 tasks, srun --mpi=pmix.
BASE=fam/base EXPERTS="fam/expert*" CATALOG=cat-slurm BLOCK_BYTES=4096 submit catalog catalog.sbatch --ntasks=2
((job_rc == 0)) || { cat logs/catalog.out >&2 && fail "catalog.sbatch exited $job_rc"; }
log_has catalog "running: srun --mpi=pmix"
log_has catalog "--experts fam/expert00 fam/expert01 fam/expert02 --out cat-slurm --block-bytes 4096 --threads 1"
log_has catalog "catalog.sbatch: exit 0"

CONFIG=ties.yaml CATALOG=cat-slurm BUDGET=50% OUT=merged-slurm MPIIO_HINTS="cb_nodes=1,romio_cb_write=automatic" \
  submit merge merge.sbatch --ntasks=2
((job_rc == 0)) || { cat logs/merge.out >&2 && fail "merge.sbatch exited $job_rc"; }
log_has merge "running: srun --mpi=pmix"
log_has merge "--budget 50% --threads 1 --mpiio-hint cb_nodes=1 --mpiio-hint romio_cb_write=automatic"
log_has merge "merge.sbatch: exit 0"
merge_job="$job_id"
scontrol show job "$merge_job" | grep -q 'Requeue=1' || fail "merge.sbatch is not requeueable"

# 2. The same catalog and merge run directly with mpirun: byte-identical output, same plan.
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat-direct \
  --block-bytes 4096 --threads 1 >/dev/null
run_np 2 merge ties.yaml --catalog cat-direct --budget 50% --out merged-direct --threads 1 --quiet
same_model_files merged-slurm merged-direct
[[ "$(json_get merged-slurm/mergepipe.manifest.json plan_hash)" == "$(json_get merged-direct/mergepipe.manifest.json plan_hash)" ]] ||
  fail "plan hash differs between the Slurm and the direct merge"
[[ "$(json_get merged-slurm/mergepipe.manifest.json ranks)" == 2 ]] || fail "the Slurm merge did not run on 2 ranks"

# 3. Full budget through Slurm with the mpirun launcher == the catalog-less naive merge (mpirun).
CONFIG=ties.yaml CATALOG=cat-slurm BUDGET=100% OUT=full-slurm LAUNCHER=mpirun submit full merge.sbatch --ntasks=2
((job_rc == 0)) || { cat logs/full.out >&2 && fail "merge.sbatch with LAUNCHER=mpirun exited $job_rc"; }
log_has full "running: mpirun -np 2"
run_np 2 merge ties.yaml --full-read --out full-direct --threads 1 --quiet
same_model_files full-slurm full-direct

# 4. Exit codes: a missing variable is a usage error; mergepipe's own code comes through srun.
CONFIG=ties.yaml CATALOG=cat-slurm submit no-out merge.sbatch --ntasks=2
((job_rc == 2)) || fail "merge.sbatch without OUT: expected exit 2, got $job_rc"
log_has no-out "merge.sbatch: error: set OUT"
CONFIG=ties.yaml CATALOG=cat-slurm BUDGET=lots OUT=bad-budget submit bad-budget merge.sbatch --ntasks=2
((job_rc == 2)) || { cat logs/bad-budget.out >&2 && fail "bad budget: expected exit 2 through srun, got $job_rc"; }
log_has bad-budget "mergepipe: error:"
[[ ! -e bad-budget ]] || fail "a failed merge left bad-budget behind"

# 5. Requeue: the finished merge job, requeued, runs the same command again; OUT is already
# published, so it only verifies it, appending to the same log.
scontrol requeue "$merge_job"
scontrol update jobid="$merge_job" StartTime=now # requeued jobs otherwise wait ~2 minutes
wait_for_job "$merge_job" "requeued job $merge_job"
scontrol show job "$merge_job" | grep -q 'ExitCode=0:0' || fail "requeued job failed: $(scontrol show job "$merge_job" | grep -o 'ExitCode=[^ ]*')"
log_has merge "restart 1"
log_has merge "already published by an earlier attempt; verifying it"
[[ $(grep -c 'merge.sbatch: job' logs/merge.out) -eq 2 ]] || fail "the requeued run did not append to the log"
same_model_files merged-slurm merged-direct
echo "catalog/merge/requeue through Slurm ok after $((SECONDS - t_start)) s"

# 6. Preemption: a merge requeued while it runs (Slurm kills it) starts again with the same
# command, continues from its staging folder and publishes the same bytes as a direct run; its
# log shows progress lines at the requested interval.
"$MERGEPIPE" synth --preset qwen3-0.6b --layers 4 --hidden 512 --experts 3 --kinds full --seed 9 \
  --out big >/dev/null
run_np 2 catalog --base big/base --experts big/expert00 big/expert01 big/expert02 --out cat-big \
  --block-bytes 256KiB --quiet
write_config big.yaml ties big 3
run_np 2 merge big.yaml --catalog cat-big --budget 70% --out big-direct --threads 1 --quiet
blocks=$(json_get cat-big/catalog.json block_count)
# One reader per rank and small reads: the merge must still be running when it is requeued.
CONFIG=big.yaml CATALOG=cat-big BUDGET=70% OUT=big-slurm \
  EXTRA_ARGS="--progress-interval 0.5 --io-threads 1 --read-size 64KiB" \
  sbatch --parsable --ntasks=2 --output="$PWD/logs/preempt.out" "$SLURM_DIR/merge.sbatch" >logs/preempt.id
preempt_job="$(head -1 logs/preempt.id)"
journal_records() { cat .big-slurm.mergepipe-staging/journal-*.bin 2>/dev/null | wc -c | awk '{print int($1 / 32)}'; }
until (($(journal_records) >= blocks / 5)); do
  ((SECONDS < deadline)) || fail "the preemption job made no progress"
  [[ -n "$(squeue -h -j "$preempt_job" -o %T 2>/dev/null)" ]] || fail "the merge ended before it could be preempted"
  sleep 0.02
done
scontrol requeue "$preempt_job"
killed_at=$(journal_records)
((killed_at < blocks)) || fail "the merge had finished before the requeue"
job_field() { scontrol show job "$preempt_job" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
# The requeued job goes back to PENDING (held ~2 minutes unless released), then runs again.
until [[ "$(job_field JobState)" == PENDING ]]; do
  ((SECONDS < deadline)) || fail "the requeued merge never became pending ($(job_field JobState))"
  sleep 0.2
done
[[ ! -e big-slurm ]] || fail "a folder appeared at the target of the preempted merge"
# Release it only once the node has finished killing the old run, and in a later second: slurmd
# refuses a batch credential issued in the same second it revoked the job's old one ("Job
# credential revoked"), the race Slurm's own ~2 minute requeue hold exists to avoid.
until [[ "$(sinfo -h -o %T | sort -u)" == idle ]]; do
  ((SECONDS < deadline)) || fail "the node did not become idle after the requeue ($(sinfo -h -o %T))"
  sleep 0.2
done
sleep 2
scontrol update jobid="$preempt_job" StartTime=now
until [[ "$(job_field JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)$ ]]; do
  ((SECONDS < deadline)) || fail "the requeued merge did not finish ($(job_field JobState))"
  sleep 0.2
done
[[ "$(job_field JobState)" == COMPLETED && "$(job_field ExitCode)" == 0:0 ]] ||
  { cat logs/preempt.out >&2 && fail "the requeued merge ended $(job_field JobState) $(job_field ExitCode)"; }
log_has preempt "restart 1"
grep -Eq "resumed +[1-9][0-9]* of $blocks blocks kept" logs/preempt.out ||
  { cat logs/preempt.out >&2 && fail "the restarted job did not resume (killed at $killed_at of $blocks blocks)"; }
same_model_files big-direct big-slurm
# Progress: plain lines (a log file is no terminal), one per interval, then the final one.
"$PYTHON" - logs/preempt.out <<'PY' || fail "progress lines missing or too far apart in the job log"
import re, sys
elapsed = [float(m.group(1)) * 60 + float(m.group(2)) for m in
           re.finditer(r"^mergepipe: merge +[0-9.]+% .* elapsed (\d+):(\d+)", open(sys.argv[1]).read(), re.M)]
assert len(elapsed) >= 3, elapsed
gaps = [b - a for a, b in zip(elapsed, elapsed[1:]) if b >= a]
assert max(gaps) <= 2, gaps  # 0.5 s interval; the clock text has 1 s resolution
assert "\r" not in open(sys.argv[1]).read(), "a terminal bar in a log file"
print(f"{len(elapsed)} progress lines, largest gap {max(gaps)} s")
PY
echo "preemption and resume through Slurm ok (killed at $killed_at of $blocks blocks)"

# 7. Scaling study on one node: ranks 1 and 2, two budgets.
bash "$SLURM_DIR/scaling-study.sh" --config ties.yaml --catalog cat-slurm --out study \
  --nodes 1 --ranks-per-node "1 2" --threads 1 --budgets "50%,100%" --mergepipe "$MERGEPIPE" \
  --timeout "$(left)" >study.txt 2>&1 || { cat study.txt >&2 && fail "scaling-study.sh failed"; }
cat study.txt
[[ -s study/scaling.png ]] || fail "no plot study/scaling.png"
[[ "$(head -c 4 study/scaling.png | od -An -c | tr -d ' ')" == *PNG* ]] || fail "study/scaling.png is not a PNG"
"$PYTHON" - <<'PY' || fail "study/scaling.csv is wrong"
import csv
rows = list(csv.DictReader(open("study/scaling.csv")))
assert len(rows) == 4, rows
cells = sorted((r["budget"], int(r["ranks"])) for r in rows)
assert cells == [("100%", 1), ("100%", 2), ("50%", 1), ("50%", 2)], cells
for r in rows:
    assert r["status"] == "ok" and r["exit_code"] == "0", r
    assert r["nodes"] == "1" and r["threads"] == "1", r
    for k in ("wall_s", "job_wall_s", "throughput_MBps", "throughput_per_rank_MBps", "efficiency"):
        assert float(r[k]) > 0, (k, r)
    moved = int(r["base_bytes"]) + int(r["expert_bytes"]) + int(r["output_bytes"])
    assert int(r["bytes_moved"]) == moved > 0, r
    assert int(r["expert_bytes"]) <= int(r["budget_bytes"]), r
    if r["ranks"] == "1":
        assert float(r["efficiency"]) == 1.0, r
for b in ("50%", "100%"):
    same = [r for r in rows if r["budget"] == b]
    assert len({r["plan_hash"] for r in same}) == 1, same  # plan independent of rank count
    assert len({r["expert_bytes"] for r in same}) == 1, same
half = [r for r in rows if r["budget"] == "50%"]
full = [r for r in rows if r["budget"] == "100%"]
assert int(half[0]["expert_bytes"]) < int(full[0]["expert_bytes"])
print("scaling.csv ok")
PY
[[ -z "$(ls study/out)" ]] || fail "the study kept merged outputs without --keep-outputs"

echo "slurm cluster test: ok in $((SECONDS - t_start)) s"
