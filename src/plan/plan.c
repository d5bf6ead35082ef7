/* plan/plan.c — layout evaluation and search (see plan.h).
 *
 * Modelling choices, in one place (docs/PLAN.md explains them):
 *  - Megatron-style TP with sequence parallelism: every per-token tensor and GEMM is split
 *    over TP; each TP collective is an all-gather or reduce-scatter of a [tokens, d]
 *    tensor inside a node (TP never leaves a node), not overlapped with compute.
 *  - Routed experts with ETP = 1 over an EP group of consecutive ranks (inside a node
 *    first). The busiest EP rank (imbalance factor) sets the pace of every MoE layer, and
 *    the all-to-alls are not overlapped (no overlapped forward/backward schedule yet).
 *  - Ranks are ordered TP (innermost), then DP, then PP (outermost), as in Megatron-LM, so
 *    pipeline neighbours are on different nodes unless TP x DP fits in one node.
 *  - Mixed precision: bf16 weights, fp32 gradients, fp32 master weights + AdamW moments
 *    (12 bytes a parameter) sharded over the (expert-)DP group with the distributed
 *    optimizer. Gradients are reduce-scattered per chunk as soon as its last backward is
 *    done (overlapping the rest of the cool-down); the parameter all-gather overlaps the
 *    next step's first forward.
 *  - Compute time is a roofline per unit: GEMM FLOPs at an efficiency that depends on the
 *    GEMM's size, attention FLOPs at the attention efficiency, element-wise bytes at the
 *    memory efficiency; backward = 2x forward compute; full recompute adds a forward.
 *    The trainer's --bf16 (settings gemm_bf16) changes the GEMMs (the calibrated bf16 GEMM's
 *    peak and curve) and attention (its calibrated bf16 efficiency, when the file has it). */
#include "plan/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "parallel/schedule.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "plan/sim.h"
#include "train/optimizer.h" /* MT_OPT_INFLIGHT_BYTES */

const char *const mt_plan_reason_name[MT_PLAN_NREASONS] = {
    "ok", "TP: heads, dense FFN or sequence not divisible, or TP larger than a node",
    "TP x PP does not divide the devices", "EP: experts or DP x TP not divisible",
    "global batch not divisible (DP x mb, x PP if interleaved) or > 65536 micro-batches",
    "fewer layers than virtual stages, or VPP without PP", "recompute policy the trainer lacks",
    "out of device memory"};

static const char *const a2a_name[] = {"flat", "hier"};
static const char *const split_name[] = {"even", "balanced"};

void mt_plan_settings_default(mt_plan_settings *s) {
    memset(s, 0, sizeof *s);
    s->seq = 8192;
    s->elt = 2;
    s->dist_opt = 1;
    s->imbalance = 1.2;
    s->threads = 1;
    s->bucket_bytes = 25.0 * 1048576.0;
    s->decode_seqs = 64;
}

/* Everything that does not depend on the layout, computed once per search. */
typedef struct {
    const mt_config *c;
    const mt_cluster *cl;
    const mt_plan_settings *st;
    int nu;                 /* units: embed, L layers, MTP, head */
    mt_unit_cost *u;
    double model_flops;     /* per token, MFU numerator */
} ctx;

static void ctx_init(ctx *x, const mt_config *c, const mt_cluster *cl, const mt_plan_settings *st) {
    x->c = c;
    x->cl = cl;
    x->st = st;
    x->nu = mt_cost_units(c, st->seq, st->elt, NULL);
    x->u = mt_xcalloc((size_t)x->nu, sizeof *x->u);
    mt_cost_units(c, st->seq, st->elt, x->u);
    x->model_flops = mt_cost_model_flops_per_token(c, st->seq);
    MT_ASSERT(!st->gemm_bf16 || cl->gemm_bf16_peak > 0); /* the caller checks the cluster file */
}

/* Ring all-gather / reduce-scatter of a `bytes` tensor over g ranks. */
static double ring(double bytes, int g, double bw, double lat) {
    return g <= 1 ? 0 : (g - 1.0) / g * bytes / bw + (g - 1.0) * lat;
}

/* a group of g ranks `stride` apart spans more than one node */
static int spans_nodes(const mt_cluster *cl, int g, int stride) { return (double)g * stride > cl->per_node; }

/* the link a group of g ranks `stride` apart moves on: the node's, unless it spans several */
static void group_link(const mt_cluster *cl, int g, int stride, double *bw, double *lat) {
    int in = !spans_nodes(cl, g, stride);
    *bw = in ? cl->intra_bw : cl->inter_bw;
    *lat = in ? cl->intra_lat : cl->inter_lat;
}

/* Expected number of other nodes a token's k experts live on, for an EP group over nn
 * nodes (E/nn experts each), experts drawn uniformly without replacement; group-limited
 * and MoGE routing with one group per node pin it. */
static double remote_nodes(const mt_config *c, int nn) {
    if (nn <= 1) return 0;
    const int E = c->n_routed_experts, K = c->num_experts_per_tok;
    if (c->n_group == nn && c->topk_method == MT_TOPK_GROUP_LIMITED)
        return c->topk_group * (nn - 1.0) / nn;
    if (c->n_group == nn && c->topk_method == MT_TOPK_MOGE) return nn - 1.0;
    double none = 1; /* P(a given node holds none of the k experts) */
    for (int i = 0; i < K; i++) none *= (double)(E - E / nn - i) / (E - i);
    return (nn - 1.0) * (1 - none);
}

/* One all-to-all (dispatch or combine) of n tokens per device, k copies each. */
static double a2a_time(const ctx *x, const mt_layout *l, double n) {
    const mt_cluster *cl = x->cl;
    const double C = x->c->hidden_size, K = x->c->num_experts_per_tok, imb = x->st->imbalance;
    const int ep = l->ep, local = ep < cl->per_node ? ep : cl->per_node, nn = (ep + local - 1) / local;
    if (ep <= 1) return 0;
    const double send = n * K * C * x->st->elt * imb;      /* bytes of (token, slot) pairs */
    if (nn <= 1 || l->a2a == MT_A2A_FLAT) {
        double intra = send * (local - 1.0) / ep, inter = send * (ep - (double)local) / ep;
        double t = fmax(intra / cl->intra_bw, inter / cl->inter_bw);
        return t + cl->intra_lat + (nn > 1 ? cl->inter_lat : 0);
    }
    /* hierarchical: a token crosses to each remote node once, then fans out inside it */
    double inter = n * C * x->st->elt * imb * remote_nodes(x->c, nn);
    double intra = send * (local - 1.0) / local;
    return inter / cl->inter_bw + intra / cl->intra_bw + cl->inter_lat + cl->intra_lat;
}

/* train --wire: the MoE layer's exchanges when the EP group spans nodes, each message on
 * its sender's one outgoing link (lat + bytes / bw). An exchange is done when both its
 * directions are: the rows bound for the busiest rank's experts (imb times the mean's, sent
 * on the other ranks' links) and those they send back set its time. The forward sends its
 * tokens' rows with their routing metadata (six int32 a row), then its experts' rows back
 * (combine); the backward the output gradients' rows to the experts (gather), then the
 * input gradients' rows back with the gate gradients beside them (K floats a row;
 * parallel/ep.c). rows: one exchange's rows on the wire, the four's extra bytes spread
 * evenly (6 + K bytes a row); lat: its latency. Returns 0 (all zero) when no wire is crossed. */
typedef struct { double rows, lat; } wire_x;
static int wire_a2a(const ctx *x, const mt_layout *l, double n, wire_x *w) {
    const mt_cluster *cl = x->cl;
    const double C = x->c->hidden_size, K = x->c->num_experts_per_tok, imb = x->st->imbalance;
    const int ep = l->ep, local = ep < cl->per_node ? ep : cl->per_node, nn = (ep + local - 1) / local;
    memset(w, 0, sizeof *w);
    if (ep <= 1 || nn <= 1) return 0;
    const double rows = l->a2a == MT_A2A_HIER ? n * remote_nodes(x->c, nn) : n * K * (ep - (double)local) / ep;
    const double bw = x->st->wire_bw, lat = x->st->wire_lat;
    w->rows = imb * rows * (C * 4 + 6 + K) / bw;
    w->lat = lat;
    return 1;
}

