#!/usr/bin/env bash
# Installs the Debian packages ad needs to build and test (as root, or via sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libfmt-dev doctest-dev libopenblas-dev libopenmpi-dev openmpi-bin liblapacke-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
