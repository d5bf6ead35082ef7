#!/usr/bin/python3
"""moe_ref.py - independent PyTorch implementation of moetrain's model contract
(docs: docs/FORMATS.md).  Test oracle and benchmark peer.

Run with Debian's PyTorch:  /usr/bin/python3 tests/oracle/moe_ref.py <command> ...

Commands
  make-case --config CFG.json --out DIR [--seed S --std 0.3 --batch B --seq T --mtp-copies]
  compare   --case DIR --dump FILE.safetensors
  train     --config CFG.json --data DIR --steps N --batch B --seq T [--threads 2
            --lr 3e-4 --warmup 10 --init DIR --out DIR --seed S --autocast none|bf16
            --no-blas-timing]
  eval      --ckpt DIR --data DIR --seq T --windows N [--threads 2]
  gradcheck [--config CFG.json]   (float64 autograd vs finite differences, self test; with
            MTP also which tokens each block sees and a literal sum of its ce)
  batch     --jobs FILE [--threads N]   (many of the commands above in one process: each
            line of FILE is PREFIX COMMAND ARGS..., shell-quoted; the job's stdout, stderr
            and exit status go to PREFIX.out, PREFIX.err and PREFIX.rc)

Everything is plain torch code in fp32 (or fp64 for gradcheck; `train --autocast bf16`
runs the forward under torch.autocast, PyTorch's mixed precision); nothing is shared with
the C implementation.
"""
import os
import sys

# --- threading / BLAS / malloc environment: must be fixed before torch is imported ----
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# the same wait as moetrain's: a short spin (5000 rounds, ~250 us here) before sleeping
# saves a futex wake-up at each end of each parallel region (PyTorch runs many)
os.environ.setdefault("GOMP_SPINCOUNT", "5000")

# For `train` (the benchmark peer) re-exec once with glibc malloc tunables: PyTorch on CPU
# has no caching allocator, and glibc hands every tensor > 32 MiB (and, with the default
# dynamic threshold, many smaller ones) back to the kernel on free, so each training step
# page-faults gigabytes of fresh memory (measured: ~1M minor faults and ~8 s system time
# per step of the "small" config).  A fixed mmap threshold, no trimming and transparent
# huge pages for the remaining mmapped blocks remove most of it (the usual advice is
# jemalloc/tcmalloc, which Debian's python3-torch does not pull in).  MOE_REF_MALLOC=0
# disables this.
_MALLOC_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                    "glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=268435456")
#
# BLAS: Debian's torch calls the libblas.so.3 of the alternatives system, which is the
# pthread build of OpenBLAS by default.  Its worker threads spin (sched_yield) after each
# GEMM while torch's own OpenMP threads run the elementwise ops, so on few cores the two
# pools fight.  For `train` we load the OpenMP build of the same OpenBLAS (one shared
# libgomp pool with a passive wait policy; moetrain links this build too) when it is
# installed.  MOE_REF_BLAS=system keeps the alternatives' choice.
_OPENMP_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
if (len(sys.argv) > 1 and sys.argv[1] == "train" and "MOE_REF_MALLOC" not in os.environ):
    _env = dict(os.environ)
    _env["MOE_REF_MALLOC"] = "1"
    _env["GLIBC_TUNABLES"] = (_env["GLIBC_TUNABLES"] + ":" if _env.get("GLIBC_TUNABLES") else "") + _MALLOC_TUNABLES
    if (_env.get("MOE_REF_BLAS", "openmp") == "openmp" and os.path.exists(_OPENMP_BLAS + "/libblas.so.3")
            and "blas" not in _env.get("LD_LIBRARY_PATH", "")):
        _env["LD_LIBRARY_PATH"] = _OPENMP_BLAS + (":" + _env["LD_LIBRARY_PATH"] if _env.get("LD_LIBRARY_PATH") else "")
    try:
        os.execve(sys.executable, [sys.executable] + sys.argv, _env)
    except OSError:
        pass


def _cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " avx512f " in (line.rstrip("\n") + " ")
    except OSError:
        pass
    return False


# MT_CPU_TIER (moetrain's kernels forced to a lower tier) limits PyTorch to the same instruction
# set, as on a CPU of that tier: its ATen kernels, oneDNN, and for avx2 the OpenBLAS kernel
# moetrain picks there (else SkylakeX below would run AVX-512 products). Explicit settings win.
_TIER_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"},
             "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
for _k, _v in _TIER_ENV.get(os.environ.get("MT_CPU_TIER", ""), {}).items():
    os.environ.setdefault(_k, _v)

if "OPENBLAS_CORETYPE" not in os.environ and _cpu_has_avx512():
    # Debian's OpenBLAS may mis-detect AMD EPYC (Zen4) cores and fall back to a
    # generic/Haswell kernel; SkylakeX is the AVX-512 sgemm kernel.
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


def _threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return None


_t = _threads_from_argv()
if _t is not None:
    # OpenBLAS (pthread build) keeps its own pool; size it like torch's.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", _t)
    os.environ.setdefault("OMP_NUM_THREADS", _t)

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ======================================================================================
# safetensors (json + struct + numpy)
# ======================================================================================

_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "BF16": None, "F16": np.float16,
              "I32": np.int32, "I64": np.int64}


def st_read(path):
    """Returns an ordered dict name -> float32 torch tensor (BF16/F16 widened)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError(f"{path}: header length {hlen} exceeds file size")
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    for name, info in items:
        dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        buf = raw[base + b: base + e]
        if dt == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif dt in _ST_DTYPES:
            arr = np.frombuffer(buf, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
            arr = arr.astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        n = int(np.prod(shape)) if shape else 1
        if arr.size != n:
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements, shape {shape}")
        out[name] = torch.from_numpy(arr.reshape(shape).copy())
    return out


def st_write(path, tensors):
    """tensors: dict name -> tensor/ndarray, written as F32 in insertion order."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            a = t.detach().to(torch.float32).contiguous().cpu().numpy()
        else:
            a = np.ascontiguousarray(np.asarray(t, dtype=np.float32))
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ======================================================================================
# token shards (llm.c format)
# ======================================================================================

def shard_read(path):
    hdr = np.fromfile(path, dtype="<i4", count=256)
    if hdr.size < 256:
        raise ValueError(f"{path}: shorter than the 1024-byte header")
    magic, version, n = int(hdr[0]), int(hdr[1]), int(hdr[2])
    if (magic, version) == (20240520, 1):
        dt, w = "<u2", 2
    elif (magic, version) == (20240801, 7):
        dt, w = "<u4", 4
    else:
        raise ValueError(f"{path}: unknown shard magic/version {magic}/{version}")
    size = os.path.getsize(path)
    if size != 1024 + n * w:
        raise ValueError(f"{path}: size {size} disagrees with header ({n} tokens)")
    return np.memmap(path, dtype=dt, mode="r", offset=1024, shape=(n,))


def shard_write(path, tokens):
    tokens = np.asarray(tokens, dtype=np.int64)
    hdr = np.zeros(256, dtype="<i4")
    if tokens.max(initial=0) < 65536:
        hdr[0], hdr[1], data = 20240520, 1, tokens.astype("<u2")
    else:
        hdr[0], hdr[1], data = 20240801, 7, tokens.astype("<u4")
    hdr[2] = tokens.size
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(data.tobytes())


# ======================================================================================
# config
# ======================================================================================

REQUIRED = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"]
INT_KEYS = REQUIRED + ["first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
                       "n_shared_experts", "moe_intermediate_size", "n_group", "topk_group",
                       "num_nextn_predict_layers"]


class Config:
    pass