/* train --wire: g bytes of buckets over a ring of S ranks on the rank's link, each byte
 * `passes` times (2: a sum, 1: a reduce-scatter or all-gather) at (S-1)/S, a latency per ring
 * step and bucket (dist.c mt_coll). Unless blocking (--overlap off) the buckets travel
 * behind `hide` seconds of compute, except those of the `last` bytes, final only when the
 * backward ends / needed before the forward starts (the first layer's and the embedding's,
 * rounded up by a bucket). */
static double wire_buckets(const mt_plan_settings *st, double g, int S, int passes, double last, double hide) {
    const double hops = (double)passes * (S - 1);
    const double t = hops / S * g / st->wire_bw + hops * ceil(g / st->bucket_bytes) * st->wire_lat;
    return st->blocking ? t : fmax(t * fmin(1, (last + st->bucket_bytes) / g), t - hide);
}

/* the overlapped schedule (plan --overlap pipe, mt_schedule_overlap) pairs passes when a
 * rank has more than the forwards it runs ahead */
static int overlapped(const mt_plan_settings *st, int M) { return st->overlap && M > 1; }

/* comp/tp/a2a: fwd + bwd. A MoE unit's pieces (the overlapped schedule,
 * plan/sim.h): the forward's compute before the dispatch (pre), the experts', the shared
 * experts'; the backward's shared experts', experts' before and after the input gradients
 * leave, and the rest (route and attention); each of the four exchanges' copy (x_copy),
 * rows on the wire (x_wire, x_lat) and full recompute's exchanges again (b_ra). */
typedef struct {
    double fwd, bwd, comp, tp, a2a;
    double f_pre, f_exp, f_sh, b_sh, b_exp0, b_exp1, b_post;
    double x_copy, x_wire, x_lat, b_ra;
} unit_time;

/* Seconds of `flops` FLOPs of GEMM calls of `call` FLOPs each: the training dtype's peak
 * and curve, or (trainer --bf16) the bf16 GEMM's. */
static double gemm_time(const ctx *x, double flops, double call) {
    const mt_cluster *cl = x->cl;
    if (x->st->gemm_bf16) return flops / (cl->gemm_bf16_peak * mt_cluster_gemm_eff_bf16(cl, call));
    return flops / (cl->peak_bf16 * mt_cluster_gemm_eff(cl, call));
}

static void unit_times(const ctx *x, const mt_layout *l, const mt_unit_cost *u, unit_time *t) {
    const mt_config *c = x->c;
    const mt_cluster *cl = x->cl;
    /* the busiest EP rank's share of the routed rows sets the pace; with every expert on
     * each rank (EP 1) the rows are the mean */
    const double imb = l->ep > 1 ? x->st->imbalance : 1.0, Ntok = (double)l->mb * x->st->seq, n = Ntok / l->tp;
    const double peak = cl->peak_bf16; /* the training dtype's (attention in fp32) */
    double tg = gemm_time(x, u->f_gemm * n, n * u->gemm_width);
    /* moetrain's TP: MLA's latent projections run on all the gathered tokens of each rank */
    if (x->st->trainer && l->tp > 1) tg += gemm_time(x, u->f_gemm_tp_rep * (Ntok - n), Ntok * u->gemm_width);
    /* attention: in bf16 mode its products run on bf16 pairs (the calibrated rate when the
     * file has it) */
    double ta = x->st->gemm_bf16 && cl->eff_att_bf16 > 0 ? u->f_att * n / (cl->gemm_bf16_peak * cl->eff_att_bf16)
                                                          : u->f_att * n / (peak * cl->eff_att);
    double te = 0;
    /* the busiest rank's extra rows sit on its hot experts, not in uniformly larger calls:
     * each call's efficiency is the mean expert's (its rows: n K ep / E) */
    const double erows = n * c->num_experts_per_tok * l->ep / c->n_routed_experts;
    if (u->moe) {
        te = gemm_time(x, u->f_expert * n * imb, erows * 2.0 * c->hidden_size * c->moe_intermediate_size);
    }
    double tm = (u->mem_tok * n + u->mem_expert_tok * n * imb) / (cl->mem_bw * cl->eff_mem);
    double tpc = u->tp_colls * ring(Ntok * c->hidden_size * x->st->elt, l->tp, cl->intra_bw, cl->intra_lat);
    double a2a = u->moe ? 2 * a2a_time(x, l, n) : 0;
    /* calibrated: the trainer's exchange, half each way */
    if (u->moe && l->ep > 1 && (cl->ep_layer_s > 0 || cl->ep_byte_s > 0))
        a2a = 0.5 * (cl->ep_layer_s + cl->ep_byte_s * n * c->num_experts_per_tok * c->hidden_size * x->st->elt * imb);
    double a2a_b = a2a; /* the backward's exchanges (the forward's: a2a) */
    const double copy = 0.5 * a2a; /* one exchange's, without the wire */
    wire_x wx;
    if (u->moe && x->st->wire_bw > 0 && wire_a2a(x, l, n, &wx)) {
        a2a = fmax(a2a, 2 * (wx.rows + wx.lat));
        a2a_b = fmax(a2a_b, 2 * (wx.rows + wx.lat));
    } else
        memset(&wx, 0, sizeof wx);
    double cf = tg + ta + te + tm, cb = 2 * (tg + ta + te + tm);
    int layer = u->kind == MT_UNIT_DENSE || u->kind == MT_UNIT_MOE || u->kind == MT_UNIT_MTP;
    double rf = 0, rtp = 0, ra = 0;
    if (layer && l->rc == MT_RECOMPUTE_FULL) { rf = cf; rtp = tpc; ra = a2a; }
    if (layer && l->rc == MT_RECOMPUTE_NONE) rf = 0.25 * tm; /* SwiGLU / gather re-done */
    if (layer && l->rc == MT_RECOMPUTE_SELECTIVE) {
        /* and the output projection and the experts' gate|up GEMMs */
        rf = 0.25 * tm + gemm_time(x, u->f_rc_gemm * n, n * u->gemm_width);
        if (u->moe) {
            rf += gemm_time(x, u->f_rc_expert * n * imb, erows * 4.0 * c->hidden_size * c->moe_intermediate_size);
        }
    }
    t->fwd = cf + tpc + a2a;
    t->bwd = cb + tpc + a2a_b + rf + rtp + ra;
    t->comp = cf + cb + rf;
    t->tp = 2 * tpc + rtp;
    t->a2a = a2a + a2a_b + ra;
    /* the pieces: GEMM and memory time split by where they run */
    const double ts = u->moe ? gemm_time(x, u->f_shared * n, n * u->f_shared / 6) : 0;
    const double tme = u->mem_expert_tok * n * imb / (cl->mem_bw * cl->eff_mem);
    t->f_exp = te + tme;
    t->f_sh = ts;
    t->f_pre = cf + tpc - t->f_exp - t->f_sh;
    t->b_sh = 2 * ts;
    t->b_exp0 = 2 * (te + tme) * 2 / 3; /* data gradients and the down projection's weights */
    t->b_exp1 = 2 * (te + tme) / 3;     /* gate|up's weight gradient, while the rows travel */
    t->b_post = cb + tpc + rf + rtp - t->b_sh - t->b_exp0 - t->b_exp1;
    /* the trainer's exchange on one machine is a copy MPI makes inside the wait (never
     * hidden) and the wire's rows travel; a cluster's exchange moves on its links while the
     * devices compute (the link model's seconds, all of them hideable) */
    t->x_copy = x->st->trainer ? copy : 0;
    t->x_wire = x->st->trainer ? wx.rows : copy;
    t->x_lat = wx.lat;
    t->b_ra = ra; /* full recompute: the forward's exchanges again, in place */
}

