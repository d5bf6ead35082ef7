/* model/moe_block.c — routing, the balance loss and the MoE block (local or over an expert-parallel group) (see model.h). */
#include "model/model.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/moe.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/internal.h"

/* ---------------------------------------------------------------- routing */


static inline int better(const float *p, int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

/* picks the best `want` indices of p among [lo, hi) not yet taken, appending to sel */
static int pick_top(const float *p, int lo, int hi, int want, unsigned char *taken, int *sel, int n) {
    for (int r = 0; r < want; r++) {
        int best = -1;
        for (int e = lo; e < hi; e++)
            if (!taken[e] && (best < 0 || better(p, e, best))) best = e;
        MT_ASSERT(best >= 0);
        taken[best] = 1;
        sel[n++] = best;
    }
    return n;
}

void mt_route_select(const mt_config *c, const float *p, int *sel) {
    const int E = c->n_routed_experts, K = c->num_experts_per_tok;
    unsigned char taken[MAX_E];
    MT_ASSERT(E <= MAX_E && K <= 512);
    memset(taken, 0, (size_t)E);
    int n = 0;
    if (c->topk_method == MT_TOPK_GREEDY || c->n_group <= 1) {
        n = pick_top(p, 0, E, K, taken, sel, 0);
    } else if (c->topk_method == MT_TOPK_MOGE) {
        int gs = E / c->n_group, per = K / c->n_group;
        for (int gi = 0; gi < c->n_group; gi++) n = pick_top(p, gi * gs, (gi + 1) * gs, per, taken, sel, n);
        /* order the selection by score (descending, ties to lower index) */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && better(p, sel[j], sel[j - 1]); j--) {
                int t = sel[j]; sel[j] = sel[j - 1]; sel[j - 1] = t;
            }
    } else { /* group_limited */
        int ng = c->n_group, gs = E / ng;
        float gscore[MAX_E];
        for (int gi = 0; gi < ng; gi++) {
            float mx = -INFINITY;
            for (int e = gi * gs; e < (gi + 1) * gs; e++) mx = p[e] > mx ? p[e] : mx;
            gscore[gi] = mx;
        }
        unsigned char gtaken[MAX_E];
        memset(gtaken, 0, (size_t)ng);
        int gsel[MAX_E];
        pick_top(gscore, 0, ng, c->topk_group, gtaken, gsel, 0);
        /* experts of unselected groups are unavailable */
        for (int gi = 0; gi < ng; gi++)
            if (!gtaken[gi]) memset(taken + gi * gs, 1, (size_t)gs);
        n = pick_top(p, 0, E, K, taken, sel, 0);
    }
    MT_ASSERT(n == K);
}


/* Router: scores in fp32, selection, routing weights (L->probs, L->sel, L->wsel). With a
 * routing replay (rep: the chosen experts of each token of this layer, stride ints apart;
 * a negative first id: select as usual) the experts are given and only their weights come
 * from the scores. */
static void route_fwd(mt_ws kws, const mt_config *c, layer_acts *L, const mt_layer_w *w, const float *ln, const uint16_t *ln16,
                      int N, const int32_t *rep, int stride) {
    const int C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int sigmoid = c->scoring_func == MT_SCORING_SIGMOID;
    mt_linear_fwd_x(kws, L->probs, NULL, ln, ln16, w->router, N, C, E, 0.0f);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *p = L->probs + (size_t)t * E;
        if (sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        } else {
            float mx = -INFINITY, sum = 0.0f;
            for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
            for (int e = 0; e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
            for (int e = 0; e < E; e++) p[e] /= sum;
        }
        int sel[512];
        const int32_t *r = rep ? rep + (size_t)t * stride : NULL;
        if (r && r[0] >= 0) {
            for (int j = 0; j < K; j++) {
                MT_ASSERT(r[j] >= 0 && r[j] < E); /* the caller checked the record */
                sel[j] = r[j];
            }
        } else {
            mt_route_select(c, p, sel);
        }
        float wsum = 0.0f;
        for (int j = 0; j < K; j++) wsum += p[sel[j]];
        for (int j = 0; j < K; j++) {
            float wj = p[sel[j]];
            if (c->norm_topk_prob) wj /= (wsum + 1e-20f);
            L->sel[(size_t)t * K + j] = sel[j];
            L->wsel[(size_t)t * K + j] = wj * (float)c->routed_scaling_factor;
        }
    }
}

