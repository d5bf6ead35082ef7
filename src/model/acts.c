/* model/acts.c — the activation arena of one micro-batch: one function lays out every buffer, dry to size it and
 * for real (see model.h), and the arena's size by part and the recompute policies' names (sizes.h). */
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

typedef struct { char *base; size_t off; int dry; } carver;

static void *carve(carver *cv, size_t bytes) {
    size_t a = (bytes + 63) & ~(size_t)63;
    void *p = cv->dry ? NULL : cv->base + cv->off;
    cv->off += a;
    return p;
}

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

/* A buffer that holds bf16 in bf16 mode (h16) and fp32 otherwise: one carve, whose pointer of
 * the matching type is set, the other NULL (model/internal.h). */
static void carve_pair(carver *cv, size_t bytes, int h16, float **f32, uint16_t **b16) {
    void *p = carve(cv, bytes);
    *f32 = h16 ? NULL : p;
    *b16 = h16 ? p : NULL;
}

/* The arena's dimensions. With TP, attention and the dense FFN see all Nt tokens with the
 * local heads / columns; the residual stream, norms, MoE and head hold N = Nt/tp tokens with
 * SP (else Nt). hl: bytes of a value the FFNs keep or write to bf16-able scratch. */
typedef struct {
    size_t tp, B, T, Nt, N, C, H, G, D, E, K, Fm, Fs, F, R, hl, nthr;
    int sel, kv16, sw;
    int mla;                      /* MLA: the widths below (0 for GQA) */
    size_t ql, kvl, dr, dq, dv;   /* q_lora_rank, kv_lora_rank, qk_rope_head_dim, dn + dr, v_head_dim */
} geom;

static void geom_of(geom *g, const mt_config *c, const mt_acts_dims *d) {
    g->tp = d->tp > 1 ? (size_t)d->tp : 1;
    g->B = (size_t)d->B;
    g->Nt = (size_t)d->B * d->T;
    g->N = d->sp && d->tp > 1 ? g->Nt / g->tp : g->Nt;
    g->T = (size_t)d->T;
    g->C = c->hidden_size;
    g->H = c->num_attention_heads / g->tp;
    g->G = c->num_key_value_heads / g->tp;
    g->D = c->head_dim;
    g->E = c->n_routed_experts;
    g->K = c->num_experts_per_tok;
    g->Fm = c->moe_intermediate_size;
    g->Fs = (size_t)c->n_shared_experts * g->Fm;
    g->F = c->intermediate_size / g->tp;
    g->R = g->N * g->K;
    g->nthr = (size_t)d->nthr;
    g->sel = d->policy == MT_RECOMPUTE_SELECTIVE;
    g->kv16 = d->kv16;
    g->sw = c->sandwich_norm != 0;
    /* kv16 implies the bf16 GEMMs, in which the FFNs keep their gate|up outputs as bf16
     * (model/internal.h), and their scratch that only products read (carve_scratch) */
    g->hl = d->kv16 ? sizeof(uint16_t) : sizeof(float);
    g->mla = mt_config_is_mla(c);
    g->ql = g->mla ? (size_t)c->q_lora_rank : 0;
    g->kvl = g->mla ? (size_t)c->kv_lora_rank : 0;
    g->dr = g->mla ? (size_t)c->qk_rope_head_dim : 0;
    g->dq = g->mla ? (size_t)c->qk_nope_head_dim + g->dr : 0;
    g->dv = g->mla ? (size_t)c->v_head_dim : 0;
}

/* The attention's widths: of q and k per head, of v and the output per head, RoPE's table. */
static size_t att_qk(const geom *g) { return g->mla ? g->dq : g->D; }
static size_t att_v(const geom *g) { return g->mla ? g->dv : g->D; }
static size_t rope_w(const geom *g) { return g->mla ? g->dr : g->D; }

/* The arena is carved in this order, by parts (model/sizes.h sizes each part with the same
 * functions run dry; every carve is a multiple of 64 B, so a part's size does not depend on
 * where it starts). */

