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
# rl_case NAME [flags]: a 1-step rl run with both dumps, then the oracle on it (fp32)
rl_case() {
  local name=$1; shift
  echo "=== rl case $name: $*"
  if ! "$MOETRAIN" rl "${RL[@]}" --out "r_$name" --dump-rollouts "r_$name/ro" --dump-grads "r_$name/grads.safetensors" \
       "$@" > "r_$name.log" 2>&1; then
    tail -20 "r_$name.log"; fail "$name: moetrain rl failed"; return 1
  fi
  grep '^step 1/1' "r_$name.log" | sed 's/^/    /'
  if ! "$PY" "$REF" --ckpt pre --dump "r_$name/ro/step_00000001.json" --grads "r_$name/grads.safetensors" \
       > "r_$name.ref" 2>&1; then
    sed 's/^/    /' "r_$name.ref"; fail "$name: grpo_ref.py disagrees with moetrain"; return 1
  fi
  sed 's/^/    /' "r_$name.ref"
  ok "$name"
}

# ---- 2. the cases -------------------------------------------------------------------------
rl_case token_mean --agg token-mean
if [ -f r_token_mean/ro/step_00000001.json ]; then
  if "$PY" "$REF" --ckpt pre --dump r_token_mean/ro/step_00000001.json --grads r_token_mean/grads.safetensors \
       --dtype float64 > r_token_mean.ref64 2>&1; then
    grep -E 'logp_|gradients|^  (pg|balance|grad_norm) ' r_token_mean.ref64 | sed 's/^/    fp64: /'
    ok "token_mean against the fp64 oracle"
  else
    sed 's/^/    /' r_token_mean.ref64; fail "token_mean: the fp64 oracle disagrees"
  fi
fi
rl_case seq_mean_topk --agg seq-mean-token-mean --temperature 0.7 --top-k 5 --top-p 0.9
rl_case sum_norm_drop --agg seq-mean-token-sum-norm --no-scale --drop-uniform
rl_case greedy --temperature 0 --format-penalty 0.5 --micro-batch 5

# ---- 3. the oracle notices changes --------------------------------------------------------
# tamper KIND: a copy of the token_mean dump (or gradients) changed one way; must fail
tamper() {
  "$PY" - "$1" <<'EOF'
import json, sys, os
sys.path.insert(0, os.path.join(os.environ["SRC"], "tests/oracle"))
kind = sys.argv[1]
D = json.load(open("r_token_mean/ro/step_00000001.json"))
grads = "r_token_mean/grads.safetensors"
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
    G = moe_ref.st_read(grads)
    name = "model.layers.1.mlp.gate.weight"
    G[name] = G[name] * 1.001
    grads = "tampered.safetensors"
    moe_ref.st_write(grads, G)
json.dump(D, open("tampered.json", "w"))
print(grads)
EOF
}
if [ -f r_token_mean/grads.safetensors ]; then
  export SRC
  for kind in logp_behav pg reward advantage balance grads; do
    g=$(tamper $kind) || { fail "tamper $kind: could not write the changed dump"; continue; }
    if "$PY" "$REF" --ckpt pre --dump tampered.json --grads "$g" > "tamper_$kind.ref" 2>&1; then
      cat "tamper_$kind.ref"; fail "the oracle passed a dump with a changed $kind"
    else
      echo "    changed $kind: $(grep -m1 '^FAIL' "tamper_$kind.ref")"
    fi
  done
  ok "the oracle fails changed dumps"
fi

# ---- 4. data parallel (optional) ----------------------------------------------------------
source "$SRC/tests/lib/mpirun.sh"
if [ ${#MPI[@]} -eq 0 ]; then
  echo "note: mpirun not found: the DP2 part did not run"
else
  echo "=== DP2: 2 steps, rank 0 writes the gathered rollouts"
  if ! OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$MOETRAIN" rl "${RL[@]}" --steps 2 --save-every 1 --keep 0 --out r_dp2 \
       --dump-rollouts r_dp2/ro > r_dp2.log 2>&1; then
    tail -20 r_dp2.log; fail "DP2: moetrain rl failed"
  else
    for s in 1 2; do
      ck=pre; [ $s = 2 ] && ck=r_dp2/step_00000001
      if "$PY" "$REF" --ckpt $ck --dump r_dp2/ro/step_0000000$s.json > r_dp2_$s.ref 2>&1; then
        grep -E 'logp_behav|^  (pg|grad_norm) ' r_dp2_$s.ref | sed "s/^/    step $s: /"
        ok "DP2 step $s (from $ck)"
      else
        sed 's/^/    /' r_dp2_$s.ref; fail "DP2 step $s: grpo_ref.py disagrees"
      fi
    done
  fi
  # training split over the ranks (RL Fusion): the dump merges each DP index's records, the
  # trainer's log-probs from the ranks where the head ran (with SP each TP rank holds a part)
  for L in "--tp 2 --sp" "--pp 2"; do
    n=r_$(echo "$L" | tr -d ' -')
    echo "=== $L: 2 steps, the rollout on both ranks from a whole copy"
    if ! OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$MOETRAIN" rl "${RL[@]}" $L --steps 2 --save-every 1 --keep 0 --out $n \
         --dump-rollouts $n/ro > $n.log 2>&1; then
      tail -20 $n.log; fail "$L: moetrain rl failed"
      continue
    fi
    for st in 1 2; do
      ck=pre; [ $st = 2 ] && ck=$n/step_00000001
      if "$PY" "$REF" --ckpt $ck --dump $n/ro/step_0000000$st.json > ${n}_$st.ref 2>&1; then
        grep -E 'logp_old|^  (pg|grad_norm) ' ${n}_$st.ref | sed "s/^/    step $st: /"
        ok "$L step $st (from $ck)"
      else
        sed 's/^/    /' ${n}_$st.ref; fail "$L step $st: grpo_ref.py disagrees"
      fi
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

cd / || true
if [ ${#FAILS[@]} -gt 0 ]; then
  echo "${#FAILS[@]} failure(s); scratch kept in $TMP"
  printf '  %s\n' "${FAILS[@]}"
  exit 1
fi
rm -rf "$TMP"
echo "PASS: rl oracle"
