/* model/decode.c — the inference forward with a KV cache (see decode.h). */
#include "model/decode.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "kernels/vdot.h"
#include "model/internal.h"

struct mt_decoder {
    int slots, tmax, cap, nthr, L, kvw;
    float *kc, *vc;               /* [L][slots][tmax][kvw] */
    float *cos_t, *sin_t;         /* RoPE tables for tmax positions */
    mt_acts *a;                   /* the FFN / MoE blocks' buffers for cap tokens */
    float *x, *h, *ln, *rstd;     /* [cap, C] residual stream in and after attention, normed input, [cap] */
    float *y;                     /* sandwich norm: [cap, C] a sublayer's output before its norm */
    float *q, *k, *v, *att;       /* [cap, H*D], [cap, kvw] x2, [cap, H*D] */
    float *xo, *lno;              /* [cap, C]: the rows whose logits are wanted, normed */
    float *sc;                    /* [nthr][tmax] attention scores */
    int32_t **route;              /* [L] routing record of the last call (MoE layers) */
    size_t bytes;
};

static void *dalloc(mt_decoder *d, size_t bytes) {
    d->bytes += bytes;
    return mt_try_alloc(bytes);
}

mt_decoder *mt_decoder_new(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16) {
    const mt_config *c = &m->cfg;
    if (slots < 1 || tmax < 1 || cap < 1)
        return mt_error("decode: need slots, positions and tokens per call >= 1"), NULL;
    if (tmax > c->max_position_embeddings)
        return mt_error("decode: %d positions exceed max_position_embeddings %d", tmax, c->max_position_embeddings),
               NULL;
    if (m->tp || m->ep || !m->part.embed || !m->part.head)
        return mt_error("decode: the model must be whole on this rank (no TP, PP or EP)"), NULL;
    if (mt_gemm_bf16_check(bf16) != 0) return NULL;
    mt_decoder *d = mt_xcalloc(1, sizeof *d);
    const size_t C = (size_t)c->hidden_size, HD = (size_t)c->num_attention_heads * c->head_dim;
    d->slots = slots, d->tmax = tmax, d->cap = cap, d->nthr = nthr, d->L = c->num_hidden_layers;
    d->kvw = c->num_key_value_heads * c->head_dim;
    const size_t cache = (size_t)d->L * slots * tmax * d->kvw * sizeof(float);
    d->kc = dalloc(d, cache);
    d->vc = dalloc(d, cache);
    d->cos_t = dalloc(d, sizeof(float) * (size_t)tmax * (c->head_dim / 2));
    d->sin_t = dalloc(d, sizeof(float) * (size_t)tmax * (c->head_dim / 2));
    const size_t row = sizeof(float) * (size_t)cap;
    d->x = dalloc(d, row * C);
    d->h = dalloc(d, row * C);
    d->ln = dalloc(d, row * C);
    d->y = c->sandwich_norm ? dalloc(d, row * C) : NULL;
    d->rstd = dalloc(d, row);
    d->q = dalloc(d, row * HD);
    d->k = dalloc(d, row * d->kvw);
    d->v = dalloc(d, row * d->kvw);
    d->att = dalloc(d, row * HD);
    d->xo = dalloc(d, row * C);
    d->lno = dalloc(d, row * C);
    d->sc = dalloc(d, sizeof(float) * (size_t)nthr * tmax);
    d->route = mt_xcalloc((size_t)d->L, sizeof(int32_t *));
    int ok = d->kc && d->vc && d->cos_t && d->sin_t && d->x && d->h && d->ln && d->rstd && d->q && d->k && d->v &&
             d->att && d->xo && d->lno && d->sc && (d->y || !c->sandwich_norm);
    for (int l = 0; l < d->L && ok; l++)
        if (mt_config_is_moe(c, l)) ok = (d->route[l] = dalloc(d, sizeof(int32_t) * (size_t)cap * c->num_experts_per_tok)) != NULL;
    if (ok) {
        d->a = mt_acts_new(c, cap, 1, nthr, bf16); /* rows of one token: the blocks see cap x 1 */
        mt_acts_ws_reserve(d->a, c, cap);     /* the kernels' workspace (the forward grows it if it must) */
        d->bytes += mt_acts_arena_bytes(d->a) + d->a->ws.cap;
    }
    if (!ok) {
        size_t want = d->bytes;
        mt_decoder_free(d);
        return mt_error("decode: %.1f MiB for %d sequences of %d positions cannot be allocated",
                        (double)want / 1048576.0, slots, tmax), NULL;
    }
    mt_rope_table(d->cos_t, d->sin_t, tmax, c->head_dim, c->rope_theta);
    return d;
}