def load_config(path_or_dict):
    if isinstance(path_or_dict, dict):
        raw = dict(path_or_dict)
    else:
        with open(path_or_dict) as f:
            raw = json.load(f)
    mla = raw.get("attention_type", "gqa") == "mla"
    for k in REQUIRED:
        # MLA: head_dim and num_key_value_heads are not used (its own keys instead)
        if k not in raw and not (mla and k in ("head_dim", "num_key_value_heads")):
            raise ValueError(f"config: missing required key '{k}'")
    c = Config()
    c.raw = raw

    def geti(k, default):
        v = raw.get(k, default)
        if v is None:
            return default
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise ValueError(f"config: '{k}' must be an integer, got {v!r}")
        return int(v)

    c.V = geti("vocab_size", None)
    c.d = geti("hidden_size", None)
    c.L = geti("num_hidden_layers", None)
    c.H = geti("num_attention_heads", None)
    c.Hkv = geti("num_key_value_heads", None)
    c.hd = geti("head_dim", None)
    if mla:  # q_lora_rank null / absent / 0: no query compression
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if k not in raw:
                raise ValueError(f"config: missing required key '{k}' (attention_type mla)")
        c.q_lora = geti("q_lora_rank", 0)
        c.kv_lora = geti("kv_lora_rank", None)
        c.dn = geti("qk_nope_head_dim", None)
        c.dr = geti("qk_rope_head_dim", None)
        c.dv = geti("v_head_dim", None)
        c.Hkv = c.H
        c.hd = c.dr
    c.ffn = geti("intermediate_size", None)
    c.max_pos = geti("max_position_embeddings", None)
    c.first_dense = geti("first_k_dense_replace", c.L)
    c.E = geti("n_routed_experts", 0)
    c.k = geti("num_experts_per_tok", 0)
    c.n_shared = geti("n_shared_experts", 0)
    c.moe_ffn = geti("moe_intermediate_size", 0)
    c.scoring = raw.get("scoring_func", "softmax")
    c.norm_topk = raw.get("norm_topk_prob", True)
    c.rsf = float(raw.get("routed_scaling_factor", 1.0))
    c.n_group = geti("n_group", 1)
    c.topk_group = geti("topk_group", 1)
    c.topk_method = raw.get("topk_method", "greedy")
    c.alpha = float(raw.get("aux_loss_alpha", 0.0))
    c.rope_theta = float(raw.get("rope_theta", 10000.0))
    c.eps = float(raw.get("rms_norm_eps", 1e-6))
    c.attn_type = raw.get("attention_type", "gqa")
    # RoPE on neighbouring pairs (2i, 2i+1) instead of rotate-half; MLA's default is true
    c.rope_interleave = bool(raw.get("rope_interleave", c.attn_type == "mla"))
    c.tied = raw.get("tie_word_embeddings", False)
    # sandwich norm: every sublayer's output is normed before the residual add
    c.sandwich = raw.get("sandwich_norm", False)
    if not isinstance(c.sandwich, bool):
        raise ValueError(f"config: 'sandwich_norm' must be a boolean, got {c.sandwich!r}")
    # multi-token prediction (DeepSeek-V3): D extra blocks, stored as layers L .. L+D-1
    c.D = geti("num_nextn_predict_layers", 0)
    if c.D < 0:
        raise ValueError(f"config: 'num_nextn_predict_layers' must be >= 0, got {c.D}")
    w = raw.get("mtp_loss_weight", 0.3)
    if w is None:
        w = 0.3
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
        raise ValueError(f"config: 'mtp_loss_weight' must be a non-negative number, got {w!r}")
    c.mtp_w = float(w)
    for k, bad in (("rope_scaling", lambda v: v is not None), ("moe_layer_freq", lambda v: v != 1),
                   ("attention_bias", lambda v: v is True)):
        if k in raw and bad(raw[k]):
            raise ValueError(f"config: '{k}'={raw[k]!r} is unsupported")
    if c.attn_type not in ("gqa", "mla"):
        raise ValueError(f"config: attention_type '{c.attn_type}' unsupported by the oracle")
    if c.scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"config: scoring_func '{c.scoring}' unknown")
    if c.topk_method not in ("greedy", "group_limited", "moge"):
        raise ValueError(f"config: topk_method '{c.topk_method}' unknown")
    if c.H % c.Hkv != 0:
        raise ValueError("config: num_attention_heads % num_key_value_heads != 0")
    if c.hd % 2:
        raise ValueError("config: head_dim is odd")
    c.n_moe = max(0, c.L - c.first_dense)
    if c.n_moe:
        if c.E <= 0 or c.moe_ffn <= 0:
            raise ValueError("config: MoE layers present but n_routed_experts/moe_intermediate_size missing")
        if c.k < 1 or c.k > c.E:
            raise ValueError("config: num_experts_per_tok out of range (k > n_routed_experts)")
        if c.E % c.n_group:
            raise ValueError("config: n_routed_experts % n_group != 0")
        if c.topk_group > c.n_group:
            raise ValueError("config: topk_group > n_group")
        if c.topk_method == "group_limited" and c.k > c.topk_group * c.E // c.n_group:
            raise ValueError("config: num_experts_per_tok > topk_group * E / n_group")
        if c.topk_method == "moge" and c.k % c.n_group:
            raise ValueError("config: num_experts_per_tok % n_group != 0 with moge")
    return c


def is_moe(c, l):
    """Layer l (0 .. L+D-1) has an MoE FFN.  The MTP blocks (l >= L) are MoE iff the main
    stack has MoE layers (then first_dense < L <= l)."""
    return l >= c.first_dense and c.n_moe > 0


def layer_shapes(c, l):
    """(name, shape) of decoder layer l's tensors (a main layer or an MTP block's layer)."""
    s = []
    p = f"model.layers.{l}."
    s += [(p + "input_layernorm.weight", (c.d,))]
    if c.attn_type == "mla":
        a = p + "self_attn."
        dq = c.dn + c.dr
        if c.q_lora:
            s += [(a + "q_a_proj.weight", (c.q_lora, c.d)), (a + "q_a_layernorm.weight", (c.q_lora,)),
                  (a + "q_b_proj.weight", (c.H * dq, c.q_lora))]
        else:
            s += [(a + "q_proj.weight", (c.H * dq, c.d))]
        s += [(a + "kv_a_proj_with_mqa.weight", (c.kv_lora + c.dr, c.d)),
              (a + "kv_a_layernorm.weight", (c.kv_lora,)),
              (a + "kv_b_proj.weight", (c.H * (c.dn + c.dv), c.kv_lora)),
              (a + "o_proj.weight", (c.d, c.H * c.dv))]
    else:
        s += [(p + "self_attn.q_proj.weight", (c.H * c.hd, c.d)),
              (p + "self_attn.k_proj.weight", (c.Hkv * c.hd, c.d)),
              (p + "self_attn.v_proj.weight", (c.Hkv * c.hd, c.d)),
              (p + "self_attn.o_proj.weight", (c.d, c.H * c.hd))]
    s += [(p + "post_attention_layernorm.weight", (c.d,))]
    if not is_moe(c, l):
        s += [(p + "mlp.gate_proj.weight", (c.ffn, c.d)), (p + "mlp.up_proj.weight", (c.ffn, c.d)),
              (p + "mlp.down_proj.weight", (c.d, c.ffn))]
    else:
        s += [(p + "mlp.gate.weight", (c.E, c.d))]
        for e in range(c.E):
            q = p + f"mlp.experts.{e}."
            s += [(q + "gate_proj.weight", (c.moe_ffn, c.d)), (q + "up_proj.weight", (c.moe_ffn, c.d)),
                  (q + "down_proj.weight", (c.d, c.moe_ffn))]
        if c.n_shared:
            q = p + "mlp.shared_experts."
            S = c.n_shared * c.moe_ffn
            s += [(q + "gate_proj.weight", (S, c.d)), (q + "up_proj.weight", (S, c.d)),
                  (q + "down_proj.weight", (c.d, S))]
    if c.sandwich:
        s += [(p + "pre_mlp_layernorm.weight", (c.d,)), (p + "post_mlp_layernorm.weight", (c.d,))]
    return s


