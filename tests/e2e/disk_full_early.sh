#!/usr/bin/env bash
# A full disk at the very first byte of the output: the merge must end with exit 4 and "No space
# left on device" naming the file, promptly, on every rank, leaving no folder at the target and
# no staging folder. Three places: the staging folder's resume record (the first file written at
# all), and the reservation of the shards' blocks and their headers, both by rank 0 alone (rank 0
# failing between collectives once left rank 1 waiting in the next collective forever).
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 11 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2
mkdir full
expect_exit 4 "full/\.merged\.mergepipe-staging/mergepipe\.resume\.json: .*No space left on device" \
  env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_ENOSPC_PATH="$TEST_SCRATCH/full/" \
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
  timeout 60 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
  --out full/merged --threads 1
expect_one_error
expect_no_output full/merged
# The resume record ({"format": "mergepipe-resume-1", "task": "<32 hex>"} and a newline) is 77
# bytes: let it through, so the next write is rank 0's reservation of the first shard's blocks
# (fallocate, before its header), which a full disk refuses before anything is merged.
expect_exit 4 "full/\.merged\.mergepipe-staging/model\.safetensors: cannot reserve [0-9]+ bytes: No space left on device" \
  env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_ENOSPC_PATH="$TEST_SCRATCH/full/" \
  MERGEPIPE_FAULT_ENOSPC_AFTER=77 ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
  timeout 60 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
  --out full/merged --threads 1
expect_one_error
expect_no_output full/merged
# Room for the resume record and the shard's reservation (the injector counts a fallocate's
# length as written; the shard's size is that of a clean merge's): the header write fails.
run_np 2 merge c.yaml --catalog cat --out clean --quiet
room=$((77 + $(stat -c %s clean/model.safetensors)))
expect_exit 4 "full/\.merged\.mergepipe-staging/model\.safetensors: .*(No space left on device|wrote nothing)" \
  env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_ENOSPC_PATH="$TEST_SCRATCH/full/" \
  MERGEPIPE_FAULT_ENOSPC_AFTER=$room ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
  timeout 60 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
  --out full/merged --threads 1
cat "$TEST_SCRATCH/err.txt"
! grep -q "cannot reserve" "$TEST_SCRATCH/err.txt" || fail "the reservation failed, not the header write"
expect_one_error
expect_no_output full/merged
echo "disk full at the first write: ok"
