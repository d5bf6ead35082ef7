/* model/model.c — the explicit forward and backward of the docs/FORMATS.md transformer for one
 * micro-batch: attention, FFN and MoE layers, the head (see model.h). */
#include "model/model.h"

#include <limits.h>
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

/* ---------------------------------------------------------------- step */

void mt_doc_positions(const int32_t *inputs, int B, int T, int32_t eot, int32_t *pos) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            pos[n] = (t == 0 || inputs[n - 1] == eot) ? 0 : pos[n - 1] + 1;
        }
}

void mt_model_step(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                   int B, int T, int train, float ce_scale, float bal_scale, float *logits,
                   mt_step_stats *st) {
    mt_model_step_pos(m, a, inputs, targets, NULL, B, T, train, ce_scale, bal_scale, logits, st);
}

void mt_model_step_pos(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                       const int32_t *pos, int B, int T, int train, float ce_scale, float bal_scale,
                       float *logits, mt_step_stats *st) {
    memset(st, 0, sizeof *st);
    mt_loss loss = {ce_scale, NULL, NULL, NULL, 0, NULL, NULL};
    float ms[MT_MAX_MTP];
    int64_t nv[MT_MAX_MTP];
    if (a->nmtp > 0) { /* the MTP blocks run (and train) too, the batch being the global one */
        for (int k = 1; k <= a->nmtp; k++) nv[k - 1] = mt_mtp_valid(targets, B, T, k);
        mt_mtp_scales(&m->cfg, nv, ms);
        loss.mtp_scale = ms;
    }
    mt_model_forward(m, a, inputs, targets, pos, B, T, train, &loss, logits, st);
    if (train) mt_model_backward(m, a, inputs, pos, B, T, bal_scale);
}

mt_loss mt_loss_micro(const mt_loss *l, int mb, int B, int T, mt_head_obj *obj) {
    mt_loss m = *l;
    const size_t BT = (size_t)B * T;
    if (l->obj) {
        *obj = *l->obj;
        obj->base += (int64_t)mb * (int64_t)BT;
        m.obj = obj;
    }
    if (l->fed) m.fed = l->fed + (size_t)mb * B;
    if (l->replay) m.replay = l->replay + (size_t)mb * BT * (size_t)l->replay_stride;
    return m;
}

/* Tensor parallelism: the input of a column-parallel linear, all N tokens (SP: gathered
 * from the TP ranks' blocks into a->gat; else the local rows are all the rows) */
static const float *tp_in(const mt_model *m, mt_acts *a, float *buf, const float *local, int C) {
    if (!a->sp) return local;
    m->tp->gather(m->tp->ctx, buf, local, (size_t)a->Nl * C);
    return buf;
}

/* the sum over TP of a row-parallel linear's partial [N,C] into this rank's rows out[Nl,C]
 * (SP: reduce-scatter; else all-reduce); part is clobbered */
static void tp_out(const mt_model *m, float *out, float *part, int N, int C) {
    m->tp->reduce(m->tp->ctx, out, part, (size_t)N * C);
}

/* RMSNorm of x into a->ln, the layer's normed input: as bf16 when only products read it
 * (bf16 mode, no TP, whose all-gathers move fp32, and for a MoE layer no EP, whose dispatch
 * does), else fp32; *f and *h get the one that was written (the other NULL). */
static void norm_in(const mt_model *m, mt_acts *a, int moe_layer, float *rstd, const float *x, const float *w,
                    const float **f, const uint16_t **h) {
    const mt_config *c = &m->cfg;
    const float eps = (float)c->rms_norm_eps;
    const int tp = m->tp ? m->tp->size : 1, h16 = a->bf16 && tp == 1 && !(moe_layer && m->ep);
    if (h16) mt_rmsnorm_fwd16(a->ws, a->ln16, rstd, x, w, a->Nl, c->hidden_size, eps);
    else mt_rmsnorm_fwd(a->ln, rstd, x, w, a->Nl, c->hidden_size, eps);
    *f = h16 ? NULL : a->ln;
    *h = h16 ? a->ln16 : NULL;
}

/* The attention output before the residual: y = att Wo^T, over TP the partial sums of the local
 * heads summed into this rank's rows (row-parallel). */
