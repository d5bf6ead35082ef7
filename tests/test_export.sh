#!/usr/bin/env bash
# The Hugging Face / DeepSeek-V3 folder layout (docs/FORMATS.md 4.7): `moetrain export` and
# loading such folders.
#   (a) a tiny MLA MoE model with an MTP block trained 3 steps, exported as F32 in several shards: the index
#       (weight_map lists every tensor once, under the shard that holds it; total_size; the
#       files exist; the shards hold the checkpoint's tensors in its order, bytes unchanged),
#       config.json (MLA keys, torch_dtype), checksums.json; eval, dump (logits, losses,
#       gradients), generate and train --init give the original's results bit for bit.
#       As BF16: every value the nearest-even bf16 of the F32 one, val loss within 1e-3
#       relative; a BF16 export exported again as BF16 is the same bytes. A model of a
#       tokenizer.json: the export carries the tokenizer files and evaluates and decodes alike.
#   (b) a folder written here the way DeepSeek-V3 ships one (its config.json spellings, no
#       attention_type, BF16 shards, a sorted index, an MTP block as layer L with its copies of
#       the embedding and head, ignored with a warning each): eval, export and train --init load it,
#       its F32 export holds exactly its values; with "quantization_config" (FP8), "topk_method":
#       "noaux_tc", a YaRN "rope_scaling", "seq_aux": false, attention dropout or F8_E4M3
#       tensors it is one clear error each.
#   (c) bad --shard-size, --dtype and --out: one clear error each.
# Needs python3 (no torch). Usage: bash tests/test_export.sh /path/to/moetrain
set -u
NAME=test_export
source "$(dirname "$0")/lib/cli.sh"
export OMP_NUM_THREADS=2

"$M" data math --out data --train 2000 --val 200 >/dev/null || { echo "FAIL: data math"; exit 1; }
# MLA (query compression) with a DeepSeek-V3 style router: sigmoid, top-2 within the best of 2 groups
"$PY" - "$SRC/configs/demo.json" <<'EOF' || { echo "FAIL: cannot write mla.json"; exit 1; }
import json, sys
c = json.load(open(sys.argv[1]))
for k in ("num_key_value_heads", "head_dim"):
    c.pop(k)
c.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, n_routed_experts=4,
         num_experts_per_tok=2, moe_intermediate_size=32, max_position_embeddings=64, attention_type="mla",
         q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
         scoring_func="sigmoid", n_group=2, topk_group=1, topk_method="group_limited", routed_scaling_factor=2.5,
         num_nextn_predict_layers=1)
json.dump(c, open("mla.json", "w"), indent=1)
EOF
TR=(--data data --batch 4 --seq 32 --lr 1e-3 --warmup 1 --quiet --threads 2)
"$M" train --config mla.json "${TR[@]}" --steps 3 --out run >/dev/null || { echo "FAIL: train"; exit 1; }
CK=run/step_00000003

# ---- (a) export F32 in shards, BF16 --------------------------------------------------------
expect_ok export_f32 -- "$M" export --ckpt run --out e32 --shard-size 20KB
expect_ok export_bf16 -- "$M" export --ckpt run --out e16 --dtype bf16
grep -q 'in [0-9]* shards' export_f32.out || fail export_f32_shards "not several shards: $(cat export_f32.out)"

# check.py: the index and shards of an export against the checkpoint it came from
cat > check.py <<'EOF'
import json, os, re, struct, sys

def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]

def tensors(path):  # name -> (dtype, shape, bytes), in data order, and __metadata__
    h, data = header(path)
    md = h.pop("__metadata__", None)
    items = sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in items], md

