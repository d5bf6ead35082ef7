#!/usr/bin/python3
"""profile_torch_step.py - where the PyTorch peer's training step spends its time.

Runs the benchmark peer (tests/oracle/moe_ref.py: the same model, data, optimizer and
environment as `moe_ref.py train`, which bench/bench_small.sh times) for some warm-up steps,
then profiles a few steps with torch.profiler and prints the operators by self CPU time,
with the matrix products (aten::mm, bmm, baddbmm, addmm) summed per step. Compare with
`moetrain train --profile` and `perf record` of moetrain (docs/PERFORMANCE.md).

Usage: /usr/bin/python3 bench/profile_torch_step.py --data DIR [--config small]
           [--batch 8 --seq 512 --threads 2 --warmup 6 --steps 3 --autocast bf16|none]
(DIR: token shards, e.g. from `moetrain data math --out DIR`.)
"""
import argparse
import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", help="preset name in configs/ or a config.json path")
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=6, help="unprofiled steps first (PyTorch speeds up for several)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--autocast", choices=["bf16", "none"], default="bf16")
    args = sys.argv[1:]
    if args[:1] == ["train"]:  # the re-executed run (see below)
        args = args[1:]
    a = ap.parse_args(args)
    cfg = a.config if os.path.exists(a.config) else os.path.join(SRC, "configs", a.config + ".json")

    # moe_ref.py sets the peer's threading/BLAS/malloc environment when its command is
    # `train`: it re-executes the running script once (this one, with these arguments) with
    # the malloc tunables and the OpenMP OpenBLAS, as for the benchmark
    sys.argv = [sys.argv[0], "train"] + args + ["--threads", str(a.threads)]
    spec = importlib.util.spec_from_file_location("moe_ref", os.path.join(SRC, "tests", "oracle", "moe_ref.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)  # may re-exec this script with the peer's environment
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(a.threads)
    c = m.load_config(cfg)
    P = m.init_params(c, 1)
    for t in P.values():
        t.requires_grad_(True)
    params = list(P.values())
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    data = m.ShardSampler(a.data, "train", 1)

    def step():
        inp, tgt = data.batch(a.batch, a.seq)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            _, ce, bals, loss = m.forward(c, P, inp, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    for i in range(a.warmup):
        t0 = time.perf_counter()
        step()
        print(f"warm-up step {i + 1}: {time.perf_counter() - t0:.3f} s", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        wall = (time.perf_counter() - t0) / a.steps
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=20))
    total = sum(e.self_cpu_time_total for e in ka) / 1e6 / a.steps
    mm = sum(e.self_cpu_time_total for e in ka if e.key in ("aten::mm", "aten::bmm", "aten::baddbmm",
                                                             "aten::addmm")) / 1e6 / a.steps
    print(f"per profiled step: wall {wall:.3f} s (with the profiler's overhead), self CPU {total:.3f} s, "
          f"matrix products (mm, bmm, baddbmm, addmm) {mm:.3f} s = {100 * mm / total:.1f}%, "
          f"everything else {total - mm:.3f} s")


if __name__ == "__main__":
    main()
