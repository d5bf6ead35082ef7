#!/usr/bin/env bash
# Peer benchmark of the "small" config: moetrain vs the PyTorch implementation of the same
# model (tests/oracle/moe_ref.py), same data, batch 8 x seq 512, 2 threads.
#
# Usage: bench/bench_small.sh path/to/moetrain [steps]      (steps default 6)
# Env:   MT_BENCH_TMP  scratch dir (default ${TMPDIR:-/tmp}/bench_small.PID, removed after)
#        BENCH_SKIP_TORCH=1  run moetrain only
#        MT_TRAIN_ARGS       extra flags for moetrain train (e.g. "--recompute selective")
#
# small: vocab 8192, hidden 512, 8 layers (first dense), 8 heads, 8 kv heads, head_dim 64,
# intermediate 1408, 16 routed experts, top-2, 1 shared expert, moe_intermediate 352.
# tokens/s excludes the first (warm-up) step on both sides; peak RSS is the process's
# VmHWM (MiB = 2^20 bytes), cross-checked with /usr/bin/time -v when available.
set -u
MOETRAIN=${1:?usage: bench/bench_small.sh path/to/moetrain [steps]}
STEPS=${2:-6}
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MOETRAIN=$(cd "$(dirname "$MOETRAIN")" && pwd)/$(basename "$MOETRAIN")
PY=/usr/bin/python3
REF="$SRC/tests/oracle/moe_ref.py"
B=8; T=512; THREADS=2
[ -x "$MOETRAIN" ] || { echo "bench_small: $MOETRAIN is not an executable"; exit 1; }
[ "$STEPS" -ge 2 ] 2>/dev/null || { echo "bench_small: steps must be >= 2 (the first is warm-up)"; exit 1; }

TMP=${MT_BENCH_TMP:-${TMPDIR:-/tmp}/bench_small.$$}
KEEP=${MT_BENCH_TMP:+1}
mkdir -p "$TMP"
cleanup() { [ -z "$KEEP" ] && rm -rf "$TMP"; }
trap cleanup EXIT

# config: the repo's configs/small.json when present, else the same numbers written here
if [ -f "$SRC/configs/small.json" ]; then
  CFG_FILE="$SRC/configs/small.json"; CFG_ARG=small
