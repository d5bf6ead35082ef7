#!/usr/bin/env bash
# CLI error handling (issue item 8, docs/FORMATS.md "config.json" / "Token data" / checkpoints):
# every bad input must give ONE clear "moetrain: error: ..." line naming the file, flag or
# key, a non-zero exit that is not a signal, and never a crash, a hang or a silent success.
# Positive controls (a good train, eval and --resume) keep the test from passing vacuously.
#
# Usage: bash tests/test_cli_errors.sh /path/to/moetrain
# Env:   MT_TEST_TMP (scratch dir; a unique subdir is made and removed on success)
# Exit:  0 all passed, 1 some failed.
set -u
NAME=test_cli_errors
source "$(dirname "$0")/lib/cli.sh"

# ---- inputs ----------------------------------------------------------------------------
cli_tiny_config # c.json, the base of the variants below
"$PY" - <<'EOF' || { echo "FAIL: cannot write configs"; exit 1; }
import json, sys, struct, os
c = json.load(open("c.json"))
os.makedirs("cfg", exist_ok=True)
def variant(name, patch=None, drop=()):
    v = dict(c); v.update(patch or {})
    for k in drop: v.pop(k, None)
    json.dump(v, open("cfg/%s.json" % name, "w"), indent=1)
variant("h_hkv", {"num_key_value_heads": 3})
variant("odd_hd", {"head_dim": 15})
variant("k_gt_e", {"num_experts_per_tok": 5})
variant("e_ngroup", {"n_group": 3})
variant("topkg_gt_ng", {"n_group": 2, "topk_group": 3})
variant("grouplim_k", {"topk_method": "group_limited", "n_group": 4, "topk_group": 1, "num_experts_per_tok": 2})
variant("moge_k", {"topk_method": "moge", "n_group": 2, "num_experts_per_tok": 3})
variant("moe_no_experts", {"n_routed_experts": 0})
variant("moe_no_ffn", drop=("moe_intermediate_size",))
variant("rope_scaling", {"rope_scaling": {"type": "linear", "factor": 2.0}})
variant("moe_layer_freq", {"moe_layer_freq": 2})
variant("attention_bias", {"attention_bias": True})
variant("float_int", {"hidden_size": 8.5})
variant("missing_key", drop=("intermediate_size",))
variant("vocab200", {"vocab_size": 200})
variant("layers300", {"num_hidden_layers": 300, "first_k_dense_replace": 300})
variant("mtp5", {"num_nextn_predict_layers": 5})
variant("tied", {"tie_word_embeddings": True})
variant("absurd", {"vocab_size": 2000000000, "hidden_size": 2000000000})
# accepted spellings (positive control for the rules above)
variant("accepted", {"hidden_size": 32.0, "rope_scaling": None, "moe_layer_freq": 1,
                     "attention_bias": False, "some_unknown_key": "kept"})
open("malformed.json", "w").write('{"vocab_size": 257,\n "hidden_size": 32,,\n')
EOF

