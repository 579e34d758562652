#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`: clang, ASan + UBSan) and runs each for SECONDS
# (default 60), one after the other on one core. Seeds come from tests/fuzz/corpus/TARGET; new
# inputs libFuzzer finds go to build-fuzz/corpus/TARGET (kept between runs, never into the repo).
# A crash, leak, UB report, timeout or escaped exception fails the script; its input is saved as
# build-fuzz/artifacts/TARGET/crash-* (fix the bug, then add the input to the seed corpus).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
cmake --preset fuzz -G Ninja >/dev/null
cmake --build --preset fuzz -j 2
targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in tests/fuzz/*_fuzz.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi
# Fixture files a target needs live here, wiped before each run.
export MERGEPIPE_FUZZ_SCRATCH="$PWD/build-fuzz/scratch"
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t" artifacts="build-fuzz/artifacts/$t"
  rm -rf "$MERGEPIPE_FUZZ_SCRATCH"
  mkdir -p "$work" "$artifacts" "$MERGEPIPE_FUZZ_SCRATCH"
  echo "fuzz: $t for ${seconds}s"
  if ! "build-fuzz/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "tests/fuzz/corpus/$t" \
      >"build-fuzz/$t.log" 2>&1; then
    tail -40 "build-fuzz/$t.log" >&2
    echo "fuzz: $t FAILED (log build-fuzz/$t.log, input in $artifacts/)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^stat::new_units_added" \
    "build-fuzz/$t.log" | sed "s/^/  /"
done
echo "fuzz: ${#targets[@]} target(s) ran ${seconds}s each without a finding"