void mt_decoder_free(mt_decoder *d) {
    if (!d) return;
    float *bufs[] = {d->kc, d->vc, d->cos_t, d->sin_t, d->x, d->h, d->ln, d->rstd, d->q, d->k, d->v, d->att,
                     d->xo, d->lno, d->sc, d->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mt_free(bufs[i]);
    for (int l = 0; l < d->L; l++) mt_free(d->route[l]);
    free(d->route);
    mt_acts_free(d->a);
    free(d);
}

size_t mt_decoder_bytes(const mt_decoder *d) { return d->bytes; }
int mt_decoder_cap(const mt_decoder *d) { return d->cap; }
const int32_t *mt_decoder_routing(const mt_decoder *d, int l) { return d->route[l]; }

/* att[i] = softmax(q_i K^T / sqrt(D)) V over positions 0..pos[i] of the token's slot, per
 * head (GQA: head h reads key/value head h / (H/G)); scores in fp32, as the training
 * forward's online softmax computes them, in one pass over the cached rows. */
static void attend(mt_decoder *d, const mt_config *c, int l, const int32_t *slot, const int32_t *pos, int n) {
    const int H = c->num_attention_heads, G = c->num_key_value_heads, D = c->head_dim, rep = H / G;
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(dynamic, 1)
    for (int ih = 0; ih < n * H; ih++) {
        const int i = ih / H, hh = ih % H, g = hh / rep, P = pos[i] + 1;
        const float *q = d->q + ((size_t)i * H + hh) * D;
        const size_t base = (((size_t)l * d->slots + slot[i]) * d->tmax) * d->kvw + (size_t)g * D;
        const float *K = d->kc + base, *V = d->vc + base;
        float *s = d->sc + (size_t)omp_get_thread_num() * d->tmax, mx = -INFINITY;
        for (int t = 0; t < P; t++) {
            s[t] = mt_dotf(q, K + (size_t)t * d->kvw, (size_t)D) * scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        float sum = 0.0f;
        for (int t = 0; t < P; t++) sum += s[t] = expf(s[t] - mx);
        float *o = d->att + ((size_t)i * H + hh) * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int t = 0; t < P; t++) {
            const float p = s[t] / sum, *vr = V + (size_t)t * d->kvw;
            for (int j = 0; j < D; j++) o[j] += p * vr[j];
        }
    }
}

void mt_decoder_forward(mt_decoder *d, mt_model *m, const int32_t *tokens, const int32_t *slot, const int32_t *pos,
                        int n, const int32_t *rows, int no, float *logits) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size, H = c->num_attention_heads, D = c->head_dim, HD = H * D, kvw = d->kvw;
    const int rope = c->rope_interleave ? MT_ROPE_INTERLEAVE : 0;
    const int F = c->intermediate_size, K = c->num_experts_per_tok, sw = c->sandwich_norm;
    const float eps = (float)c->rms_norm_eps;
    MT_ASSERT(n >= 1 && n <= d->cap && no >= 0 && no <= n);
    for (int i = 0; i < n; i++) MT_ASSERT(slot[i] >= 0 && slot[i] < d->slots && pos[i] >= 0 && pos[i] < d->tmax);
    mt_acts *a = d->a;
    a->Nl = n, a->g0 = 0, a->count_load = 0;
    mt_acts_ws_reserve(a, c, n);
    mt_trace_begin("decode");
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memcpy(d->x + (size_t)i * C, m->embed + (size_t)tokens[i] * C, sizeof(float) * C);
    for (int l = 0; l < d->L; l++) {
        const mt_layer_w *w = &m->w[l];
        mt_rmsnorm_fwd(d->ln, d->rstd, d->x, w->in_norm, n, C, eps);
        mt_linear_fwd(a->ws, d->q, d->ln, w->wq, n, C, HD, 0.0f);
        mt_linear_fwd(a->ws, d->k, d->ln, w->wk, n, C, kvw, 0.0f);
        mt_linear_fwd(a->ws, d->v, d->ln, w->wv, n, C, kvw, 0.0f);
        mt_rope_apply_pos(d->q, d->cos_t, d->sin_t, pos, n, d->tmax, H, D, rope);
        mt_rope_apply_pos(d->k, d->cos_t, d->sin_t, pos, n, d->tmax, c->num_key_value_heads, D, rope);
        for (int i = 0; i < n; i++) {
            const size_t at = (((size_t)l * d->slots + slot[i]) * d->tmax + pos[i]) * kvw;
            memcpy(d->kc + at, d->k + (size_t)i * kvw, sizeof(float) * kvw);
            memcpy(d->vc + at, d->v + (size_t)i * kvw, sizeof(float) * kvw);
        }
        attend(d, c, l, slot, pos, n);
        if (sw) { /* h = x + rmsnorm(att Wo^T), the FFN's input normed by pre_mlp_layernorm */
            mt_linear_fwd(a->ws, d->y, d->att, w->wo, n, HD, C, 0.0f);
            mt_rmsnorm_fwd(d->h, d->rstd, d->y, w->post_norm, n, C, eps);
            mt_add(d->h, d->x, (size_t)n * C);
        } else {
            mt_linear_fwd_res(a->ws, d->h, d->x, d->att, NULL, w->wo, n, HD, C);
        }
        mt_rmsnorm_fwd(d->ln, d->rstd, d->h, sw ? w->pre_mlp_norm : w->post_norm, n, C, eps);
        layer_acts *L = &a->L[l];
        float *fout = sw ? d->y : d->x; /* sandwich: the FFN's output, normed into x below */
        const float *fres = sw ? NULL : d->h;
        if (!mt_config_is_moe(c, l)) {
            mt_ffn_fwd(a, fout, fres, L->gu, L->gu16, d->ln, NULL, w->gate, w->down, n, C, F, a->ffn_rows);
        } else {
            mt_moe_block_fwd(m, a, L, w, l, n, 1, d->ln, NULL, fres, fout, 0);
            memcpy(d->route[l], L->sel, sizeof(int32_t) * (size_t)n * K);
        }
        if (sw) {
            mt_rmsnorm_fwd(d->x, d->rstd, d->y, w->post_mlp_norm, n, C, eps);
            mt_add(d->x, d->h, (size_t)n * C);
        }
    }
    for (int j = 0; j < no; j++) memcpy(d->xo + (size_t)j * C, d->x + (size_t)rows[j] * C, sizeof(float) * C);
    if (no > 0) {
        mt_rmsnorm_fwd(d->lno, d->rstd, d->xo, m->norm, no, C, eps);
        mt_linear_fwd(a->ws, logits, d->lno, m->head, no, C, c->vocab_size, 0.0f);
    }
    mt_trace_end();
}
