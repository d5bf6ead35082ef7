#!/usr/bin/env bash
# make demo: the math corpus, a few minutes of training of the demo MoE, held-out accuracy;
# then RL (GRPO) from the run's early checkpoint, which only half solves the task.
set -euo pipefail
MT=${1:-build/moetrain}
OUT=${2:-demo_out}
STEPS=${DEMO_STEPS:-1200}
mkdir -p "$OUT"
RL_STEPS=${DEMO_RL_STEPS:-30}
RL_FROM=${DEMO_RL_FROM:-350}
echo "== 1/4 data: synthetic arithmetic corpus (2-digit additions; 500 held-out problems never seen in training) -> $OUT/data"
"$MT" data math --out "$OUT/data" --seed 1 --train 200000 --val 500 --min-digits 2 --max-digits 2
echo "== 2/4 train: configs/demo.json ($("$MT" info --config demo | sed -n 2p | awk '{print $2}') parameters, 8 experts top-2 + 1 shared), $STEPS steps"
rm -rf "$OUT/run"
"$MT" train --config demo --data "$OUT/data" --out "$OUT/run" --steps "$STEPS" --batch 32 --seq 128 \
    --lr 3e-3 --warmup 50 --wd 0.05 --log-every 50 --eval-every 200 --load-every 200 --plot \
    --save-every "$RL_FROM" --keep 0
echo "== 3/4 eval: validation loss and exact-match accuracy on 500 held-out problems"
"$MT" eval --ckpt "$OUT/run" --data "$OUT/data" --seq 128 --problems 500 --show 8
CK=$(printf 'step_%08d' "$RL_FROM")
echo "== 4/4 rl: GRPO from $CK (early in training: the model half solves the task), $RL_STEPS steps of 32 prompts x 8 samples"
rm -rf "$OUT/rl"
"$MT" rl --init "$OUT/run/$CK" --data "$OUT/data" --out "$OUT/rl" --steps "$RL_STEPS" --group 8 \
    --prompts-per-step 32 --max-new 8 --temperature 0.7 --lr 1e-4 --eval-n 500 --eval-every 10
echo
echo "checkpoint: $OUT/run/$(cat "$OUT/run/latest")   (config.json + model.safetensors, loads in PyTorch: tests/oracle/moe_ref.py)"
echo "metrics:    $OUT/run/metrics.jsonl, $OUT/rl/metrics.jsonl (rl)"
[ -f "$OUT/run/loss.png" ] && echo "plot:       $OUT/run/loss.png"
echo "try:        $MT generate --ckpt $OUT/run --prompt '47+38=' --temperature 0"
