#!/usr/bin/env bash
# RL oracle test: a `moetrain rl` step recomputed by tests/oracle/grpo_ref.py, an independent
# PyTorch implementation of the GRPO step (RL contract; docs/FORMATS.md 7-8), from the
# checkpoint the step started from and the step's rollout dump (FORMATS.md 8.1).
#  1. data math (small: 1-digit sums) and a short pretrain of configs/demo.json (seconds)
#  2. 1-step rl runs from that checkpoint (--dump-rollouts, --dump-grads) with each
#     aggregation and several sampling settings; grpo_ref.py checks rewards, advantages,
#     every logp_behav (and the trainer's logp_old) against its own forward, the counts,
#     pg / loss, kl, clip fraction, balance, grad_norm and every gradient tensor
#     (fp32; the first case also fp64)
#  3. the oracle is not blind: a dump or gradient changed on purpose fails it
#  4. with mpirun: a DP2 run of 2 steps (--save-every 1 --keep 0): both steps' dumps
#     recomputed, step 2 from OUT/step_00000001; so are TP2+SP and PP2 runs (RL Fusion:
#     rollout from a whole copy, training split); --dump-grads refused under mpirun
# The oracle's checks run last, all in one grpo_ref.py --jobs process (torch imported once).
# Usage: bash tests/test_rl_oracle.sh /path/to/moetrain
# Env:   MT_SRC (source root; default: this script's ..), MT_TEST_TMP (scratch dir)
# Exit:  0 pass, 1 fail, 77 skipped (no python3-torch).
set -u
MOETRAIN=${1:?usage: bash tests/test_rl_oracle.sh /path/to/moetrain}
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
REF="$SRC/tests/oracle/grpo_ref.py"

if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "SKIPPED: python3-torch not installed (apt-get install python3-torch)"
  exit 77
fi
[ -x "$MOETRAIN" ] || { echo "FAIL: $MOETRAIN is not an executable"; exit 1; }
MOETRAIN=$(realpath "$MOETRAIN")

TMP=${MT_TEST_TMP:-/tmp}/rl_oracle.$$
rm -rf "$TMP"; mkdir -p "$TMP"
TMP=$(realpath "$TMP")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
FAILS=()
fail() { echo "FAIL: $*"; FAILS+=("$*"); }
ok() { echo "ok: $*"; }
cd "$TMP" || exit 1

# ---- 1. data and a short pretrain ---------------------------------------------------------
if ! "$MOETRAIN" data math --out math --train 4000 --val 50 --max-digits 1 > data.log 2>&1; then
  cat data.log; echo "FAIL: data math"; exit 1
fi
if ! "$MOETRAIN" train --config "$SRC/configs/demo.json" --data math --out pre --steps 60 --batch 8 --seq 64 \
     --lr 3e-3 --warmup 5 --quiet > pre.log 2>&1; then
  tail -20 pre.log; echo "FAIL: pretrain of configs/demo.json"; exit 1
fi

RL=(--init pre --data math --steps 1 --prompts-per-step 4 --group 8 --max-new 8 --format-penalty 1 --eval-n 0)
# The oracle runs as one grpo_ref.py --jobs process (torch imported once) after every
# moetrain run: job PREFIX ARGS... adds a check whose results are PREFIX.out/.err/.rc.
JOBS="$TMP/jobs.txt"; : > "$JOBS"
job() { printf '%q ' "$@" >> "$JOBS"; echo >> "$JOBS"; }
job_rc() { if [ -s "$1.rc" ]; then cat "$1.rc"; else echo none; fi; }
# judged PREFIX: the check ran and passed; else its output is shown
judged() {
  [ "$(job_rc "$1")" = 0 ] && return 0
  [ -s "$1.out" ] && sed 's/^/    /' "$1.out"
  [ -s "$1.err" ] && sed 's/^/    /' "$1.err"
  [ "$(job_rc "$1")" = none ] && echo "    (the check did not finish: grpo_ref.py ended early)"
  return 1
}

# rl_case NAME [flags]: a 1-step rl run with both dumps; the oracle checks it (fp32)
CASES=()
rl_case() {
  local name=$1; shift
  echo "=== rl case $name: $*"
  if ! "$MOETRAIN" rl "${RL[@]}" --out "r_$name" --dump-rollouts "r_$name/ro" --dump-grads "r_$name/grads.safetensors" \
       "$@" > "r_$name.log" 2>&1; then
    tail -20 "r_$name.log"; fail "$name: moetrain rl failed"; return 1
  fi
  grep '^step 1/1' "r_$name.log" | sed 's/^/    /'
  job "r_$name.ref" --ckpt pre --dump "r_$name/ro/step_00000001.json" --grads "r_$name/grads.safetensors"
  CASES+=("$name")
}

# ---- 2. the cases -------------------------------------------------------------------------
rl_case token_mean --agg token-mean
FP64=0
if [ -f r_token_mean/ro/step_00000001.json ]; then
  FP64=1
  job r_token_mean.ref64 --ckpt pre --dump r_token_mean/ro/step_00000001.json --grads r_token_mean/grads.safetensors \
      --dtype float64
fi
rl_case seq_mean_topk --agg seq-mean-token-mean --temperature 0.7 --top-k 5 --top-p 0.9
rl_case sum_norm_drop --agg seq-mean-token-sum-norm --no-scale --drop-uniform
rl_case greedy --temperature 0 --format-penalty 0.5 --micro-batch 5

# ---- 3. the oracle notices changes --------------------------------------------------------
# copies of the token_mean dump (or gradients), each changed one way; each must fail
KINDS="logp_behav pg reward advantage balance grads"
TAMPERED=0
if [ -f r_token_mean/grads.safetensors ]; then
  export SRC
  if "$PY" - $KINDS > tamper.log 2>&1 <<'PYEOF'