def mtp_prefix(c, k):
    """Tensor name prefix of MTP block k = 1..D (layer index L + k - 1)."""
    return f"model.layers.{c.L + k - 1}."


def param_shapes(c):
    """Ordered list of (name, shape) exactly as docs/FORMATS.md names them.  The MTP
    blocks come last, so a model with D > 0 draws (draw_params, init_params) the same
    main-model tensors as the same config with D = 0."""
    s = [("model.embed_tokens.weight", (c.V, c.d))]
    for l in range(c.L):
        s += layer_shapes(c, l)
    s += [("model.norm.weight", (c.d,))]
    if not c.tied:
        s += [("lm_head.weight", (c.V, c.d))]
    for k in range(1, c.D + 1):
        p = mtp_prefix(c, k)
        s += [(p + "enorm.weight", (c.d,)), (p + "hnorm.weight", (c.d,)),
              (p + "eh_proj.weight", (c.d, 2 * c.d))]
        s += layer_shapes(c, c.L + k - 1)
        s += [(p + "shared_head.norm.weight", (c.d,))]
    return s


def load_checkpoint(ckdir):
    c = load_config(os.path.join(ckdir, "config.json"))
    idx = os.path.join(ckdir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        t = {}
        for fn in sorted(set(wm.values())):
            t.update(st_read(os.path.join(ckdir, fn)))
    else:
        t = st_read(os.path.join(ckdir, "model.safetensors"))
    params = {}
    for name, shape in param_shapes(c):
        if name not in t:
            raise ValueError(f"{ckdir}: missing tensor {name}")
        if tuple(t[name].shape) != tuple(shape):
            raise ValueError(f"{ckdir}: tensor {name} has shape {tuple(t[name].shape)}, expected {shape}")
        params[name] = t.pop(name)
    if c.tied and "lm_head.weight" in t:
        print("warning: tied embeddings: ignoring lm_head.weight", file=sys.stderr)
        t.pop("lm_head.weight")
    for k in range(1, c.D + 1):
        # DeepSeek-V3's MTP layers carry copies of the embedding and the head: ignored
        for n in ("embed_tokens.weight", "shared_head.head.weight"):
            name = mtp_prefix(c, k) + n
            if name in t:
                print(f"warning: MTP block {k}: ignoring {name} (the shared "
                      f"{'embedding' if n.startswith('embed') else 'lm_head'} is used)", file=sys.stderr)
                t.pop(name)
    if t:
        raise ValueError(f"{ckdir}: unexpected tensor {sorted(t)[0]}")
    return c, params


# ======================================================================================
# model (functional; params is a dict name -> tensor)
# ======================================================================================

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, wg, wu, wd):
    # gate and up projections as one GEMM (same dot products as two separate ones)
    gu = F.linear(x, torch.cat([wg, wu], 0))
    g, u = gu.split(wg.shape[0], dim=-1)
    return F.linear(F.silu(g) * u, wd)


_rope_cache = {}