/* SELECTIVE: the h and gate|up buffers every layer shares. */
static void carve_shared(carver *cv, mt_acts *a, const geom *g) {
    if (!g->sel) return;
    a->hbuf = carve(cv, g->N * g->C * sizeof(float));
    if (g->sw) a->yabuf = carve(cv, g->N * g->C * sizeof(float));
    if (g->mla) { /* the up-projections' outputs, rebuilt from the kept latents (model/mla.c) */
        a->mqbuf = carve(cv, g->Nt * g->H * g->dq * sizeof(float));
        a->mkbuf = carve(cv, g->Nt * g->H * g->dq * sizeof(float));
        a->mvbuf = carve(cv, g->Nt * g->H * g->dv * sizeof(float));
    }
    if (g->E) carve_pair(cv, maxz(g->R * 2 * g->Fm, g->N * 2 * g->Fs) * g->hl, a->bf16, &a->gubuf, &a->gubuf16);
}

/* What decoder layer l keeps. */
static void carve_layer(carver *cv, const mt_acts *a, layer_acts *L, const mt_config *c, int l, const geom *g) {
    const size_t N = g->N, Nt = g->Nt, C = g->C, H = g->H, G = g->G, D = g->D, E = g->E, R = g->R;
    const size_t fl = sizeof(float), il = sizeof(int32_t), hl = g->hl;
    L->x = carve(cv, N * C * fl);
    L->rstd1 = carve(cv, N * fl);
    if (g->mla) { /* the compressed q and c (before their norms), q and the per-head k, v (fp32) */
        if (g->ql) {
            L->cq = carve(cv, Nt * g->ql * fl);
            L->rstdq = carve(cv, Nt * fl);
        }
        L->ckv = carve(cv, Nt * g->kvl * fl);
        L->rstdkv = carve(cv, Nt * fl);
        L->q = g->sel ? a->mqbuf : carve(cv, Nt * H * g->dq * fl);
        L->k = g->sel ? a->mkbuf : carve(cv, Nt * H * g->dq * fl);
        L->v = g->sel ? a->mvbuf : carve(cv, Nt * H * g->dv * fl);
    } else {
        L->q = carve(cv, Nt * H * D * fl);
        if (g->kv16) {
            L->k16 = carve(cv, Nt * G * D * sizeof(uint16_t));
            L->v16 = carve(cv, Nt * G * D * sizeof(uint16_t));
        } else {
            L->k = carve(cv, Nt * G * D * fl);
            L->v = carve(cv, Nt * G * D * fl);
        }
    }
    L->att = carve(cv, Nt * H * att_v(g) * fl);
    L->lse = carve(cv, Nt * H * fl);
    L->h = g->sel ? a->hbuf : carve(cv, N * C * fl);
    L->rstd2 = carve(cv, N * fl);
    if (!mt_config_is_moe(c, l)) {
        carve_pair(cv, Nt * 2 * g->F * hl, a->bf16, &L->gu, &L->gu16);
    } else {
        L->probs = carve(cv, N * E * fl);
        L->sel = carve(cv, R * il);
        L->wsel = carve(cv, R * fl);
        L->slot_row = carve(cv, R * il);
        L->perm_tok = carve(cv, R * il);
        L->eoff = carve(cv, (E + 1) * il);
        if (g->sel) L->egu = a->gubuf, L->egu16 = a->gubuf16;
        else carve_pair(cv, R * 2 * g->Fm * hl, a->bf16, &L->egu, &L->egu16);
        if (g->Fs && g->sel) L->sgu = a->gubuf, L->sgu16 = a->gubuf16;
        else if (g->Fs) carve_pair(cv, N * 2 * g->Fs * hl, a->bf16, &L->sgu, &L->sgu16);
        L->f = carve(cv, g->B * E * fl);
    }
    if (g->sw) { /* the sublayers' outputs before their norms (SELECTIVE recomputes the attention's) */
        L->ya = g->sel ? a->yabuf : carve(cv, N * C * fl);
        L->rstd_ya = carve(cv, N * fl);
        L->yf = carve(cv, N * C * fl);
        L->rstd_yf = carve(cv, N * fl);
    }
}

/* The chunk's decoder layers [lo, hi) and, when last, the MTP blocks after its head: the
 * fields that say which layer each layer_acts is (mt_acts_layer_of) */
static void chunk_shape(mt_acts *a, const mt_config *c, int lo, int hi, int last) {
    a->lo = lo;
    a->hi = hi;
    a->last = last;
    a->Lm = c->num_hidden_layers;
    a->nmtp = last ? c->num_nextn_predict_layers : 0;
    a->nL = hi - lo + a->nmtp;
}

