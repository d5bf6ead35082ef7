#!/usr/bin/env bash
# PyTorch oracle test: moetrain's forward/backward against tests/oracle/moe_ref.py, an
# independent PyTorch implementation of docs/FORMATS.md, and the reverse direction (a
# checkpoint written by PyTorch trains and evaluates in moetrain with the same loss; one
# written by moetrain with the sandwich norm, or with multi-token prediction, evaluates in
# PyTorch with the same loss).
#
# Usage: bash tests/test_oracle.sh /path/to/moetrain
# Env:   MT_SRC (source root; default: this script's ..), MT_TEST_TMP (scratch dir)
# Exit:  0 pass, 1 fail, 77 skipped (no python3-torch).
#
# The PyTorch side runs as two `moe_ref.py batch` processes (torch imported once each):
# (A) make-case for every case and the reverse direction's training, then every moetrain
# run, then (B) compare for every case and the PyTorch evals; last, the report per case.
set -u
MOETRAIN=${1:?usage: bash tests/test_oracle.sh /path/to/moetrain}
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
REF="$SRC/tests/oracle/moe_ref.py"

# find_spec, not import: importing torch takes seconds; the batch jobs below import it once
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("torch") and u.find_spec("numpy")))' \
     >/dev/null 2>&1; then
  echo "SKIPPED: python3-torch not installed (apt-get install python3-torch)"
  exit 77
fi
[ -x "$MOETRAIN" ] || { echo "FAIL: $MOETRAIN is not an executable"; exit 1; }

TMP=${MT_TEST_TMP:-/tmp}/oracle.$$
rm -rf "$TMP"; mkdir -p "$TMP"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
FAILS=()
fail() { echo "FAIL: $*"; FAILS+=("$*"); }

