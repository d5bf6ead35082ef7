#!/usr/bin/env bash
# Kernel benchmark: every optimised moetrain kernel against its plain reference
# (`moetrain bench kernels`) and against the same operation written in PyTorch
# (bench/bench_kernels_torch.py), on the shapes of the "small" config, in one run.
#
# Usage: bench/bench_kernels.sh [path/to/moetrain] [--quick]   (default build/moetrain)
# Env:   THREADS (default 2), MT_BENCH_TMP scratch dir (default ${TMPDIR:-/tmp}/bench_kernels.PID,
#        removed after), BENCH_SKIP_TORCH=1 to run moetrain only.
#
# Speed-ups are time ratios: ref/mt = reference time / moetrain time, pt/mt = PyTorch time /
# moetrain time; > 1 means moetrain is faster. The naive references are single-threaded
# (some timed on a slice of the work and scaled, see the note column); the grouped-GEMM
# reference is a per-expert loop of moetrain's own BLAS linear. The *_bf16 rows (CPUs with
# AVX512-BF16 only) are moetrain's mixed-precision GEMM (mt_gemm_bf16): their reference is the
# same call in fp32 (OpenBLAS SGEMM), their PyTorch counterpart the matmuls on bf16 tensors.
set -u
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MOETRAIN="$SRC/build/moetrain"
QUICK=()
for a in "$@"; do
  case "$a" in
    --quick) QUICK=(--quick) ;;
    *) MOETRAIN=$a ;;
  esac
done
PY=/usr/bin/python3
THREADS=${THREADS:-2}
[ -x "$MOETRAIN" ] || { echo "bench_kernels: $MOETRAIN is not an executable"; exit 1; }

TMP=${MT_BENCH_TMP:-${TMPDIR:-/tmp}/bench_kernels.$$}
KEEP=${MT_BENCH_TMP:+1}
mkdir -p "$TMP"
cleanup() { [ -z "$KEEP" ] && rm -rf "$TMP"; }
trap cleanup EXIT

echo "bench_kernels: $THREADS threads ${QUICK[*]}, scratch $TMP"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "--- moetrain bench kernels"
if ! "$MOETRAIN" bench kernels --threads "$THREADS" "${QUICK[@]}" --json "$TMP/mt.json" > "$TMP/mt.log" 2>&1; then
  tail -30 "$TMP/mt.log"; echo "bench_kernels: moetrain bench kernels failed"; exit 1
fi
head -1 "$TMP/mt.log" | sed 's/^/    /'

PT_JSON=""
if [ "${BENCH_SKIP_TORCH:-0}" != 1 ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "--- PyTorch (bench_kernels_torch.py)"
  if ! OMP_WAIT_POLICY=PASSIVE "$PY" "$SRC/bench/bench_kernels_torch.py" --threads "$THREADS" "${QUICK[@]}" \
       --json "$TMP/pt.json" > "$TMP/pt.log" 2>&1; then
    tail -30 "$TMP/pt.log"; echo "bench_kernels: bench_kernels_torch.py failed"; exit 1
  fi
  head -1 "$TMP/pt.log" | sed 's/^/    /'
  PT_JSON="$TMP/pt.json"
else
  echo "--- PyTorch skipped (BENCH_SKIP_TORCH=1 or no python3-torch)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$TMP/mt.json" "$PT_JSON" <<'EOF'
import json, sys
mt = json.load(open(sys.argv[1]))
pt = {(r["kernel"], r["shape"]): r for r in json.load(open(sys.argv[2]))["rows"]} if sys.argv[2] else {}
def ms(v):
    return "-" if v is None else (f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3f}")
def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"
print()
print(f"{'kernel':31} {'shape':26} {'mt ms':>8} {'mt rate':>13} {'ref ms':>9} {'torch ms':>9} {'ref/mt':>8} "
      f"{'pt/mt':>7}  reference (torch)")
for r in mt["rows"]:
    p = pt.get((r["kernel"], r["shape"]))
    ptms = p["ms"] if p else None
    note = r["ref"] + (f" [1/{r['ref_scale']:g} scaled]" if r["ref_scale"] > 1 else "")
    if r.get("ref_ms") is None:
        note = "skipped"
    if p and p.get("torch"):
        note += f" ({p['torch']})"
    unit = "GF/s" if r["unit"] == "GFLOP/s" else "GB/s"
    print(f"{r['kernel']:31} {r['shape']:26} {ms(r['ms']):>8} {r['rate']:8.2f} {unit:4} {ms(r.get('ref_ms')):>9} "
          f"{ms(ptms):>9} {ratio(r.get('ref_ms'), r['ms']):>8} {ratio(ptms, r['ms']):>7}  {note}")
missing = [k for k in pt if k not in {(r["kernel"], r["shape"]) for r in mt["rows"]}]
if missing:
    print("rows only in the PyTorch run:", missing)
print(f"\nmoetrain: {mt['threads']} threads, BLAS {mt['blas']}; ratios > 1: moetrain faster. "
      "rate: GFLOP/s (GF/s) for GEMM/attention/head, GB/s of bytes read+written for the rest.")
EOF