def check(ckpt, out, dtype, limit):
    src, _ = tensors(os.path.join(ckpt, "model.safetensors"))
    idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    assert sorted(idx) == ["metadata", "weight_map"], sorted(idx)
    wm = idx["weight_map"]
    files = []  # shard order = first appearance = file name order
    for f in wm.values():
        if f not in files:
            files.append(f)
    n = len(files)
    assert files == ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)], files
    assert sorted(f for f in os.listdir(out) if f.endswith(".safetensors")) == files, "stray or missing shard files"
    got, total = [], 0
    for f in files:
        ts, md = tensors(os.path.join(out, f))
        assert md == {"format": "pt"}, md
        size = sum(len(t[3]) for t in ts)
        assert len(ts) == 1 or size <= limit, (f, size, limit)  # only a lone tensor exceeds the size
        for name, dt, shape, b in ts:
            assert wm.get(name) == f, (name, f, wm.get(name))
            assert dt == dtype, (name, dt)
            got.append((name, shape, b))
            total += len(b)
    assert idx["metadata"] == {"total_size": total}, (idx["metadata"], total)
    assert [g[0] for g in got] == [s[0] for s in src] and len(wm) == len(src), "not the checkpoint's tensors in its order"
    for (name, shape, b), (_, sdt, sshape, sb) in zip(got, src):
        assert shape == sshape, (name, shape, sshape)
        if dtype == "F32":
            assert b == sb, name + ": F32 bytes differ"
        else:  # the nearest-even bf16 of every fp32 (no NaN in a checkpoint)
            u = struct.unpack("<%dI" % (len(sb) // 4), sb)
            want = struct.pack("<%dH" % len(u), *[((x + 0x7fff + ((x >> 16) & 1)) >> 16) & 0xffff for x in u])
            assert b == want, name + ": BF16 is not the nearest-even rounding"
    cfg, scfg = json.load(open(os.path.join(out, "config.json"))), json.load(open(os.path.join(ckpt, "config.json")))
    assert cfg.pop("torch_dtype") == ("float32" if dtype == "F32" else "bfloat16")
    scfg.pop("torch_dtype")
    assert cfg == scfg, "config.json differs from the checkpoint's beyond torch_dtype"
    for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        assert isinstance(cfg[k], int), k
    sums = json.load(open(os.path.join(out, "checksums.json")))["files"]
    assert sorted(sums) == sorted(files + ["config.json", "model.safetensors.index.json"]), sorted(sums)
    print("%d tensors, %d shard(s), %d bytes of %s" % (len(got), n, total, dtype))

check(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
EOF
if "$PY" check.py $CK e32 F32 20000 >check32.out 2>&1; then ok "f32_layout ($(cat check32.out))"
else fail f32_layout "$(tail -3 check32.out)"; fi
if "$PY" check.py $CK e16 BF16 5000000000 >check16.out 2>&1; then ok "bf16_layout ($(cat check16.out))"
else fail bf16_layout "$(tail -3 check16.out)"; fi

# the same numbers from the export: eval (val loss, greedy accuracy), dump, generate, train --init
EV=(--data data --windows 32 --seq 32 --problems 20 --threads 2)
for c in run e32 e16; do "$M" eval --ckpt $c "${EV[@]}" >eval_$c.out 2>eval_$c.err || fail eval_$c "$(cat eval_$c.err)"; done
vl() { sed -n 's/^val_loss=\([0-9.]*\).*/\1/p' "$1"; }
echo "  val loss: original $(vl eval_run.out), F32 export $(vl eval_e32.out), BF16 export $(vl eval_e16.out)"
if [ -n "$(vl eval_run.out)" ] && diff <(sed 's/, [^,]*)$//' eval_run.out) <(sed 's/, [^,]*)$//' eval_e32.out) >/dev/null
then ok eval_f32_same; else fail eval_f32_same "$(cat eval_run.out eval_e32.out)"; fi
"$PY" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-3 * a and a != b else 1)" \
  "$(vl eval_run.out)" "$(vl eval_e16.out)" && ok eval_bf16_close || fail eval_bf16_close "$(vl eval_run.out) vs $(vl eval_e16.out)"
"$M" dump --ckpt run --tokens data/math_val_000000.bin --out dump_run.st >/dev/null &&
  "$M" dump --ckpt e32 --tokens data/math_val_000000.bin --out dump_e32.st >/dev/null &&
  cmp -s dump_run.st dump_e32.st && ok dump_f32_same || fail dump_f32_same "logits, losses or gradients differ"
G=(--prompts prompts.txt --temperature 0 --max-new 8 --threads 2)
printf '12+34=\n7+8=\n' > prompts.txt
"$M" generate --ckpt run "${G[@]}" | grep -av '^decode:' >gen_run.out && "$M" generate --ckpt e32 "${G[@]}" | grep -av '^decode:' >gen_e32.out &&
  cmp -s gen_run.out gen_e32.out && ok generate_f32_same || fail generate_f32_same "completions differ"
"$M" train --init run "${TR[@]}" --steps 1 --out init_run >/dev/null 2>&1 &&
  "$M" train --init e32 "${TR[@]}" --steps 1 --out init_e32 >/dev/null 2>&1 &&
  cmp -s init_run/step_00000001/model.safetensors init_e32/step_00000001/model.safetensors &&
  ok train_init_f32_same || fail train_init_f32_same "a step from the export differs from one from the checkpoint"
expect_ok train_init_bf16 -- "$M" train --init e16 "${TR[@]}" --steps 1 --out init_e16
# BF16 read back and written as BF16 again: lossless
expect_ok export_bf16_again -- "$M" export --ckpt e16 --out e16b --dtype bf16
cmp -s e16/model-00001-of-00001.safetensors e16b/model-00001-of-00001.safetensors && ok bf16_roundtrip ||
  fail bf16_roundtrip "a BF16 export exported again as BF16 differs"

# a model of a tokenizer.json (a byte-level BPE without merges): the export carries it
"$PY" - <<'EOF' || { echo "FAIL: cannot write tokenizer.json"; exit 1; }
import json
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))  # GPT-2's bytes_to_unicode
cs = bs + [256 + i for i in range(256 - len(bs))]
bs += [b for b in range(256) if b not in bs]
vocab = {chr(c): b for b, c in zip(bs, cs)}
level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
           "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}],
           "pre_tokenizer": dict(type="ByteLevel", **level), "decoder": dict(type="ByteLevel", **level),
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": []}}, open("tokenizer.json", "w"))
open("t1.txt", "w").write("hello world, this is a test. " * 200)
open("t2.txt", "w").write("another file of text here. " * 100)
EOF
"$M" data text --out tdata --tokenizer tokenizer.json t1.txt t2.txt >/dev/null &&
  "$M" train --config mla.json --data tdata --batch 2 --seq 32 --steps 1 --quiet --threads 2 --out trun >/dev/null ||
  fail tokenizer_setup "data text or train failed"
