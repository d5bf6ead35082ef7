#!/usr/bin/env bash
# Benchmarks of the parallel layouts (issue 3), on the "small" config:
#  1. throughput: 1 rank x 2 threads vs 2 ranks x 1 thread as DP2, EP2, PP2 and TP2+SP, the
#     same global batch (8 sequences x 256 tokens per step), tokens/s and the per-step
#     breakdown from `train --profile` (mean over the steps after the first, per rank);
#  2. optimizer state per rank for DP 1/2/4 with and without --dist-opt;
#  3. expert all-to-all inter-node bytes per step, flat vs hierarchical, EP8 over 2 and 4
#     emulated nodes at top-2 and top-8 (the trainer counts both modes on the same routing).
# Usage: bash bench/bench_parallel.sh path/to/moetrain [steps]   (steps default 5)
set -euo pipefail
MT=$(realpath "${1:?usage: bench/bench_parallel.sh path/to/moetrain [steps]}")
STEPS=${2:-5}
SRC=$(cd "$(dirname "$0")/.." && pwd)
command -v mpirun >/dev/null || { echo "bench_parallel: mpirun not found (apt-get install openmpi-bin)"; exit 1; }
TMP=${MT_BENCH_TMP:-${TMPDIR:-/tmp}/bench_parallel.$$}
mkdir -p "$TMP"
[ -n "${MT_BENCH_TMP:-}" ] || trap 'rm -rf "$TMP"' EXIT
MPI=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
"$MT" data math --out "$TMP/data" --train 20000 --val 100 > /dev/null
PY=/usr/bin/python3

summ() { # metrics.jsonl -> "tok/s step_s"
    $PY - "$1" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
s = [e for e in ev if e.get("event") == "summary"][-1]
print("%.0f %.3f" % (s["tokens_per_s"], s["step_time_s"]))
PYEOF
}
prof() { # metrics.jsonl -> one line per rank of the mean breakdown
    $PY - "$1" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
for e in ev:
    if e.get("event") != "profile": continue
    print("rank %d: compute %.3f | TP %.3f | a2a %.3f | pipeline wait %.3f | grads %.3f | params %.3f | optimizer %.3f | other %.3f" % (
        e["rank"], e["compute_s"], e["tp_s"], e["a2a_s"], e["pipeline_wait_s"], e["gradients_s"], e["params_s"],
        e["optimizer_s"], e["data_s"] + e["other_s"]))
PYEOF
}

echo "## 1. small, 8 x 256 tokens per step, $STEPS steps (first excluded)"
echo
common=(--config small --data "$TMP/data" --seq 256 --steps "$STEPS" --lr 1e-4 --quiet --profile)
run1() { # name ranks threads flags...
    local name=$1 n=$2 th=$3; shift 3
    if [ "$n" = 1 ]; then
        OMP_NUM_THREADS=$th "$MT" train "${common[@]}" --threads "$th" --out "$TMP/$name" "$@" > "$TMP/$name.log" 2>&1
    else
        "${MPI[@]}" -np "$n" -x OMP_NUM_THREADS=$th "$MT" train "${common[@]}" --threads "$th" --out "$TMP/$name" "$@" \
            > "$TMP/$name.log" 2>&1
    fi || { tail -5 "$TMP/$name.log"; echo "bench_parallel: $name failed"; exit 1; }
    read -r tps st < <(summ "$TMP/$name/metrics.jsonl")
    printf "| %-24s | %5s | %8s |\n" "$name" "$tps" "$st"
    prof "$TMP/$name/metrics.jsonl" | sed 's/^/    /' > "$TMP/$name.prof"
}
echo "| layout                   | tok/s | step s   |"
echo "|--------------------------|-------|----------|"
run1 "1 rank x 2 threads" 1 2 --batch 2 --accum 4
run1 "DP2 (2 ranks x 1 thread)" 2 1 --batch 2 --accum 2
run1 "EP2 (DP2)" 2 1 --batch 2 --accum 2 --ep 2
run1 "PP2 (1F1B, 4 mb)" 2 1 --batch 2 --accum 4 --pp 2
run1 "TP2 + SP" 2 1 --batch 2 --accum 4 --tp 2 --sp
echo
echo "Per-step breakdown (seconds, mean per step):"
for n in "1 rank x 2 threads" "DP2 (2 ranks x 1 thread)" "EP2 (DP2)" "PP2 (1F1B, 4 mb)" "TP2 + SP"; do
    echo "  $n"; cat "$TMP/$n.prof"
done

echo
echo "## 2. optimizer state per rank (small, AdamW moments fp32)"
echo
echo "| DP | all-reduce (MiB) | --dist-opt (MiB) |"
echo "|----|------------------|------------------|"
opt() { $PY -c "import json,sys; e=[json.loads(l) for l in open(sys.argv[1])]; print('%.2f' % ([x for x in e if x.get('event')=='summary'][-1]['optimizer_bytes_per_rank']/2**20))" "$1"; }
for dp in 1 2 4; do
    row=""
    for o in "" --dist-opt; do
        d="$TMP/opt$dp$o"
        "${MPI[@]}" -np $dp -x OMP_NUM_THREADS=1 "$MT" train --config small --data "$TMP/data" --seq 32 --batch 1 \
            --steps 1 --threads 1 --quiet --out "$d" $o > "$d.log" 2>&1 || { tail -3 "$d.log"; exit 1; }
        row="$row | $(opt "$d/metrics.jsonl")"
    done
    echo "| $dp $row |"
done

echo
echo "## 3. expert all-to-all, EP8 (8 ranks), inter-node MiB per step (forward + backward)"
echo
sed 's/"num_experts_per_tok": 2/"num_experts_per_tok": 8/' "$SRC/configs/small.json" > "$TMP/small_top8.json"
echo "| nodes | top-k | flat (MiB) | hierarchical (MiB) | hier / flat | hierarchical, measured bytes sent (MiB) |"
echo "|-------|-------|------------|--------------------|-------------|-------------------|"
for nodes in 2 4; do
    for k in 2 8; do
        cfg=small; [ $k = 8 ] && cfg="$TMP/small_top8.json"
        d="$TMP/a2a$nodes$k"
        "${MPI[@]}" -np 8 -x OMP_NUM_THREADS=1 "$MT" train --config "$cfg" --data "$TMP/data" --seq 128 --batch 2 \
            --steps 2 --threads 1 --quiet --ep 8 --ranks-per-node $((8 / nodes)) --out "$d" > "$d.log" 2>&1 \
            || { tail -3 "$d.log"; exit 1; }
        $PY - "$d/metrics.jsonl" $nodes $k <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
s = [e for e in ev if e.get("event") == "step"][-1]
C = 512 * 4 / 2**20
f, h = s["a2a_inter_rows_flat"] * C, s["a2a_inter_rows_hier"] * C
print("| %s | %s | %.1f | %.1f | %.2f | %.1f |" % (sys.argv[2], sys.argv[3], f, h, h / f, s["a2a_inter_bytes"] / 2**20))
PYEOF
    done
done