def rope_tables(T, hd, theta, dtype):
    key = (T, hd, theta, dtype)
    if key not in _rope_cache:
        i = torch.arange(hd // 2, dtype=torch.float64)
        inv = theta ** (-2.0 * i / hd)                        # double
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        # cos/sin in double, then rounded to fp32 (then widened for fp64 runs)
        cos = torch.cos(ang).to(torch.float32).to(dtype)
        sin = torch.sin(ang).to(torch.float32).to(dtype)
        _rope_cache[key] = (cos, sin)
    return _rope_cache[key]


def apply_rope(x, cos, sin, interleave=False):
    # x [B, heads, T, hd]; rotate-half, or neighbouring pairs (2i, 2i+1) with the same angles
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


_bias_cache = {}


def causal_bias(T, rep, dtype):
    """[rep*T, T] additive causal mask (0 / -inf), rows = (query head in group, position)."""
    key = (T, rep, dtype)
    if key not in _bias_cache:
        m = torch.zeros(T, T, dtype=dtype).masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        _bias_cache[key] = m.repeat(rep, 1).contiguous()
    return _bias_cache[key]


def mla_attention(c, P, p, x):
    """Multi-head latent attention, written straight from the formulas (DeepSeek-V2/V3)."""
    B, T, _ = x.shape
    H, dn, dr, dv = c.H, c.dn, c.dr, c.dv
    a = p + "self_attn."
    if c.q_lora:
        cq = rmsnorm(F.linear(x, P[a + "q_a_proj.weight"]), P[a + "q_a_layernorm.weight"], c.eps)
        q = F.linear(cq, P[a + "q_b_proj.weight"])
    else:
        q = F.linear(x, P[a + "q_proj.weight"])
    q = q.view(B, T, H, dn + dr).transpose(1, 2)                       # [B, H, T, dn+dr]
    ckv = F.linear(x, P[a + "kv_a_proj_with_mqa.weight"])               # [B, T, kvl+dr]
    cc, k_pe = ckv[..., :c.kv_lora], ckv[..., c.kv_lora:]
    kv = F.linear(rmsnorm(cc, P[a + "kv_a_layernorm.weight"], c.eps), P[a + "kv_b_proj.weight"])
    kv = kv.view(B, T, H, dn + dv).transpose(1, 2)                     # [B, H, T, dn+dv]
    k_nope, v = kv[..., :dn], kv[..., dn:]
    cos, sin = rope_tables(T, dr, c.rope_theta, x.dtype)
    q_pe = apply_rope(q[..., dn:], cos, sin, c.rope_interleave)
    k_pe = apply_rope(k_pe[:, None], cos, sin, c.rope_interleave)      # [B, 1, T, dr]: one head
    qh = torch.cat([q[..., :dn], q_pe], -1)
    kh = torch.cat([k_nope, k_pe.expand(B, H, T, dr)], -1)
    att = torch.matmul(qh, kh.transpose(-1, -2)) / math.sqrt(dn + dr) + causal_bias(T, 1, x.dtype)
    o = torch.matmul(torch.softmax(att, dim=-1), v)                     # [B, H, T, dv]
    return F.linear(o.transpose(1, 2).reshape(B, T, H * dv), P[a + "o_proj.weight"])


def attention(c, P, p, x):
    if c.attn_type == "mla":
        return mla_attention(c, P, p, x)
    B, T, _ = x.shape
    H, Hkv, hd = c.H, c.Hkv, c.hd
    # q, k, v projections as one GEMM (same dot products as three separate ones)
    W = torch.cat([P[p + "self_attn.q_proj.weight"], P[p + "self_attn.k_proj.weight"],
                   P[p + "self_attn.v_proj.weight"]], 0)
    qkv = F.linear(x, W).view(B, T, H + 2 * Hkv, hd).transpose(1, 2)   # [B, H+2Hkv, T, hd]
    cos, sin = rope_tables(T, hd, c.rope_theta, x.dtype)
    q = apply_rope(qkv[:, :H], cos, sin, c.rope_interleave)             # [B, H, T, hd]
    k = apply_rope(qkv[:, H:H + Hkv], cos, sin, c.rope_interleave)      # [B, Hkv, T, hd]
    v = qkv[:, H + Hkv:]
    rep = H // Hkv
    # query head h uses kv head h // rep: group the query heads by kv head
    q3 = q.reshape(B * Hkv, rep * T, hd)
    k3 = k.reshape(B * Hkv, T, hd)
    v3 = v.reshape(B * Hkv, T, hd)
    # scores = q k^T / sqrt(hd) + causal mask (-inf above the diagonal), in one batched GEMM
    att = torch.baddbmm(causal_bias(T, rep, x.dtype), q3, k3.transpose(1, 2), alpha=1.0 / math.sqrt(hd))
    att = torch.softmax(att, dim=-1)
    o = torch.bmm(att, v3).view(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
    return F.linear(o, P[p + "self_attn.o_proj.weight"])


def _desc_stable(v):
    """indices sorting v descending along the last dim; ties -> lower index."""
    return torch.sort(v, dim=-1, descending=True, stable=True).indices


def route(c, p):
    """p: [N, E] selection probabilities (fp32/fp64, detached usage).
    Returns (idx [N, k] long, margin [N] of the selection: min over the relevant gaps)."""
    N, E = p.shape
    k, G = c.k, c.n_group
    big = torch.tensor(float("inf"), dtype=p.dtype)
    if c.topk_method == "greedy" or G <= 1 and c.topk_method != "moge":
        order = _desc_stable(p)
        idx = order[:, :k]
        if k < E:
            srt = p.gather(1, order)
            margin = srt[:, k - 1] - srt[:, k]
        else:
            margin = big.expand(N)
        return idx, margin
    per = E // G
    pg = p.view(N, G, per)
    if c.topk_method == "group_limited":
        gscore = pg.max(dim=-1).values                        # [N, G]
        gorder = _desc_stable(gscore)
        kept = gorder[:, :c.topk_group]
        gmask = torch.zeros(N, G, dtype=torch.bool).scatter_(1, kept, True)
        emask = gmask[:, :, None].expand(N, G, per).reshape(N, E)
        masked = p.masked_fill(~emask, float("-inf"))
        order = _desc_stable(masked)
        idx = order[:, :k]
        srt = masked.gather(1, order)
        m = big.expand(N).clone()
        if k < c.topk_group * per:
            m = torch.minimum(m, srt[:, k - 1] - srt[:, k])
        if c.topk_group < G:
            gs = gscore.gather(1, gorder)
            m = torch.minimum(m, gs[:, c.topk_group - 1] - gs[:, c.topk_group])
        return idx, m
    # moge: k / G experts from every group
    kg = k // G
    order = _desc_stable(pg)                                   # [N, G, per]
    sel = order[:, :, :kg] + (torch.arange(G) * per)[None, :, None]
    idx = sel.reshape(N, k)
    if kg < per:
        srt = pg.gather(2, order)
        m = (srt[:, :, kg - 1] - srt[:, :, kg]).min(dim=-1).values
    else:
        m = big.expand(N)
    return idx, m


def moe_block(c, P, p, x, stats):
    """x [B, T, d] -> y, balance (mean over sequences). stats collects margins."""
    B, T, d = x.shape
    N = B * T
    xf = x.reshape(N, d)
    s = F.linear(xf, P[p + "mlp.gate.weight"])                # [N, E]
    if c.scoring == "softmax":
        prob = torch.softmax(s, dim=-1)
    else:
        prob = torch.sigmoid(s)
    with torch.no_grad():
        idx, margin = route(c, prob.detach())
    if stats is not None:
        stats.append((margin, idx, prob.detach()))
    w = prob.gather(1, idx)                                    # [N, k]
    if c.norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * c.rsf
    # dispatch: sort the (token, slot) pairs by expert, gather their rows once, run each
    # expert on its contiguous slice, scale by the routing weight, scatter-add back.
    flat_e = idx.reshape(-1)                                   # [N*k]
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=c.E).tolist()
    tok_sorted = order // c.k
    w_sorted = w.reshape(-1).index_select(0, order)
    xs = xf.index_select(0, tok_sorted)                        # [N*k, d]
    outs = []
    start = 0
    for e in range(c.E):
        n = counts[e]
        if n == 0:
            continue
        q = p + f"mlp.experts.{e}."
        outs.append(swiglu(xs[start:start + n], P[q + "gate_proj.weight"], P[q + "up_proj.weight"],
                           P[q + "down_proj.weight"]))
        start += n
    out = torch.cat(outs, 0) * w_sorted[:, None]
    # (under bf16 autocast the experts' output is bf16: accumulate it into the fp32 stream)
    y = torch.zeros_like(xf).index_add_(0, tok_sorted, out.to(xf.dtype))
    if c.n_shared:
        q = p + "mlp.shared_experts."
        y = y + swiglu(xf, P[q + "gate_proj.weight"], P[q + "up_proj.weight"], P[q + "down_proj.weight"])
    # balance loss, per sequence
    with torch.no_grad():
        cnt = torch.zeros(B, c.E, dtype=x.dtype)
        cnt.scatter_add_(1, idx.reshape(B, T * c.k), torch.ones(B, T * c.k, dtype=x.dtype))
        f = cnt / (T * c.k)
    pn = prob if c.scoring == "softmax" else prob / prob.sum(-1, keepdim=True)
    Pe = pn.view(B, T, c.E).mean(1)                            # [B, E]
    bal = (c.E * (f * Pe).sum(-1)).mean()
    return y.view(B, T, d), bal


def decoder_layer(c, P, l, x, stats=None, bals=None):
    """Decoder layer l (a main layer, or an MTP block's layer at index L+k-1): attention
    and FFN (dense SwiGLU or MoE), pre-norm or sandwich norm.  x [B, T, d] -> [B, T, d];
    an MoE layer appends its balance loss to bals."""
    p = f"model.layers.{l}."
    a = attention(c, P, p, rmsnorm(x, P[p + "input_layernorm.weight"], c.eps))
    if c.sandwich:   # post_attention_layernorm norms the attention output; pre_mlp the FFN input
        h = x + rmsnorm(a, P[p + "post_attention_layernorm.weight"], c.eps)
        hn = rmsnorm(h, P[p + "pre_mlp_layernorm.weight"], c.eps)
    else:
        h = x + a
        hn = rmsnorm(h, P[p + "post_attention_layernorm.weight"], c.eps)
    if is_moe(c, l):
        y, bal = moe_block(c, P, p, hn, stats)
        if bals is not None:
            bals.append(bal)
    else:
        y = swiglu(hn, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"], P[p + "mlp.down_proj.weight"])
    if c.sandwich:
        y = rmsnorm(y, P[p + "post_mlp_layernorm.weight"], c.eps)
    return h + y


def masked_ce(c, logits, targets):
    """Token-weighted mean cross entropy over the targets >= 0 (0 * logits if none)."""
    valid = targets >= 0
    nv = int(valid.sum())
    if nv == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.reshape(-1, c.V), targets.reshape(-1).clamp_min(0),
                           reduction="none").masked_select(valid.reshape(-1)).sum() / nv


def mtp_inputs(c, P, tokens, targets):
    """The MTP blocks' embedding stream: [B, T+1+D, d] with row j = e_j, i.e.
    embed_tokens[t_j] for j <= T (t_j = tokens[:, j] for j < T, t_T = targets[:, T-1],
    the zero vector where that target is masked) and the zero vector for j > T.
    Block k reads rows k .. k+T-1."""
    B, T = tokens.shape
    W = P["model.embed_tokens.weight"]
    e = F.embedding(tokens, W)                                          # e_0 .. e_{T-1}
    last = targets[:, T - 1]
    eT = F.embedding(last.clamp_min(0), W)[:, None, :]                  # e_T
    eT = torch.where((last >= 0)[:, None, None], eT, torch.zeros_like(eT))
    pad = torch.zeros(B, c.D, e.shape[-1], dtype=e.dtype)               # e_{T+1} .. e_{T+D}
    return torch.cat([e, eT, pad], 1)


def mtp_targets(targets, k):
    """Block k's targets [B, T]: position i gets the main target of position i + k
    (token t_{i+1+k}, masked where that one is masked); positions i >= T - k none (-1)."""
    B, T = targets.shape
    out = torch.full_like(targets, -1)
    if k < T:
        out[:, :T - k] = targets[:, k:]
    return out


def forward(c, P, tokens, targets=None, stats=None, mtp=None):
    """tokens [B, T] long. Returns logits [B,T,V], ce, balances (list), loss.
    With targets and D > 0 the MTP blocks run too (their ce in loss, their balances
    after the main stack's in the list); if mtp is a list, (logits^k, ce_k) of block
    k = 1..D is appended to it.  Without targets (eval) the MTP blocks are skipped."""
    x = F.embedding(tokens, P["model.embed_tokens.weight"])
    bals = []
    for l in range(c.L):
        x = decoder_layer(c, P, l, x, stats, bals)
    W = P["model.embed_tokens.weight"] if c.tied else P["lm_head.weight"]
    logits = F.linear(rmsnorm(x, P["model.norm.weight"], c.eps), W)
    ce = None
    loss = None
    if targets is not None:
        ce = masked_ce(c, logits, targets)
        loss = ce
        if c.D > 0:
            T = tokens.shape[1]
            emb = mtp_inputs(c, P, tokens, targets)
            h = x                                                   # h^0: before model.norm
            mtp_sum = None
            for k in range(1, c.D + 1):
                p = mtp_prefix(c, k)
                u = F.linear(torch.cat([rmsnorm(emb[:, k:k + T], P[p + "enorm.weight"], c.eps),
                                        rmsnorm(h, P[p + "hnorm.weight"], c.eps)], -1),
                             P[p + "eh_proj.weight"])
                h = decoder_layer(c, P, c.L + k - 1, u, stats, bals)   # h^k
                lk = F.linear(rmsnorm(h, P[p + "shared_head.norm.weight"], c.eps), W)
                cek = masked_ce(c, lk, mtp_targets(targets, k))
                if mtp is not None:
                    mtp.append((lk, cek))
                mtp_sum = cek if mtp_sum is None else mtp_sum + cek
            loss = loss + c.mtp_w * (mtp_sum / c.D)
        if bals:
            loss = loss + c.alpha * torch.stack(bals).sum()
    return logits, ce, bals, loss


# ======================================================================================
# commands
# ======================================================================================

def draw_params(c, seed, std):
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in param_shapes(c):
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        if len(shape) == 1:
            t = 1.0 + 0.3 * t          # norm weights
        else:
            t = t * std
        P[name] = t
    return P


def cmd_make_case(a):
    c = load_config(a.config)
    os.makedirs(a.out, exist_ok=True)
    B, T = a.batch, a.seq
    if T > c.max_pos:
        raise ValueError("sequence longer than max_position_embeddings")
    seed = a.seed
    for attempt in range(200):
        P = draw_params(c, seed, a.std)
        rng = np.random.default_rng(seed)
        toks = rng.integers(0, min(c.V, 65536), size=B * (T + 1), dtype=np.int64)
        rows = torch.from_numpy(toks.reshape(B, T + 1))
        stats = []
        with torch.no_grad():
            forward(c, P, rows[:, :T], rows[:, 1:], stats)
        mm = min([float(m[0].min()) for m in stats], default=float("inf"))
        # how many token-layers a grouped method routes differently from plain greedy top-k
        ndiff, ntot = 0, 0
        for _, idx, prob in stats:
            greedy = _desc_stable(prob)[:, :c.k]
            ndiff += int((idx.sort(-1).values != greedy.sort(-1).values).any(-1).sum())
            ntot += idx.shape[0]
        if mm <= 1e-5:
            print(f"make-case: seed {seed}: routing margin {mm:.3g} <= 1e-5, redrawing")
        elif c.n_moe and c.topk_method != "greedy" and c.n_group > 1 and ndiff == 0:
            print(f"make-case: seed {seed}: {c.topk_method} selects like greedy on every token, redrawing")
        else:
            break
        seed += 1
    else:
        raise RuntimeError("make-case: could not draw a case with routing margins > 1e-5")
    shutil.copyfile(a.config, os.path.join(a.out, "config.json"))
    npar = sum(t.numel() for t in P.values())
    if a.mtp_copies:
        if not c.D:
            raise ValueError("make-case: --mtp-copies needs num_nextn_predict_layers > 0")
        # DeepSeek-V3's per-block copies of the embedding and the head, which a loader
        # ignores; drawn unlike the real ones, so a loader that used them would show
        g = torch.Generator().manual_seed(seed + 1000003)
        P = dict(P)
        for k in range(1, c.D + 1):
            for n in ("embed_tokens.weight", "shared_head.head.weight"):
                P[mtp_prefix(c, k) + n] = torch.randn((c.V, c.d), generator=g) * a.std
    st_write(os.path.join(a.out, "model.safetensors"), P)
    shard_write(os.path.join(a.out, "tokens.bin"), toks)
    print(f"make-case: {a.out}: seed {seed}, B={B} T={T}, min routing margin "
          f"{mm:.3g}, {npar} parameters"
          + (f", {c.topk_method} differs from greedy on {ndiff}/{ntot} token-layers"
             if c.n_moe and c.topk_method != "greedy" else "")
          + (f", {c.D} MTP block(s) (mtp_loss_weight {c.mtp_w:g})" if c.D else "")
          + (", with DeepSeek-V3's embed_tokens/shared_head.head copies" if a.mtp_copies else ""))


def case_tokens(case, B, T):
    toks = np.asarray(shard_read(os.path.join(case, "tokens.bin")), dtype=np.int64)
    if toks.size < B * (T + 1):
        raise ValueError(f"tokens.bin holds {toks.size} tokens, need {B * (T + 1)}")
    rows = torch.from_numpy(toks[:B * (T + 1)].reshape(B, T + 1).copy())
    return rows[:, :T], rows[:, 1:]


def reference(c, P, inp, tgt):
    """Forward + backward of a case.  The last value: {} without MTP, else the dump's MTP
    tensors, mtp_logits [D, B, T, V] (block k at index k-1) and mtp_ce [D]."""
    Pg = {k: v.clone().requires_grad_(True) for k, v in P.items()}
    stats = []
    mtp = []
    logits, ce, bals, loss = forward(c, Pg, inp, tgt, stats, mtp)
    loss.backward()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in Pg.items()}
    margin = min([float(m[0].min()) for m in stats], default=float("inf"))
    extra = {}
    if mtp:
        extra["mtp_logits"] = torch.stack([lk.detach() for lk, _ in mtp])
        extra["mtp_ce"] = torch.stack([cek.detach() for _, cek in mtp])
    return logits.detach(), ce.detach(), [b.detach() for b in bals], loss.detach(), grads, margin, extra


