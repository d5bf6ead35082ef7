/* model/decode.c — the inference forward with a KV cache (see decode.h). */
#include "model/decode.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "kernels/vdot.h"
#include "model/internal.h"

struct mt_decoder {
    int slots, tmax, cap, nthr, L, kvw, vw;
    int kt;                       /* key positions per slot in kc (mt_kv_key_positions: tmax rounded up to 16) */
    int tp, H, G;                 /* TP size; this rank's query and key/value heads (H / tp, G / tp) */
    int mla, absorbed;            /* MLA, and its cache form (decode.h) */
    float *kc, *vc;               /* per cached layer (L, + 1 drafting) and slot: kc [kt/16][kvw][16] (blocks of 16
                                   * positions transposed, as mt_attention_row reads them; kv_put) or, absorbed
                                   * MLA, [tmax][kvw] rows; vc [tmax][vw] (NULL for absorbed MLA) */
    float *cq, *ckv, *kpe, *qa;   /* MLA: [cap, ql], [cap, kvl], [cap, dr], absorbed [cap, H*kvl] q / out */
    size_t kv_read;               /* bytes of cache rows the attention read */
    float *cos_t, *sin_t;         /* RoPE tables for tmax positions */
    mt_acts *a;                   /* the FFN / MoE blocks' buffers for cap tokens */
    float *x, *h, *ln, *rstd;     /* [cap, C] residual stream in and after attention, normed input, [cap] */
    float *y;                     /* sandwich norm: [cap, C] a sublayer's output before its norm */
    float *part;                  /* TP: [cap, C] a row-parallel product's partial sum */
    float *q, *k, *v, *att;       /* [cap, H*D], [cap, kvw] x2, [cap, H*D] */
    float *xo, *lno;              /* [cap, C]: the rows whose logits are wanted, normed */
    float *sc;                    /* [nthr][scw] attention scratch */
    size_t scw;
    int32_t **route;              /* [L] routing record of the last call (MoE layers) */
    /* MTP drafting (mt_decoder_new_draft): the cache holds layer L too (MTP block 1) */
    int draft;
    float *h0;                    /* [cap, C] the main stack's output of the last call's tokens */
    float *cat;                   /* [cap, 2C] the MTP block's normed inputs */
    int32_t *dslot, *dpos, *drow; /* [cap] the rows a draft call runs */
    size_t bytes;
};

static void *dalloc(mt_decoder *d, size_t bytes) {
    d->bytes += bytes;
    return mt_try_alloc(bytes);
}

