#!/usr/bin/env bash
# Runs a test with the kernels' CPU tier forced: tests/tier.sh TIER COMMAND...
# Exits 77 (CTest: skipped) when this CPU lacks the tier, or when the tier is its best one
# (the test's plain run covers that).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: tests/tier.sh avx2|avx512 COMMAND..." >&2; exit 2; }
tier=$1; shift
case $tier in avx2|avx512|avx512bf16) ;; *) echo "tier.sh: unknown tier $tier" >&2; exit 2;; esac
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
best=avx2
if has avx512f avx512bw avx512cd avx512dq avx512vl; then
  best=avx512
  has avx512_bf16 && best=avx512bf16
fi
rank() { case $1 in avx2) echo 0;; avx512) echo 1;; avx512bf16) echo 2;; esac; }
if [ "$(rank "$tier")" -ge "$(rank "$best")" ]; then
  echo "tier $tier: this CPU's best tier is $best; the plain run covers it: skipped"
  exit 77
fi
export MT_CPU_TIER=$tier
exec "$@"
