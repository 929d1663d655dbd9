#!/usr/bin/env bash
# Quick start, step 2: build everything with warnings as errors and run the
# whole test suite. Usage: bash scripts/test.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
bash scripts/deps.sh
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DAD_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