static mt_decoder *create(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16, int absorbed, int draft) {
    const mt_config *c = &m->cfg;
    if (slots < 1 || tmax < 1 || cap < 1)
        return mt_error("decode: need slots, positions and tokens per call >= 1"), NULL;
    if (tmax > c->max_position_embeddings)
        return mt_error("decode: %d positions exceed max_position_embeddings %d", tmax, c->max_position_embeddings),
               NULL;
    if ((m->tp && m->tp->sp) || !m->part.embed || !m->part.head)
        return mt_error("decode: the model must be whole on this rank but for its experts and TP slices (no PP, no "
                        "sequence parallelism)"), NULL;
    if (mt_gemm_bf16_check(bf16) != 0) return NULL;
    mt_decoder *d = mt_xcalloc(1, sizeof *d);
    const int tp = m->tp ? m->tp->size : 1, H = c->num_attention_heads / tp, R = mt_config_rope_dim(c);
    d->tp = tp, d->H = H, d->G = c->num_key_value_heads / tp;
    const size_t C = (size_t)c->hidden_size;
    d->slots = slots, d->tmax = tmax, d->cap = cap, d->nthr = nthr, d->L = c->num_hidden_layers;
    d->mla = mt_config_is_mla(c);
    d->absorbed = d->mla && absorbed;
    /* widths per fed token: q, the heads' output, k and v (MLA: kv_b's output in v) */
    size_t qw = (size_t)H * c->head_dim, aw = qw, kw, vw;
    /* the cache's widths (model/sizes.h; the planner sizes the cache with the same function) */
    mt_kv_widths(c, d->absorbed, &d->kvw, &d->vw);
    if (!d->absorbed) d->kvw /= tp, d->vw /= tp; /* per head: this rank's heads only (absorbed MLA: shared) */
    kw = vw = (size_t)d->G * c->head_dim;
    if (d->mla) {
        const int dq = c->qk_nope_head_dim + c->qk_rope_head_dim;
        qw = (size_t)H * dq;
        aw = (size_t)H * c->v_head_dim;
        kw = qw;
        vw = (size_t)H * (c->qk_nope_head_dim + c->v_head_dim);
    }
    d->draft = draft;
    const size_t pos_rows = (size_t)(d->L + draft) * slots * tmax; /* drafting: MTP block 1's cache after the stack's */
    d->kt = (int)mt_kv_key_positions(c, absorbed, tmax); /* the planner sizes the cache with it too */
    d->kc = dalloc(d, pos_rows / tmax * d->kt * d->kvw * sizeof(float));
    d->vc = d->vw ? dalloc(d, pos_rows * d->vw * sizeof(float)) : NULL;
    d->cos_t = dalloc(d, sizeof(float) * (size_t)tmax * (R / 2));
    d->sin_t = dalloc(d, sizeof(float) * (size_t)tmax * (R / 2));
    const size_t row = sizeof(float) * (size_t)cap;
    d->x = dalloc(d, row * C);
    d->h = dalloc(d, row * C);
    d->ln = dalloc(d, row * C);
    d->y = c->sandwich_norm ? dalloc(d, row * C) : NULL;
    d->part = tp > 1 ? dalloc(d, row * C) : NULL;
    d->rstd = dalloc(d, row);
    d->q = dalloc(d, row * qw);
    d->k = dalloc(d, row * kw);
    d->v = dalloc(d, row * vw);
    d->att = dalloc(d, row * aw);
    int mla_ok = 1;
    if (d->mla) {
        d->cq = dalloc(d, row * (c->q_lora_rank > 0 ? c->q_lora_rank : 1));
        d->ckv = dalloc(d, row * c->kv_lora_rank);
        d->kpe = dalloc(d, row * c->qk_rope_head_dim);
        d->qa = d->absorbed ? dalloc(d, row * H * c->kv_lora_rank) : NULL;
        mla_ok = d->cq && d->ckv && d->kpe && (!d->absorbed || d->qa);
    }
    d->xo = dalloc(d, row * C);
    d->lno = dalloc(d, row * C);
    const int Dk = d->mla ? c->qk_nope_head_dim + c->qk_rope_head_dim : c->head_dim;
    const int Dv = d->mla ? c->v_head_dim : c->head_dim;
    d->scw = d->absorbed ? (size_t)tmax : mt_attention_row_scratch_floats(Dk, Dv);
    d->sc = dalloc(d, sizeof(float) * (size_t)nthr * d->scw);
    d->route = mt_xcalloc((size_t)d->L, sizeof(int32_t *));
    if (draft) {
        d->h0 = dalloc(d, row * C);
        d->cat = dalloc(d, row * 2 * C);
        d->dslot = mt_xmalloc(sizeof(int32_t) * (size_t)cap * 3);
        d->dpos = d->dslot + cap;
        d->drow = d->dpos + cap;
    }
    int ok = mla_ok && d->kc && (d->vc || !d->vw) && d->cos_t && d->sin_t && d->x && d->h && d->ln && d->rstd &&
             d->q && d->k && d->v && d->att && d->xo && d->lno && d->sc && (d->y || !c->sandwich_norm) &&
             (d->part || tp == 1) &&
             (!draft || (d->h0 && d->cat));
    for (int l = 0; l < d->L && ok; l++)
        if (mt_config_is_moe(c, l)) ok = (d->route[l] = dalloc(d, sizeof(int32_t) * (size_t)cap * c->num_experts_per_tok)) != NULL;
    if (ok) {
        d->a = mt_acts_new(c, cap, 1, nthr, bf16); /* rows of one token: the blocks see cap x 1 */
        mt_acts_ws_reserve(d->a, c, cap);     /* the kernels' workspace (the forward grows it if it must) */
        /* a few rows per weight: no packing (kernels/rows.h); MT_DECODE_BLAS=1 runs OpenBLAS, to compare */
        const char *blas = getenv("MT_DECODE_BLAS");
        mt_acts_fwd_rows(d->a, !(blas && *blas && strcmp(blas, "0") != 0));
        d->bytes += mt_acts_arena_bytes(d->a) + d->a->ws.cap;
    }
    if (!ok) {
        size_t want = d->bytes;
        mt_decoder_free(d);
        return mt_error("decode: %.1f MiB for %d sequences of %d positions cannot be allocated",
                        (double)want / 1048576.0, slots, tmax), NULL;
    }
    mt_rope_table(d->cos_t, d->sin_t, tmax, R, c->rope_theta);
    return d;
}