expect_ok export_tokenizer -- "$M" export --ckpt trun --out texp
cmp -s texp/tokenizer.json trun/step_00000001/tokenizer.json && cmp -s texp/tokenizer_config.json \
  trun/step_00000001/tokenizer_config.json && grep -q '"tokenizer.json"' texp/checksums.json && ok tokenizer_copied ||
  fail tokenizer_copied "tokenizer files not carried over"
"$M" eval --ckpt trun --data tdata --windows 8 --seq 32 --threads 2 >tev_run.out 2>&1 &&
  "$M" eval --ckpt texp --data tdata --windows 8 --seq 32 --threads 2 >tev_exp.out 2>&1 &&
  [ "$(vl tev_run.out)" = "$(vl tev_exp.out)" ] && [ -n "$(vl tev_run.out)" ] &&
  "$M" generate --ckpt trun --prompt hello --temperature 0 --max-new 6 >tg_run.out &&
  "$M" generate --ckpt texp --prompt hello --temperature 0 --max-new 6 >tg_exp.out && cmp -s tg_run.out tg_exp.out &&
  ok tokenizer_model_same || fail tokenizer_model_same "eval or generate of the export differs: $(cat tev_exp.out)"

# ---- (b) a folder in DeepSeek-V3's own spelling ----------------------------------------------
"$PY" - <<'EOF' || { echo "FAIL: cannot write the DeepSeek-V3 folders"; exit 1; }
import json, os, struct
# DeepSeek-V3's config.json (huggingface.co/deepseek-ai/DeepSeek-V3), sizes shrunk; what moetrain
# cannot run is changed: quantization_config dropped, rope_scaling null, topk_method group_limited,
# no MTP layer (each is tested as an error below)
cfg = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 32.0, "initializer_range": 0.02, "intermediate_size": 64,
    "kv_lora_rank": 16, "max_position_embeddings": 64, "model_type": "deepseek_v3", "moe_intermediate_size": 16,
    "moe_layer_freq": 1, "n_group": 2, "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 2, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 24, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True, "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "group_limited", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": True, "v_head_dim": 16, "vocab_size": 257}
