#!/usr/bin/env bash
# A corpus of bad inputs (issue items 3, 8, 9; docs/FORMATS.md "JSON" and 4.5): configs that
# are not strict JSON (RFC 8259), hand-edited trainer_state.json values (checksums recomputed,
# so the edit reaches the validator), bad checksums.json / safetensors headers / rl_settings.json,
# and FIFOs named like inputs. Each must give ONE "moetrain: error: ..." line naming the file
# and the key, a non-zero exit that is not a signal, and no hang. Positive controls (strict
# JSON that is accepted, a resume from a re-hashed but unchanged state) keep the test honest.
#
# Usage: bash tests/test_bad_inputs.sh /path/to/moetrain
# Env:   MT_TEST_TMP (scratch dir; a unique subdir is made and removed on success)
set -u
NAME=test_bad_inputs
source "$(dirname "$0")/lib/cli.sh"
command -v timeout >/dev/null 2>&1 || { echo "FAIL: timeout (coreutils) is needed: a FIFO must not hang the test"; exit 1; }
command -v mkfifo >/dev/null 2>&1 || { echo "FAIL: mkfifo is needed"; exit 1; }

# ---- a tiny model, data and one checkpoint ---------------------------------------------
"$PY" - "$SRC/configs/demo.json" <<'EOF' || { echo "FAIL: cannot write configs"; exit 1; }
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
         head_dim=16, intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=32, max_position_embeddings=64, rope_theta=10000.0)
json.dump(c, open("c.json", "w"), indent=1)
json.dump(dict(c, vocab_size=200), open("c200.json", "w"), indent=1)
EOF
run_cmd 120 data.out data.err "$M" data math --out D --train 2000 --val 100
[ $RC = 0 ] && [ -f D/math_train_000000.bin ] || { echo "FAIL setup: moetrain data math (exit $RC): $(cat data.err)"; exit 1; }
mkdir -p TRONLY && cp D/math_train_000000.bin TRONLY/
TR="--steps 2 --batch 2 --seq 32"
expect_ok control_train -- "$M" train --config c.json --data D $TR --out RUN --quiet
CK=RUN/step_00000002
[ -f "$CK/trainer_state.json" ] || { echo "FAIL setup: no $CK/trainer_state.json"; exit 1; }

# ---- config.json: strict JSON (RFC 8259) ------------------------------------------------
# raw FILE TEXT-REPLACEMENT: c.json with `"hidden_size": 32` (or another key) rewritten as text
"$PY" <<'EOF' || { echo "FAIL: cannot write the JSON corpus"; exit 1; }
import os
base = open("c.json").read()
os.makedirs("J", exist_ok=True)
def raw(name, old, new):
    assert old in base, old
    open("J/%s.json" % name, "w").write(base.replace(old, new, 1))
