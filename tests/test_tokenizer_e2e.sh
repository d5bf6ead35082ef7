#!/usr/bin/env bash
# tests/test_tokenizer_e2e.sh — Hugging Face tokenizer.json (byte-level BPE) from data text to
# generate and rl. tests/tokenizer_ref.py learns three small tokenizer files (GPT-2 style:
# ByteLevel with its regex and "a b" merges; Llama-3 style: a Split regex with (?i:) and
# \p{N}{1,3}, pair merges, ignore_merges; DeepSeek style: three Splits) and encodes varied
# text with its own BPE; `data text --tokenizer` must write exactly those ids. Then the
# refusals on the command line, and end to end: data text -> train -> the checkpoint
# carries tokenizer.json -> generate decodes a learned continuation -> rl feeds the
# prompts as the tokenizer encodes them.
# Usage: bash tests/test_tokenizer_e2e.sh path/to/moetrain.  Exit 77: no python3 with `regex`.
set -u
NAME=test_tokenizer_e2e
source "$(dirname "$0")/lib/cli.sh"
if ! "$PY" -c 'import regex' 2>/dev/null && /usr/bin/python3 -c 'import regex' 2>/dev/null; then PY=/usr/bin/python3; fi
"$PY" -c 'import regex' 2>/dev/null || { echo "SKIPPED: python3 module regex missing (apt-get install python3-regex)"; exit 77; }
REF="$SRC/tests/tokenizer_ref.py"

# ---- inputs: a corpus to learn merges from, and documents of every kind of text --------
"$PY" - <<'EOF' || { echo "FAIL: cannot write the inputs"; exit 1; }
import random
random.seed(3)
words = ("the quick brown fox jumps over lazy dog it's we'll they've I'M DON'T numbers 12345 3.14159 "
         "2024-06-01 hello, world! naïve café über straße Ελληνικά русский язык 中文字符 日本語のテキスト "
         "カタカナ emoji 😀🎉👍🏽 tab\tsep  double  spaces\nnew line\r\nwindows line x=y+z; (a[b]{c}) @user "
         "#tag $100 50% a&b ~~~ ... —— “quotes” «guillemets» e\u0301 combining ٣٤٥ ½ Ⅻ").split(" ")
def doc(n):
    return " ".join(random.choice(words) for _ in range(n))
open("corpus.txt", "w", encoding="utf-8").write("\n".join(doc(40) for _ in range(300)))
docs = [doc(200), "   leading spaces and trailing   \n\n\n  ", "1234567890 000 12 1 99999999 ٣٤٥ ½ Ⅻ",
        "<|endoftext|><|endoftext|>x<|endoftext|> <tool><tool>a<tool", "\t\t \n \r\n\r\n   x  \u3000 full\u00a0nbsp",
        "I'M HERE, THEY'LL SEE'S 'S 's", "🏳️‍🌈 👨‍👩‍👧 \U0001F600\U0001F600!!", doc(30) + "\n"]
# the regex classes (\s, \p{L}, \p{N}, \p{P}, \p{S}, \p{M}) over every third code point
docs.append("".join(chr(c) + " x" + chr(c) * 2 + "1 " for c in list(range(1, 0xD800, 3)) + list(range(0xE000, 0x30000, 97))))
for i, t in enumerate(docs):
    open("doc%d.txt" % i, "w", encoding="utf-8", newline="").write(t)
# the shard reader for the comparisons
open("shard.py", "w").write('''import json, struct, sys
def shard(p):
    b = open(p, "rb").read()
    magic, ver, n = struct.unpack("<3i", b[:12])
    return list(struct.unpack("<%d%s" % (n, "H" if magic == 20240520 else "I"), b[1024:1024 + 2 * n * (1 if magic == 20240520 else 2)]))
got, eot, want = shard(sys.argv[1]), int(sys.argv[2]), []
for line in open(sys.argv[3]):
    want += [eot] + json.loads(line)
if got != want:
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    print("first difference at token %d of %d/%d: got %s, want %s" % (i, len(got), len(want), got[i:i + 6], want[i:i + 6]))
    sys.exit(1)
print(len(got))
''')
EOF
DOCS=$(ls doc*.txt | sort)