/* The last chunk's MTP blocks: each one's decoder layer and its own buffers (mtp_acts). */
static void carve_mtp(carver *cv, mt_acts *a, const mt_config *c, const geom *g) {
    const size_t N = g->N, C = g->C, fl = sizeof(float), il = sizeof(int32_t);
    for (int k = 0; k < a->nmtp; k++) {
        layer_acts dummy;
        mtp_acts mdummy;
        layer_acts *L = a->L ? &a->L[a->hi - a->lo + k] : &dummy;
        mtp_acts *M = a->M ? &a->M[k] : &mdummy;
        carve_layer(cv, a, L, c, mt_acts_layer_of(a, a->hi - a->lo + k), g);
        M->tok = carve(cv, N * il);
        M->tg = carve(cv, N * il);
        M->e = carve(cv, N * C * fl);
        M->cat = carve(cv, N * 2 * C * fl);
        M->rstd_e = carve(cv, N * fl);
        M->rstd_h = carve(cv, N * fl);
        M->out = carve(cv, N * C * fl);
        M->rstd_o = carve(cv, N * fl);
        M->dout = carve(cv, N * C * fl);
    }
}

/* The residual stream, its gradients, the norms' buffers, the RoPE tables, TP's buffers. */
static void carve_stream(carver *cv, mt_acts *a, const geom *g) {
    const size_t N = g->N, Nt = g->Nt, C = g->C, fl = sizeof(float);
    a->xf = carve(cv, N * C * fl);
    if (a->last) a->rstdf = carve(cv, N * fl);
    a->cos_t = carve(cv, g->T * rope_w(g) / 2 * fl);
    a->sin_t = carve(cv, g->T * rope_w(g) / 2 * fl);
    void *ln = carve(cv, N * C * fl); /* norm_in writes it as bf16 or as fp32: both views */
    a->ln = ln;
    a->ln16 = ln;
    /* the final norm's output lives only while the head (whose backward runs with its
     * forward) reads it: the blocks' normed-input buffer, free by then */
    if (a->last) a->lnf = a->ln;
    a->rstd_tmp = carve(cv, N * fl);
    a->dres = carve(cv, N * C * fl);
    a->dln = carve(cv, N * C * fl);
    if (g->sw) a->dsub = carve(cv, N * C * fl);
    if (g->tp > 1) {
        a->gat = carve(cv, Nt * C * fl);
        a->part = carve(cv, Nt * C * fl);
        a->dgat = carve(cv, Nt * C * fl);
    }
}