/* The ep-group scope's routed fractions f_e, in L->f[0..E): over every (token, slot) of the
 * micro-batch on the EP group's ranks (an all-reduce of the counts and the token count; with
 * SP each rank counts its own 1/TP of the tokens, and the group spans the TP ranks it spans) */
static void group_fractions(const mt_model *m, const mt_acts *a, layer_acts *L) {
    const int E = m->cfg.n_routed_experts, K = m->cfg.num_experts_per_tok, R = a->Nl * K;
    MT_ASSERT(!a->fed); /* a row's real length has no meaning for a group of rows */
    double *cnt = mt_xcalloc((size_t)E + 1, sizeof(double));
    for (int i = 0; i < R; i++) cnt[L->sel[i]] += 1.0;
    cnt[E] = a->Nl;
    if (m->ep) m->ep->sum_f64(m->ep->ctx, cnt, (size_t)E + 1);
    for (int e = 0; e < E; e++) L->f[e] = (float)(cnt[e] / (cnt[E] * K));
    free(cnt);
}

/* per-sequence routed fractions f_e (for the balance loss) of the chunk's Nl tokens, token
 * 0 being token g0 of the micro-batch; with SP the counts of the TP ranks are summed */
static void route_fractions(const mt_model *m, const mt_acts *a, layer_acts *L, int B, int T) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts, K = c->num_experts_per_tok, R = a->Nl * K;
    if (m->aux_scope == MT_AUX_EP_GROUP) {
        group_fractions(m, a, L);
        return;
    }
    memset(L->f, 0, sizeof(float) * (size_t)B * E);
    for (int i = 0; i < R; i++) {
        const int tok = a->g0 + i / K;
        if (a->fed && tok % T >= a->fed[tok / T]) continue; /* padding after a short row */
        L->f[(size_t)(tok / T) * E + L->sel[i]] += 1.0f;
    }
    if (m->tp && m->tp->sp) m->tp->sum_f32(m->tp->ctx, L->f, (size_t)B * E);
    if (!a->fed) {
        for (size_t i = 0; i < (size_t)B * E; i++) L->f[i] /= (float)(T * K);
    } else {
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E && a->fed[b] > 0; e++) L->f[(size_t)b * E + e] /= (float)(a->fed[b] * K);
    }
}

/* ---------------------------------------------------------------- the local exchange */

/* The size-1 expert exchange: the fused permute groups the rows by expert in the layer's
 * tables (L->eoff, slot_row, perm_tok) and the arena's scratch (a->xe); combine and the
 * input gradient are the unpermute and its transpose. Its rows live in scratch that every
 * layer shares, so the backward forms them again (redispatch). The state is attached to the
 * batch by local_attach before the dispatch. */
typedef mt_local_plan local_plan;

static void local_attach(const mt_model *m, mt_acts *a, layer_acts *L, int l) {
    local_plan *lp = &L->local;
    memset(lp, 0, sizeof *lp);
    const mt_sum_order *o = &m->sum_order;
    if (o->ranks > 0) {
        lp->esel = L->sel;
        lp->order = (mt_moe_sum_order){.node_of = o->node_of, .owner = o->owner + (size_t)l * m->cfg.n_routed_experts};
    }
    lp->off = L->eoff;
    lp->slot_row = L->slot_row;
    lp->perm_tok = L->perm_tok;
    lp->xe = a->xe; /* one of the two is set: the acts' precision */
    lp->xe16 = a->xe16;
    lp->wrow = a->wrow;
    lp->ws = a->ws;
    L->epb.plan = lp;
}

static void local_dispatch(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16, const int32_t *sel,
                           const float *w, int N, int K, int C, int E) {
    (void)ctx;
    local_plan *lp = b->plan;
    lp->N = N, lp->K = K, lp->C = C, lp->E = E;
    lp->wsel = w;
    const int R = N * K;
    /* bf16 rows: the tables first, then the gather */
    mt_moe_permute(lp->ws, lp->xe, lp->off, lp->slot_row, lp->perm_tok, x, sel, N, K, E, C);
    if (lp->xe16) mt_moe_gather_x(NULL, lp->xe16, x, x16, lp->perm_tok, R, C);
    b->R = R;
    b->off = lp->off;
    b->xe = lp->xe;
    b->xe16 = lp->xe16;
    b->w = NULL;
}