else
  CFG_FILE="$TMP/small.json"; CFG_ARG="$CFG_FILE"
  cat > "$CFG_FILE" <<'EOF'
{"vocab_size": 8192, "hidden_size": 512, "num_hidden_layers": 8, "first_k_dense_replace": 1,
 "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 1408,
 "max_position_embeddings": 4096, "n_routed_experts": 16, "num_experts_per_tok": 2,
 "n_shared_experts": 1, "moe_intermediate_size": 352, "aux_loss_alpha": 0.01,
 "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "model_type": "moetrain"}
EOF
fi
echo "bench_small: config $CFG_FILE, batch $B x seq $T, $STEPS steps, $THREADS threads, scratch $TMP"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"

TIMEV=()
if /usr/bin/time -v true >/dev/null 2>&1; then TIMEV=(/usr/bin/time -v -o); fi
maxrss_mb() {  # "Maximum resident set size (kbytes)" of a /usr/bin/time -v report, in MiB
  [ -f "$1" ] && awk -F: '/Maximum resident set size/ {printf "%.1f", $2/1024}' "$1"
}

cd "$SRC" || exit 1
if ! "$MOETRAIN" data math --out "$TMP/data" > "$TMP/data.log" 2>&1; then
  tail -20 "$TMP/data.log"; echo "bench_small: moetrain data math failed"; exit 1
fi

# ---- moetrain ---------------------------------------------------------------------------
echo "--- moetrain train"
rm -rf "$TMP/run_mt"
if [ ${#TIMEV[@]} -gt 0 ]; then TV=("${TIMEV[@]}" "$TMP/time_mt.txt"); else TV=(); fi
if ! "${TV[@]}" "$MOETRAIN" train --config "$CFG_ARG" --data "$TMP/data" --steps "$STEPS" --batch $B --seq $T \
     --threads $THREADS --out "$TMP/run_mt" ${MT_TRAIN_ARGS:-} > "$TMP/mt.log" 2>&1; then
  tail -30 "$TMP/mt.log"; echo "bench_small: moetrain train failed"; exit 1
fi
tail -n 4 "$TMP/mt.log" | sed 's/^/    /'
MT=$("$PY" - "$TMP/run_mt/metrics.jsonl" <<'EOF'
import json, sys
last = None
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        last = json.loads(line)
if not last or last.get("event") != "summary":
    sys.exit("last line of metrics.jsonl is not a summary event")
print(last["tokens_per_s"], last["peak_rss_bytes"] / 2**20, last.get("mfu", float("nan")))
EOF
) || { echo "bench_small: could not read $TMP/run_mt/metrics.jsonl"; exit 1; }
read -r MT_TPS MT_RSS MT_MFU <<< "$MT"
MT_RSS_TIME=$(maxrss_mb "$TMP/time_mt.txt")

# ---- PyTorch ------------------------------------------------------------------------------
PT_TPS=""; PT_RSS=""; PT_RSS_TIME=""
if [ "${BENCH_SKIP_TORCH:-0}" != 1 ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "--- PyTorch (moe_ref.py train)"
  if [ ${#TIMEV[@]} -gt 0 ]; then TV=("${TIMEV[@]}" "$TMP/time_pt.txt"); else TV=(); fi
  if ! "${TV[@]}" "$PY" "$REF" train --config "$CFG_FILE" --data "$TMP/data" --steps "$STEPS" --batch $B \
       --seq $T --threads $THREADS > "$TMP/pt.log" 2>&1; then
    tail -30 "$TMP/pt.log"; echo "bench_small: moe_ref.py train failed"; exit 1
  fi
  grep -E '^(blas|train|step)' "$TMP/pt.log" | sed 's/^/    /'
  line=$(grep '^summary ' "$TMP/pt.log" | tail -1)
  PT_TPS=$(sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p' <<< "$line")
  PT_RSS=$(sed -n 's/.*peak_rss_mb=\([^ ]*\).*/\1/p' <<< "$line")
  PT_RSS_TIME=$(maxrss_mb "$TMP/time_pt.txt")
else
  echo "--- PyTorch skipped (BENCH_SKIP_TORCH=1 or no python3-torch)"
fi

# ---- table ---------------------------------------------------------------------------------
"$PY" - "$MT_TPS" "$MT_RSS" "${MT_RSS_TIME:-}" "$MT_MFU" "${PT_TPS:-}" "${PT_RSS:-}" "${PT_RSS_TIME:-}" <<'EOF'
import sys
def f(s):
    try:
        return float(s)
    except ValueError:
        return None
mt_tps, mt_rss, mt_rss_t, mt_mfu, pt_tps, pt_rss, pt_rss_t = map(f, sys.argv[1:])
def s(v, fmt="{:.1f}"):
    return fmt.format(v) if v is not None else "-"
print()
print(f"{'':12} {'tokens/s':>10} {'peak RSS MiB':>13} {'(time -v)':>10} {'MFU':>7}")
print(f"{'moetrain':12} {s(mt_tps):>10} {s(mt_rss):>13} {s(mt_rss_t):>10} {s(mt_mfu, '{:.3f}'):>7}")
if pt_tps is not None:
    print(f"{'PyTorch':12} {s(pt_tps):>10} {s(pt_rss):>13} {s(pt_rss_t):>10} {'':>7}")
    r_t = mt_tps / pt_tps if pt_tps else None
    r_m = mt_rss / pt_rss if pt_rss else None
    print(f"{'ratio mt/pt':12} {s(r_t, '{:.2f}x'):>10} {s(r_m, '{:.2f}x'):>13}")
EOF