/* Layers per virtual stage. first/last: fixed costs of the first stage (embedding) and of
 * the last (MTP + head); w[L]: cost of each layer. */
static int split_fits(const double *w, int L, int S, double first, double last, double B, int fair,
                      int *cnt) {
    if (S == 1) {
        if (cnt) cnt[0] = L;
        return 1;
    }
    /* Fill stages from the last one backwards. The first and last stages may end up with
     * no decoder layer (their embedding or head + MTP can be a stage's worth of work, as
     * in Llama 3's and Pangu's uneven splits); every middle stage gets at least one. */
    int j = S - 1, k = 0;
    double load = last;
    for (int i = L - 1; i >= 0; i--) {
        /* close stage j if the layer does not fit, if the middle stages before it need
         * the rest, or (fair) once it has its share of the layers left, so that the stages
         * the bottleneck does not constrain come out even */
        int share = (i + 1 + k + j) / (j + 1);
        int must = j > 1 && i < j - 1;
        if (j > 0 && (k > 0 || j == S - 1) && (load + w[i] > B || must || (fair && k >= share))) {
            if (k == 0 && j < S - 1) return 0;
            if (cnt) cnt[j] = k;
            j--;
            k = 0;
            load = j == 0 ? first : 0;
        }
        load += w[i];
        k++;
        if (load > B) return 0;
    }
    if (j > 1 || first > B) return 0;
    if (cnt) {
        cnt[j] = k;
        if (j == 1) cnt[0] = 0;
    }
    return 1;
}

static void split_layers(const mt_layout *l, const double *w, int L, int S, double first, double last,
                         int *cnt) {
    if (l->split == MT_SPLIT_EVEN || S == 1) {
        int base = L / S, rem = L % S, lo = (S - rem) / 2; /* extra layers in the middle */
        for (int s = 0; s < S; s++) cnt[s] = base + (s >= lo && s < lo + rem);
        return;
    }
    double lo = 0, hi = first + last;
    for (int i = 0; i < L; i++) {
        hi += w[i];
        if (w[i] > lo) lo = w[i];
    }
    for (int it = 0; it < 60 && hi - lo > 1e-6 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        if (split_fits(w, L, S, first, last, mid, 0, NULL)) hi = mid;
        else lo = mid;
    }
    int ok = split_fits(w, L, S, first, last, hi, 1, cnt) || split_fits(w, L, S, first, last, hi, 0, cnt);
    MT_ASSERT(ok);
}

/* The divisibility rules of a layout (l->dp is derived here); *m gets the micro-batches. */
static int check_layout(const ctx *x, mt_layout *l, int *m) {
    const mt_config *c = x->c;
    const int H = c->num_attention_heads, E = c->n_routed_experts;
    const int gqa = strcmp(c->attention_type, "mla") != 0;
    const int dense = c->n_routed_experts == 0 || c->first_k_dense_replace > 0;
    /* sequence parallelism (always planned) splits a sequence over TP; the dense FFN is
     * column-split */
    if (l->tp < 1 || H % l->tp || (gqa && c->num_key_value_heads % l->tp) || l->tp > x->cl->per_node ||
        x->st->seq % l->tp || (dense && c->intermediate_size % l->tp))
        return MT_PLAN_BAD_TP;
    if (l->pp < 1 || l->vpp < 1 || x->st->devices % (l->tp * l->pp)) return MT_PLAN_BAD_DEVICES;
    l->dp = x->st->devices / (l->tp * l->pp);
    if (l->ep < 1 || (E == 0 && l->ep != 1) || (E > 0 && (E % l->ep || (l->dp * l->tp) % l->ep)))
        return MT_PLAN_BAD_EP;
    const long long per = (long long)l->dp * l->mb;
    if (l->mb < 1 || x->st->global_seqs % per || (l->vpp > 1 && (x->st->global_seqs / per) % l->pp) ||
        x->st->global_seqs / per > MT_PLAN_MAX_MICRO)
        return MT_PLAN_BAD_BATCH;
    *m = (int)(x->st->global_seqs / per);
    if (l->pp * l->vpp > c->num_hidden_layers || l->pp * l->vpp > MT_PLAN_MAX_STAGES || (l->vpp > 1 && l->pp < 2) ||
        l->vpp > 255)
        return MT_PLAN_BAD_SPLIT;
    if (x->st->trainer && !mt_recompute_trainer(l->rc)) return MT_PLAN_BAD_RC;
    return MT_PLAN_OK;
}

/* The KV cache of decoding with the layout's split (res->layers known): the pipeline rank
 * holding the most decoder layers, the rollout engine's cache widths (model/sizes.h). */
static void kv_cache(const ctx *x, mt_plan_result *res) {
    const mt_config *c = x->c;
    const mt_plan_settings *st = x->st;
    const int P = res->l.pp, S = res->nstages, tp = res->l.tp, L = c->num_hidden_layers;
    res->kv_seqs = st->decode_seqs;
    res->kv_positions = st->decode_positions > 0 ? st->decode_positions : st->seq;
    res->kv_elt = st->elt;
    res->kv_rank = 0;
    res->kv_layers = 0;
    for (int r = 0; r < P; r++) {
        int n = 0;
        for (int s = r; s < S; s += P) n += res->layers[s];
        if (n > res->kv_layers) res->kv_layers = n, res->kv_rank = r;
    }
    const double B = res->kv_seqs, T = res->kv_positions;
    const int mla = mt_config_is_mla(c);
    int kw, vw;
    mt_kv_widths(c, 1, &kw, &vw);
    res->kv_width = kw + vw;
    mt_kv_widths(c, 0, &kw, &vw);
    res->kv_width_unabs = kw + vw;
    res->kv_mla = mla;
    /* absorbed MLA caches one latent row for all heads: TP cannot split it */
    res->kv_model = mt_kv_cache_bytes(c, 1, L, B, T, st->elt);
    res->kv_dev = mt_kv_cache_bytes(c, 1, res->kv_layers, B, T, st->elt) / (mla ? 1 : tp);
    res->kv_model_unabs = mt_kv_cache_bytes(c, 0, L, B, T, st->elt);
    res->kv_dev_unabs = mt_kv_cache_bytes(c, 0, res->kv_layers, B, T, st->elt) / tp;
}

/* The overlapped schedule's pieces (plan/sim.h) of the units [u0, u1) of a stage, as the
 * trainer hands over (parallel/a2a.c xfer_finish, model/moe_block.c): the forward at the
 * dispatch's rows (its metadata travels with them) and at the combine (after the shared
 * experts), the backward at the gather (after the shared experts) and at the input
 * gradients (after gate|up's weight gradient; the gate gradients travel with them). The trainer runs the head's backward inside the forward (fused with the loss).
 * pf / pb hold 2 pieces per unit. */
static void stage_passes(const ctx *x, const unit_time *ut, int u0, int u1, mt_sim_piece *pf, mt_sim_piece *pb,
                         mt_sim_pass *f, mt_sim_pass *b) {
    int n = 0;
    double c = 0;
    for (int i = u0; i < u1; i++) {
        const unit_time *t = &ut[i];
        if (!x->u[i].moe) {
            c += t->fwd + (x->st->trainer && x->u[i].kind == MT_UNIT_HEAD ? t->bwd : 0);
            continue;
        }
        pf[n++] = (mt_sim_piece){c + t->f_pre, 0, t->x_wire, t->x_lat, t->x_copy, 0};
        pf[n++] = (mt_sim_piece){t->f_exp, 0, t->x_wire, t->x_lat, t->x_copy, t->f_sh};
        c = 0;
    }
    *f = (mt_sim_pass){pf, n, c, 0};
    n = 0, c = 0;
    double in = 0;
    for (int i = u1 - 1; i >= u0; i--) {
        const unit_time *t = &ut[i];
        if (!x->u[i].moe) {
            c += x->st->trainer && x->u[i].kind == MT_UNIT_HEAD ? 0 : t->bwd;
            continue;
        }
        pb[n++] = (mt_sim_piece){c, in, t->x_wire, t->x_lat, t->x_copy, t->b_sh};
        pb[n++] = (mt_sim_piece){t->b_exp0, 0, t->x_wire, t->x_lat, t->x_copy, t->b_exp1};
        c = t->b_post, in = t->b_ra;
    }
    *b = (mt_sim_pass){pb, n, c, in};
}

