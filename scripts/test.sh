#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite through CTest: the release build,
# then the ASan+UBSan build (all but Slurm.cluster; skip it with MERGEPIPE_SKIP_ASAN=1), then
# each libFuzzer target for MERGEPIPE_FUZZ_SECONDS (default 10; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
scripts/setup-deps.sh
jobs="$(nproc)"
if command -v git >/dev/null && [[ -d .git ]]; then scripts/check-format.sh; fi

scripts/build.sh release
ctest --preset release -j "$jobs" --timeout 900

if [[ "${MERGEPIPE_SKIP_ASAN:-0}" != 1 ]]; then
  scripts/build.sh asan
  # Slurm.cluster checks the slurm/ scripts against a real cluster; it runs serially, and under
  # ASan it repeats the release leg's job 1.7x slower (~100 s of CI), so it runs there only.
  ctest --preset asan -j "$jobs" --timeout 1800 -E '^Slurm\.cluster$'
fi

fuzz_seconds="${MERGEPIPE_FUZZ_SECONDS:-10}"
if ((fuzz_seconds > 0)); then
  scripts/fuzz.sh "$fuzz_seconds"
fi
