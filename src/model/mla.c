/* model/mla.c — the multi-head latent attention sublayer (attention_type "mla", docs/FORMATS.md):
 * the projections around the flash attention, forward and backward (see model/internal.h).
 *
 * Per token: q = q_b(norm(q_a(x))) (or q_proj(x)) [H, dn+dr]; c = kv_a(x)[:kvl], k_pe =
 * kv_a(x)[kvl:] (one head); kv = kv_b(norm(c)) [H, dn+dv]; RoPE on q's last dr dimensions of
 * every head and on k_pe. The attention runs on per-head k = [k_nope_h | k_pe] and v_h built
 * here (G = H heads, q/k width dn+dr, v width dv), so the training forward is the GQA flash
 * kernel with a second width; the compressed form is the decoder's business (model/decode.c).
 *
 * Tensor parallelism splits heads: q_b / q_proj and kv_b by rows, o_proj by columns. q_a and
 * kv_a (and their norms) are replicated, and each rank's heads give a part of the gradient of
 * their outputs. With SP the replicated tensors' gradients are summed over TP by the
 * optimizer, so each rank keeps its part; without SP they must be the same on every rank, so
 * those output gradients are summed over TP first, and TP rank 0 alone adds what flows
 * through q_a / kv_a to the input gradient that the caller then sums. */
#include <string.h>

#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "model/internal.h"

typedef struct {
    int N, C, H, ql, kvl, dn, dr, dv, dq, rope;
    float eps;
} mla_dims;

static mla_dims dims_of(const mt_model *m, int N) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    mla_dims d = {N, c->hidden_size, c->num_attention_heads / tp, c->q_lora_rank, c->kv_lora_rank,
                  c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim,
                  c->qk_nope_head_dim + c->qk_rope_head_dim, c->rope_interleave ? MT_ROPE_INTERLEAVE : 0,
                  (float)c->rms_norm_eps};
    return d;
}

/* The up-projections: q (from the kept q latent cq, or from the input without query
 * compression), k_pe from the input, and the per-head k, v from the kept c; rope applied.
 * The forward runs them once; with selective recompute the backward runs them again into
 * the buffers all layers share, with the same operations (the same bits). */
static void mla_up(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, const float *lnf,
                   const uint16_t *ln16, const int32_t *pos, int T, const mla_dims *dp) {
    const mla_dims d = *dp;
    const int N = d.N, C = d.C, H = d.H, dkv = d.dn + d.dv;
    if (d.ql > 0) {
        mt_rmsnorm_fwd(a->cqn, L->rstdq, L->cq, w->qa_norm, N, d.ql, d.eps);
        mt_linear_fwd(a->ws, L->q, a->cqn, w->wq, N, d.ql, H * d.dq, 0.0f);
    } else {
        mt_linear_fwd_x(a->ws, L->q, NULL, lnf, ln16, w->wq, N, C, H * d.dq, 0.0f);
    }
    mt_rope_apply_ld(L->q + d.dn, a->cos_t, a->sin_t, pos, N, T, H, d.dr, (size_t)H * d.dq, (size_t)d.dq, d.rope);
    mt_linear_fwd_x(a->ws, a->kpe, NULL, lnf, ln16, w->wkva + (size_t)d.kvl * C, N, C, d.dr, 0.0f);
    mt_rope_apply_pos(a->kpe, a->cos_t, a->sin_t, pos, N, T, 1, d.dr, d.rope);
    mt_rmsnorm_fwd(a->cn, L->rstdkv, L->ckv, w->kva_norm, N, d.kvl, d.eps);
    mt_linear_fwd(a->ws, a->dkv, a->cn, w->wkvb, N, d.kvl, H * dkv, 0.0f);
    /* per head: k = [k_nope_h | k_pe], v = v_h */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const float *kv = a->dkv + ((size_t)n * H + h) * dkv;
            float *k = L->k + ((size_t)n * H + h) * d.dq;
            memcpy(k, kv, sizeof(float) * d.dn);
            memcpy(k + d.dn, a->kpe + (size_t)n * d.dr, sizeof(float) * d.dr);
            memcpy(L->v + ((size_t)n * H + h) * d.dv, kv + d.dn, sizeof(float) * d.dv);
        }
}

void mt_mla_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, const float *lnf,
                const uint16_t *ln16, const int32_t *pos, int B, int T) {
    const mla_dims d = dims_of(m, B * T);
    const int N = d.N, C = d.C, H = d.H;
    /* the compressed q latent and c, kept; kv_a's rows [0, kvl) give c, the last dr k_pe */
    if (d.ql > 0) mt_linear_fwd_x(a->ws, L->cq, NULL, lnf, ln16, w->wqa, N, C, d.ql, 0.0f);
    mt_linear_fwd_x(a->ws, L->ckv, NULL, lnf, ln16, w->wkva, N, C, d.kvl, 0.0f);
    mla_up(m, a, L, w, lnf, ln16, pos, T, &d);
    mt_attention_fwd_dv(L->att, L->lse, L->q, L->k, L->v, pos, B, T, H, H, d.dq, d.dv, a->att_scratch, a->nthr,
                        a->bf16);
}