static void local_combine(void *ctx, mt_ep_batch *b, float *out, const float *y) {
    (void)ctx;
    local_plan *lp = b->plan;
    lp->pending = 1, lp->dst = out, lp->src = y;
}

static void local_gather(void *ctx, mt_ep_batch *b, float *xr, uint16_t *xr16, const float *x) {
    (void)ctx;
    local_plan *lp = b->plan;
    const int R = lp->N * lp->K;
    mt_moe_gather_x(xr, xr16, x, NULL, lp->perm_tok, R, lp->C);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < R; i++) lp->wrow[lp->slot_row[i]] = lp->wsel[i];
    b->w = lp->wrow;
}

static void local_redispatch(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16) {
    (void)ctx;
    local_plan *lp = b->plan;
    mt_moe_gather_x(lp->xe, lp->xe16, x, x16, lp->perm_tok, lp->N * lp->K, lp->C);
}

static void local_dispatch_bwd(void *ctx, mt_ep_batch *b, float *dx, const float *dxe, int accumulate, float *vs,
                               const float *v) {
    (void)ctx;
    local_plan *lp = b->plan;
    lp->pending = 2, lp->dst = dx, lp->src = dxe, lp->accumulate = accumulate, lp->vs = vs, lp->v = v;
}

static int local_test(void *ctx, mt_ep_batch *b) {
    (void)ctx, (void)b;
    return 1;
}

static void local_wait(void *ctx, mt_ep_batch *b) {
    (void)ctx;
    local_plan *lp = b->plan;
    if (lp->pending == 1 && lp->esel)
        mt_moe_unpermute_ordered(lp->dst, lp->src, lp->wsel, lp->slot_row, lp->esel, lp->N, lp->K, lp->C,
                                 &lp->order);
    else if (lp->pending == 1)
        mt_moe_unpermute(lp->dst, lp->src, lp->wsel, lp->slot_row, lp->N, lp->K, lp->C, 1);
    else if (lp->pending == 2) {
        mt_moe_permute_bwd(lp->dst, lp->src, lp->slot_row, lp->N, lp->K, lp->C, lp->accumulate);
        for (int i = 0; i < lp->N * lp->K; i++) lp->vs[i] = lp->v[lp->slot_row[i]];
    }
    lp->pending = 0;
}

static void local_release(void *ctx, mt_ep_batch *b) {
    (void)ctx;
    memset(b, 0, sizeof *b);
}

static const mt_ep_ops local_ops = {.ctx = NULL, .rank = 0, .size = 1, .bf16_rows = 1, .dispatch = local_dispatch,
                                    .combine = local_combine, .gather = local_gather,
                                    .redispatch = local_redispatch, .dispatch_bwd = local_dispatch_bwd,
                                    .test = local_test, .wait = local_wait,
                                    .release = local_release};

static const mt_ep_ops *xchg_of(const mt_model *m) { return m->ep ? m->ep : &local_ops; }

/* ---------------------------------------------------------------- expert scratch */

/* The buffers the routed experts compute in for a batch of R rows. The local exchange's
 * R = N*K fits the arena; over EP, R depends on the routing of the whole group, so the
 * buffers grow to the largest batch seen and stay (gate|up per layer: the backward reads
 * it). egu, act and dgu are bf16 in bf16 mode (the fp32 pointer NULL; model/internal.h);
 * ye and ye16 are the same bytes, the output gradients' rows as bf16, then fp32 outputs. */
typedef struct {
    float *egu, *act, *ye, *dact, *dgu, *dwr;
    uint16_t *egu16, *act16, *ye16, *dgu16;
} expert_ws;

static void *grow(void *p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return p;
    mt_free(p);
    *cap = bytes + bytes / 4;
    return mt_alloc(*cap);
}

/* grow for a pair: the pointer of the precision h16 set, the other NULL */
static void grow_pair(float **f32, uint16_t **b16, size_t *cap, size_t bytes, int h16) {
    void *p = *f32;
    if (!p) p = *b16;
    p = grow(p, cap, bytes);
    *f32 = h16 ? NULL : p;
    *b16 = h16 ? p : NULL;
}