/* The evaluation; sched may be NULL (made here). bound > 0: skip the simulation when the
 * busiest rank's compute alone reaches it (res->step is then that lower bound). Returns 1
 * if simulated. */
static int eval_layout(const ctx *x, const mt_schedule *sched, const mt_layout *lin, mt_plan_result *res,
                       double bound) {
    const mt_config *c = x->c;
    const mt_cluster *cl = x->cl;
    const mt_plan_settings *st = x->st;
    memset(res, 0, sizeof *res);
    mt_layout *l = &res->l;
    *l = *lin;
    res->gemm_bf16 = st->gemm_bf16;
    res->reason = check_layout(x, l, &res->m);
    if (res->reason != MT_PLAN_OK) return 0;
    const int Lyr = c->num_hidden_layers, E = c->n_routed_experts;
    const int P = l->pp, V = l->vpp, S = P * V, M = res->m;
    res->nstages = S;

    /* unit times, then the split */
    unit_time *ut = mt_xmalloc((size_t)x->nu * sizeof *ut);
    for (int i = 0; i < x->nu; i++) unit_times(x, l, &x->u[i], &ut[i]);
    double *w = mt_xmalloc((size_t)Lyr * sizeof *w);
    for (int i = 0; i < Lyr; i++) w[i] = ut[1 + i].fwd + ut[1 + i].bwd;
    double first = ut[0].fwd + ut[0].bwd, last = 0;
    for (int i = 1 + Lyr; i < x->nu; i++) last += ut[i].fwd + ut[i].bwd;
    split_layers(l, w, Lyr, S, first, last, res->layers);
    kv_cache(x, res);

    /* per virtual stage: its units [u0, u1) */
    const int nu = x->nu;
    double *fwd = mt_xcalloc((size_t)S * 6, sizeof(double));
    double *bwd = fwd + S, *sync = fwd + 2 * S, *acts = fwd + 3 * S, *comp = fwd + 4 * S, *tpa = fwd + 5 * S;
    double *a2a = mt_xcalloc((size_t)S * 3, sizeof(double));
    double *pdense = a2a + S, *pexp = a2a + 2 * S;
    double *work = mt_xcalloc((size_t)P * 3, sizeof(double));
    /* per stage, what its first layer (and the embedding) holds and its forward: their
     * buckets are the last to be reduced and the first the next forward waits for */
    double *first_pd = mt_xcalloc((size_t)S * 3, sizeof(double)), *first_pe = first_pd + S, *first_f = first_pd + 2 * S;
    double *moe_on = work + P, *opt = work + 2 * P;
    const double imb = st->imbalance, n = (double)l->mb * st->seq / l->tp;
    const int edp = E > 0 ? l->dp * l->tp / l->ep : l->dp;
    int start = 1;
    for (int s = 0; s < S; s++) {
        double pfirst[2] = {0, 0}, bfirst = 0; /* the stage's first layer (and the embedding) */
        double bwire = 0;                      /* the link time of the backward's expert exchanges */
        int u0 = s == 0 ? 0 : start, u1 = start + res->layers[s];
        if (s == S - 1) u1 = nu;
        start += res->layers[s];
        const int r = s % P;
        for (int i = u0; i < u1; i++) {
            const mt_unit_cost *u = &x->u[i];
            fwd[s] += ut[i].fwd;
            bwd[s] += ut[i].bwd;
            comp[s] += ut[i].comp;
            tpa[s] += ut[i].tp;
            a2a[s] += ut[i].a2a;
            bwire += 2 * ut[i].x_wire;
            const double ud = st->trainer ? u->p_tp_trainer / l->tp + (u->p_tp - u->p_tp_trainer) + u->p_rep
                                          : u->p_tp / l->tp + u->p_rep,
                         ue = E > 0 ? u->p_expert / l->ep : 0;
            pdense[s] += ud;
            pexp[s] += ue;
            if (i <= u0 + (s == 0)) {
                pfirst[0] += ud;
                pfirst[1] += ue;
                bfirst += ut[i].bwd;
                first_f[s] += ut[i].fwd;
            }
            const int is_layer = u->kind == MT_UNIT_DENSE || u->kind == MT_UNIT_MOE || u->kind == MT_UNIT_MTP;
            const int rc = is_layer ? l->rc : MT_RECOMPUTE_NONE;
            acts[s] += (u->act_tok[rc] + u->act_expert_tok[rc] * imb) * n;
            double wk = fmax(u->work_tok + u->work_expert_tok * imb, u->work_att_tok) * n;
            if (rc == MT_RECOMPUTE_SELECTIVE) wk += (u->work_rc_tok + u->work_rc_expert_tok * imb) * n;
            if (rc == MT_RECOMPUTE_FULL)
                wk += (u->act_tok[MT_RECOMPUTE_KEEP_ALL] + u->act_expert_tok[MT_RECOMPUTE_KEEP_ALL] * imb) * n;
            if (wk > work[r]) work[r] = wk;
            if (u->moe) moe_on[r] = 1;
        }
        /* the last stage also holds the embedding when MTP or a tied head needs it */
        if (s == S - 1 && P > 1 && (c->num_nextn_predict_layers > 0 || c->tie_word_embeddings)) {
            pdense[s] += x->u[0].p_tp / l->tp;
            pfirst[0] += x->u[0].p_tp / l->tp;
        }
        /* DP gradient reduction (fp32) of the stage's parameters, once its backwards are done */
        double bw, lat, t = 0;
        if (st->trainer) {
            /* the trainer's collectives, measured: per region (dense over DP, experts over
             * expert-DP) the all-reduce in buckets, or the reduce-scatter */
            const double pr[2] = {pdense[s], pexp[s]};
            const int gs[2] = {l->dp, edp}, stride[2] = {l->tp, l->ep};
            for (int k = 0; k < 2; k++) {
                group_link(cl, gs[k], stride[k], &bw, &lat);
                double g = 4 * pr[k], ab = cl->ar_bw > 0 ? cl->ar_bw : bw, rb = cl->rs_bw > 0 ? cl->rs_bw : bw;
                double nb = ceil(g / st->bucket_bytes);
                double tk = 0;
                if (gs[k] > 1 && g > 0)
                    tk = st->dist_opt ? ring(g, gs[k], rb, lat) : 2 * ring(g, gs[k], ab, lat) + (nb - 1) * 2 * (gs[k] - 1) * lat;
                /* with the buckets behind the last backward, what its layers above the first
                 * do not hide: they travel in the link time its expert exchanges leave */
                if (st->wire_bw > 0 && gs[k] > 1 && g > 0 && spans_nodes(cl, gs[k], stride[k]))
                    tk = fmax(tk, wire_buckets(st, g, gs[k], st->dist_opt ? 1 : 2, 4 * pfirst[k],
                                               fmax(0, bwd[s] - bfirst - bwire)));
                t += tk;
            }
            first_pd[s] = pfirst[0], first_pe[s] = pfirst[1];
        } else {
            group_link(cl, l->dp, l->tp, &bw, &lat);
            t += ring(4 * pdense[s], l->dp, bw, lat) * (st->dist_opt ? 1 : 2);
            group_link(cl, edp, l->ep, &bw, &lat);
            t += ring(4 * pexp[s], edp, bw, lat) * (st->dist_opt ? 1 : 2);
        }
        sync[s] = t;
    }

    /* memory of every pipeline rank */
    mt_schedule own;
    if (!sched) {
        int rc = mt_schedule_make(&own, P, V, M);
        MT_ASSERT(rc == 0);
        if (overlapped(st, M)) MT_ASSERT(mt_schedule_overlap(&own) == 0);
        sched = &own;
    }
    const double msg = (double)l->mb * st->seq * c->hidden_size * st->elt / l->tp;
    double busy_max = 0, exposed_ag = 0;
    int busy_rank = 0;
    for (int r = 0; r < P; r++) {
        double pd = 0, pe = 0, busy = 0;
        for (int v = 0; v < V; v++) {
            pd += pdense[v * P + r];
            pe += pexp[v * P + r];
            busy += M * (fwd[v * P + r] + bwd[v * P + r]);
        }
        double cur = 0, peak = 0;
        for (int i = 0; i < sched->len[r]; i++) {
            const mt_action *a = &sched->act[r][i];
            if (a->kind == MT_ACT_FWD) cur += acts[a->chunk * P + r];
            if (a->kind == MT_ACT_BWD) cur -= acts[a->chunk * P + r];
            if (cur > peak) peak = cur;
        }
        const double sd = st->dist_opt ? l->dp : 1, se = st->dist_opt ? edp : 1;
        /* Adam moments (8 B), plus an fp32 master copy when the weights are bf16 (4 B) */
        double mw = st->elt * (pd + pe), mg = 4 * (pd + pe), mo = (st->elt == 4 ? 8 : 12) * (pd / sd + pe / se);
        double mc = 2 * msg + (moe_on[r] ? 2 * n * c->num_experts_per_tok * c->hidden_size * st->elt * imb : 0);
        double wk = work[r], ckpt = 0, ckpt_extra = 0;
        if (st->trainer) {
            const double nfull = mt_cost_params_mtp(c); /* the trainer holds the MTP blocks too */
            /* fp32 weights and gradients, two fp32 moments (no master copy); the arenas of
             * model.c itself (train/pipeline.c: one per micro-batch a chunk holds at once,
             * from the same schedule) */
            mo = 8 * (pd / sd + pe / se);
            if (mt_recompute_trainer(l->rc)) {
                const mt_acts_dims d = {l->mb, st->seq, st->threads, l->rc, l->tp, l->tp > 1,
                                        mt_attention_bf16(st->gemm_bf16, c->head_dim)};
                int nslot[MT_PLAN_MAX_STAGES];
                mt_schedule_slots(sched, r, nslot);
                peak = 0;
                for (int v = 0; v < V; v++) {
                    const int sv = v * P + r;
                    int lo = 0;
                    for (int k = 0; k < sv; k++) lo += res->layers[k];
                    peak += nslot[v] * mt_cost_trainer_acts_bytes(c, lo, lo + res->layers[sv], sv == S - 1, &d);
                }
                wk = 0;
                /* the head's packed weight (bf16), on the rank of the last stage */
                if ((S - 1) % P == r)
                    wk = (double)mt_head_packed_bytes(l->mb * st->seq / (l->tp > 1 ? l->tp : 1), c->hidden_size,
                                                      c->vocab_size, st->gemm_bf16, 1);
            }
            /* communication memory: the ZeRO-1 gradient shard, MPI's segments for the other
             * ranks of the node, and the scratch of the largest collective of the step */
            double gbytes = 4 * fmax(pd, pe), scratch = 0; /* the largest region's message */
            int peers = (st->devices < cl->per_node ? st->devices : cl->per_node) - 1;
            mc = (st->dist_opt ? 4 * (pd / sd + pe / se) : 0) + (peers > 0 ? peers * cl->mpi_per_peer : 0);
            if (l->dp > 1 || edp > 1)
                scratch = st->dist_opt ? fmax(cl->rs_scratch, cl->ag_scratch) * gbytes
                                       : cl->ar_scratch * fmin(gbytes, st->bucket_bytes);
            if (!st->dist_opt && (l->dp > 1 || edp > 1)) {
                /* the buckets' non-blocking all-reduces in flight: MPI keeps a copy of each
                 * message (Open MPI's libnbc), at most MT_OPT_INFLIGHT_BYTES (or a bucket) */
                const double ar = (l->dp > 1 ? 4 * pd : 0) + (edp > 1 ? 4 * pe : 0);
                scratch += fmin(ar, fmax((double)MT_OPT_INFLIGHT_BYTES, (double)st->bucket_bytes));
            }
            /* the checkpoint at the end (saveload.c mt_ckpt_save_dist), the step's buffers still
             * allocated. A rank holding the whole model (no TP, PP, EP) writes from its own
             * buffers; with ZeRO-1 world rank 0 first gathers the moments (8 B a parameter).
             * A sharded layout sends its tensors to world rank 0 point to point
             * (parallel/reshard.c): rank 0 holds whole-model parameters and moments (12 B a
             * parameter); with ZeRO-1 every rank first assembles its part's moments (8 B a
             * local parameter) */
            const int whole = l->tp == 1 && l->pp == 1 && l->ep == 1;
            double extra = whole ? (st->dist_opt && r == 0 ? 8 * nfull : 0)
                                 : (st->dist_opt ? 8 * (pd + pe) : 0) + (r == 0 ? 12 * nfull : 0);
            ckpt = mw + mg + mo + peak + wk + mc + cl->reserved_bytes + extra;
            ckpt_extra = extra;
            mc += scratch;
        }
        double step_tot = mw + mg + mo + peak + wk + mc + cl->reserved_bytes;
        double tot = fmax(step_tot, ckpt);
        if (tot > res->mem_total) {
            res->mem_rank = r;
            res->mem_total = tot;
            res->mem_weights = mw;
            res->mem_grads = mg;
            res->mem_opt = mo;
            res->mem_acts = peak;
            res->mem_work = wk;
            res->mem_comm = mc;
            res->mem_reserved = cl->reserved_bytes;
            res->mem_step = step_tot;
            res->mem_ckpt = ckpt;
            res->mem_ckpt_extra = ckpt_extra;
        }
        /* optimizer: AdamW reads/writes ~36 bytes per local parameter (memory bound);
         * then the bf16 parameter all-gather, overlapped with the next step's first forward */
        double bw, lat, ag = 0;
        opt[r] = 36 * (pd / sd + pe / se) / (cl->mem_bw * cl->eff_mem);
        if (st->trainer) /* AdamW (28 B: reads p, g, m, v, writes p, m, v), zeroing the
                          * gradients and their norm (4 B each) */
            opt[r] = (28 * (pd / sd + pe / se) + 4 * (pd + pe) + 4 * (st->dist_opt ? (pd / sd + pe / se) : pd + pe)) /
                     (cl->mem_bw * cl->eff_mem);
        if (st->dist_opt) {
            group_link(cl, l->dp, l->tp, &bw, &lat);
            ag += ring(st->elt * pd, l->dp, st->trainer && cl->ag_bw > 0 ? cl->ag_bw : bw, lat);
            group_link(cl, edp, l->ep, &bw, &lat);
            ag += ring(st->elt * pe, edp, st->trainer && cl->ag_bw > 0 ? cl->ag_bw : bw, lat);
        }
        double ex = st->trainer ? ag : fmax(0, ag - fwd[r]); /* the trainer gathers after the update */
        if (st->trainer && st->dist_opt && st->wire_bw > 0 && V == 1) {
            /* train --wire: the ring's (S-1)/S of every fp32 bucket on the rank's link; left
             * in flight (not --overlap off), what the next forward's layers after the first
             * do not hide */
            const double pr[2] = {pd, pe}, pf[2] = {first_pd[r], first_pe[r]};
            const int gs[2] = {l->dp, edp}, stride[2] = {l->tp, l->ep};
            double wt = 0;
            for (int k = 0; k < 2; k++)
                if (gs[k] > 1 && pr[k] > 0 && spans_nodes(cl, gs[k], stride[k]))
                    wt += wire_buckets(st, 4 * pr[k], gs[k], 1, 4 * pf[k], fwd[r] - first_f[r]);
            ex = fmax(ex, wt);
        }
        opt[r] += ex;
        if (ex > exposed_ag) exposed_ag = ex;
        if (busy > busy_max) { busy_max = busy; busy_rank = r; }
    }
    res->reason = res->mem_total > cl->mem_bytes ? MT_PLAN_MEMORY : MT_PLAN_OK;
    for (int v = 0; v < V; v++) {
        res->t_compute += M * comp[v * P + busy_rank];
        res->t_tp += M * tpa[v * P + busy_rank];
        res->t_a2a += M * a2a[v * P + busy_rank];
    }
    res->t_opt = opt[busy_rank];

    int simulated = 0;
    if (bound > 0 && busy_max >= bound) {
        res->step = busy_max;
    } else {
        /* with and without the p2p time: the difference is the exposed p2p, the bubble is
         * the schedule's own (stage imbalance included) */
        double pbw, plat;
        group_link(cl, 2, l->tp * l->dp, &pbw, &plat);
        const int paired = overlapped(st, M);
        mt_sim_cost sc = {fwd, bwd, P > 1 ? msg / pbw + plat : 0, sync, opt, NULL, NULL};
        mt_sim_pass *pass = NULL;
        mt_sim_piece *piece = NULL;
        if (paired) { /* the two fibers' pieces, per virtual stage */
            pass = mt_xmalloc(sizeof *pass * 2 * (size_t)S);
            piece = mt_xmalloc(sizeof *piece * 4 * (size_t)(x->nu + 1));
            int ufirst = 1, used = 0;
            for (int s = 0; s < S; s++) {
                int u0 = s == 0 ? 0 : ufirst, u1 = ufirst + res->layers[s];
                if (s == S - 1) u1 = x->nu;
                ufirst += res->layers[s];
                const int k = u1 - u0;
                stage_passes(x, ut, u0, u1, piece + used, piece + used + 2 * k, &pass[s], &pass[S + s]);
                used += 4 * k;
            }
            sc.fwd_pass = pass, sc.bwd_pass = pass + S;
        }
        if (st->trainer && st->wire_bw > 0 && P > 1 && 2.0 * l->tp * l->dp > cl->per_node) /* train --wire: fp32 rows */
            sc.p2p = fmax(sc.p2p, 4 * msg / st->elt / st->wire_bw + st->wire_lat);
        mt_sim_result a, b;
        mt_sim_run(sched, &sc, &a);
        double p2p = sc.p2p;
        sc.p2p = 0;
        if (p2p > 0) mt_sim_run(sched, &sc, &b);
        else b = a;
        res->step = a.step;
        res->bubble = b.bubble;
        res->t_p2p = fmax(0, a.pipe - b.pipe);
        res->t_dp = a.exposed_dp + exposed_ag;
        if (paired) res->t_a2a = a.exposed_ep; /* what the fibers wait for */
        free(pass);
        free(piece);
        simulated = 1;
    }
    res->exposed_comm = res->t_tp + res->t_a2a + res->t_p2p + res->t_dp;
    res->tok_s = (double)st->global_seqs * st->seq / res->step;
    res->mfu = x->model_flops * res->tok_s / ((double)st->devices * (st->gemm_bf16 ? cl->gemm_bf16_peak : cl->peak_bf16));
    if (sched == &own) mt_schedule_free(&own);
    free(ut);
    free(w);
    free(fwd);
    free(a2a);
    free(work);
    free(first_pd);
    return simulated;
}

