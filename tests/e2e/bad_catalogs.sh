#!/usr/bin/env bash
# Catalogs that do not describe the inputs (docs/reliability.md, "Bad catalogs"): a stale catalog
# (an expert rewritten, replaced or deleted after cataloguing), a catalog of another family (same
# architecture, other weights; another architecture), and damaged catalog files. Merges on 2 ranks
# exit 3 with one line naming the file, and leave no output or staging folder; a refused catalog
# extension leaves the catalog as it was.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 5 --out fam >/dev/null
# Same preset, other seed: the same tensor names, shapes and headers (so the same family id), other
# weights. And another architecture.
"$MERGEPIPE" synth --preset tiny --experts 1 --seed 6 --out twin >/dev/null
"$MERGEPIPE" synth --preset tiny-llama --experts 1 --seed 6 --out llama >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml linear fam 2
cp -r cat cat.orig

# merge_refused PATTERN [CATALOG] [CONFIG]: a 2-rank merge exits 3 naming PATTERN, no output.
merge_refused() {
  local pattern="$1" catalog="${2:-cat}" config="${3:-c.yaml}"
  expect_exit 3 "$pattern" run_np 2 merge "$config" --catalog "$catalog" --out out
  expect_one_error
  expect_no_output out
}

# Another family's base with this catalog, and extending this catalog from another base.
printf 'merge_method: linear\nbase_model: twin/base\nmodels: [twin/expert00]\n' >twin.yaml
merge_refused "config base_model '.*/twin/base' is not the catalog's base '.*/fam/base' \(a catalog of another family\?\)" \
  cat twin.yaml
printf 'merge_method: linear\nbase_model: llama/base\nmodels: [llama/expert00]\n' >llama.yaml
merge_refused "config base_model '.*/llama/base' is not the catalog's base" cat llama.yaml
expect_exit 3 "catalog: cat was built from the base .*/fam/base, not .*/twin/base \(a catalog of another family\?\)" \
  run_np 2 catalog --base twin/base --experts twin/expert00 --out cat
expect_one_error
diff -r cat cat.orig >/dev/null || fail "a refused extension changed the catalog"
expect_exit 3 "not the base this catalog was built from|was built from the base" \
  run_np 2 catalog --base llama/base --experts llama/expert00 --out cat
diff -r cat cat.orig >/dev/null || fail "a refused extension changed the catalog"
echo "ok: catalog of another family"

# Stale: an expert shard rewritten in place (same size, new bytes, new mtime).
shard=fam/expert01/model-00002-of-00004.safetensors
cp -p "$shard" shard.orig
"$PYTHON" -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(-2, 2)
    b = f.read(1)
    f.seek(-2, 2)
    f.write(bytes([b[0] ^ 0x40]))" "$shard"
merge_refused "stale catalog: .*/fam/expert01/model-00002-of-00004\.safetensors changed since it was catalogued \(size/mtime/header differ: mtime\)"
expect_exit 3 "stale catalog: .*/fam/expert01/model-00002-of-00004\.safetensors changed" \
  run_np 2 catalog --check cat
# A merge that does not use the changed expert reads none of it: it runs, on the same catalog.
write_config only0.yaml linear fam 1
run_np 2 merge only0.yaml --catalog cat --out out0 --quiet ||
  fail "a merge of expert00 was refused because expert01 changed"
[[ -f out0/mergepipe.manifest.json ]] || fail "the merge of expert00 published nothing"
rm -rf out0
# Replaced by a file with another header (an F16 copy of one tensor's header entry).
"$PYTHON" "$TESTS_DIR/python/corrupt_checkpoint.py" set "$shard" model.layers.0.mlp.down_proj.weight \
  dtype '"F16"' >/dev/null
merge_refused "stale catalog: .*/fam/expert01/model-00002-of-00004\.safetensors changed since it was catalogued \(size/mtime/header differ: .*header\)"
# Deleted.
rm "$shard"
merge_refused "stale catalog: .*/fam/expert01/model-00002-of-00004\.safetensors changed since it was catalogued \(size/mtime/header differ: the file is missing\)"
cp -p shard.orig "$shard"
run_np 2 catalog --check cat >/dev/null || fail "restoring the shard did not make the catalog fresh"
echo "ok: stale catalog"

# Damaged catalog files.
cp -r cat.orig bad && echo '{"format": ' >bad/catalog.json
merge_refused "bad/catalog\.json: malformed catalog summary: .*parse error" bad
rm -rf bad && cp -r cat.orig bad && truncate -s 1000 bad/catalog.h5
merge_refused "bad/catalog\.h5: HDF5 cannot open it \(damaged or truncated catalog\?\)" bad
rm -rf bad && cp -r cat.orig bad && rm bad/catalog.h5
merge_refused "bad/catalog\.h5: catalog file is missing" bad
rm -rf bad && cp -r cat.orig bad && cp twin/base/model-00001-of-00004.safetensors bad/catalog.h5
merge_refused "bad/catalog\.h5: not an HDF5 file" bad
echo "ok: damaged catalog files"
echo "bad catalogs: ok"