static void attn_out(const mt_model *m, mt_acts *a, float *y, const float *att, const float *wo, int N, int HD, int C) {
    if (!m->tp) {
        mt_linear_fwd(a->ws, y, att, wo, N, HD, C, 0.0f);
    } else {
        mt_linear_fwd(a->ws, a->part, att, wo, N, HD, C, 0.0f);
        tp_out(m, y, a->part, N, C);
    }
}

/* h = x + att Wo^T, or with the sandwich norm h = x + rmsnorm(att Wo^T, post_attention_layernorm)
 * (L->ya keeps the product, L->rstd_ya its 1/rms) */
static void attn_residual(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int N, int HD) {
    const int C = m->cfg.hidden_size, Nl = a->Nl;
    if (m->cfg.sandwich_norm) {
        attn_out(m, a, L->ya, L->att, w->wo, N, HD, C);
        mt_rmsnorm_fwd(L->h, L->rstd_ya, L->ya, w->post_norm, Nl, C, (float)m->cfg.rms_norm_eps);
        mt_add(L->h, L->x, (size_t)Nl * C);
    } else if (!m->tp) { /* residual add fused into the output projection */
        mt_linear_fwd_res(a->ws, L->h, L->x, L->att, NULL, w->wo, N, HD, C);
    } else {
        attn_out(m, a, L->h, L->att, w->wo, N, HD, C);
        mt_add(L->h, L->x, (size_t)Nl * C);
    }
}

/* The sandwich norm's backward of out = res + rmsnorm(y, w): a->dsub = d/dy from dout
 * (the gradient of out, which is also res's: the caller keeps adding into it) */
static const float *sub_norm_bwd(mt_acts *a, float *dw, const float *dout, const float *y, const float *w,
                                 const float *rstd, int C) {
    mt_zero(a->dsub, (size_t)a->Nl * C);
    mt_rmsnorm_bwd(a->dsub, dw, dout, y, w, rstd, a->Nl, C);
    return a->dsub;
}

void mt_layer_fwd(const mt_model *m, mt_acts *a, layer_acts *L, int l, float *xout, const int32_t *pos, int B, int T,
                  int train, mt_step_stats *st) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, H = c->num_attention_heads / tp;
    const int G = c->num_key_value_heads / tp, D = c->head_dim, F = c->intermediate_size / tp;
    const int rope = c->rope_interleave ? MT_ROPE_INTERLEAVE : 0, mla = mt_config_is_mla(c);
    const int AO = H * (mla ? c->v_head_dim : D); /* the attention output's width (o_proj's input) */
    const int Nl = a->Nl, sw = c->sandwich_norm;
    const float eps = (float)c->rms_norm_eps;
    const mt_layer_w *w = &m->w[l];
    mt_trace_begin("fwd.attention");
    const float *lnx;
    const uint16_t *ln16;
    norm_in(m, a, 0, L->rstd1, L->x, w->in_norm, &lnx, &ln16);
    const float *lnf = tp > 1 ? tp_in(m, a, a->gat, a->ln, C) : lnx;
    if (mla) {
        mt_mla_fwd(m, a, L, w, lnf, ln16, pos, B, T);
    } else if (a->kv16) { /* V's product rounds its output; K in fp32 in the attention backward's
                           * dk (free in the forward), rotated and rounded in one pass */
        mt_linear_fwd_x(a->ws, L->q, NULL, lnf, ln16, w->wq, N, C, H * D, 0.0f);
        mt_rope_apply_pos(L->q, a->cos_t, a->sin_t, pos, N, T, H, D, rope);
        mt_linear_fwd_x(a->ws, a->dk, NULL, lnf, ln16, w->wk, N, C, G * D, 0.0f);
        mt_linear_fwd_x(a->ws, NULL, L->v16, lnf, ln16, w->wv, N, C, G * D, 0.0f);
        mt_rope_store16(a->ws, L->k16, a->dk, a->cos_t, a->sin_t, pos, N, T, G, D, rope);
        mt_attention_fwd_kv16(L->att, L->lse, L->q, L->k16, L->v16, pos, B, T, H, G, D, a->att_scratch, a->nthr);
    } else {
        mt_linear_fwd_x(a->ws, L->q, NULL, lnf, ln16, w->wq, N, C, H * D, 0.0f);
        mt_rope_apply_pos(L->q, a->cos_t, a->sin_t, pos, N, T, H, D, rope);
        mt_linear_fwd_x(a->ws, L->k, NULL, lnf, ln16, w->wk, N, C, G * D, 0.0f);
        mt_linear_fwd_x(a->ws, L->v, NULL, lnf, ln16, w->wv, N, C, G * D, 0.0f);
        mt_rope_apply_pos(L->k, a->cos_t, a->sin_t, pos, N, T, G, D, rope);
        mt_attention_fwd(L->att, L->lse, L->q, L->k, L->v, pos, B, T, H, G, D, a->att_scratch, a->nthr, a->bf16);
    }
    attn_residual(m, a, L, w, N, AO);
    norm_in(m, a, mt_config_is_moe(c, l), L->rstd2, L->h, sw ? w->pre_mlp_norm : w->post_norm, &lnx, &ln16);
    mt_trace_end();
    /* the FFN writes xout = h + FFN(norm(h)); with the sandwich norm its output goes to
     * L->yf, normed into xout after it */
    float *fout = sw ? L->yf : xout;
    const float *fres = sw ? NULL : L->h;
    if (!mt_config_is_moe(c, l)) {
        mt_trace_begin("fwd.ffn");
        if (tp == 1) {
            mt_ffn_fwd(a, fout, fres, L->gu, L->gu16, lnx, ln16, w->gate, w->down, N, C, F, a->ffn_rows);
        } else {
            const float *lf = tp_in(m, a, a->gat, a->ln, C);
            mt_ffn_fwd(a, a->part, NULL, L->gu, L->gu16, lf, NULL, w->gate, w->down, N, C, F, a->ffn_rows);
            if (sw) {
                tp_out(m, fout, a->part, N, C);
            } else {
                tp_out(m, a->dln, a->part, N, C); /* dln: scratch in the forward */
                mt_copy(xout, L->h, (size_t)Nl * C);
                mt_add(xout, a->dln, (size_t)Nl * C);
            }
        }
    } else {
        mt_trace_begin("fwd.moe");
        mt_moe_block_fwd(m, a, L, w, l, B, T, lnx, ln16, fres, fout, train);
        mt_balance_fwd(m, a, L, B, T, &st->bal_sum[l]);
    }
    if (sw) {
        mt_rmsnorm_fwd(xout, L->rstd_yf, L->yf, w->post_mlp_norm, Nl, C, eps);
        mt_add(xout, L->h, (size_t)Nl * C);
    }
    mt_trace_end();
}