# ---- tiny configs ------------------------------------------------------------------------
# base: vocab 300, d 64, 3 layers (first dense), H 4, Hkv 2, hd 16, ffn 96, E 8, k 2,
# moe ffn 32, 1 shared expert, aux 0.01.  Every variant is base + a JSON patch.
"$PY" - "$TMP" <<'EOF'
import json, sys, os
tmp = sys.argv[1]
base = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 3, "first_k_dense_replace": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "max_position_embeddings": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "n_shared_experts": 1, "aux_loss_alpha": 0.01,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "model_type": "moetrain"}
variants = {
    "softmax_greedy": {},
    "sigmoid_greedy": {"scoring_func": "sigmoid"},
    # k 3 > topk_group 2: with k <= topk_group group_limited can never differ from greedy
    "group_limited": {"topk_method": "group_limited", "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
    "sigmoid_group_limited_noshared": {"scoring_func": "sigmoid", "topk_method": "group_limited",
                                       "n_group": 4, "topk_group": 2, "n_shared_experts": 0,
                                       "num_experts_per_tok": 3},
    "moge": {"topk_method": "moge", "n_group": 2, "num_experts_per_tok": 2},
    "sigmoid_moge_k4": {"scoring_func": "sigmoid", "topk_method": "moge", "n_group": 2, "num_experts_per_tok": 4},
    "nonorm_rsf2.5": {"norm_topk_prob": False, "routed_scaling_factor": 2.5},
    "sigmoid_nonorm_rsf2.5": {"scoring_func": "sigmoid", "norm_topk_prob": False, "routed_scaling_factor": 2.5},
    "tied": {"tie_word_embeddings": True},
    "all_dense": None,
    "mha_hkv_eq_h": {"num_key_value_heads": 4},
    "rope_interleave": {"rope_interleave": True},
    # sandwich norm, with each routing family and with interleaved RoPE
    "sandwich": {"sandwich_norm": True},
    "sandwich_sigmoid_group_limited": {"sandwich_norm": True, "scoring_func": "sigmoid", "topk_method": "group_limited",
                                       "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
    "sandwich_moge_nonorm": {"sandwich_norm": True, "topk_method": "moge", "n_group": 2, "norm_topk_prob": False,
                             "routed_scaling_factor": 2.5, "n_shared_experts": 0},
    "sandwich_rope_interleave_tied": {"sandwich_norm": True, "rope_interleave": True, "tie_word_embeddings": True},
    # MLA (no head_dim, no num_key_value_heads: "DELETE"): query compression on / off, with
    # other routings; its RoPE pairing defaults to interleaved, one case rotates half
    "mla_qlora": {"attention_type": "mla", "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                  "qk_rope_head_dim": 8, "v_head_dim": 12, "head_dim": "DELETE", "num_key_value_heads": "DELETE"},
    "mla_noq_sigmoid_moge": {"attention_type": "mla", "q_lora_rank": None, "kv_lora_rank": 24,
                             "qk_nope_head_dim": 8, "qk_rope_head_dim": 16, "v_head_dim": 16,
                             "rope_interleave": False, "scoring_func": "sigmoid", "topk_method": "moge",
                             "n_group": 2, "num_experts_per_tok": 2, "head_dim": "DELETE",
                             "num_key_value_heads": "DELETE"},
    "mla_qlora_group_limited_tied": {"attention_type": "mla", "q_lora_rank": 16, "kv_lora_rank": 16,
                                     "qk_nope_head_dim": 12, "qk_rope_head_dim": 4, "v_head_dim": 20,
                                     "topk_method": "group_limited", "n_group": 4, "topk_group": 2,
                                     "num_experts_per_tok": 3, "tie_word_embeddings": True,
                                     "head_dim": "DELETE", "num_key_value_heads": "DELETE"},
    # Pangu's block: MLA under the sandwich norm
    "mla_sandwich": {"attention_type": "mla", "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                     "qk_rope_head_dim": 8, "v_head_dim": 12, "head_dim": "DELETE", "num_key_value_heads": "DELETE",
                     "sandwich_norm": True},
}
# multi-token prediction (num_nextn_predict_layers D): an existing variant + D (+ patch);
# "all_dense" as the base gives a dense MTP block
mtp = {
    "mtp1": ("softmax_greedy", 1, {}),
    "mtp2_sigmoid_group_limited": ("softmax_greedy", 2, {"scoring_func": "sigmoid", "topk_method": "group_limited",
                                                         "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3}),
    "mtp1_all_dense": ("all_dense", 1, {}),
    "mtp2_mla_sandwich": ("mla_sandwich", 2, {"mtp_loss_weight": 0.5}),
    "mtp1_tied_moge": ("moge", 1, {"tie_word_embeddings": True}),
    "mtp1_rope_interleave": ("rope_interleave", 1, {}),
    "mtp3_mla_noq_sigmoid_moge_noshared": ("mla_noq_sigmoid_moge", 3, {"n_shared_experts": 0,
                                                                       "mtp_loss_weight": 1.0}),
}
for name, (b, D, patch) in mtp.items():
    variants[name] = dict({"_dense": True} if variants[b] is None else variants[b],
                          num_nextn_predict_layers=D, **patch)
for name, patch in variants.items():
    if patch is None or patch.get("_dense"):   # no MoE keys at all: every layer dense (defaults)
        cfg = {k: v for k, v in dict(base, **(patch or {})).items() if k not in (
            "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
            "moe_intermediate_size", "n_shared_experts", "aux_loss_alpha", "_dense")}
    else:
        cfg = {k: v for k, v in dict(base, **patch).items() if v != "DELETE"}
    with open(os.path.join(tmp, name + ".json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print(name)
EOF
[ $? -eq 0 ] || { echo "FAIL: could not write the test configs"; exit 1; }

CASES="softmax_greedy sigmoid_greedy group_limited sigmoid_group_limited_noshared moge sigmoid_moge_k4 nonorm_rsf2.5 sigmoid_nonorm_rsf2.5 tied all_dense mha_hkv_eq_h rope_interleave sandwich sandwich_sigmoid_group_limited sandwich_moge_nonorm sandwich_rope_interleave_tied"
CASES="$CASES mla_qlora mla_noq_sigmoid_moge mla_qlora_group_limited_tied mla_sandwich"
CASES="$CASES mtp1 mtp2_sigmoid_group_limited mtp1_all_dense mtp2_mla_sandwich mtp1_tied_moge mtp1_rope_interleave"
CASES="$CASES mtp3_mla_noq_sigmoid_moge_noshared"

# ---- job lists for moe_ref.py batch ----------------------------------------------------
JOBS_A="$TMP/jobs_a.txt"; JOBS_B="$TMP/jobs_b.txt"
: > "$JOBS_A"; : > "$JOBS_B"
# job LIST PREFIX COMMAND ARGS...: one line of a batch; PREFIX.out/.err/.rc are its results
job() { local list=$1; shift; printf '%q ' "$@" >> "$list"; echo >> "$list"; }
# job_rc PREFIX: the job's exit status, "none" if it never finished
job_rc() { if [ -s "$1.rc" ]; then cat "$1.rc"; else echo none; fi; }
# run_batch LIST LOG: one PyTorch process for the whole list (each job's own status is
# checked where it is used; a job with none never finished). One thread: the cases are too
# small to gain from a second (train and eval set their own --threads).
run_batch() {
  [ -s "$1" ] || return 0
  "$PY" "$REF" batch --jobs "$1" --threads 1 > "$2" 2>&1
  grep -q '^batch: [0-9]* job(s)' "$2" && return 0
  echo "--- moe_ref.py batch ended before all its jobs (log $2):"
  tail -20 "$2" | sed 's/^/    /'
}
# not_run WHAT PREFIX: the failure message of a job that failed or never finished
not_run() {
  local rc; rc=$(job_rc "$2")
  if [ "$rc" = none ]; then echo "$1 did not finish (the PyTorch batch process ended early)"
  else echo "$1 failed (exit $rc)"; fi
}

# case NAME CONFIG B T [MAKE-CASE ARGS]: the oracle's case at batch B x seq T against
# moetrain dump
C_NAME=(); C_B=(); C_T=()
add_case() {
  local name=$1 cfg=$2 B=$3 T=$4 case_dir="$TMP/case_$1"
  shift 4
  C_NAME+=("$name"); C_B+=("$B"); C_T+=("$T")
  mkdir -p "$case_dir"
  job "$JOBS_A" "$case_dir/make_case" make-case --config "$TMP/$cfg.json" --out "$case_dir" --seed 7 --std 0.3 \
      --batch "$B" --seq "$T" "$@"
}
for name in $CASES; do add_case "$name" "$name" 2 16; done
# 1024 tokens: the dense FFN (F 96, wider than k x moe ffn = 64) runs over row chunks that fit
# the MoE-sized scratch (672 + 352 rows), its weight gradients summed over the chunks
add_case dense_ffn_chunks softmax_greedy 8 128
# a DeepSeek-V3 file: every MTP block also carries copies of the embedding and the head
# (model.layers.{L+k-1}.embed_tokens.weight, .shared_head.head.weight), drawn unlike the
# real ones: the loader must accept and ignore them
add_case mtp2_dsv3_copies mtp2_sigmoid_group_limited 2 16 --mtp-copies
# MTP on 4 x 64 tokens: more rows per expert, attention over a longer window
add_case mtp2_mla_sandwich_4x64 mtp2_mla_sandwich 4 64

# ---- reverse direction: a checkpoint written by PyTorch -----------------------------------
# moe_ref.py trains a checkpoint of each REVERSE config; moetrain trains on from it and
# evaluates it to PyTorch's validation loss
SEQ=32; WIN=8
DATA="$TMP/reverse_data"
REVERSE="softmax_greedy mla_qlora mla_noq_sigmoid_moge mtp1"
DATA_OK=0
if "$MOETRAIN" data math --out "$DATA" > "$TMP/reverse_data.log" 2>&1 && [ -d "$DATA" ]; then
  DATA_OK=1
  for cfg in $REVERSE; do
    REV="$TMP/reverse_$cfg"; mkdir -p "$REV"
    job "$JOBS_A" "$REV/oracle_train" train --config "$TMP/$cfg.json" --data "$DATA" --steps 3 --batch 2 \
        --seq $SEQ --threads 2 --warmup 1 --lr 1e-3 --no-blas-timing --out "$REV/oracle_ckpt"
  done
fi

# ---- (A) PyTorch: make-case, train --------------------------------------------------------
echo "--- PyTorch (A): $(wc -l < "$JOBS_A") make-case / train jobs in one process"
run_batch "$JOBS_A" "$TMP/batch_a.log"

# ---- moetrain: dump every case; train and eval both directions' checkpoints ---------------
DUMP_OK=()
for i in "${!C_NAME[@]}"; do
  case_dir="$TMP/case_${C_NAME[$i]}"; DUMP_OK[i]=0
  [ "$(job_rc "$case_dir/make_case")" = 0 ] || continue
  if "$MOETRAIN" dump --ckpt "$case_dir" --tokens "$case_dir/tokens.bin" --batch "${C_B[$i]}" --seq "${C_T[$i]}" \
       --out "$case_dir/dump.safetensors" > "$case_dir/dump.log" 2>&1; then
    DUMP_OK[i]=1
    job "$JOBS_B" "$case_dir/compare" compare --case "$case_dir" --dump "$case_dir/dump.safetensors"
  fi
done
# an MFU denominator given: moetrain train times no GEMM at start and end (no check uses MFU)
PEAK=(--peak-gflops 100)
# mt_eval CKPT OUT ERR: moetrain's validation loss of CKPT (stdout to OUT, stderr to ERR)
mt_eval() { "$MOETRAIN" eval --ckpt "$1" --data "$DATA" --seq $SEQ --windows $WIN > "$2" 2> "$3"; }
if [ $DATA_OK = 1 ]; then
  for cfg in $REVERSE; do
    REV="$TMP/reverse_$cfg"; OCK="$REV/oracle_ckpt"
    [ "$(job_rc "$REV/oracle_train")" = 0 ] || continue
    "$MOETRAIN" train --config "$OCK/config.json" --init "$OCK" --data "$DATA" --steps 3 --batch 2 \
      --seq $SEQ "${PEAK[@]}" --out "$REV/run" > "$REV/mt_train.log" 2>&1; echo $? > "$REV/mt_train.rc"
    mt_eval "$OCK" "$REV/mt_eval.out" "$REV/mt_eval.err"
    job "$JOBS_B" "$REV/py_eval" eval --ckpt "$OCK" --data "$DATA" --seq $SEQ --windows $WIN
  done
fi
# mt_written CONFIG WHAT [TRAIN ARGS]: a checkpoint written by moetrain (sandwich norm; MTP),
# evaluated by PyTorch: moetrain trains CONFIG from scratch for 3 steps
MT_WRITTEN=(); MT_WRITTEN_WHAT=()
mt_written() {
  local cfg=$1 what=$2 SWR="$TMP/mt_written_$1"
  shift 2
  MT_WRITTEN+=("$cfg"); MT_WRITTEN_WHAT+=("$what")
  [ $DATA_OK = 1 ] || return
  "$MOETRAIN" train --config "$TMP/$cfg.json" --data "$DATA" --steps 3 --batch 2 --seq $SEQ --lr 1e-3 \
    --warmup 1 "$@" "${PEAK[@]}" --out "$SWR" --quiet > "$SWR.train.log" 2>&1; echo $? > "$SWR.train.rc"
  [ "$(cat "$SWR.train.rc")" = 0 ] || return
  mt_eval "$SWR" "$SWR.mt_eval.out" "$SWR.mt_eval.err"
  job "$JOBS_B" "$SWR.py_eval" eval --ckpt "$SWR/step_00000003" --data "$DATA" --seq $SEQ --windows $WIN
}
mt_written sandwich sandwich-norm --init-scheme tiny
mt_written mtp2_mla_sandwich "MTP (D 2, MLA, sandwich norm)"

# ---- (B) PyTorch: compare, eval -----------------------------------------------------------
echo "--- PyTorch (B): $(wc -l < "$JOBS_B") compare / eval jobs in one process"
run_batch "$JOBS_B" "$TMP/batch_b.log"

# ---- report, case by case -----------------------------------------------------------------
for i in "${!C_NAME[@]}"; do
  name=${C_NAME[$i]}; case_dir="$TMP/case_$name"
  echo "=== oracle case $name (batch ${C_B[$i]} x seq ${C_T[$i]})"
  cat "$case_dir/make_case.out" "$case_dir/make_case.err" 2>/dev/null
  if [ "$(job_rc "$case_dir/make_case")" != 0 ]; then
    fail "$name: $(not_run make-case "$case_dir/make_case")"; continue
  fi
  if [ "${DUMP_OK[$i]}" != 1 ]; then
    sed 's/^/    /' "$case_dir/dump.log" | tail -20
    fail "$name: moetrain dump failed (log $case_dir/dump.log)"; continue
  fi
  cat "$case_dir/compare.out" "$case_dir/compare.err" 2>/dev/null
  rc=$(job_rc "$case_dir/compare")
  if [ "$rc" = none ]; then
    fail "$name: $(not_run compare "$case_dir/compare")"
  elif [ "$rc" != 0 ]; then
    fail "$name: moetrain disagrees with the PyTorch oracle (see table above)"
  fi
done

# val_of FILE: the last val_loss= value printed in FILE (empty if none)
val_of() { grep -o 'val_loss=[-+0-9.eEinfa]*' "$1" 2>/dev/null | tail -1 | cut -d= -f2; }
# close A B: |a - b| <= 1e-4 |a|
close() { "$PY" -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-4*abs(a) else 1)" "$1" "$2"; }

[ $DATA_OK = 1 ] || { tail -20 "$TMP/reverse_data.log"; fail "reverse: moetrain data math failed"; }
if [ $DATA_OK = 1 ]; then
  for cfg in $REVERSE; do
    REV="$TMP/reverse_$cfg"
    echo "=== reverse direction ($cfg): PyTorch-written checkpoint in moetrain"
    if [ "$(job_rc "$REV/oracle_train")" != 0 ]; then
      tail -20 "$REV/oracle_train.out" "$REV/oracle_train.err" 2>/dev/null
      fail "reverse $cfg: $(not_run "moe_ref.py train" "$REV/oracle_train")"; continue
    fi
    grep -E '^(blas|step|summary)' "$REV/oracle_train.out" | sed 's/^/    oracle: /'
    if [ "$(cat "$REV/mt_train.rc")" != 0 ]; then
      tail -20 "$REV/mt_train.log"; fail "reverse $cfg: moetrain train --init <oracle checkpoint> failed"
    else
      echo "    moetrain train --init oracle checkpoint: ok"
    fi
    mt_val=$(val_of "$REV/mt_eval.out"); py_val=$(val_of "$REV/py_eval.out")
    if [ -z "$mt_val" ]; then
      tail -5 "$REV/mt_eval.err"; fail "reverse $cfg: moetrain eval printed no val_loss="
    elif [ -z "$py_val" ]; then
      tail -5 "$REV/py_eval.err" 2>/dev/null
      fail "reverse $cfg: moe_ref.py eval printed no val_loss=$([ "$(job_rc "$REV/py_eval")" = none ] && echo " (it did not finish)")"
    elif ! close "$py_val" "$mt_val"; then
      fail "reverse $cfg: val loss of the oracle checkpoint: moetrain $mt_val vs PyTorch $py_val (> 1e-4 relative)"
    else
      echo "    val_loss (seq $SEQ, $WIN windows): PyTorch $py_val  moetrain $mt_val  ok"
    fi
  done
fi

# PyTorch loads each moetrain-written checkpoint (every tensor named and shaped as it
# expects, nothing extra, not even a copy it would ignore) and evaluates it to moetrain's
# validation loss
for i in "${!MT_WRITTEN[@]}"; do
  what=${MT_WRITTEN_WHAT[$i]}; SWR="$TMP/mt_written_${MT_WRITTEN[$i]}"
  echo "=== moetrain-written $what checkpoint in PyTorch"
  if [ $DATA_OK != 1 ]; then
    fail "$what checkpoint: no data (the reverse direction's data step failed)"; continue
  fi
  if [ "$(cat "$SWR.train.rc")" != 0 ]; then
    tail -20 "$SWR.train.log"; fail "$what checkpoint: moetrain train failed"; continue
  fi
  mt_val=$(val_of "$SWR.mt_eval.out"); py_val=$(val_of "$SWR.py_eval.out")
  if [ -z "$mt_val" ] || [ -z "$py_val" ]; then
    tail -5 "$SWR.mt_eval.err" "$SWR.py_eval.err" 2>/dev/null
    fail "$what checkpoint: an eval printed no val_loss=$([ "$(job_rc "$SWR.py_eval")" = none ] && echo " (PyTorch's did not finish)")"
  elif grep -q 'warning: .*ignoring' "$SWR.py_eval.err"; then
    # e.g. DeepSeek-V3's MTP copies of the embedding / head, which writers do not write
    grep 'warning: .*ignoring' "$SWR.py_eval.err" | sed 's/^/    /'
    fail "$what checkpoint: moetrain wrote tensors that are not parameters of the model"
  elif ! close "$py_val" "$mt_val"; then
    fail "$what checkpoint: val loss moetrain $mt_val vs PyTorch $py_val (> 1e-4 relative)"
  else
    echo "    val_loss (seq $SEQ, $WIN windows): moetrain $mt_val  PyTorch $py_val  ok"
  fi
done

echo
if [ ${#FAILS[@]} -gt 0 ]; then
  echo "test_oracle: ${#FAILS[@]} failure(s):"
  for f in "${FAILS[@]}"; do echo "  - $f"; done
  echo "(scratch kept in $TMP)"
  exit 1
fi
echo "test_oracle: all cases agree with the PyTorch oracle"
rm -rf "$TMP"
exit 0