void mt_plan_eval(const mt_config *c, const mt_cluster *cl, const mt_plan_settings *st, const mt_layout *l,
                  mt_plan_result *res) {
    ctx x;
    ctx_init(&x, c, cl, st);
    eval_layout(&x, NULL, l, res, 0);
    free(x.u);
}

/* ---------------------------------------------------------------- search */

/* Inserts r into the sorted best[0..*have) (capacity n) if it is fast enough. */
static void keep(mt_plan_result *best, int n, int *have, const mt_plan_result *r) {
    int i = *have < n ? *have : n - 1;
    if (*have == n && r->step >= best[n - 1].step) return;
    while (i > 0 && best[i - 1].step > r->step) {
        best[i] = best[i - 1];
        i--;
    }
    best[i] = *r;
    if (*have < n) (*have)++;
}

int mt_plan_search(const mt_config *c, const mt_cluster *cl, const mt_plan_settings *st, mt_plan_result *best,
                   int n, mt_plan_stats *stats, int progress) {
    ctx x;
    ctx_init(&x, c, cl, st);
    memset(stats, 0, sizeof *stats);
    const double t0 = mt_now();
    double last_print = t0;
    const int E = c->n_routed_experts, L = c->num_hidden_layers;
    int have = 0;
    static const int mbs[] = {1, 2, 4};
    static const int vpps[] = {1, 2, 3, 4, 6, 8};
    /* from the most memory kept to the least (ties in the ranking keep this order) */
    static const int rc_order[MT_RECOMPUTE_N] = {MT_RECOMPUTE_KEEP_ALL, MT_RECOMPUTE_NONE, MT_RECOMPUTE_SELECTIVE,
                                                 MT_RECOMPUTE_FULL};
    mt_plan_result *r = mt_xmalloc(sizeof *r);
    for (int tp = 1; tp <= cl->per_node; tp *= 2) {
        for (int pp = 1; pp <= L && pp <= st->devices / tp; pp++) {
            if ((st->devices / tp) % pp) continue;
            for (size_t iv = 0; iv < sizeof vpps / sizeof vpps[0]; iv++) {
                const int vpp = vpps[iv];
                if (vpp > 1 && (pp == 1 || pp * vpp > L)) continue;
                for (size_t im = 0; im < sizeof mbs / sizeof mbs[0]; im++) {
                    mt_schedule sched;
                    int have_sched = 0;
                    const int dp = st->devices / (tp * pp);
                    for (int ep = 1; ep <= (E > 0 ? E : 1); ep++) {
                        if (E > 0 && (E % ep || (dp * tp) % ep)) continue;
                        const int nn = (ep + cl->per_node - 1) / cl->per_node;
                        for (int ir = 0; ir < MT_RECOMPUTE_N; ir++)
                            for (int a2a = 0; a2a < (nn > 1 ? 2 : 1); a2a++)
                                for (int split = 0; split < 2; split++) {
                                    /* the trainer's two policies on a calibrated CPU file; else
                                     * keep-all, none and full (Megatron's) */
                                    const int rc = rc_order[ir];
                                    if (st->trainer ? !mt_recompute_trainer(rc) : rc == MT_RECOMPUTE_SELECTIVE)
                                        continue;
                                    mt_layout l = {tp, pp, vpp, ep, dp, mbs[im], rc, a2a, split};
                                    stats->layouts++;
                                    int m = 0, why = check_layout(&x, &l, &m);
                                    if (why != MT_PLAN_OK) {
                                        stats->infeasible[why]++;
                                        continue;
                                    }
                                    if (!have_sched) {
                                        int rcs = mt_schedule_make(&sched, pp, vpp, m);
                                        MT_ASSERT(rcs == 0);
                                        if (overlapped(st, m))
                                            MT_ASSERT(mt_schedule_overlap(&sched) == 0);
                                        have_sched = 1;
                                    }
                                    double bound = have == n ? best[n - 1].step : 0;
                                    int sim = eval_layout(&x, &sched, &l, r, bound);
                                    if (r->reason != MT_PLAN_OK) {
                                        stats->infeasible[r->reason]++;
                                        continue;
                                    }
                                    stats->feasible++;
                                    if (sim) {
                                        stats->simulated++;
                                        keep(best, n, &have, r);
                                    } else {
                                        stats->pruned++;
                                    }
                                }
                        if (progress && mt_now() - last_print > 0.2) {
                            last_print = mt_now();
                            fprintf(stderr, "\rplan: %lld layouts, %lld fit, %lld simulated, best %.2f s/step   ",
                                    stats->layouts, stats->feasible, stats->simulated, have ? best[0].step : 0.0);
                        }
                    }
                    if (have_sched) mt_schedule_free(&sched);
                }
            }
        }
    }
    if (progress) fprintf(stderr, "\r%90s\r", "");
    stats->seconds = mt_now() - t0;
    free(r);
    free(x.u);
    return have;
}

