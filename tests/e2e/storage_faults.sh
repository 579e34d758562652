#!/usr/bin/env bash
# Storage faults (docs/reliability.md, "Faults"): a full disk under the output, unreadable files and
# folders (run as an unprivileged user, since root bypasses permissions), and read errors that
# clear after a few retries or persist. Each failure exits 4 with one line naming the file (and
# the offset of a failed read), and leaves no folder at the target and no staging folder.
umount "${TEST_SCRATCH:?}/small" 2>/dev/null || true # left mounted by an interrupted run
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 8 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2
run_np 2 merge c.yaml --catalog cat --out clean --quiet || fail "the clean merge failed"

# --- Disk full: a real 128 KiB tmpfs as the output parent when this machine lets us mount one
# (the merged model needs ~330 KB); otherwise the injector lets each process write 64 KiB under
# the output parent, then fails every write there with ENOSPC.
mkdir -p small
full_env=()
if mount -t tmpfs -o size=128k mergepipe-test small 2>/dev/null; then
  on_exit 'umount "$TEST_SCRATCH/small"'
  echo "disk full: 128 KiB tmpfs"
else
  full_env=(LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_ENOSPC_PATH="$TEST_SCRATCH/small/"
            MERGEPIPE_FAULT_ENOSPC_AFTER=65536 ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0")
  echo "disk full: mount refused, ENOSPC injected through LD_PRELOAD"
fi
# Writes of the merged shards fail (MPI-IO reports a write that wrote nothing; POSIX writes
# report ENOSPC). Which staging file meets the full disk first (a shard or a rank's resume
# journal) depends on timing; either way the message names it.
expect_exit 4 "small/\.merged\.mergepipe-staging/(model\.safetensors|journal-[0-9]+\.bin): .*(No space left on device|disk full)" \
  env "${full_env[@]}" "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
  --out small/merged --threads 1
expect_one_error
expect_no_output small/merged
[[ -z "$(ls -A small)" ]] || fail "the full file system still holds: $(ls -A small)"
# The HDF5 output reserves its datasets' bytes before merging, so the system's reason shows
# (HDF5's own write errors do not carry it).
for np in 1 2; do
  expect_exit 4 "small/\.merged\.mergepipe-staging/(model\.h5: cannot reserve [0-9]+ bytes|journal-[0-9]+\.bin: .*): No space left on device" \
    env "${full_env[@]}" "$MPIEXEC" -np "$np" --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
    --out small/merged --threads 1 --format hdf5
  expect_one_error
  expect_no_output small/merged
  [[ -z "$(ls -A small)" ]] || fail "HDF5, $np rank(s): the full file system still holds: $(ls -A small)"
done
# A catalog written to a file system with a few KiB left fails the same way and leaves no
# temporary folder.
if ((${#full_env[@]})); then
  full_env=("${full_env[@]/#MERGEPIPE_FAULT_ENOSPC_AFTER=*/MERGEPIPE_FAULT_ENOSPC_AFTER=4096}")
else
  head -c 120K /dev/zero >small/filler
fi
expect_exit 4 "small/.*(No space left on device|disk full|write failed|HDF5)" \
  env "${full_env[@]}" "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" catalog --base fam/base \
  --experts fam/expert00 fam/expert01 --out small/cat --block-bytes 4KiB
expect_one_error
expect_no_catalog small/cat
rm -f small/filler
echo "ok: disk full"

# --- Permissions, as user nobody (root reads everything). The build tree may sit below a folder
# nobody cannot enter (a checkout in a 0700 temp folder), so nobody works in a world-traversable
# temp folder with its own copy of the binary; `perm` here links to it for the checks run as root.
# `nobody` owns only the folder it may write to.
if setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
  perm_root="$(mktemp -d)"
  chmod 755 "$perm_root"
  on_exit 'rm -rf "$perm_root"'
  cp "$MERGEPIPE" "$perm_root/mergepipe"
  as_nobody() {
    (cd "$perm_root" && setpriv --reuid=65534 --regid=65534 --clear-groups \
      env HOME="$perm_root/home" "$@")
  }
  mkdir -p "$perm_root/perm/out" "$perm_root/home" && ln -s "$perm_root/perm" perm
  cp -r fam perm/fam && chmod -R a+rX "$perm_root"
  chown 65534:65534 perm/out "$perm_root/home"
  (cd perm && write_config c.yaml linear fam 2)
  chmod a+r perm/c.yaml
  locked=perm/fam/expert01/model-00003-of-00004.safetensors
  chmod 000 "$locked"
  expect_exit 4 "perm/fam/expert01/model-00003-of-00004\.safetensors: cannot open: Permission denied" \
    as_nobody "$MPIEXEC" -np 2 --oversubscribe "$perm_root/mergepipe" catalog --base perm/fam/base \
    --experts perm/fam/expert00 perm/fam/expert01 --out perm/out/cat
  expect_one_error
  expect_no_catalog perm/out/cat
  expect_exit 4 "perm/fam/expert01/model-00003-of-00004\.safetensors: cannot open: Permission denied" \
    as_nobody "$MPIEXEC" -np 2 --oversubscribe "$perm_root/mergepipe" merge perm/c.yaml --full-read \
    --out perm/out/merged
  expect_one_error
  expect_no_output perm/out/merged
  chmod 644 "$locked"
  # An unreadable config, and an output folder nobody may write to.
  chmod 000 perm/c.yaml
  expect_exit 4 "perm/c\.yaml: cannot open: Permission denied" \
    as_nobody "$perm_root/mergepipe" merge perm/c.yaml --full-read --out perm/out/merged
  expect_one_error
  chmod 644 perm/c.yaml
  expect_exit 4 "perm/\.merged\.mergepipe-staging: cannot create staging folder: Permission denied" \
    as_nobody "$MPIEXEC" -np 2 --oversubscribe "$perm_root/mergepipe" merge perm/c.yaml --full-read \
    --out perm/merged
  expect_one_error
  expect_no_output perm/merged
  as_nobody "$MPIEXEC" -np 2 --oversubscribe "$perm_root/mergepipe" merge perm/c.yaml --full-read \
    --out perm/out/merged --quiet || fail "nobody cannot merge readable files"
  echo "ok: permissions"
else
  echo "SKIP permissions: setpriv cannot switch to user nobody here"
fi

# --- Read errors: the injector fails the first N reads of one expert shard with EIO.
shard="$(realpath fam/expert00/model-00004-of-00004.safetensors)"
eio() { # eio COUNT [RANK] command...: run with COUNT failing reads of $shard (on RANK only)
  local count="$1" rank_env=()
  shift
  [[ "$1" =~ ^[0-9]+$ ]] && { rank_env=(MERGEPIPE_FAULT_RANK="$1"); shift; }
  env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_EIO_FILE="$shard" MERGEPIPE_FAULT_EIO_COUNT="$count" \
    "${rank_env[@]}" ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" "$@"
}
# A few transient errors are retried: the merge succeeds with the clean run's bytes, whether they
# hit rank 0's catalog freshness check or rank 1's block reads.
eio 3 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat --out retried --quiet ||
  fail "3 transient read errors were not retried"
same_model_files retried clean
# (--schedule static: rank 1 surely reads that shard, the last, as in its fixed share.)
eio 3 1 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat --out retried1 \
  --schedule static --quiet || fail "3 transient read errors on rank 1 were not retried"
same_model_files retried1 clean
# A persistent error ends the job: rank 1's message (file and offset) is printed once, by rank 0.
expect_exit 4 "$shard: read of [0-9]+ bytes at offset [0-9]+ failed: Input/output error" \
  eio 1000 1 timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" merge c.yaml --catalog cat \
  --out failed --schedule static
expect_one_error
expect_no_output failed
expect_exit 4 "$shard: read of [0-9]+ bytes at offset [0-9]+ failed: Input/output error" \
  eio 1000 timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" catalog --check cat
expect_one_error
expect_exit 4 "$shard: read of [0-9]+ bytes at offset [0-9]+ failed: Input/output error" \
  eio 1000 timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$MERGEPIPE" catalog --base fam/base \
  --experts fam/expert00 --out cat2
expect_one_error
expect_no_catalog cat2
echo "ok: read errors"
echo "storage faults: ok"
