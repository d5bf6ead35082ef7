#!/usr/bin/env bash
# train --expert-balance (train/balance.h): every N steps each MoE layer's experts are placed
# anew on the EP ranks from the window's load, and those that change rank move with their
# AdamW moments. The demo model routes top-2, so a token's combine is one addition whatever
# the placement: a balanced run must write the checkpoint (weights and moments) of the same
# run without it, bit for bit; a wrong move shows there. Checked under EP2 (2 ranks), DP2 x
# EP2, EP4 and DP2 x EP2 with ZeRO-1 (its moments made whole for the move) and the pipe
# schedule, whose parameter all-gather is still in flight after the update (4 ranks), and EP2
# over two emulated nodes on the wire (the moved experts take their link time); a resume from a checkpoint taken inside a window continues bit for
# bit (the placement and the window's load are in trainer_state.json); the flag's misuse is
# refused. Usage: bash tests/test_expert_balance.sh path/to/moetrain (77 without mpirun)
set -euo pipefail
NAME=test_expert_balance
source "$(dirname "$0")/lib/mpi.sh"

"$MT" data math --out "$T/data" --train 5000 --val 50 >/dev/null
base=(--config demo --data "$T/data" --batch 4 --seq 64 --lr 3e-3 --warmup 2 --threads 1 --steps 8 --quiet
      --peak-gflops 100)
same_ckpt() { # two run folders: the final checkpoint's weights and moments identical
    cmp -s "$1/step_00000008/model.safetensors" "$2/step_00000008/model.safetensors" &&
        cmp -s "$1/step_00000008/optimizer.safetensors" "$2/step_00000008/optimizer.safetensors"
}
# events RUN: the run's expert_balance events (metrics.jsonl)
events() { grep '"event":"expert_balance"' "$1/metrics.jsonl" || true; }

for L in "2 --ep 2" "4 --ep 2" "4 --ep 4" "4 --ep 2 --dist-opt --overlap pipe --accum 2" \
         "2 --ep 2 --ranks-per-node 1 --wire 0.05,50"; do
    np=${L%% *}; L=${L#* }; n=$np$(echo "$L" | tr -d ' -.,')
    run "$np" train "${base[@]}" $L --out "$T/off$n" > "$T/off$n.log" 2>&1 || { tail -3 "$T/off$n.log"; fail "$L without"; }
    run "$np" train "${base[@]}" $L --expert-balance 2 --out "$T/on$n" > "$T/on$n.log" 2>&1 \
        || { tail -3 "$T/on$n.log"; fail "$L --expert-balance 2"; }
    ev=$(events "$T/on$n")
    [ "$(echo "$ev" | grep -c '"event"')" = 3 ] || { echo "$ev"; fail "$L: not 3 re-placements in 8 steps (2, 4, 6)"; }
    python3 - "$T/on$n/metrics.jsonl" <<'EOF' || fail "$L: no expert moved, or a placement made the window's busiest rank worse"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"expert_balance"' in l]
sys.exit(0 if sum(e["moved"] for e in ev) > 0 and all(e["busy_after"] <= e["busy_before"] for e in ev) else 1)
EOF
    same_ckpt "$T/off$n" "$T/on$n" || fail "$L: --expert-balance changed the weights or the moments"
    ok "$L on $np ranks, --expert-balance 2: $(echo "$ev" | sed -E 's/.*"moved":([0-9]+),"busy_before":([0-9.]+),"busy_after":([0-9.]+).*/\1 moved (\2x -> \3x)/' | paste -sd';' -); the checkpoint of the run without it, bit for bit"
done

# resume inside a window (checkpoint at step 3, re-placements at 2, 4, 6): the same final bits
run 2 train "${base[@]}" --ep 2 --expert-balance 2 --save-every 3 --keep 0 --out "$T/full" > "$T/full.log" 2>&1 \
    || { tail -3 "$T/full.log"; fail "the uninterrupted run"; }
mkdir -p "$T/res" && cp -r "$T/full/step_00000003" "$T/res/"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d['expert_balance'] == 2 and len(d['expert_slots']) == len(d['expert_load_window']) > 0 and sum(d['expert_load_window']) > 0 else 1)" \
    "$T/res/step_00000003/trainer_state.json" || fail "trainer_state.json lacks the placement or the window's load"
run 2 train --resume "$T/res/step_00000003" --data "$T/data" --ep 2 --threads 1 --quiet --peak-gflops 100 --out "$T/res" \
    > "$T/res.log" 2>&1 || { tail -3 "$T/res.log"; fail "resuming at step 3"; }
same_ckpt "$T/full" "$T/res" || fail "the resumed run's final checkpoint differs from the uninterrupted one"
[ "$(events "$T/full" | grep -v '"step":2,')" = "$(events "$T/res")" ] || fail "the resumed run placed differently"
ok "--expert-balance 2 resumed at step 3 (inside a window): the uninterrupted run's placements and final bits"
# a resume without --ep turns the resumed --expert-balance off (a warning), trains on
"$MT" train --resume "$T/res/step_00000003" --data "$T/data" --threads 1 --quiet --peak-gflops 100 --steps 4 \
    --out "$T/res1" > "$T/res1.log" 2>&1 || { cat "$T/res1.log"; fail "resuming without --ep"; }
grep -q "is off: this layout has no --ep" "$T/res1.log" || { cat "$T/res1.log"; fail "no word that the balance is off"; }
ok "a resume without --ep: $(grep -m1 'is off' "$T/res1.log")"

refused "--expert-balance without --ep" "it needs --ep > 1" train "${base[@]}" --expert-balance 2 --out "$T/x"
refused "--expert-balance -1" "expects a non-negative integer" train "${base[@]}" --expert-balance -1 --out "$T/x"
echo "$passed passed, 0 failed"
