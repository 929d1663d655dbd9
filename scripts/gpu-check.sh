#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds ad with CUDA, runs every CUDA test
# (they report "skipped" elsewhere) and the GPU benchmarks that exist, and
# prints a short table last. Results go to docs/gpu.md with the device and
# date. Usage: bash scripts/gpu-check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi not found"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DAD_CUDA=ON -DAD_BUILD_EXAMPLES=OFF -DAD_MPI=OFF >/dev/null || exit 1
cmake --build "$dir" -j"$(nproc)" --target ad_tests bench_attention bench_semiseparable 2>&1 | tail -3
ctest --test-dir "$dir" -R "cuda" --output-on-failure 2>&1 | tee "$log"
for b in "$dir"/bench/bench_attention "$dir"/bench/bench_semicrf "$dir"/bench/bench_semiseparable; do
  [ -x "$b" ] && "$b" --gpu 2>&1 | tee -a "$log"
done
echo
echo "| test | result |"
echo "|---|---|"
grep -E "Test +#[0-9]+: cuda" "$log" | sed -E 's/.*Test +#[0-9]+: (.*) \.+ *(\**[A-Za-z]+).*/| \1 | \2 |/'
grep -E "case x dtype runs compared" "$log" | head -1
