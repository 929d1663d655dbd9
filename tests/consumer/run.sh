#!/usr/bin/env bash
# usage: run.sh package <ad-build-dir> <work-dir> | run.sh subdirectory <ad-source-dir> <work-dir>
#        run.sh pkgconfig <ad-build-dir> <work-dir>   (installs, then builds main.cpp with pkg-config only)
set -euo pipefail
mode=$1 src=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
if [ "$mode" = pkgconfig ]; then
  cmake --install "$src" --prefix "$work/prefix" >/dev/null
  pc=$(find "$work/prefix" -name ad.pc | head -n 1)
  [ -n "$pc" ] || { echo "ad.pc was not installed" >&2; exit 1; }
  export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # shellcheck disable=SC2046  # pkg-config output is a list of flags
  ${CXX:-c++} -std=c++20 "$here/main.cpp" -o "$work/consumer" $(pkg-config --cflags --static --libs ad)
  "$work/consumer"
  exit
fi
if [ "$mode" = package ]; then
  cmake --install "$src" --prefix "$work/prefix" >/dev/null
  cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DAD_CONSUMER_MODE=package >/dev/null
else
  # The parent's build type (none: unoptimised) and one CUDA architecture
  # where nvcc is found: the test is that the library builds and links in
  # place, and so it builds in about a third of the time.
  cmake -S "$here" -B "$work/build" -DAD_CONSUMER_MODE=subdirectory -DAD_SOURCE_DIR="$src" \
    -DCMAKE_CUDA_ARCHITECTURES=90-real >/dev/null
fi
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
