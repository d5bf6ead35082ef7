#!/usr/bin/env bash
# moetrain rl end to end (docs/FORMATS.md sections 7 and 8) on a tiny pretrained demo model
# and a one-digit math corpus:
#   - 3 GRPO steps succeed; metrics.jsonl has the eval event at step 0, 3 step events with
#     every documented field, finite, with the fixed values of a synchronous run (version =
#     step - 1, kl 0, max_staleness 0, switch_s 0, prompts, completions, completion_tokens =
#     length x completions, reward = accuracy without a format penalty), held-out accuracy
#     at the last step and a summary; the checkpoint exists and `moetrain eval --ckpt` loads
#     it (run folder and step folder) and finds the held-out accuracy rl reported last;
#   - on-policy: every step's ratio_dev and clip_fraction are exactly 0, and logp_old is
#     logp_behav to the bit (one process, fp32: the trainer's forward runs the decoder's
#     products, the decoder's attention the training kernel's arithmetic);
#   - the other aggregations and tau 0.7 run and stay on-policy;
#   - errors give one line and a non-zero exit: --group 1, a malformed prompt line and a
#     wrong answer (file:line named), --tp 2, no --init, --init at a non-checkpoint,
#     --agg bogus, --temperature -1, --speculative without an MTP block;
#   - --speculative (MTP drafts) on a demo model with an MTP block: the same rewards, accuracy
#     and tokens as plain rollouts, the drafts counted in metrics.jsonl;
#   - under mpirun (when there is one): DP2 gives the per-step reward, accuracy, tokens and
#     held-out accuracy of one process exactly and its loss within 1e-5 relative (1e-6
#     absolute: an on-policy loss is a sum of +-A w / N terms that cancel to ~1e-8, where
#     the last bits of w = exp(logp_old - logp_behav) move with the batch shape); so do
#     training layouts that split the model (EP2, TP2+SP, PP2+ZeRO-1; DP4 x EP2: RL Fusion, a layout
#     switch to a whole rollout copy every step, or to an EP part of one with --rollout-ep,
#     or to TP slices with --rollout-tp (also with MLA, and drafting speculatively on EP and TP parts),
#     switch_s > 0; logp_old within 1e-5 of logp_behav) and separate deployments
#     (--rollout-ranks 1 of 2, 2 of 3: the weights sent to the rollout ranks each step).
# Usage: bash tests/test_rl.sh path/to/moetrain
set -euo pipefail
NAME=test_rl
MPI_OPTIONAL=1 # the single-process runs need no MPI launcher
source "$(dirname "$0")/lib/mpi.sh"
export OMP_NUM_THREADS=2
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found (it reads metrics.jsonl)"; exit 77; }

"$MT" data math --out "$T/D" --train 20000 --val 50 --min-digits 1 --max-digits 1 >/dev/null
[ -s "$T/D/math_prompts_train.tsv" ] && [ -s "$T/D/math_prompts_val.tsv" ] || fail "data math wrote no prompt files"
"$MT" train --config demo --data "$T/D" --batch 16 --seq 64 --steps 120 --lr 3e-3 --warmup 10 --threads 2 --quiet \
    --out "$T/run" > "$T/pre.log" 2>&1 || { tail -5 "$T/pre.log"; fail "pretraining the demo model"; }
ok "pretrained the demo model (120 steps)"

rlargs=(--init "$T/run" --data "$T/D" --steps 3 --group 4 --prompts-per-step 8 --max-new 4 --eval-n 50)
"$MT" rl "${rlargs[@]}" --threads 2 --out "$T/R" > "$T/R.log" 2>&1 || { tail -5 "$T/R.log"; fail "moetrain rl"; }

# every documented field of a step event, finite; the fixed values of a synchronous run
python3 - "$T/R/metrics.jsonl" <<'EOF' || fail "metrics.jsonl of rl does not follow FORMATS.md 8"
import json, math, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e for e in ev if e["event"] == "step"]
fields = ("step version prompts completions completion_tokens reward accuracy uniform_groups length loss pg kl "
          "clip_fraction ratio_dev max_staleness logp_old_behav_max grad_norm rollout_tokens_per_s "
          "train_tokens_per_s switch_s rss_rollout_mib rss_train_mib elapsed").split()
bad = []
def want(c, what):
    if not c: bad.append(what)