/* The backward's scratch region of the chunk's layers [a->lo, a->hi); sets a->ffn_rows. */
static void carve_scratch(carver *cv, mt_acts *a, const mt_config *c, const geom *g) {
    const size_t N = g->N, Nt = g->Nt, C = g->C, H = g->H, G = g->G, D = g->D, E = g->E, R = g->R;
    const size_t F = g->F, fl = sizeof(float), hl = g->hl;
    /* [rows, F]-sized scratch (big1, big2; big3 twice it): sized by the MoE layers; the
     * dense FFN (F wider than the experts' K*Fm) then runs over row chunks that fit */
    size_t bigsz = 0;
    int dense = 0;
    for (int i = 0; i < a->nL; i++) {
        const int l = mt_acts_layer_of(a, i);
        if (mt_config_is_moe(c, l)) bigsz = maxz(bigsz, maxz(R * g->Fm, N * g->Fs));
        else dense = 1;
    }
    a->ffn_rows = (int)Nt;
    if (dense && F > 0 && bigsz > 0) {
        const size_t floor_rows = Nt < MT_FFN_MIN_ROWS ? Nt : MT_FFN_MIN_ROWS;
        size_t rows = maxz(bigsz / F / 16 * 16, floor_rows);
        a->ffn_rows = (int)(rows < Nt ? rows : Nt);
    }
    bigsz = maxz(bigsz, (size_t)a->ffn_rows * F * dense);
    /* Three groups of scratch share one region: the attention backward's gradients (only
     * live from the output projection's backward to the QKV projections' backward), the
     * FFN / MoE blocks' buffers (only live inside one block, forward or backward) and the
     * head's logits chunk (only live in the head, after the last layer's forward). No
     * function holds buffers of two groups. */
    const size_t u0 = cv->off;
    if (g->mla) { /* MLA: the forward's kv_b output, k_pe and normed q / c live here too */
        a->datt = carve(cv, Nt * H * g->dv * fl);
        a->dq = carve(cv, Nt * H * g->dq * fl);
        a->dk = carve(cv, Nt * H * g->dq * fl);
        a->dv = carve(cv, Nt * H * g->dv * fl);
        a->dkv = carve(cv, Nt * H * (g->dq - g->dr + g->dv) * fl);
        a->kpe = carve(cv, Nt * g->dr * fl);
        a->cn = carve(cv, Nt * g->kvl * fl);
        a->dcn = carve(cv, Nt * g->kvl * fl);
        a->dckv = carve(cv, Nt * g->kvl * fl);
        if (g->ql) {
            a->cqn = carve(cv, Nt * g->ql * fl);
            a->dcqn = carve(cv, Nt * g->ql * fl);
            a->dcq = carve(cv, Nt * g->ql * fl);
        }
    } else {
        a->datt = carve(cv, Nt * H * D * fl);
        a->dq = carve(cv, Nt * H * D * fl);
        a->dk = carve(cv, Nt * G * D * fl);
        a->dv = carve(cv, Nt * G * D * fl);
    }
    const size_t u1 = cv->off;
    cv->off = u0;
    /* the bf16 scratch: the SwiGLU output (big1), the gate|up gradient (big3) and the
     * gathered expert rows (xe) (model/internal.h): half the bytes (dact in big2 and the expert
     * outputs in ye stay fp32) */
    carve_pair(cv, bigsz * hl, a->bf16, &a->big1, &a->big1_16);
    a->big2 = carve(cv, bigsz * fl);
    carve_pair(cv, 2 * bigsz * hl, a->bf16, &a->big3, &a->big3_16);
    if (E) {
        carve_pair(cv, R * C * hl, a->bf16, &a->xe, &a->xe16);
        void *ye = carve(cv, R * C * fl); /* the gathered output gradients as bf16, then fp32 */
        a->ye = ye;
        a->ye16 = ye;
        a->ds = carve(cv, N * E * fl);
        a->dw = carve(cv, R * fl);
        a->wrow = carve(cv, R * fl);
    }
    const size_t u2 = cv->off;
    cv->off = u0;
    if (a->last) a->head_scratch = carve(cv, mt_head_scratch_floats(c->vocab_size) * fl);
    cv->off = maxz(cv->off, maxz(u1, u2));
}

static void carve_att_scratch(carver *cv, mt_acts *a, const geom *g) {
    const size_t w = att_qk(g) > att_v(g) ? att_qk(g) : att_v(g);
    a->att_scratch = carve(cv, g->nthr * mt_attention_scratch_floats((int)g->T, (int)w) * sizeof(float));
}

/* One function lays out every activation buffer: run dry to size, then for real. */
static void acts_layout(mt_acts *a, const mt_config *c, const mt_acts_dims *d, carver *cv) {
    geom g;
    geom_of(&g, c, d);
    carve_shared(cv, a, &g);
    for (int l = a->lo; l < a->hi; l++) carve_layer(cv, a, &a->L[l - a->lo], c, l, &g);
    carve_mtp(cv, a, c, &g);
    carve_stream(cv, a, &g);
    carve_scratch(cv, a, c, &g);
    carve_att_scratch(cv, a, &g);
}

/* ---------------------------------------------------------------- sizes by part (sizes.h) */

size_t mt_acts_layer_bytes(const mt_config *c, int l, const mt_acts_dims *d) {
    geom g;
    geom_of(&g, c, d);
    mt_acts a;
    layer_acts L;
    memset(&a, 0, sizeof a);
    memset(&L, 0, sizeof L);
    carver cv = {NULL, 0, 1};
    carve_layer(&cv, &a, &L, c, l, &g);
    return cv.off;
}

size_t mt_acts_base_bytes(const mt_config *c, int last, const mt_acts_dims *d) {
    geom g;
    geom_of(&g, c, d);
    mt_acts a;
    memset(&a, 0, sizeof a);
    chunk_shape(&a, c, 0, 0, last);
    carver cv = {NULL, 0, 1};
    carve_shared(&cv, &a, &g);
    carve_mtp(&cv, &a, c, &g);
    carve_stream(&cv, &a, &g);
    carve_att_scratch(&cv, &a, &g);
    return cv.off;
}