void mt_mla_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, const float *lnf,
                const uint16_t *ln16, const int32_t *pos, int B, int T, float *dl) {
    const mla_dims d = dims_of(m, B * T);
    const int N = d.N, C = d.C, H = d.H, dkv = d.dn + d.dv;
    const int tp_sum = m->tp && !a->sp; /* the replicated projections' output gradients summed over TP */
    const int full_here = !tp_sum || m->tp->rank == 0; /* adds what flows through q_a / kv_a */
    if (a->policy == MT_RECOMPUTE_SELECTIVE) mla_up(m, a, L, w, lnf, ln16, pos, T, &d);
    mt_attention_bwd_dv(a->dq, a->dk, a->dv, a->datt, L->q, L->k, L->v, L->att, L->lse, pos, B, T, H, H, d.dq, d.dv,
                        a->att_scratch, a->nthr, a->bf16);
    mt_rope_apply_ld(a->dq + d.dn, a->cos_t, a->sin_t, pos, N, T, H, d.dr, (size_t)H * d.dq, (size_t)d.dq,
                     d.rope | MT_ROPE_INVERSE);
    /* d kv_b's output = [dk_nope_h | dv_h] per head; d k_pe = the sum over heads of their
     * k_pe parts, in head order */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *kp = a->kpe + (size_t)n * d.dr;
        memset(kp, 0, sizeof(float) * d.dr);
        for (int h = 0; h < H; h++) {
            const float *dk = a->dk + ((size_t)n * H + h) * d.dq;
            float *g = a->dkv + ((size_t)n * H + h) * dkv;
            memcpy(g, dk, sizeof(float) * d.dn);
            memcpy(g + d.dn, a->dv + ((size_t)n * H + h) * d.dv, sizeof(float) * d.dv);
            for (int j = 0; j < d.dr; j++) kp[j] += dk[d.dn + j];
        }
    }
    mt_rope_apply_pos(a->kpe, a->cos_t, a->sin_t, pos, N, T, 1, d.dr, d.rope | MT_ROPE_INVERSE);
    /* kv_b: its input (normed c) recomputed, as the layer input's norm is */
    mt_rmsnorm_fwd(a->cn, L->rstdkv, L->ckv, w->kva_norm, N, d.kvl, d.eps);
    mt_linear_bwd(a->ws, a->dcn, dw->wkvb, a->dkv, a->cn, w->wkvb, N, d.kvl, H * dkv, 0.0f);
    if (tp_sum) {
        m->tp->sum_f32(m->tp->ctx, a->dcn, (size_t)N * d.kvl);
        m->tp->sum_f32(m->tp->ctx, a->kpe, (size_t)N * d.dr);
    }
    mt_zero(a->dckv, (size_t)N * d.kvl);
    mt_rmsnorm_bwd(a->dckv, dw->kva_norm, a->dcn, L->ckv, w->kva_norm, L->rstdkv, N, d.kvl);
    /* q: through q_b and q_a's norm, or q_proj */
    const float *dqin = a->dq; /* the gradient of the product that reads the layer input */
    float *dwq_in = dw->wq;
    int qin = H * d.dq;
    if (d.ql > 0) {
        mt_rmsnorm_fwd(a->cqn, L->rstdq, L->cq, w->qa_norm, N, d.ql, d.eps);
        mt_linear_bwd(a->ws, a->dcqn, dw->wq, a->dq, a->cqn, w->wq, N, d.ql, H * d.dq, 0.0f);
        if (tp_sum) m->tp->sum_f32(m->tp->ctx, a->dcqn, (size_t)N * d.ql);
        mt_zero(a->dcq, (size_t)N * d.ql);
        mt_rmsnorm_bwd(a->dcq, dw->qa_norm, a->dcqn, L->cq, w->qa_norm, L->rstdq, N, d.ql);
        dqin = a->dcq;
        dwq_in = dw->wqa;
        qin = d.ql;
    }
    /* the input gradient: q's product is per head (a part under TP) unless it is q_a's */
    const float *wq_in = d.ql > 0 ? w->wqa : w->wq;
    float beta = 0.0f;
    if (d.ql == 0 || full_here) {
        mt_linear_bwd(a->ws, dl, NULL, dqin, lnf, wq_in, N, C, qin, 0.0f);
        beta = 1.0f;
    }
    if (full_here) {
        mt_linear_bwd(a->ws, dl, NULL, a->dckv, lnf, w->wkva, N, C, d.kvl, beta);
        mt_linear_bwd(a->ws, dl, NULL, a->kpe, lnf, w->wkva + (size_t)d.kvl * C, N, C, d.dr, 1.0f);
    } else if (beta == 0.0f) {
        mt_zero(dl, (size_t)N * C);
    }
    { /* the weight gradients that read the layer input, with it packed once (into datt,
       * dead since the attention backward) */
        float *const dws[3] = {dwq_in, dw->wkva, dw->wkva + (size_t)d.kvl * C};
        const float *const dos[3] = {dqin, a->dckv, a->kpe};
        const int os[3] = {qin, d.kvl, d.dr};
        mt_linear_bwd_weight_shared(a->ws, 3, dws, dos, os, lnf, ln16, N, C, a->datt, (size_t)N * H * d.dv);
    }
}
