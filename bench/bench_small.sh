#!/usr/bin/env bash
# Peer benchmark of the "small" config: moetrain vs the PyTorch implementation of the same
# model (tests/oracle/moe_ref.py), same data, batch 8 x seq 512, 2 threads, in each precision
# both sides have: fp32, and mixed precision (moetrain --bf16; PyTorch torch.autocast(bfloat16),
# whose matrix products run in oneDNN's bf16 kernels). Ratios compare like with like, and the
# fastest of each side (PyTorch given its best settings).
#
# Usage: bench/bench_small.sh path/to/moetrain [steps]      (steps default 12)
# Env:   MT_BENCH_TMP  scratch dir (default ${TMPDIR:-/tmp}/bench_small.PID, removed after)
#        BENCH_SKIP_TORCH=1  run moetrain only
#        MT_CPU_TIER         avx2 | avx512: moetrain's kernels at that tier, and PyTorch limited to
#                            the same instruction set (moe_ref.py sets ATen's, oneDNN's and, for
#                            avx2, OpenBLAS's Haswell kernel from it)
#        MT_TRAIN_ARGS       extra flags for moetrain train (e.g. "--recompute selective")
#        BENCH_PRECISIONS    "fp32 bf16" (default), or one of them; bf16 is skipped on a CPU
#                            without AVX512-BF16
#        BENCH_ROUNDS        rounds of the whole comparison (default 1); with more, the table
#                            also gives the median of the rounds' ratios and best round / best
#                            round (PyTorch's speed moves by ~25% between runs on a shared machine)
#
# small: vocab 8192, hidden 512, 8 layers (first dense), 8 heads, 8 kv heads, head_dim 64,
# intermediate 1408, 16 routed experts, top-2, 1 shared expert, moe_intermediate 352.
# tokens/s counts the steps after the first third on both sides (sum of tokens / sum of step
# times); peak RSS is the process's VmHWM (MiB = 2^20 bytes), cross-checked with
# /usr/bin/time -v when available.
set -u
MOETRAIN=${1:?usage: bench/bench_small.sh path/to/moetrain [steps]}
STEPS=${2:-12}
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MOETRAIN=$(cd "$(dirname "$MOETRAIN")" && pwd)/$(basename "$MOETRAIN")
PY=/usr/bin/python3
REF="$SRC/tests/oracle/moe_ref.py"
B=8; T=512; THREADS=2
[ -x "$MOETRAIN" ] || { echo "bench_small: $MOETRAIN is not an executable"; exit 1; }
[ "$STEPS" -ge 2 ] 2>/dev/null || { echo "bench_small: steps must be >= 2 (the first is warm-up)"; exit 1; }
# tokens/s of both sides over the same window: the steps after the first third (at least the
# first step) — PyTorch keeps speeding up for several steps (its allocator and oneDNN's
# caches warm up; under autocast it gains ~30% between steps 2 and 6), so the first steps
# alone would understate it
SKIP=$(( STEPS / 3 > 1 ? STEPS / 3 : 1 ))

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
echo "bench_small: config $CFG_FILE, batch $B x seq $T, $STEPS steps (tokens/s over steps $((SKIP + 1))-$STEPS), $THREADS threads, scratch $TMP"
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