# ---- ids against the reference BPE -----------------------------------------------------
for st in gpt2 llama3 deepseek; do
  "$PY" "$REF" train corpus.txt tok_$st.json $st 300 || { fail "learn_$st" "tokenizer_ref.py train failed"; continue; }
  eot=$("$PY" -c "import json,sys;t=json.load(open(sys.argv[1]));print([a['id'] for a in t['added_tokens'] if a['special'] and a['content'] in ('<|endoftext|>','<|end_of_text|>','<｜end▁of▁sentence｜>')][0])" tok_$st.json)
  run_cmd 120 dt_$st.out dt_$st.err "$M" data text --tokenizer tok_$st.json --out D_$st --val-fraction 0 $DOCS corpus.txt
  if [ $RC != 0 ]; then fail "ids_$st" "data text failed: $(head -c 300 dt_$st.err)"; continue; fi
  "$PY" "$REF" encode tok_$st.json $DOCS corpus.txt > ref_$st.txt || { fail "ids_$st" "reference encode failed"; continue; }
  if n=$("$PY" shard.py D_$st/text_train_000000.bin "$eot" ref_$st.txt); then
    ok "ids_$st ($n tokens equal the reference's)"
  else
    fail "ids_$st" "$n"
  fi
  cmp -s tok_$st.json D_$st/tokenizer.json && grep -q '"eos_token"' D_$st/tokenizer_config.json \
    && ok "data_folder_records_$st" || fail "data_folder_records_$st" "no copy of tokenizer.json / tokenizer_config.json"
done
# the byte tokenizer stays the default, byte for byte, and a byte run drops an old tokenizer.json
"$M" data text --out D_gpt2 --val-fraction 0 doc0.txt >/dev/null 2>&1
if [ ! -e D_gpt2/tokenizer.json ] && "$PY" -c '
import struct, sys
b = open("D_gpt2/text_train_000000.bin", "rb").read(); n = struct.unpack("<3i", b[:12])[2]
want = [256] + list(open("doc0.txt", "rb").read())
sys.exit(list(struct.unpack("<%dH" % n, b[1024:])) != want)'; then ok "byte_default_unchanged"; else fail "byte_default_unchanged" "shard or folder differs"; fi

# ---- refusals --------------------------------------------------------------------------
edit_tok() {  # edit_tok OUT 'python statement on t'
  "$PY" -c 'import json,sys
t=json.load(open("tok_gpt2.json"))
exec(sys.argv[2])
json.dump(t, open(sys.argv[1], "w"))' "$1" "$2"
}
edit_tok nfc.json 't["normalizer"]={"type":"NFC"}'
edit_tok wp.json 't["model"]["type"]="WordPiece"'
edit_tok noeot.json 't["added_tokens"]=[]'
printf 'ab\xffcd' > bad_utf8.txt
expect_fail tok_normalizer 'nfc\.json: key normalizer: type NFC' -- "$M" data text --tokenizer nfc.json --out X doc0.txt
expect_fail tok_model_type 'wp\.json: key model\.type: WordPiece' -- "$M" data text --tokenizer wp.json --out X doc0.txt
expect_fail tok_no_eot 'noeot\.json: key added_tokens: no special end-of-text token' -- "$M" data text --tokenizer noeot.json --out X doc0.txt
expect_ok tok_eot_named -- "$M" data text --tokenizer noeot.json --eot-token the --out X doc0.txt
expect_fail tok_eot_unknown '"<nope>" is neither in added_tokens nor in model\.vocab' -- "$M" data text --tokenizer tok_gpt2.json --eot-token '<nope>' --out X doc0.txt
expect_fail tok_eot_without_tokenizer '--eot-token needs --tokenizer' -- "$M" data text --eot-token x --out X doc0.txt
expect_fail tok_not_utf8 'bad_utf8\.txt: not UTF-8 at byte 2' -- "$M" data text --tokenizer tok_gpt2.json --out X bad_utf8.txt
expect_fail tok_missing_file 'nothere\.json' -- "$M" data text --tokenizer nothere.json --out X doc0.txt
cli_tiny_config
"$PY" -c 'import json; c=json.load(open("c.json")); c["vocab_size"]=300; json.dump(c, open("c300.json","w"))'
"$PY" -c 'import json; c=json.load(open("c.json")); c["vocab_size"]=640; c["max_position_embeddings"]=128; json.dump(c, open("c640.json","w"))'
expect_fail tok_vocab_too_big 'tokenizer\.json \([0-9]+ ids.*does not fit c300\.json: key vocab_size: 300' -- \
  "$M" train --config c300.json --data D_llama3 --steps 1 --batch 2 --seq 16 --out RX --quiet