def relnorm(a, b):
    a = a.double()
    b = b.double()
    na = float(a.norm())
    diff = float((a - b).norm())
    return diff / na if na > 0 else diff


def cmd_compare(a):
    c, P = load_checkpoint(a.case)
    D = st_read(a.dump)
    fails = []
    if "logits" not in D:
        print(f"compare: {a.dump}: no 'logits' tensor")
        return 1
    B, T, V = D["logits"].shape
    inp, tgt = case_tokens(a.case, B, T)
    logits, ce, bals, loss, grads, margin, mtp = reference(c, P, inp, tgt)
    rows = []

    def check(name, ref, got, kind, tol):
        if got is None:
            rows.append((name, "MISSING", "", "FAIL"))
            fails.append(f"{name}: missing from dump")
            return
        if tuple(got.shape) != tuple(ref.shape):
            rows.append((name, f"shape {tuple(got.shape)} vs {tuple(ref.shape)}", "", "FAIL"))
            fails.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
            return
        if kind == "norm":
            err = relnorm(ref, got)
            ok = err < tol
            desc = f"||a-b||/||a|| = {err:.3e}"
        else:
            r, g = ref.double().reshape(-1), got.double().reshape(-1)
            errs = []
            ok = True
            for x, y in zip(r.tolist(), g.tolist()):
                if abs(x) < 1e-6:
                    e = abs(x - y)
                    ok &= e <= 1e-7
                else:
                    e = abs(x - y) / abs(x)
                    ok &= e < tol
                errs.append(e)
            err = max(errs) if errs else 0.0
            desc = f"rel err {err:.3e} (ref {', '.join(f'{x:.7g}' for x in r.tolist()[:4])})"
        rows.append((name, desc, f"< {tol:g}", "ok" if ok else "FAIL"))
        if not ok:
            fails.append(f"{name}: {desc} exceeds {tol:g}")
        return err

    check("logits", logits, D.get("logits"), "norm", 1e-4)
    check("ce", ce.reshape(1), D.get("ce"), "scalar", 1e-5)
    if c.n_moe:
        check("balance", torch.stack(bals), D.get("balance"), "scalar", 1e-5)
    elif "balance" in D and D["balance"].numel() != 0:
        fails.append("balance: dump has balance values but the model has no MoE layer")
    if c.D:
        check("mtp_logits", mtp["mtp_logits"], D.get("mtp_logits"), "norm", 1e-4)
        check("mtp_ce", mtp["mtp_ce"], D.get("mtp_ce"), "scalar", 1e-5)
    else:
        for k in ("mtp_logits", "mtp_ce"):
            if k in D:
                fails.append(f"{k}: dump has {k} but the model has no MTP block")
    check("loss", loss.reshape(1), D.get("loss"), "scalar", 1e-5)
    worst = (None, -1.0)
    gfails = 0
    for name, g in grads.items():
        got = D.get("grad." + name)
        nrow = len(rows)
        err = check("grad." + name, g, got, "norm", 1e-3)
        if err is not None and err > worst[1]:
            worst = (name, err)
        if rows[-1][3] == "FAIL":
            gfails += 1
        elif not a.verbose:
            rows.pop()
        del nrow
    extra = [k for k in D if k.startswith("grad.") and k[5:] not in grads]
    for k in extra:
        fails.append(f"{k}: dump has a gradient for a tensor that is not a parameter")
    print(f"compare: case {a.case}  B={B} T={T} V={V}  min routing margin {margin:.3g}"
          + (f"  MTP blocks {c.D}" if c.D else ""))
    w = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"  {r[0]:<{w}}  {r[1]:<60} {r[2]:<8} {r[3]}")
    print(f"  gradients: {len(grads)} tensors, {gfails} failed, worst {worst[0]} "
          f"||a-b||/||a|| = {worst[1]:.3e} (< 1e-3)")
    if fails:
        print("compare: FAILED:")
        for f in fails:
            print("  " + f)
        return 1
    print("compare: OK")
    return 0


