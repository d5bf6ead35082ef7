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
set -u
MOETRAIN=${1:?usage: bash tests/test_oracle.sh /path/to/moetrain}
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=/usr/bin/python3
REF="$SRC/tests/oracle/moe_ref.py"

if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
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
# run_case NAME CONFIG B T [MAKE-CASE ARGS]: the oracle's case at batch B x seq T against
# moetrain dump
run_case() {
  local name=$1 cfg=$2 B=$3 T=$4 case_dir="$TMP/case_$1"
  shift 4
  echo "=== oracle case $name (batch $B x seq $T)"
  if ! "$PY" "$REF" make-case --config "$TMP/$cfg.json" --out "$case_dir" --seed 7 --std 0.3 \
       --batch $B --seq $T "$@"; then
    fail "$name: make-case failed"; return
  fi
  if ! "$MOETRAIN" dump --ckpt "$case_dir" --tokens "$case_dir/tokens.bin" --batch $B --seq $T \
       --out "$case_dir/dump.safetensors" > "$case_dir/dump.log" 2>&1; then
    sed 's/^/    /' "$case_dir/dump.log" | tail -20
    fail "$name: moetrain dump failed (log $case_dir/dump.log)"; return
  fi
  if ! "$PY" "$REF" compare --case "$case_dir" --dump "$case_dir/dump.safetensors"; then
    fail "$name: moetrain disagrees with the PyTorch oracle (see table above)"
  fi
}
for name in $CASES; do run_case "$name" "$name" 2 16; done
# 1024 tokens: the dense FFN (F 96, wider than k x moe ffn = 64) runs over row chunks that fit
# the MoE-sized scratch (672 + 352 rows), its weight gradients summed over the chunks
run_case dense_ffn_chunks softmax_greedy 8 128
# a DeepSeek-V3 file: every MTP block also carries copies of the embedding and the head
# (model.layers.{L+k-1}.embed_tokens.weight, .shared_head.head.weight), drawn unlike the
# real ones: the loader must accept and ignore them
run_case mtp2_dsv3_copies mtp2_sigmoid_group_limited 2 16 --mtp-copies
# MTP on 4 x 64 tokens: more rows per expert, attention over a longer window
run_case mtp2_mla_sandwich_4x64 mtp2_mla_sandwich 4 64

# ---- reverse direction: a checkpoint written by PyTorch -----------------------------------
SEQ=32; WIN=8
DATA="$TMP/reverse_data"
"$MOETRAIN" data math --out "$DATA" > "$TMP/reverse_data.log" 2>&1 \
  || { tail -20 "$TMP/reverse_data.log"; fail "reverse: moetrain data math failed"; }
# reverse CONFIG: moe_ref.py trains a checkpoint of CONFIG; moetrain trains on from it and
# evaluates it to PyTorch's validation loss
reverse() {
  local cfg=$1 REV="$TMP/reverse_$1"
  echo "=== reverse direction ($cfg): PyTorch-written checkpoint in moetrain"
  mkdir -p "$REV"
  local OCK="$REV/oracle_ckpt" RUN="$REV/run" mt_val py_val
  if ! "$PY" "$REF" train --config "$TMP/$cfg.json" --data "$DATA" --steps 3 --batch 2 \
       --seq $SEQ --threads 2 --warmup 1 --lr 1e-3 --out "$OCK" > "$REV/oracle_train.log" 2>&1; then
    tail -20 "$REV/oracle_train.log"; fail "reverse $cfg: moe_ref.py train failed"; return
  fi
  grep -E '^(blas|step|summary)' "$REV/oracle_train.log" | sed 's/^/    oracle: /'
  if ! "$MOETRAIN" train --config "$OCK/config.json" --init "$OCK" --data "$DATA" --steps 3 --batch 2 \
       --seq $SEQ --out "$RUN" > "$REV/mt_train.log" 2>&1; then
    tail -20 "$REV/mt_train.log"; fail "reverse $cfg: moetrain train --init <oracle checkpoint> failed"
  else
    echo "    moetrain train --init oracle checkpoint: ok"
  fi
  mt_val=$("$MOETRAIN" eval --ckpt "$OCK" --data "$DATA" --seq $SEQ --windows $WIN 2> "$REV/mt_eval.err" \
           | grep -o 'val_loss=[-+0-9.eEinfa]*' | tail -1 | cut -d= -f2)
  py_val=$("$PY" "$REF" eval --ckpt "$OCK" --data "$DATA" --seq $SEQ --windows $WIN 2> "$REV/py_eval.err" \
           | grep -o 'val_loss=[-+0-9.eEinfa]*' | tail -1 | cut -d= -f2)
  if [ -z "$mt_val" ]; then
    cat "$REV/mt_eval.err" | tail -5; fail "reverse $cfg: moetrain eval printed no val_loss="
  elif [ -z "$py_val" ]; then
    cat "$REV/py_eval.err" | tail -5; fail "reverse $cfg: moe_ref.py eval printed no val_loss="
  elif ! "$PY" -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-4*abs(a) else 1)" "$py_val" "$mt_val"; then
    fail "reverse $cfg: val loss of the oracle checkpoint: moetrain $mt_val vs PyTorch $py_val (> 1e-4 relative)"
  else
    echo "    val_loss (seq $SEQ, $WIN windows): PyTorch $py_val  moetrain $mt_val  ok"
  fi
}
if [ -d "$DATA" ]; then
  reverse softmax_greedy
  reverse mla_qlora
  reverse mla_noq_sigmoid_moge
  reverse mtp1