V, d, L, H, F, E, Fm, S = 257, 32, 3, 2, 64, 4, 16, 1
ql, kvl, dn, dr, dv = 24, 16, 8, 8, 16
# DeepSeek-V3's tensor names and shapes
ts = [("model.embed_tokens.weight", [V, d])]
for l in range(L + 1):  # layer L: the MTP block, with DeepSeek-V3's copies of the embedding and head
    p = "model.layers.%d." % l
    if l == L:
        ts += [(p + "enorm.weight", [d]), (p + "hnorm.weight", [d]), (p + "eh_proj.weight", [d, 2 * d]),
               (p + "embed_tokens.weight", [V, d]), (p + "shared_head.head.weight", [V, d]),
               (p + "shared_head.norm.weight", [d])]
    ts += [(p + "input_layernorm.weight", [d]), (p + "self_attn.q_a_proj.weight", [ql, d]),
           (p + "self_attn.q_a_layernorm.weight", [ql]), (p + "self_attn.q_b_proj.weight", [H * (dn + dr), ql]),
           (p + "self_attn.kv_a_proj_with_mqa.weight", [kvl + dr, d]), (p + "self_attn.kv_a_layernorm.weight", [kvl]),
           (p + "self_attn.kv_b_proj.weight", [H * (dn + dv), kvl]), (p + "self_attn.o_proj.weight", [d, H * dv]),
           (p + "post_attention_layernorm.weight", [d])]
    if l < 1:
        ts += [(p + "mlp.%s_proj.weight" % w, [d, F] if w == "down" else [F, d]) for w in ("gate", "up", "down")]
    else:
        ts.append((p + "mlp.gate.weight", [E, d]))
        for e in range(E):
            ts += [(p + "mlp.experts.%d.%s_proj.weight" % (e, w), [d, Fm] if w == "down" else [Fm, d])
                   for w in ("gate", "up", "down")]
        ts += [(p + "mlp.shared_experts.%s_proj.weight" % w, [d, S * Fm] if w == "down" else [S * Fm, d])
               for w in ("gate", "up", "down")]
ts += [("model.norm.weight", [d]), ("lm_head.weight", [V, d])]
state = [12345]
def value():  # a uniform draw in [-0.1, 0.1), as a bf16 bit pattern
    state[0] = (state[0] * 6364136223846793005 + 1442695040888963407) % 2**64
    f = ((state[0] >> 40) / 2**24 - 0.5) * 0.2
    return struct.unpack("<I", struct.pack("<f", f))[0] >> 16
data = {n: struct.pack("<%dH" % (s[0] * (s[1] if len(s) > 1 else 1)),
                       *([0x3f80] * s[0] if len(s) == 1 else [value() for _ in range(s[0] * s[1])]))
        for n, s in ts}
shape = dict(ts)

def shard(path, names, dtypes={}):
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        b = len(data[n]) // 2 if dtypes.get(n) == "F8_E4M3" else len(data[n])
        hdr[n] = {"dtype": dtypes.get(n, "BF16"), "shape": shape[n], "data_offsets": [off, off + b]}
        off += b
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data[n][:len(data[n]) // 2] if dtypes.get(n) == "F8_E4M3"
                                                         else data[n] for n in names))