def cmd_selfdump(a):
    """Writes the oracle's own dump of a case (same format as `moetrain dump`), for
    testing compare itself; --perturb NAME scales that tensor of the dump by 1.01."""
    c, P = load_checkpoint(a.case)
    inp, tgt = case_tokens(a.case, a.batch, a.seq)
    logits, ce, bals, loss, grads, _, mtp = reference(c, P, inp, tgt)
    D = {"logits": logits, "ce": ce.reshape(1), "balance": torch.stack(bals) if bals else torch.zeros(0),
         "loss": loss.reshape(1)}
    D.update(mtp)   # mtp_logits, mtp_ce (D > 0 only)
    for n, g in grads.items():
        D["grad." + n] = g if g is not None else torch.zeros_like(P[n])
    if a.perturb:
        D[a.perturb] = D[a.perturb] * 1.01
    st_write(a.out, D)
    return 0


# --- gradcheck (self test of the autograd path) ----------------------------------------

def mtp_leak_check(c, P, rows):
    """Which tokens each MTP block sees: logits^k at position i may depend on t_0 .. t_{i+k}
    only (it predicts t_{i+k+1}), and must depend on t_{i+k} (its e_{i+k}).  Changes one
    window token t_j at a time (rows [B, T+1]: t_0 .. t_T) and checks which positions of
    every block's logits move.  Returns the number of violations (printed)."""
    B, T = rows.shape[0], rows.shape[1] - 1
    def run(r):
        mtp = []
        with torch.no_grad():
            forward(c, P, r[:, :T], r[:, 1:], None, mtp)
        return [lk for lk, _ in mtp]
    ref = run(rows)
    bad = 0
    for j in range(T + 1):
        r = rows.clone()
        r[:, j] = (r[:, j] + 1) % c.V
        got = run(r)
        for k in range(1, c.D + 1):
            diff = (got[k - 1] - ref[k - 1]).abs().amax(dim=(0, 2))   # [T]
            for i in range(T):
                moved = float(diff[i]) > 1e-12 * (1 + float(ref[k - 1][:, i].abs().max()))
                if moved != (j <= i + k):
                    bad += 1
                    print(f"  mtp block {k} position {i}: changing t_{j} "
                          f"{'moves' if moved else 'does not move'} its logits (max diff {float(diff[i]):.3g})")
    return bad


def mtp_target_check(c, P, inp, tgt):
    """Each ce_k against a literal sum: block k at position i is scored on t_{i+1+k} =
    tgt[:, i+k] for i + k < T where that target is valid.  Returns the violations."""
    B, T = inp.shape
    mtp = []
    with torch.no_grad():
        forward(c, P, inp, tgt, None, mtp)
    bad = 0
    for k, (lk, cek) in enumerate(mtp, 1):
        tot, n = 0.0, 0
        for b in range(B):
            for i in range(T):
                if i + k < T and int(tgt[b, i + k]) >= 0:
                    tot -= float(torch.log_softmax(lk[b, i].double(), -1)[int(tgt[b, i + k])])
                    n += 1
        want = tot / n if n else 0.0
        if abs(want - float(cek)) > 1e-9 * max(1.0, abs(want)):
            bad += 1
            print(f"  mtp block {k}: ce_k {float(cek):.12g}, literal sum over {n} targets {want:.12g}")
    return bad