want(ev[0] == {"event": "eval", "step": 0, "heldout_accuracy": ev[0].get("heldout_accuracy")}, "first event: eval at step 0")
want(ev[-1]["event"] == "summary", "last event: summary")
want([s["step"] for s in steps] == [1, 2, 3], "3 step events, steps 1..3")
for s in steps:
    n = s["step"]
    for f in fields:
        want(f in s and isinstance(s[f], (int, float)) and math.isfinite(s[f]), f"step {n}: {f} missing or not finite")
    if bad: break
    want(s["version"] == n - 1, f"step {n}: version {s['version']}")
    want(s["prompts"] == 8 and s["completions"] == 32, f"step {n}: prompts/completions {s['prompts']}/{s['completions']}")
    want(abs(s["completion_tokens"] - s["length"] * s["completions"]) < 0.1, f"step {n}: tokens != length x completions")
    want(s["completions"] <= s["completion_tokens"] <= 4 * s["completions"], f"step {n}: completion_tokens out of range")
    want(s["reward"] == s["accuracy"], f"step {n}: reward {s['reward']} != accuracy {s['accuracy']} (no format penalty)")
    want(0 <= s["accuracy"] <= 1 and 0 <= s["uniform_groups"] <= 1, f"step {n}: shares out of [0, 1]")
    want(s["kl"] == 0 and s["max_staleness"] == 0 and s["switch_s"] == 0, f"step {n}: kl/max_staleness/switch_s not 0")
    want(s["pg"] == s["loss"], f"step {n}: pg != loss without KL")
    want(s["grad_norm"] > 0, f"step {n}: grad_norm {s['grad_norm']}")
    want(("heldout_accuracy" in s) == (n == 3), f"step {n}: heldout_accuracy only at the last step")
want(steps[-1].get("heldout_accuracy") == ev[-1].get("heldout_accuracy"), "summary's held-out accuracy != the last step's")
# memory settles: a step's buffers are found again by the next (the rollout's KV cache grew
# the heap by its size every step when large blocks were 2 MiB-aligned)
want(steps[-1]["rss_train_mib"] <= steps[0]["rss_train_mib"] + 2, f"peak RSS grows per step: {[s['rss_train_mib'] for s in steps]}")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
EOF
ok "metrics.jsonl: eval, 3 step events with the documented fields (finite), summary"

onpolicy() { # metrics.jsonl: every step exactly on-policy
    python3 - "$1" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
bad = [s["step"] for s in steps if s["ratio_dev"] != 0 or s["clip_fraction"] != 0 or s["logp_old_behav_max"] != 0]
for s in steps: print(f"    step {s['step']}: ratio_dev {s['ratio_dev']} clip {s['clip_fraction']} |old-behav| {s['logp_old_behav_max']:.1e} reward {s['reward']:.3f} loss {s['loss']:+.8f}")
sys.exit(1 if bad or not steps else 0)
EOF
}
onpolicy "$T/R/metrics.jsonl" || fail "a synchronous step is not on-policy (ratio_dev, clip_fraction or |logp_old - logp_behav| not 0)"
ok "on-policy: ratio_dev 0, clip_fraction 0 and logp_old = logp_behav to the bit at every step"

[ -d "$T/R/step_00000003" ] && [ -e "$T/R/latest" ] || fail "rl saved no checkpoint step_00000003 / latest"
acc=$(grep '"event":"summary"' "$T/R/metrics.jsonl" | sed -E 's/.*"heldout_accuracy":([0-9.]+).*/\1/')
for ck in "$T/R" "$T/R/step_00000003"; do
    "$MT" eval --ckpt "$ck" --data "$T/D" --problems 50 --max-new 4 --threads 2 > "$T/ev.log" 2>&1 \
        || { cat "$T/ev.log"; fail "moetrain eval --ckpt $ck"; }
    eacc=$(sed -nE 's/^accuracy=([0-9.]+) .*/\1/p' "$T/ev.log")
    awk -v a="$acc" -v b="$eacc" 'BEGIN { exit !(b != "" && a - b < 1e-6 && b - a < 1e-6) }' \
        || { cat "$T/ev.log"; fail "eval of $ck: accuracy $eacc, rl's last held-out accuracy $acc"; }
done
ok "moetrain eval loads the rl checkpoint (run and step folder): held-out accuracy $acc as rl reported"

for v in "seq-mean-token-mean 0.7" "seq-mean-token-sum-norm 0"; do
    set -- $v
    "$MT" rl "${rlargs[@]}" --steps 2 --eval-n 0 --agg "$1" --temperature "$2" --threads 2 --out "$T/A$1" \
        > "$T/A.log" 2>&1 || { tail -5 "$T/A.log"; fail "rl --agg $1 --temperature $2"; }
    onpolicy "$T/A$1/metrics.jsonl" || fail "--agg $1 --temperature $2: not on-policy"
    ok "--agg $1 --temperature $2: runs, on-policy"
