#!/usr/bin/env bash
# No command writes over its inputs (docs/reliability.md, "Inputs are never outputs"): every
# target that is, holds or lies inside an input, the current folder or a parent of it is refused
# with exit 2 before anything is read, at 1 and 2 ranks, and every input's bytes (hashed before
# and after) are unchanged. Then a random sweep of targets among the inputs, their parents and
# links to them, with and without --force.
source "$(dirname "$0")/common.bash"

"$MERGEPIPE" synth --preset tiny --experts 2 --seed 5 --out fam >/dev/null
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 --out cat >/dev/null
write_config c.yaml ties fam 2 "normalize: true"
run_np 2 merge c.yaml --catalog cat --budget 25% --out done --quiet
mkdir user && echo "keep me" >user/notes.txt
echo "keep me too" >cat/notes.txt

inputs_digest() {
  find fam cat c.yaml user done -type f ! -name .mergepipe.lock -print0 | sort -z |
    xargs -0 sha256sum | sha256sum
}
before="$(inputs_digest)"
unchanged() { [[ "$(inputs_digest)" == "$before" ]] || fail "an input changed: $*"; }

merge() { run_np "$np" merge c.yaml --catalog cat --budget 25% "$@"; }
for np in 1 2; do
  for out in fam/base fam/expert00 cat fam c.yaml fam/base/model-00001-of-00004.safetensors \
    cat/catalog.h5; do
    expect_exit 2 "merge: --out $out (is|contains|lies inside) the " merge --out "$out" --force
    expect_one_error
  done
  expect_exit 2 "is the current folder" merge --out . --force
  expect_exit 2 "is a parent of the current folder" merge --out .. --force
  expect_exit 2 "merge: --out is empty" merge --out ''
  expect_exit 2 "merge: --budget is empty" run_np "$np" merge c.yaml --catalog cat --budget '' --out b
  expect_exit 2 "refusing to replace a folder that no mergepipe merge wrote .*would delete its 1 entry \(notes.txt\)" \
    merge --out user --force
  ln -sfn fam/base link-out
  expect_exit 2 "is a symbolic link" merge --out link-out --force
  ln -sfn nowhere dangling
  expect_exit 2 "dangling is a symbolic link \(to nowhere\)" merge --out dangling
  expect_exit 2 "bytes; at most" merge --out "$(printf 'n%.0s' {1..240})"
  # A link planted at the staging path is never followed, nor deleted through.
  ln -sfn fam/base .planted.mergepipe-staging
  expect_exit 2 "staging folder is a symbolic link" merge --out planted
  rm .planted.mergepipe-staging
  expect_exit 2 "replay: --out .* is the base model" \
    run_np "$np" replay done/mergepipe.manifest.json --out fam/base --force
  expect_exit 2 "replay: --out done contains the manifest" \
    run_np "$np" replay done/mergepipe.manifest.json --out done --force
  expect_exit 2 "plan: --out c.yaml is the config" run_np "$np" plan c.yaml --catalog cat --out c.yaml
  expect_exit 2 "plan: --out .* lies inside the base" \
    run_np "$np" plan c.yaml --catalog cat --out fam/base/config.json
  expect_exit 2 "exists and is not a mergepipe plan" \
    run_np "$np" plan c.yaml --catalog cat --out user/notes.txt
  expect_exit 2 "catalog: --out fam/base is the base" \
    run_np "$np" catalog --base fam/base --experts fam/expert00 --out fam/base
  expect_exit 2 "catalog: --out fam contains the base" \
    run_np "$np" catalog --base fam/base --experts fam/expert00 --out fam --force
  expect_exit 2 "exists and is not a catalog folder" \
    run_np "$np" catalog --base fam/base --experts fam/expert00 --out user --force
  expect_exit 2 "synth: --out .* is the current folder" \
    "$MERGEPIPE" synth --preset tiny --experts 1 --out . --force
  # Wrong exit codes and late errors (stop 46), with the inputs hashed around them.
  expect_exit 2 "catalog: --experts needs at least one value before --out" \
    run_np "$np" catalog --base fam/base --experts --out cat
  expect_one_error
  expect_exit 3 "fam/base: not a mergepipe output: it holds no mergepipe\.manifest\.json" \
    run_np "$np" verify fam/base
  # Equal weights of 1e308 (their fp32 values overflow) merge as equal weights of 1.
  sed 's/weight: [0-9.]*/weight: 1e308/' c.yaml >huge.yaml
  sed 's/weight: [0-9.]*/weight: 1/' c.yaml >ones.yaml
  run_np "$np" merge huge.yaml --catalog cat --budget 25% --out "huge-$np" --quiet ||
    fail "weights of 1e308 with normalize at $np rank(s)"
  run_np "$np" merge ones.yaml --catalog cat --budget 25% --out "ones-$np" --quiet
  same_model_files "ones-$np" "huge-$np"
  unchanged "refused targets at $np rank(s)"
  echo "ok: refused targets at $np rank(s)"
