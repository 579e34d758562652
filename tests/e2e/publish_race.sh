#!/usr/bin/env bash
# A second merge to the same target arriving while the first publishes its output (between
# releasing its lock and renaming the staging folder) must not be able to take the staging folder
# over: whatever happens, exactly one merge succeeds and the folder at the target verifies.
# The injector stretches the first merge's rename so that the window is seconds wide.
# Registered DISABLED in tests/CMakeLists.txt until io/src/staging.cpp holds its lock across the
# rename (docs/reliability.md, "Known gaps"): today the second merge wipes the first one's files
# and the first publishes the second's partial folder with exit 0.
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 10 --out fam >/dev/null
run_np 1 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2
inject=(env LD_PRELOAD="$FAULT_INJECT" ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0")

"${inject[@]}" MERGEPIPE_FAULT_SLOW_RENAME=.out.mergepipe-staging MERGEPIPE_FAULT_SLOW_MS=3000 \
  "$MERGEPIPE" merge c.yaml --catalog cat --out out --quiet >a.out 2>a.err &
first=$!
# The first merge is publishing once its manifest is written.
for ((i = 0; i < 600; ++i)); do
  [[ -e .out.mergepipe-staging/mergepipe.manifest.json ]] && break
  sleep 0.05
done
# Its own Open MPI session folder: launchers that start or end at once in one race on it
# (common.bash, rank_faults.sh).
mkdir -m 1777 "$OMPI_MCA_orte_tmpdir_base/b"
OMPI_MCA_orte_tmpdir_base="$OMPI_MCA_orte_tmpdir_base/b" \
  "${inject[@]}" MERGEPIPE_FAULT_SLOW_PATH="$TEST_SCRATCH/fam/" MERGEPIPE_FAULT_SLOW_MS=50 \
  "$MERGEPIPE" merge c.yaml --catalog cat --out out --threads 1 --quiet >b.out 2>b.err && rc_b=0 || rc_b=$?
rc_a=0
wait "$first" || rc_a=$?
cat a.err b.err
((rc_a == 0 || rc_b == 0)) || fail "neither merge succeeded (exits $rc_a, $rc_b)"
((rc_a != 0 || rc_b != 0)) || fail "both merges claim success"
"$MERGEPIPE" verify out >/dev/null || fail "the published folder does not verify: $(ls -A out)"
[[ ! -e out/.mergepipe.lock ]] || fail "the published folder holds a lock file"
echo "publish race: ok (exits $rc_a, $rc_b)"