done

# the KL to the frozen --init weights and routing replay: on-policy still; kl 0 at step 1
# (the weights are the reference's), positive and finite after an update
"$MT" rl "${rlargs[@]}" --steps 3 --eval-n 0 --beta 0.1 --routing-replay --threads 2 --out "$T/K" > "$T/K.log" 2>&1 \
    || { tail -5 "$T/K.log"; fail "rl --beta 0.1 --routing-replay"; }
onpolicy "$T/K/metrics.jsonl" || fail "--beta --routing-replay: not on-policy"
kls=$(grep '"event":"step"' "$T/K/metrics.jsonl" | sed -E 's/.*"kl":([^,]+),.*/\1/' | tr '\n' ' ')
echo "$kls" | awk '{ if ($1 != 0 || !($3 > 0) || $3 > 10) exit 1 }' || fail "--beta: kl per step '$kls' (want 0, then > 0)"
ok "--beta 0.1 --routing-replay: on-policy, kl per step $kls"

# resume: 4 steps in one go = 2 steps, then --resume from the step-2 checkpoint (the RL
# settings come from OUT/rl_settings.json, the trainer's from the checkpoint)
"$MT" rl "${rlargs[@]}" --steps 4 --eval-n 0 --save-every 2 --keep 0 --threads 2 --quiet --out "$T/RA" \
    || fail "rl 4 steps"
"$MT" rl "${rlargs[@]}" --steps 4 --eval-n 0 --save-every 2 --keep 0 --threads 2 --quiet --out "$T/RB" \
    || fail "rl 4 steps (second run)"
rm -rf "$T/RB/step_00000004"
"$MT" rl --resume "$T/RB/step_00000002" --threads 2 --quiet || fail "rl --resume"
for f in model.safetensors optimizer.safetensors; do
    cmp -s "$T/RA/step_00000004/$f" "$T/RB/step_00000004/$f" || fail "resumed rl run: $f differs from the uninterrupted run"
done
ok "rl --resume from step 2 = the uninterrupted 4-step run (model and optimizer bit for bit)"
# with a KL to the frozen reference: the resume reloads it from the run's --init checkpoint
"$MT" rl "${rlargs[@]}" --steps 4 --eval-n 0 --beta 0.1 --save-every 2 --keep 0 --threads 2 --quiet --out "$T/KA" \
    || fail "rl --beta 4 steps"
"$MT" rl "${rlargs[@]}" --steps 2 --eval-n 0 --beta 0.1 --save-every 2 --keep 0 --threads 2 --quiet --out "$T/KB" \
    || fail "rl --beta 2 steps"
"$MT" rl --resume "$T/KB" --steps 4 --threads 2 --quiet || fail "rl --resume of a --beta run"
for f in model.safetensors optimizer.safetensors; do
    cmp -s "$T/KA/step_00000004/$f" "$T/KB/step_00000004/$f" || fail "resumed --beta run: $f differs from the uninterrupted run"
done
ok "rl --beta 0.1 --resume from step 2 = the uninterrupted 4-step run (the reference reloaded; bit for bit)"

# errors: one line, non-zero exit
base=(--data "$T/D" --steps 1 --group 4 --prompts-per-step 8 --max-new 4 --eval-n 0 --threads 2 --quiet --out "$T/E")
printf '1+2=\t3\n4+5=9\n' > "$T/notab.tsv"
printf '1+2=\t3\n4+5=\t9\n2*3=\t5\n' > "$T/wrong.tsv"
refused "--group 1" "group" rl --init "$T/run" "${base[@]}" --group 1
refused "a prompt line without TAB" "notab.tsv:2" rl --init "$T/run" "${base[@]}" --prompts "$T/notab.tsv"
refused "a prompt with a wrong answer" "wrong.tsv:3" rl --init "$T/run" "${base[@]}" --prompts "$T/wrong.tsv"
refused "--tp 2" "tp" rl --init "$T/run" "${base[@]}" --tp 2
refused "no --init" "init" rl "${base[@]}"
refused "--init at a data folder" "$T/D" rl --init "$T/D" "${base[@]}"
refused "--init at a missing folder" "$T/nothere" rl --init "$T/nothere" "${base[@]}"
refused "--agg bogus" "bogus" rl --init "$T/run" "${base[@]}" --agg bogus
refused "--temperature -1" "temperature" rl --init "$T/run" "${base[@]}" --temperature -1
refused "an RL flag with --resume" "cannot be given with it" rl --resume "$T/RB" --group 3
refused "--beta -1" "beta" rl --init "$T/run" "${base[@]}" --beta -1
refused "--routing-replay with --dump-rollouts" "routing" rl --init "$T/run" "${base[@]}" --routing-replay --dump-rollouts "$T/dd"
refused "--speculative without an MTP block" "MTP" rl --init "$T/run" "${base[@]}" --speculative