static expert_ws expert_scratch(const mt_model *m, mt_acts *a, layer_acts *L, int R) {
    const mt_config *c = &m->cfg;
    const size_t Fm = (size_t)c->moe_intermediate_size, C = (size_t)c->hidden_size, r = (size_t)R + 1;
    expert_ws ws;
    if (!m->ep) {
        ws = (expert_ws){L->egu, a->big1, a->ye, a->big2, a->big3, a->ds, L->egu16, a->big1_16, a->ye16, a->big3_16};
        return ws;
    }
    const int h16 = a->bf16;
    grow_pair(&L->ep_egu, &L->ep_egu16, &L->ep_egu_cap, sizeof(float) * r * 2 * Fm, h16);
    mt_moe_scratch *x = &a->moe;
    grow_pair(&x->act, &x->act16, &x->cap[0], sizeof(float) * r * Fm, h16);
    void *ye = grow(x->ye, &x->cap[1], sizeof(float) * r * C);
    x->ye = ye; /* and ye16: the same bytes (expert_ws) */
    x->ye16 = ye;
    x->dact = grow(x->dact, &x->cap[2], sizeof(float) * r * Fm);
    grow_pair(&x->dgu, &x->dgu16, &x->cap[3], sizeof(float) * r * 2 * Fm, h16);
    x->dwr = grow(x->dwr, &x->cap[4], sizeof(float) * r);
    ws = (expert_ws){L->ep_egu, x->act, x->ye, x->dact, x->dgu, x->dwr, L->ep_egu16, x->act16, x->ye16, x->dgu16};
    return ws;
}

/* the kernels' workspace grown for the grouped GEMMs of R rows (over EP more than the
 * N*K that mt_acts_ws_reserve sized) */
static void grouped_ws(mt_acts *a, const mt_config *c, int R, int LE, int bf16) {
    const int Fm = c->moe_intermediate_size, C = c->hidden_size, nthr = mt_get_threads();
    mt_ws_reserve(&a->ws, mt_grouped_ws_bytes(R, LE, 2 * Fm > C ? 2 * Fm : C, bf16, nthr > a->nthr ? nthr : a->nthr));
}

void mt_moe_scratch_free(mt_acts *a) {
    mt_moe_scratch *x = &a->moe;
    mt_free(x->act); /* of each pair one is set */
    mt_free(x->act16);
    mt_free(x->ye);
    mt_free(x->dact);
    mt_free(x->dgu);
    mt_free(x->dgu16);
    mt_free(x->dwr);
    mt_free(x->slot_sel);
    memset(x, 0, sizeof *x);
    for (int l = 0; l < a->nL; l++) {
        mt_free(a->L[l].ep_egu);
        mt_free(a->L[l].ep_egu16);
        a->L[l].ep_egu = NULL;
        a->L[l].ep_egu16 = NULL;
        a->L[l].ep_egu_cap = 0;
    }
}

/* ---------------------------------------------------------------- the MoE block */

/* MoE block forward on the normed input ln[N,C] (or ln16): out[N,C] = res + shared(ln) +
 * sum_j w_j E_j(ln) (res NULL: none, the sandwich norm's sublayer output), in phases: route;
 * dispatch; the local experts as one grouped GEMM on the rows that arrived; combine, with the
 * shared experts computed while it is pending (they write out = res + shared, which the
 * combine's wait adds into). */
