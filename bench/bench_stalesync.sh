#!/usr/bin/env bash
# StaleSync end to end (issue 23): completion tokens trained per second of `moetrain rl` on
# 2 ranks (one thread each), co-located and separate (1 rollout + 1 train rank) at
# --max-staleness 0, 1, 2, from one pretrained checkpoint, with the held-out accuracy at the
# end and where each role's time went (the metrics' waits).
# Usage: bash bench/bench_stalesync.sh build/moetrain [CKPT DATA [STEPS [PROMPTS_PER_STEP]]]
#   e.g. CKPT DATA = demo_out/run/step_NNNNNNNN demo_out/data (the checkpoint `make demo` started
#   its RL from: a model that half solves its task); without them it pretrains "demo" 300 steps
#   on 1-2 digit sums.
# Env: CONFIGS (default "colocated:0 separate:0 separate:1 separate:2"), EXTRA (more rl flags,
#   e.g. "--slots 8": a smaller decode batch, a rollout as long as the training step).
set -euo pipefail
MT=$(realpath "$1")
W=${BENCH_DIR:-/tmp/bench_stalesync}
mkdir -p "$W"
if [ $# -ge 3 ]; then CK=$(realpath "$2"); DATA=$(realpath "$3"); else
    DATA=$W/D CK=$W/pre
    [ -d "$DATA" ] || "$MT" data math --out "$DATA" --train 20000 --val 500 --min-digits 1 --max-digits 2 >/dev/null
    [ -d "$CK" ] || OMP_NUM_THREADS=2 "$MT" train --config demo --data "$DATA" --batch 16 --seq 64 --steps 300 \
        --lr 3e-3 --warmup 10 --threads 2 --quiet --out "$CK" >/dev/null
fi
STEPS=${4:-12} P=${5:-16}
source "$(dirname "$0")/../tests/lib/mpirun.sh"
export OMP_NUM_THREADS=1
ARGS=(--init "$CK" --data "$DATA" --steps "$STEPS" --group 8 --prompts-per-step "$P" --max-new 8 --temperature 0.7
      --lr 1e-4 --eval-n 500 --threads 1 --quiet ${EXTRA:-})
lscpu | grep -m1 'Model name' || true
printf '%-26s %10s %8s %8s %10s %10s %10s\n' run "tok/s" acc0 acc "wait_train" "wait_roll" "stale"
for cfg in ${CONFIGS:-colocated:0 separate:0 separate:1 separate:2}; do
    mode=${cfg%%:*} s=${cfg#*:}
    extra=()
    [ "$mode" = separate ] && extra=(--rollout-ranks 1)
    out=$W/${mode}_s$s
    rm -rf "$out"
    "${MPI[@]}" -np 2 "$MT" rl "${ARGS[@]}" "${extra[@]}" --max-staleness "$s" --out "$out" --profile >/dev/null
    python3 - "$out/metrics.jsonl" "$mode s=$s" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
st = [e for e in ev if e["event"] == "step"]
summ = [e for e in ev if e["event"] == "summary"][0]
# end to end: every step's completion tokens over the loop's wall time (pipeline fill included)
tok = sum(e["completion_tokens"] for e in st); dt = st[-1]["elapsed"]
wt = sum(e["wait_trainer_s"] for e in st); wr = sum(e["wait_rollout_weights_s"] + e["wait_rollout_room_s"] for e in st)
stale = sum(e["staleness_mean"] for e in st) / len(st)
print(f"{sys.argv[2]:<26} {tok / dt:10.1f} {summ['heldout_accuracy_start']:8.3f} {summ['heldout_accuracy']:8.3f} "
      f"{wt:10.2f} {wr:10.2f} {stale:10.2f}")
PY
done
