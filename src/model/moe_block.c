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


/* Router: scores in fp32, selection, routing weights (L->probs, L->sel, L->wsel). */
static void route_fwd(const mt_config *c, layer_acts *L, const mt_layer_w *w, const float *ln, const uint16_t *ln16,
                      int N) {
    const int C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int sigmoid = c->scoring_func == MT_SCORING_SIGMOID;
    mt_linear_fwd_x(L->probs, NULL, ln, ln16, w->router, N, C, E, 0.0f);
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
        mt_route_select(c, p, sel);
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

/* per-sequence routed fractions f_e (for the balance loss) of the chunk's Nl tokens, token
 * 0 being token g0 of the micro-batch; with SP the counts of the TP ranks are summed */
static void route_fractions(const mt_model *m, const mt_acts *a, layer_acts *L, int B, int T) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts, K = c->num_experts_per_tok, R = a->Nl * K;
    memset(L->f, 0, sizeof(float) * (size_t)B * E);
    for (int i = 0; i < R; i++) L->f[(size_t)((a->g0 + i / K) / T) * E + L->sel[i]] += 1.0f;
    if (m->tp && m->tp->sp) m->tp->sum_f32(m->tp->ctx, L->f, (size_t)B * E);
    for (size_t i = 0; i < (size_t)B * E; i++) L->f[i] /= (float)(T * K);
}

/* MoE block forward on the normed input ln[N,C]: out[N,C] = res + shared(ln) + sum_j w_j E_j(ln). */
static void moe_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l,
                    int B, int T, const float *ln, const uint16_t *ln16, const float *res, float *out) {
    const mt_config *c = &m->cfg;
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, R = N * K;
    mt_trace_begin("moe.route");
    route_fwd(c, L, w, ln, ln16, N);
    /* fused permute: rows grouped by expert, gathered into xe (bf16: the tables first, then
     * the gather) */
    const int h16 = mt_gemm_bf16_enabled();
    SCRATCH_PAIR(h16, a->xe, xe, xe16);
    SCRATCH_PAIR(h16, a->big1, act, act16);
    SCRATCH_PAIR(h16, L->egu, egu, egu16);
    mt_moe_permute(xe, L->eoff, L->slot_row, L->perm_tok, ln, L->sel, N, K, E, C);
    if (xe16) mt_moe_gather_x(NULL, xe16, ln, ln16, L->perm_tok, R, C);
    const int32_t *off = L->eoff;
    if (a->count_load) /* training tokens only, not evaluation */
        for (int e = 0; e < E; e++) a->load[(size_t)l * E + e] += off[e + 1] - off[e];
    route_fractions(m, a, L, B, T);
    mt_trace_end();
    /* grouped expert GEMMs: gate|up, SwiGLU, down */
    mt_trace_begin("moe.experts");
    mt_grouped_linear_fwd_x(egu, egu16, xe, xe16, w->egate, (size_t)2 * Fm * C, off, E, C, 2 * Fm, 0.0f);
    mt_swiglu_rows_fwd_x(act, act16, egu, egu16, R, Fm);
    mt_grouped_linear_fwd_x(a->ye, NULL, act, act16, w->edown, (size_t)C * Fm, off, E, Fm, C, 0.0f);
    mt_trace_end();
    /* the shared experts' product adds the residual stream in its output pass and the
     * weighted combine accumulates: the residual add costs no pass of its own */
    mt_trace_begin("moe.shared");
    if (Fs > 0) mt_ffn_fwd(a, out, res, L->sgu, ln, ln16, w->sgate, w->sdown, N, C, Fs, N);
    else mt_copy(out, res, (size_t)N * C);
    mt_trace_end();
    mt_trace_begin("moe.combine");
    mt_moe_unpermute(out, a->ye, L->wsel, L->slot_row, N, K, C, 1);
    mt_trace_end();
}

/* The same with the routed experts spread over an EP group: the (token, expert) rows travel
 * to the experts' ranks (dispatch), the local experts run as one grouped GEMM on what arrived
 * from every rank, and the outputs travel back weighted (combine). Sizes depend on the
 * routing of the whole group, so the expert buffers are allocated per step. */
