#!/usr/bin/env python3
"""Where a run's exposed expert-exchange time goes, from its traces (train --profile).

Usage: python3 bench/a2a_waits.py RUN_DIR [--from-step N]

Reads RUN_DIR/trace_rank*.json of one EP group (every rank of the run) and, over the
steps from N (default 2: the first is warm-up), prints per rank:
  - exposed: the a2a.blocked spans, the part of each wait for rows after the other fiber
    handed the thread back (all of a wait outside the overlapped schedule), as a share of
    the steps' time; split into
      wire       the emulated link's sleep (train --wire): the rows had not arrived yet,
      peer late  before the last peer reached its own wait of the same exchange (it was still
                 computing: load imbalance, or a longer turn of its other fiber),
      in MPI     the rest, with every peer waiting too (MPI's copies and its overheads);
  - the same by exchange: the pass (fwd./bwd. span) and the MoE phase (moe.* span) it is in;
  - the part inside the overlapped schedule's pairs (overlap.pair spans: the forward of one
    micro-batch and the backward of another as two fibers) and the rest: the pipeline's fill
    and drain (the first forward and the last backward of a step, which nothing can pair),
    or all of it without --overlap pipe. (The trainer's profile gives the steady state's
    exposure, a2a_paired_s / paired_s, which also counts the exchange's calls outside the
    blocked waits.)
The ranks' traces line up by their clock origin (otherData.clock_origin_s, one
CLOCK_MONOTONIC for the machine); the k-th wait of every rank is the same exchange, as
every rank issues the exchanges in one order (parallel/a2a.c).
"""
import glob
import json
import os
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        t = json.load(f)
    origin = t.get("otherData", {}).get("clock_origin_s")
    if origin is None:
        sys.exit(f"a2a_waits: {path} has no clock origin (a trace from before this tool)")
    ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    for e in ev:
        e["a"] = e["ts"] + origin * 1e6
        e["b"] = e["a"] + e["dur"]
    return ev


def enclosing(ev):
    """for every a2a.blocked span, the names of the fwd./bwd. and moe.* spans around it (same track)"""
    out = {}
    by_tid = defaultdict(list)
    for e in ev:
        n = e["name"]
        if n == "a2a.blocked" or n.startswith(("fwd.", "bwd.", "moe.")):
            by_tid[e["tid"]].append(e)
    for spans in by_tid.values():
        spans.sort(key=lambda e: (e["a"], -e["dur"]))
        stack = []
        for e in spans:
            # spans that ended before e began (their times are rounded to 0.1 us: a span that
            # follows another may seem to start inside it)
            while stack and stack[-1]["b"] <= e["a"] + 0.2:
                stack.pop()
            if e["name"] == "a2a.blocked":
                top = next((s["name"] for s in stack if s["name"].startswith(("fwd.", "bwd."))), "?")
                moe = next((s["name"] for s in reversed(stack) if s["name"].startswith("moe.")), "?")
                out[id(e)] = f"{top} / {moe}"
            else:
                stack.append(e)
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    run, first = args[0], 2
    if "--from-step" in args:
        first = int(args[args.index("--from-step") + 1])
    paths = sorted(glob.glob(os.path.join(run, "trace_rank*.json")), key=lambda p: int(p.rsplit("rank", 1)[1][:-5]))
    if len(paths) < 1:
        sys.exit(f"a2a_waits: no trace_rank*.json in {run} (train --profile writes them)")
    R = [load(p) for p in paths]
    blocked = [sorted((e for e in ev if e["name"] == "a2a.blocked"), key=lambda e: e["a"]) for ev in R]
    wires = [sorted((e for e in ev if e["name"] == "a2a.wire"), key=lambda e: e["a"]) for ev in R]
    paired = len(R) > 1 and len({len(b) for b in blocked}) == 1
    if len(R) > 1 and not paired:
        print("a2a_waits: the ranks' wait counts differ (not one EP group?): no peer split")
    for r, ev in enumerate(R):
        steps = sorted((e for e in ev if e["name"] == "step"), key=lambda e: e["a"])
        if len(steps) < first:
            sys.exit(f"a2a_waits: rank {r} traced {len(steps)} steps, fewer than --from-step {first}")
        t0 = steps[first - 1]["a"]
        total = sum(s["dur"] for s in steps[first - 1:])
        where = enclosing(ev)
        wi = wires[r]
        pairs = sorted(((e["a"], e["b"]) for e in ev if e["name"] == "overlap.pair" and e["a"] >= t0))
        pair_time = sum(b - a for a, b in pairs)
        pi, in_pairs = 0, 0.0
        parts = defaultdict(float)
        by = defaultdict(lambda: [0, 0.0, 0.0])
        j = 0
        for k, e in enumerate(blocked[r]):
            if e["a"] < t0:
                continue
            while j < len(wi) and wi[j]["b"] < e["a"]:
                j += 1
            w = sum(x["dur"] for x in wi[j:j + 2] if x["tid"] == e["tid"] and x["a"] >= e["a"] and x["b"] <= e["b"] + 1)
            late = 0.0
            if paired:
                peer = max(blocked[q][k]["a"] for q in range(len(R)) if q != r)
                late = max(0.0, min(peer, e["b"]) - e["a"])
                late = min(late, e["dur"] - w)
            parts["wire"] += w
            parts["peer late"] += late
            parts["in MPI"] += e["dur"] - w - late
            while pi < len(pairs) and pairs[pi][1] < e["a"]:
                pi += 1
            if pi < len(pairs) and pairs[pi][0] <= e["a"] + 0.2 and e["b"] <= pairs[pi][1] + 0.2:
                in_pairs += e["dur"]
            b = by[where.get(id(e), "?")]
            b[0] += 1
            b[1] += e["dur"]
            b[2] += w
        exp = sum(parts.values())
        split = ", ".join(f"{n} {100 * parts[n] / total:.2f}%" for n in ("wire", "peer late", "in MPI") if n != "peer late" or paired)
        print(f"rank {r}: exposed {100 * exp / total:.2f}% of steps {first}-{len(steps)} ({total / 1e6:.3f} s): {split}")
        if pairs:
            print(f"    inside the overlapped pairs ({100 * pair_time / total:.1f}% of the steps): "
                  f"{100 * in_pairs / pair_time:.2f}% of their time; outside them (the fill and drain): "
                  f"{100 * (exp - in_pairs) / total:.2f}% of the steps")
        for name, (n, d, w) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"    {name:32s} {n:5d} waits  {100 * d / total:5.2f}%  (wire {100 * w / total:.2f}%)")


if __name__ == "__main__":
    main()
