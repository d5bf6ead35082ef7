#!/usr/bin/env bash
# make demo: the math corpus, a few minutes of training of the demo MoE, held-out accuracy;
# then RL (GRPO): a short run of imitation on a corpus that writes many carries wrongly
# leaves the model half right, and the verifier's reward (the true answers) raises it.
set -euo pipefail
MT=${1:-build/moetrain}
OUT=${2:-demo_out}
STEPS=${DEMO_STEPS:-1200}
SLIP_STEPS=${DEMO_SLIP_STEPS:-150}
RL_STEPS=${DEMO_RL_STEPS:-30}
mkdir -p "$OUT"
CORPUS=(--seed 1 --train 200000 --val 500 --min-digits 2 --max-digits 2)
echo "== 1/5 data: synthetic arithmetic corpus (2-digit additions; 500 held-out problems never seen in training) -> $OUT/data"
"$MT" data math --out "$OUT/data" "${CORPUS[@]}"
echo "== 2/5 train: configs/demo.json ($("$MT" info --config demo | sed -n 2p | awk '{print $2}') parameters, 8 experts top-2 + 1 shared), $STEPS steps"
rm -rf "$OUT/run"
"$MT" train --config demo --data "$OUT/data" --out "$OUT/run" --steps "$STEPS" --batch 32 --seq 64 \
    --lr 3e-3 --warmup 50 --wd 0.05 --clip 2 --log-every 50 --eval-every 200 --load-every 200 --plot --save-every 400
echo "== 3/5 eval: validation loss and exact-match accuracy on 500 held-out problems"
"$MT" eval --ckpt "$OUT/run" --data "$OUT/data" --seq 64 --problems 500 --show 8
# A corpus that imitation cannot get right: the same problems, 60% of the additions that
# carry from the ones digits written with that carry forgotten (the prompt files and the
# validation split keep the true answers). Imitating it leaves the model about half right.
echo "== 4/5 imitation of a flawed corpus: 60% of the carries from the ones digits forgotten in the text, $SLIP_STEPS steps"
"$MT" data math --out "$OUT/slip" "${CORPUS[@]}" --slip 0.6
rm -rf "$OUT/slip_run"
"$MT" train --init "$OUT/run" --data "$OUT/slip" --out "$OUT/slip_run" --steps "$SLIP_STEPS" --batch 32 --seq 64 \
    --lr 1e-3 --warmup 20 --wd 0.05 --log-every 50
"$MT" eval --ckpt "$OUT/slip_run" --data "$OUT/slip" --seq 64 --problems 500 --windows 1 | grep '^accuracy'
echo "== 5/5 rl: GRPO from that checkpoint, $RL_STEPS steps of 32 prompts x 8 samples, rewarded by the true answers"
rm -rf "$OUT/rl"
"$MT" rl --init "$OUT/slip_run" --data "$OUT/slip" --out "$OUT/rl" --steps "$RL_STEPS" --group 8 \
    --prompts-per-step 32 --max-new 8 --temperature 0.7 --lr 1e-4 --eval-n 500 --eval-every 10
echo
echo "checkpoints: $OUT/run/$(cat "$OUT/run/latest") (pretrained), $OUT/rl/$(cat "$OUT/rl/latest") (after RL)"
echo "             (config.json + model.safetensors, load in PyTorch: tests/oracle/moe_ref.py)"
echo "metrics:     $OUT/run/metrics.jsonl, $OUT/slip_run/metrics.jsonl, $OUT/rl/metrics.jsonl"
[ -f "$OUT/run/loss.png" ] && echo "plot:        $OUT/run/loss.png"
echo "try:         $MT generate --ckpt $OUT/run --prompt '47+38=' --temperature 0"
