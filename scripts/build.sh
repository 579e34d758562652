#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release). Usage: scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
jobs="$(nproc)"
cmake --preset "$preset" -G Ninja >/dev/null
cmake --build --preset "$preset" -j "$jobs"
