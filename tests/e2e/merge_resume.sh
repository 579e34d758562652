#!/usr/bin/env bash
# Kill and resume (issue 6): a merge whose rank is SIGKILLed part way leaves no folder at the
# target; running the same command again continues from the staging folder, re-does only what
# was not finished (checking what was) and publishes files byte-identical to an uninterrupted
# run, at the same or another rank count, for safetensors and HDF5 outputs.
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

# A 38 MB model (its vocabulary cut to 4096 rows); the runs to be killed write slowly.
"$MERGEPIPE" synth --preset qwen3-0.6b --layers 4 --hidden 512 --vocab 4096 --experts 3 \
  --kinds full --seed 9 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat \
  --block-bytes 256KiB >/dev/null
write_config ties.yaml ties fam 3

# journal_records DIR: block records written so far by every rank of the run staging into DIR.
journal_records() {
  local total=0 f
  for f in "$1"/journal-*.bin; do
    [[ -f "$f" ]] && total=$((total + $(stat -c %s "$f") / 32))
  done
  echo "$total"
}

# kill_part_way NP OUT ARGS...: starts `merge ARGS --out OUT` on NP ranks, each write into its
# staging folder slowed by SLOW_MS, SIGKILLs one rank once the journal holds >= 15% of the
# blocks, and checks the job ended with nothing at OUT.
kill_part_way() {
  local np="$1" out="$2"
  shift 2
  local staging=".$out.mergepipe-staging"
  env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_SLOW_WRITE_PATH="$TEST_SCRATCH/$staging/" \
    MERGEPIPE_FAULT_SLOW_MS="$SLOW_MS" ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
    "$MPIEXEC" -np "$np" --oversubscribe "$MERGEPIPE" merge "$@" --out "$out" --threads 1 \
    --progress none >"kill-$out.log" 2>&1 &
  local job=$! waited=0
  while (($(journal_records "$staging") < BLOCKS * 15 / 100)); do
    sleep 0.01
    waited=$((waited + 1))
    ((waited < 6000)) || fail "no progress in the journal of $out"
    kill -0 "$job" 2>/dev/null || fail "the merge into $out ended before it could be killed"
  done
  local victim
  victim="$(pgrep -f "^$MERGEPIPE merge .*--out $out " | tail -1)"
  [[ -n "$victim" ]] || fail "no rank process found for $out"
  kill -9 "$victim"
  local rc=0
  timeout 60 tail --pid="$job" -f /dev/null || fail "mpirun did not end after a rank was killed"
  wait "$job" || rc=$?
  ((rc != 0)) || fail "the killed merge into $out reported success"
  [[ ! -e "$out" ]] || fail "a folder appeared at $out after the merge was killed"
  [[ -d "$staging" ]] || fail "the killed run left no staging folder to resume from"
  local done_blocks
  done_blocks=$(journal_records "$staging")
  ((done_blocks < BLOCKS)) || fail "the merge into $out had finished before the kill"
  echo "killed $out at $done_blocks of $BLOCKS blocks"
}

BLOCKS=$(json_get cat/catalog.json block_count)
SLOW_MS=${SLOW_MS:-20}

for fmt in safetensors hdf5; do
  # Budgeted TIES: the uninterrupted reference, then killed at 2 ranks and resumed at 2 and 3.
  run_np 2 merge ties.yaml --catalog cat --budget 70% --format "$fmt" --out "ref-$fmt" --quiet
  kill_part_way 2 "res-$fmt" ties.yaml --catalog cat --budget 70% --format "$fmt"
  # What Open MPI's MPI-IO leaves beside a shared file when a run across nodes is killed (issue
  # 42): the resumed run must publish exactly what an uninterrupted one writes.
  stray=$(ls ".res-$fmt.mergepipe-staging" | grep -E '\.(safetensors|h5)$' | head -1)
  [[ -n "$stray" ]] || fail "$fmt: the killed run staged no output file"
  touch ".res-$fmt.mergepipe-staging/$stray-4242-77.lock"
  run_np 2 merge ties.yaml --catalog cat --budget 70% --format "$fmt" --out "res-$fmt" >resume.txt
  [[ ! -e "res-$fmt/$stray-4242-77.lock" ]] || fail "$fmt: a stray lock file was published"
  grep -Eq "resumed +[1-9][0-9]* of $BLOCKS blocks kept" resume.txt ||
    { cat resume.txt >&2; fail "$fmt: the rerun did not resume"; }
  same_model_files "ref-$fmt" "res-$fmt"
  [[ ! -e ".res-$fmt.mergepipe-staging" ]] || fail "$fmt: staging folder left after publishing"
  ls "res-$fmt" | grep -q journal && fail "$fmt: journals published with the output"
  [[ "$(json_get "res-$fmt/mergepipe.manifest.json" resume.resumed)" == True ]] ||
    fail "$fmt: the manifest does not record the resume"

  kill_part_way 2 "res3-$fmt" ties.yaml --catalog cat --budget 70% --format "$fmt"
  run_np 3 merge ties.yaml --catalog cat --budget 70% --format "$fmt" --out "res3-$fmt" --quiet
  same_model_files "ref-$fmt" "res3-$fmt"
