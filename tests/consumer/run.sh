#!/usr/bin/env bash
# usage: run.sh package <ad-build-dir> <work-dir> | run.sh subdirectory <ad-source-dir> <work-dir>
set -euo pipefail
mode=$1 src=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
if [ "$mode" = package ]; then
  cmake --install "$src" --prefix "$work/prefix" >/dev/null
  cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DAD_CONSUMER_MODE=package >/dev/null
else
  cmake -S "$here" -B "$work/build" -DAD_CONSUMER_MODE=subdirectory -DAD_SOURCE_DIR="$src" >/dev/null
fi
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