mt_decoder *mt_decoder_new(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16) {
    return mt_decoder_new_form(m, slots, tmax, cap, nthr, bf16, 1);
}

mt_decoder *mt_decoder_new_form(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16, int absorbed) {
    return create(m, slots, tmax, cap, nthr, bf16, absorbed, 0);
}

mt_decoder *mt_decoder_new_draft(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16) {
    if (m->cfg.num_nextn_predict_layers < 1)
        return mt_error("decode: speculative decoding drafts with the model's MTP block, and this model has none "
                        "(num_nextn_predict_layers 0)"), NULL;
    return create(m, slots, tmax, cap, nthr, bf16, 1, 1);
}

void mt_decoder_free(mt_decoder *d) {
    if (!d) return;
    float *bufs[] = {d->kc, d->vc, d->cos_t, d->sin_t, d->x, d->h, d->ln, d->rstd, d->q, d->k, d->v, d->att,
                     d->xo, d->lno, d->sc, d->y, d->cq, d->ckv, d->kpe, d->qa, d->h0, d->cat, d->part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mt_free(bufs[i]);
    for (int l = 0; l < d->L; l++) mt_free(d->route[l]);
    free(d->route);
    free(d->dslot);
    mt_acts_free(d->a);
    free(d);
}

size_t mt_decoder_bytes(const mt_decoder *d) { return d->bytes; }
int mt_decoder_cap(const mt_decoder *d) { return d->cap; }
const int32_t *mt_decoder_routing(const mt_decoder *d, int l) { return d->route[l]; }
size_t mt_decoder_kv_read(const mt_decoder *d) { return d->kv_read; }

/* Position t's key row k (kvw floats) and value row v (vw) into layer l's cache of the slot:
 * keys in blocks of 16 positions, each block transposed (mt_attention_row's layout), values as rows. */
static void kv_put(mt_decoder *d, int l, int slot, int t, const float *k, const float *v) {
    const size_t ls = (size_t)l * d->slots + slot;
    float *kb = d->kc + (ls * d->kt + (size_t)t / 16 * 16) * d->kvw + t % 16;
    for (int e = 0; e < d->kvw; e++) kb[(size_t)e * 16] = k[e];
    memcpy(d->vc + (ls * d->tmax + t) * d->vw, v, sizeof(float) * d->vw);
}

/* att[i] = softmax(q_i K^T / sqrt(Dk)) V over positions 0..pos[i] of the token's slot, per
 * head (GQA: head h reads key/value head h / (H/G); unabsorbed MLA: G = H, q/k of dn + dr
 * and v of dv), by mt_attention_row: the training forward's bits for that query. */
static void attend(mt_decoder *d, const mt_config *c, int l, const int32_t *slot, const int32_t *pos, int n) {
    const int mla = d->mla, H = d->H, G = mla ? H : d->G, rep = H / G;
    const int Dk = mla ? c->qk_nope_head_dim + c->qk_rope_head_dim : c->head_dim;
    const int Dv = mla ? c->v_head_dim : c->head_dim;
#pragma omp parallel for schedule(dynamic, 1)
    for (int ih = 0; ih < n * H; ih++) {
        const int i = ih / H, hh = ih % H, g = hh / rep;
        const size_t ls = (size_t)l * d->slots + slot[i];
        const float *Kb = d->kc + ls * d->kt * d->kvw + (size_t)g * Dk * 16;
        const float *V = d->vc + ls * d->tmax * d->vw + (size_t)g * Dv;
        mt_attention_row(d->att + ((size_t)i * H + hh) * Dv, d->q + ((size_t)i * H + hh) * Dk, Kb, (size_t)d->kvw * 16,
                         V, (size_t)d->vw, pos[i] + 1, Dk, Dv, d->sc + (size_t)omp_get_thread_num() * d->scw);
    }
    /* the cache the loops above read: G heads' k and v rows per visible position */
    for (int i = 0; i < n; i++) d->kv_read += (size_t)(pos[i] + 1) * (size_t)G * (Dk + Dv) * sizeof(float);
}

/* GQA's attention sublayer of layer l for the n fed tokens: d->ln in, d->att out, the cache
 * rows of the fed positions written. */
static void gqa_layer(mt_decoder *d, mt_acts *a, const mt_config *c, const mt_layer_w *w, int l, const int32_t *slot,
                      const int32_t *pos, int n) {
    const int C = c->hidden_size, H = d->H, D = c->head_dim, kvw = d->kvw;
    const int rope = c->rope_interleave ? MT_ROPE_INTERLEAVE : 0;
    mt_linear_fwd(a->ws, d->q, d->ln, w->wq, n, C, H * D, 0.0f);
    mt_linear_fwd(a->ws, d->k, d->ln, w->wk, n, C, kvw, 0.0f);
    mt_linear_fwd(a->ws, d->v, d->ln, w->wv, n, C, kvw, 0.0f);
    mt_rope_apply_pos(d->q, d->cos_t, d->sin_t, pos, n, d->tmax, H, D, rope);
    mt_rope_apply_pos(d->k, d->cos_t, d->sin_t, pos, n, d->tmax, d->G, D, rope);
    for (int i = 0; i < n; i++) kv_put(d, l, slot[i], pos[i], d->k + (size_t)i * kvw, d->v + (size_t)i * kvw);
    attend(d, c, l, slot, pos, n);
}

/* MLA with kv_b absorbed, on the compressed cache [c_n | k_pe] (kvl + dr per position, one
 * row for all heads): head h's score of position t is q_nope_h . (W_kb^h c_t) + q_pe_h . k_pe_t
 * = (W_kb^h^T q_nope_h) . c_t + q_pe_h . k_pe_t, so d->qa holds W_kb^h^T q_nope_h per head
 * (the caller's product) and this overwrites it with the head's softmax-weighted sum of the
 * c_t, to which the caller applies W_vb^h. */
static void attend_absorbed(mt_decoder *d, const mt_config *c, int l, const int32_t *slot, const int32_t *pos,
                            int n) {
    const int H = d->H, kvl = c->kv_lora_rank, dn = c->qk_nope_head_dim;
    const int dr = c->qk_rope_head_dim, dq = dn + dr;
    const float scale = 1.0f / sqrtf((float)dq);
#pragma omp parallel for schedule(dynamic, 1)
    for (int ih = 0; ih < n * H; ih++) {
        const int i = ih / H, hh = ih % H, P = pos[i] + 1;
        float *qa = d->qa + ((size_t)i * H + hh) * kvl;
        const float *qpe = d->q + ((size_t)i * H + hh) * dq + dn;
        const float *K = d->kc + ((size_t)l * d->slots + slot[i]) * d->tmax * d->kvw;
        float *s = d->sc + (size_t)omp_get_thread_num() * d->scw, mx = -INFINITY;
        for (int t = 0; t < P; t++) {
            const float *r = K + (size_t)t * d->kvw;
            s[t] = (mt_dotf(qa, r, (size_t)kvl) + mt_dotf(qpe, r + kvl, (size_t)dr)) * scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        float sum = 0.0f;
        for (int t = 0; t < P; t++) sum += s[t] = expf(s[t] - mx);
        memset(qa, 0, sizeof(float) * (size_t)kvl);
        for (int t = 0; t < P; t++) {
            const float p = s[t] / sum, *r = K + (size_t)t * d->kvw;
            for (int j = 0; j < kvl; j++) qa[j] += p * r[j];
        }
    }
    /* the cache read: one compressed row per visible position, whatever the head count */
    for (int i = 0; i < n; i++) d->kv_read += (size_t)(pos[i] + 1) * (size_t)d->kvw * sizeof(float);
}

/* MLA's attention sublayer of layer l for the n fed tokens: d->ln in, d->att (the heads'
 * outputs, [n, H*dv]) out, the cache rows of the fed positions written; the projections are
 * the training forward's (model/mla.c). */
static void mla_layer(mt_decoder *d, mt_acts *a, const mt_config *c, const mt_layer_w *w, int l, const int32_t *slot,
                      const int32_t *pos, int n) {
    const int C = c->hidden_size, H = d->H, ql = c->q_lora_rank, kvl = c->kv_lora_rank;
    const int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim, dq = dn + dr, dkv = dn + dv;
    const int rope = c->rope_interleave ? MT_ROPE_INTERLEAVE : 0;
    const float eps = (float)c->rms_norm_eps;
    if (ql > 0) {
        mt_linear_fwd(a->ws, d->cq, d->ln, w->wqa, n, C, ql, 0.0f);
        mt_rmsnorm_fwd(d->cq, d->rstd, d->cq, w->qa_norm, n, ql, eps); /* in place: a row is read, then written */
        mt_linear_fwd(a->ws, d->q, d->cq, w->wq, n, ql, H * dq, 0.0f);
    } else {
        mt_linear_fwd(a->ws, d->q, d->ln, w->wq, n, C, H * dq, 0.0f);
    }
    mt_rope_apply_ld(d->q + dn, d->cos_t, d->sin_t, pos, n, d->tmax, H, dr, (size_t)H * dq, (size_t)dq, rope);
    mt_linear_fwd(a->ws, d->ckv, d->ln, w->wkva, n, C, kvl, 0.0f);
    mt_linear_fwd(a->ws, d->kpe, d->ln, w->wkva + (size_t)kvl * C, n, C, dr, 0.0f);
    mt_rope_apply_pos(d->kpe, d->cos_t, d->sin_t, pos, n, d->tmax, 1, dr, rope);
    mt_rmsnorm_fwd(d->ckv, d->rstd, d->ckv, w->kva_norm, n, kvl, eps);
    if (d->absorbed) {
        for (int i = 0; i < n; i++) {
            float *r = d->kc + (((size_t)l * d->slots + slot[i]) * d->tmax + pos[i]) * d->kvw;
            memcpy(r, d->ckv + (size_t)i * kvl, sizeof(float) * kvl);
            memcpy(r + kvl, d->kpe + (size_t)i * dr, sizeof(float) * dr);
        }
        /* per head: qa_h = q_nope_h W_kb^h ([n, dn] x [dn, kvl]); after the attention
         * att_h = (sum_t p_t c_t) W_vb^h^T ([n, kvl] x [kvl, dv]) */
        for (int h = 0; h < H; h++)
            mt_sgemm(a->ws, 0, 0, n, kvl, dn, 1.0f, d->q + (size_t)h * dq, H * dq, w->wkvb + (size_t)h * dkv * kvl,
                     kvl, 0.0f, d->qa + (size_t)h * kvl, H * kvl);
        attend_absorbed(d, c, l, slot, pos, n);
        for (int h = 0; h < H; h++)
            mt_sgemm(a->ws, 0, 1, n, dv, kvl, 1.0f, d->qa + (size_t)h * kvl, H * kvl,
                     w->wkvb + ((size_t)h * dkv + dn) * kvl, kvl, 0.0f, d->att + (size_t)h * dv, H * dv);
        return;
    }
    /* unabsorbed: the training forward's per-head k = [k_nope_h | k_pe] and v, cached */
    mt_linear_fwd(a->ws, d->v, d->ckv, w->wkvb, n, kvl, H * dkv, 0.0f);
    for (int i = 0; i < n; i++) {
        float *k = d->k, *v = d->att; /* one position's rows, assembled (att is written after) */
        for (int h = 0; h < H; h++) {
            const float *kv = d->v + ((size_t)i * H + h) * dkv;
            memcpy(k + (size_t)h * dq, kv, sizeof(float) * dn);
            memcpy(k + (size_t)h * dq + dn, d->kpe + (size_t)i * dr, sizeof(float) * dr);
            memcpy(v + (size_t)h * dv, kv + dn, sizeof(float) * dv);
        }
        kv_put(d, l, slot[i], pos[i], k, v);
    }
    attend(d, c, l, slot, pos, n);
}

/* Decoder layer l (main stack or MTP block) on the n fed tokens' residual stream d->x, in place. */
static void decode_layer(mt_decoder *d, mt_model *m, int l, const int32_t *slot, const int32_t *pos, int n) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size, H = d->H;
    const int AO = H * (d->mla ? c->v_head_dim : c->head_dim); /* o_proj's input width */
    const int F = c->intermediate_size / d->tp, K = c->num_experts_per_tok, sw = c->sandwich_norm;
    const float eps = (float)c->rms_norm_eps;
    mt_acts *a = d->a;
    const mt_layer_w *w = &m->w[l];
    mt_rmsnorm_fwd(d->ln, d->rstd, d->x, w->in_norm, n, C, eps);
    if (d->mla) mla_layer(d, a, c, w, l, slot, pos, n);
    else gqa_layer(d, a, c, w, l, slot, pos, n);
    if (sw) { /* h = x + rmsnorm(att Wo^T), the FFN's input normed by pre_mlp_layernorm */
        mt_linear_fwd(a->ws, d->y, d->att, w->wo, n, AO, C, 0.0f);
        if (d->tp > 1) m->tp->reduce(m->tp->ctx, d->y, d->y, (size_t)n * C); /* the heads' partial sums */
        mt_rmsnorm_fwd(d->h, d->rstd, d->y, w->post_norm, n, C, eps);
        mt_add(d->h, d->x, (size_t)n * C);
    } else if (d->tp > 1) {
        mt_linear_fwd(a->ws, d->h, d->att, w->wo, n, AO, C, 0.0f);
        m->tp->reduce(m->tp->ctx, d->h, d->h, (size_t)n * C);
        mt_add(d->h, d->x, (size_t)n * C);
    } else {
        mt_linear_fwd_res(a->ws, d->h, d->x, d->att, NULL, w->wo, n, AO, C);
    }
    mt_rmsnorm_fwd(d->ln, d->rstd, d->h, sw ? w->pre_mlp_norm : w->post_norm, n, C, eps);
    layer_acts *L = &a->L[l];
    float *fout = sw ? d->y : d->x; /* sandwich: the FFN's output, normed into x below */
    const float *fres = sw ? NULL : d->h;
    if (!mt_config_is_moe(c, l) && d->tp > 1) { /* this rank's F / tp columns, their partial sums added */
        mt_ffn_fwd(a, d->part, NULL, L->gu, L->gu16, d->ln, NULL, w->gate, w->down, n, C, F, a->ffn_rows);
        m->tp->reduce(m->tp->ctx, sw ? fout : d->part, d->part, (size_t)n * C);
        if (!sw) {
            mt_copy(fout, fres, (size_t)n * C);
            mt_add(fout, d->part, (size_t)n * C);
        }
    } else if (!mt_config_is_moe(c, l)) {
        mt_ffn_fwd(a, fout, fres, L->gu, L->gu16, d->ln, NULL, w->gate, w->down, n, C, F, a->ffn_rows);
    } else {
        mt_moe_block_fwd(m, a, L, w, l, n, 1, d->ln, NULL, fres, fout, 0);
        if (l < d->L) memcpy(d->route[l], L->sel, sizeof(int32_t) * (size_t)n * K);
    }
    if (sw) {
        mt_rmsnorm_fwd(d->x, d->rstd, d->y, w->post_mlp_norm, n, C, eps);
        mt_add(d->x, d->h, (size_t)n * C);
    }
}

/* logits[j] = head(norm(x[rows[j]], w)) */
static void head_rows(mt_decoder *d, mt_model *m, const float *w, const int32_t *rows, int no, float *logits) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size;
    if (no <= 0) return;
    for (int j = 0; j < no; j++) memcpy(d->xo + (size_t)j * C, d->x + (size_t)rows[j] * C, sizeof(float) * C);
    mt_rmsnorm_fwd(d->lno, d->rstd, d->xo, w, no, C, (float)c->rms_norm_eps);
    mt_linear_fwd(d->a->ws, logits, d->lno, m->head, no, C, c->vocab_size, 0.0f);
}

