#!/usr/bin/env bash
# `mergepipe catalog` end to end on 2 ranks: build, the JSON summary and HDF5 file, extension
# reading only the new expert, rejection of another family's expert, the block size fixed once
# built, and stale-catalog detection through `catalog --check` (exit 3).
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 3 --seed 1 --out fam >/dev/null ||
  fail "mergepipe synth is needed by this test"

# Build with two experts.
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat \
  --block-bytes 64KiB >build.txt || fail "catalog build failed"
cat build.txt
[[ -f cat/catalog.h5 && -f cat/catalog.json ]] || fail "catalog folder lacks its files"
[[ -z "$(ls -A . | grep '^\.cat\.tmp')" ]] || fail "a temporary folder was left behind"

"$PYTHON" - "$TEST_SCRATCH" <<'EOF' || fail "catalog.json check"
import json, os, sys
root = sys.argv[1]
d = json.load(open(os.path.join(root, "cat/catalog.json")))
assert d["format"] == "mergepipe-catalog-1", d["format"]
assert d["block_bytes"] == 65536, d["block_bytes"]
assert d["expert_count"] == 2 and len(d["experts"]) == 2, d["expert_count"]
assert len(d["family_id"]) == 32
assert d["base"]["dir"] == os.path.realpath(os.path.join(root, "fam/base")), d["base"]["dir"]
for k, e in enumerate(d["experts"]):
    assert e["dir"] == os.path.realpath(os.path.join(root, "fam/expert%02d" % k)), e["dir"]
    assert e["group"] == "/experts/%03d" % k
    for f in e["files"]:
        assert f["size"] == os.path.getsize(f["path"]), f
        assert os.stat(f["path"]).st_mtime_ns == f["mtime_ns"], f
shards = [n for n in os.listdir(os.path.join(root, "fam/base")) if n.endswith(".safetensors")]
assert len(d["base"]["files"]) == len(shards), (d["base"]["files"], shards)
t = d["totals"]
per_ckpt = t["tensor_bytes_per_checkpoint"]
assert t["expert_bytes"] == 2 * per_ckpt, t
size = sum(os.path.getsize(os.path.join(root, "cat", n)) for n in ("catalog.h5", "catalog.json"))
assert t["catalog_bytes"] == size, (t["catalog_bytes"], size)
assert abs(t["catalog_fraction"] - size / t["family_bytes"]) < 1e-12
print("catalog.json ok: %d blocks, catalog %d bytes = %.3f%% of %d family bytes"
      % (d["block_count"], size, 100 * size / t["family_bytes"], t["family_bytes"]))
EOF
per_ckpt=$(json_get cat/catalog.json totals.tensor_bytes_per_checkpoint)
grep -q "(${per_ckpt} + $((2 * per_ckpt)) bytes)" build.txt ||
  fail "the build did not read the base once and each expert once"
"$PYTHON" "$TESTS_DIR/python/read_catalog.py" cat >h5.txt || fail "h5py cannot read catalog.h5"
grep -q "^/experts/001/block_octaves ($(json_get cat/catalog.json block_count), 48) float32$" h5.txt ||
  fail "catalog.h5 lacks /experts/001/block_octaves"
"$PYTHON" -c "
import h5py, sys
f = h5py.File('cat/catalog.h5', 'r')
print(' '.join('%x' % h for h in f['experts/000/block_hash'][...]))
print(' '.join('%x' % h for h in f['experts/001/block_hash'][...]))" >hashes-before.txt

# Adding an expert reads only it (and the base); expert00 is already there.
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert02 --out cat >extend.txt ||
  fail "extension failed"
cat extend.txt
grep -q "already catalogued: fam/expert00" extend.txt || fail "expert00 not reported as present"
grep -q "(${per_ckpt} + ${per_ckpt} bytes)" extend.txt || fail "extension read more than one expert"
[[ "$(json_get cat/catalog.json expert_count)" -eq 3 ]] || fail "extension did not add expert02"
"$PYTHON" -c "
import h5py
f = h5py.File('cat/catalog.h5', 'r')
print(' '.join('%x' % h for h in f['experts/000/block_hash'][...]))
print(' '.join('%x' % h for h in f['experts/001/block_hash'][...]))" >hashes-after.txt
cmp -s hashes-before.txt hashes-after.txt || fail "extension changed the existing experts"

# Nothing new: no rewrite.
run_np 2 catalog --base fam/base --experts fam/expert01 --out cat >again.txt
grep -q "nothing to add" again.txt || fail "re-adding a catalogued expert did something"

# The block size is fixed once the catalog exists.
expect_exit 2 "built with --block-bytes 65536; pass --force" \
  run_np 2 catalog --base fam/base --experts fam/expert02 --out cat --block-bytes 1MiB

# An expert of another family (other tensor names and shapes) is rejected, naming the mismatch.
"$MERGEPIPE" synth --preset tiny-llama --experts 1 --seed 2 --out other >/dev/null
expect_exit 3 "other/expert00/.*\.safetensors: tensor '[^']+' (is missing|has shape|has dtype|is not in the base)|other/expert00: tensor '[^']+' is missing" \
  run_np 2 catalog --base fam/base --experts other/expert00 --out cat
[[ "$(json_get cat/catalog.json expert_count)" -eq 3 ]] || fail "a rejected expert changed the catalog"

# Usage errors.
expect_exit 2 "--out is required" "$MERGEPIPE" catalog --base fam/base --experts fam/expert00
# --experts with no folder must not take the next option as one.
expect_exit 2 "catalog: --experts needs at least one value before --out" \
  "$MERGEPIPE" catalog --base fam/base --experts --out cat-none
[[ ! -e cat-none ]] || fail "catalog --experts --out cat-none created cat-none"
mkdir -p notacatalog && touch notacatalog/keep
expect_exit 2 "not a catalog folder" "$MERGEPIPE" catalog --base fam/base --experts fam/expert00 \
  --out notacatalog --force
[[ -f notacatalog/keep ]] || fail "a foreign folder was replaced"

# Freshness: unchanged, then an expert shard rewritten in place.
run_np 2 catalog --check cat >check.txt || fail "fresh catalog reported stale"
grep -q "is fresh" check.txt || fail "catalog --check printed no verdict"
shard=$(ls fam/expert01/*.safetensors | head -1)
sleep 0.02
"$PYTHON" -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(-2, 2)
    b = f.read(2)
    f.seek(-2, 2)
    f.write(bytes([b[0] ^ 0x01, b[1]]))" "$shard"
expect_exit 3 "stale catalog: .*fam/expert01/$(basename "$shard") changed since it was catalogued" \
  run_np 2 catalog --check cat
expect_exit 3 "stale catalog" "$MERGEPIPE" catalog --check cat
# Extending a stale catalog is refused too; --force rebuilds it.
expect_exit 3 "stale catalog" run_np 2 catalog --base fam/base --experts fam/expert02 --out cat
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat --force \
  --block-bytes 64KiB >/dev/null || fail "--force rebuild failed"
run_np 2 catalog --check cat >/dev/null || fail "rebuilt catalog is not fresh"
[[ "$(json_get cat/catalog.json expert_count)" -eq 2 ]] || fail "--force did not rebuild"
echo "catalog_cli: ok"