size_t mt_acts_scratch_bytes(const mt_config *c, int lo, int hi, int last, const mt_acts_dims *d) {
    geom g;
    geom_of(&g, c, d);
    mt_acts a;
    memset(&a, 0, sizeof a);
    chunk_shape(&a, c, lo, hi, last);
    carver cv = {NULL, 0, 1};
    carve_scratch(&cv, &a, c, &g);
    return cv.off;
}

/* ---------------------------------------------------------------- recompute policies */

static const char *const rc_names[MT_RECOMPUTE_N] = {"none", "selective", "keep-all", "full"};

const char *mt_recompute_name(int policy) {
    return policy >= 0 && policy < MT_RECOMPUTE_N ? rc_names[policy] : "?";
}

int mt_recompute_lookup(const char *name) {
    for (int i = 0; i < MT_RECOMPUTE_N; i++)
        if (strcmp(name, rc_names[i]) == 0) return i;
    return -1;
}

int mt_recompute_trainer(int policy) { return policy == MT_RECOMPUTE_NONE || policy == MT_RECOMPUTE_SELECTIVE; }

int mt_recompute_parse(const char *name) {
    int p = mt_recompute_lookup(name);
    if (p >= 0 && !mt_recompute_trainer(p))
        return mt_error("--recompute: '%s' is a policy of the planner only; the trainer has none or selective", name);
    if (p < 0) return mt_error("--recompute: unknown policy '%s' (none or selective)", name);
    return p;
}

size_t mt_acts_bytes_chunk(const mt_config *c, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp, int kv16) {
    mt_acts a;
    memset(&a, 0, sizeof a);
    a.policy = policy;
    a.kv16 = kv16;
    a.tp = tp;
    a.sp = sp && tp > 1;
    chunk_shape(&a, c, lo, hi, last);
    a.first = first;
    a.L = mt_xcalloc((size_t)a.nL + 1, sizeof(layer_acts));
    a.M = mt_xcalloc((size_t)a.nmtp + 1, sizeof(mtp_acts));
    const mt_acts_dims d = {B, T, nthr, policy, tp, sp, kv16};
    carver cv = {NULL, 0, 1};
    acts_layout(&a, c, &d, &cv);
    free(a.L);
    free(a.M);
    return cv.off;
}

size_t mt_acts_bytes_policy(const mt_config *c, int B, int T, int nthr, int policy, int bf16) {
    return mt_acts_bytes_chunk(c, 0, c->num_hidden_layers, 1, 1, B, T, nthr, policy, 1, 0,
                               mt_attention_bf16(bf16, c->head_dim));
}

size_t mt_acts_bytes(const mt_config *c, int B, int T, int nthr, int bf16) {
    return mt_acts_bytes_policy(c, B, T, nthr, MT_RECOMPUTE_NONE, bf16);
}

mt_acts *mt_acts_new_chunk(const mt_config *c, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp, int bf16) {
    MT_ASSERT(mt_recompute_trainer(policy));
    MT_ASSERT(0 <= lo && lo <= hi && hi <= c->num_hidden_layers);
    mt_acts *a = mt_xcalloc(1, sizeof *a);
    a->B = B;
    a->T = T;
    a->nthr = nthr;
    a->policy = policy;
    chunk_shape(a, c, lo, hi, last);
    a->first = first;
    a->tp = tp > 1 ? tp : 1;
    a->sp = sp && tp > 1;
    a->cap = (size_t)B * T;
    a->bf16 = bf16 != 0;
    a->ws.bf16 = a->bf16; /* every kernel the blocks run gets the precision with a->ws */
    a->kv16 = mt_attention_bf16(a->bf16, c->head_dim);
    a->L = mt_xcalloc((size_t)a->nL + 1, sizeof(layer_acts));
    a->M = mt_xcalloc((size_t)a->nmtp + 1, sizeof(mtp_acts));
    a->arena_bytes = mt_acts_bytes_chunk(c, lo, hi, first, last, B, T, nthr, policy, tp, sp, a->kv16);
    a->arena = mt_alloc(a->arena_bytes);
    const mt_acts_dims d = {B, T, nthr, policy, tp, sp, a->kv16};
    carver cv = {a->arena, 0, 0};
    acts_layout(a, c, &d, &cv);
    mt_rope_table(a->cos_t, a->sin_t, T, mt_config_rope_dim(c), c->rope_theta);
    a->rope_T = T, a->rope_D = mt_config_rope_dim(c), a->rope_theta = c->rope_theta;
    a->nlayers = mt_config_layers(c);
    a->nexperts = c->n_routed_experts;
    a->load = mt_xcalloc((size_t)a->nlayers * (c->n_routed_experts + 1), sizeof(int64_t));
    return a;
}