void mt_decoder_forward(mt_decoder *d, mt_model *m, const int32_t *tokens, const int32_t *slot, const int32_t *pos,
                        int n, const int32_t *rows, int no, float *logits) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size;
    MT_ASSERT(n >= 1 && n <= d->cap && no >= 0 && no <= n);
    for (int i = 0; i < n; i++) MT_ASSERT(slot[i] >= 0 && slot[i] < d->slots && pos[i] >= 0 && pos[i] < d->tmax);
    mt_acts *a = d->a;
    a->Nl = n, a->g0 = 0, a->count_load = 0;
    mt_acts_ws_reserve(a, c, n);
    mt_trace_begin("decode");
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memcpy(d->x + (size_t)i * C, m->embed + (size_t)tokens[i] * C, sizeof(float) * C);
    for (int l = 0; l < d->L; l++) decode_layer(d, m, l, slot, pos, n);
    if (d->draft) mt_copy(d->h0, d->x, (size_t)n * C); /* the MTP block's h^0 */
    head_rows(d, m, m->norm, rows, no, logits);
    mt_trace_end();
}

void mt_decoder_draft(mt_decoder *d, mt_model *m, const int32_t *next, const int32_t *slot, const int32_t *pos,
                      int n, const int32_t *rows, int no, int32_t *draft, float *logits) {
    const mt_config *c = &m->cfg;
    const int C = c->hidden_size, V = c->vocab_size, l = d->L;
    const float eps = (float)c->rms_norm_eps;
    const mt_layer_w *w = &m->w[l];
    MT_ASSERT(d->draft && n <= d->cap && no <= n);
    /* the rows with a known next token, compacted; a wanted row must be one of them */
    int nr = 0;
    int32_t *at = d->drow; /* fed row -> compacted row */
    for (int i = 0; i < n; i++) {
        at[i] = -1;
        if (next[i] < 0) continue;
        at[i] = nr;
        d->dslot[nr] = slot[i], d->dpos[nr] = pos[i];
        memcpy(d->x + (size_t)nr * C, m->embed + (size_t)next[i] * C, sizeof(float) * C);
        memcpy(d->xo + (size_t)nr * C, d->h0 + (size_t)i * C, sizeof(float) * C);
        nr++;
    }
    if (nr == 0 && !m->ep) return;
    if (nr == 0) { /* EP: this rank has no sequence left, but the block's MoE exchange is the
                    * group's: one row in slot 0 (free: a rank with no running sequence takes no
                    * more requests), its results dropped */
        d->dslot[0] = 0, d->dpos[0] = 0;
        memcpy(d->x, m->embed, sizeof(float) * C);
        memcpy(d->xo, d->h0, sizeof(float) * C);
        nr = 1;
    }
    mt_trace_begin("decode.draft");
    mt_acts *a = d->a;
    a->Nl = nr, a->g0 = 0, a->count_load = 0;
    /* the block's input from e_next (in x) and h0 (in xo), as the training forward builds it */
    mt_mtp_input(a->ws, w, d->x, d->cat, d->ln, d->rstd, d->rstd, d->x, d->xo, nr, C, eps);
    decode_layer(d, m, l, d->dslot, d->dpos, nr);
    int32_t *crow = d->dslot; /* free again: the wanted rows, compacted */
    for (int j = 0; j < no; j++) {
        MT_ASSERT(at[rows[j]] >= 0);
        crow[j] = at[rows[j]];
    }
    head_rows(d, m, w->mtp_norm, crow, no, logits);
    /* the draft: the block's most likely token (lowest id on ties) */
    for (int j = 0; j < no; j++) {
        const float *lg = logits + (size_t)j * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        draft[j] = best;
    }
    mt_trace_end();
}