hs, rt = '"hidden_size": 32', '"rope_theta": 10000.0'
raw("leading_zero", hs, '"hidden_size": 032')
raw("trailing_dot", hs, '"hidden_size": 32.')
raw("leading_dot", rt, '"rope_theta": .5')
raw("plus_sign", hs, '"hidden_size": +32')
raw("huge", rt, '"rope_theta": 1e999')
raw("nan", rt, '"rope_theta": NaN')
raw("infinity", rt, '"rope_theta": Infinity')
raw("minus_infinity", rt, '"rope_theta": -Infinity')
raw("hex", hs, '"hidden_size": 0x20')
raw("no_exp_digits", rt, '"rope_theta": 1e')
raw("single_quotes", hs, "'hidden_size': 32")
raw("bad_escape", '"model_type": "', '"model_type": "\\x')
raw("trailing_comma", base.rstrip()[:-1].rstrip(), base.rstrip()[:-1].rstrip() + ",")
raw("nested_dup", hs, '"rope_parameters": {"rope_type": "default", "rope_type": "yarn"}, ' + hs)
open("J/after_nul.json", "wb").write(base.rstrip().encode() + b"\0 garbage\n")
open("J/trailing_text.json", "w").write(base.rstrip() + " {}\n")
# accepted: exponents (3.2e1 is the integer 32), a capital E with a sign
open("J/ok_spellings.json", "w").write(base.replace(hs, '"hidden_size": 3.2e1').replace(rt, '"rope_theta": 1E+4'))
EOF
cj() {  # cj NAME PATTERN: info --config J/NAME.json must fail naming the file and the key
  expect_fail "config_$1" "J/$1\.json: $2" -- "$M" info --config "J/$1.json"
}
cj leading_zero   'key hidden_size: 032 is not a JSON number \(leading zero\)'
cj trailing_dot   'key hidden_size: 32\. is not a JSON number \(no digit after the decimal point\)'
cj leading_dot    'key rope_theta: \.5 is not a JSON number'
cj plus_sign      'key hidden_size: \+32 is not a JSON number'
cj huge           'key rope_theta: 1e999 is out of range'
cj nan            'key rope_theta: NaN is not a JSON value'
cj infinity       'key rope_theta: Infinity is not a JSON value'
cj minus_infinity 'key rope_theta: -Infinity is not a JSON value'
cj hex            'key hidden_size: 0x20 is not a JSON number'
cj no_exp_digits  'key rope_theta: 1e is not a JSON number'
cj single_quotes  "'''hidden_size'.*not JSON|\"key\""
cj bad_escape     'key model_type: \\x is not a JSON escape'
cj trailing_comma '.*trailing comma before'
cj nested_dup     'key rope_type: appears more than once'
cj after_nul      'NUL byte at byte [0-9]+'
cj trailing_text  '.*after the end of the JSON value \(trailing text\)'
expect_ok control_config_plain -- "$M" info --config c.json
expect_ok control_config_ok_spellings -- "$M" info --config J/ok_spellings.json
# the same reader for train (not only info)
expect_fail train_config_leading_zero 'J/leading_zero\.json: key hidden_size: 032' -- "$M" train --config J/leading_zero.json --data D $TR --out R1