# speculative rollouts (the MTP block drafts): the same completions, so the same rewards and
# tokens, and the drafts counted; on a demo model with one MTP block
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_nextn_predict_layers"] = 1; json.dump(c, open(sys.argv[2], "w"))' \
    "${MT_SRC:-$(dirname "$0")/..}/configs/demo.json" "$T/mtp.json" || fail "could not derive the MTP config"
"$MT" train --config "$T/mtp.json" --data "$T/D" --batch 16 --seq 64 --steps 60 --lr 3e-3 --warmup 10 --threads 2 --quiet \
    --out "$T/mrun" > "$T/mpre.log" 2>&1 || { tail -5 "$T/mpre.log"; fail "pretraining the MTP demo model"; }
margs=(--init "$T/mrun" --data "$T/D" --steps 2 --group 4 --prompts-per-step 8 --max-new 6 --eval-n 0 --threads 2 --quiet)
"$MT" rl "${margs[@]}" --out "$T/M0" > "$T/M0.log" 2>&1 || { tail -5 "$T/M0.log"; fail "rl on the MTP model"; }
"$MT" rl "${margs[@]}" --speculative --out "$T/M1" > "$T/M1.log" 2>&1 || { tail -5 "$T/M1.log"; fail "rl --speculative"; }
python3 - "$T/M0/metrics.jsonl" "$T/M1/metrics.jsonl" <<'PYEOF' || fail "rl --speculative changed the rollouts (or counted no drafts)"
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"event":"step"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("reward", "accuracy", "completion_tokens"):
        assert x[k] == y[k], (k, x[k], y[k])
    assert abs(x["loss"] - y["loss"]) <= 1e-6 + 1e-5 * abs(x["loss"]), (x["loss"], y["loss"])
    assert "spec_drafted" not in x and y["spec_drafted"] > 0 and 0 <= y["spec_accepted"] <= y["spec_drafted"], y
print("  speculative: drafts %d, accepted %d" % (sum(y["spec_drafted"] for y in b), sum(y["spec_accepted"] for y in b)))
PYEOF
ok "rl --speculative: the same rewards, accuracy and tokens as plain rollouts, drafts counted"

