#!/usr/bin/env python3
"""tests/tokenizer_ref.py — a reference byte-level BPE, independent of moetrain's C code.

  train CORPUS OUT STYLE NMERGES   learn NMERGES merges from CORPUS, write a tokenizer.json
                                   in STYLE (gpt2 | llama3 | deepseek) to OUT
  encode TOKENIZER FILE...         print one JSON list of ids per FILE (the whole file is
                                   one text), as Hugging Face's encode(add_special_tokens=False)

The encoder is written from the Hugging Face tokenizers behaviour, not from moetrain:
added tokens are cut out first (leftmost-longest), the Split / ByteLevel regexes are run
with the `regex` module (it has \\p{L} and lookahead like the library's Oniguruma), and
each pre-token is merged GPT-2 style (every occurrence of the lowest-ranked bigram per pass).
"""
import json
import sys

import regex

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
DS_DIGITS = r"""\p{N}{1,3}"""
DS_CJK = r"""[一-龥぀-ゟ゠-ヿ]+"""
DS_MAIN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {c: b for b, c in B2U.items()}


def split_isolated(pieces, pattern):
    out = []
    rx = regex.compile(pattern)
    for p in pieces:
        at = 0
        for m in rx.finditer(p):
            if m.start() == m.end():
                continue
            if m.start() > at:
                out.append(p[at:m.start()])
            out.append(m.group())
            at = m.end()
        if at < len(p):
            out.append(p[at:])
    return out


def pretokenize(tok, text):
    pre = tok["pre_tokenizer"]
    steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    pieces = [text]
    for s in steps:
        if s["type"] == "Split":
            pat = s["pattern"]["Regex"] if "Regex" in s["pattern"] else regex.escape(s["pattern"]["String"])
            pieces = split_isolated(pieces, pat)
        elif s["type"] == "ByteLevel":
            if s.get("use_regex", True):
                pieces = split_isolated(pieces, GPT2)
        else:
            raise SystemExit("unsupported pre-tokenizer " + s["type"])
    return ["".join(B2U[b] for b in p.encode("utf-8")) for p in pieces]


def merge_word(word, ranks):
    parts = list(word)
    while len(parts) > 1:
        pairs = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                out.append(parts[i] + parts[i + 1])
                i += 2
            else:
                out.append(parts[i])
                i += 1
        parts = out
    return parts


def encode(tok, text):
    vocab = tok["model"]["vocab"]
    ranks = {}
    for i, m in enumerate(tok["model"]["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        ranks[(a, b)] = i
    ignore = tok["model"].get("ignore_merges", False)
    added = tok.get("added_tokens") or []
    ids = []

    def plain(seg):
        for w in pretokenize(tok, seg):
            if ignore and w in vocab:
                ids.append(vocab[w])
            else:
                ids.extend(vocab[p] for p in merge_word(w, ranks))

    def cut(seg, passes):
        if not passes:
            plain(seg)
            return
        toks = sorted(passes[0], key=lambda t: -len(t["content"]))
        at = i = 0
        while i < len(seg):
            hit = next((t for t in toks if seg.startswith(t["content"], i)), None)
            if hit is None:
                i += 1
                continue
            cut(seg[at:i], passes[1:])
            ids.append(hit["id"])
            i += len(hit["content"])
            at = i
        cut(seg[at:], passes[1:])

    cut(text, [[t for t in added if not t["normalized"]], [t for t in added if t["normalized"]]])
    return ids


def train(corpus, out, style, nmerges):
    text = open(corpus, encoding="utf-8").read()
    words = {}
    for w in split_isolated([text], GPT2):
        m = tuple(B2U[b] for b in w.encode("utf-8"))
        words[m] = words.get(m, 0) + 1
    vocab = {B2U[b]: i for i, b in enumerate(sorted(B2U))}
    merges = []
    while len(merges) < nmerges:
        counts = {}
        for w, c in words.items():
            for p in zip(w, w[1:]):
                counts[p] = counts.get(p, 0) + c
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        nw = {}
        for w, c in words.items():
            o, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    o.append(w[i] + w[i + 1])
                    i += 2
                else:
                    o.append(w[i])
                    i += 1
            nw[tuple(o)] = nw.get(tuple(o), 0) + c
        words = nw
    n = len(vocab)
    specials = {"gpt2": ["<|endoftext|>"], "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                "deepseek": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]}[style]
    added = [{"id": n + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(specials)]
    # one non-special added token that normalizes: split off in the second pass
    added.append({"id": n + len(specials), "content": "<tool>", "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": True, "special": False})
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": style == "gpt2"}
    if style == "gpt2":
        pre = bl
        ms = [a + " " + b for a, b in merges]
    else:
        pats = [LLAMA3] if style == "llama3" else [DS_DIGITS, DS_CJK, DS_MAIN]
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in pats] + [bl]}
        ms = [[a, b] for a, b in merges]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None if style != "deepseek" else {"type": "Sequence", "normalizers": []},
           "pre_tokenizer": pre,
           "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": style == "llama3", "vocab": vocab, "merges": ms}}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=style != "llama3", indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif sys.argv[1] == "encode":
        tok = json.load(open(sys.argv[2], encoding="utf-8"))
        for p in sys.argv[3:]:
            print(json.dumps(encode(tok, open(p, encoding="utf-8", newline="").read())))
    else:
        raise SystemExit(__doc__)
