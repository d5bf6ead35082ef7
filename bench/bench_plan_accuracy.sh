#!/usr/bin/env bash
# The planner against the trainer on this machine (issue 4, item 4): for each layout of the
# "small" config, the step time and peak memory per rank that `moetrain plan` predicts from
# a calibrated cluster file, next to what `moetrain train` measures (its metrics.jsonl
# summary: step_time_s = mean step time without the first step, peak_rss_bytes_per_rank).
# PASS when the step time is within 15% and the peak memory (max over ranks) within 10%.
#
# Usage: bash bench/bench_plan_accuracy.sh path/to/moetrain [calib.json]
#   without calib.json the script calibrates first, with as many ranks as the largest row:
#     mpirun -np 4 --bind-to none moetrain bench --calibrate CAL --threads 1
#   (the per-thread-count figures of one rank alone, then MPI on 2 and on 4 ranks at once)
# Env: MT_BENCH_TMP   scratch dir (kept when given; default a fresh dir, removed after)
#      PA_STEPS       training steps per layout (default 4: the first is not timed)
#      PA_RUNS        trainings per layout (default 1); the row's measured step is the least of
#                     their step times, as the calibration keeps each figure's best of its
#                     rounds (a figure taken in a busy minute then does not stand against one
#                     taken in a quiet one); every run's step time is listed under the table
#      PA_ONLY        run only the layouts whose name matches this regex
#      PA_CAL_QUICK=1 calibrate with --quick (~7 s instead of ~30 s; the short timings of
#                     the 2-thread GEMMs are noisier on a shared machine)
#      PA_QUIET_WAIT  seconds to wait before each measurement for an idle machine (>= 90% of
#                     the CPU time idle over one second; default 120, 0 = do not wait)
# Exit: 0 when every row that ran passes, 1 otherwise.
#
# Every rank count runs under mpirun with --bind-to none: a "device" of the planner is one
# rank with its threads, and the ranks of the node share its cores (the calibrated file's
# cpu section; `plan --threads T --devices-per-node N`). Without --bind-to none Open MPI
# binds each of <= 2 ranks to one core, so 1 rank x 2 threads would run on one core.
set -u
MOETRAIN=${1:?usage: bash bench/bench_plan_accuracy.sh path/to/moetrain [calib.json]}
CAL_IN=${2:-}
case "$MOETRAIN" in /*) ;; *) MOETRAIN="$PWD/$MOETRAIN" ;; esac
[ -x "$MOETRAIN" ] || { echo "bench_plan_accuracy: $MOETRAIN is not an executable"; exit 1; }
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$SRC" || exit 1  # configs/ (the "small" preset)
PY=$(command -v python3) || { echo "bench_plan_accuracy: python3 is needed"; exit 1; }
STEPS=${PA_STEPS:-4}
SEQ=256
TMP=${MT_BENCH_TMP:-$(mktemp -d "${TMPDIR:-/tmp}/plan_accuracy.XXXXXX")}
KEEP=${MT_BENCH_TMP:+1}
mkdir -p "$TMP"
cleanup() { [ -z "$KEEP" ] && rm -rf "$TMP"; }
trap cleanup EXIT
MPI=(mpirun)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
    MPI+=(--oversubscribe --bind-to none)
    [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
fi

# ---- the layouts --------------------------------------------------------------------------
# name | ranks | threads per rank | flags of `moetrain train` | `moetrain plan --layout`
# The plan's global batch is batch x accum x DP (DP = ranks / (pp x tp)), its --no-dist-opt
# follows the absence of --dist-opt. The planner's rc= names are the trainer's --recompute
# names (docs/PLAN.md). A row runs only when `moetrain train --help` lists every flag it uses
# (the EP / PP rows wait for those flags). Rows with --bf16 (every GEMM in bf16 with fp32
# sums) are planned with `plan --bf16` (the calibrated bf16 GEMM) and need AVX512-BF16.
# The ep2-nodes / ep2-wire rows put each rank on its own emulated node (--ranks-per-node 1,
# planned with --devices-per-node 1), the wire rows with the expert exchanges over an
# emulated link (train --wire, planned with plan --wire), blocking and with the overlapped
# schedule (--overlap pipe, planned with plan --overlap pipe).
LAYOUTS=(
  "dp1-t2|1|2|--batch 4|mb=4,rc=none"
  "dp1-t1|1|1|--batch 4|mb=4,rc=none"
  "dp1-t2-b8|1|2|--batch 8|mb=8,rc=none"
  "dp1-t2-rcsel|1|2|--batch 4 --recompute selective|mb=4,rc=selective"
  "dp2-t1|2|1|--batch 4|mb=4,rc=none"
  "dp2-t1-distopt|2|1|--batch 4 --dist-opt|mb=4,rc=none"
  "dp2-t1-rcsel|2|1|--batch 4 --recompute selective|mb=4,rc=selective"
  "dp2-t1-accum2|2|1|--batch 2 --accum 2|mb=2,rc=none"
  "dp4-t1|4|1|--batch 2|mb=2,rc=none"
  "dp4-t1-distopt|4|1|--batch 2 --dist-opt|mb=2,rc=none"
  "ep2-t1|2|1|--batch 4 --ep 2|ep=2,mb=4,rc=none"
  "ep4-t1|4|1|--batch 2 --ep 4|ep=4,mb=2,rc=none"
  "pp2-t1|2|1|--batch 2 --accum 4 --pp 2|pp=2,mb=2,rc=none"
  "pp2-vpp2-t1|2|1|--batch 2 --accum 4 --pp 2 --vpp 2|pp=2,vpp=2,mb=2,rc=none"
  "dp2-ep2-hier|4|1|--batch 2 --ep 2 --ranks-per-node 2 --a2a hier|ep=2,mb=2,rc=none,a2a=hier"
  "tp2-sp-t1|2|1|--batch 4 --tp 2 --sp|tp=2,mb=4,rc=none"
  "dp1-t2-bf16|1|2|--batch 4 --bf16|mb=4,rc=none"
  "dp2-t1-bf16|2|1|--batch 4 --bf16|mb=4,rc=none"
  "ep2-t1-bf16|2|1|--batch 4 --ep 2 --bf16|ep=2,mb=4,rc=none"
  "ep2-nodes-t1|2|1|--batch 2 --accum 4 --ep 2 --ranks-per-node 1 --overlap off|ep=2,mb=2,rc=none,a2a=hier"
  "ep2-wire-t1|2|1|--batch 2 --accum 4 --ep 2 --ranks-per-node 1 --overlap off --wire 0.05,50|ep=2,mb=2,rc=none,a2a=hier"
  "ep2-wire-pipe-t1|2|1|--batch 2 --accum 4 --ep 2 --ranks-per-node 1 --overlap pipe --wire 0.05,50|ep=2,mb=2,rc=none,a2a=hier"
)

echo "bench_plan_accuracy: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg), scratch $TMP"
HELP=$("$MOETRAIN" train --help 2>&1)
supported() {  # every --flag of $1 is listed by `train --help` (as --NAME or --[no-]NAME)
    local f
    for f in $(grep -o -- '--[a-z][a-z0-9-]*' <<< "$1"); do
        grep -Eq -- "^ *--(\[no-\])?${f#--} " <<< "$HELP" || return 1
    done
}

# The machine is shared: wait (up to PA_QUIET_WAIT s) until the CPUs are idle, so that the
# calibration and the runs measure this program, not a neighbour's.
idle_share() {  # share of CPU time idle over one second
    local a b
    a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
    awk -v i1="${a[4]}" -v i2="${b[4]}" -v t1="$(IFS=+; echo "$((${a[*]:1}))")" -v t2="$(IFS=+; echo "$((${b[*]:1}))")" \
        'BEGIN { printf "%.2f", (i2 - i1) / (t2 - t1 > 0 ? t2 - t1 : 1) }'
}
wait_quiet() {
    local waited=0 lim=${PA_QUIET_WAIT:-120} idle
    [ "$lim" = 0 ] && return
    while :; do
        idle=$(idle_share)
        awk -v x="$idle" 'BEGIN { exit !(x >= 0.9) }' && return
        if [ "$waited" -ge "$lim" ]; then
            echo "    (machine still busy: ${idle} idle after ${waited} s; measuring anyway)"
            return
        fi
        sleep 4; waited=$((waited + 5))
    done
}

# ---- calibration and data -----------------------------------------------------------------
CAL="$TMP/calibration.json"
if [ -n "$CAL_IN" ]; then
    cp "$CAL_IN" "$CAL" || exit 1
    echo "calibration: $CAL_IN"
else
    Q=
    [ "${PA_CAL_QUICK:-0}" = 1 ] && Q=--quick
    NR=2
    for row in "${LAYOUTS[@]}"; do r=$(cut -d'|' -f2 <<< "$row"); [ "$r" -gt "$NR" ] && NR=$r; done
    wait_quiet
    echo "calibration: ${MPI[*]} -np $NR -x OMP_NUM_THREADS=1 moetrain bench --calibrate $CAL $Q --threads 1"
    if ! "${MPI[@]}" -np "$NR" -x OMP_NUM_THREADS=1 "$MOETRAIN" bench --calibrate "$CAL" $Q --threads 1 > "$TMP/cal.log" 2>&1; then
        cat "$TMP/cal.log"; echo "bench_plan_accuracy: calibration failed"; exit 1
    fi
    sed 's/^/    /' "$TMP/cal.log"
fi
if ! "$MOETRAIN" data math --out "$TMP/data" > "$TMP/data.log" 2>&1; then
    cat "$TMP/data.log"; echo "bench_plan_accuracy: moetrain data math failed"; exit 1
fi

# ---- run every layout ---------------------------------------------------------------------
ROWS="$TMP/rows.tsv"
: > "$ROWS"
for row in "${LAYOUTS[@]}"; do
    IFS='|' read -r name ranks threads flags layout <<< "$row"
    if [ -n "${PA_ONLY:-}" ] && ! grep -Eq "$PA_ONLY" <<< "$name"; then continue; fi
    if ! supported "$flags"; then
        echo "--- $name: skipped (moetrain train does not accept: $flags)"
        continue
    fi
    pbf16=
    if grep -q -- '--bf16' <<< "$flags"; then
        if ! grep -qw avx512_bf16 /proc/cpuinfo; then echo "--- $name: skipped (no AVX512-BF16)"; continue; fi
        pbf16=--bf16
    fi
    batch=$(grep -o -- '--batch [0-9]*' <<< "$flags" | awk '{print $2}'); batch=${batch:-8}
    accum=$(grep -o -- '--accum [0-9]*' <<< "$flags" | awk '{print $2}'); accum=${accum:-1}
    pp=$(sed -n 's/.*[,]pp=\([0-9]*\).*/\1/p' <<< ",$layout"); pp=${pp:-1}
    tp=$(sed -n 's/.*[,]tp=\([0-9]*\).*/\1/p' <<< ",$layout"); tp=${tp:-1}
    dp=$((ranks / pp / tp))
    gb=$((batch * accum * dp))
    dist=--no-dist-opt
    grep -q -- '--dist-opt' <<< "$flags" && dist=
    pnode=$ranks pwire=
    grep -q -- '--ranks-per-node 1 ' <<< "$flags " && pnode=1
    grep -q -- '--wire' <<< "$flags" && pwire="--wire $(grep -o -- '--wire [^ ]*' <<< "$flags" | awk '{print $2}')"
    grep -q -- '--overlap pipe' <<< "$flags" && pwire="$pwire --overlap pipe"
    grep -q -- '--overlap off' <<< "$flags" && [ -n "$pwire" ] && pwire="$pwire --overlap off"
    out="$TMP/run_$name"
    echo "--- $name: ${MPI[*]} -np $ranks -x OMP_NUM_THREADS=$threads moetrain train --config small --seq $SEQ --steps $STEPS --threads $threads $flags"
    metrics= failed=
    for k in $(seq 1 "${PA_RUNS:-1}"); do
        o=$out
        [ "$k" -gt 1 ] && o="$out.$k"
        wait_quiet
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086
        if ! "${MPI[@]}" -np "$ranks" -x OMP_NUM_THREADS="$threads" "$MOETRAIN" train --config small --data "$TMP/data" \
                --steps "$STEPS" --seq $SEQ --threads "$threads" --out "$o" --quiet $flags > "$TMP/$name.log" 2>&1; then
            tail -20 "$TMP/$name.log"
            failed=1
            break
        fi
        echo "    $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}') s wall"
        rm -rf "$o"/step_*  # the final checkpoint (~1.3 GB); metrics.jsonl stays
        metrics="$metrics${metrics:+,}$o/metrics.jsonl"
    done
    if [ -n "$failed" ]; then
        printf '%s\t%s\tERROR\n' "$name" "$layout" >> "$ROWS"
        continue
    fi
    # the routing's load imbalance over the EP ranks is an input of the model (how the
    # router spreads tokens, not a property of the machine): the trainer measures it
    imb=
    if grep -q -- '--ep' <<< "$flags"; then
        imb="--imbalance $("$PY" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "summary" in l][-1]["ep_imbalance"])' "$out/metrics.jsonl")"
    fi
    # shellcheck disable=SC2086
    "$MOETRAIN" plan --model small --cluster "$CAL" --devices "$ranks" --devices-per-node "$pnode" --threads "$threads" \
        --seq $SEQ --global-batch "$gb" --dtype fp32 $pbf16 $dist $imb $pwire --layout "$layout" --json --quiet \
        > "$TMP/$name.plan.json" 2> "$TMP/$name.plan.err"
    echo "    plan --devices $ranks --devices-per-node $pnode --threads $threads --seq $SEQ --global-batch $gb --dtype fp32 $pbf16 $dist $imb $pwire --layout $layout"
    printf '%s\t%s\t%s\t%s\n' "$name" "$layout" "$metrics" "$TMP/$name.plan.json" >> "$ROWS"