import json, sys, os
sys.path.insert(0, os.path.join(os.environ["SRC"], "tests/oracle"))
for kind in sys.argv[1:]:
    D = json.load(open("r_token_mean/ro/step_00000001.json"))
    C = D["completions"]
    if kind == "logp_behav":
        C[3]["logp_behav"][1] += 0.05
    elif kind == "pg":
        D["recorded"]["pg"] += 1e-3
    elif kind == "reward":
        C[0]["reward"] = 1.0 - C[0]["reward"]
    elif kind == "advantage":
        C[1]["advantage"] = -C[1]["advantage"] if C[1]["advantage"] else 0.5
    elif kind == "balance":
        D["recorded"]["balance"] *= 1.001
    elif kind == "grads":
        import moe_ref
        G = moe_ref.st_read("r_token_mean/grads.safetensors")
        name = "model.layers.1.mlp.gate.weight"
        G[name] = G[name] * 1.001
        moe_ref.st_write("tampered_grads.safetensors", G)
    json.dump(D, open(f"tampered_{kind}.json", "w"))
PYEOF
  then
    TAMPERED=1
    for kind in $KINDS; do
      g=r_token_mean/grads.safetensors; [ $kind = grads ] && g=tampered_grads.safetensors
      job "tamper_$kind.ref" --ckpt pre --dump "tampered_$kind.json" --grads "$g"
    done
  else
    cat tamper.log; fail "tamper: could not write the changed dumps"
  fi
fi

# ---- 4. data parallel (optional) ----------------------------------------------------------
# DP2: rank 0 writes the gathered rollouts. TP2+SP and PP2 (RL Fusion: the rollout on both
# ranks from a whole copy, the training split): the dump merges each DP index's records,
# the trainer's log-probs from the ranks where the head ran (with SP each TP rank holds a
# part)
source "$SRC/tests/lib/mpirun.sh"
LAYOUTS=()
layout_dir() { if [ -z "$1" ]; then echo r_dp2; else echo "r_$(echo "$1" | tr -d ' -')"; fi; }
if [ ${#MPI[@]} -eq 0 ]; then
  echo "note: mpirun not found: the DP2 part did not run"
else
  for L in "" "--tp 2 --sp" "--pp 2"; do
    n=$(layout_dir "$L")
    echo "=== ${L:-DP2}: 2 steps on 2 ranks"
    if ! OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$MOETRAIN" rl "${RL[@]}" $L --steps 2 --save-every 1 --keep 0 --out $n \
         --dump-rollouts $n/ro > $n.log 2>&1; then
      tail -20 $n.log; fail "${L:-DP2}: moetrain rl failed"
      continue
    fi
    LAYOUTS+=("$L")
    for st in 1 2; do
      ck=pre; [ $st = 2 ] && ck=$n/step_00000001
      job ${n}_$st.ref --ckpt $ck --dump $n/ro/step_0000000$st.json
    done
  done
  if OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$MOETRAIN" rl "${RL[@]}" --out r_dp2g --dump-grads g.safetensors \
       > r_dp2g.log 2>&1; then
    fail "DP2: --dump-grads was accepted under mpirun"
  elif ! grep -q "dump-grads" r_dp2g.log; then
    cat r_dp2g.log; fail "DP2: no clear message for --dump-grads under mpirun"
  else
    ok "--dump-grads refused under mpirun"
  fi
fi

# ---- the oracle's verdicts ----------------------------------------------------------------
echo "=== grpo_ref.py: $(wc -l < "$JOBS") checks in one process"
[ -s "$JOBS" ] && "$PY" "$REF" --jobs "$JOBS" > jobs.log 2>&1
for name in "${CASES[@]}"; do
  if judged "r_$name.ref"; then
    sed 's/^/    /' "r_$name.ref.out"; ok "$name"
  else
    fail "$name: grpo_ref.py disagrees with moetrain"
  fi
done
if [ $FP64 = 1 ]; then
  if judged r_token_mean.ref64; then
    grep -E 'logp_|gradients|^  (pg|balance|grad_norm) ' r_token_mean.ref64.out | sed 's/^/    fp64: /'
    ok "token_mean against the fp64 oracle"
  else
    fail "token_mean: the fp64 oracle disagrees"
  fi
fi
if [ $TAMPERED = 1 ]; then
  caught=1
  for kind in $KINDS; do
    p=tamper_$kind.ref
    if [ "$(job_rc $p)" = 0 ]; then
      cat $p.out; fail "the oracle passed a dump with a changed $kind"; caught=0
    elif ! grep -q '^FAIL' $p.out 2>/dev/null; then
      judged $p; fail "the oracle did not judge the dump with a changed $kind"; caught=0
    else
      echo "    changed $kind: $(grep -m1 '^FAIL' $p.out)"
    fi
  done
  [ $caught = 1 ] && ok "the oracle fails changed dumps"
fi
for L in "${LAYOUTS[@]}"; do
  n=$(layout_dir "$L")
  for st in 1 2; do
    ck=pre; [ $st = 2 ] && ck=$n/step_00000001
    if judged ${n}_$st.ref; then
      grep -E 'logp_behav|logp_old|^  (pg|grad_norm) ' ${n}_$st.ref.out | sed "s/^/    step $st: /"
      ok "${L:-DP2} step $st (from $ck)"
    else
      fail "${L:-DP2} step $st: grpo_ref.py disagrees"
    fi
  done
done

cd / || true
if [ ${#FAILS[@]} -gt 0 ]; then
  echo "${#FAILS[@]} failure(s); scratch kept in $TMP"
  printf '  %s\n' "${FAILS[@]}"
  exit 1
fi
rm -rf "$TMP"
echo "PASS: rl oracle"
