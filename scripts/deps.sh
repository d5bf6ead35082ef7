#!/usr/bin/env bash
# Installs the Debian packages moetrain needs (when root), or prints the apt-get line.
# Usage: scripts/deps.sh [--with-torch]   (--with-torch adds the test oracles' packages: PyTorch, regex)
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-openmp-dev libcjson-dev libpcre2-dev libxxhash-dev gnuplot-nox libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--with-torch" ]; then pkgs+=(python3 python3-torch python3-numpy python3-regex); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "moetrain: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "moetrain: missing Debian packages; run as root:"
  echo "  apt-get update && apt-get install -y ${missing[*]}"
  exit 1
fi