done

# ---- the table ----------------------------------------------------------------------------
"$PY" - "$ROWS" <<'EOF'
import json, sys
MiB = 2.0 ** 20
rows, bad = [], 0
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    name, layout = f[0], f[1]
    if f[2] == "ERROR":
        rows.append((name, layout, None)); bad += 1; continue
    runs = []
    for path in f[2].split(","):
        summ = None
        for l in open(path):
            l = l.strip()
            if l:
                e = json.loads(l)
                if e.get("event") == "summary": summ = e
        runs.append(summ)
    # the least step time of the runs (PA_RUNS), with that run's figures
    summ = min(runs, key=lambda e: e["step_time_s"])
    summ["runs_step_s"] = [e["step_time_s"] for e in runs]
    try:
        plan = json.load(open(f[3]))["layouts"][0]
    except Exception as ex:
        rows.append((name, layout, None)); bad += 1; continue
    ms, mm = summ["step_time_s"], max(summ["peak_rss_bytes_per_rank"]) / MiB
    ps, pm = plan["step_s"], plan["memory_bytes"]["total"] / MiB
    es, em = 100 * (ps - ms) / ms, 100 * (pm - mm) / mm
    ok = abs(es) <= 15 and abs(em) <= 10 and plan["status"] == "ok"
    bad += not ok
    per_rank = "/".join("%.0f" % (x / MiB) for x in summ["peak_rss_bytes_per_rank"])
    rows.append((name, layout, (ps, ms, es, pm, mm, em, ok, per_rank, plan, summ)))
