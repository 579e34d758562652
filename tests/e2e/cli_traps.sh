#!/usr/bin/env bash
# The command-line traps a mergekit user walks into (docs/reliability.md, "Bad configs and
# options"; docs/mergekit.md): each is a usage error (exit 2) with one line that says what to do,
# nothing is written; and mergekit's spellings that mean the same here work.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 9 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml ties fam 2

# refused NP PATTERN merge-args...: exit 2, one error line, no output folder at out.
refused() {
  local np="$1" pattern="$2"
  shift 2
  expect_exit 2 "$pattern" run_np "$np" merge "$@"
  expect_one_error
  expect_no_output out
}

for np in 1 2; do
  # A bare number is bytes: below one block it would read next to nothing.
  refused "$np" "budget '50' is 50 bytes, less than one block of the catalog \(4194304 bytes\), so next to nothing would be read; for a share of the full read write '50%'" \
    c.yaml out --catalog cat --budget 50
  refused "$np" "budget '150%' is above 100%" c.yaml out --catalog cat --budget 150%
  for flag in "--budget 10%" "--catalog cat" "--max-error 1"; do
    # shellcheck disable=SC2086 # the flag and its value are two words
    refused "$np" "merge: --full-read reads every expert block without a catalog, so ${flag%% *} has no meaning with it" \
      c.yaml out --full-read $flag
  done
  refused "$np" "fam: is a folder, not a config file" fam out --catalog cat
  refused "$np" "merge: the output folder is missing \(merge CONFIG OUT, or --out OUT\)" c.yaml --catalog cat
  refused "$np" "merge: --cuda: MergePipe merges on CPUs" c.yaml out --catalog cat --cuda
  refused "$np" "merge: --lazy-unpickle: MergePipe reads safetensors checkpoints only" c.yaml out --catalog cat --lazy-unpickle
  refused "$np" "merge: --out-shard-size '5X': expected a whole number with an optional K, M or B" \
    c.yaml out --catalog cat --out-shard-size 5X
done
# A budget in the config is held to the same rules.
{ cat c.yaml; echo "budget: 150%"; } >over.yaml
refused 1 "budget '150%' is above 100%" over.yaml out --catalog cat
"$MERGEPIPE" plan c.yaml --catalog cat --budget 50 >/dev/null 2>err.txt && fail "plan took --budget 50"
grep -q "budget '50' is 50 bytes" err.txt || fail "plan --budget 50: $(cat err.txt)"
echo "ok: refused"

# mergekit's spellings: CONFIG OUT positional, -j/--num-threads, --random-seed, -v, and
# --out-shard-size in its units (100K = 100,000 bytes: the tiny family's 320 KiB of tensors in
# 4 shards, as --max-shard-size 100000 gives).
run_np 2 merge c.yaml pos --catalog cat --budget 60% -j 1 --random-seed 4 -v --quiet
run_np 2 merge c.yaml --out flag --catalog cat --budget 60% --num-threads 1 --seed 4 --quiet
same_model_files pos flag
run_np 1 merge c.yaml shards-mk --catalog cat --out-shard-size 100K --quiet
run_np 1 merge c.yaml shards-mp --catalog cat --max-shard-size 100000 --quiet
same_model_files shards-mk shards-mp
[[ -e shards-mk/model-00004-of-00004.safetensors ]] || fail "--out-shard-size 100K: $(ls shards-mk)"
refused 1 "give --out-shard-size or --max-shard-size, not both" c.yaml out --catalog cat \
  --out-shard-size 1B --max-shard-size 5GB
# More threads than CPUs: a warning, and the merge runs.
"$MERGEPIPE" merge c.yaml many --catalog cat --threads 99 2>warn.txt >/dev/null
grep -q "warning: --threads 99 is more than the [0-9]* CPUs of this node" warn.txt ||
  fail "no warning for --threads 99: $(cat warn.txt)"
same_model_files many flag
echo "ok: mergekit spellings"

# help, version, and a mistyped command.
"$MERGEPIPE" help >help.txt
grep -q "^  merge " help.txt || fail "mergepipe help lists no merge"
"$MERGEPIPE" help merge >help-merge.txt
grep -q "^usage: mergepipe merge CONFIG OUT" help-merge.txt || fail "help merge: $(head -2 help-merge.txt)"
[[ "$("$MERGEPIPE" version)" == "$("$MERGEPIPE" --version)" ]] || fail "version differs from --version"
expect_exit 2 "unknown command 'mrege' \(did you mean 'merge'\?\)" "$MERGEPIPE" mrege c.yaml
expect_exit 2 "unknown command 'catalgo' \(did you mean 'catalog'\?\)" "$MERGEPIPE" catalgo
expect_exit 2 "unknown command 'frobnicate'$" "$MERGEPIPE" frobnicate
echo "ok: help"

# Models that are not one family (mergekit's "crimes"), from their config.json: refused before
# any weight is read, unless --allow-crimes; a base without config.json gets a warning.
cp -p fam/expert01/config.json expert01-config.json
"$PYTHON" - fam/expert01/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["architectures"] = ["MistralForCausalLM"]
json.dump(c, open(sys.argv[1], "w"))
PY
for np in 1 2; do
  expect_exit 3 "fam/expert01/config.json describes another model than the base's: architectures \[\"MistralForCausalLM\"\] \(base \[\".*\"\]\); merging across architectures is refused \(--allow-crimes merges them anyway where their tensors match the base's\)" \
    run_np "$np" merge c.yaml out --catalog cat
  expect_one_error
  expect_no_output out
done
run_np 2 merge c.yaml crimes --catalog cat --budget 60% --allow-crimes 2>crimes.txt >/dev/null
grep -q "warning: .*describes another model than the base's.*merged anyway: --allow-crimes" crimes.txt ||
  fail "no --allow-crimes warning: $(cat crimes.txt)"
same_model_files crimes pos
cp -p expert01-config.json fam/expert01/config.json
mv fam/base/config.json base-config.json
run_np 1 merge c.yaml no-config --catalog cat --budget 60% 2>noconfig.txt >/dev/null
grep -q "warning: .*fam/base has no config.json: the output has none either" noconfig.txt ||
  fail "no warning for a base without config.json: $(cat noconfig.txt)"
[[ ! -e no-config/config.json ]] || fail "an output config.json from nowhere"
mv base-config.json fam/base/config.json
echo "ok: architecture check"
