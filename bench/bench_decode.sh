#!/usr/bin/env bash
# Decode benchmark of the "small" config: moetrain's batched KV-cache rollout engine
# (`moetrain generate --prompts FILE --batch S`) against the PyTorch KV-cache decoder of the same
# model (bench/decode_ref.py), greedy, same checkpoint, same prompts, same threads, in one run:
#   (a) moetrain generate --batch 64   (b) moetrain generate --batch 1   (c) decode_ref.py --batch 64
#   (d) (a) with MT_DECODE_BLAS=1: the decode's products on OpenBLAS instead of the few-row kernel
# and a table of tokens/s with the ratios (a)/(c), (a)/(b) and (a)/(d), plus how many completions
# of (a) agree with (c) (and with (b), (d)). (a), (d) and (c) run BENCH_REPEAT rounds, alternated
# (a d c a d c ...): the table shows each side's best round (least seconds), the ratios are of
# those, and each round's own (a)/(c) and (a)/(d) ratios are listed with their median, so one
# busy minute on a shared machine moves one round, not the result. The checkpoint is barely trained (one step), so greedy
# decoding sits on near-ties and some disagreement is expected: it is reported, not failed.
#
# Usage: bench/bench_decode.sh [path/to/moetrain]      (default: build/moetrain of this tree)
# Env:   MT_BENCH_TMP      scratch dir (default ${TMPDIR:-/tmp}/bench_decode.PID, removed after)
#        BENCH_THREADS     threads of both sides (default 2)
#        BENCH_PROMPTS     number of prompts (default 64)
#        BENCH_MAX_NEW     new tokens per prompt at most (default 32)
#        BENCH_BATCH       batch of (a) and (c) (default 64)
#        BENCH_REPEAT      rounds of (a), (d), (c) (default 3)
#        BENCH_TORCH_BATCH1=1  also run decode_ref.py --batch 1 (slow: ~30 s on 2 cores)
#        MT_CPU_TIER       avx2 | avx512: moetrain's kernels at that tier, and PyTorch limited to
#                          the same instruction set (decode_ref.py imports moe_ref.py, which sets it)
#        BENCH_SKIP_C=1    PyTorch side only (to test this script before `generate --prompts`
#                          exists); otherwise the script stops if moetrain lacks it
#
# Tokens/s on each side is what the program prints on its last line,
# `decode: T tokens in S seconds = X tokens/s (batch S)` ("S s" accepted too): T counts every generated token
# including the end-of-text that stopped a sequence, S covers prefill + decode (not loading).
set -u
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
MOETRAIN=${1:-$SRC/build/moetrain}
MOETRAIN=$(cd "$(dirname "$MOETRAIN")" 2>/dev/null && pwd)/$(basename "$MOETRAIN")
PY=/usr/bin/python3
REF="$SRC/bench/decode_ref.py"
THREADS=${BENCH_THREADS:-2}
NPROMPTS=${BENCH_PROMPTS:-64}
MAXNEW=${BENCH_MAX_NEW:-32}
BATCH=${BENCH_BATCH:-64}
REPEAT=${BENCH_REPEAT:-3}
SKIP_C=${BENCH_SKIP_C:-0}
[ -x "$MOETRAIN" ] || { echo "bench_decode: $MOETRAIN is not an executable"; exit 1; }
"$PY" -c 'import torch' >/dev/null 2>&1 || { echo "bench_decode: $PY has no torch (apt install python3-torch)"; exit 1; }
if [ "$SKIP_C" != 1 ]; then
  # the batched engine's flag set: generate --prompts FILE ... --batch S
  if ! "$MOETRAIN" generate --help 2>&1 | grep -q -- '--prompts'; then
    echo "bench_decode: $MOETRAIN generate has no --prompts flag: the batched KV-cache engine"
    echo "bench_decode: (generate --prompts FILE --max-new N --temperature 0 --batch S) is not in this"
    echo "bench_decode: binary yet; rebuild once it has landed (BENCH_SKIP_C=1 runs the PyTorch side only)"
    exit 2
  fi
  if ! "$MOETRAIN" generate --help 2>&1 | grep -q -- '--batch'; then
    echo "bench_decode: $MOETRAIN generate has --prompts but no --batch flag"; exit 2
  fi
fi

TMP=${MT_BENCH_TMP:-${TMPDIR:-/tmp}/bench_decode.$$}
KEEP=${MT_BENCH_TMP:+1}
mkdir -p "$TMP"
cleanup() { [ -z "$KEEP" ] && rm -rf "$TMP"; }
trap cleanup EXIT

# config: the repo's configs/small.json when present (passed as a path: a folder named
# `small` in the working directory would shadow the preset name), else the same numbers
if [ -f "$SRC/configs/small.json" ]; then
  CFG_FILE="$SRC/configs/small.json"