static void moe_fwd_ep(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l,
                       int B, int T, const float *ln, const float *res, float *out, int train) {
    const mt_config *c = &m->cfg;
    const mt_ep_ops *ep = m->ep;
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, LE = E / ep->size;
    mt_trace_begin("moe.route");
    route_fwd(c, L, w, ln, NULL, N);
    if (a->count_load)
        for (int i = 0; i < N * K; i++) a->load[(size_t)l * E + L->sel[i]]++;
    route_fractions(m, a, L, B, T);
    ep->dispatch(ep->ctx, &L->epb, ln, L->sel, L->wsel, N, K, C, E);
    mt_trace_end();
    mt_trace_begin("moe.experts");
    const int R = L->epb.R, h16 = mt_gemm_bf16_enabled();
    L->ep_egu = mt_alloc((h16 ? sizeof(uint16_t) : sizeof(float)) * ((size_t)R * 2 * Fm + 1));
    SCRATCH_PAIR(h16, L->ep_egu, egu, egu16);
    float *act = mt_alloc(sizeof(float) * ((size_t)R * Fm + 1));
    float *ye = mt_alloc(sizeof(float) * ((size_t)R * C + 1));
    mt_grouped_linear_fwd_x(egu, egu16, L->epb.xe, NULL, w->egate, (size_t)2 * Fm * C, L->epb.off, LE, C, 2 * Fm,
                            0.0f);
    mt_swiglu_rows_fwd_x(act, NULL, egu, egu16, R, Fm);
    mt_grouped_linear_fwd(ye, act, w->edown, (size_t)C * Fm, L->epb.off, LE, Fm, C, 0.0f);
    mt_trace_end();
    mt_trace_begin("moe.combine");
    ep->combine(ep->ctx, &L->epb, a->ye, ye); /* a->ye: [N*K, C] scratch, >= [N, C] */
    mt_trace_end();
    mt_free(act);
    mt_free(ye);
    mt_trace_begin("moe.shared");
    if (Fs > 0) mt_ffn_fwd(a, out, res, L->sgu, ln, NULL, w->sgate, w->sdown, N, C, Fs, N);
    else mt_copy(out, res, (size_t)N * C);
    mt_trace_end();
    mt_add(out, a->ye, (size_t)N * C);
    if (!train) { /* no backward will come for this dispatch */
        ep->release(ep->ctx, &L->epb);
        mt_free(L->ep_egu);
        L->ep_egu = NULL;
    }
}

/* balance loss of each sequence: E * sum_e f_e * P_e, P_e = mean_t ptilde[t,e] (with SP the
 * per-sequence sums of the TP ranks are added first) */
void mt_balance_fwd(const mt_model *m, const mt_acts *a, const layer_acts *L, int B, int T, double *sum_out) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts;
    double *P = mt_xcalloc((size_t)B * E, sizeof(double));
    for (int t = 0; t < a->Nl; t++) {
        const float *p = L->probs + (size_t)t * E;
        double *Pb = P + (size_t)((a->g0 + t) / T) * E;
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
        double bl = 0.0;
        for (int e = 0; e < E; e++) bl += L->f[(size_t)b * E + e] * (P[(size_t)b * E + e] / T);
        total += E * bl;
    }
    free(P);
    *sum_out += total;
}

static void route_bwd(const mt_config *c, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw,
                      const float *ln, const uint16_t *ln16, float *dln, int N, int T, float bal_coef);

