#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds ad with CUDA (or takes binaries built
# elsewhere), runs every CUDA test case (they report "skipped" elsewhere), the
# GPU benchmarks and compute-sanitizer's memcheck over the CUDA tests, and
# prints a short table last. Results go to docs/gpu.md with the device and date.
#
#   bash scripts/gpu-check.sh [build-dir]
#       configure and build with CUDA in build-dir (default build-gpu), then run
#   bash scripts/gpu-check.sh --prebuilt DIR|PACK.tgz
#       run the binaries in DIR (ad_tests, bench_cuda, bench_attention,
#       bench_semicrf, bench_semiseparable; shared libraries the machine lacks
#       in DIR/lib), as scripts/gpu-pack.sh leaves them (a folder or a .tgz):
#       for a GPU machine that has the CUDA toolkit but not the project's
#       build dependencies
#
# AD_GPU_BENCHES names the benchmarks to run (default: all four);
# AD_GPU_SEMICRF_ARGS adds arguments to bench_semicrf (say --only 40000,3000,24);
# AD_GPU_MEMCHECK_TC is the doctest filter of the cases memcheck runs (default
# "cuda*", all of them; a comma separates filters).
# Each step runs under a time limit (env AD_GPU_STEP_S, default 90 s; each
# test case AD_GPU_TEST_S, default 60 s, and no case starts after
# AD_GPU_TESTS_S, default 300 s, of them) so that one slow step cannot eat the
# others; full logs (7 files) go to AD_GPU_LOG (a folder, default a temporary one).
set -uo pipefail
cd "$(dirname "$0")/.."
step_s=${AD_GPU_STEP_S:-90}
test_s=${AD_GPU_TEST_S:-60}
tests_s=${AD_GPU_TESTS_S:-300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
logdir=${AD_GPU_LOG:-$(mktemp -d)}
mkdir -p "$logdir"
sum="$logdir/summary.txt"
: >"$sum"
if [ "${1:-}" = "--prebuilt" ]; then
  bin=${2:?"--prebuilt needs a folder (or gpu-pack.sh's .tgz)"}
  if [[ "$bin" == *.tgz ]]; then  # unpacked next to the logs' temporary folder
    mkdir -p "$tmp/bin" && tar -C "$tmp/bin" -xzf "$bin" || exit 1
    bin="$tmp/bin"
  fi
  tests="$bin/ad_tests"
  benches="$bin"
  # the packed libraries first, then the CUDA toolkit's (cuBLAS is not packed)
  for l in /usr/local/cuda/lib64 "$bin/lib"; do
    [ -d "$l" ] && export LD_LIBRARY_PATH="$(cd "$l" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  # a build with NCCL needs libnccl.so.2: where the toolkit lacks it, take one installed elsewhere
  # (a Python environment's NCCL package, say); NCCL 2's C API is stable across its minor versions
  if ldd "$tests" 2>/dev/null | grep -q "libnccl.so.2 => not found"; then
    nccl=$(find /usr/local /opt /usr/lib -name libnccl.so.2 2>/dev/null | head -1)
    [ -n "$nccl" ] && echo "nccl: $nccl" && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nccl")"
  fi
else
  dir=${1:-build-gpu}
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DAD_CUDA=ON -DAD_BUILD_EXAMPLES=OFF -DAD_MPI=OFF -DAD_BUILD_BENCH=ON \
    -DAD_BENCH_TORCH=OFF >/dev/null || exit 1
  cmake --build "$dir" -j"$(nproc)" --target ad_tests bench_cuda bench_attention bench_semicrf bench_semiseparable 2>&1 |
    tail -3
  tests="$dir/tests/ad_tests"
  benches="$dir/bench"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null |
  sed 's/^/gpu: /' || echo "gpu: nvidia-smi not found"
if ! "$tests" --list-test-cases -tc="cuda*" >"$tmp/cases.txt" 2>&1; then
  echo "ad_tests does not start here:"
  cat "$tmp/cases.txt"
  exit 1
fi
# one process per test case, so a hang or a crash names its case
t_start=$(date +%s)
grep -E "^cuda" "$tmp/cases.txt" | while IFS= read -r tc; do
  if [ $(($(date +%s) - t_start)) -ge "$tests_s" ]; then
    echo "| $tc | not run (the test cases' ${tests_s} s were spent) | |" >>"$sum"
    continue
  fi
  pat=$(printf '%s' "$tc" | sed 's/[][*?,\\]/?/g')  # doctest filters: * ? are wildcards, ',' separates
  t0=$(date +%s.%N)
  timeout "$test_s" "$tests" -tc="$pat" >"$tmp/case.log" 2>&1
  rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 124 ]; then res="timeout (${test_s} s)"
  elif [ $rc -ne 0 ]; then res="FAILED (rc $rc)"
  elif grep -q "\[ad-skip\]" "$tmp/case.log"; then res="skipped: $(grep -o '\[ad-skip\].*' "$tmp/case.log" | head -1)"
  elif grep -qE "test cases: *1 \| *1 passed" "$tmp/case.log"; then res="passed"
  else res="UNKNOWN (rc 0, no doctest summary)"
  fi
  echo "| $tc | $res | $dt |" >>"$sum"
  { echo "==== $tc: $res"; cat "$tmp/case.log"; } >>"$logdir/tests.log"
  case "$res" in passed | skipped*) ;; *) echo "==== $tc: $res"; tail -40 "$tmp/case.log" ;; esac