# ---- runs ---------------------------------------------------------------------------------
# run_mt NAME FLAGS... / run_pt NAME FLAGS...: print "tokens/s peak_rss_MiB rss_time_MiB mfu peak"
# (progress to stderr); run_mt returns 2 when the CPU cannot run the precision
run_mt() {
  local name=$1; shift
  echo "--- moetrain train $* ${MT_TRAIN_ARGS:-}" >&2
  rm -rf "$TMP/run_$name"
  if [ ${#TIMEV[@]} -gt 0 ]; then TV=("${TIMEV[@]}" "$TMP/time_$name.txt"); else TV=(); fi
  if ! "${TV[@]}" "$MOETRAIN" train --config "$CFG_ARG" --data "$TMP/data" --steps "$STEPS" --batch $B --seq $T \
       --threads $THREADS --out "$TMP/run_$name" "$@" ${MT_TRAIN_ARGS:-} > "$TMP/$name.log" 2>&1; then
    if grep -q 'AVX512-BF16' "$TMP/$name.log"; then echo "    skipped: $(tail -1 "$TMP/$name.log")" >&2; return 2; fi
    tail -30 "$TMP/$name.log" >&2; echo "bench_small: moetrain train failed" >&2; return 1
  fi
  tail -n 4 "$TMP/$name.log" | sed 's/^/    /' >&2
  local r
  r=$("$PY" -c '
import json, sys
skip, tokens = int(sys.argv[2]), int(sys.argv[3])
last, secs, n, mfu = None, 0.0, 0, 0.0
for line in open(sys.argv[1]):
    if line.strip():
        last = json.loads(line)
        if last.get("event") == "step" and last["step"] > skip:
            dt = tokens / last["tokens_per_s"]
            secs += dt; n += 1; mfu += last["mfu"] * dt  # time-weighted: the MFU of the window
if not last or last.get("event") != "summary" or n == 0:
    sys.exit("metrics.jsonl: no summary event or no steps after the window start")
print(n * tokens / secs, last["peak_rss_bytes"] / 2**20, mfu / secs, last["peak_gflops"])
' "$TMP/run_$name/metrics.jsonl" "$SKIP" "$((B * T))") || { echo "bench_small: could not read $TMP/run_$name/metrics.jsonl" >&2; return 1; }
  local tps rss mfu peak
  read -r tps rss mfu peak <<< "$r"
  echo "$tps $rss $(maxrss_mb "$TMP/time_$name.txt") $mfu $peak"
}
run_pt() {
  local name=$1; shift
  echo "--- PyTorch (moe_ref.py train $*)" >&2
  if [ ${#TIMEV[@]} -gt 0 ]; then TV=("${TIMEV[@]}" "$TMP/time_$name.txt"); else TV=(); fi
  if ! "${TV[@]}" "$PY" "$REF" train --config "$CFG_FILE" --data "$TMP/data" --steps "$STEPS" --batch $B \
       --seq $T --threads $THREADS "$@" > "$TMP/$name.log" 2>&1; then
    tail -30 "$TMP/$name.log" >&2; echo "bench_small: moe_ref.py train failed" >&2; return 1
  fi
  grep -E '^(blas|train|step)' "$TMP/$name.log" | sed 's/^/    /' >&2
  local line tps
  line=$(grep '^summary ' "$TMP/$name.log" | tail -1)
  # "step S/N ... <ms> ms <tok/s> tok/s": the same window as moetrain's
  tps=$(awk -v skip="$SKIP" -v tok="$((B * T))" '$1 == "step" { split($2, a, "/"); if (a[1] > skip) { ms += $(NF-3); n++ } }
        END { if (n) printf "%.1f", n * tok / (ms / 1000) }' "$TMP/$name.log")
  [ -n "$tps" ] || { echo "bench_small: no step lines in $TMP/$name.log" >&2; return 1; }
  echo "$tps $(sed -n 's/.*peak_rss_mb=\([^ ]*\).*/\1/p' <<< "$line") $(maxrss_mb "$TMP/time_$name.txt") - -"
}

ROWS=()
HAVE_TORCH=0
if [ "${BENCH_SKIP_TORCH:-0}" != 1 ] && "$PY" -c 'import torch' >/dev/null 2>&1; then HAVE_TORCH=1; fi
ROUNDS=${BENCH_ROUNDS:-1}
[ "$ROUNDS" -ge 1 ] 2>/dev/null || { echo "bench_small: BENCH_ROUNDS must be >= 1"; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
[ "$ROUNDS" -gt 1 ] && echo "=== round $round of $ROUNDS" >&2
for prec in ${BENCH_PRECISIONS:-fp32 bf16}; do
  case $prec in
    fp32) mtflags=(); ptflags=(--autocast none) ;;
    bf16) mtflags=(--bf16); ptflags=(--autocast bf16) ;;
    *) echo "bench_small: BENCH_PRECISIONS: unknown precision $prec"; exit 1 ;;
  esac
  rc=0
  out=$(run_mt "mt_$prec" "${mtflags[@]}") || rc=$?
  [ $rc = 1 ] && exit 1
  [ $rc = 2 ] && continue
  ROWS+=("moetrain $prec $round $out")
  if [ $HAVE_TORCH = 1 ]; then
    out=$(run_pt "pt_$prec" "${ptflags[@]}") || exit 1
    ROWS+=("PyTorch $prec $round $out")
  fi
done
done
[ $HAVE_TORCH = 1 ] || echo "--- PyTorch skipped (BENCH_SKIP_TORCH=1 or no python3-torch)"

# ---- table ---------------------------------------------------------------------------------
# Per round: both sides' rows and their ratios (one round = one run: the ratios compare runs
# made minutes apart). With several rounds, the median of the rounds' ratios and the ratio of
# each side's best round. "ceiling": moetrain's tokens/s at 100% of its measured GEMM peak
# (tokens/s / MFU, the same FLOPs per token) over PyTorch's, i.e. the most any kernel work
# could give against that PyTorch run; "2x needs" the MFU at which moetrain would be twice it.
printf '%s\n' "${ROWS[@]}" | "$PY" -c '
import statistics, sys
num = lambda s: float(s) if s not in ("-", "") else None
rows = []
for line in sys.stdin:
    f = line.split() + ["-"] * 8
    if f[0] in ("moetrain", "PyTorch"):
        rows.append(dict(who=f[0], prec=f[1], round=int(f[2]), tps=num(f[3]), rss=num(f[4]), rss_t=num(f[5]),
                         mfu=num(f[6]), peak=num(f[7])))
rounds = sorted({r["round"] for r in rows})
s = lambda v, fmt="{:.1f}": fmt.format(v) if v is not None else "-"
print()
print("%-5s %-18s %10s %13s %10s %7s %11s" % ("round", "", "tokens/s", "peak RSS MiB", "(time -v)", "MFU", "of GFLOP/s"))
for r in rows:
    print("%-5d %-18s %10s %13s %10s %7s %11s" % (r["round"], r["who"] + " " + r["prec"], s(r["tps"]), s(r["rss"]),
                                                s(r["rss_t"]), s(r["mfu"], "{:.3f}"), s(r["peak"], "{:.0f}")))
get = lambda who, prec, rnd: next((r for r in rows if r["who"] == who and r["prec"] == prec and r["round"] == rnd), None)
ok = lambda a, b: a and b and a["tps"] and b["tps"] and a["rss"] and b["rss"]
ratios = {}
print()
for rnd in rounds:
    for prec in ("fp32", "bf16"):
        a, b = get("moetrain", prec, rnd), get("PyTorch", prec, rnd)
        if not ok(a, b):
            continue
        t, m = a["tps"] / b["tps"], a["rss"] / b["rss"]
        ratios.setdefault(prec, []).append((t, m))
        extra = ""
        if a["mfu"]:
            extra = "   ceiling %.2fx, 2x needs MFU %.1f%%" % (a["tps"] / a["mfu"] / b["tps"], 100 * a["mfu"] * 2 * b["tps"] / a["tps"])
        print("%-40s %6.2fx tokens/s %6.2fx peak memory%s" % ("round %d: moetrain / PyTorch, both %s" % (rnd, prec), t, m, extra))
if len(rounds) > 1:
    print()
    for prec, rs in ratios.items():
        print("%-40s %6.2fx tokens/s %6.2fx peak memory (%d rounds)" % ("median: moetrain / PyTorch, both " + prec,
              statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs), len(rs)))
best = lambda who, prec=None: max((r for r in rows if r["who"] == who and r["tps"] and (prec is None or r["prec"] == prec)),
                                  key=lambda r: r["tps"], default=None)
for prec in ratios:
    a, b = best("moetrain", prec), best("PyTorch", prec)
    if len(rounds) > 1 and ok(a, b):
        print("%-40s %6.2fx tokens/s (%.1f / %.1f)" % ("best round / best round, both " + prec, a["tps"] / b["tps"], a["tps"], b["tps"]))
a, b = best("moetrain"), best("PyTorch")
if ok(a, b):
    print("%-40s %6.2fx tokens/s (%s / %s)" % ("fastest / fastest", a["tps"] / b["tps"], a["prec"], b["prec"]))
'