/* MoE block backward: dln[N,C] = d/d(ln) (overwritten); weight grads accumulate. */
static void moe_bwd(const mt_config *c, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, int T,
                    const float *ln, const uint16_t *ln16, const float *dout, float *dln, float bal_coef) {
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, R = N * K;
    const int32_t *off = L->eoff;
    const int recompute = a->policy == MT_RECOMPUTE_SELECTIVE;
    /* shared experts (SELECTIVE: their gate|up output is recomputed first) */
    mt_trace_begin("moe.shared");
    const int h16 = mt_gemm_bf16_enabled();
    if (Fs > 0 && recompute) {
        SCRATCH_PAIR(h16, L->sgu, sgu, sgu16);
        mt_linear_fwd_x(sgu, sgu16, ln, ln16, w->sgate, N, C, 2 * Fs, 0.0f);
    }
    if (Fs > 0)
        mt_ffn_bwd(a, dln, dw->sgate, dw->sdown, dout, ln, ln16, L->sgu, w->sgate, w->sdown, N, C, Fs, N);
    mt_trace_end();
    /* Routed experts. With y = sum_j w_j E_j(x): the unweighted dout rows go through the down
     * projection's data gradient, da' = dout W_d; then dw_j = da'_r . a_r (so the expert
     * outputs need not be kept), da = w_j da', and dW_d += dout^T (w a). */
    mt_trace_begin("moe.experts");
    /* bf16 mode: xe, act, the gathered output gradients ye, dgu and egu as bf16 (see
     * SCRATCH_PAIR); ye is the last product's fp32 output, after its bf16 rows are read */
    SCRATCH_PAIR(h16, L->egu, egu, egu16);
    SCRATCH_PAIR(h16, a->xe, xe, xe16);
    SCRATCH_PAIR(h16, a->ye, ye, ye16);
    SCRATCH_PAIR(h16, a->big1, act, act16);
    SCRATCH_PAIR(h16, a->big3, dgu, dgu16);
    float *dact = a->big2;
    mt_moe_gather_x(xe, xe16, ln, ln16, L->perm_tok, R, C);
    mt_moe_gather_x(ye, ye16, dout, NULL, L->perm_tok, R, C);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < R; i++) a->wrow[L->slot_row[i]] = L->wsel[i];
    if (recompute)
        mt_grouped_linear_fwd_x(egu, egu16, xe, xe16, w->egate, (size_t)2 * Fm * C, off, E, C, 2 * Fm, 0.0f);
    mt_grouped_linear_bwd_data_x(dact, ye, ye16, w->edown, (size_t)C * Fm, off, E, Fm, C, 0.0f);
    /* per pair i (row r): the activation again, dw_i = act_r . dact_r, act_r *= w_i */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < R; i++) {
        size_t r = (size_t)L->slot_row[i];
        a->dw[i] = mt_swiglu_row_wgrad_x(act ? act + r * Fm : NULL, act16 ? act16 + r * Fm : NULL,
                                         egu ? egu + r * 2 * Fm : NULL, egu16 ? egu16 + r * 2 * Fm : NULL,
                                         dact + r * Fm, L->wsel[i], Fm);
    }
    mt_grouped_linear_bwd_weight_x(dw->edown, (size_t)C * Fm, ye, ye16, act, act16, off, E, Fm, C);
    mt_swiglu_rows_bwd_x(dgu, dgu16, dact, egu, egu16, a->wrow, R, Fm);
    mt_grouped_linear_bwd_weight_x(dw->egate, (size_t)2 * Fm * C, dgu, dgu16, xe, xe16, off, E, C, 2 * Fm);
    mt_grouped_linear_bwd_data_x(a->ye, dgu, dgu16, w->egate, (size_t)2 * Fm * C, off, E, C, 2 * Fm, 0.0f);
    mt_trace_end();
    mt_trace_begin("moe.route");
    mt_moe_permute_bwd(dln, a->ye, L->slot_row, N, K, C, Fs > 0);
    route_bwd(c, a, L, w, dw, ln, ln16, dln, N, T, bal_coef);
    mt_trace_end();
}

/* Router backward: a->dw[N*K] (gradient of the routing weights, slot order) and the
 * balance loss -> dp -> scores; dln += its gradient, the router's weight gradient accumulates. */