void mt_model_forward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                      const int32_t *pos, int B, int T, int train, const mt_loss *loss, float *logits,
                      mt_step_stats *st) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, V = c->vocab_size, lo = a->lo, hi = a->hi;
    const float eps = (float)c->rms_norm_eps;
    MT_ASSERT(T <= a->T && (size_t)N <= a->cap && (tp > 1) == (a->tp > 1));
    MT_ASSERT(!a->kv16 || a->bf16); /* the bf16 scratch sizes (acts_layout) */
    mt_acts_ws_reserve(a, c, N);
    a->Nl = a->sp ? N / tp : N;
    a->g0 = a->sp ? m->tp->rank * a->Nl : 0;
    MT_ASSERT(!a->sp || N % tp == 0);
    const int Nl = a->Nl;
    a->count_load = train;
    a->fed = loss ? loss->fed : NULL;
    a->replay = loss ? loss->replay : NULL;
    a->replay_stride = loss ? loss->replay_stride : 0;
    a->mtp_ran = 0;

    float *x0 = mt_acts_input(a);
    if (m->params_ready) m->params_ready(m->hook_ctx, lo);
    if (a->first) { /* embedding of this rank's tokens */
        const int32_t *tok = inputs + a->g0;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < Nl; n++)
            memcpy(x0 + (size_t)n * C, m->embed + (size_t)tok[n] * C, sizeof(float) * C);
    }
    for (int l = lo; l < hi; l++) {
        if (m->params_ready && l > lo) m->params_ready(m->hook_ctx, l);
        mt_layer_fwd(m, a, &a->L[l - lo], l, l + 1 < hi ? a->L[l + 1 - lo].x : a->xf, pos, B, T, train, st);
    }
    if (!a->last) return;
    if (m->params_ready) m->params_ready(m->hook_ctx, INT_MAX);
    mt_trace_begin(train ? "fwd.head+ce (+bwd)" : "fwd.head");
    const int32_t *tg = targets + a->g0;
    mt_rmsnorm_fwd(a->lnf, a->rstdf, a->xf, m->norm, Nl, C, eps);
    int64_t nv = 0;
    for (int n = 0; n < Nl; n++) nv += tg[n] >= 0;
    st->n_valid += nv;
    mt_head_obj obj;
    if (loss && loss->obj) {
        obj = *loss->obj;
        obj.base += a->g0;
    }
    st->ce_sum += mt_head_ce(a->ws, train ? a->dln : NULL, train ? m->d_head : NULL, logits, a->lnf, m->head, tg, Nl, C, V,
                             loss ? loss->ce_scale : 0.0f, loss && loss->obj ? &obj : NULL, a->head_scratch);
    if (train) { /* the final norm's backward too: the MTP blocks reuse dln, and add into dres */
        mt_zero(a->dres, (size_t)Nl * C);
        mt_rmsnorm_bwd(a->dres, m->d_norm, a->dln, a->xf, m->norm, a->rstdf, Nl, C);
    }
    mt_trace_end();
    if (a->nmtp > 0 && loss && loss->mtp_scale) mt_mtp_fwd(m, a, inputs, targets, pos, B, T, train, loss, st);
}