run_cmd 60 data.out data.err "$M" data math --out D --train 2000 --val 100
[ $RC = 0 ] && [ -f D/math_train_000000.bin ] || { echo "FAIL setup: moetrain data math (exit $RC): $(cat data.err)"; exit 1; }
TRAIN_SHARD=$(ls D/*train*.bin | head -1)

TR="--steps 2 --batch 2 --seq 32"
expect_ok control_train -- "$M" train --config c.json --data D $TR --out RUN --quiet
CK=RUN/$(cat RUN/latest 2>/dev/null)
if [ ! -f "$CK/model.safetensors" ] || [ ! -f "$CK/checksums.json" ]; then
  fail control_checkpoint "RUN/latest -> '$CK' has no model.safetensors/checksums.json"
  CK=RUN/step_00000002
else ok control_checkpoint; fi
expect_ok control_eval -- "$M" eval --ckpt RUN --data D --problems 2
expect_ok control_accepted_config -- "$M" train --config cfg/accepted.json --data D --steps 1 --batch 2 --seq 32 --out RUN_ACC --quiet

# ---- flags and commands ----------------------------------------------------------------
expect_fail unknown_flag_train '--bogus' -- "$M" train --config c.json --data D $TR --out R1 --bogus
expect_fail unknown_flag_eval '--bogus' -- "$M" eval --ckpt RUN --data D --bogus
expect_fail bad_cpu_tier 'MT_CPU_TIER=avx9: expected auto, avx2' -- env MT_CPU_TIER=avx9 "$M" info --config c.json
# --no-NAME exists only for booleans a resumed run may set (--bf16, --doc-mode)
expect_fail no_flag_not_resumable '--no-quiet' -- "$M" train --config c.json --data D $TR --out R1 --no-quiet
expect_fail no_flag_value '--no-bf16 takes no value' -- "$M" train --config c.json --data D $TR --out R1 --no-bf16=1
expect_fail bad_expert_placement "--expert-placement .striped.: contiguous or shuffled:SEED" -- "$M" train --config c.json --data D $TR --out R1 --expert-placement striped
expect_fail unknown_flag_data_math '--bogus' -- "$M" data math --out DX --bogus
expect_fail unknown_command 'frobnicate' -- "$M" frobnicate
expect_fail missing_data_flag '--data' -- "$M" train --config c.json $TR --out R1
expect_fail missing_ckpt_flag '--ckpt' -- "$M" eval --data D
expect_fail flag_missing_value '--steps' -- "$M" train --config c.json --data D --batch 2 --seq 32 --out R1 --steps
expect_fail non_numeric_steps "--steps.*'?abc" -- "$M" train --config c.json --data D --batch 2 --seq 32 --out R1 --steps abc
expect_fail trailing_garbage_lr '--lr' -- "$M" train --config c.json --data D $TR --out R1 --lr 1e-3x
# the planner's policies beyond the trainer's two are refused by name; an unknown one too
expect_fail recompute_planner_only "--recompute: 'full' is a policy of the planner only" -- "$M" train --config c.json --data D $TR --out R1 --recompute full
expect_fail recompute_unknown "--recompute: unknown policy 'selective-gemm'" -- "$M" train --config c.json --data D $TR --out R1 --recompute selective-gemm
# the balance loss's scope and the init scheme: the values are named
expect_fail aux_scope_unknown "--aux-scope 'batch': sequence or ep-group" -- "$M" train --config c.json --data D $TR --out R1 --aux-scope batch
expect_fail init_scheme_unknown "--init-scheme 'small': default or tiny" -- "$M" train --config c.json --data D $TR --out R1 --init-scheme small
expect_fail init_scheme_tiny_tied "--init-scheme tiny.*tie_word_embeddings" -- "$M" train --config cfg/tied.json --data D $TR --out R1 --init-scheme tiny
# bench: the default sequence fits the config (demo's maximum is 256); a longer --seq is refused
expect_ok control_bench_demo_default_seq -- "$M" bench --config demo --batch 1 --steps 1
expect_fail bench_seq_too_long 'max_position_embeddings' -- "$M" bench --config demo --batch 1 --steps 1 --seq 300
expect_fail nonpositive_steps '--steps' -- "$M" train --config c.json --data D --batch 2 --seq 32 --out R1 --steps 0

# ---- config.json -----------------------------------------------------------------------
expect_fail config_missing_file 'nope\.json' -- "$M" train --config nope.json --data D $TR --out R1
expect_fail config_malformed_json 'malformed\.json' -- "$M" train --config malformed.json --data D $TR --out R1
cfg_fail() {  # cfg_fail VARIANT KEY_REGEX
  expect_fail "config_$1" "$1\.json.*($2)" -- "$M" train --config "cfg/$1.json" --data D $TR --out R1
}
cfg_fail h_hkv          num_key_value_heads
cfg_fail odd_hd         head_dim
cfg_fail k_gt_e         'num_experts_per_tok|n_routed_experts'
cfg_fail e_ngroup       'n_group|n_routed_experts'
cfg_fail topkg_gt_ng    topk_group
cfg_fail grouplim_k     'num_experts_per_tok|topk_group'
cfg_fail moge_k         'num_experts_per_tok|n_group'
cfg_fail moe_no_experts n_routed_experts
cfg_fail moe_no_ffn     moe_intermediate_size
cfg_fail rope_scaling   rope_scaling
cfg_fail moe_layer_freq moe_layer_freq
cfg_fail attention_bias attention_bias
cfg_fail float_int      'hidden_size.*8\.5|8\.5.*hidden_size'
cfg_fail missing_key    intermediate_size
expect_fail seq_gt_max_positions_train 'max_position_embeddings' -- "$M" train --config c.json --data D --steps 1 --batch 2 --seq 65 --out R1
expect_fail seq_gt_max_positions_eval 'max_position_embeddings' -- "$M" eval --ckpt RUN --data D --seq 65 --problems 0

# ---- token data ------------------------------------------------------------------------
"$PY" - "$TRAIN_SHARD" <<'EOF' || { echo "FAIL: cannot write shards"; exit 1; }
import os, struct, sys, random
src = open(sys.argv[1], "rb").read()
def put(d, name, data):
    os.makedirs(d, exist_ok=True); open(os.path.join(d, name), "wb").write(data)
os.makedirs("EMPTY", exist_ok=True)
put("TRUNC", "math_train_000000.bin", src[:-777])                 # cut bytes off the end
put("SHORTHDR", "math_train_000000.bin", src[:1000])              # shorter than the header
random.seed(7)
put("FOREIGN", "x_train_000000.bin", bytes(random.randrange(256) for _ in range(5000)))
h = [0] * 256; h[0] = 12345; h[1] = 1; h[2] = 100
put("BADMAGIC", "x_train_000000.bin", struct.pack("<256i", *h) + bytes(200))
d = bytearray(src); struct.pack_into("<i", d, 4, 3)               # known magic, unknown version
put("BADVER", "math_train_000000.bin", bytes(d))
n = struct.unpack_from("<i", src, 8)[0]
d = bytearray(src); struct.pack_into("<i", d, 8, n + 100)         # header count > file
put("COUNTHI", "math_train_000000.bin", bytes(d))
d = bytearray(src); struct.pack_into("<i", d, 8, n - 100)         # header count < file
put("COUNTLO", "math_train_000000.bin", bytes(d))
# a val split shorter than one window beside a good train split
put("SHORTVAL", "math_train_000000.bin", src)
hv = list(struct.unpack_from("<256i", src, 0)); hv[2] = 10
put("SHORTVAL", "math_val_000000.bin", struct.pack("<256i", *hv) + src[1024:1024 + 2 * 10])
# uint32 shard with a token of 2^31 (negative as int32) for dump
toks = [5] * 100; toks[3] = 0x80000000
h = [0] * 256; h[0] = 20240801; h[1] = 7; h[2] = len(toks)
put("TOK31", "t_train_000000.bin", struct.pack("<256i", *h) + struct.pack("<%dI" % len(toks), *toks))
# uint32 shard with a token beyond any vocab
toks = [5] * 3000; toks[100] = 70000
h = [0] * 256; h[0] = 20240801; h[1] = 7; h[2] = len(toks)
put("BIGTOK", "s_train_000000.bin", struct.pack("<256i", *h) + struct.pack("<%dI" % len(toks), *toks))
# small-token data (ids < 150) to train a vocab-200 model
toks = [random.randrange(150) for _ in range(5000)]
h = [0] * 256; h[0] = 20240520; h[1] = 1; h[2] = len(toks)
for split in ("train", "val"):
    put("SMALLV", "s_%s_000000.bin" % split, struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks))
EOF
DT="--config c.json $TR --out R1"
expect_fail data_missing_dir 'nodir' -- "$M" train $DT --data nodir
expect_fail data_no_shards 'EMPTY.*(shard|train)' -- "$M" train $DT --data EMPTY
# the val split matters only with --eval-every
expect_ok control_short_val_no_eval -- "$M" train $DT --data SHORTVAL --quiet
expect_fail data_short_val_eval "SHORTVAL.*'val'" -- "$M" train --config c.json $TR --out R1V --data SHORTVAL --eval-every 1 --quiet
expect_fail data_truncated_shard 'TRUNC/math_train_000000\.bin' -- "$M" train $DT --data TRUNC
expect_fail data_shorter_than_header 'SHORTHDR/math_train_000000\.bin' -- "$M" train $DT --data SHORTHDR
expect_fail data_foreign_random 'FOREIGN/x_train_000000\.bin' -- "$M" train $DT --data FOREIGN
expect_fail data_wrong_magic 'BADMAGIC/x_train_000000\.bin' -- "$M" train $DT --data BADMAGIC
expect_fail data_unknown_version 'BADVER/math_train_000000\.bin' -- "$M" train $DT --data BADVER
expect_fail data_header_count_high 'COUNTHI/math_train_000000\.bin' -- "$M" train $DT --data COUNTHI
expect_fail data_header_count_low 'COUNTLO/math_train_000000\.bin' -- "$M" train $DT --data COUNTLO
expect_fail eval_data_no_val_shards 'EMPTY' -- "$M" eval --ckpt RUN --data EMPTY --problems 0
expect_fail vocab_mismatch_train '(D|math_train).*vocab_size|vocab_size.*(D\b|math_train)' -- "$M" train --config cfg/vocab200.json --data D $TR --out R1
expect_fail vocab_mismatch_uint32_token '(BIGTOK|s_train).*vocab_size|vocab_size.*(BIGTOK|s_train)' -- "$M" train --config c.json --data BIGTOK $TR --out R1
expect_ok control_train_vocab200 -- "$M" train --config cfg/vocab200.json --data SMALLV --steps 1 --batch 2 --seq 32 --out RV --quiet
expect_fail vocab_mismatch_eval '(D|math_val).*vocab_size|vocab_size.*(D\b|math_val)' -- "$M" eval --ckpt RV --data D --problems 0
# byte-tokenizer prompts (end-of-text 256) on a vocab-200 model: refused, not read past the embedding
expect_fail generate_vocab_below_eot 'vocab_size 200' -- "$M" generate --ckpt RV --prompt abc --max-new 2
expect_fail dump_token_2_31 'token id 2147483648' -- "$M" dump --ckpt RUN --tokens TOK31/t_train_000000.bin --out d31.safetensors --batch 2 --seq 16

# ---- checkpoints -----------------------------------------------------------------------
edit_json() {  # edit_json FILE 'python statement on c'
  "$PY" -c 'import json,sys
p=sys.argv[1]; c=json.load(open(p))
exec(sys.argv[2])
json.dump(c, open(p, "w"), indent=1)' "$1" "$2"
}
clone() { rm -rf "$1"; cp -r "$CK" "$1"; }
clone CK_HIDDEN; rm -f CK_HIDDEN/checksums.json; edit_json CK_HIDDEN/config.json 'c["hidden_size"]=64'
expect_fail ckpt_hidden_size_shape 'model\.[a-z_.0-9]+weight.*\[.*\].*\[.*\]' -- "$M" eval --ckpt CK_HIDDEN --data D --problems 0
clone CK_LAYERS; rm -f CK_LAYERS/checksums.json; edit_json CK_LAYERS/config.json 'c["num_hidden_layers"]=3'
expect_fail ckpt_more_layers 'model\.layers\.2\.' -- "$M" eval --ckpt CK_LAYERS --data D --problems 0
clone CK_FEWER; rm -f CK_FEWER/checksums.json; edit_json CK_FEWER/config.json 'c["num_hidden_layers"]=1'
expect_fail ckpt_fewer_layers 'model\.layers\.1\.' -- "$M" eval --ckpt CK_FEWER --data D --problems 0
clone CK_EXPERTS; rm -f CK_EXPERTS/checksums.json; edit_json CK_EXPERTS/config.json 'c["n_routed_experts"]=2'
expect_fail ckpt_experts_shape 'model\.layers\.1\.mlp\.' -- "$M" eval --ckpt CK_EXPERTS --data D --problems 0
expect_fail init_from_mismatched_ckpt 'model\.[a-z_.0-9]+weight' -- "$M" train --init CK_HIDDEN --data D $TR --out R1
clone CK_CFGSUM; edit_json CK_CFGSUM/config.json 'c["hidden_size"]=64'
expect_fail ckpt_config_checksum 'CK_CFGSUM/config\.json.*checksum' -- "$M" eval --ckpt CK_CFGSUM --data D --problems 0
clone CK_FLIP
"$PY" -c 'import sys
p=sys.argv[1]; d=bytearray(open(p,"rb").read()); d[-100]^=0x40; open(p,"wb").write(d)' CK_FLIP/model.safetensors
expect_fail ckpt_model_checksum 'CK_FLIP/model\.safetensors.*checksum' -- "$M" eval --ckpt CK_FLIP --data D --problems 0
clone CK_TRUNC; rm -f CK_TRUNC/checksums.json
"$PY" -c 'import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)-1000)' CK_TRUNC/model.safetensors
expect_fail ckpt_truncated_model 'CK_TRUNC/model\.safetensors' -- "$M" eval --ckpt CK_TRUNC --data D --problems 0
clone CK_TRUNC2; rm -f CK_TRUNC2/checksums.json
"$PY" -c 'import os,sys; os.truncate(sys.argv[1], 100)' CK_TRUNC2/model.safetensors
expect_fail ckpt_truncated_header 'CK_TRUNC2/model\.safetensors' -- "$M" eval --ckpt CK_TRUNC2 --data D --problems 0
clone CK_NOSUM; rm -f CK_NOSUM/checksums.json
expect_fail resume_ckpt_no_checksums 'CK_NOSUM.*incomplete' -- "$M" train --resume CK_NOSUM --data D --steps 3 --batch 2 --seq 32 --out CK_NOSUM
rm -rf RUN_NOSUM; cp -r RUN RUN_NOSUM; rm -f RUN_NOSUM/step_*/checksums.json
expect_fail resume_run_no_checksums 'RUN_NOSUM.*incomplete' -- "$M" train --resume RUN_NOSUM --data D --steps 3 --batch 2 --seq 32 --out RUN_NOSUM
expect_fail eval_missing_ckpt 'nonexist' -- "$M" eval --ckpt nonexist --data D --problems 0
expect_fail eval_not_a_ckpt 'EMPTY' -- "$M" eval --ckpt EMPTY --data D --problems 0

# positive control: --resume of a run folder continues to the new step count
rm -rf RUN_RES; cp -r RUN RUN_RES
expect_ok control_resume -- "$M" train --resume RUN_RES --data D --steps 4 --batch 2 --seq 32 --out RUN_RES --quiet
if [ "$(cat RUN_RES/latest 2>/dev/null)" = step_00000004 ] && [ -f RUN_RES/step_00000004/checksums.json ]; then
  ok control_resume_latest
else fail control_resume_latest "RUN_RES/latest is '$(cat RUN_RES/latest 2>/dev/null)', expected step_00000004"; fi

# ---- non-finite loss / gradient --------------------------------------------------------
# --lr 1e30: step 1 is finite and saved (--save-every 1); its update blows the weights up
# so that later steps have a non-finite gradient and are skipped; after --max-bad-steps
# of them in a row the run stops naming the last good checkpoint, which must still load.
MAXBAD=2
run_cmd 60 nan.out nan.err "$M" train --config c.json --data D --steps 10 --batch 2 --seq 32 --out NAN \
  --lr 1e30 --max-bad-steps $MAXBAD --save-every 1 --keep 2 --quiet
nskip=$(grep -c 'update skipped' nan.err)
errline=$(grep -m1 '^moetrain: error:' nan.err)
good=$(printf '%s\n' "$errline" | sed -n 's/.*last good checkpoint: *\([^ ;,]*\).*/\1/p')
if [ $RC = 0 ] || [ $RC -ge 124 ]; then
  fail nonfinite_stops "exit $RC, expected a clean non-zero exit; stderr: $(head -c 400 nan.err | tr '\n' '|')"
elif [ "$(grep -c '^moetrain: error:' nan.err)" != 1 ]; then
  fail nonfinite_stops "expected one error line; stderr: $(head -c 400 nan.err | tr '\n' '|')"
elif ! printf '%s\n' "$errline" | grep -qiE 'non-finite|nan|inf'; then
  fail nonfinite_stops "error line does not mention non-finite steps: $errline"
else ok nonfinite_stops; fi
# MODEL/issue: "too many in a row stop the run": stop at the MAXBAD-th or (MAXBAD+1)-th
if [ "$nskip" -ge "$MAXBAD" ] && [ "$nskip" -le $((MAXBAD + 1)) ] && \
   [ "$(grep 'update skipped' nan.err | grep -ciE 'non-finite|nan|inf')" = "$nskip" ]; then
  ok nonfinite_update_skipped_warnings
else fail nonfinite_update_skipped_warnings "$nskip 'update skipped' warnings with --max-bad-steps $MAXBAD; stderr: $(head -c 400 nan.err | tr '\n' '|')"; fi
if [ -z "$good" ] || [ ! -d "$good" ]; then
  fail nonfinite_names_last_good "error line names no existing checkpoint: $errline"
else
  ok nonfinite_names_last_good
  expect_ok nonfinite_last_good_loads -- "$M" eval --ckpt "$good" --data D --problems 0
  expect_ok nonfinite_run_folder_loads -- "$M" eval --ckpt NAN --data D --problems 0
fi
# a loss that is NaN from the first step (huge init): stop, no checkpoint to name
expect_fail nonfinite_loss_from_init 'non-finite' --lines 6 -- "$M" train --config c.json --data D --steps 6 --batch 2 \
  --seq 32 --out NAN2 --init-std 1e38 --max-bad-steps 1 --quiet
if grep -qE 'non-finite loss.*update skipped' "$TMP/nonfinite_loss_from_init.err"; then ok nonfinite_loss_warning
else fail nonfinite_loss_warning "no 'non-finite loss ... update skipped' warning: $(head -c 300 "$TMP/nonfinite_loss_from_init.err" | tr '\n' '|')"; fi

# ---- invalid numeric values (beyond the list of the issue: crashes, hangs, silent NaN) --
expect_fail eval_batch_zero '--batch' --timeout 60 -- "$M" eval --ckpt RUN --data D --batch 0 --windows 2 --problems 0
expect_fail eval_batch_negative '--batch' --timeout 60 -- "$M" eval --ckpt RUN --data D --batch -1 --problems 0
expect_fail eval_max_new_negative '--max-new' --timeout 60 -- "$M" eval --ckpt RUN --data D --problems 2 --max-new -1
expect_fail train_lr_nan '--lr' -- "$M" train --config c.json --data D $TR --out R_LRNAN --lr nan --quiet
expect_fail train_init_std_nan '--init-std' -- "$M" train --config c.json --data D $TR --out R_STDNAN --init-std nan --quiet
# the parser: integers are never negative (no flag silently falls back to its default),
# reals are finite, and strtoull's " -1" (2^64 - 1) is refused
expect_fail train_warmup_negative '--warmup' -- "$M" train --config c.json --data D $TR --out R_WU --warmup -5 --quiet
expect_fail train_seed_space_minus '--seed' -- "$M" train --config c.json --data D $TR --out R_SEED --seed " -1" --quiet
expect_fail generate_temperature_nan '--temperature' -- "$M" generate --ckpt RUN --prompt 1+1= --temperature nan
expect_fail train_vpp_zero '--vpp' -- "$M" train --config c.json --data D $TR --out R_VPP --vpp 0 --quiet
expect_fail info_batch_zero '--batch' -- "$M" info --config c.json --batch 0
expect_fail bench_steps_zero '--steps' -- "$M" bench --config c.json --steps 0
expect_fail dump_batch_zero '--batch' -- "$M" dump --ckpt RUN --tokens "$TRAIN_SHARD" --out d0.safetensors --batch 0
expect_fail eval_eot_range '--eot' --timeout 60 -- "$M" eval --ckpt RUN --data D --doc-mode --eot 999 --problems 0
# configs beyond the trainer: a clear error, not a stack overrun or an abort allocating
expect_fail train_layers_over_256 'layers300\.json: key num_hidden_layers: 300.*256' -- "$M" train --config cfg/layers300.json --data D $TR --out R_L300 --quiet
expect_fail train_mtp_over_limit 'num_nextn_predict_layers: 5 exceeds the trainer.s limit of 4' -- "$M" train --config cfg/mtp5.json --data D $TR --out R_MTP --quiet
expect_fail train_absurd_sizes 'parameter' -- "$M" train --config cfg/absurd.json --data D $TR --out R_ABS --quiet
# flags that would be ignored: refused
expect_fail train_resume_and_init '--init' -- "$M" train --resume RUN --init RUN --data D --steps 3 --out R_RI --quiet
expect_fail bench_steps_without_config '--config' -- "$M" bench --steps 3
expect_fail bench_quick_without_calibrate '--calibrate' -- "$M" bench --quick
expect_fail plan_per_node_not_dividing '--devices-per-node' -- "$M" plan --model c.json --seq 64 --cluster h100 --devices 8 --devices-per-node 3
# a folder where a file is expected (it opens, and its size reads as LONG_MAX)
expect_fail config_is_folder 'not a regular file' -- "$M" info --config D
# --metrics elsewhere: the closing lines name the file that was written
run_cmd 60 metrics.out metrics.err "$M" train --config c.json --data D $TR --out R_MET --metrics met.jsonl
if [ $RC = 0 ] && [ -s met.jsonl ] && grep -qE '^  metrics +met.jsonl$' metrics.out; then ok train_metrics_path_printed
else fail train_metrics_path_printed "exit $RC; closing lines: $(tail -3 metrics.out | tr '\n' '|')"; fi

cli_summary