if [ ${#MPI[@]} -gt 0 ]; then
    # one process and DP2 on one thread per rank (the same global batch: 8 prompts x 4)
    OMP_NUM_THREADS=1 "$MT" rl "${rlargs[@]}" --threads 1 --quiet --out "$T/S1" > "$T/S1.log" 2>&1 \
        || { tail -5 "$T/S1.log"; fail "rl, one process, one thread"; }
    run 2 rl "${rlargs[@]}" --threads 1 --quiet --out "$T/S2" > "$T/S2.log" 2>&1 \
        || { tail -5 "$T/S2.log"; fail "rl under mpirun -np 2"; }
    python3 - "$T/S1/metrics.jsonl" "$T/S2/metrics.jsonl" <<'EOF' || fail "DP2 differs from one process"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"event":"step"' in l] for f in sys.argv[1:3])
bad = len(a) != 3 or len(b) != 3
for x, y in zip(a, b):
    d = abs(x["loss"] - y["loss"])
    print(f"    step {x['step']}: reward {x['reward']:.6f} / {y['reward']:.6f}, accuracy {x['accuracy']:.6f} / "
          f"{y['accuracy']:.6f}, tokens {x['completion_tokens']} / {y['completion_tokens']}, loss {x['loss']:+.8f} / "
          f"{y['loss']:+.8f}, grad_norm {x['grad_norm']:.6f} / {y['grad_norm']:.6f}")
    bad |= x["step"] != y["step"] or x["reward"] != y["reward"] or x["accuracy"] != y["accuracy"]
    bad |= x["completion_tokens"] != y["completion_tokens"] or x["uniform_groups"] != y["uniform_groups"]
    bad |= d > 1e-5 * abs(x["loss"]) + 1e-6
    bad |= abs(x["grad_norm"] - y["grad_norm"]) > 1e-4 * x["grad_norm"]
    bad |= x.get("heldout_accuracy") != y.get("heldout_accuracy")
    bad |= y["ratio_dev"] != 0 or y["clip_fraction"] != 0
sys.exit(1 if bad else 0)
EOF
    ok "DP2 = one process: rewards, accuracy, tokens, held-out accuracy exactly; loss within 1e-5 (1e-6 abs)"
    # RL Fusion: training splits the model, every rank rolls out from a whole copy
    # (4 ranks, DP4 x EP2: ranks 2 and 3 own no tensor, so they send empty blocks), or
    # from its part of an expert-parallel rollout layout (--rollout-ep: DP2 -> EP2, TP2 x DP2
    # -> EP4, the experts exchanged in every decode step) or of a tensor-parallel one
    # (--rollout-tp: DP2 -> TP2, TP2+SP x DP2 -> TP2 x DP2 without SP, the heads' partial sums
    # all-reduced in every decode step); and separate deployments:
    # --rollout-ranks R roll out, the other ranks train. The trainer's log-probs of the
    # sampled tokens within 1e-5 of the rollout's in every pair of layouts
    # run $2 = the one-process run $1 ($3 steps): rewards, tokens, held-out accuracy (and
    # speculative drafts) exactly, loss within 1e-5, on-policy, a layout switch every step, logp_old within 1e-5 of
    # logp_behav (within $4 when given: 0 where the layouts differ only in their experts, which the copy whose experts
    # are all local sums in the other layout's order)
    same_run() {
        python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "${4:-1e-5}" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"event":"step"' in l] for f in sys.argv[1:3])
lim = float(sys.argv[4])
bad = len(a) != int(sys.argv[3]) or len(b) != len(a)
for x, y in zip(a, b):
    print(f"    step {x['step']}: reward {y['reward']:.6f}, tokens {y['completion_tokens']}, loss {x['loss']:+.8f} / "
          f"{y['loss']:+.8f}, grad_norm {x['grad_norm']:.6f} / {y['grad_norm']:.6f}, |old-behav| {y['logp_old_behav_max']:.1e}, switch {y['switch_s']:.4f} s, "
          f"rss rollout/train {y['rss_rollout_mib']:.0f}/{y['rss_train_mib']:.0f} MiB")
    bad |= x["reward"] != y["reward"] or x["completion_tokens"] != y["completion_tokens"]
    bad |= abs(x["loss"] - y["loss"]) > 1e-5 * abs(x["loss"]) + 1e-6
    bad |= abs(x["grad_norm"] - y["grad_norm"]) > 1e-4 * x["grad_norm"]
    bad |= x.get("heldout_accuracy") != y.get("heldout_accuracy")
    bad |= x.get("spec_drafted") != y.get("spec_drafted") or x.get("spec_accepted") != y.get("spec_accepted")
    bad |= y["ratio_dev"] != 0 or not (y["switch_s"] > 0) or y["logp_old_behav_max"] > lim
sys.exit(1 if bad else 0)
EOF
    }
    for L in "2 --ep 2" "2 --tp 2 --sp" "2 --pp 2 --dist-opt" "4 --ep 2" "2 --rollout-ranks 1" "3 --rollout-ranks 2" "3 --ep 2 --rollout-ranks 1" \
             "2 --rollout-ep 2" "4 --tp 2 --sp --rollout-ep 4" "2 --rollout-tp 2" "4 --tp 2 --sp --rollout-tp 2"; do
        np=${L%% *}; L=${L#* }; n=$np$(echo "$L" | tr -d ' -')
        run $np rl "${rlargs[@]}" $L --threads 1 --quiet --out "$T/F$n" > "$T/F$n.log" 2>&1 \
            || { tail -5 "$T/F$n.log"; fail "rl $L under mpirun -np $np"; }
        lim=1e-5
        case "$L" in *ep*) [[ "$L" == *tp* ]] || lim=0 ;; esac
        same_run "$T/S1" "$T/F$n" 3 $lim || fail "rl $L differs from one process"
        ok "rl $L on $np ranks (weights moved each step) = one process: rewards, tokens, held-out accuracy; loss within 1e-5; |old-behav| <= $lim"
    done
    # --rollout-tp with MLA and the sandwich norm: the absorbed cache is shared by a rank's
    # heads, q_b / kv_b rows and o_proj columns split by heads
    python3 - "$(dirname "$0")/../configs/demo.json" "$T/mla.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
for k in ("num_key_value_heads", "head_dim"):
    c.pop(k)
c.update({"attention_type": "mla", "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 16, "v_head_dim": 32, "sandwich_norm": True})
json.dump(c, open(sys.argv[2], "w"))
EOF
    "$MT" train --config "$T/mla.json" --data "$T/D" --batch 16 --seq 64 --steps 40 --lr 3e-3 --warmup 10 --threads 2 \
        --quiet --out "$T/tla" > "$T/tpre.log" 2>&1 || { tail -5 "$T/tpre.log"; fail "pretraining the MLA model"; }
    targs=(--init "$T/tla" --data "$T/D" --steps 2 --group 4 --prompts-per-step 8 --max-new 6 --eval-n 50 --quiet)
    "$MT" rl "${targs[@]}" --threads 2 --out "$T/T1" > "$T/T1.log" 2>&1 || { tail -5 "$T/T1.log"; fail "rl, MLA"; }
    run 2 rl "${targs[@]}" --threads 1 --rollout-tp 2 --out "$T/T2" > "$T/T2.log" 2>&1 \
        || { tail -5 "$T/T2.log"; fail "rl --rollout-tp 2, MLA"; }
    same_run "$T/T1" "$T/T2" 2 || fail "rl --rollout-tp 2 with MLA differs from one process"
    ok "rl --rollout-tp 2 with MLA and the sandwich norm = one process: rewards, tokens, held-out accuracy; loss within 1e-5"
    # speculative decoding on the rollout parts: the MTP block drafts on EP parts (a rank
    # with no sequence left joins the block's exchange) and on TP slices
    for L in "--rollout-ep 2" "--rollout-tp 2"; do
        n=S$(echo "$L" | tr -d ' -')
        run 2 rl --init "$T/mrun" --data "$T/D" --steps 2 --group 4 --prompts-per-step 8 --max-new 6 --eval-n 0 --quiet \
            --speculative $L --threads 1 --out "$T/$n" > "$T/$n.log" 2>&1 || { tail -5 "$T/$n.log"; fail "rl --speculative $L"; }
        same_run "$T/M1" "$T/$n" 2 || fail "rl --speculative $L differs from one process"
        ok "rl --speculative $L on 2 ranks = one process: rewards, tokens, drafts and accepted drafts; loss within 1e-5"
    done
    if run 2 rl "${rlargs[@]}" --rollout-ranks 2 --threads 1 --quiet --out "$T/S4" > "$T/S4.log" 2>&1; then
        fail "--rollout-ranks 2 on 2 ranks accepted"
    fi
    grep -q "leaves no rank to train" "$T/S4.log" || { cat "$T/S4.log"; fail "--rollout-ranks 2 on 2 ranks: no clear error"; }
    ok "--rollout-ranks 2 on 2 ranks refused: $(grep -m1 'no rank to train' "$T/S4.log")"
    for v in "ep 3|does not divide" "ep 2 --rollout-ranks 1|cannot be given with --rollout-ranks" \
             "tp 3|does not divide" "tp 2 --rollout-ep 2|cannot be combined" "tp 2 --rollout-ranks 1|cannot be given"; do
        a=${v%%|*} msg=${v#*|}
        # shellcheck disable=SC2086
        if run 2 rl "${rlargs[@]}" --rollout-$a --threads 1 --quiet --out "$T/S5" > "$T/S5.log" 2>&1; then
            fail "--rollout-$a on 2 ranks accepted"
        fi
        grep -q "$msg" "$T/S5.log" || { cat "$T/S5.log"; fail "--rollout-$a: no clear error"; }
        ok "--rollout-$a on 2 ranks refused: $(grep -m1 "$msg" "$T/S5.log")"
    done
    if run 2 rl "${rlargs[@]}" --prompts-per-step 7 --threads 1 --quiet --out "$T/S3" > "$T/S3.log" 2>&1; then
        fail "DP2 with --prompts-per-step 7 accepted"
    fi
    grep -q "multiple" "$T/S3.log" || { cat "$T/S3.log"; fail "DP2 --prompts-per-step 7: no clear error"; }
    ok "DP2 refuses --prompts-per-step 7 (not a multiple of the ranks)"
else
    echo "note: mpirun not found (apt-get install openmpi-bin): the DP2 comparison was left out"
fi
echo "$passed passed, 0 failed"
