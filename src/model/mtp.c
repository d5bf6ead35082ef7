/* model/mtp.c — multi-token prediction (num_nextn_predict_layers, docs/FORMATS.md): D blocks after
 * the main stack, block k predicting the token k + 1 places ahead of the main head's.
 *
 * Block k (decoder layer Lm + k - 1) at position i: u = eh_proj(rmsnorm(e_{i+k}, enorm) |
 * rmsnorm(h^{k-1}_i, hnorm)), h^k = layer(u), logits^k = head(rmsnorm(h^k, shared_head.norm)),
 * with h^0 the main stack's output, e_j the embedding of the window's token j (zero past
 * it) and the main target of position i + k as its target. Its CE gradient scale comes with
 * the loss (mt_loss.mtp_scale: mtp_loss_weight / D / its valid targets in the global batch);
 * its head's backward runs with its forward, as the main head's does. */
#include <omp.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "model/internal.h"

int64_t mt_mtp_valid(const int32_t *targets, int rows, int T, int k) {
    int64_t n = 0;
    for (int b = 0; b < rows; b++)
        for (int i = 0; i + k < T; i++) n += targets[(size_t)b * T + i + k] >= 0;
    return n;
}

/* rows of x[N,C] into columns [col, col+C) of cat[N,2C], and back */
static void to_half(float *cat, const float *x, int N, int C, int col) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(cat + (size_t)n * 2 * C + col, x + (size_t)n * C, sizeof(float) * C);
}
static void from_half(float *x, const float *cat, int N, int C, int col) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(x + (size_t)n * C, cat + (size_t)n * 2 * C + col, sizeof(float) * C);
}

void mt_mtp_scales(const mt_config *c, const int64_t *nvalid, float *scale) {
    const int D = c->num_nextn_predict_layers;
    for (int k = 0; k < D; k++) scale[k] = nvalid[k] ? (float)(c->mtp_loss_weight / D / (double)nvalid[k]) : 0.0f;
}

void mt_mtp_input(mt_ws ws, const mt_layer_w *w, float *u, float *cat, float *tmp, float *rstd_e, float *rstd_h,
                  const float *e, const float *h, int N, int C, float eps) {
    mt_rmsnorm_fwd(tmp, rstd_e, e, w->enorm, N, C, eps);
    to_half(cat, tmp, N, C, 0);
    mt_rmsnorm_fwd(tmp, rstd_h, h, w->hnorm, N, C, eps);
    to_half(cat, tmp, N, C, C);
    mt_linear_fwd(ws, u, cat, w->eh_proj, N, 2 * C, C, 0.0f);
}

