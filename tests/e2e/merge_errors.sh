#!/usr/bin/env bash
# Bad input to merge: each case exits with its code and one clear line, and no folder appears
# at the target (or an existing one is left untouched).
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 4 --out fam >/dev/null
"$MERGEPIPE" catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2

expect_exit 2 "budget" run_np 2 merge c.yaml --catalog cat --budget 12XB --out o1
expect_no_output o1
expect_exit 2 "not a size|must be a size" "$MERGEPIPE" merge c.yaml --catalog cat --max-shard-size 10% --out o2
expect_no_output o2
expect_exit 2 "catalog" "$MERGEPIPE" merge c.yaml --out o3
expect_exit 2 "--input-io must be auto, direct or buffered" "$MERGEPIPE" merge c.yaml --catalog cat --input-io sideways --out o3
expect_no_output o3
expect_exit 2 "--output-io must be auto, direct or buffered" "$MERGEPIPE" merge c.yaml --catalog cat --output-io sideways --out o3
expect_no_output o3
expect_exit 2 "--expert-piece-size '10%' must be a size" "$MERGEPIPE" merge c.yaml --catalog cat --expert-piece-size 10% --out o3
expect_no_output o3
expect_exit 2 "--schedule must be dynamic or static" "$MERGEPIPE" merge c.yaml --catalog cat --schedule random --out o3
expect_no_output o3
expect_exit 2 "--threads, --io-threads and --prefetch must be >= 0" "$MERGEPIPE" merge c.yaml --catalog cat --io-threads=-1 --out o3
expect_no_output o3
printf 'merge_method: linear\nbase_model: fam/base\nmodels: [fam/expert00]\nbogus_key: 1\n' >bad.yaml
expect_exit 2 "bogus_key" run_np 2 merge bad.yaml --catalog cat --out o4
expect_no_output o4
printf 'merge_method: linear\nbase_model: fam/base\nmodels: [fam/expert00, fam/expert03]\n' >missing.yaml
expect_exit 2 "expert03" "$MERGEPIPE" merge missing.yaml --catalog cat --out o5
expect_no_output o5

# An existing target is refused and left as it was; --force replaces it.
run_np 2 merge c.yaml --catalog cat --budget 50% --out done --quiet
before=$(cat done/*.safetensors | md5sum)
expect_exit 2 "already exists" run_np 2 merge c.yaml --catalog cat --out done
[[ "$(cat done/*.safetensors | md5sum)" == "$before" ]] || fail "the existing output was modified"
run_np 2 merge c.yaml --catalog cat --budget 100% --out done --force --quiet
[[ "$(cat done/*.safetensors | md5sum)" != "$before" ]] || fail "--force did not replace the output"
"$MERGEPIPE" verify done >/dev/null

# A changed expert makes the catalog stale: exit 3, nothing written.
shard="$(ls fam/expert01/*.safetensors | head -1)"
printf '\x01' | dd of="$shard" bs=1 seek=$(($(stat -c %s "$shard") - 1)) conv=notrunc status=none
touch -d '2001-01-01' "$shard"
expect_exit 3 "stale catalog" run_np 2 merge c.yaml --catalog cat --out o6
expect_no_output o6

# A truncated expert during --full-read (no catalog to catch it first): exit 3, nothing written.
truncate -s -64 "$shard"
expect_exit 3 "expert01" run_np 2 merge c.yaml --full-read --out o7
expect_no_output o7
echo "merge errors: ok"