mt_acts *mt_acts_new_policy(const mt_config *c, int B, int T, int nthr, int policy, int bf16) {
    return mt_acts_new_chunk(c, 0, c->num_hidden_layers, 1, 1, B, T, nthr, policy, 1, 0, bf16);
}

mt_acts *mt_acts_new(const mt_config *c, int B, int T, int nthr, int bf16) {
    return mt_acts_new_policy(c, B, T, nthr, MT_RECOMPUTE_NONE, bf16);
}

size_t mt_acts_arena_bytes(const mt_acts *a) { return a->arena_bytes; }
int mt_acts_bf16(const mt_acts *a) { return a->bf16; }
void mt_acts_fwd_rows(mt_acts *a, int on) { a->ws.rows = on && !a->bf16; }

void mt_acts_park(mt_acts *a) {
    mt_release_pages(a->arena, a->arena_bytes);
    if (a->ws.p) mt_release_pages(a->ws.p, a->ws.cap);
    /* the one thing in the arena that outlives a micro-batch */
    mt_rope_table(a->cos_t, a->sin_t, a->rope_T, a->rope_D, a->rope_theta);
}

int mt_acts_rows(const mt_acts *a, int n) { return a->sp ? n / a->tp : n; }

float *mt_acts_input(mt_acts *a) { return a->hi > a->lo ? a->L[0].x : a->xf; }
float *mt_acts_output(mt_acts *a) { return a->xf; }
float *mt_acts_grad(mt_acts *a) { return a->dres; }

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

void mt_acts_ws_reserve(mt_acts *a, const mt_config *c, int N) {
    const int bf16 = a->bf16, nthr = mt_get_threads() > a->nthr ? mt_get_threads() : a->nthr;
    const int C = c->hidden_size, Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm;
    int F = c->intermediate_size > Fm ? c->intermediate_size : Fm;
    F = F > Fs ? F : Fs;
    size_t need = bf16 ? mt_gemm_ws_bytes(nthr) : 0;
    need = max_size(need, mt_rmsnorm_fwd16_ws_bytes(C, nthr));
    need = max_size(need, mt_rope_store16_ws_bytes(c->num_key_value_heads, c->head_dim, nthr));
    need = max_size(need, mt_swiglu_ws_bytes(F, nthr));
    if (a->last) need = max_size(need, mt_head_ws_bytes(N, C, c->vocab_size, bf16, 1, nthr));
    if (c->n_routed_experts > 0) {
        const int E = c->n_routed_experts, O = 2 * Fm > C ? 2 * Fm : C;
        need = max_size(need, mt_moe_permute_ws_bytes(E, nthr));
        need = max_size(need, mt_grouped_ws_bytes(N * c->num_experts_per_tok, E, O, bf16, nthr));
    }
    mt_ws_reserve(&a->ws, need);
}

void mt_acts_free(mt_acts *a) {
    if (!a) return;
    mt_moe_scratch_free(a);
    mt_ws_free(&a->ws);
    mt_free(a->arena);
    free(a->L);
    free(a->M);
    free(a->load);
    free(a);
}

const int64_t *mt_acts_load(const mt_acts *a) { return a->load; }

void mt_acts_reset_load(mt_acts *a) {
    memset(a->load, 0, sizeof(int64_t) * (size_t)a->nlayers * (size_t)a->nexperts);
}

uint64_t mt_acts_routing_hash(const mt_acts *a, const mt_config *c) {
    uint64_t h = 0;
    for (int j = 0; j < (a->mtp_ran ? a->nL : a->hi - a->lo); j++) {
        const int l = mt_acts_layer_of(a, j);
        if (!mt_config_is_moe(c, l)) continue;
        for (size_t i = 0; i < (size_t)a->Nl * (size_t)c->num_experts_per_tok; i++)
            h = mt_hash4(h, (uint64_t)l, i, (uint64_t)a->L[j].sel[i]);
    }
    return h;
}