static void route_bwd(const mt_config *c, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw,
                      const float *ln, const uint16_t *ln16, float *dln, int N, int T, float bal_coef) {
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
        if (bal_coef != 0.0f) {
            /* d/dptilde[t,e] = bal_coef * E * f_e / T */
            const float *f = L->f + (size_t)((a->g0 + t) / T) * E;
            if (!sigmoid) {
                for (int e = 0; e < E; e++) dp[e] += bal_coef * E * f[e] / T;
            } else {
                float S = 0.0f, dot = 0.0f;
                for (int e = 0; e < E; e++) S += p[e];
                for (int e = 0; e < E; e++) dot += (bal_coef * E * f[e] / T) * p[e] / S;
                for (int e = 0; e < E; e++) dp[e] += (bal_coef * E * f[e] / T - dot) / S;
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
    mt_linear_bwd_x(dln, dw->router, a->ds, NULL, ln, ln16, w->router, N, C, E, 1.0f);
}

/* MoE block backward with the experts over an EP group (see moe_fwd_ep): the unweighted
 * output gradients travel to the experts (gather), the input gradients come back (the
 * dispatch's backward) and so do the routing-weight gradients (to_source). */
static void moe_bwd_ep(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw,
                       int T, const float *ln, const float *dout, float *dln, float bal_coef) {
    const mt_config *c = &m->cfg;
    const mt_ep_ops *ep = m->ep;
    const int N = a->Nl, C = c->hidden_size, E = c->n_routed_experts;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, LE = E / ep->size;
    const mt_ep_batch *b = &L->epb;
    const int R = b->R;
    const int32_t *off = b->off;
    mt_trace_begin("moe.shared");
    const int h16 = mt_gemm_bf16_enabled();
    if (Fs > 0 && a->policy == MT_RECOMPUTE_SELECTIVE) {
        SCRATCH_PAIR(h16, L->sgu, sgu, sgu16);
        mt_linear_fwd_x(sgu, sgu16, ln, NULL, w->sgate, N, C, 2 * Fs, 0.0f);
    }
    if (Fs > 0)
        mt_ffn_bwd(a, dln, dw->sgate, dw->sdown, dout, ln, NULL, L->sgu, w->sgate, w->sdown, N, C, Fs, N);
    mt_trace_end();
    mt_trace_begin("moe.experts");
    float *yeu = mt_alloc(sizeof(float) * ((size_t)R * C + 1));
    float *act = mt_alloc(sizeof(float) * ((size_t)R * Fm + 1));
    float *dact = mt_alloc(sizeof(float) * ((size_t)R * Fm + 1));
    float *dgu = mt_alloc(sizeof(float) * ((size_t)R * 2 * Fm + 1));
    float *dwv = mt_alloc(sizeof(float) * ((size_t)R + 1));
    SCRATCH_PAIR(h16, L->ep_egu, egu, egu16);
    ep->gather(ep->ctx, b, yeu, dout);
    mt_grouped_linear_bwd_data(dact, yeu, w->edown, (size_t)C * Fm, off, LE, Fm, C, 0.0f);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        dwv[r] = mt_swiglu_row_wgrad_x(act + (size_t)r * Fm, NULL, egu ? egu + (size_t)r * 2 * Fm : NULL,
                                       egu16 ? egu16 + (size_t)r * 2 * Fm : NULL, dact + (size_t)r * Fm, b->w[r], Fm);
    mt_grouped_linear_bwd_weight(dw->edown, (size_t)C * Fm, yeu, act, off, LE, Fm, C);
    mt_swiglu_rows_bwd_x(dgu, NULL, dact, egu, egu16, b->w, R, Fm);
    mt_grouped_linear_bwd_weight(dw->egate, (size_t)2 * Fm * C, dgu, b->xe, off, LE, C, 2 * Fm);
    mt_grouped_linear_bwd_data(yeu, dgu, w->egate, (size_t)2 * Fm * C, off, LE, C, 2 * Fm, 0.0f);
    mt_trace_end();
    mt_trace_begin("moe.route");
    ep->dispatch_bwd(ep->ctx, b, a->ye, yeu);
    if (Fs > 0) mt_add(dln, a->ye, (size_t)N * C);
    else mt_copy(dln, a->ye, (size_t)N * C);
    ep->to_source(ep->ctx, b, a->dw, dwv);
    mt_free(yeu);
    mt_free(act);
    mt_free(dact);
    mt_free(dgu);
    mt_free(dwv);
    ep->release(ep->ctx, &L->epb);
    mt_free(L->ep_egu);
    L->ep_egu = NULL;
    route_bwd(c, a, L, w, dw, ln, NULL, dln, N, T, bal_coef);
    mt_trace_end();
}

void mt_moe_block_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l, int B, int T,
                      const float *ln, const uint16_t *ln16, const float *res, float *out, int train) {
    if (m->ep) moe_fwd_ep(m, a, L, w, l, B, T, a->ln, res, out, train);
    else moe_fwd(m, a, L, w, l, B, T, ln, ln16, res, out);
}

void mt_moe_block_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, int T,
                      const float *ln, const uint16_t *ln16, const float *dout, float *dln, float bal_coef) {
    if (m->ep) moe_bwd_ep(m, a, L, w, dw, T, a->ln, dout, dln, bal_coef);
    else moe_bwd(&m->cfg, a, L, w, dw, T, ln, ln16, dout, dln, bal_coef);
}