# ---- end to end: data text -> train -> generate, rl -----------------------------------
# one sentence learned by heart, so that a greedy continuation is known text
"$PY" -c '
s = "the quick brown fox jumps over the lazy dog, naïve café 😀 12345.\n"
open("learn.txt", "w", encoding="utf-8").write(s * 400)'
"$PY" "$REF" train learn.txt tok_e2e.json gpt2 200
"$M" data text --tokenizer tok_e2e.json --out DE --val-fraction 0.1 learn.txt >/dev/null 2>&1 || fail e2e_data "data text"
run_cmd 300 tr.out tr.err "$M" train --config c640.json --data DE --steps 150 --batch 8 --seq 64 --lr 3e-3 --warmup 10 \
  --eval-every 150 --save-every 150 --out RE --quiet
if [ $RC = 0 ] && cmp -s tok_e2e.json RE/step_00000150/tokenizer.json && grep -q '"tokenizer.json"' RE/step_00000150/checksums.json; then
  ok "e2e_train (checkpoint carries tokenizer.json, in checksums.json)"
else
  fail e2e_train "rc $RC: $(head -c 300 tr.err)"
fi
run_cmd 60 gen.out gen.err "$M" generate --ckpt RE --prompt "the quick brown" --max-new 12 --temperature 0
if [ $RC = 0 ] && grep -q "^the quick brown fox jumps over the lazy dog" gen.out; then
  ok "e2e_generate: $(head -1 gen.out)"
else
  fail e2e_generate "rc $RC: $(head -c 300 gen.out) $(head -c 300 gen.err)"
fi
# a data folder made with another tokenizer than the checkpoint's is refused
expect_fail e2e_init_other_tokenizer 'differs|must be the same' -- \
  "$M" train --init RE --data D_gpt2 --steps 160 --batch 2 --seq 16 --out RX2 --quiet
expect_fail e2e_eval_other_tokenizer 'must be the same' -- "$M" eval --ckpt RE --data D_gpt2 --problems 0
run_cmd 60 ev.out ev.err "$M" eval --ckpt RE --data DE --doc-mode
if [ $RC = 0 ] && grep -q "^val_loss=" ev.out && grep -q "accuracy: skipped" ev.out; then ok "e2e_eval ($(head -1 ev.out | cut -d' ' -f1))"
else fail e2e_eval "rc $RC: $(head -c 300 ev.out) $(head -c 300 ev.err)"; fi
# rl: prompts encoded by the checkpoint's tokenizer (end-of-text first), as the reference encodes them
printf '12+34=\t46\n1+2=\t3\n7*8=\t56\n5-9=\t-4\n' > p.tsv
run_cmd 300 rl.out rl.err "$M" rl --init RE --prompts p.tsv --steps 1 --group 2 --prompts-per-step 4 --max-new 4 \
  --out RLE --dump-rollouts RLD --quiet
if [ $RC != 0 ]; then
  fail e2e_rl "rc $RC: $(head -c 300 rl.err)"
else
  printf '%s' '12+34=' > p0.txt; printf '%s' '1+2=' > p1.txt; printf '%s' '7*8=' > p2.txt; printf '%s' '5-9=' > p3.txt
  "$PY" "$REF" encode tok_e2e.json p0.txt p1.txt p2.txt p3.txt > p_ref.txt
  if "$PY" - <<'EOF'; then ok "e2e_rl (prompt tokens as the reference encodes them, completions ended by its end of text)"; else fail e2e_rl "dump disagrees"; fi
import glob, json, sys
t = json.load(open("tok_e2e.json"))
eot = [a["id"] for a in t["added_tokens"] if a["content"] == "<|endoftext|>"][0]
ref = [[eot] + json.loads(l) for l in open("p_ref.txt")]
d = json.load(open(sorted(glob.glob("RLD/step_*.json"))[0]))
if d["sampling"]["eot"] != eot:
    print("dump: sampling.eot", d["sampling"]["eot"], "is not the tokenizer's", eot); sys.exit(1)
bad = [c for c in d["completions"] if c["prompt_tokens"] != ref[c["prompt_index"]]]
if bad or not d["completions"]:
    print("prompt tokens differ:", bad[:1]); sys.exit(1)
if any(c["stopped_eot"] and c["completion_tokens"][-1] != eot for c in d["completions"]):
    print("a completion stopped at another end of text"); sys.exit(1)
EOF
  cmp -s tok_e2e.json RLE/step_00000001/tokenizer.json && ok "e2e_rl_checkpoint_tokenizer" || fail e2e_rl_checkpoint_tokenizer "rl checkpoint lacks tokenizer.json"
fi
cli_summary
