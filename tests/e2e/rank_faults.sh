#!/usr/bin/env bash
# Rank faults (docs/reliability.md, "Faults"): an error on rank 1 only ends the whole job promptly
# with rank 1's message printed once by rank 0; a SIGKILLed rank ends the job without a hang and
# leaves no folder at the target (the next run reclaims its staging folder); two merges to one
# target: one wins, the other fails cleanly, whether the lock is held by a test-controlled `flock`
# or by a genuinely concurrent merge. Reads of the family are slowed with the LD_PRELOAD injector
# so that a tiny merge lasts seconds, long enough to be killed or raced, without using CPU.
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 9 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2
slow=(env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_SLOW_PATH="$TEST_SCRATCH/fam/"
      MERGEPIPE_FAULT_SLOW_MS=150 ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0")
mpi2=("$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE")

# pid_of_rank TARGET RANK: the pid of that rank of the running merge to TARGET.
pid_of_rank() {
  local target="$1" rank="$2" p
  for p in $(pgrep -f -- "--out $target( |$)"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == mergepipe ]] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank" &&
      echo "$p" && return 0
  done
  return 1
}

# wait_for PATH: waits (up to 60 s) until PATH exists.
wait_for() {
  local i
  for ((i = 0; i < 600; ++i)); do
    [[ -e "$1" ]] && return 0
    sleep 0.1
  done
  fail "$1 never appeared"
}

# --- An input error on rank 1 only: NaN in lm_head.weight, the last tensor, which only rank 1
# merges (--schedule static: its fixed share ends the model). Rank 0 prints rank 1's message,
# once, and the job ends promptly.
cp -r fam nan && "$PYTHON" "$TESTS_DIR/python/corrupt_checkpoint.py" nonfinite nan/expert00 \
  lm_head.weight nan >/dev/null
printf 'merge_method: linear\nbase_model: nan/base\nmodels: [nan/expert00, nan/expert01]\n' >nan.yaml
start=$SECONDS
expect_exit 3 "nan/expert00/model[^ ]*\.safetensors bytes [0-9]+\.\.[0-9]+: tensor 'lm_head\.weight' of expert 0 holds NaN/Inf values; --allow-nonfinite" \
  timeout 60 "${mpi2[@]}" merge nan.yaml --full-read --out nan-out --schedule static
expect_one_error
expect_no_output nan-out
((SECONDS - start < 30)) || fail "a failing rank took $((SECONDS - start)) s to end the job"
echo "ok: rank 1's error on rank 0"

# --- A killed rank: SIGKILL rank 1 while it merges (slowed reads keep it busy for seconds).
"${slow[@]}" timeout 120 "${mpi2[@]}" merge c.yaml --catalog cat --out killed --threads 1 --quiet \
  >killed.out 2>&1 &
job=$!
wait_for .killed.mergepipe-staging/model.safetensors
victim=""
for ((i = 0; i < 300; ++i)); do
  kill -0 "$job" 2>/dev/null || { cat killed.out >&2; fail "the merge ended before rank 1 could be killed"; }
  victim="$(pid_of_rank killed 1)" && break
  sleep 0.1
done
[[ -n "$victim" ]] || fail "rank 1 of the merge never showed up"
kill -9 "$victim"
start=$SECONDS
rc=0
wait "$job" || rc=$?
((rc != 0 && rc != 124)) || { cat killed.out >&2; fail "mpirun after a killed rank: exit $rc"; }
((SECONDS - start < 60)) || fail "the job took $((SECONDS - start)) s to end after a rank died"
[[ ! -e killed ]] || fail "a killed merge left a folder at the target"
pgrep -f -- "--out killed( |$)" >/dev/null && fail "ranks of the killed merge are still running"
# The next run reclaims the staging folder and publishes a complete output.
run_np 2 merge c.yaml --catalog cat --out killed --quiet || fail "the merge after a kill failed"
"$MERGEPIPE" verify killed >/dev/null || fail "the merge after a kill does not verify"
[[ ! -e .killed.mergepipe-staging ]] || fail "the staging folder of the killed run was not reclaimed"
echo "ok: killed rank (exit $rc)"

# --- The staging lock held from outside (deterministic): the merge refuses, touches nothing.
mkdir .locked.mergepipe-staging
expect_exit 4 "locked: another merge is writing this output right now \(lock held on .*\.locked\.mergepipe-staging/\.mergepipe\.lock\)" \
  flock .locked.mergepipe-staging/.mergepipe.lock "${mpi2[@]}" merge c.yaml --catalog cat --out locked
expect_one_error
[[ ! -e locked ]] || fail "a merge that could not lock published a folder"
[[ -d .locked.mergepipe-staging ]] || fail "a merge removed a staging folder it did not lock"
run_np 2 merge c.yaml --catalog cat --out locked --quiet || fail "the merge after the lock was freed failed"
[[ ! -e .locked.mergepipe-staging ]] || fail "staging folder left after a successful merge"
echo "ok: staging lock held"

# --- Two merges to one target at the same time: exactly one publishes a complete output.
# Each launcher has its own session folder: two started at once in one race on creating it
# (common.bash; seen here as "orte_init failed ... File exists" for the losing merge).
for who in a b; do
  mkdir -m 1777 "$OMPI_MCA_orte_tmpdir_base/$who"
  OMPI_MCA_orte_tmpdir_base="$OMPI_MCA_orte_tmpdir_base/$who" \
  "${slow[@]}" timeout 120 "${mpi2[@]}" merge c.yaml --catalog cat --out raced --threads 1 --quiet \
    >"race-$who.out" 2>"race-$who.err" &
  eval "pid_$who=$!"
done
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
if ((rc_a == 0 && rc_b != 0)); then loser=b rc=$rc_b; elif ((rc_b == 0 && rc_a != 0)); then loser=a rc=$rc_a; else
  cat race-a.err race-b.err >&2
  fail "concurrent merges: exits $rc_a and $rc_b, expected exactly one success"
fi
grep -Eq "^mergepipe: error: raced: (another merge is writing this output right now|output folder already exists|output folder appeared while merging)" \
  "race-$loser.err" || { cat "race-$loser.err" >&2; fail "the losing merge gave no clear message"; }
"$MERGEPIPE" verify raced >/dev/null || fail "the winning merge's output does not verify"
run_np 1 merge c.yaml --catalog cat --out raced-alone --quiet
same_model_files raced raced-alone
[[ ! -e .raced.mergepipe-staging ]] || fail "staging folder left after the race"
echo "ok: concurrent merges (loser exit $rc: $(grep -o 'raced: [a-z ]*' "race-$loser.err" | head -1))"
echo "rank faults: ok"
