#!/usr/bin/env bash
# make demo: the math corpus, a few minutes of training of the demo MoE, held-out accuracy.
set -euo pipefail
MT=${1:-build/moetrain}
OUT=${2:-demo_out}
STEPS=${DEMO_STEPS:-1200}
mkdir -p "$OUT"
echo "== 1/3 data: synthetic arithmetic corpus (2-digit additions; 500 held-out problems never seen in training) -> $OUT/data"
"$MT" data math --out "$OUT/data" --seed 1 --train 200000 --val 500 --min-digits 2 --max-digits 2
echo "== 2/3 train: configs/demo.json ($("$MT" info --config demo | sed -n 2p | awk '{print $2}') parameters, 8 experts top-2 + 1 shared), $STEPS steps"
rm -rf "$OUT/run"
"$MT" train --config demo --data "$OUT/data" --out "$OUT/run" --steps "$STEPS" --batch 32 --seq 128 \
    --lr 3e-3 --warmup 50 --wd 0.05 --log-every 50 --eval-every 200 --load-every 200 --plot
echo "== 3/3 eval: validation loss and exact-match accuracy on 500 held-out problems"
"$MT" eval --ckpt "$OUT/run" --data "$OUT/data" --seq 128 --problems 500 --show 8
echo
echo "checkpoint: $OUT/run/$(cat "$OUT/run/latest")   (config.json + model.safetensors, loads in PyTorch: tests/oracle/moe_ref.py)"
echo "metrics:    $OUT/run/metrics.jsonl"
[ -f "$OUT/run/loss.png" ] && echo "plot:       $OUT/run/loss.png"
echo "try:        $MT generate --ckpt $OUT/run --prompt '47+38=' --temperature 0"