else
  CFG_FILE="$TMP/small.json"
  cat > "$CFG_FILE" <<'EOF'
{"vocab_size": 8192, "hidden_size": 512, "num_hidden_layers": 8, "first_k_dense_replace": 1,
 "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 1408,
 "max_position_embeddings": 4096, "n_routed_experts": 16, "num_experts_per_tok": 2,
 "n_shared_experts": 1, "moe_intermediate_size": 352, "aux_loss_alpha": 0.01,
 "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "model_type": "moetrain"}
EOF
fi
CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
[ -n "$CPU_MODEL" ] || CPU_MODEL=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo)
has() { case " ${FLAGS#*:} " in *" $1 "*) echo yes ;; *) echo no ;; esac; }
echo "bench_decode: config $CFG_FILE, $NPROMPTS prompts, max-new $MAXNEW, batch $BATCH, greedy, $THREADS threads, scratch $TMP"
echo "machine: $(nproc) CPUs, $CPU_MODEL, avx512f $(has avx512f), avx512_bf16 $(has avx512_bf16), load $(cut -d' ' -f1-3 /proc/loadavg)${MT_CPU_TIER:+, MT_CPU_TIER=$MT_CPU_TIER}"

cd "$SRC" || exit 1
# ---- checkpoint: one training step of "small" on the math corpus ---------------------------
if ! "$MOETRAIN" data math --out "$TMP/data" --train 2000 --val 300 > "$TMP/data.log" 2>&1; then
  tail -20 "$TMP/data.log"; echo "bench_decode: moetrain data math failed"; exit 1
fi
if ! "$MOETRAIN" train --config "$CFG_FILE" --data "$TMP/data" --steps 1 --batch 1 --seq 64 --threads "$THREADS" \
     --out "$TMP/run" --quiet > "$TMP/train.log" 2>&1; then
  tail -20 "$TMP/train.log"; echo "bench_decode: moetrain train failed"; exit 1
fi
# ---- prompts: distinct random 2-digit additions "a+b=", fixed seed --------------------------
"$PY" - "$TMP/prompts.txt" "$NPROMPTS" <<'EOF' || { echo "bench_decode: could not write prompts"; exit 1; }
import random, sys
r, seen = random.Random(20240601), []
while len(seen) < int(sys.argv[2]):
    p = "%d+%d=" % (r.randint(10, 99), r.randint(10, 99))
    if p not in seen:
        seen.append(p)
open(sys.argv[1], "w").write("".join(p + "\n" for p in seen))
EOF
echo "prompts: $TMP/prompts.txt ($(head -3 "$TMP/prompts.txt" | paste -sd' ') ...), checkpoint $TMP/run"

# ---- runs -------------------------------------------------------------------------------------
# run NAME CMD...: output to $TMP/NAME.out, prints "tokens seconds tokens/s wall_s"
run() {
  local name=$1; shift
  echo "--- $*" >&2
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$@" > "$TMP/$name.out" 2> "$TMP/$name.err"; then
    tail -20 "$TMP/$name.err" >&2; echo "bench_decode: $name failed: $*" >&2; return 1
  fi
  t1=$(date +%s.%N)
  local line
  line=$(grep -a '^decode: ' "$TMP/$name.out" | tail -1)
  echo "    $line" >&2
  # decode: T tokens in S seconds = X tokens/s (batch S)
  # ("seconds" or "s")
  read -r tok secs tps <<< "$(sed -n 's/^decode: \([0-9]*\) tokens in \([0-9.eE+-]*\) s\(econds\)\{0,1\} = \([0-9.eE+-]*\) tokens\/s.*/\1 \2 \4/p' <<< "$line")"
  [ -n "${tps:-}" ] || { echo "bench_decode: $name: no 'decode: T tokens in S seconds = X tokens/s' line in $TMP/$name.out" >&2; return 1; }
  echo "$tok $secs $tps $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
}
ROWS=()
# round r of (a), (d), (c); round 1's outputs are c_bB, c_blas, pt_bB (the agreement reads them)
for r in $(seq 1 "$REPEAT"); do
  sfx=$([ "$r" = 1 ] || echo ".r$r")
  if [ "$SKIP_C" != 1 ]; then
    out=$(run c_b$BATCH$sfx "$MOETRAIN" generate --ckpt "$TMP/run" --prompts "$TMP/prompts.txt" --max-new "$MAXNEW" \
          --temperature 0 --batch "$BATCH" --threads "$THREADS") || exit 1
    ROWS+=("c_b$BATCH$sfx moetrain_batch_$BATCH $out")
    out=$(MT_DECODE_BLAS=1 run c_blas$sfx "$MOETRAIN" generate --ckpt "$TMP/run" --prompts "$TMP/prompts.txt" \
          --max-new "$MAXNEW" --temperature 0 --batch "$BATCH" --threads "$THREADS") || exit 1
    ROWS+=("c_blas$sfx moetrain_b${BATCH}_OpenBLAS $out")
  elif [ "$r" = 1 ]; then
    echo "--- moetrain generate skipped (BENCH_SKIP_C=1)" >&2
  fi
  out=$(run pt_b$BATCH$sfx "$PY" "$REF" --ckpt "$TMP/run" --prompts "$TMP/prompts.txt" --max-new "$MAXNEW" \
        --batch "$BATCH" --threads "$THREADS") || exit 1
  ROWS+=("pt_b$BATCH$sfx PyTorch_batch_$BATCH $out")