done

# --full-read TIES (thresholds scanned from the data, recorded in the journal too).
run_np 2 merge ties.yaml --full-read --block-bytes 256KiB --out ref-full --quiet
kill_part_way 2 res-full ties.yaml --full-read --block-bytes 256KiB
run_np 2 merge ties.yaml --full-read --block-bytes 256KiB --out res-full --quiet
same_model_files ref-full res-full
[[ "$(json_get res-full/mergepipe.manifest.json plan_hash)" == "$(json_get ref-full/mergepipe.manifest.json plan_hash)" ]] ||
  fail "the resumed full read recorded other thresholds"
# --full-read breadcrumbs: two thresholds per expert and tensor (the band), journaled together.
sed -e 's/merge_method: ties/merge_method: breadcrumbs_ties/' ties.yaml >crumbs.yaml
printf 'parameters: {gamma: 0.05}\n' >>crumbs.yaml
run_np 2 merge crumbs.yaml --full-read --block-bytes 256KiB --out ref-crumbs --quiet
kill_part_way 2 res-crumbs crumbs.yaml --full-read --block-bytes 256KiB
run_np 3 merge crumbs.yaml --full-read --block-bytes 256KiB --out res-crumbs --quiet
same_model_files ref-crumbs res-crumbs
[[ "$(json_get res-crumbs/mergepipe.manifest.json plan_hash)" == "$(json_get ref-crumbs/mergepipe.manifest.json plan_hash)" ]] ||
  fail "the resumed breadcrumbs recorded other thresholds"
# A geometric method (model_stock; slerp, karcher, multislerp and nuslerp take the same path):
# each tensor's linear form (base scale and one coefficient per expert) comes from the scan's
# Gram, and is journaled.
cat >stock.yaml <<YAML
merge_method: model_stock
base_model: fam/base
models: [fam/expert00, fam/expert01, fam/expert02]
YAML
run_np 2 merge stock.yaml --block-bytes 256KiB --out ref-stock --quiet
kill_part_way 2 res-stock stock.yaml --block-bytes 256KiB
run_np 3 merge stock.yaml --block-bytes 256KiB --out res-stock --quiet
same_model_files ref-stock res-stock
[[ "$(json_get res-stock/mergepipe.manifest.json plan_hash)" == "$(json_get ref-stock/mergepipe.manifest.json plan_hash)" ]] ||
  fail "the resumed model_stock recorded other coefficients"
kept=$(json_get res-stock/mergepipe.manifest.json resume.blocks_kept)
[[ "$kept" -gt 0 ]] || fail "the resumed model_stock kept no block of the killed run"

# What the journal claims is checked: with the staged shard's data destroyed, every claim is
# rejected and the block merged again.
kill_part_way 2 damaged ties.yaml --catalog cat --budget 70%
shard=".damaged.mergepipe-staging/model.safetensors"
size=$(stat -c %s "$shard")
dd if=/dev/zero of="$shard" bs=1M seek=1 count=$(((size >> 20) - 1)) conv=notrunc status=none
run_np 2 merge ties.yaml --catalog cat --budget 70% --out damaged >resume.txt
grep -Eq "resumed +[0-9]+ of $BLOCKS blocks kept .*\([1-9][0-9]* rejected\)" resume.txt ||
  { cat resume.txt >&2; fail "damaged staged bytes were not rejected"; }
same_model_files ref-safetensors damaged

# Another task (a different budget) does not reuse the leftover; --no-resume starts afresh.
kill_part_way 2 other ties.yaml --catalog cat --budget 70%
run_np 2 merge ties.yaml --catalog cat --budget 40% --out other >other.txt
grep -q "resumed" other.txt && fail "a different task resumed another task's staging folder"
kill_part_way 2 fresh ties.yaml --catalog cat --budget 70%
run_np 2 merge ties.yaml --catalog cat --budget 70% --out fresh --no-resume >fresh.txt
grep -q "resumed" fresh.txt && fail "--no-resume resumed"
same_model_files ref-safetensors fresh
echo "merge resume: ok"
