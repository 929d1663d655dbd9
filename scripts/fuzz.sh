#!/usr/bin/env bash
# libFuzzer on the safetensors loader (clang): builds the instrumented target
# and fuzzes for N seconds (default 60) from the seed corpus. CI replays the
# corpus through the same entry point in every build (tests/nn_safetensors.cpp);
# this runs the fuzzer itself. Usage: bash scripts/fuzz.sh [seconds] [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60} dir=${2:-build-fuzz}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DAD_FUZZ=ON -DAD_CUDA=OFF -DAD_MPI=OFF \
  -DAD_BUILD_TESTS=OFF -DAD_BUILD_BENCH=OFF -DAD_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$dir" -j"$(nproc)" --target fuzz_safetensors
rm -rf "$dir/corpus" && mkdir -p "$dir/corpus"
"$dir/tests/fuzz/fuzz_safetensors" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  "$dir/corpus" tests/fuzz/corpus
