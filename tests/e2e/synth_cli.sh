#!/usr/bin/env bash
# mergepipe synth: the same (preset, seed, K) gives byte-identical families whatever --threads,
# the folders have the Hugging Face layout, and bad arguments fail with exit code 2.
set -euo pipefail
: "${MERGEPIPE:?}" "${TEST_SCRATCH:?}"
rm -rf "$TEST_SCRATCH"
mkdir -p "$TEST_SCRATCH"
cd "$TEST_SCRATCH"

fail() { echo "FAIL: $*" >&2; exit 1; }

"$MERGEPIPE" synth --preset tiny --experts 4 --seed 7 --out "$TEST_SCRATCH/a" --threads 1 >a.log
"$MERGEPIPE" synth --preset tiny --experts 4 --seed 7 --out "$TEST_SCRATCH/b" --threads 3 >b.log
grep -q "files" a.log || fail "no summary printed: $(cat a.log)"

# Same file list, same bytes.
(cd a && find . -type f | sort) >a.files
(cd b && find . -type f | sort) >b.files
cmp a.files b.files || fail "different file lists"
while read -r f; do
  cmp "a/$f" "b/$f" || fail "$f differs between --threads 1 and --threads 3"
done <a.files

# Layout: base + expert00..03, each a sharded HF folder with its small files; family.json.
for m in base expert00 expert01 expert02 expert03; do
  d="a/$m"
  [[ -d "$d" ]] || fail "missing folder $m"
  for f in config.json tokenizer_config.json generation_config.json model.safetensors.index.json; do
    [[ -s "$d/$f" ]] || fail "$m/$f missing"
  done
  shards=$(ls "$d" | grep -c '^model-[0-9]\{5\}-of-[0-9]\{5\}\.safetensors$' || true)
  ((shards >= 2)) || fail "$m: expected several shards, found $shards"
  ls "$d" | grep -q '\.tmp$' && fail "$m: temporary file left behind"
  # Every shard named by the index exists.
  grep -o '"model-[0-9]*-of-[0-9]*\.safetensors"' "$d/model.safetensors.index.json" | tr -d '"' | sort -u |
    while read -r s; do [[ -f "$d/$s" ]] || fail "$m: index names missing shard $s"; done
done
[[ ! -e a/expert04 ]] || fail "unexpected fifth expert"
[[ -s a/family.json ]] || fail "family.json missing"
grep -q '"preset": "tiny"' a/family.json || fail "family.json does not name the preset"
grep -q '"kind": "lora"' a/family.json || fail "family.json does not record the expert kinds"
ls -a "$TEST_SCRATCH" | grep -q staging && fail "staging folder left behind"

# Independent check of the files with Python: valid safetensors headers (reference writer rules),
# index consistent with the shards, the stored tied lm_head equal to the embedding, and the lora
# expert (expert01) differing from the base only in q_proj / v_proj.
"${PYTHON:-/usr/bin/python3}" - "$TEST_SCRATCH/a" <<'PY'
import json, os, struct, sys
root = sys.argv[1]

def load(folder):
    index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        path = os.path.join(folder, shard)
        data = open(path, "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        assert n % 8 == 0, (path, "header not padded to 8")
        header = json.loads(data[8:8 + n])
        assert header.pop("__metadata__") == {"format": "pt"}, path
        end = 0
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = t["data_offsets"]
            assert b == end, (path, name, "hole or overlap")
            count = 1
            for d in t["shape"]:
                count *= d
            assert e - b == count * 2 and t["dtype"] == "BF16", (path, name)
            assert index["weight_map"][name] == shard, (path, name)
            tensors[name] = data[8 + n + b:8 + n + e]
            end = e
        assert 8 + n + end == len(data), (path, "trailing bytes")
    assert set(tensors) == set(index["weight_map"]), folder
    assert index["metadata"]["total_size"] == sum(len(v) for v in tensors.values())
    return tensors

base = load(os.path.join(root, "base"))
assert len(base) == 25, len(base)
assert base["lm_head.weight"] == base["model.embed_tokens.weight"], "tied lm_head differs"
family = json.load(open(os.path.join(root, "family.json")))
assert [e["kind"] for e in family["experts"]] == ["full", "lora", "rl", "partial"], family["experts"]
for e in family["experts"]:
    expert = load(os.path.join(root, e["name"]))
    changed = {k for k in base if expert[k] != base[k]}
    assert changed == set(e["changed_tensors"]), (e["name"], sorted(changed ^ set(e["changed_tensors"])))
    if e["kind"] == "lora":
        assert changed == {k for k in base if "q_proj" in k or "v_proj" in k}, sorted(changed)
    if e["kind"] == "full":
        assert len(changed) >= 20, len(changed)
PY

# A different seed changes the weights; the same seed into an existing family needs --force.
"$MERGEPIPE" synth --preset tiny --experts 4 --seed 8 --out "$TEST_SCRATCH/c" >/dev/null
cmp -s a/base/model-00001-of-*.safetensors c/base/model-00001-of-*.safetensors &&
  fail "seed 8 gave the same base as seed 7"
set +e
"$MERGEPIPE" synth --preset tiny --experts 4 --seed 7 --out "$TEST_SCRATCH/a" >/dev/null 2>exists.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "existing --out: exit code $rc, expected 2"
grep -q -- "--force" exists.err || fail "existing --out: message does not mention --force: $(cat exists.err)"
"$MERGEPIPE" synth --preset tiny --experts 2 --seed 7 --out "$TEST_SCRATCH/a" --force >/dev/null
[[ -d a/expert01 && ! -e a/expert02 ]] || fail "--force did not replace the family"

# A bad preset name: exit code 2 and a message naming it.
set +e
"$MERGEPIPE" synth --preset no-such-model --experts 2 --seed 1 --out "$TEST_SCRATCH/bad" >bad.out 2>bad.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "bad preset: exit code $rc, expected 2"
grep -q "no-such-model" bad.err || fail "bad preset: message does not name it: $(cat bad.err)"
[[ ! -e "$TEST_SCRATCH/bad" ]] || fail "bad preset: output folder created"

# Other bad arguments are usage errors too.
for args in "--dtype int8" "--kinds full,sft" "--max-shard-size 10%" "--layers 0" "--threads 0" "--vocab 16"; do
  set +e
  # shellcheck disable=SC2086
  "$MERGEPIPE" synth --preset tiny --experts 1 --out "$TEST_SCRATCH/bad" $args >/dev/null 2>&1
  rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "synth $args: exit code $rc, expected 2"
done

# fp32, unsharded when one shard is large enough, and the Llama-like tiny preset.
"$MERGEPIPE" synth --preset tiny-llama --experts 1 --seed 3 --dtype fp32 --max-shard-size 1GB \
  --out "$TEST_SCRATCH/single" >/dev/null
[[ -f single/base/model.safetensors && ! -e single/base/model.safetensors.index.json ]] ||
  fail "single-shard folder layout"
grep -q '"torch_dtype": "float32"' single/expert00/config.json || fail "config.json dtype"

echo "synth_cli: all checks passed"