/* ---------------------------------------------------------------- layout strings */

int mt_layout_parse(mt_layout *l, const char *s, int rc_default) {
    *l = (mt_layout){1, 1, 1, 1, 0, 1, rc_default, MT_A2A_FLAT, MT_SPLIT_EVEN};
    char buf[256];
    if (strlen(s) >= sizeof buf) return mt_error("--layout: too long");
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return mt_error("--layout: expected key=value, got '%s'", kv);
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int *dst = !strcmp(k, "tp") ? &l->tp : !strcmp(k, "pp") ? &l->pp : !strcmp(k, "vpp") ? &l->vpp
                 : !strcmp(k, "ep") ? &l->ep : !strcmp(k, "mb") ? &l->mb : !strcmp(k, "dp") ? &l->dp : NULL;
        if (dst) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*v == 0 || *end || x < 1 || x > 1 << 20)
                return mt_error("--layout: %s expects a positive integer, got '%s'", k, v);
            *dst = (int)x;
            continue;
        }
        if (!strcmp(k, "rc") || !strcmp(k, "recompute")) {
            l->rc = mt_recompute_lookup(v);
            if (l->rc < 0)
                return mt_error("--layout: %s: unknown value '%s' (keep-all, none, selective, full)", k, v);
            continue;
        }
        const char *const *names = !strcmp(k, "a2a") ? a2a_name : !strcmp(k, "split") ? split_name : NULL;
        int *d2 = names == a2a_name ? &l->a2a : &l->split;
        int cnt = 2, found = 0;
        if (!names) return mt_error("--layout: unknown key '%s' (tp, pp, vpp, ep, dp, mb, rc, a2a, split)", k);
        for (int i = 0; i < cnt; i++)
            if (!strcmp(v, names[i]) || (names == a2a_name && i == 1 && !strcmp(v, "hierarchical"))) {
                *d2 = i;
                found = 1;
            }
        if (!found) return mt_error("--layout: %s: unknown value '%s'", k, v);
    }
    return 0;
}

