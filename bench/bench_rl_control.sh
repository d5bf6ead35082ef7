#!/usr/bin/env bash
# RL against a pretraining control (issue 22): from one checkpoint that half solves an
# arithmetic task, `moetrain rl` for STEPS steps, and, for the same wall time, more
# pretraining of the same run (`train --resume` of that checkpoint: the run's data and
# settings). Both curves: held-out greedy accuracy on the same 500 problems against wall
# seconds, as a table and, with gnuplot, BENCH_DIR/curves.png.
# Usage: bash bench/bench_rl_control.sh build/moetrain [CKPT DATA [STEPS]]
#   CKPT: a checkpoint of a pretraining run (RUN/step_NNNNNNNN, resumable), DATA its data,
#   e.g. what `make demo` leaves before its RL stage (demo_out/slip_run/step_00000150,
#   demo_out/slip).
#   Without them: the demo's pretraining (1,200 steps, exact corpus; clip 1, as the demo had it
#   when the figures in docs/PERFORMANCE.md were taken), then 300 steps more on
#   the same problems written with `data math --slip 0.6` (60% of the additions that carry
#   from the ones digits have that carry forgotten in the text, the prompt files keep the
#   true answers); its last checkpoint is the start: imitation of that corpus plateaus near
#   60% held-out, which a verifier's reward can correct and more of the corpus cannot.
#   STEPS: RL steps (default 30, the demo's).
# Env: BENCH_DIR (default /tmp/bench_rl_control), EVERY (RL held-out evaluation every N
#   steps, default 5; the control evaluates as many checkpoints).
set -euo pipefail
MT=$(realpath "$1")
W=${BENCH_DIR:-/tmp/bench_rl_control}
mkdir -p "$W"
if [ $# -ge 3 ]; then CKPT=$(realpath "$2"); DATA=$(realpath "$3"); else
    CORPUS=(--seed 1 --train 200000 --val 500 --min-digits 2 --max-digits 2)
    [ -d "$W/data" ] || "$MT" data math --out "$W/data" "${CORPUS[@]}" >/dev/null
    [ -d "$W/pre/step_00001200" ] || "$MT" train --config demo --data "$W/data" --out "$W/pre" --steps 1200 \
        --batch 32 --seq 64 --lr 3e-3 --warmup 50 --wd 0.05 --keep 0 --quiet >/dev/null
    DATA=$W/slip CKPT=$W/run/step_00000300
    [ -d "$DATA" ] || "$MT" data math --out "$DATA" "${CORPUS[@]}" --slip 0.6 >/dev/null
    [ -d "$CKPT" ] || "$MT" train --init "$W/pre/step_00001200" --data "$DATA" --out "$W/run" --steps 300 \
        --batch 32 --seq 64 --lr 1e-3 --warmup 20 --wd 0.05 --quiet >/dev/null
fi
[ -d "$CKPT" ] || { echo "bench_rl_control: $CKPT does not exist" >&2; exit 1; }
CK=$(basename "$CKPT") RUN=$(dirname "$CKPT")
FROM=$((10#${CK#step_}))
STEPS=${4:-30} EVERY=${EVERY:-5}
lscpu | grep -m1 'Model name' || true
acc() { "$MT" eval --ckpt "$1" --data "$DATA" --seq 64 --windows 1 --problems 500 2>/dev/null | sed -nE 's/^accuracy=([0-9.]+).*/\1/p'; }

# RL: the demo's settings, the held-out accuracy every EVERY steps
rm -rf "$W/rl"
"$MT" rl --init "$RUN/$CK" --data "$DATA" --out "$W/rl" --steps "$STEPS" --group 8 --prompts-per-step 32 --max-new 8 \
    --temperature 0.7 --lr 1e-4 --eval-n 500 --eval-every "$EVERY" --quiet >/dev/null
python3 - "$W/rl/metrics.jsonl" > "$W/rl.tsv" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
print("0\t%.4f" % [e for e in ev if e["event"] == "eval"][0]["heldout_accuracy"])
for e in ev:
    if e["event"] == "step" and "heldout_accuracy" in e:
        print("%.2f\t%.4f" % (e["elapsed"], e["heldout_accuracy"]))
PY
T_RL=$(tail -1 "$W/rl.tsv" | cut -f1)

# the control: the pretraining run resumed from the same checkpoint; its step time first, then
# as many steps as fit RL's wall time, a checkpoint every STEPS/EVERY-th of them
rm -rf "$W/probe"
"$MT" train --resume "$RUN/$CK" --data "$DATA" --out "$W/probe" --steps $((FROM + 10)) --quiet --save-every 0 >/dev/null
N=$(python3 - "$W/probe/metrics.jsonl" "$T_RL" <<'PY'
import json, sys
st = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
per = (st[-1]["elapsed"] - st[0]["elapsed"]) / (len(st) - 1)
print(max(int(float(sys.argv[2]) / per), 1))
PY
)
K=$(( (N * EVERY + STEPS - 1) / STEPS )); [ "$K" -ge 1 ] || K=1
rm -rf "$W/ctl"
"$MT" train --resume "$RUN/$CK" --data "$DATA" --out "$W/ctl" --steps $((FROM + N)) --save-every "$K" --keep 0 \
    --quiet >/dev/null
{
    printf '0\t%s\n' "$(acc "$RUN/$CK")"
    python3 - "$W/ctl" <<'PY' | while read -r c el; do printf '%s\t%s\n' "$el" "$(acc "$W/ctl/$c")"; done
import json, os, sys
el = {e["step"]: e["elapsed"] for e in (json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl"))
      if e.get("event") == "step"}
for c in sorted(d for d in os.listdir(sys.argv[1]) if d.startswith("step_")):  # the checkpoints it saved
    print(c, "%.2f" % el[int(c[5:])])
PY
} > "$W/ctl.tsv"

echo "held-out accuracy (500 problems) against wall seconds, from $CK:"
printf '%-24s %s\n' "RL ($STEPS GRPO steps)" "$(tr '\t\n' ': ' < "$W/rl.tsv")"
printf '%-24s %s\n' "pretraining ($N steps)" "$(tr '\t\n' ': ' < "$W/ctl.tsv")"
a0=$(head -1 "$W/rl.tsv" | cut -f2) a1=$(tail -1 "$W/rl.tsv" | cut -f2) c1=$(tail -1 "$W/ctl.tsv" | cut -f2)
python3 -c "import sys; a0, a1, c1, t = map(float, sys.argv[1:]); print('gain in %.1f s: RL %+.1f points, pretraining %+.1f points' % (t, 100 * (a1 - a0), 100 * (c1 - a0)))" "$a0" "$a1" "$c1" "$T_RL"
if command -v gnuplot >/dev/null 2>&1; then
    gnuplot -e "set terminal png size 800,500; set output '$W/curves.png'; set xlabel 'wall seconds'; \
        set ylabel 'held-out accuracy'; set key bottom right; \
        plot '$W/rl.tsv' using 1:2 with linespoints title 'RL (GRPO)', '$W/ctl.tsv' using 1:2 with linespoints title 'more pretraining'"
    echo "plot: $W/curves.png"
fi
