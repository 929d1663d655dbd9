#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt needs into one folder: the test
# and GPU benchmark binaries of a CUDA build, and the shared libraries they
# load that a GPU machine with only the CUDA toolkit may lack (fmt, OpenBLAS,
# LAPACKE and theirs). Left out: the C and C++ runtimes and the CUDA
# libraries, which the GPU machine has (the same CUDA major version is needed).
#   bash scripts/gpu-pack.sh BUILD_DIR OUT_DIR
#   bash scripts/gpu-pack.sh BUILD_DIR OUT.tgz   (the same folder gzipped: about
#       half the size, for a transfer with a size limit; gpu-check.sh --prebuilt
#       takes the .tgz as it is)
set -euo pipefail
build=${1:?"usage: gpu-pack.sh BUILD_DIR OUT_DIR|OUT.tgz"}
out=${2:?"usage: gpu-pack.sh BUILD_DIR OUT_DIR|OUT.tgz"}
tgz=""
if [[ "$out" == *.tgz ]]; then
  tgz=$out
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out/lib"
bins=("$build/tests/ad_tests")
for b in bench_cuda bench_attention bench_semicrf bench_semiseparable; do
  [ -x "$build/bench/$b" ] && bins+=("$build/bench/$b")
done
for f in "${bins[@]}"; do
  strip -o "$out/$(basename "$f")" "$f"
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    case "$name" in
      ld-linux* | libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | libcuda.so* | \
        libcublas* | libcudart* | libnccl* | libmpi* | libopen-*) ;;
      *) cp -L "$path" "$out/lib/$name" ;;
    esac
  done
done
if [ -n "$tgz" ]; then
  mkdir -p "$(dirname "$tgz")"
  tar -C "$out" -cf - . | gzip -6 >"$tgz"
  du -sh "$tgz"
else
  du -sh "$out"
fi