def cmd_gradcheck(a):
    cfgs = []
    if a.config:
        cfgs.append(load_config(a.config).raw)
    else:
        base = dict(vocab_size=37, hidden_size=16, num_hidden_layers=2, first_k_dense_replace=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=24,
                    max_position_embeddings=64, n_routed_experts=8, num_experts_per_tok=2,
                    n_shared_experts=1, moe_intermediate_size=8, aux_loss_alpha=0.1)
        cfgs = [base, dict(base, scoring_func="sigmoid", norm_topk_prob=False, routed_scaling_factor=2.5),
                dict(base, topk_method="group_limited", n_group=4, topk_group=2, tie_word_embeddings=True),
                dict(base, topk_method="moge", n_group=2, scoring_func="sigmoid"),
                dict(base, attention_type="mla", q_lora_rank=6, kv_lora_rank=8, qk_nope_head_dim=4,
                     qk_rope_head_dim=4, v_head_dim=3),
                dict(base, attention_type="mla", q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=2,
                     qk_rope_head_dim=6, v_head_dim=5, rope_interleave=False)]
        # multi-token prediction: MoE and dense MTP blocks, tied head, MLA, sandwich norm
        dense = {k: v for k, v in base.items() if k not in (
            "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
            "moe_intermediate_size", "n_shared_experts", "aux_loss_alpha")}
        cfgs += [dict(base, num_nextn_predict_layers=1),
                 dict(base, num_nextn_predict_layers=2, mtp_loss_weight=0.5, scoring_func="sigmoid",
                      topk_method="group_limited", n_group=4, topk_group=2, tie_word_embeddings=True),
                 dict(dense, num_nextn_predict_layers=2),
                 dict(base, num_nextn_predict_layers=2, attention_type="mla", q_lora_rank=6, kv_lora_rank=8,
                      qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3, sandwich_norm=True),
                 dict(base, num_nextn_predict_layers=1, topk_method="moge", n_group=2, sandwich_norm=True,
                      rope_interleave=True)]
    worst_all = 0.0
    leaks = 0
    for raw in cfgs:
        c = load_config(raw)
        P = {k: v.double() for k, v in draw_params(c, 1, 0.3).items()}
        rng = np.random.default_rng(0)
        B, T = 2, 6
        rows = torch.from_numpy(rng.integers(0, c.V, size=(B, T + 1)))
        inp, tgt = rows[:, :T], rows[:, 1:].clone()
        tgt[0, 2] = -1   # one invalid target
        if c.D:
            tgt[1, T - 1] = -1   # the last target masked: e_T of row 1 is the zero vector
            leaks += mtp_leak_check(c, P, rows) + mtp_target_check(c, P, inp, tgt)
        Pg = {k: v.clone().requires_grad_(True) for k, v in P.items()}
        stats = []
        _, _, _, loss = forward(c, Pg, inp, tgt, stats)
        loss.backward()
        base_idx = None
        g = torch.Generator().manual_seed(3)
        worst = 0.0
        for name, t in P.items():
            # a few random coordinates per tensor, central differences
            n = t.numel()
            coords = torch.randint(0, n, (3,), generator=g).tolist()
            if c.D and name == "model.embed_tokens.weight":
                # the row of t_T of row 0: reaches the loss through e_T (and as a target)
                coords += [int(tgt[0, T - 1]) * c.d + jj for jj in (0, c.d - 1)]
            for j in coords:
                h = 1e-5   # fp64: rounding ~1e-11 here, truncation below it
                def f(delta):
                    Q = dict(P)
                    tt = t.clone().view(-1)
                    tt[j] += delta
                    Q[name] = tt.view(t.shape)
                    st = []
                    lo = forward(c, Q, inp, tgt, st)[3]
                    return float(lo), st
                lp, st1 = f(h)
                lm, st2 = f(-h)
                fd = (lp - lm) / (2 * h)
                gr = Pg[name].grad
                ad = float(gr.reshape(-1)[j]) if gr is not None else 0.0
                err = abs(fd - ad) / max(1e-4, abs(fd) + abs(ad))
                worst = max(worst, err)
                if err > 1e-5:
                    print(f"  {name}[{j}]: autograd {ad:.9g} finite diff {fd:.9g} rel {err:.2e}")
        del base_idx
        worst_all = max(worst_all, worst)
        print(f"gradcheck {c.attn_type}/{c.topk_method}/{c.scoring}/norm={c.norm_topk}/tied={c.tied}"
              + (f"/moe={c.n_moe > 0}/sandwich={c.sandwich}/mtp={c.D}" if c.D else "") + ": "
              f"min margin {min([float(m[0].min()) for m in stats], default=float('inf')):.2e}, "
              f"worst rel err {worst:.2e}")
    ok = worst_all < 1e-5 and leaks == 0
    print("gradcheck:", "OK" if ok else "FAILED")
    return 0 if ok else 1


# --- training / eval -------------------------------------------------------------------

def vm_hwm_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def blas_report(timed=True):
    libs = set()
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    torch.mm(a, b)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(p)
                if any(s in base for s in ("blas", "blis", "mkl", "dnnl", "gomp", "lapack")):
                    libs.add(os.path.realpath(p))
    except OSError:
        pass
    gf = float("nan")
    if timed:
        n = 0
        t0 = time.perf_counter()
        while True:
            torch.mm(a, b)
            n += 1
            dt = time.perf_counter() - t0
            if dt > 0.5 and n >= 3:
                break
        gf = 2.0 * 1024 ** 3 * n / dt / 1e9
    print(f"blas: {', '.join(sorted(libs)) or '?'}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}"
          f" OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '')} threads={torch.get_num_threads()}"
          f" malloc={'tuned' if os.environ.get('MOE_REF_MALLOC') == '1' else 'default'};"
          + (f" sgemm 1024^3: {gf:.1f} GFLOP/s" if timed else " sgemm not timed (--no-blas-timing)"), flush=True)
    return gf


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    std = math.sqrt(1.0 / (2.0 * c.d * c.L))
    P = {}
    # the sandwich norm's post-sublayer gains start at c/sqrt(L), moetrain's (Pangu Ultra's) c
    sub = {"post_attention_layernorm.weight": 0.283, "post_mlp_layernorm.weight": 0.432}
    for name, shape in param_shapes(c):
        if len(shape) == 1:
            gain = sub.get(name.split(".", 3)[-1], 1.0) if c.sandwich else 1.0
            P[name] = torch.ones(shape) * (gain if gain == 1.0 else gain / math.sqrt(c.L))
        else:
            P[name] = torch.randn(shape, generator=g) * std
    return P


class ShardSampler:
    def __init__(self, data_dir, pattern, seed):
        files = sorted(glob.glob(os.path.join(data_dir, f"*{pattern}*.bin")))
        if not files:
            raise ValueError(f"{data_dir}: no *{pattern}*.bin shards")
        self.shards = [shard_read(f) for f in files]
        self.rng = np.random.default_rng(seed)

    def batch(self, B, T):
        rows = np.empty((B, T + 1), dtype=np.int64)
        sizes = np.array([s.size for s in self.shards])
        ok = np.nonzero(sizes >= T + 1)[0]
        if ok.size == 0:
            raise ValueError("no shard holds T+1 tokens")
        w = (sizes[ok] - T).astype(np.float64)
        for b in range(B):
            si = ok[self.rng.choice(ok.size, p=w / w.sum())]
            s = self.shards[si]
            o = int(self.rng.integers(0, s.size - T))
            rows[b] = s[o:o + T + 1]
        t = torch.from_numpy(rows)
        return t[:, :T], t[:, 1:]


def save_checkpoint(out, c, P):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c.raw, f, indent=2)
    st_write(os.path.join(out, "model.safetensors"), {n: P[n] for n, _ in param_shapes(c)})


