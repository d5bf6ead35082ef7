#!/usr/bin/python3
"""bench/bench_kernels_torch.py — the kernels of `moetrain bench kernels` written as plain
PyTorch ops (what a PyTorch MoE training step runs), on the same shapes, printed as the
same rows (kernel, shape, unit, work, ms, rate) and optionally written as JSON.

  /usr/bin/python3 bench/bench_kernels_torch.py [--threads N] [--quick] [--json FILE]

The kernel and shape strings and the work counts (FLOPs or bytes read + written) are
those of src/cli/cmd_bench.c, so bench/bench_kernels.sh can join the two by (kernel,
shape). Timing: best wall time of repeated calls, at least two (the first warms up).
Backwards use autograd where PyTorch would (rmsnorm, swiglu, attention, cross-entropy)
and the explicit matmuls of nn.Linear's backward for the linear layers.

The *_bf16 rows (moetrain's mt_gemm_bf16 and its bf16 attention: fp32 operands rounded to
bf16, fp32 sums) are the same operations on bfloat16 tensors converted beforehand (PyTorch's
CPU bf16 matmul, oneDNN with AVX512-BF16); the conversion is not timed and the results are
bf16. Only on CPUs with avx512_bf16, as in moetrain.
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP pool
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# the "small" config (bench shapes of cmd_bench.c)
V, C, H, G, D, FF, E, K, FM, B, T, TLONG = 8192, 512, 8, 8, 64, 1408, 16, 2, 352, 8, 512, 4096
N = B * T
BF16 = torch.bfloat16


def bf16_cpu():
    """The CPU has AVX512-BF16 (moetrain's mt_bf16_supported, which gates its *_bf16 rows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(ln.startswith("flags") and "avx512_bf16" in ln.split() for ln in f)
    except OSError:
        return False


def best_time(fn, budget):
    """Best seconds of fn(): >= 2 runs unless one exceeds budget, then while within budget."""
    best, spent = math.inf, 0.0
    for n in range(50):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        spent += t
        best = min(best, t)
        if (spent + best > budget) if n >= 1 else (t > budget):
            break
    return best


class Table:
    def __init__(self, budget, bf16):
        self.rows, self.budget, self.bf16 = [], budget, bf16  # bf16: also the *_bf16 rows

    def add(self, kernel, shape, flop_bound, work, fn, note="", t=None):
        t = best_time(fn, self.budget) if t is None else t
        row = {"kernel": kernel, "shape": shape, "unit": "GFLOP/s" if flop_bound else "GB/s",
               "work": work, "ms": t * 1e3, "rate": work / t * 1e-9, "torch": note}
        self.rows.append(row)
        print(f"{kernel:31} {shape:26} {t * 1e3:9.3f} {row['rate']:8.2f} {row['unit']:7} {note}", flush=True)


def rnd(*shape, lo=-1.0, hi=1.0, grad=False):
    x = torch.rand(*shape) * (hi - lo) + lo
    return x.requires_grad_(grad)


def dense(tb):
    x, W, dy = rnd(N, C), rnd(FF, C), rnd(N, FF)
    dW = torch.zeros(FF, C)
    shape = f"N={N} In={C} O={FF}"
    tb.add("linear_fwd", shape, True, 2.0 * N * C * FF, lambda: F.linear(x, W))

    def linear_bwd():  # what nn.Linear's backward computes: din = dy W, dW += dy^T x
        torch.mm(dy, W)
        dW.addmm_(dy.t(), x)
    tb.add("linear_bwd", shape, True, 4.0 * N * C * FF, linear_bwd, "mm + addmm_")
    if tb.bf16:
        xb, Wb, dyb, dWb = x.to(BF16), W.to(BF16), dy.to(BF16), torch.zeros(FF, C, dtype=BF16)
        tb.add("linear_fwd_bf16", shape, True, 2.0 * N * C * FF, lambda: F.linear(xb, Wb), "F.linear bf16")

        def linear_bwd_bf16():
            torch.mm(dyb, Wb)
            dWb.addmm_(dyb.t(), xb)
        tb.add("linear_bwd_bf16", shape, True, 4.0 * N * C * FF, linear_bwd_bf16, "mm + addmm_ bf16")

    # RMSNorm as torch ops; backward by autograd over the saved graph
    xr, w = rnd(N, C, grad=True), rnd(C, lo=0.5, hi=1.5, grad=True)

    def rms_fwd():
        return xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    n = N * C
    tb.add("rmsnorm_fwd", f"N={N} C={C}", False, 4.0 * (2.0 * n + N + C), lambda: rms_fwd().detach())
    y, dout = rms_fwd(), rnd(N, C)
    tb.add("rmsnorm_bwd", f"N={N} C={C}", False, 4.0 * (4.0 * n + N + 3.0 * C),
           lambda: torch.autograd.grad(y, (xr, w), dout, retain_graph=True), "autograd")

    # RoPE "rotate half" on q[B,T,H,D] with cos/sin tables [T, D/2]
    for Tr in (T, TLONG):
        Br = N // Tr
        q = rnd(Br, Tr, H, D)
        inv = 1.0 / (1e4 ** (torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D))
        ang = torch.arange(Tr, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]

        def rope(q=q, cos=cos, sin=sin):
            x1, x2 = q[..., : D // 2], q[..., D // 2:]
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        nq, nt = N * H * D, Tr * (D // 2)
        tb.add("rope", f"N={N} T={Tr} nh={H} D={D}", False, 4.0 * (2.0 * nq + 2.0 * nt), rope)

    # SwiGLU on gate|up rows: silu(g) * u; backward by autograd (times the routing weight)
    for R, Fr, weighted in ((N, FF, False), (N * K, FM, True)):
        gu = rnd(R, 2 * Fr, lo=-4, hi=4, grad=True)
        nn_ = R * Fr

        def sw_fwd(gu=gu, Fr=Fr):
            g, u = gu[:, :Fr], gu[:, Fr:]
            return F.silu(g) * u
        tb.add("swiglu_rows_fwd", f"N={R} F={Fr}", False, 12.0 * nn_, lambda sw_fwd=sw_fwd: sw_fwd().detach())
        a, da = sw_fwd(), rnd(R, Fr)
        ws = rnd(R, 1, lo=0, hi=1) if weighted else None

        def sw_bwd(a=a, da=da, ws=ws, gu=gu):
            return torch.autograd.grad(a, gu, da * ws if ws is not None else da, retain_graph=True)
        tb.add("swiglu_rows_bwd", f"N={R} F={Fr}" + (" wscale" if weighted else ""), False,
               4.0 * (5.0 * nn_ + (R if weighted else 0)), sw_bwd, "autograd")


def attention(tb):
    for Bq, Tq in ((B, T), (1, TLONG)):
        q = rnd(Bq, H, Tq, D, grad=True)
        k, v = rnd(Bq, G, Tq, D, grad=True), rnd(Bq, G, Tq, D, grad=True)
        mask = torch.ones(Tq, Tq, dtype=torch.bool).triu_(1)
        scale = 1.0 / math.sqrt(D)

        def fwd(q=q, k=k, v=v, mask=mask):
            s = torch.matmul(q, k.transpose(-1, -2)) * scale
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            return torch.matmul(p, v)
        ff = 4.0 * D * H * Tq * (Tq + 1) / 2.0 * Bq
        shape = f"B={Bq} T={Tq} H={H} G={G} D={D}"
        with torch.no_grad():
            tb.add("attention_fwd", shape, True, ff, fwd, "matmul+masked softmax+matmul")
        out = fwd()
        dout = rnd(*out.shape)
        tb.add("attention_bwd", shape, True, 2.5 * ff,
               lambda out=out, dout=dout, q=q, k=k, v=v: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
               "autograd")
        del out
        if tb.bf16:  # the same on bf16 tensors (what autocast runs: bf16 matmuls, softmax in bf16)
            qb, kb, vb = (t.detach().bfloat16().requires_grad_(True) for t in (q, k, v))
            with torch.no_grad():
                tb.add("attention_fwd_bf16", shape, True, ff, lambda qb=qb, kb=kb, vb=vb: fwd(qb, kb, vb),
                       "matmul+masked softmax+matmul bf16")
            outb = fwd(qb, kb, vb)
            doutb = dout.bfloat16()
            tb.add("attention_bwd_bf16", shape, True, 2.5 * ff,
                   lambda outb=outb, doutb=doutb, qb=qb, kb=kb, vb=vb:
                   torch.autograd.grad(outb, (qb, kb, vb), doutb, retain_graph=True), "autograd bf16")
            del outb


def head(tb):
    x, W = rnd(N, C, grad=True), rnd(V, C, lo=-0.05, hi=0.05, grad=True)
    tg = torch.randint(0, V, (N,))

    def ce():
        loss = F.cross_entropy(F.linear(x, W), tg, reduction="sum") * (1.0 / N)
        return torch.autograd.grad(loss, (x, W))
    tb.add("head_ce_fwd_bwd", f"N={N} C={C} V={V}", True, 6.0 * N * C * V, ce, "linear+cross_entropy+autograd")
    if tb.bf16:  # the same under autocast (the training peer's mixed precision: a bf16 linear)
        def ce_bf16():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(F.linear(x, W), tg, reduction="sum") * (1.0 / N)
            return torch.autograd.grad(loss, (x, W))
        tb.add("head_ce_fwd_bwd_bf16", f"N={N} C={C} V={V}", True, 6.0 * N * C * V, ce_bf16,
               "autocast linear+cross_entropy+autograd")


def moe(tb):
    R = N * K
    gen = torch.Generator().manual_seed(11)
    sel = torch.rand(N, E, generator=gen).topk(K, dim=-1).indices.flatten().to(torch.int64)  # distinct experts
    x, w = rnd(N, C), rnd(R, lo=0, hi=1)
    rc, nc = float(R * C), float(N * C)
    shape = f"N={N} K={K} E={E} C={C}"

    def permute():
        srt, order = torch.sort(sel, stable=True)
        off = torch.zeros(E + 1, dtype=torch.int64)
        off[1:] = torch.cumsum(torch.bincount(srt, minlength=E), 0)
        row_tok = order // K
        slot_row = torch.empty_like(order).scatter_(0, order, torch.arange(R))
        return x.index_select(0, row_tok), off, slot_row, row_tok, order
    tb.add("moe_permute", shape, False, 4.0 * (2.0 * rc + 3.0 * R + E + 1), permute, "sort(stable)+index_select")
    xe, off, slot_row, row_tok, order = permute()

    def permute_bwd():
        return torch.zeros(N, C).index_add_(0, row_tok, xe)
    tb.add("moe_permute_bwd", shape, False, 4.0 * (rc + nc + R), permute_bwd, "index_add_")

    def unpermute():
        return torch.zeros(N, C).index_add_(0, row_tok, xe * w[order][:, None])
    tb.add("moe_unpermute", shape, False, 4.0 * (rc + nc + 2.0 * R), unpermute, "mul+index_add_")

    bounds = off.tolist()
    for name, In, O in (("gate_up", C, 2 * FM), ("down", FM, C)):
        W, dW = rnd(E, O, In, lo=-0.05, hi=0.05), torch.zeros(E, O, In)
        inp, out, din = rnd(R, In), rnd(R, O), torch.empty(R, In)
        fl = 2.0 * R * In * O
        shape = f"R={R} E={E} In={In} O={O}"

        def fwd(W=W, inp=inp, out=out):
            for e in range(E):
                a, b = bounds[e], bounds[e + 1]
                torch.mm(inp[a:b], W[e].t(), out=out[a:b])

        def bwd_data(W=W, out=out, din=din):
            for e in range(E):
                a, b = bounds[e], bounds[e + 1]
                torch.mm(out[a:b], W[e], out=din[a:b])

        def bwd_weight(dW=dW, out=out, inp=inp):
            for e in range(E):
                a, b = bounds[e], bounds[e + 1]
                dW[e].addmm_(out[a:b].t(), inp[a:b])
        tb.add(f"grouped_fwd_{name}", shape, True, fl, fwd, "loop of mm")
        tb.add(f"grouped_bwd_data_{name}", shape, True, fl, bwd_data, "loop of mm")
        tb.add(f"grouped_bwd_weight_{name}", shape, True, fl, bwd_weight, "loop of addmm_")
        if tb.bf16:  # the same loops on bf16 copies
            Wb, dWb, inpb, outb, dinb = W.to(BF16), dW.to(BF16), inp.to(BF16), out.to(BF16), din.to(BF16)
            tb.add(f"grouped_fwd_{name}_bf16", shape, True, fl,
                   lambda fwd=fwd, Wb=Wb, inpb=inpb, outb=outb: fwd(Wb, inpb, outb), "loop of mm bf16")
            tb.add(f"grouped_bwd_data_{name}_bf16", shape, True, fl,
                   lambda bwd_data=bwd_data, Wb=Wb, outb=outb, dinb=dinb: bwd_data(Wb, outb, dinb), "loop of mm bf16")
            tb.add(f"grouped_bwd_weight_{name}_bf16", shape, True, fl,
                   lambda bwd_weight=bwd_weight, dWb=dWb, outb=outb, inpb=inpb: bwd_weight(dWb, outb, inpb),
                   "loop of addmm_ bf16")


def adamw(tb, n):
    """torch.optim.AdamW step on one n-element parameter, foreach False and True: the faster."""
    best = None
    for foreach in (False, True):
        p = torch.nn.Parameter(rnd(n))
        p.grad = rnd(n)
        opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=foreach)
        t = best_time(opt.step, tb.budget)
        if best is None or t < best[0]:
            best = (t, foreach)
    tb.add("adamw", f"n={n}", False, 28.0 * n, None, f"optim.AdamW foreach={best[1]}", t=best[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tb = Table(0.25 if args.quick else 1.0, bf16_cpu())
    t0 = time.perf_counter()
    print(f"bench_kernels_torch: PyTorch {torch.__version__}, {torch.get_num_threads()} threads"
          + ("" if tb.bf16 else "; no avx512_bf16: the *_bf16 rows are skipped"), flush=True)
    print(f"{'kernel':31} {'shape':26} {'ms':>9} {'rate':>8} {'unit':7} torch ops")
    dense(tb)
    attention(tb)
    head(tb)
    moe(tb)
    adamw(tb, (4 << 20) if args.quick else (16 << 20))
    print(f"bench_kernels_torch: {len(tb.rows)} rows in {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"impl": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads(),
                       "rows": tb.rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