fi

# ---- checkpoints written by moetrain (sandwich norm; MTP), evaluated by PyTorch -----------
# mt_written CONFIG WHAT [TRAIN ARGS]: moetrain trains CONFIG from scratch for 3 steps; PyTorch
# loads the checkpoint (every tensor named and shaped as it expects, nothing extra, not even
# a copy it would ignore) and
# evaluates it to moetrain's validation loss
mt_written() {
  local cfg=$1 what=$2 SWR="$TMP/mt_written_$1" mt_val py_val
  shift 2
  echo "=== moetrain-written $what checkpoint in PyTorch"
  if [ ! -d "$DATA" ]; then
    fail "$what checkpoint: no data (the reverse direction's data step failed)"; return
  fi
  if ! "$MOETRAIN" train --config "$TMP/$cfg.json" --data "$DATA" --steps 3 --batch 2 --seq $SEQ --lr 1e-3 \
       --warmup 1 "$@" --out "$SWR" --quiet > "$SWR.train.log" 2>&1; then
    tail -20 "$SWR.train.log"; fail "$what checkpoint: moetrain train failed"; return
  fi
  mt_val=$("$MOETRAIN" eval --ckpt "$SWR" --data "$DATA" --seq $SEQ --windows $WIN 2> "$SWR.mt_eval.err" \
           | grep -o 'val_loss=[-+0-9.eEinfa]*' | tail -1 | cut -d= -f2)
  py_val=$("$PY" "$REF" eval --ckpt "$SWR/step_00000003" --data "$DATA" --seq $SEQ --windows $WIN 2> "$SWR.py_eval.err" \
           | grep -o 'val_loss=[-+0-9.eEinfa]*' | tail -1 | cut -d= -f2)
  if [ -z "$mt_val" ] || [ -z "$py_val" ]; then
    tail -5 "$SWR.mt_eval.err" "$SWR.py_eval.err"; fail "$what checkpoint: an eval printed no val_loss="
  elif grep -q 'warning: .*ignoring' "$SWR.py_eval.err"; then
    # e.g. DeepSeek-V3's MTP copies of the embedding / head, which writers do not write
    grep 'warning: .*ignoring' "$SWR.py_eval.err" | sed 's/^/    /'
    fail "$what checkpoint: moetrain wrote tensors that are not parameters of the model"
  elif ! "$PY" -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-4*abs(a) else 1)" "$py_val" "$mt_val"; then
    fail "$what checkpoint: val loss moetrain $mt_val vs PyTorch $py_val (> 1e-4 relative)"
  else
    echo "    val_loss (seq $SEQ, $WIN windows): moetrain $mt_val  PyTorch $py_val  ok"
  fi
}
mt_written sandwich sandwich-norm --init-scheme tiny
mt_written mtp2_mla_sandwich "MTP (D 2, MLA, sandwich norm)"

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