static void moe_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l, int B, int T,
                    const float *ln, const uint16_t *ln16, const float *res, float *out, int train) {
    const mt_config *c = &m->cfg;
    const mt_ep_ops *xo = xchg_of(m);
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, LE = E / xo->size;
    const int h16 = a->bf16;
    mt_ep_batch *b = &L->epb;
    mt_trace_begin("moe.route");
    const int32_t *rep = NULL;
    if (a->replay) { /* this layer's ids: the MoE layers before it come first in each token's record */
        int q = 0;
        for (int k = 0; k < l; k++) q += mt_config_is_moe(c, k);
        rep = a->replay + (size_t)a->g0 * a->replay_stride + (size_t)q * K;
    }
    route_fwd(a->ws, c, L, w, ln, ln16, N, rep, a->replay_stride);
    if (a->count_load) /* training tokens only, not evaluation */
        for (int i = 0; i < N * K; i++) a->load[(size_t)l * E + L->sel[i]]++;
    route_fractions(m, a, L, B, T);
    if (!m->ep) local_attach(m, a, L, l);
    /* the exchange addresses experts by placement slot */
    const int32_t *sel = L->sel;
    if (m->slot_of) {
        mt_moe_scratch *x = &a->moe;
        x->slot_sel = grow(x->slot_sel, &x->cap[5], sizeof(int32_t) * ((size_t)N * K + 1));
        const int32_t *so = m->slot_of + (size_t)l * E;
        for (int i = 0; i < N * K; i++) x->slot_sel[i] = so[L->sel[i]];
        sel = x->slot_sel;
    }
    xo->dispatch(xo->ctx, b, ln, xo->bf16_rows ? ln16 : NULL, sel, L->wsel, N, K, C, E);
    xo->wait(xo->ctx, b);
    mt_trace_end();
    /* grouped expert GEMMs: gate|up, SwiGLU, down */
    mt_trace_begin("moe.experts");
    const int R = b->R;
    expert_ws ws = expert_scratch(m, a, L, R);
    grouped_ws(a, c, R, LE, h16);
    mt_grouped_linear_fwd_x(a->ws, ws.egu, ws.egu16, b->xe, b->xe16, w->egate, (size_t)2 * Fm * C, b->off, LE, C,
                            2 * Fm, 0.0f);
    mt_swiglu_rows_fwd_x(a->ws, ws.act, ws.act16, ws.egu, ws.egu16, R, Fm);
    mt_grouped_linear_fwd_x(a->ws, ws.ye, NULL, ws.act, ws.act16, w->edown, (size_t)C * Fm, b->off, LE, Fm, C, 0.0f);
    mt_trace_end();
    mt_trace_begin("moe.combine");
    xo->combine(xo->ctx, b, out, ws.ye);
    mt_trace_end();
    /* the shared experts' product adds the residual stream in its output pass and the
     * weighted combine accumulates: the residual add costs no pass of its own */
    mt_trace_begin("moe.shared");
    if (Fs > 0) mt_ffn_fwd(a, out, res, L->sgu, L->sgu16, ln, ln16, w->sgate, w->sdown, N, C, Fs, N);
    else if (res) mt_copy(out, res, (size_t)N * C);
    else mt_zero(out, (size_t)N * C);
    mt_trace_end();
    mt_trace_begin("moe.combine");
    xo->wait(xo->ctx, b);
    mt_trace_end();
    if (!train) xo->release(xo->ctx, b); /* no backward will come for this dispatch */
}

/* balance loss of each sequence: E * sum_e f_e * P_e, P_e = mean_t ptilde[t,e] (with SP the
 * per-sequence sums of the TP ranks are added first) */
/* the ep-group scope: one balance E * sum_e f_e P_e over the group's tokens (P_e's sums
 * and the token count all-reduced like f_e's), standing for each of this rank's Nl / T
 * sequences: the trainer's mean over sequences is then the mean over the groups */
static double group_balance(const mt_model *m, const mt_acts *a, const layer_acts *L, int T) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts;
    double *P = mt_xcalloc((size_t)E + 1, sizeof(double));
    for (int t = 0; t < a->Nl; t++) {
        const float *p = L->probs + (size_t)t * E;
        float norm = 1.0f;
        if (c->scoring_func == MT_SCORING_SIGMOID) {
            norm = 0.0f;
            for (int e = 0; e < E; e++) norm += p[e];
        }
        for (int e = 0; e < E; e++) P[e] += p[e] / norm;
    }
    P[E] = a->Nl;
    if (m->ep) m->ep->sum_f64(m->ep->ctx, P, (size_t)E + 1);
    double bl = 0.0;
    for (int e = 0; e < E; e++) bl += L->f[e] * (P[e] / P[E]);
    free(P);
    return E * bl * a->Nl / T;
}

void mt_balance_fwd(const mt_model *m, const mt_acts *a, const layer_acts *L, int B, int T, double *sum_out) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts;
    if (m->aux_scope == MT_AUX_EP_GROUP) {
        *sum_out += group_balance(m, a, L, T);
        return;
    }
    double *P = mt_xcalloc((size_t)B * E, sizeof(double));
    for (int t = 0; t < a->Nl; t++) {
        const float *p = L->probs + (size_t)t * E;
        const int tok = a->g0 + t;
        if (a->fed && tok % T >= a->fed[tok / T]) continue;
        double *Pb = P + (size_t)(tok / T) * E;
        float norm = 1.0f;
        if (c->scoring_func == MT_SCORING_SIGMOID) {
            norm = 0.0f;
            for (int e = 0; e < E; e++) norm += p[e];
        }
        for (int e = 0; e < E; e++) Pb[e] += p[e] / norm;
    }
    if (m->tp && m->tp->sp) m->tp->sum_f64(m->tp->ctx, P, (size_t)B * E);
    double total = 0.0;
    for (int b = 0; b < B; b++) {
        const int Tb = a->fed ? a->fed[b] : T; /* the row's real positions */
        if (Tb <= 0) continue;
        double bl = 0.0;
        for (int e = 0; e < E; e++) bl += L->f[(size_t)b * E + e] * (P[(size_t)b * E + e] / Tb);
        total += E * bl;
    }
    free(P);
    *sum_out += total;
}

