# Shared helpers for the end-to-end CLI tests (sourced, not run: its name does not end in .sh).
set -euo pipefail
: "${MERGEPIPE:?path of the mergepipe binary}"
: "${TEST_SCRATCH:?scratch folder}"
MPIEXEC="${MPIEXEC:-mpiexec}"
PYTHON="${PYTHON:-/usr/bin/python3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$TEST_SCRATCH"
mkdir -p "$TEST_SCRATCH"
cd "$TEST_SCRATCH"
# Each test's mpiexec keeps its session folder apart: Open MPI 4.1 launchers starting and ending
# at once in the shared /tmp/ompi.HOST.UID race (one removes it as another creates it: "orte_init
# failed ... mkdir: File exists", seen once in a CI run with ctest -j 2). Short, for PMIx's socket
# paths.
OMPI_MCA_orte_tmpdir_base=$(mktemp -d /tmp/mp-ompi.XXXXXX)
chmod 1777 "$OMPI_MCA_orte_tmpdir_base"  # as /tmp: tests that run a rank as another user
export OMPI_MCA_orte_tmpdir_base
# A passing test leaves no scratch behind (some hold GBs of synthetic weights); a failing one
# keeps it for inspection. Tests add their own clean-up with on_exit (a trap would replace this one).
exit_hooks=()
on_exit() { exit_hooks+=("$1"); }
remove_scratch_if_passed() {
  local rc=$? hook
  for hook in "${exit_hooks[@]}"; do eval "$hook" || true; done
  rm -rf "$OMPI_MCA_orte_tmpdir_base"
  ((rc == 0)) && cd / && rm -rf "$TEST_SCRATCH"
  return "$rc"
}
trap remove_scratch_if_passed EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# run_np N args...: mergepipe on N MPI ranks.
run_np() {
  local np="$1"
  shift
  "$MPIEXEC" -np "$np" --oversubscribe "$MERGEPIPE" "$@"
}

# expect_exit CODE PATTERN cmd...: the command fails with CODE and its stderr matches PATTERN.
expect_exit() {
  local code="$1" pattern="$2"
  shift 2
  local rc=0
  "$@" >"$TEST_SCRATCH/out.txt" 2>"$TEST_SCRATCH/err.txt" || rc=$?
  [[ $rc -eq $code ]] || { cat "$TEST_SCRATCH/err.txt" >&2; fail "expected exit $code, got $rc: $*"; }
  grep -Eq -- "$pattern" "$TEST_SCRATCH/err.txt" || { cat "$TEST_SCRATCH/err.txt" >&2; fail "stderr lacks /$pattern/: $*"; }
}

# write_config FILE METHOD FAMILY K [extra global parameters] [dtype]
write_config() {
  local file="$1" method="$2" family="$3" k="$4" params="${5:-}" dtype="${6:-}"
  {
    echo "merge_method: $method"
    echo "base_model: $family/base"
    echo "models:"
    for ((i = 0; i < k; i++)); do
      printf '  - model: %s/expert%02d\n' "$family" "$i"
      printf '    parameters: {weight: %s, density: %s}\n' "$(awk "BEGIN{print 1 + 0.25 * $i}")" "$(awk "BEGIN{print 0.3 + 0.1 * $i}")"
    done
    [[ -n "$params" ]] && echo "parameters: {$params}"
    [[ -n "$dtype" ]] && echo "dtype: $dtype"
    echo "seed: 11"
  } >"$file"
}

# same_model_files A B: every tensor file (and index/config/tokenizer) identical; the records of
# how each was made (manifest, model card, config copy) may differ.
same_model_files() {
  local a="$1" b="$2" f
  for f in "$a"/*; do
    local name
    name="$(basename "$f")"
    [[ "$name" == mergepipe.manifest.json || "$name" == README.md || "$name" == mergekit_config.yml ]] && continue
    cmp -s "$f" "$b/$name" || fail "$name differs between $a and $b"
  done
  [[ $(ls "$a" | wc -l) -eq $(ls "$b" | wc -l) ]] || fail "$a and $b hold different files"
}

# json_get FILE KEY.PATH
json_get() {
  "$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'): d=d[int(k)] if isinstance(d, list) else d[k]
print(d)" "$1" "$2"
}

# expect_no_output DIR: neither a folder at DIR nor its staging folder (a failed merge leaves
# nothing behind).
expect_no_output() {
  local dir="${1%/}"
  local staging
  staging="$(dirname "$dir")/.$(basename "$dir").mergepipe-staging"
  [[ ! -e "$dir" ]] || fail "$dir exists after a failed run"
  [[ ! -e "$staging" ]] || fail "staging folder $staging left behind"
}

# expect_no_catalog DIR: neither a catalog at DIR nor a temporary catalog folder beside it.
expect_no_catalog() {
  local dir="${1%/}"
  [[ ! -e "$dir" ]] || fail "$dir exists after a failed catalog build"
  ! compgen -G "$(dirname "$dir")/.$(basename "$dir").tmp-*" >/dev/null ||
    fail "temporary catalog folder left beside $dir"
}

# expect_one_error: the stderr of the last expect_exit holds exactly one error line.
expect_one_error() {
  local n
  n=$(grep -Ec '^mergepipe: (internal )?error' "$TEST_SCRATCH/err.txt" || true)
  [[ $n -eq 1 ]] || { cat "$TEST_SCRATCH/err.txt" >&2; fail "expected one error line, got $n"; }
}