void mt_layout_format(const mt_layout *l, char *buf, size_t n) {
    snprintf(buf, n, "tp=%d,pp=%d,vpp=%d,ep=%d,dp=%d,mb=%d,rc=%s,a2a=%s,split=%s", l->tp, l->pp, l->vpp, l->ep,
             l->dp, l->mb, mt_recompute_name(l->rc), a2a_name[l->a2a], split_name[l->split]);
}

/* ---------------------------------------------------------------- reports */

static const double GB = 1e9;

void mt_plan_print_table(FILE *f, const mt_plan_result *r, int n) {
    fprintf(f, "  # TP PP VPP  EP   DP MB recomp.   a2a  split      step s    tok/s    MFU  mem GB (wts+grd+opt+act+oth)  bubble exp.comm s\n");
    for (int i = 0; i < n; i++) {
        const mt_plan_result *x = &r[i];
        const mt_layout *l = &x->l;
        double other = x->mem_work + x->mem_comm + x->mem_reserved;
        fprintf(f, "%3d %2d %2d %3d %3d %4d %2d %-9s %-4s %-8s %9.3f %8.3gM %5.1f%%  %5.1f (%4.1f+%4.1f+%4.1f+%4.1f+%4.1f)  %5.1f%% %8.3f\n",
                i + 1, l->tp, l->pp, l->vpp, l->ep, l->dp, l->mb, mt_recompute_name(l->rc), a2a_name[l->a2a],
                split_name[l->split], x->step, x->tok_s / 1e6, 100 * x->mfu, x->mem_total / GB,
                x->mem_weights / GB, x->mem_grads / GB, x->mem_opt / GB, x->mem_acts / GB, other / GB,
                100 * x->bubble, x->exposed_comm);
    }
}

/* "12.345 GB", or TB from 10^12 B (whole-model caches of the big presets) */
static const char *gb_tb(double b, char *buf, size_t n) {
    if (b >= 1e12) snprintf(buf, n, "%.3f TB", b / 1e12);
    else snprintf(buf, n, "%.3f GB", b / GB);
    return buf;
}

/* The KV-cache lines of a layout's detail. */
static void print_kv(FILE *f, const mt_plan_result *x) {
    char d[32], m[32];
    fprintf(f, "kv cache      decoding %d sequences x %d positions, %d B a value (not in the memory above), pipeline "
               "rank %d (%d layers):\n", x->kv_seqs, x->kv_positions, x->kv_elt, x->kv_rank, x->kv_layers);
    if (!x->kv_mla) {
        fprintf(f, "              GQA k and v (%d values a position and layer, split over TP): %s a device, %s the "
                   "whole model\n", x->kv_width, gb_tb(x->kv_dev, d, sizeof d), gb_tb(x->kv_model, m, sizeof m));
        return;
    }
    fprintf(f, "              MLA absorbed (%d values a position and layer, whole on every TP rank): %s a device, "
               "%s the whole model\n", x->kv_width, gb_tb(x->kv_dev, d, sizeof d), gb_tb(x->kv_model, m, sizeof m));
    fprintf(f, "              unabsorbed (per-head k and v, %d values, split over TP): %s a device, %s the whole "
               "model\n", x->kv_width_unabs, gb_tb(x->kv_dev_unabs, d, sizeof d), gb_tb(x->kv_model_unabs, m, sizeof m));
}

void mt_plan_print_detail(FILE *f, const mt_plan_result *x) {
    char lay[160];
    mt_layout_format(&x->l, lay, sizeof lay);
    fprintf(f, "layout        %s\n", lay);
    if (x->reason != MT_PLAN_OK) fprintf(f, "infeasible    %s\n", mt_plan_reason_name[x->reason]);
    if (x->reason == MT_PLAN_OK || x->reason == MT_PLAN_MEMORY) {
        fprintf(f, "micro-batches %d per step, %d virtual stages, layers per stage:", x->m, x->nstages);
        for (int s = 0; s < x->nstages; s++) fprintf(f, " %d", x->layers[s]);
        /* the same layout as `moetrain train` flags */
        const mt_layout *l = &x->l;
        fprintf(f, "\ntrain flags   --tp %d%s --pp %d --vpp %d --ep %d --batch %d --accum %d --a2a %s", l->tp,
                l->tp > 1 ? " --sp" : "", l->pp, l->vpp, l->ep, l->mb, x->m, l->a2a == MT_A2A_HIER ? "hier" : "flat");
        if (l->pp * l->vpp > 1) {
            fprintf(f, " --split ");
            for (int s = 0; s < x->nstages; s++) fprintf(f, "%s%d", s ? "," : "", x->layers[s]);
        }
        fprintf(f, "%s%s", x->gemm_bf16 ? " --bf16" : "",
                l->rc == MT_RECOMPUTE_SELECTIVE ? " --recompute selective"
                : l->rc == MT_RECOMPUTE_FULL ? "  (full recompute: not in the trainer yet)" : "");
        fprintf(f, "\nstep          %.3f s   %.4gM tokens/s   MFU %.1f%%   bubble %.1f%%\n", x->step,
                x->tok_s / 1e6, 100 * x->mfu, 100 * x->bubble);
        fprintf(f, "busiest rank  compute %.3f s, TP %.3f s, all-to-all %.3f s, exposed p2p %.3f s, exposed DP %.3f s, optimizer %.3f s\n",
                x->t_compute, x->t_tp, x->t_a2a, x->t_p2p, x->t_dp, x->t_opt);
        fprintf(f, "memory        %.2f GB on pipeline rank %d: weights %.2f, grads %.2f, optimizer %.2f, activations %.2f, working %.2f, comm buffers %.2f, reserved %.2f\n",
                x->mem_total / GB, x->mem_rank, x->mem_weights / GB, x->mem_grads / GB, x->mem_opt / GB,
                x->mem_acts / GB, x->mem_work / GB, x->mem_comm / GB, x->mem_reserved / GB);
        if (x->mem_ckpt > 0)
            fprintf(f, "              peak of the step %.3f GB, while writing the checkpoint %.3f GB\n",
                    x->mem_step / GB, x->mem_ckpt / GB);
        print_kv(f, x);
    }
}