/* Router backward: a->dw[N*K] (gradient of the routing weights, slot order) and the
 * balance loss -> dp -> scores; dln += its gradient, the router's weight gradient accumulates. */
static void route_bwd(const mt_config *c, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw,
                      const float *ln, const uint16_t *ln16, float *dln, int N, int T, float bal_coef, int group) {
    const int C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int sigmoid = c->scoring_func == MT_SCORING_SIGMOID;
    const float scale = (float)c->routed_scaling_factor;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *p = L->probs + (size_t)t * E;
        float *dp = a->ds + (size_t)t * E;
        memset(dp, 0, sizeof(float) * E);
        const int32_t *sel = L->sel + (size_t)t * K;
        const float *dwt = a->dw + (size_t)t * K;
        if (c->norm_topk_prob) {
            float S = 0.0f, dot = 0.0f;
            for (int j = 0; j < K; j++) S += p[sel[j]];
            S += 1e-20f;
            for (int j = 0; j < K; j++) dot += dwt[j] * p[sel[j]];
            for (int j = 0; j < K; j++) dp[sel[j]] += scale * (dwt[j] / S - dot / (S * S));
        } else {
            for (int j = 0; j < K; j++) dp[sel[j]] += scale * dwt[j];
        }
        const int tok = a->g0 + t, Tb = a->fed ? a->fed[tok / T] : T;
        if (bal_coef != 0.0f && tok % T < Tb) {
            /* d/dptilde[t,e] = bal_coef * E * f_e / T (T: the row's real positions). The
             * ep-group scope's the same with the group's f_e: its balance counts once per
             * sequence of the group and its P_e is a mean over the group's tokens */
            const float *f = group ? L->f : L->f + (size_t)(tok / T) * E;
            if (!sigmoid) {
                for (int e = 0; e < E; e++) dp[e] += bal_coef * E * f[e] / Tb;
            } else {
                float S = 0.0f, dot = 0.0f;
                for (int e = 0; e < E; e++) S += p[e];
                for (int e = 0; e < E; e++) dot += (bal_coef * E * f[e] / Tb) * p[e] / S;
                for (int e = 0; e < E; e++) dp[e] += (bal_coef * E * f[e] / Tb - dot) / S;
            }
        }
        if (!sigmoid) {
            float dot = 0.0f;
            for (int e = 0; e < E; e++) dot += dp[e] * p[e];
            for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - dot);
        } else {
            for (int e = 0; e < E; e++) dp[e] = dp[e] * p[e] * (1.0f - p[e]);
        }
    }
    mt_linear_bwd_x(a->ws, dln, dw->router, a->ds, NULL, ln, ln16, w->router, N, C, E, 1.0f);
}

/* MoE block backward: dln[N,C] = d/d(ln) (overwritten); weight grads accumulate. With
 * y = sum_j w_j E_j(x): the unweighted output-gradient rows travel to the experts (gather),
 * go through the down projection's data gradient, da' = dout W_d; then dw_j = da'_r . a_r
 * (so the expert outputs need not be kept), da = w_j da', and dW_d += dout^T (w a). The
 * input-gradient rows travel back (dispatch_bwd) with the routing-weight gradients beside
 * them, in one exchange. The shared experts run while the gather is pending. */
