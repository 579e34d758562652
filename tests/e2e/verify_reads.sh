#!/usr/bin/env bash
# A file changed after cataloguing with the same size, header and mtime (put back with touch -r)
# is caught: its inode change time moved, so it is read and compared block by block with the
# catalog's hashes: exit 3 naming the file and the block, nothing published, at every
# --verify-reads level. The base is checked too. The per-read check of --verify-reads (storage
# returning other bytes than the file holds) is tested last, with a fault injected into reads.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --kinds full --seed 12 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat --block-bytes 4096 >/dev/null
write_config lin.yaml linear fam 2
run_np 2 merge lin.yaml --catalog cat --out clean --quiet --verify-reads all

# flip FILE OFFSET: changes one byte in place, keeping size and mtime (cp -p keeps a pristine copy).
flip() {
  local file="$1" offset="$2" byte
  [[ -f "$file.orig" ]] || cp -p "$file" "$file.orig"
  byte=$(dd if="$file" bs=1 skip="$offset" count=1 status=none | od -An -tu1 | tr -d ' ')
  printf "\\x$(printf %02x $(((byte + 1) % 256)))" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
  touch -r "$file.orig" "$file"
}
restore() { mv "$1.orig" "$1"; }
# data_offset FILE FRACTION: an offset FRACTION (0..1) of the way through the data section.
data_offset() {
  "$PYTHON" -c "
import os, struct, sys
f = sys.argv[1]
begin = 8 + struct.unpack('<Q', open(f, 'rb').read(8))[0]
print(begin + int((os.path.getsize(f) - begin) * float(sys.argv[2])))" "$1" "$2"
}

shard="$(ls fam/expert01/*.safetensors | head -1)"
stale="stale catalog: .*$shard changed since it was catalogued \(block [0-9]+ of tensor '.*' holds other bytes, though size, mtime and header are as catalogued\)"
# The inode change time gives the edit away (touch -r puts back the mtime only): the file is read
# and its blocks compared with the catalog's hashes, by catalog --check, plan and every merge.
flip "$shard" "$(data_offset "$shard" 0.5)"
expect_exit 3 "$stale" "$MERGEPIPE" catalog --check cat
expect_exit 3 "$stale" "$MERGEPIPE" plan lin.yaml --catalog cat
for np in 1 2; do
  for level in first off all; do
    expect_exit 3 "$stale" run_np "$np" merge lin.yaml --catalog cat --out bad --verify-reads "$level"
    [[ ! -e bad && ! -e .bad.mergepipe-staging ]] || fail "a merge of a changed file left output behind"
  done
done
# A file put back (new inode change time, the catalogued bytes) is read once per check and fresh.
restore "$shard"
"$MERGEPIPE" catalog --check cat >/dev/null || fail "a restored file is not fresh"
run_np 2 merge lin.yaml --catalog cat --out restored --quiet --verify-reads all
same_model_files clean restored

# The base is checked too.
base_shard="$(ls fam/base/*.safetensors | head -1)"
flip "$base_shard" "$(data_offset "$base_shard" 0.5)"
expect_exit 3 "stale catalog: .*$base_shard changed since it was catalogued \(block" \
  run_np 2 merge lin.yaml --catalog cat --out bad-base --verify-reads all
restore "$base_shard"
run_np 1 merge lin.yaml --catalog cat --out first-ok --io-threads 1 --quiet
[[ "$(json_get first-ok/mergepipe.manifest.json verify_reads)" == reads ]] ||
  fail "the manifest does not record the verification mode"
echo "verify reads: ok"

# Storage that returns other bytes than the file holds (the file itself unchanged, so its
# identity checks pass): fault_inject flips one byte of what a read returns. The default
# level, reads, hashes every block the merge reads, so the merge fails with exit 3 naming the
# file, the byte range and the block, and publishes nothing; off merges the wrong byte in.
# A fresh catalog first: the restored file's inode change time moved, which alone would have it
# read and checked in full before the merge (the path above).
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat2 --block-bytes 4096 >/dev/null
flip_at="$(( $(data_offset "$shard" 0.5) | 1 ))"  # a high byte: an exponent bit, a value halved or doubled
flip_env=(env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_FLIP_FILE="$(readlink -f "$shard")"
  MERGEPIPE_FAULT_FLIP_OFFSET="$flip_at" ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0")
for np in 1 2; do
  expect_exit 3 "$shard bytes [0-9]+\.\.[0-9]+: block [0-9]+ of tensor '.*' does not match the catalog \(hash [0-9a-f]+, catalogued [0-9a-f]+\): the file changed after it was catalogued \(rebuild the catalog\) or the storage returned wrong data" \
    "${flip_env[@]}" "$MPIEXEC" -np "$np" --oversubscribe "$MERGEPIPE" merge lin.yaml --catalog cat2 --out bad
  expect_one_error
  expect_no_output bad
done
"${flip_env[@]}" "$MERGEPIPE" merge lin.yaml --catalog cat2 --out unchecked --verify-reads off --quiet
"$MERGEPIPE" verify unchecked --against clean --max-rel-l2 0 >/dev/null 2>&1 &&
  fail "the flipped byte did not reach the unchecked merge (the fault did not fire)"
echo "verify reads, storage returning wrong data: ok"