# ---- trainer_state.json: every field validated ------------------------------------------
# edit_state NAME 'python on dict s' [raw]: a clone of CK with trainer_state.json edited and
# its XXH64 in checksums.json recomputed (pure Python XXH64: no module needed)
cat >xxh.py <<'EOF'
import json, re, struct, sys
M = (1 << 64) - 1
P1, P2, P3, P4, P5 = 11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579, 2870177450012600261
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(a, v): return (rotl((a + v * P2) & M, 31) * P1) & M
def merge(h, v): return (((h ^ rnd(0, v)) * P1) + P4) & M
def xxh64(d, seed=0):
    n, i = len(d), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for k, w in enumerate(struct.unpack_from("<4Q", d, i)): v[k] = rnd(v[k], w)
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = merge(h, x)
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", d, i)[0]), 27) * P1 + P4) & M; i += 8
    if i + 4 <= n:
        h = (rotl(h ^ ((struct.unpack_from("<I", d, i)[0] * P1) & M), 23) * P2 + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ ((d[i] * P5) & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M; h ^= h >> 32
    return h
def rehash(ck, name):
    p = ck + "/checksums.json"; c = json.load(open(p))
    c["files"][name] = "%016x" % xxh64(open(ck + "/" + name, "rb").read())
    json.dump(c, open(p, "w"), indent=1)
if __name__ == "__main__":
    ck, mode, code = sys.argv[1], sys.argv[2], sys.argv[3]
    p = ck + "/trainer_state.json"
    if mode == "check":  # the unedited file must hash to what moetrain wrote
        want = json.load(open(ck + "/checksums.json"))["files"]["trainer_state.json"]
        sys.exit(0 if "%016x" % xxh64(open(p, "rb").read()) == want else 1)
    if mode == "json":
        s = json.load(open(p)); exec(code); json.dump(s, open(p, "w"), indent=1)
    else:  # raw: code rewrites the bytes t
        t = open(p, "rb").read(); t = eval(code); open(p, "wb").write(t)
    rehash(ck, "trainer_state.json")
EOF
if "$PY" xxh.py "$CK" check x; then ok xxh64_matches_moetrain
else fail xxh64_matches_moetrain "the test's XXH64 of $CK/trainer_state.json differs from checksums.json"; fi
edit_state() {  # edit_state NAME MODE CODE
  rm -rf "$1"; cp -r "$CK" "$1"
  "$PY" xxh.py "$1" "$2" "$3" || fail "$1" "cannot edit trainer_state.json"
}
RES="--data D --steps 3 --quiet --out"
st() {  # st NAME 'python on s' PATTERN: the resume must fail naming trainer_state.json and the key
  edit_state "ST_$1" json "$2"
  expect_fail "state_$1" "ST_$1/trainer_state\.json: $3" -- "$M" train --resume "ST_$1" $RES "OUT_$1"
}
st step_1e300      's["step"]=1e300'            'key step: 1e\+300 is out of range'
st step_negative   's["step"]=-1'               'key step: -1 is out of range'
st step_fraction   's["step"]=2.5'              'key step: expected an integer, got 2\.5'
st samples_neg     's["samples"]=-3'            'key samples: -3 is out of range'
st warmup_fraction 's["warmup"]=1.5'            'key warmup: expected an integer, got 1\.5'
st seed_text       's["seed"]="x"'              'key seed: expected a decimal integer'
st seed_negative   's["seed"]=-1'               'key seed: expected a decimal integer'
st seed_neg_text   's["seed"]="-1"'             'key seed: expected a decimal integer'
st seed_fraction   's["seed"]=1.5'              'key seed: expected a decimal integer'
st seed_too_big    's["seed"]="18446744073709551616"' 'key seed: expected a decimal integer'
st eps_zero        's["eps"]=0'                 'key eps: 0 is out of range'
st lr_negative     's["lr"]=-1'                 'key lr: -1 is out of range'
st beta2_one       's["beta2"]=1'               'key beta2: 1 is out of range'
st missing_eps     'del s["eps"]'               'key eps: required key is missing'
st missing_step    'del s["step"]'              'key step: required key is missing'
st batch_string    's["batch"]="2"'             'key batch: expected an integer, got "2"'
st doc_mode_number 's["doc_mode"]=1'            'key doc_mode: expected a boolean'
st metrics_number  's["metrics"]=5'             'key metrics: expected a string'
st opt_step_high   's["opt_step"]=s["step"]+1'  'key opt_step: 3 exceeds step 2'
st global_batch    's["global_batch"]=3'        'key global_batch: 3 is not batch'
st log_every_zero  's["log_every"]=0'           'key log_every: 0 is out of range'
st top_level_array 's=[s]'                      'top level is not a JSON object'
edit_state ST_raw_zero raw 're.sub(rb"\"step\":\s*2", b"\"step\": 02", t, count=1)'
expect_fail state_raw_leading_zero 'ST_raw_zero/trainer_state\.json: key step: 02 is not a JSON number' -- "$M" train --resume ST_raw_zero $RES OUT_rz
edit_state ST_raw_nul raw 't.rstrip() + b"\0\n"'
expect_fail state_raw_nul 'ST_raw_nul/trainer_state\.json: NUL byte' -- "$M" train --resume ST_raw_nul $RES OUT_rn
# controls: re-hashed but unchanged, and clip written 1.0 instead of 1, resume fine
edit_state ST_same json 'pass'
expect_ok control_resume_rehashed -- "$M" train --resume ST_same $RES OUT_same
edit_state ST_float json 's["clip"]=float(s["clip"]); s["step"]=float(s["step"])'
expect_ok control_resume_integral_float -- "$M" train --resume ST_float $RES OUT_float

# ---- checksums.json, safetensors headers, rl_settings.json ------------------------------
rm -rf CS_ZERO; cp -r "$CK" CS_ZERO
"$PY" -c 'import sys; p=sys.argv[1]; t=open(p).read().rstrip(); open(p,"w").write(t[:-1] + ", \"extra\": 01}")' CS_ZERO/checksums.json
expect_fail checksums_leading_zero 'CS_ZERO/checksums\.json: key extra: 01 is not a JSON number' -- "$M" train --resume CS_ZERO $RES OUT_cs
rm -rf ST_HDR; cp -r "$CK" ST_HDR; rm -f ST_HDR/checksums.json
"$PY" - ST_HDR/model.safetensors <<'EOF' || fail st_header_edit "cannot rewrite the header"
import struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack_from("<Q", b)[0]
h = b[8:8 + n].rstrip(b" ")
assert b'"data_offsets":[0,' in h
h = h.replace(b'"data_offsets":[0,', b'"data_offsets":[00,', 1)
h += b" " * (-len(h) % 8)
open(p, "wb").write(struct.pack("<Q", len(h)) + h + b[8 + n:])
EOF
expect_fail safetensors_header_leading_zero 'ST_HDR/model\.safetensors: header: key data_offsets: 00 is not a JSON number' -- "$M" eval --ckpt ST_HDR --data D --problems 0
# rl --resume reads OUT/rl_settings.json first: a fractional group is refused by key
"$PY" - <<'EOF' || fail rl_settings_write "cannot write rl_settings.json"
import json, shutil
s = {"init": "", "prompts": "no_such_prompts.tsv", "task": "math", "agg": "token-mean", "group": 2, "prompts_per_step": 2,
     "micro_batch": 0, "max_new": 8, "top_k": 0, "slots": 4, "temperature": 1.0, "top_p": 1.0, "eps_low": 0.2,
     "eps_high": 0.2, "is_cap": 10.0, "format_penalty": 0.0, "no_scale": 0, "drop_uniform": 0, "eval_every": 0,
     "eval_n": 0, "beta": 0.0, "routing_replay": 0}
for name, patch in (("RL_OK", {}), ("RL_GROUP", {"group": 2.5}), ("RL_TOPP", {"top_p": 0})):
    shutil.rmtree(name, ignore_errors=True); shutil.copytree("RUN/step_00000002", name)
    json.dump(dict(s, **patch), open(name + "/rl_settings.json", "w"), indent=1)
EOF
expect_fail rl_settings_group_fraction 'RL_GROUP/rl_settings\.json: key group: expected an integer, got 2\.5' -- "$M" rl --resume RL_GROUP --out OUT_rlg
expect_fail rl_settings_top_p_zero 'RL_TOPP/rl_settings\.json: key top_p: 0 is out of range' -- "$M" rl --resume RL_TOPP --out OUT_rlt
# control: valid settings get past the reader (then the missing prompts file is the error)
expect_fail control_rl_settings_valid 'no_such_prompts\.tsv' -- "$M" rl --resume RL_OK --out OUT_rlo

# ---- FIFOs named like inputs: refused, never a hang --------------------------------------
mkdir -p FIFOD && mkfifo FIFOD/x_train_000000.bin
expect_fail fifo_train_shard 'FIFOD/x_train_000000\.bin: not a regular file \(a FIFO\)' --timeout 20 -- "$M" train --config c.json --data FIFOD $TR --out R_FIFO
mkfifo fifo.json
expect_fail fifo_config 'fifo\.json: not a regular file \(a FIFO\)' --timeout 20 -- "$M" info --config fifo.json
rm -rf CK_FIFO; cp -r "$CK" CK_FIFO; rm -f CK_FIFO/trainer_state.json; mkfifo CK_FIFO/trainer_state.json
expect_fail fifo_trainer_state 'CK_FIFO/trainer_state\.json: not a regular file' --timeout 20 -- "$M" train --resume CK_FIFO $RES OUT_fifo
mkfifo prompts.fifo
expect_fail fifo_prompts 'prompts\.fifo: not a regular file' --timeout 20 -- "$M" generate --ckpt RUN --prompts prompts.fifo --max-new 2

# ---- item 9: warnings and messages that name the file and the key ------------------------
expect_ok eval_every_without_val 'moetrain: warning: --eval-every 1: TRONLY has no validation shards' -- \
  "$M" train --config c.json --data TRONLY --steps 1 --batch 2 --seq 32 --eval-every 1 --out R_NOVAL --quiet
expect_fail vocab_names_shard_and_key 'D/math_train_000000\.bin: token id [0-9]+ does not fit c200\.json: key vocab_size: 200' -- \
  "$M" train --config c200.json --data D $TR --out R_V200
"$PY" -c 'import json; c=json.load(open("c.json")); c["num_nextn_predict_layers"]=5; json.dump(c, open("mtp.json","w"))'
expect_fail trainer_limit_names_file 'mtp\.json: key num_nextn_predict_layers' -- "$M" train --config mtp.json --data D $TR --out R_MTP

cli_summary