void mt_plan_print_explain(FILE *f, const mt_plan_result *r, int n) {
    if (n < 2) {
        fprintf(f, "explain: one layout in the table: nothing to compare it with (raise --top)\n");
        return;
    }
    const mt_plan_result *a = &r[0];
    fprintf(f, "why #1 wins (step %.3f s):\n", a->step);
    for (int i = 1; i < n && i < 4; i++) {
        const mt_plan_result *b = &r[i];
        const mt_layout *x = &a->l, *y = &b->l;
        fprintf(f, "  vs #%d (+%.3f s, +%.1f%%): differs in", i + 1, b->step - a->step, 100 * (b->step / a->step - 1));
        if (x->tp != y->tp) fprintf(f, " tp %d->%d", x->tp, y->tp);
        if (x->pp != y->pp) fprintf(f, " pp %d->%d", x->pp, y->pp);
        if (x->vpp != y->vpp) fprintf(f, " vpp %d->%d", x->vpp, y->vpp);
        if (x->ep != y->ep) fprintf(f, " ep %d->%d", x->ep, y->ep);
        if (x->mb != y->mb) fprintf(f, " mb %d->%d", x->mb, y->mb);
        if (x->rc != y->rc) fprintf(f, " recompute %s->%s", mt_recompute_name(x->rc), mt_recompute_name(y->rc));
        if (x->a2a != y->a2a) fprintf(f, " a2a %s->%s", a2a_name[x->a2a], a2a_name[y->a2a]);
        if (x->split != y->split) fprintf(f, " split %s->%s", split_name[x->split], split_name[y->split]);
        fprintf(f, "\n    its deltas: compute %+.3f s, TP %+.3f s, all-to-all %+.3f s, p2p %+.3f s, DP %+.3f s, bubble %+.1f pt, memory %+.1f GB\n",
                b->t_compute - a->t_compute, b->t_tp - a->t_tp, b->t_a2a - a->t_a2a, b->t_p2p - a->t_p2p,
                b->t_dp - a->t_dp, 100 * (b->bubble - a->bubble), (b->mem_total - a->mem_total) / GB);
    }
}

/* The KV-cache figures of a layout (mt_plan_result's kv_*), MLA's in both forms. */
static void kv_json(cJSON *kv, const mt_plan_result *x) {
    cJSON_AddNumberToObject(kv, "sequences", x->kv_seqs);
    cJSON_AddNumberToObject(kv, "positions", x->kv_positions);
    cJSON_AddNumberToObject(kv, "value_bytes", x->kv_elt);
    cJSON_AddNumberToObject(kv, "pipeline_rank", x->kv_rank);
    cJSON_AddNumberToObject(kv, "layers", x->kv_layers);
    cJSON_AddNumberToObject(kv, "values_per_position_layer", x->kv_width);
    cJSON_AddNumberToObject(kv, "device_bytes", x->kv_dev);
    cJSON_AddNumberToObject(kv, "model_bytes", x->kv_model);
    if (!x->kv_mla) return;
    /* the figures above are the absorbed form (the decoder's default) */
    cJSON_AddNumberToObject(kv, "values_per_position_layer_unabsorbed", x->kv_width_unabs);
    cJSON_AddNumberToObject(kv, "device_bytes_unabsorbed", x->kv_dev_unabs);
    cJSON_AddNumberToObject(kv, "model_bytes_unabsorbed", x->kv_model_unabs);
}

static cJSON *result_json(const mt_plan_result *x) {
    cJSON *o = cJSON_CreateObject();
    const mt_layout *l = &x->l;
    char lay[160];
    mt_layout_format(l, lay, sizeof lay);
    cJSON_AddStringToObject(o, "layout", lay);
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    cJSON_AddNumberToObject(o, "vpp", l->vpp);
    cJSON_AddNumberToObject(o, "ep", l->ep);
    cJSON_AddNumberToObject(o, "dp", l->dp);
    cJSON_AddNumberToObject(o, "mb", l->mb);
    cJSON_AddStringToObject(o, "recompute", mt_recompute_name(l->rc));
    cJSON_AddStringToObject(o, "a2a", a2a_name[l->a2a]);
    cJSON_AddStringToObject(o, "split", split_name[l->split]);
    cJSON_AddStringToObject(o, "status", mt_plan_reason_name[x->reason]);
    if (x->gemm_bf16) cJSON_AddBoolToObject(o, "bf16", 1); /* trainer --bf16 */
    cJSON_AddNumberToObject(o, "micro_batches", x->m);
    cJSON_AddNumberToObject(o, "step_s", x->step);
    cJSON_AddNumberToObject(o, "tokens_per_s", x->tok_s);
    cJSON_AddNumberToObject(o, "mfu", x->mfu);
    cJSON_AddNumberToObject(o, "bubble", x->bubble);
    cJSON_AddNumberToObject(o, "exposed_comm_s", x->exposed_comm);
    cJSON *t = cJSON_AddObjectToObject(o, "time_s");
    cJSON_AddNumberToObject(t, "compute", x->t_compute);
    cJSON_AddNumberToObject(t, "tp", x->t_tp);
    cJSON_AddNumberToObject(t, "all_to_all", x->t_a2a);
    cJSON_AddNumberToObject(t, "p2p_exposed", x->t_p2p);
    cJSON_AddNumberToObject(t, "dp_exposed", x->t_dp);
    cJSON_AddNumberToObject(t, "optimizer", x->t_opt);
    cJSON *m = cJSON_AddObjectToObject(o, "memory_bytes");
    cJSON_AddNumberToObject(m, "total", x->mem_total);
    cJSON_AddNumberToObject(m, "weights", x->mem_weights);
    cJSON_AddNumberToObject(m, "grads", x->mem_grads);
    cJSON_AddNumberToObject(m, "optimizer", x->mem_opt);
    cJSON_AddNumberToObject(m, "activations", x->mem_acts);
    cJSON_AddNumberToObject(m, "working", x->mem_work);
    cJSON_AddNumberToObject(m, "comm_buffers", x->mem_comm);
    cJSON_AddNumberToObject(m, "reserved", x->mem_reserved);
    cJSON_AddNumberToObject(m, "pipeline_rank", x->mem_rank);
    cJSON_AddNumberToObject(m, "step_peak", x->mem_step);
    if (x->mem_ckpt > 0) cJSON_AddNumberToObject(m, "checkpoint_peak", x->mem_ckpt);
    if (x->nstages > 0) kv_json(cJSON_AddObjectToObject(o, "kv_cache"), x); /* a layout that divides the model */
    cJSON *sp = cJSON_AddArrayToObject(o, "layers_per_stage");
    for (int s = 0; s < x->nstages; s++) cJSON_AddItemToArray(sp, cJSON_CreateNumber(x->layers[s]));
    return o;
}

char *mt_plan_json(const mt_plan_result *r, int n, const mt_plan_stats *stats) {
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "layouts");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, result_json(&r[i]));
    if (stats) {
        cJSON *s = cJSON_AddObjectToObject(root, "search");
        cJSON_AddNumberToObject(s, "layouts", (double)stats->layouts);
        cJSON_AddNumberToObject(s, "feasible", (double)stats->feasible);
        cJSON_AddNumberToObject(s, "simulated", (double)stats->simulated);
        cJSON_AddNumberToObject(s, "pruned", (double)stats->pruned);
        cJSON_AddNumberToObject(s, "seconds", stats->seconds);
        cJSON *inf = cJSON_AddObjectToObject(s, "infeasible");
        for (int i = 1; i < MT_PLAN_NREASONS; i++)
            cJSON_AddNumberToObject(inf, mt_plan_reason_name[i], (double)stats->infeasible[i]);
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    return txt;
}