print()
print("%-16s %-34s %8s %8s %7s %9s %9s %7s  %s" % ("layout", "plan --layout", "pred s", "meas s", "err",
      "pred MiB", "meas MiB", "err", "result   (measured MiB per rank)"))
for name, layout, r in rows:
    if r is None:
        print("%-16s %-34s  run or plan failed" % (name, layout)); continue
    ps, ms, es, pm, mm, em, ok, per_rank, plan, summ = r
    print("%-16s %-34s %8.3f %8.3f %+6.1f%% %9.0f %9.0f %+6.1f%%  %s   (%s)" % (name, layout, ps, ms, es, pm, mm, em,
          "PASS" if ok else "FAIL", per_rank))
print()
print("predictions in parts: seconds = compute + exposed communication (DP, p2p, all-to-all) + optimizer, measured "
      "communication; MiB = weights + grads + optimizer + activations (trainer's arena) + comm + reserve; peaks of the "
      "step and of the final checkpoint")
for name, layout, r in rows:
    if r is None: continue
    p, summ = r[8], r[9]; t = p["time_s"]; m = p["memory_bytes"]
    acts = summ.get("activation_bytes_per_rank")
    print("  %-16s %.3f + %.3f + %.3f s (meas. comm %.3f) | %.0f+%.0f+%.0f+%.0f (%s)+%.0f+%.0f MiB | step %.0f, checkpoint %s MiB%s" % (
          name, t["compute"], t["dp_exposed"] + t["p2p_exposed"] + t["all_to_all"], t["optimizer"],
          summ.get("comm_share", 0) * summ["step_time_s"], m["weights"] / MiB, m["grads"] / MiB, m["optimizer"] / MiB,
          (m["activations"] + m["working"]) / MiB, "%.0f" % (acts / MiB) if acts is not None else "-",
          m["comm_buffers"] / MiB, m["reserved"] / MiB, m["step_peak"] / MiB,
          "%.0f" % (m["checkpoint_peak"] / MiB) if "checkpoint_peak" in m else "-",
          " | runs " + ", ".join("%.3f" % x for x in summ["runs_step_s"]) + " s" if len(summ["runs_step_s"]) > 1 else ""))
n = len(rows)
print("\n%d of %d layouts within 15%% (step time) and 10%% (peak memory per rank)" % (n - bad, n))
sys.exit(1 if bad else 0)
EOF