/* The GQA attention's backward from a->datt = d(att): the gradients of q, k, v's weights
 * (accumulated) and of their input into dl (overwritten; under TP the rank's part). */
static void gqa_bwd(const mt_model *m, mt_acts *a, const layer_acts *L, const mt_layer_w *w, mt_layer_w *dw,
                    const float *lnf, const uint16_t *ln16, const int32_t *pos, int B, int T, float *dl) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, H = c->num_attention_heads / tp;
    const int G = c->num_key_value_heads / tp, D = c->head_dim;
    const int rope = c->rope_interleave ? MT_ROPE_INTERLEAVE : 0;
    if (a->kv16)
        mt_attention_bwd_kv16(a->dq, a->dk, a->dv, a->datt, L->q, L->k16, L->v16, L->att, L->lse, pos, B, T, H,
                              G, D, a->att_scratch, a->nthr);
    else
        mt_attention_bwd(a->dq, a->dk, a->dv, a->datt, L->q, L->k, L->v, L->att, L->lse, pos, B, T, H, G, D,
                         a->att_scratch, a->nthr, a->bf16);
    mt_rope_apply_pos(a->dq, a->cos_t, a->sin_t, pos, N, T, H, D, rope | MT_ROPE_INVERSE);
    mt_rope_apply_pos(a->dk, a->cos_t, a->sin_t, pos, N, T, G, D, rope | MT_ROPE_INVERSE);
    mt_linear_bwd(a->ws, dl, NULL, a->dq, lnf, w->wq, N, C, H * D, 0.0f);
    mt_linear_bwd(a->ws, dl, NULL, a->dk, lnf, w->wk, N, C, G * D, 1.0f);
    mt_linear_bwd(a->ws, dl, NULL, a->dv, lnf, w->wv, N, C, G * D, 1.0f);
    { /* their weight gradients read lnf packed once, into datt (dead since the attention
       * backward) when it is large enough */
        float *const dws[3] = {dw->wq, dw->wk, dw->wv};
        const float *const dos[3] = {a->dq, a->dk, a->dv};
        const int os[3] = {H * D, G * D, G * D};
        mt_linear_bwd_weight_shared(a->ws, 3, dws, dos, os, lnf, ln16, N, C, a->datt, (size_t)N * H * D);
    }
}