def folder(name, patch={}, dtypes={}):
    os.makedirs(name)
    c = dict(cfg, **patch)
    json.dump(c, open(name + "/config.json", "w"), indent=2)
    names = [n for n, _ in ts]
    parts = [names[:1], names[1:len(names) // 2], names[len(names) // 2:]]
    wm = {}
    for i, part in enumerate(parts):  # DeepSeek-V3's own names: model-00001-of-000163.safetensors
        f = "model-%05d-of-%06d.safetensors" % (i + 1, len(parts))
        shard(name + "/" + f, part, dtypes)
        wm.update({n: f for n in part})
    total = sum(len(v) for v in data.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": wm}, open(name + "/model.safetensors.index.json", "w"),
              indent=2, sort_keys=True)

folder("ds")
folder("ds_fp8", {"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": [128, 128]}})
folder("ds_noaux", {"topk_method": "noaux_tc"})
folder("ds_yarn", {"rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "original_max_position_embeddings": 4096, "type": "yarn"}})
folder("ds_f8w", dtypes={"model.layers.0.self_attn.q_a_proj.weight": "F8_E4M3"})
folder("ds_seqaux", {"seq_aux": False})
folder("ds_dropout", {"attention_dropout": 0.1})
EOF
expect_ok ds_eval 'no checksums.json' -- "$M" eval --ckpt ds "${EV[@]}"
grep -q 'model.layers.3.embed_tokens.weight is a copy' ds_eval.err && grep -q 'model.layers.3.shared_head.head.weight is a copy' ds_eval.err \
  && ok "ds_mtp_copies_ignored (a warning each)" || fail ds_mtp_copies_ignored "$(grep -i copy ds_eval.err)"
echo "  DeepSeek-V3 folder: $(head -1 ds_eval.out)"
expect_ok ds_export 'no checksums.json' -- "$M" export --ckpt ds --out ds32
"$PY" - <<'EOF' >ds_check.out 2>&1 && ok "ds_f32_exact ($(cat ds_check.out))" || fail ds_f32_exact "$(tail -3 ds_check.out)"
import json, struct
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    h.pop("__metadata__", None)
    return {k: (v["dtype"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}
def folder(d):
    wm = json.load(open(d + "/model.safetensors.index.json"))["weight_map"]
    out = {}
    for f in sorted(set(wm.values())):
        out.update(tensors(d + "/" + f))
    return out
a, b = folder("ds"), folder("ds32")
copies = {"model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight"}
assert sorted(set(a) - copies) == sorted(b), "other tensors (the MTP block's copies are not written)"
for k in copies:
    a.pop(k)
for k, (dt, raw) in a.items():
    assert dt == "BF16" and b[k][0] == "F32", k
    widened = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
    assert b[k][1] == widened, k + ": F32 export is not the BF16 value"
c = json.load(open("ds32/config.json"))
assert c["attention_type"] == "mla" and c["model_type"] == "deepseek_v3" and c["hidden_size"] == 32, c
print("%d tensors, every F32 value the BF16 one" % len(a))
EOF
"$M" eval --ckpt ds32 "${EV[@]}" >eval_ds32.out 2>&1
[ "$(vl ds_eval.out)" = "$(vl eval_ds32.out)" ] && [ -n "$(vl ds_eval.out)" ] && ok ds_eval_same_as_export ||
  fail ds_eval_same_as_export "$(vl ds_eval.out) vs $(vl eval_ds32.out)"
expect_ok ds_train_init -- "$M" train --init ds "${TR[@]}" --steps 1 --out init_ds
expect_fail ds_fp8_config 'ds_fp8/config.json: key quantization_config: .*"fp8".*not supported.*F32 and BF16' -- \
  "$M" eval --ckpt ds_fp8 "${EV[@]}"
expect_fail ds_noaux_tc 'ds_noaux/config.json: key topk_method: "noaux_tc".*e_score_correction_bias.*not supported' -- \
  "$M" train --init ds_noaux "${TR[@]}" --steps 1 --out init_noaux
expect_fail ds_yarn 'ds_yarn/config.json: key rope_scaling: RoPE scaling is not supported' -- \
  "$M" eval --ckpt ds_yarn "${EV[@]}"
expect_fail ds_seq_aux_false 'ds_seqaux/config.json: key seq_aux: only the sequence-wise balance loss' -- \
  "$M" eval --ckpt ds_seqaux "${EV[@]}"
expect_fail ds_dropout 'ds_dropout/config.json: key attention_dropout: dropout is not supported' -- \
  "$M" eval --ckpt ds_dropout "${EV[@]}"
expect_fail ds_fp8_weights 'tensor model.layers.0.self_attn.q_a_proj.weight has unsupported dtype F8_E4M3' -- \
  "$M" export --ckpt ds_f8w --out f8out
[ -e f8out ] || [ -e f8out.tmp ] && fail ds_fp8_weights_left "a failed export left a folder" || ok ds_fp8_weights_nothing_left

# ---- (c) bad flags and output folders ---------------------------------------------------------
i=0
for s in 5XB 0 -1 GB 1.5.GB 0.5B ''; do
  i=$((i + 1))
  expect_fail "shard_size_bad$i" "--shard-size expects a positive size such as 5GB.*got '$s'" -- \
    "$M" export --ckpt run --out bad --shard-size "$s"
done
expect_ok shard_size_units -- "$M" export --ckpt run --out e_units --shard-size 0.04MiB
expect_fail dtype_fp8 "--dtype must be f32 or bf16, got 'fp8'" -- "$M" export --ckpt run --out bad --dtype fp8
expect_fail out_not_empty 'e32: exists and is not empty' -- "$M" export --ckpt run --out e32
touch afile
expect_fail out_is_file 'afile: exists and is not a folder' -- "$M" export --ckpt run --out afile
expect_fail out_unwritable 'afile/sub: cannot use as the output folder: Not a directory' -- \
  "$M" export --ckpt run --out afile/sub
if [ "$(id -u)" != 0 ]; then # root writes anywhere
  mkdir ro && chmod 555 ro
  expect_fail out_no_permission 'ro/x: export not written: ro/x.tmp: cannot create directory: Permission denied' -- \
    "$M" export --ckpt run --out ro/x
  chmod 755 ro
fi
expect_fail no_ckpt 'nothere: no such checkpoint' -- "$M" export --ckpt nothere --out bad
mkdir empty
expect_ok out_empty_folder -- "$M" export --ckpt run --out empty/
[ -f empty/model.safetensors.index.json ] && [ ! -e empty.tmp ] && ok out_empty_filled || fail out_empty_filled "empty/ not filled"
[ -e bad ] && fail nothing_written "a failed export left bad/" || ok nothing_written
cli_summary