static void moe_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, int T,
                    const float *ln, const uint16_t *ln16, const float *dout, float *dln, float bal_coef) {
    const mt_config *c = &m->cfg;
    const mt_ep_ops *xo = xchg_of(m);
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, LE = E / xo->size;
    const int recompute = a->policy == MT_RECOMPUTE_SELECTIVE, h16 = a->bf16;
    mt_ep_batch *b = &L->epb;
    const int R = b->R;
    expert_ws ws = expert_scratch(m, a, L, R);
    grouped_ws(a, c, R, LE, h16);
    /* bf16 mode: the rows only products read as bf16 (model/internal.h); ye is the last
     * product's fp32 output, after its bf16 rows are read */
    uint16_t *ye16 = h16 && xo->bf16_rows ? ws.ye16 : NULL;
    float *ye = ye16 ? NULL : ws.ye;
    mt_trace_begin("moe.experts");
    xo->gather(xo->ctx, b, ye, ye16, dout);
    mt_trace_end();
    /* shared experts (SELECTIVE: their gate|up output is recomputed first) */
    mt_trace_begin("moe.shared");
    if (Fs > 0 && recompute) {
        mt_linear_fwd_x(a->ws, L->sgu, L->sgu16, ln, ln16, w->sgate, N, C, 2 * Fs, 0.0f);
    }
    if (Fs > 0)
        mt_ffn_bwd(a, dln, dw->sgate, dw->sdown, dout, ln, ln16, L->sgu, L->sgu16, w->sgate, w->sdown, N, C, Fs, N);
    mt_trace_end();
    mt_trace_begin("moe.experts");
    xo->wait(xo->ctx, b);
    xo->redispatch(xo->ctx, b, ln, xo->bf16_rows ? ln16 : NULL);
    float *egu = ws.egu, *act = ws.act, *dgu = ws.dgu;
    uint16_t *egu16 = ws.egu16, *act16 = ws.act16, *dgu16 = ws.dgu16;
    const int32_t *off = b->off;
    /* the gate|up outputs: kept over EP (the exchange's rows persist), recomputed locally
     * under SELECTIVE */
    if (recompute && !m->ep)
        mt_grouped_linear_fwd_x(a->ws, egu, egu16, b->xe, b->xe16, w->egate, (size_t)2 * Fm * C, off, LE, C, 2 * Fm, 0.0f);
    mt_grouped_linear_bwd_data_x(a->ws, ws.dact, ye, ye16, w->edown, (size_t)C * Fm, off, LE, Fm, C, 0.0f);
    /* per row: the activation again, dw_r = act_r . dact_r, act_r *= w_r */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        ws.dwr[r] = mt_swiglu_row_wgrad_x(a->ws, act ? act + (size_t)r * Fm : NULL, act16 ? act16 + (size_t)r * Fm : NULL,
                                          egu ? egu + (size_t)r * 2 * Fm : NULL,
                                          egu16 ? egu16 + (size_t)r * 2 * Fm : NULL, ws.dact + (size_t)r * Fm, b->w[r],
                                          Fm);
    mt_grouped_linear_bwd_weight_x(a->ws, dw->edown, (size_t)C * Fm, ye, ye16, act, act16, off, LE, Fm, C);
    mt_swiglu_rows_bwd_x(a->ws, dgu, dgu16, ws.dact, egu, egu16, b->w, R, Fm);
    mt_grouped_linear_bwd_data_x(a->ws, ws.ye, dgu, dgu16, w->egate, (size_t)2 * Fm * C, off, LE, C, 2 * Fm, 0.0f);
    /* the input gradients travel back while the gate|up weight gradient (2/3 of the experts'
     * weight-gradient FLOPs, needing neither) is computed */
    xo->dispatch_bwd(xo->ctx, b, dln, ws.ye, Fs > 0, a->dw, ws.dwr);
    mt_grouped_linear_bwd_weight_x(a->ws, dw->egate, (size_t)2 * Fm * C, dgu, dgu16, b->xe, b->xe16, off, LE, C, 2 * Fm);
    mt_trace_end();
    mt_trace_begin("moe.route");
    xo->wait(xo->ctx, b);
    xo->release(xo->ctx, b);
    route_bwd(c, a, L, w, dw, ln, ln16, dln, N, T, bal_coef, m->aux_scope == MT_AUX_EP_GROUP);
    mt_trace_end();
}

void mt_moe_block_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l, int B, int T,
                      const float *ln, const uint16_t *ln16, const float *res, float *out, int train) {
    moe_fwd(m, a, L, w, l, B, T, ln, ln16, res, out, train);
}

void mt_moe_block_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, int T,
                      const float *ln, const uint16_t *ln16, const float *dout, float *dln, float bal_coef) {
    moe_bwd(m, a, L, w, dw, T, ln, ln16, dout, dln, bal_coef);
}