void mt_layer_bwd(const mt_model *m, mt_acts *a, layer_acts *L, int l, float *d, const int32_t *pos, int B, int T,
                  float bal_coef) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, H = c->num_attention_heads / tp;
    const int D = c->head_dim, F = c->intermediate_size / tp, mla = mt_config_is_mla(c);
    const int AO = H * (mla ? c->v_head_dim : D); /* the attention output's width (o_proj's input) */
    const int Nl = a->Nl, sw = c->sandwich_norm;
    const mt_layer_w *w = &m->w[l];
    mt_layer_w *dw = &m->g[l];
    if (a->policy == MT_RECOMPUTE_SELECTIVE) attn_residual(m, a, L, w, N, AO); /* h, as in the forward */
    mt_trace_begin(mt_config_is_moe(c, l) ? "bwd.moe" : "bwd.ffn");
    /* ffn: d is the gradient of the layer output, dy that of the FFN's output (the
     * sandwich norm's input); recompute the FFN's normed input */
    const float *fnorm = sw ? w->pre_mlp_norm : w->post_norm;
    const float *dy = sw ? sub_norm_bwd(a, dw->post_mlp_norm, d, L->yf, w->post_mlp_norm, L->rstd_yf, C) : d;
    const float *lnx;
    const uint16_t *ln16;
    norm_in(m, a, mt_config_is_moe(c, l), a->rstd_tmp, L->h, fnorm, &lnx, &ln16);
    if (!mt_config_is_moe(c, l)) {
        if (tp == 1) {
            mt_ffn_bwd(a, a->dln, dw->gate, dw->down, dy, lnx, ln16, L->gu, L->gu16, w->gate, w->down, N, C, F,
                       a->ffn_rows);
        } else { /* gathered input and output gradient; the input gradient summed over TP */
            const float *lf = tp_in(m, a, a->gat, a->ln, C);
            const float *df = tp_in(m, a, a->dgat, dy, C);
            mt_ffn_bwd(a, a->part, dw->gate, dw->down, df, lf, NULL, L->gu, L->gu16, w->gate, w->down, N, C, F,
                       a->ffn_rows);
            tp_out(m, a->dln, a->part, N, C);
        }
    } else {
        mt_moe_block_bwd(m, a, L, w, dw, T, lnx, ln16, dy, a->dln, bal_coef);
    }
    mt_rmsnorm_bwd(d, sw ? dw->pre_mlp_norm : dw->post_norm, a->dln, L->h, fnorm, L->rstd2, Nl, C);
    mt_trace_end();
    mt_trace_begin("bwd.attention");
    /* attention: d is now the gradient of h, dy that of the attention output */
    dy = sw ? sub_norm_bwd(a, dw->post_norm, d, L->ya, w->post_norm, L->rstd_ya, C) : d;
    norm_in(m, a, 0, a->rstd_tmp, L->x, w->in_norm, &lnx, &ln16);
    const float *lnf = tp > 1 ? tp_in(m, a, a->gat, a->ln, C) : lnx;
    const float *df = tp > 1 ? tp_in(m, a, a->dgat, dy, C) : dy;
    mt_linear_bwd(a->ws, a->datt, dw->wo, df, L->att, w->wo, N, AO, C, 0.0f);
    float *dl = tp > 1 ? a->part : a->dln;
    if (mla) mt_mla_bwd(m, a, L, w, dw, lnf, ln16, pos, B, T, dl);
    else gqa_bwd(m, a, L, w, dw, lnf, ln16, pos, B, T, dl);
    if (tp > 1) tp_out(m, a->dln, a->part, N, C);
    mt_rmsnorm_bwd(d, dw->in_norm, a->dln, L->x, w->in_norm, L->rstd1, Nl, C);
    mt_trace_end();
}

void mt_model_backward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *pos, int B, int T,
                       float bal_scale) {
    const mt_config *c = &m->cfg;
    const int N = B * T, C = c->hidden_size, lo = a->lo, hi = a->hi, Nl = a->Nl;
    MT_ASSERT(!a->kv16 || a->bf16); /* the bf16 scratch sizes (acts_layout) */
    mt_acts_ws_reserve(a, c, N);
    /* a last chunk's forward left the gradient of its output in dres (the head's and the final
     * norm's backward ran with it); the MTP blocks add theirs */
    float *d = a->dres;
    const float bal_coef = (float)(c->aux_loss_alpha * bal_scale);
    if (a->mtp_ran) {
        mt_mtp_bwd(m, a, pos, B, T, bal_coef);
        for (int k = a->nmtp; k >= 1 && m->grad_ready; k--) m->grad_ready(m->hook_ctx, a->Lm + k - 1);
    }
    for (int l = hi - 1; l >= lo; l--) {
        mt_layer_bwd(m, a, &a->L[l - lo], l, d, pos, B, T, bal_coef);
        if (m->grad_ready) m->grad_ready(m->hook_ctx, l);
    }
    if (!a->first) return; /* d is the gradient of the chunk's input */
    /* embedding backward: thread i owns the vocabulary rows congruent to i, and adds the
     * tokens in their order, so every row sums in the same order for any thread count */
    const int32_t *tok = inputs + a->g0;
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        for (int n = 0; n < Nl; n++) {
            if (tok[n] % nt != tid) continue;
            float *de = m->d_embed + (size_t)tok[n] * C;
            const float *dn = d + (size_t)n * C;
            for (int q = 0; q < C; q++) de[q] += dn[q];
        }
    }
}