done

# --force replaces a merge output atomically and leaves no copy behind; a leftover .replaced copy
# of a run killed between two renames is put back at a missing target by the next run.
run_np 2 merge c.yaml --catalog cat --budget 50% --out done2 --quiet
run_np 2 merge c.yaml --catalog cat --budget 25% --out done2 --force --quiet
same_model_files done done2
! compgen -G ".done2.mergepipe-staging*" >/dev/null || fail "publish left a staging copy"
mv done2 .done2.mergepipe-staging.replaced
run_np 2 merge c.yaml --catalog cat --budget 25% --out done2 --force --quiet
[[ -d done2 && ! -e .done2.mergepipe-staging.replaced ]] || fail "the .replaced copy was not reclaimed"
echo "ok: atomic --force publish"

# A plan file is replaced as a whole, and only a plan.
run_np 1 plan c.yaml --catalog cat --out p.json >/dev/null
run_np 1 plan c.yaml --catalog cat --budget 10% --out p.json >/dev/null
json_get p.json format | grep -q mergepipe-plan || fail "p.json is not a plan"

# Extending a catalog keeps the user's files in it; two extensions at once never both succeed
# silently with one expert lost.
"$MERGEPIPE" synth --preset tiny --experts 4 --seed 5 --out fam4 >/dev/null
run_np 1 catalog --base fam4/base --experts fam4/expert00 --out cat4 >/dev/null
echo "mine" >cat4/notes.txt
rc1=0 rc2=0
"$MERGEPIPE" catalog --base fam4/base --experts fam4/expert01 fam4/expert02 --out cat4 --quiet 2>e1.txt & p1=$!
"$MERGEPIPE" catalog --base fam4/base --experts fam4/expert03 --out cat4 --quiet 2>e2.txt & p2=$!
wait "$p1" || rc1=$?
wait "$p2" || rc2=$?
[[ "$(cat cat4/notes.txt)" == mine ]] || fail "catalog extension touched a user's file"
experts=$("$PYTHON" -c "import json; print(len(json.load(open('cat4/catalog.json'))['experts']))")
want=1
((rc1 == 0)) && want=$((want + 2))
((rc2 == 0)) && want=$((want + 1))
((rc1 == 0 || rc1 == 4)) && ((rc2 == 0 || rc2 == 4)) || fail "extensions exited $rc1 and $rc2"
[[ "$experts" -eq "$want" ]] || fail "catalog holds $experts experts, the exits ($rc1, $rc2) say $want"
for e in e1.txt e2.txt; do
  [[ ! -s $e ]] || grep -q "another catalog build or extension is writing it" "$e" || { cat "$e"; fail "unexpected error"; }
done
echo "ok: catalog extension ($rc1, $rc2; $experts experts)"

# Property: random targets among the inputs, their parents and links to them, with and without
# --force, change no input byte.
candidates=(fam fam/base fam/expert00 fam/expert01 cat c.yaml fam/base/config.json
  cat/catalog.json . .. "$PWD" user done)
for c in fam/base cat fam; do ln -sfn "$c" "ln-$(basename "$c")"; candidates+=("ln-$(basename "$c")"); done
candidates+=(ln-base/x ln-cat/x ln-fam/base/x)
RANDOM=7
for ((i = 0; i < 24; i++)); do
  target="${candidates[RANDOM % ${#candidates[@]}]}"
  force=()
  ((RANDOM % 2)) && force=(--force)
  case $((RANDOM % 4)) in
    0) cmd=(run_np 2 merge c.yaml --catalog cat --budget 25% --out "$target" "${force[@]}") ;;
    1) cmd=(run_np 1 replay done/mergepipe.manifest.json --out "$target" "${force[@]}") ;;
    2) cmd=(run_np 1 plan c.yaml --catalog cat --out "$target") ;;
    3) cmd=(run_np 1 catalog --base fam/base --experts fam/expert00 --out "$target" "${force[@]}") ;;
  esac
  rc=0
  "${cmd[@]}" >/dev/null 2>err.txt || rc=$?
  # Only a command's own kind of output may be accepted: a merge output for merge, the catalog
  # for catalog (which has nothing to add, or is rebuilt with --force).
  if ((rc == 0)); then
    case "$target:${cmd[2]}" in
      done:merge | cat:catalog) before="$(inputs_digest)" ;;
      *) fail "accepted target $target: ${cmd[*]}" ;;
    esac
  fi
  unchanged "${cmd[*]}"
done
echo "input safety: ok"
