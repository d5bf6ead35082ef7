#!/usr/bin/python3
"""grpo_ref.py - independent PyTorch recomputation of one `moetrain rl` step (GRPO) from the
checkpoint the step started from and the step's rollout dump (docs/FORMATS.md 8.1), per
the RL contract (/work/shared/spec/RL.md) and docs/FORMATS.md sections 7-8.

Usage: /usr/bin/python3 tests/oracle/grpo_ref.py --ckpt CKPT --dump step_NNNNNNNN.json
           [--grads grads.safetensors] [--dtype float32|float64] [--threads 2]
       /usr/bin/python3 tests/oracle/grpo_ref.py --jobs FILE   (many checks in one process, torch
           imported once: each line of FILE is PREFIX ARGS..., shell-quoted; a check's stdout,
           stderr and exit status go to PREFIX.out, PREFIX.err and PREFIX.rc)

The model is tests/oracle/moe_ref.py's forward (its own PyTorch implementation of the
model); nothing is shared with the C code. Each completion becomes one row of its own
(prompt + completion without its last token), so the balance loss of moe_ref's forward over
that row is exactly the row's balance over its fed positions. Checks, exit 1 on any failure:

  rewards      every reward recomputed from the tokens and the answer (RL.md "Reward")
  advantages   recomputed per group from the rewards (scale, uniform groups, drop)
  logp_behav   every recorded behaviour log-prob vs log softmax(logits / tau) at the token,
               within 1e-4 + 1e-4 * max|logits / tau| of its row (rows whose routing margin
               is <= 1e-5 are reported, not judged)
  logp_old     the trainer's recorded logp_old (an extra of the dump), same tolerance
  counts       kept completions and completion tokens (the denominators)
  pg / loss    sum over completion tokens of agg_t * w_t * pg_t, with w_t = min(exp(logp_old
               - logp_behav), is_cap), logp_old = logp (on-policy 1x1: ratio = 1); within
               1e-4 of sum agg_t * w_t * |A| (+1e-7). "loss" of the dump is this GRPO part
               (beta = 0, so loss = pg), the balance term is not in it
  kl           0 (beta = 0)
  clip         clipped token count (0 on-policy)
  balance      sum over MoE layers of (1 / completions) * sum over rows of the row's balance
               (FORMATS.md 1.4 over the row's fed positions), relative 1e-5
  gradients    (--grads) torch autograd (always fp64) of pg + alpha * balance (what the
               trainer minimises) vs the dumped gradient, per tensor ||g_c - g_ref|| < 1e-4 ||g_ref||,
               or below 1e-7 of the whole gradient's norm (fp32 rounding: a rarely routed expert's
               gradient can be 1e-6 of the total, its tokens' contributions cancelling); also
               the dump's grad_norm vs ||g_ref|| (relative 1e-4)
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_ref  # noqa: E402  (sets the threading environment before importing torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def resolve_ckpt(path):
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            name = f.read().strip()
        if "/" in name:
            raise ValueError(f"{latest}: bad line {name!r}")
        return os.path.join(path, name)
    raise ValueError(f"{path}: neither a checkpoint folder (config.json) nor a run folder (latest)")


def math_reward(tokens, answer, eot, penalty):
    """RL.md / FORMATS.md 7.3: 1 correct, 0 wrong, -penalty malformed."""
    if not tokens or tokens[-1] != eot:
        return -penalty
    body = tokens[:-1]
    if any(t < 0 or t > 255 for t in body):
        return -penalty
    return 1.0 if bytes(body) == answer.encode("utf-8") else 0.0


def advantages(rewards, scale):
    """per group, in double (FORMATS.md 7.4); returns (adv, uniform)."""
    G = len(rewards)
    mean = sum(rewards) / G
    if all(r == rewards[0] for r in rewards):
        return [0.0] * G, True
    a = [r - mean for r in rewards]
    if scale:
        s = math.sqrt(sum(x * x for x in a) / (G - 1))
        a = [x / (s + 1e-6) for x in a]
    return a, False


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


def recompute(c, P0, comps, ls, sm, Nc, Ntok, dt, fail):
    """Forward of every completion's row in dtype dt: the logp checks, the GRPO loss of the
    kept rows and the balance term (autograd graph kept in "total")."""
    P = {k: v.detach().to(dt).clone().requires_grad_(True) for k, v in P0.items()}
    tau = float(sm["temperature"])
    tau_eff = tau if tau > 0 else 1.0
    max_new = int(sm["max_new_tokens"])
    agg = ls["aggregation"]
    el, eh, cap = float(ls["eps_low"]), float(ls["eps_high"]), float(ls["is_cap"])
    pg = torch.zeros((), dtype=dt)
    bal = [torch.zeros((), dtype=dt) for _ in range(c.n_moe)]
    l1 = 0.0
    n_clip = 0
    worst = {"behav": (0.0, 0.0, None), "old": (0.0, 0.0, None)}  # (err / tol, err, row)
    max_err = {"behav": 0.0, "old": 0.0}
    low_margin = 0
    min_margin = float("inf")
    for i, x in enumerate(comps):
        pt, ct = x["prompt_tokens"], x["completion_tokens"]
        n = len(ct)
        if n < 1 or len(pt) < 1:
            fail(f"completion {i}: empty prompt or completion")
            continue
        row = torch.tensor([pt + ct[:-1]], dtype=torch.long)
        stats = []
        logits, _, bals, _ = moe_ref.forward(c, P, row, None, stats)
        z = logits[0] / tau_eff                                     # [fed, V]
        lp_all = F.log_softmax(z, dim=-1)
        pos = torch.arange(len(pt) - 1, len(pt) - 1 + n)
        lp = lp_all[pos, torch.tensor(ct)]                           # [n]
        margin = min([float(m[0].min()) for m in stats], default=float("inf"))
        min_margin = min(min_margin, margin)
        tol = 1e-4 + 1e-4 * float(z.detach().abs().max())
        for key in ("behav", "old"):
            ref = x["logp_behav"] if key == "behav" else x.get("logp_old")
            if ref is None or any(v is None for v in ref) or (key == "behav" and x.get("_stale")):
                continue
            err = float((lp.detach().double() - torch.tensor(ref, dtype=torch.float64)).abs().max())
            max_err[key] = max(max_err[key], err)
            if margin > 1e-5 and err / tol > worst[key][0]:
                worst[key] = (err / tol, err, i)
        if margin <= 1e-5:
            low_margin += 1
        if not x["kept"]:
            continue
        # the GRPO loss of the row's tokens
        A = float(x["advantage"])
        behav = torch.tensor(x["logp_behav"], dtype=dt)
        old = lp.detach()
        ratio = torch.exp(lp - old)
        w = torch.clamp(torch.exp(old - behav), max=cap)
        un, cl = ratio * A, torch.clamp(ratio, 1 - el, 1 + eh) * A
        clipped = cl < un
        n_clip += int(clipped.sum())
        pg_t = -torch.minimum(un, cl)
        if agg == "token-mean":
            wt = 1.0 / Ntok
        elif agg == "seq-mean-token-mean":
            wt = 1.0 / (n * Nc)
        elif agg == "seq-mean-token-sum-norm":
            wt = 1.0 / (max_new * Nc)
        else:
            fail(f"unknown aggregation {agg}")
            return None
        pg = pg + wt * (w * pg_t).sum()
        l1 += wt * float((w * abs(A)).sum())
        for l, b in enumerate(bals):
            bal[l] = bal[l] + b / Nc
    balance = torch.stack(bal).sum() if bal else torch.zeros((), dtype=dt)
    return {"P": P, "pg": pg, "balance": balance, "total": pg + float(ls["alpha"]) * balance, "l1": l1,
            "n_clip": n_clip, "worst": worst, "max_err": max_err, "low_margin": low_margin,
            "min_margin": min_margin}


def main(argv=None):
    ap = argparse.ArgumentParser(description="recompute a moetrain rl step from its rollout dump")
    ap.add_argument("--ckpt", help="checkpoint (or run folder) the step started from (default: the dump's)")
    ap.add_argument("--dump", help="rollout dump step_NNNNNNNN.json (required)")
    ap.add_argument("--grads", help="moetrain rl --dump-grads file of the same step")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", help="file of checks to run one after the other (see the usage above)")
    a = ap.parse_args(argv)
    if a.jobs:
        return moe_ref.run_jobs(a.jobs, a.threads, main, lambda v: "--jobs" in v)
    if not a.dump:
        ap.error("--dump is required")
    torch.set_num_threads(a.threads)
    dt = torch.float64 if a.dtype == "float64" else torch.float32

    with open(a.dump) as f:
        D = json.load(f)
    fails = []

    def fail(msg):
        fails.append(msg)
        print("FAIL: " + msg)

    if D.get("format") != "moetrain-rl-rollouts" or D.get("format_version") != 1:
        print(f"{a.dump}: not a version-1 moetrain rollout dump")
        return 1
    ls, sm, rec = D["loss_settings"], D["sampling"], D["recorded"]
    if ls.get("epochs", 1) != 1 or ls.get("mini_batches", 1) != 1 or ls.get("beta", 0) != 0 \
            or ls.get("routing_replay", False):
        print("grpo_ref: only the on-policy 1 x 1 step with beta = 0 and no routing replay is implemented")
        return 1
    if D.get("precision", "fp32") != "fp32":
        print(f"note: the run used {D['precision']} products: the contract's fp32 tolerances assume fp32")
    ck = resolve_ckpt(a.ckpt or D["checkpoint"])
    c, P = moe_ref.load_checkpoint(ck)
    alpha = float(ls["alpha"])
    if abs(alpha - c.alpha) > 1e-12 * max(1.0, abs(c.alpha)):
        print(f"note: the dump's alpha {alpha} differs from the config's aux_loss_alpha {c.alpha} (using the dump's)")
    tau = float(sm["temperature"])
    tau_eff = tau if tau > 0 else 1.0
    eot, max_new, G = int(sm["eot"]), int(sm["max_new_tokens"]), int(D["group"])
    comps = D["completions"]
    # a completion sampled by an older version (--max-staleness) has a logp_behav that this
    # checkpoint cannot reproduce: it enters the loss through w_t only
    for x in comps:
        x["_stale"] = any(v != D["version"] for v in x.get("version", []))
    nstale = sum(x["_stale"] for x in comps)
    if nstale:
        print(f"note: {nstale} completion(s) sampled by an older version: their logp_behav is used, not checked")
    print(f"grpo_ref: step {D['step']} (version {D['version']}) from {ck}: {len(comps)} completions "
          f"(groups of {G}), tau {tau}, top-k {sm['top_k']}, top-p {sm['top_p']}, max_new {max_new}, "
          f"{ls['aggregation']}, alpha {alpha}, {a.dtype}")

    # ---- rewards and advantages (recomputed from the tokens) ------------------------------
    if len(comps) % G:
        fail(f"{len(comps)} completions are not groups of {G}")
        return 1
    max_rew_err, max_adv_err = 0.0, 0.0
    for g0 in range(0, len(comps), G):
        grp = comps[g0:g0 + G]
        if len({x["prompt_index"] for x in grp}) != 1 or [x["sample_index"] for x in grp] != list(range(G)):
            fail(f"completions {g0}..{g0 + G - 1} are not one prompt's samples 0..{G - 1}")
            continue
        r = [math_reward(x["completion_tokens"], x["answer"], eot, float(ls["format_penalty"])) for x in grp]
        for x, ri in zip(grp, r):
            max_rew_err = max(max_rew_err, abs(x["reward"] - ri))
            if (len(x["completion_tokens"]) > 0 and x["completion_tokens"][-1] == eot) != x["stopped_eot"]:
                fail(f"completion {comps.index(x)}: stopped_eot disagrees with its tokens")
        adv, uniform = advantages(r, bool(ls["scale"]))
        kept = not (uniform and ls["drop_uniform_groups"])
        for x, ai in zip(grp, adv):
            max_adv_err = max(max_adv_err, abs(x["advantage"] - f32(ai)))
            if x["kept"] != kept:
                fail(f"prompt {x['prompt_index']}: kept {x['kept']}, expected {kept}")
    print(f"  rewards: max |diff| {max_rew_err:.3g}; advantages: max |diff| {max_adv_err:.3g}")
    if max_rew_err > 0:
        fail(f"rewards: max error {max_rew_err}")
    if max_adv_err > 1e-6:
        fail(f"advantages: max error {max_adv_err:.3g} > 1e-6")

    # ---- forward of every completion's row ------------------------------------------------
    kept_rows = [x for x in comps if x["kept"]]
    Nc = len(kept_rows)
    Ntok = sum(len(x["completion_tokens"]) for x in kept_rows)
    if Nc != rec["completions"] or Ntok != rec["completion_tokens"]:
        fail(f"counts: {Nc} completions / {Ntok} tokens kept, dump says {rec['completions']} / "
             f"{rec['completion_tokens']}")
    R = recompute(c, P, comps, ls, sm, Nc, Ntok, dt, fail)
    if R is None:
        return 1
    pg, balance, total, l1, n_clip = R["pg"], R["balance"], R["total"], R["l1"], R["n_clip"]
    worst, max_err, low_margin, min_margin = R["worst"], R["max_err"], R["low_margin"], R["min_margin"]

    # ---- the step's figures ---------------------------------------------------------------
    rows = []

    def num(name, ref, got, tol):
        if got is None:
            fail(f"{name}: not recorded")
            return
        err = abs(got - ref)
        rel = err / abs(ref) if ref != 0 else err
        ok = err <= tol
        rows.append((name, ref, got, err, rel, tol, ok))
        if not ok:
            fail(f"{name}: recomputed {ref:.9g}, dump {got:.9g} (|diff| {err:.3g} > {tol:.3g})")

    pgv = float(pg)
    num("pg", pgv, rec["pg"], 1e-4 * l1 + 1e-7)
    num("loss", pgv, rec["loss"], 1e-4 * l1 + 1e-7)
    num("kl", 0.0, rec["kl"], 0.0)
    num("clip_fraction", n_clip / Ntok if Ntok else 0.0, rec["clip_fraction"], 0.5 / max(Ntok, 1))
    bv = float(balance)
    num("balance", bv, rec.get("balance"), 1e-5 * abs(bv) + 1e-9)
    for key, what in (("behav", "logp_behav"), ("old", "logp_old")):
        r, err, at = worst[key]
        print(f"  {what}: max |diff| {max_err[key]:.3g}; worst err/tolerance {r:.3g}"
              + (f" (completion {at})" if at is not None else ""))
        if r > 1:
            fail(f"{what} of completion {at} differs by {err:.3g}, over its tolerance")
    print(f"  routing: min margin {min_margin:.3g}; {low_margin} row(s) with margin <= 1e-5 not judged")

    # ---- gradients ------------------------------------------------------------------------
    # the reference gradient is taken in fp64 (another pass when --dtype float32): fp32
    # autograd itself misses by > 1e-4 on a rarely routed expert's small gradient, where
    # the tokens' contributions of both signs cancel
    gmax = None
    if a.grads or rec.get("grad_norm") is not None:
        if dt != torch.float64:
            R = recompute(c, P, comps, ls, sm, Nc, Ntok, torch.float64, lambda msg: None)
        R["total"].backward()
        grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in R["P"].items()}
        gn = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        if rec.get("grad_norm") is not None:
            num("grad_norm", gn, rec["grad_norm"], 1e-4 * gn)
        if a.grads:
            Gd = moe_ref.st_read(a.grads)
            gmax, rmax, nfloor = (0.0, None), 0.0, 0
            for name, g in grads.items():
                if name not in Gd:
                    fail(f"gradient {name}: missing from {a.grads}")
                    continue
                if tuple(Gd[name].shape) != tuple(g.shape):
                    fail(f"gradient {name}: shape {tuple(Gd[name].shape)}, expected {tuple(g.shape)}")
                    continue
                gc = Gd.pop(name).double()
                e = moe_ref.relnorm(g, gc)
                diff, gt = float((gc - g.double()).norm()), float(g.double().norm())
                tol = max(1e-4 * gt, 1e-7 * gn)
                if e > gmax[0]:
                    gmax = (e, name)
                rmax = max(rmax, diff / tol if tol > 0 else (0.0 if diff == 0 else float("inf")))
                nfloor += e >= 1e-4 and diff <= tol
                if diff > tol:
                    fail(f"gradient {name}: relative norm error {e:.3g} >= 1e-4 (|diff| {diff:.3g}, "
                         f"||g|| {gt:.3g} of {gn:.3g} in all)")
            for name in Gd:
                fail(f"gradient {name}: not a parameter of the checkpoint")
            print(f"  gradients (vs fp64 autograd): {len(grads)} tensors, max relative norm error {gmax[0]:.3g} "
                  f"({gmax[1]}), max |diff| / tolerance {rmax:.3g}"
                  + (f"; {nfloor} tensor(s) over 1e-4 relative but within the 1e-7 x ||g|| floor" if nfloor else ""))
    print(f"  {'quantity':<14} {'recomputed':>16} {'dump':>16} {'|diff|':>10} {'rel':>10} {'tol':>10}")
    for name, ref, got, err, rel, tol, ok in rows:
        print(f"  {name:<14} {ref:>16.9g} {got:>16.9g} {err:>10.3g} {rel:>10.3g} {tol:>10.3g}"
              + ("" if ok else "  FAIL"))
    print(f"  (the trainer minimised pg + alpha * balance = {float(total):.9g})")
    if fails:
        print(f"grpo_ref: FAIL ({len(fails)} check(s))")
        return 1
    print("grpo_ref: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
