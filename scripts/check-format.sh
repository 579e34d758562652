#!/usr/bin/env bash
# Fails when a tracked C++ file differs from .clang-format's layout (fix: clang-format -i FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp')
clang-format --dry-run --Werror "${files[@]}"