done
if [ "$SKIP_C" != 1 ]; then
  out=$(run c_b1 "$MOETRAIN" generate --ckpt "$TMP/run" --prompts "$TMP/prompts.txt" --max-new "$MAXNEW" \
        --temperature 0 --batch 1 --threads "$THREADS") || exit 1
  ROWS+=("c_b1 moetrain_batch_1 $out")
fi
if [ "${BENCH_TORCH_BATCH1:-0}" = 1 ]; then
  out=$(run pt_b1 "$PY" "$REF" --ckpt "$TMP/run" --prompts "$TMP/prompts.txt" --max-new "$MAXNEW" \
        --batch 1 --threads "$THREADS") || exit 1
  ROWS+=("pt_b1 PyTorch_batch_1 $out")
fi

# ---- table and agreement ----------------------------------------------------------------------
printf '%s\n' "${ROWS[@]}" | "$PY" -c '
import sys
tmp, prompts_file, B = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = [l.rstrip(b"\n") for l in open(prompts_file, "rb") if l.strip()]
rows, rounds, order = {}, {}, []
for line in sys.stdin:
    f = line.split()
    r = dict(label=f[1].replace("_", " "), tok=int(f[2]), secs=float(f[3]), tps=float(f[4]), wall=float(f[5]))
    key = f[0].split(".r")[0]  # round 1 is the plain name, round k the name + ".rk"
    rounds.setdefault(key, []).append(r)
    if key not in order:
        order.append(key)
for k in order:  # the best round of each side
    rows[k] = min(rounds[k], key=lambda r: r["secs"])
print()
print("%-22s %8s %9s %11s %11s %7s" % ("", "tokens", "seconds", "tokens/s", "wall s *", "rounds"))
for k in order:
    r = rows[k]
    print("%-22s %8d %9.3f %11.1f %11.2f %7d" % (r["label"], r["tok"], r["secs"], r["tps"], r["wall"], len(rounds[k])))
print("* wall s: the whole command, loading included; seconds: the best of the rounds")
def ratio(a, b, what):
    if a in rows and b in rows:
        print("%-44s %7.2fx" % (what, rows[a]["tps"] / rows[b]["tps"]))
def per_round(a, b, what):
    if a in rounds and b in rounds and len(rounds[a]) > 1 and len(rounds[a]) == len(rounds[b]):
        q = [x["tps"] / y["tps"] for x, y in zip(rounds[a], rounds[b])]
        m = sorted(q)[len(q) // 2] if len(q) % 2 else sum(sorted(q)[len(q) // 2 - 1:len(q) // 2 + 1]) / 2
        print("%-44s %s, median %.2fx" % (what + ", by round:", ", ".join("%.2fx" % x for x in q), m))
print()
ratio("c_b" + B, "pt_b" + B, "moetrain batch %s / PyTorch batch %s" % (B, B))
ratio("c_b" + B, "c_b1", "moetrain batch %s / moetrain batch 1" % B)
ratio("c_b" + B, "c_blas", "moetrain batch %s / the same on OpenBLAS" % B)
ratio("pt_b" + B, "pt_b1", "PyTorch batch %s / PyTorch batch 1" % B)
per_round("c_b" + B, "pt_b" + B, "moetrain / PyTorch batch %s" % B)
per_round("c_b" + B, "c_blas", "moetrain / OpenBLAS batch %s" % B)

def completions(name):
    """prompt -> completion; a line that does not start with a known prompt and a tab
    continues the previous completion (a generated newline byte)"""
    known = set(prompts)
    out, cur = {}, None
    lines = open("%s/%s.out" % (tmp, name), "rb").read().split(b"\n")
    for ln in lines:
        if ln.startswith(b"decode: "):
            break
        p, tab, rest = ln.partition(b"\t")
        if tab and p in known and p not in out:
            cur = p
            out[p] = rest
        elif cur is not None:
            out[cur] += b"\n" + ln
    return out

def agree(a, b):
    if a not in rows or b not in rows:
        return
    A, Bc = completions(a), completions(b)
    n = sum(1 for p in prompts if p in A and p in Bc and A[p] == Bc[p])
    miss = [p for p in prompts if p not in A or p not in Bc]
    print("%-44s %d / %d completions agree%s" % ("%s vs %s:" % (rows[a]["label"], rows[b]["label"]), n, len(prompts),
          (", %d prompts missing from an output" % len(miss)) if miss else ""))
    shown = 0
    for p in prompts:
        if p in A and p in Bc and A[p] != Bc[p] and shown < 3:
            x, y = A[p], Bc[p]
            i = 0
            while i < min(len(x), len(y)) and x[i] == y[i]:
                i += 1
            print("    %s  first difference at byte %d: %r | %r" % (p.decode("latin-1"), i, x[i:i + 24], y[i:i + 24]))
            shown += 1
print()
agree("c_b" + B, "pt_b" + B)
agree("c_b" + B, "c_b1")
agree("c_b" + B, "c_blas")
agree("pt_b" + B, "pt_b1")
' "$TMP" "$TMP/prompts.txt" "$BATCH"