done
for b in ${AD_GPU_BENCHES:-bench_semiseparable bench_cuda bench_attention bench_semicrf}; do
  if [ -x "$benches/$b" ]; then
    extra=""
    [ "$b" = bench_semicrf ] && extra=${AD_GPU_SEMICRF_ARGS:-}
    echo "==== $b --gpu $extra"
    # shellcheck disable=SC2086
    timeout "$step_s" "$benches/$b" --gpu $extra 2>&1 | tee "$logdir/$b.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && echo "| $b --gpu | rc $rc$([ "$rc" -eq 124 ] && echo " (timeout ${step_s} s)") | |" >>"$sum"
  fi
done
# memcheck over the CUDA test cases, where the toolkit ships compute-sanitizer
san=$(command -v compute-sanitizer || true)
[ -z "$san" ] && nvcc_path=$(command -v nvcc || true) && [ -n "$nvcc_path" ] && [ -x "$(dirname "$nvcc_path")/compute-sanitizer" ] &&
  san="$(dirname "$nvcc_path")/compute-sanitizer"
if [ -n "$san" ]; then
  timeout "$step_s" "$san" --tool memcheck --error-exitcode 1 "$tests" -tc="${AD_GPU_MEMCHECK_TC:-cuda*}" >"$logdir/memcheck.log" 2>&1
  rc=$?
  errs=$(grep -oE "ERROR SUMMARY: [0-9]+" "$logdir/memcheck.log" | grep -oE "[0-9]+$" | tail -1)
  # memcheck also counts CUDA API calls that returned an error; NCCL's start-up probes kernels with
  # cudaFuncGetAttributes and takes "no kernel image" for an answer: those are not memory errors
  api=$(grep -c "^========= Program hit" "$logdir/memcheck.log")
  lib_api=$(grep -A2 "^========= Program hit" "$logdir/memcheck.log" | grep -cE "Host Frame: .* in libnccl")  # the first frame
  if [ $rc -eq 124 ]; then res="timeout (${step_s} s)"
  elif [ "${errs:-x}" = "0" ] && [ $rc -eq 0 ]; then res="passed (0 errors)"
  elif [ "${errs:-x}" = "0" ]; then res="0 errors (the test cases' own failures above: rc $rc)"
  elif [ "$errs" = "$api" ] && [ "$api" = "$lib_api" ] && grep -qE "test cases: *[0-9]+ \| *[0-9]+ passed \| 0 failed" "$logdir/memcheck.log"; then
    res="passed: 0 memory errors ($api CUDA API errors inside NCCL's own start-up)"
  else res="FAILED: ${errs:-?} errors (rc $rc)"; tail -40 "$logdir/memcheck.log"
  fi
else
  res="compute-sanitizer not found"
fi
echo "| compute-sanitizer memcheck (${AD_GPU_MEMCHECK_TC:-all cuda test cases}) | $res | |" >>"$sum"
echo
echo "| test | result | s |"
echo "|---|---|---|"
cat "$sum"
grep -hE "case x dtype runs compared" "$logdir/tests.log" | head -1
grep -qE "FAILED|timeout|UNKNOWN|not run|rc [1-9]" "$sum" && exit 1
exit 0
