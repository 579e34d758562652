#!/usr/bin/env bash
# --verify-reads: a file changed after cataloguing in a way its identity does not show (same size,
# same mtime, same header) is caught by the catalog's block hashes: exit 3 naming the file and
# the byte range, nothing published. Expert files and the base are both checked; `first` checks
# the first block read from each file, `all` every block, `off` none.
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
flip "$shard" "$(data_offset "$shard" 0.5)"
"$MERGEPIPE" catalog --check cat >/dev/null || fail "the identity check should not see this change"
expect_exit 3 "$shard bytes [0-9]+\.\.[0-9]+: block [0-9]+ of tensor '.*' does not match the catalog" \
  run_np 2 merge lin.yaml --catalog cat --out bad --verify-reads all
[[ ! -e bad && ! -e .bad.mergepipe-staging ]] || fail "a merge with a bad read left output behind"
# off: the merge goes through, and the changed byte reaches the output.
run_np 2 merge lin.yaml --catalog cat --out unchecked --quiet --verify-reads off
"$MERGEPIPE" verify unchecked --against clean --json >diff.json
"$PYTHON" -c "import json; d = json.load(open('diff.json')); assert d['max_abs'] > 0, d" ||
  fail "the changed expert byte did not reach the unchecked output"
restore "$shard"
run_np 2 merge lin.yaml --catalog cat --out restored --quiet --verify-reads all
same_model_files clean restored

# The base is checked too.
base_shard="$(ls fam/base/*.safetensors | head -1)"
flip "$base_shard" "$(data_offset "$base_shard" 0.5)"
expect_exit 3 "$base_shard bytes .* does not match the catalog" \
  run_np 2 merge lin.yaml --catalog cat --out bad-base --verify-reads all
restore "$base_shard"

# first (the default): with one rank and one read at a time the first block read from a file is
# the block at the start of its data, so a change there is caught and one elsewhere is not.
flip "$shard" "$(data_offset "$shard" 0)"
expect_exit 3 "$shard bytes .* does not match the catalog" \
  run_np 1 merge lin.yaml --catalog cat --out first-bad --io-threads 1
restore "$shard"
flip "$shard" "$(data_offset "$shard" 0.9)"
run_np 1 merge lin.yaml --catalog cat --out first-unseen --io-threads 1 --quiet
restore "$shard"
[[ "$(json_get first-unseen/mergepipe.manifest.json verify_reads)" == first ]] ||
  fail "the manifest does not record the verification mode"
echo "verify reads: ok"
