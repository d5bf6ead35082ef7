#!/usr/bin/env bash
# Overlap of the expert all-to-all with compute (issue 24): EP2 over two emulated nodes (one
# rank each, one thread each) on a demo-shaped model twice as wide (hidden 256, 8 experts
# top-2, OV_ACCUM (16) micro-batches of 8 x 128 tokens per rank), the inter-node link
# emulated by --wire.
# Variants, run round-robin OV_REPS times each (the median step time counts):
#   nowire  --overlap off, no wire: the step without link time (the floor)
#   off     --overlap off over the wire: every exchange blocks
#   block   --overlap block: the shared experts computed while combine / gather travel
#   pipe    --overlap pipe: the forward of micro-batch i+1 and the backward of i as two fibers
# Reported per variant: the median steady step time (metrics summary step_time_s), the
# communication share of the step the trainer measured (time in exchanges that nothing
# hid) on rank 0 and on the busiest rank (summary comm_share_min: the least any rank waited,
# what the step loses to exchanges; the other rank's excess waits for the busiest one's
# experts), the exposed all-to-all from the trace (--profile: the time inside the expert
# exchanges' spans that the other fiber did not fill, waits in place included, the exchange's own
# packing and sums (moe.permute spans) counted as compute,
# over the step; least over the ranks), the share of the wire's cost it hides:
# (off - X) / (off - nowire), and the EP ranks' load imbalance (summary ep_imbalance, busiest rank's rows over the mean);
# for the pipe variants the steady state's exposure: the same exposed all-to-all inside the
# overlapped pairs over the pairs' time (profile a2a_paired_s / paired_s; the first forward
# and the last backward of a step, the pipeline's fill and drain, have nothing to pair with;
# same rank as a2a busiest);
# then the pipe run's exposed time split by cause (the link, a peer still computing, MPI) and
# by exchange (bench/a2a_waits.py on its traces). Every
# variant's losses must equal the blocking run's bit for bit (else FAIL).
# With OV_BALANCE=N > 0 (default 1) two more variants place the experts anew from the load
# every N steps (train --expert-balance N, train/balance.h): nowire-bal (as nowire) and
# pipe-bal (as pipe); top-2 routing makes their losses the others' bits too.
#
# Usage: bash bench/bench_overlap.sh path/to/moetrain
# The dense gradients (over DP 2, across the nodes) go over the wire too, in buckets of
# OV_BUCKET_MB; block and pipe start them during the last backward, off after it.
# Steady state: every variant starts from a checkpoint the script first trains for OV_WARM
# steps (blocking, no wire): from a fresh init the router sends most tokens to one expert for
# the first tens of steps (max/mean tokens per expert ~4 at steps 1-5, 1.1-1.3 from step 100),
# and the EP ranks' imbalance, not communication, then dominates the waits. OV_WARM=0 measures
# from the init as before.
# The wire: the issue asks for a link slow enough that the blocking run exposes >= 30% of its
# step. OV_WIRE=auto (the default) sets it from the first nowire run: the bandwidth at which
# the exchanges' inter-node bytes per rank and step (metrics a2a_inter_bytes over the ranks)
# take OV_SHARE (0.32) of the blocking step, i.e. OV_SHARE / (1 - OV_SHARE) of the nowire
# step, latency 50 us; so the ratio holds on a fast CPU and a slow one. The table's "off" row
# shows the share it got.
# Env: OV_WIRE (auto, or GBPS,US: GB/s per rank, latency us), OV_SHARE (0.32), OV_REPS (3), OV_STEPS (4), OV_WARM (150),
#      OV_ACCUM (16: micro-batches per step; the pipe schedule pairs all but one forward and one
#      backward; the warm-up always runs 4), OV_BUCKET_MB (1), OV_FLAGS (more train flags for
#      the warm-up and every variant, e.g. --dist-opt, --aux-scope ep-group), MT_BENCH_TMP (scratch, kept when given; each run's
#      trace_rank*.json is there)
set -u
MT=${1:?usage: bash bench/bench_overlap.sh path/to/moetrain}
case "$MT" in /*) ;; *) MT="$PWD/$MT" ;; esac
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
WIRE=${OV_WIRE:-auto}
SHARE=${OV_SHARE:-0.32}
REPS=${OV_REPS:-3}
STEPS=${OV_STEPS:-4}
BUCKET=${OV_BUCKET_MB:-1}
ACCUM=${OV_ACCUM:-16}
BAL=${OV_BALANCE:-1}
VARIANTS=(nowire off block pipe)
[ "$BAL" -gt 0 ] && VARIANTS+=(nowire-bal pipe-bal)
read -r -a EXTRA <<< "${OV_FLAGS:-}"
TMP=${MT_BENCH_TMP:-$(mktemp -d "${TMPDIR:-/tmp}/bench_overlap.XXXXXX")}
KEEP=${MT_BENCH_TMP:+1}
mkdir -p "$TMP"
trap '[ -z "$KEEP" ] && rm -rf "$TMP"' EXIT
source "$SRC/tests/lib/mpirun.sh"
[ ${#MPI[@]} -gt 0 ] || { echo "bench_overlap: mpirun not found"; exit 1; }
export OMP_NUM_THREADS=1

sed -e 's/"hidden_size": 128/"hidden_size": 256/' -e 's/"moe_intermediate_size": 128/"moe_intermediate_size": 256/' \
    -e 's/"intermediate_size": 384/"intermediate_size": 768/' "$SRC/configs/demo.json" > "$TMP/ov.json"
"$MT" data math --out "$TMP/data" --train 20000 --val 200 > /dev/null || exit 1
WARM=${OV_WARM:-150}
INIT=()
if [ "$WARM" -gt 0 ]; then
    "${MPI[@]}" -np 2 "$MT" train --config "$TMP/ov.json" --data "$TMP/data" --batch 8 --seq 128 --accum 4 \
        --lr 1e-3 --warmup 20 --threads 1 --steps "$WARM" --eval-every 0 --quiet --ep 2 --ranks-per-node 1 \
        --overlap off --save-every 0 "${EXTRA[@]}" --out "$TMP/warm" > "$TMP/warm.log" 2>&1 || { tail -5 "$TMP/warm.log"; echo "FAIL: warm-up run"; exit 1; }
    INIT=(--init "$TMP/warm")
fi
echo "bench_overlap: $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores; EP2 over 2 emulated nodes, wire $WIRE, buckets $BUCKET MiB ${OV_FLAGS:-}"
echo "  model: demo x2 wide (hidden 256, 8 experts top-2), $ACCUM x 8 x 128 tokens per rank per step, $STEPS steps, $REPS runs each, from step $WARM"

losses() { grep '"event":"step"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
run() { # name rep flags...
    local n=$1 r=$2
    shift 2
    "${MPI[@]}" -np 2 "$MT" train --config "$TMP/ov.json" --data "$TMP/data" --batch 8 --seq 128 --accum "$ACCUM" \
        --lr 1e-3 --warmup 2 --threads 1 --steps "$STEPS" --eval-every 0 --quiet --ep 2 --ranks-per-node 1 \
        --bucket-mb "$BUCKET" "${INIT[@]}" "${EXTRA[@]}" --profile --out "$TMP/$n.$r" "$@" > "$TMP/$n.$r.log" 2>&1 || { tail -5 "$TMP/$n.$r.log"; echo "FAIL: $n run $r"; exit 1; }
}
auto_wire() { # from nowire.1: GB/s at which the wire takes SHARE of the blocking step
    grep '"event":"step"' "$TMP/nowire.1/metrics.jsonl" | awk -v share="$SHARE" \
        -v st="$(grep '"event":"summary"' "$TMP/nowire.1/metrics.jsonl" | sed -E 's/.*"step_time_s":([0-9.eE+-]+).*/\1/')" '
        { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
          match($0, /"a2a_inter_bytes":[0-9]+/); if (s > 1) { b += substr($0, RSTART + 18, RLENGTH - 18) / 2; n++ } }
        END { if (n == 0 || st <= 0) exit 1; printf "%.4f,50\n", b / n / (share / (1 - share) * st) / 1e9 }'
}
for r in $(seq 1 "$REPS"); do
    run nowire "$r" --overlap off
    if [ "$WIRE" = auto ]; then
        WIRE=$(auto_wire) || { echo "FAIL: no exchange bytes in the nowire run to set the wire from"; exit 1; }
        echo "  wire: $WIRE (GB/s per rank, us): the inter-node exchange bytes take $SHARE of the blocking step"
    fi
    run off "$r" --overlap off --wire "$WIRE"
    run block "$r" --overlap block --wire "$WIRE"
    run pipe "$r" --overlap pipe --wire "$WIRE"
    if [ "$BAL" -gt 0 ]; then
        run nowire-bal "$r" --overlap off --expert-balance "$BAL"
        run pipe-bal "$r" --overlap pipe --wire "$WIRE" --expert-balance "$BAL"
    fi
