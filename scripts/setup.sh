#!/usr/bin/env bash
# Quick start, step 1: install dependencies, build ad (Release) and train the
# MLP demo. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target mlp
./build/examples/mlp