def cmd_train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    blas_report(not a.no_blas_timing)
    if a.init:
        c, P = load_checkpoint(a.init)
    else:
        c = load_config(a.config)
        P = init_params(c, a.seed)
    if a.seq > c.max_pos:
        raise ValueError("sequence longer than max_position_embeddings")
    for t in P.values():
        t.requires_grad_(True)
    decay = [t for n, t in P.items() if t.dim() >= 2]
    nodecay = [t for n, t in P.items() if t.dim() < 2]
    kw = {}
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
        kw["foreach"] = True
    except TypeError:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    data = ShardSampler(a.data, "train", a.seed)
    params = list(P.values())
    nparam = sum(t.numel() for t in params)
    print(f"train: {nparam / 1e6:.2f}M parameters, {c.L} layers ({c.n_moe} MoE)"
          + (f" + {c.D} MTP block(s) (weight {c.mtp_w:g})" if c.D else "") + ", "
          f"batch {a.batch} x seq {a.seq}, {a.steps} steps, threads {a.threads}, autocast {a.autocast}", flush=True)
    tok_timed, t_timed = 0, 0.0
    for step in range(a.steps):
        t0 = time.perf_counter()
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            prog = (step - a.warmup) / max(1, a.steps - a.warmup)
            lr = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        for gidx in opt.param_groups:
            gidx["lr"] = lr
        inp, tgt = data.batch(a.batch, a.seq)
        if int(inp.max()) >= c.V or int(tgt.max()) >= c.V:
            raise ValueError(f"{a.data}: token id {max(int(inp.max()), int(tgt.max()))} >= vocab_size {c.V}")
        mtp = []
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            _, ce, bals, loss = forward(c, P, inp, tgt, None, mtp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step > 0:
            tok_timed += a.batch * a.seq
            t_timed += dt
        bal = float(torch.stack(bals).sum()) if bals else 0.0
        mtxt = "".join(f"mtp_ce{k + 1} {float(cek):.6f} " for k, (_, cek) in enumerate(mtp))
        print(f"step {step + 1}/{a.steps} loss {float(loss):.6f} ce {float(ce):.6f} {mtxt}balance_sum {bal:.5f} "
              f"lr {lr:.3e} gnorm {float(gn):.4f} {dt * 1000:.0f} ms {a.batch * a.seq / dt:.0f} tok/s", flush=True)
    if a.out:
        save_checkpoint(a.out, c, {n: t.detach() for n, t in P.items()})
        print(f"train: wrote {a.out}")
    tps = tok_timed / t_timed if t_timed > 0 else float("nan")
    print(f"summary tokens_per_s={tps:.3f} peak_rss_mb={vm_hwm_mb():.1f} steps={a.steps}", flush=True)
    return 0


def cmd_eval(a):
    torch.set_num_threads(a.threads)
    c, P = load_checkpoint(a.ckpt)
    T = a.seq
    files = sorted(glob.glob(os.path.join(a.data, "*val*.bin")))
    if not files:
        raise ValueError(f"{a.data}: no *val*.bin shards")
    wins = []
    for fn in files:
        s = shard_read(fn)
        nw = (s.size - 1) // T if s.size > T else 0
        for w in range(nw):
            if len(wins) >= a.windows:
                break
            wins.append(np.asarray(s[w * T: w * T + T + 1], dtype=np.int64))
        if len(wins) >= a.windows:
            break
    if len(wins) < a.windows:
        print(f"eval: only {len(wins)} windows available (asked {a.windows})")
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(wins), 8):
            rows = torch.from_numpy(np.stack(wins[i:i + 8]))
            if int(rows.max()) >= c.V:
                raise ValueError(f"{a.data}: token id {int(rows.max())} >= vocab_size {c.V}")
            inp, tgt = rows[:, :T], rows[:, 1:]
            logits = forward(c, P, inp)[0]
            l = F.cross_entropy(logits.reshape(-1, c.V).double(), tgt.reshape(-1), reduction="sum")
            tot += float(l)
            cnt += tgt.numel()
    print(f"eval: {len(wins)} windows of {T} tokens from {len(files)} val shard(s)")
    print(f"val_loss={tot / max(cnt, 1):.7f}")
    return 0


def cmd_batch(a):
    """Runs the jobs of a.jobs one after the other in this process (torch is imported
    once, not once per job).  A `train` job here runs without the malloc/BLAS re-exec
    above (fine for tests, not for timing)."""
    return run_jobs(a.jobs, a.threads, main, lambda argv: argv[:1] == ["batch"])


def run_jobs(path, threads, entry, is_batch):
    """Each line of PATH is PREFIX ARGS..., shell-quoted: entry(ARGS) runs with its stdout,
    stderr and exit status in PREFIX.out, PREFIX.err and PREFIX.rc.  A job that fails,
    raises or exits leaves its status and the next job runs; a job with no PREFIX.rc did
    not finish; is_batch(ARGS) true refuses the job.  Also grpo_ref.py's --jobs."""
    import shlex
    import traceback
    with open(path) as f:
        jobs = [shlex.split(line) for line in f if line.strip()]
    nfail = 0
    for job in jobs:
        prefix, argv = job[0], job[1:]
        t0 = time.perf_counter()
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
        try:
            with open(prefix + ".out", "wb") as fo, open(prefix + ".err", "wb") as fe:
                os.dup2(fo.fileno(), 1)
                os.dup2(fe.fileno(), 2)
                try:
                    if is_batch(argv):
                        raise ValueError("a job cannot be a batch")
                    # every job starts alike, whatever the one before it set
                    torch.set_num_threads(threads)
                    rc = entry(argv)
                except SystemExit as ex:   # argparse's usage errors
                    rc = ex.code if isinstance(ex.code, int) else 2
                except Exception:
                    traceback.print_exc()
                    rc = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os.dup2(saved[0], 1)
                    os.dup2(saved[1], 2)
        finally:
            os.close(saved[0])
            os.close(saved[1])
        rc = rc or 0
        with open(prefix + ".rc.tmp", "w") as f:
            f.write(f"{rc}\n")
        os.replace(prefix + ".rc.tmp", prefix + ".rc")
        nfail += rc != 0
        print(f"batch: {' '.join(argv[:1])} {prefix}: exit {rc}, {time.perf_counter() - t0:.2f} s", flush=True)
    print(f"batch: {len(jobs)} job(s), {nfail} failed")
    return 1 if nfail else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="moe_ref.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-case")
    m.add_argument("--config", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--std", type=float, default=0.3)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--seq", type=int, default=16)
    m.add_argument("--mtp-copies", action="store_true",
                   help="also write DeepSeek-V3's model.layers.{L+k-1}.embed_tokens.weight and "
                        ".shared_head.head.weight (random, unlike the real ones: loaders must ignore them)")
    cp = sub.add_parser("compare")
    cp.add_argument("--case", required=True)
    cp.add_argument("--dump", required=True)
    cp.add_argument("--verbose", action="store_true", help="list every gradient")
    t = sub.add_parser("train")
    t.add_argument("--config")
    t.add_argument("--data", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--init")
    t.add_argument("--out")
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--no-blas-timing", action="store_true",
                   help="skip timing an sgemm for the start-up blas: line (a test needs no rate)")
    t.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="bf16: mixed precision (torch.autocast on CPU: matrix products in bfloat16 "
                        "through oneDNN, fp32 weights and optimizer)")
    e = sub.add_parser("eval")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--seq", type=int, required=True)
    e.add_argument("--windows", type=int, required=True)
    e.add_argument("--threads", type=int, default=2)
    sd = sub.add_parser("selfdump")
    sd.add_argument("--case", required=True)
    sd.add_argument("--out", required=True)
    sd.add_argument("--batch", type=int, default=2)
    sd.add_argument("--seq", type=int, default=16)
    sd.add_argument("--perturb")
    g = sub.add_parser("gradcheck")
    g.add_argument("--config")
    bt = sub.add_parser("batch")
    bt.add_argument("--jobs", required=True)
    bt.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.cmd == "train" and not (a.config or a.init):
        ap.error("train needs --config or --init")
    try:
        return {"make-case": cmd_make_case, "compare": cmd_compare, "train": cmd_train,
                "eval": cmd_eval, "gradcheck": cmd_gradcheck, "selfdump": cmd_selfdump,
                "batch": cmd_batch}[a.cmd](a)
    except (ValueError, RuntimeError, OSError) as ex:
        print(f"moe_ref.py {a.cmd}: error: {ex}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