done
fail=0
for n in "${VARIANTS[@]}"; do
    [ "$n" = off ] && continue
    [ "$(losses "$TMP/off.1/metrics.jsonl")" = "$(losses "$TMP/$n.1/metrics.jsonl")" ] \
        || { echo "FAIL: $n: losses differ from the blocking run"; fail=1; }
done
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
summary_of() { grep '"event":"summary"' "$TMP/$1.$2/metrics.jsonl" | sed -E "s/.*\"$3\":([0-9.eE+-]+).*/\1/"; }
summary() { # name key: the median over the runs of the summary's key
    for r in $(seq 1 "$REPS"); do summary_of "$1" "$r" "$2"; done | median
}
busiest() { # name run: the busiest rank's (least a2a_s) exposed all-to-all over the step, and
    # inside the overlapped pairs over their time ("nan" without pairs)
    awk -v st="$(summary_of "$1" "$2" step_time_s)" '
        function num(k) { return match($0, "\"" k "\":[0-9.eE+-]+") ? substr($0, RSTART + length(k) + 3) + 0 : 0 }
        /"event":"profile"/ { a = num("a2a_s")
            if (m == "" || a < m) { m = a; p = num("paired_s"); s = p > 0 ? num("a2a_paired_s") / p : "nan" } }
        END { print m / st, s }' "$TMP/$1.$2/metrics.jsonl"
}
a2a() { # name: the median over the runs of busiest's first figure
    for r in $(seq 1 "$REPS"); do busiest "$1" "$r" | cut -d' ' -f1; done | median
}
steady() { # name: the median over the runs of the steady state's exposure (pipe variants)
    for r in $(seq 1 "$REPS"); do busiest "$1" "$r" | cut -d' ' -f2; done | median
}
t0=$(summary nowire step_time_s)
toff=$(summary off step_time_s)
printf "  %-10s %9s %13s %13s %12s %12s %12s %9s\n" variant "step s" "comm rank 0" "comm busiest" "a2a busiest" "a2a steady" "wire hidden" "ep imb."
for n in "${VARIANTS[@]}"; do
    t=$(summary $n step_time_s)
    c=$(summary $n comm_share)
    cm=$(summary $n comm_share_min)
    im=$(summary $n ep_imbalance)
    ea=$(a2a $n)
    es=-
    case $n in pipe*) es=$(steady $n) ;; esac
    awk -v n=$n -v t="$t" -v c="$c" -v cm="$cm" -v ea="$ea" -v es="$es" -v im="$im" -v t0="$t0" -v toff="$toff" 'BEGIN {
        h = (toff > t0) ? (toff - t) / (toff - t0) : 0
        st = (es == "-" || es == "nan") ? "-" : sprintf("%.1f%%", 100 * es)
        printf "  %-10s %9.3f %12.1f%% %12.1f%% %11.1f%% %12s %11.0f%% %9.3f\n", n, t, 100 * c, 100 * cm, 100 * ea, st, (n ~ /^nowire/ || n == "off") ? 0 : 100 * h, im }'
done
echo "  pipe's exposed exchange time by cause and exchange (run 1; bench/a2a_waits.py):"
python3 "$SRC/bench/a2a_waits.py" "$TMP/pipe.1" | sed 's/^/    /'
[ $fail = 0 ] && echo "bench_overlap: losses of every variant identical to the blocking run"
exit $fail
