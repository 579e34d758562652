#!/usr/bin/env bash
# The output folder as mergekit writes it (docs/mergekit.md, "The output folder"): a README.md
# model card, the config as given in mergekit_config.yml, the base's tokenizer and processor
# files; --no-copy-tokenizer and --no-write-model-card leave theirs out; a replay writes the
# same files byte for byte.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 17 --out fam >/dev/null
printf '{"processor_class": "Synthetic"}\n' >fam/base/preprocessor_config.json
printf '{"image_size": 4}\n' >fam/base/video_preprocessor_config.json
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
# A config in mergekit's own layout and comments, kept byte for byte.
cat >ties.yml <<'YAML'
# from a mergekit user
models:
  - model: fam/expert00
    parameters:
      density: 0.5
      weight: 0.5
  - model: fam/expert01
    parameters:
      density: 0.5
      weight: 0.5
merge_method: ties
base_model: fam/base
parameters:
  normalize: false
  int8_mask: true
dtype: float16
YAML

run_np 2 merge ties.yml merged --catalog cat --budget 40% --quiet
cmp -s ties.yml merged/mergekit_config.yml || fail "mergekit_config.yml is not the config as given"
for f in tokenizer_config.json generation_config.json preprocessor_config.json \
  video_preprocessor_config.json; do
  cmp -s "fam/base/$f" "merged/$f" || fail "$f not carried from the base"
done
"$PYTHON" - merged/README.md ties.yml merged/mergepipe.manifest.json <<'PY'
import json, sys
card, config, manifest = open(sys.argv[1]).read(), open(sys.argv[2]).read(), json.load(open(sys.argv[3]))
front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
for line in ("library_name: transformers", "- mergekit", "- merge", "- mergepipe", "fam/base\"",
             "fam/expert00\"", "fam/expert01\""):
    assert line in front, ("front matter lacks", line, front)
assert body.startswith("# merged\n"), body[:40]
assert "merged using the ties merge method using " in body and "fam/base as a base" in body, body
assert "(weight 0.5, density 0.5)" in body, body
assert manifest["plan_hash"] in body, "the card does not name the plan"
assert "```yaml\n" + config + "```\n" in body, "the card does not hold the config as given"
assert "of the experts'" in body and "(an estimate)" in body, body
print("model card: ok")
PY
"$MERGEPIPE" replay merged/mergepipe.manifest.json --out again --quiet
for f in README.md mergekit_config.yml; do
  cmp -s "merged/$f" "again/$f" || fail "the replay wrote another $f"
done
same_model_files merged again

run_np 1 merge ties.yml bare --catalog cat --budget 40% --no-copy-tokenizer --no-write-model-card --quiet
[[ ! -e bare/README.md && ! -e bare/tokenizer_config.json ]] || fail "bare output holds: $(ls bare)"
[[ -e bare/generation_config.json && -e bare/preprocessor_config.json ]] ||
  fail "--no-copy-tokenizer dropped more than the tokenizer: $(ls bare)"
cmp -s merged/model.safetensors bare/model.safetensors || fail "the folder options changed the tensors"
"$MERGEPIPE" replay bare/mergepipe.manifest.json --out bare-again --quiet
[[ ! -e bare-again/README.md && ! -e bare-again/tokenizer_config.json ]] ||
  fail "the replay of a bare output wrote: $(ls bare-again)"
expect_exit 2 "merge: --copy-tokenizer and --no-copy-tokenizer contradict each other" \
  run_np 1 merge ties.yml x --catalog cat --copy-tokenizer --no-copy-tokenizer

# tokenizer_source: a model's tokenizer instead of the base's; chat_template; out_dtype beside a
# compute dtype (a warning: the arithmetic is float32 here).
printf '{"tokenizer_class": "Expert01Tokenizer", "chat_template": "{{ expert01 }}"}\n' \
  >fam/expert01/tokenizer_config.json
printf 'EXPERT01 TOKENS\n' >fam/expert01/tokenizer.json
{ sed '/^dtype/d' ties.yml; echo "tokenizer_source: fam/expert01"; echo "dtype: bfloat16"
  echo "out_dtype: float32"; } >tok.yml
run_np 2 merge tok.yml tok --catalog cat --budget 40% >tok.txt 2>&1
grep -q "'dtype' (bfloat16) changes nothing" tok.txt || fail "no dtype warning: $(cat tok.txt)"
cmp -s fam/expert01/tokenizer_config.json tok/tokenizer_config.json || fail "tokenizer_config.json not expert01's"
cmp -s fam/expert01/tokenizer.json tok/tokenizer.json || fail "tokenizer.json not expert01's"
grep -q '"torch_dtype": "float32"' tok/config.json || fail "out_dtype not written: $(cat tok/config.json)"
"$PYTHON" - tok <<'PY'
import json, struct, sys
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
assert dtypes == {"F32"}, dtypes
PY
"$MERGEPIPE" replay tok/mergepipe.manifest.json --out tok-again --quiet
same_model_files tok tok-again
# chat_template: auto takes the template most models carry (expert01's is the only one here), a
# template string is written as given.
{ cat ties.yml; echo "chat_template: auto"; } >auto.yml
run_np 1 merge auto.yml auto --catalog cat --budget 40% --quiet
[[ "$(json_get auto/tokenizer_config.json chat_template)" == "{{ expert01 }}" ]] ||
  fail "chat_template auto: $(cat auto/tokenizer_config.json)"
[[ "$(json_get auto/tokenizer_config.json tokenizer_class)" == Qwen2Tokenizer ]] ||
  fail "chat_template auto replaced the base's tokenizer"
{ cat ties.yml; echo "chat_template: \"{% for m in messages %}{{ m['content'] }}{% endfor %}\""; } >tmpl.yml
run_np 1 merge tmpl.yml tmpl --catalog cat --budget 40% --quiet
[[ "$(json_get tmpl/tokenizer_config.json chat_template)" == "{% for m in messages %}{{ m['content'] }}{% endfor %}" ]] ||
  fail "chat_template string: $(cat tmpl/tokenizer_config.json)"
# What cannot be honoured without resizing embeddings is refused before any merging.
{ cat ties.yml; echo "tokenizer_source: union"; } >union.yml
expect_exit 2 "tokenizer_source: union: the tokenizer of '.*fam/expert01' differs from the base's" \
  "$MERGEPIPE" merge union.yml u --catalog cat
expect_no_output u
{ cat ties.yml; echo "chat_template: vicuna"; } >badtmpl.yml
expect_exit 2 "badtmpl\.yml:[0-9]+: key 'chat_template': unknown chat template 'vicuna'" \
  "$MERGEPIPE" merge badtmpl.yml u --catalog cat
{ cat ties.yml; printf 'tokenizer:\n  source: base\n  tokens:\n    "<|new|>": {source: base}\n'; } >tokens.yml
expect_exit 2 "key 'tokenizer.tokens': adding or editing tokens .* not supported yet" \
  "$MERGEPIPE" merge tokens.yml u --catalog cat
echo "output folder: ok"