void mt_mtp_fwd(const mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets, const int32_t *pos,
                int B, int T, int train, const mt_loss *loss, mt_step_stats *st) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size, V = c->vocab_size, Nl = a->Nl, g0 = a->g0;
    const float eps = (float)c->rms_norm_eps;
    a->mtp_ran = 1;
    for (int k = 1; k <= a->nmtp; k++) {
        const int l = a->Lm + k - 1;
        layer_acts *L = &a->L[a->hi - a->lo + k - 1];
        mtp_acts *M = &a->M[k - 1];
        const mt_layer_w *w = &m->w[l];
        const float *hprev = k == 1 ? a->xf : a->M[k - 2].out;
        mt_trace_begin("fwd.mtp");
        /* this rank's rows: the token k places ahead (the window's last is the last target)
         * and the target k places ahead */
        for (int n = 0; n < Nl; n++) {
            const int gn = g0 + n, b = gn / T, i = gn % T, j = i + k;
            const int32_t last = targets[(size_t)b * T + T - 1];
            M->tok[n] = j < T ? inputs[(size_t)b * T + j] : j == T && last >= 0 ? last : -1;
            M->tg[n] = j < T ? targets[(size_t)gn + k] : -1;
        }
#pragma omp parallel for schedule(static)
        for (int n = 0; n < Nl; n++) {
            float *e = M->e + (size_t)n * C;
            if (M->tok[n] >= 0) memcpy(e, m->embed + (size_t)M->tok[n] * C, sizeof(float) * C);
            else memset(e, 0, sizeof(float) * C);
        }
        mt_mtp_input(a->ws, w, L->x, M->cat, a->ln, M->rstd_e, M->rstd_h, M->e, hprev, Nl, C, eps);
        mt_trace_end();
        mt_layer_fwd(m, a, L, l, M->out, pos, B, T, train, st);
        mt_trace_begin(train ? "fwd.mtp.head+ce (+bwd)" : "fwd.mtp.head");
        mt_rmsnorm_fwd(a->lnf, M->rstd_o, M->out, w->mtp_norm, Nl, C, eps);
        int64_t nv = 0;
        for (int n = 0; n < Nl; n++) nv += M->tg[n] >= 0;
        st->mtp_n_valid[k - 1] += nv;
        float *lg = loss->mtp_logits ? loss->mtp_logits + (size_t)(k - 1) * B * T * V : NULL;
        st->mtp_ce_sum[k - 1] += mt_head_ce(a->ws, train ? a->dln : NULL, train ? m->d_head : NULL, lg, a->lnf, m->head,
                                            M->tg, Nl, C, V, loss->mtp_scale[k - 1], NULL, a->head_scratch);
        if (train) {
            mt_zero(M->dout, (size_t)Nl * C);
            mt_rmsnorm_bwd(M->dout, m->g[l].mtp_norm, a->dln, M->out, w->mtp_norm, M->rstd_o, Nl, C);
        }
        mt_trace_end();
    }
}

void mt_mtp_bwd(mt_model *m, mt_acts *a, const int32_t *pos, int B, int T, float bal_coef) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size, Nl = a->Nl;
    for (int k = a->nmtp; k >= 1; k--) {
        const int l = a->Lm + k - 1;
        layer_acts *L = &a->L[a->hi - a->lo + k - 1];
        mtp_acts *M = &a->M[k - 1];
        const mt_layer_w *w = &m->w[l];
        mt_layer_w *dw = &m->g[l];
        /* dout holds its head's gradient and block k+1's (added by its backward, run first) */
        float *d = M->dout;
        mt_layer_bwd(m, a, L, l, d, pos, B, T, bal_coef);
        mt_trace_begin("bwd.mtp");
        /* d is now the gradient of u; the input's gradient overwrites cat, dead after dW */
        mt_linear_bwd(a->ws, NULL, dw->eh_proj, d, M->cat, w->eh_proj, Nl, 2 * C, C, 0.0f);
        mt_linear_bwd(a->ws, M->cat, NULL, d, NULL, w->eh_proj, Nl, 2 * C, C, 0.0f);
        from_half(a->dln, M->cat, Nl, C, 0);
        from_half(a->ln, M->cat, Nl, C, C);
        const float *hprev = k == 1 ? a->xf : a->M[k - 2].out;
        float *gprev = k == 1 ? a->dres : a->M[k - 2].dout;
        mt_rmsnorm_bwd(gprev, dw->hnorm, a->ln, hprev, w->hnorm, M->rstd_h, Nl, C);
        /* the embeddings' gradient, in out (dead: block k+1 has read it) */
        float *de = M->out;
        mt_zero(de, (size_t)Nl * C);
        mt_rmsnorm_bwd(de, dw->enorm, a->dln, M->e, w->enorm, M->rstd_e, Nl, C);
        /* as the main embedding's backward: thread i owns the vocabulary rows congruent to i */
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
            for (int n = 0; n < Nl; n++) {
                const int32_t t = M->tok[n];
                if (t < 0 || t % nt != tid) continue;
                float *dst = m->d_embed + (size_t)t * C;
                const float *src = de + (size_t)n * C;
                for (int q = 0; q < C; q++) dst[q] += src[q];
            }
        }
        mt_trace_end();
    }
}
