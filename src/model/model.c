/* model/model.c — parameter layout, initialisation, and the explicit forward and backward
 * of the MODEL.md transformer for one micro-batch (see model.h). */
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

enum { MAX_E = 4096 }; /* experts per layer the trainer supports (stack arrays in routing) */

/* ---------------------------------------------------------------- layout */

static int add_tensor(mt_tensor *t, int idx, size_t *off, int decay, int role, int layer, int expert,
                      int64_t d0, int64_t d1, const char *fmt, ...) __attribute__((format(printf, 10, 11)));
static int add_tensor(mt_tensor *t, int idx, size_t *off, int decay, int role, int layer, int expert,
                      int64_t d0, int64_t d1, const char *fmt, ...) {
    /* saturating: absurd configs give SIZE_MAX (mt_model_check refuses them), not a wrapped size */
    const size_t lim = SIZE_MAX / 8;
    size_t a = (size_t)(d0 > 0 ? d0 : 0), b = (size_t)(d1 > 0 ? d1 : 1);
    size_t numel = a != 0 && b > lim / a ? lim : a * b;
    if (t) {
        mt_tensor *x = &t[idx];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->name, sizeof x->name, fmt, ap);
        va_end(ap);
        x->ndim = d1 > 0 ? 2 : 1;
        x->shape[0] = d0;
        x->shape[1] = d1 > 0 ? d1 : 0;
        x->offset = *off;
        x->numel = numel;
        x->decay = decay;
        x->role = role;
        x->layer = layer;
        x->expert = expert;
        x->full_index = idx;
        x->replica = 0;
        x->tp_dim = -1;
        x->tp_off = 0;
        x->tp_full = 0;
    }
    *off = *off >= lim || numel >= lim - *off ? SIZE_MAX : *off + numel;
    return idx + 1;
}

int mt_model_layout(const mt_config *c, mt_tensor *t, size_t *nparams) {
    const int C = c->hidden_size, H = c->num_attention_heads, G = c->num_key_value_heads;
    const int D = c->head_dim, F = c->intermediate_size, E = c->n_routed_experts;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm;
    size_t off = 0;
    int n = 0;
    n = add_tensor(t, n, &off, 1, MT_R_EMBED, -1, -1, c->vocab_size, C, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const char *p = "model.layers";
        n = add_tensor(t, n, &off, 0, MT_R_IN_NORM, l, -1, C, 0, "%s.%d.input_layernorm.weight", p, l);
        n = add_tensor(t, n, &off, 1, MT_R_WQ, l, -1, (int64_t)H * D, C, "%s.%d.self_attn.q_proj.weight", p, l);
        n = add_tensor(t, n, &off, 1, MT_R_WK, l, -1, (int64_t)G * D, C, "%s.%d.self_attn.k_proj.weight", p, l);
        n = add_tensor(t, n, &off, 1, MT_R_WV, l, -1, (int64_t)G * D, C, "%s.%d.self_attn.v_proj.weight", p, l);
        n = add_tensor(t, n, &off, 1, MT_R_WO, l, -1, C, (int64_t)H * D, "%s.%d.self_attn.o_proj.weight", p, l);
        n = add_tensor(t, n, &off, 0, MT_R_POST_NORM, l, -1, C, 0, "%s.%d.post_attention_layernorm.weight", p, l);
        if (!mt_config_is_moe(c, l)) {
            n = add_tensor(t, n, &off, 1, MT_R_GATE, l, -1, F, C, "%s.%d.mlp.gate_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_UP, l, -1, F, C, "%s.%d.mlp.up_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_DOWN, l, -1, C, F, "%s.%d.mlp.down_proj.weight", p, l);
        } else {
            n = add_tensor(t, n, &off, 1, MT_R_ROUTER, l, -1, E, C, "%s.%d.mlp.gate.weight", p, l);
            /* expert e's gate_proj and up_proj adjacent ([2Fm, C]: one GEMM computes both),
             * then every expert's down_proj */
            for (int e = 0; e < E; e++) {
                n = add_tensor(t, n, &off, 1, MT_R_EGATE, l, e, Fm, C, "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
                n = add_tensor(t, n, &off, 1, MT_R_EUP, l, e, Fm, C, "%s.%d.mlp.experts.%d.up_proj.weight", p, l, e);
            }
            for (int e = 0; e < E; e++)
                n = add_tensor(t, n, &off, 1, MT_R_EDOWN, l, e, C, Fm, "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e);
            if (Fs > 0) {
                n = add_tensor(t, n, &off, 1, MT_R_SGATE, l, -1, Fs, C, "%s.%d.mlp.shared_experts.gate_proj.weight", p, l);
                n = add_tensor(t, n, &off, 1, MT_R_SUP, l, -1, Fs, C, "%s.%d.mlp.shared_experts.up_proj.weight", p, l);
                n = add_tensor(t, n, &off, 1, MT_R_SDOWN, l, -1, C, Fs, "%s.%d.mlp.shared_experts.down_proj.weight", p, l);
            }
        }
    }
    n = add_tensor(t, n, &off, 0, MT_R_NORM, -1, -1, C, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) n = add_tensor(t, n, &off, 1, MT_R_HEAD, -1, -1, c->vocab_size, C, "lm_head.weight");
    if (nparams) *nparams = off;
    return n;
}

void mt_shard_full(mt_shard *s, const mt_config *c) {
    memset(s, 0, sizeof *s);
    s->ep_rank = 0;
    s->ep_size = 1;
    for (int l = 0; l < c->num_hidden_layers && l < 256; l++) s->layer[l] = 1;
    s->embed = s->head = 1;
    s->tp_rank = 0;
    s->tp_size = 1;
    s->sp = 0;
}

/* the dimension a tensor is split along under tensor parallelism, -1 if replicated:
 * column-parallel (rows of the weight) q, k, v, gate, up; row-parallel (columns) o, down */
static int tp_split_dim(int role) {
    switch (role) {
    case MT_R_WQ: case MT_R_WK: case MT_R_WV: case MT_R_GATE: case MT_R_UP: return 0;
    case MT_R_WO: case MT_R_DOWN: return 1;
    default: return -1;
    }
}

/* does the shard hold full tensor t? 2 = as a replica (the tied embedding used as head) */
static int shard_holds(const mt_config *c, const mt_shard *sh, const mt_tensor *t) {
    if (t->layer >= 0) {
        if (!sh->layer[t->layer]) return 0;
        if (t->expert < 0) return 1;
        int le = c->n_routed_experts / sh->ep_size;
        return t->expert / le == sh->ep_rank;
    }
    if (t->role == MT_R_EMBED) return sh->embed ? 1 : (sh->head && c->tie_word_embeddings) ? 2 : 0;
    return sh->head;
}

int mt_model_layout_shard(const mt_config *c, const mt_shard *sh, mt_tensor *t, size_t *nparams,
                          size_t *n_tp, size_t *n_dense) {
    mt_shard full;
    if (!sh) {
        mt_shard_full(&full, c);
        sh = &full;
    }
    int nf = mt_model_layout(c, NULL, NULL);
    mt_tensor *all = mt_xcalloc((size_t)nf, sizeof *all);
    mt_model_layout(c, all, NULL);
    /* pass 0: TP slices; pass 1: the other tensors but the routed experts under EP; pass 2:
     * those experts */
    const int tp = sh->tp_size > 1 ? sh->tp_size : 1;
    size_t off = 0, ntp = 0, nd = 0;
    int n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < nf; i++) {
            int h = shard_holds(c, sh, &all[i]);
            int dim = tp > 1 ? tp_split_dim(all[i].role) : -1;
            int p = dim >= 0 ? 0 : (all[i].expert >= 0 && sh->ep_size > 1) ? 2 : 1;
            if (!h || p != pass) continue;
            mt_tensor x = all[i];
            if (dim >= 0) {
                MT_ASSERT(x.shape[dim] % tp == 0);
                x.tp_dim = dim;
                x.tp_full = x.shape[dim];
                x.shape[dim] /= tp;
                x.tp_off = x.shape[dim] * sh->tp_rank;
                x.numel /= (size_t)tp;
            }
            if (t) {
                t[n] = x;
                t[n].offset = off;
                t[n].replica = h == 2;
            }
            off += x.numel;
            n++;
        }
        if (pass == 0) ntp = off;
        if (pass == 1) nd = off;
    }
    free(all);
    if (nparams) *nparams = off;
    if (n_tp) *n_tp = ntp;
    if (n_dense) *n_dense = nd;
    return n;
}

double mt_model_active_params(const mt_config *c) {
    const double C = c->hidden_size, H = c->num_attention_heads, G = c->num_key_value_heads;
    const double D = c->head_dim;
    double total = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        total += C * H * D * 2 + C * G * D * 2;
        if (!mt_config_is_moe(c, l))
            total += 3.0 * C * c->intermediate_size;
        else
            total += C * c->n_routed_experts +
                     3.0 * C * c->moe_intermediate_size * (c->num_experts_per_tok + c->n_shared_experts);
    }
    total += (double)c->vocab_size * C;
    return total;
}

double mt_model_flops_per_token(const mt_config *c, int T) {
    /* causal attention: a token at position t attends to t+1 keys; QK^T and PV each
     * 2*D FLOPs per (head, key); averaged over the sequence: (T+1)/2 keys */
    double att = 2.0 * 2.0 * c->num_attention_heads * c->head_dim * ((double)T + 1) / 2.0;
    return 6.0 * mt_model_active_params(c) + 3.0 * att * c->num_hidden_layers;
}

/* ---------------------------------------------------------------- model */

static void bind(const mt_model *m, float *base, mt_layer_w *w, float **embed, float **norm,
                 float **head) {
    const mt_config *c = &m->cfg;
    const int e0 = m->shard.ep_rank * (c->n_routed_experts / m->shard.ep_size);
    memset(w, 0, sizeof *w * (size_t)c->num_hidden_layers);
    *embed = *norm = *head = NULL;
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        float *p = base + t->offset;
        mt_layer_w *L = t->layer >= 0 ? &w[t->layer] : NULL;
        switch (t->role) {
        case MT_R_EMBED: *embed = p; break;
        case MT_R_NORM: *norm = p; break;
        case MT_R_HEAD: *head = p; break;
        case MT_R_IN_NORM: L->in_norm = p; break;
        case MT_R_WQ: L->wq = p; break;
        case MT_R_WK: L->wk = p; break;
        case MT_R_WV: L->wv = p; break;
        case MT_R_WO: L->wo = p; break;
        case MT_R_POST_NORM: L->post_norm = p; break;
        case MT_R_GATE: L->gate = p; break;
        case MT_R_UP: L->up = p; break;
        case MT_R_DOWN: L->down = p; break;
        case MT_R_ROUTER: L->router = p; break;
        case MT_R_EGATE: if (t->expert == e0) L->egate = p; break;
        case MT_R_EUP: if (t->expert == e0) L->eup = p; break;
        case MT_R_EDOWN: if (t->expert == e0) L->edown = p; break;
        case MT_R_SGATE: L->sgate = p; break;
        case MT_R_SUP: L->sup = p; break;
        case MT_R_SDOWN: L->sdown = p; break;
        default: MT_ASSERT(0);
        }
    }
    if (c->tie_word_embeddings) *head = *embed;
}

int mt_model_check(const mt_config *cfg) {
    if (cfg->num_hidden_layers > 256)
        return mt_error("config: num_hidden_layers %d exceeds the trainer's limit of 256",
                        cfg->num_hidden_layers);
    if (cfg->n_routed_experts > MAX_E || cfg->num_experts_per_tok > 512)
        return mt_error("config: n_routed_experts %d / num_experts_per_tok %d exceed the trainer's limits "
                        "(4096 / 512)", cfg->n_routed_experts, cfg->num_experts_per_tok);
    if (strcmp(cfg->attention_type, "gqa") != 0)
        return mt_error("config: attention_type \"%s\" is not implemented by the trainer yet "
                        "(only \"gqa\")", cfg->attention_type);
    if (cfg->num_nextn_predict_layers > 0)
        return mt_error("config: num_nextn_predict_layers %d: multi-token prediction is not implemented by the "
                        "trainer (moetrain plan models it)", cfg->num_nextn_predict_layers);
    size_t n;
    mt_model_layout(cfg, NULL, &n);
    if (n == SIZE_MAX) return mt_error("config: the parameter count overflows (the sizes are absurd)");
    return 0;
}

int mt_model_init_shard(mt_model *m, const mt_config *cfg, const mt_shard *sh, const mt_ep_ops *ep,
                        const mt_tp_ops *tp) {
    memset(m, 0, sizeof *m);
    if (mt_model_check(cfg) != 0) return -1;
    m->cfg = *cfg;
    if (sh) m->shard = *sh;
    else mt_shard_full(&m->shard, cfg);
    MT_ASSERT(m->shard.ep_size >= 1 && (cfg->n_routed_experts == 0 || cfg->n_routed_experts % m->shard.ep_size == 0));
    MT_ASSERT(m->shard.ep_size == 1 || ep != NULL);
    m->ep = m->shard.ep_size > 1 ? ep : NULL;
    if (m->shard.tp_size < 1) m->shard.tp_size = 1;
    MT_ASSERT(m->shard.tp_size == 1 || tp != NULL);
    m->tp = m->shard.tp_size > 1 ? tp : NULL;
    m->ntensors = mt_model_layout_shard(cfg, &m->shard, NULL, NULL, NULL, NULL);
    m->tensors = mt_xcalloc((size_t)m->ntensors + 1, sizeof(mt_tensor));
    mt_model_layout_shard(cfg, &m->shard, m->tensors, &m->nparams, &m->n_tp, &m->n_dense);
    const size_t bytes = (m->nparams + 1) * sizeof(float); /* nparams < SIZE_MAX / 8: mt_model_check */
    m->params = mt_try_alloc(bytes);
    m->grads = m->params ? mt_try_alloc(bytes) : NULL;
    if (!m->grads) {
        mt_free(m->params);
        free(m->tensors);
        memset(m, 0, sizeof *m);
        return mt_error("config: %zu parameters: %.1f GiB of weights and as much of gradients cannot be allocated",
                        (size_t)(bytes / sizeof(float) - 1), (double)bytes / 1073741824.0);
    }
    m->w = mt_xcalloc((size_t)cfg->num_hidden_layers, sizeof(mt_layer_w));
    m->g = mt_xcalloc((size_t)cfg->num_hidden_layers, sizeof(mt_layer_w));
    bind(m, m->params, m->w, &m->embed, &m->norm, &m->head);
    bind(m, m->grads, m->g, &m->d_embed, &m->d_norm, &m->d_head);
    return 0;
}

int mt_model_init(mt_model *m, const mt_config *cfg) { return mt_model_init_shard(m, cfg, NULL, NULL, NULL); }

void mt_model_free(mt_model *m) {
    mt_free(m->params);
    mt_free(m->grads);
    free(m->tensors);
    free(m->w);
    free(m->g);
    memset(m, 0, sizeof *m);
}

void mt_model_init_weights(mt_model *m, uint64_t seed, float std) {
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            continue;
        }
        /* stream = index in the whole model, counter = element index in the whole tensor:
         * the same draw whatever the thread count or layout (a TP slice draws its part) */
        const uint64_t stream = (uint64_t)t->full_index;
        const size_t cols = (size_t)t->shape[1];
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < t->numel; j++) {
            size_t fj = j;
            if (t->tp_dim == 0) fj = (size_t)t->tp_off * cols + j;
            else if (t->tp_dim == 1) fj = (j / cols) * (size_t)t->tp_full + (size_t)t->tp_off + j % cols;
            p[j] = std * mt_normal(seed, stream, fj);
        }
    }
}

const mt_tensor *mt_model_find(const mt_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

void mt_model_zero_grads(mt_model *m) { mt_zero(m->grads, m->nparams); }

/* ---------------------------------------------------------------- activations */

/* What the backward of a layer needs from its forward (named, so a memory policy can later
 * keep, recompute or swap each). The normed inputs of attention and FFN are not kept: the
 * backward recomputes them from x / h and the saved 1/rms (cheap, element-wise). */
typedef struct {
    float *x;                     /* [N,C] layer input (residual stream) */
    float *rstd1;                 /* [N] 1/rms of x */
    float *q, *k, *v;             /* [N,H*D], [N,G*D] x2 (after RoPE); k, v NULL with kv16 */
    uint16_t *k16, *v16;          /* kv16: K and V rounded to bf16, all attention reads of them */
    float *att, *lse;             /* [N,H*D], [B,H,T] */
    float *h;                     /* [N,C] residual after attention */
    float *rstd2;                 /* [N] */
    float *gu;                    /* dense: [N,2F] gate|up (bf16 mode: bf16, SCRATCH_PAIR) */
    float *probs;                 /* MoE: [N,E] selection scores p */
    int32_t *sel;                 /* [N,k] */
    float *wsel;                  /* [N,k] final routing weights */
    int32_t *slot_row;            /* [N*k] permuted row of (token, slot) */
    int32_t *perm_tok;            /* [N*k] token of permuted row */
    int32_t *eoff;                /* [E+1] */
    float *egu;                   /* [N*k,2Fm] expert gate|up (permuted order; bf16 mode: bf16) */
    float *sgu;                   /* [N,2Fs] shared experts gate|up (bf16 mode: bf16) */
    float *f;                     /* [B,E] per-sequence routed fraction f_e */
    mt_ep_batch epb;              /* EP: the dispatch of this layer (owned by the exchange) */
    float *ep_egu;                /* EP: [epb.R, 2Fm] expert gate|up (allocated per step; bf16 mode: bf16) */
} layer_acts;

struct mt_acts {
    int B, T, nthr, nlayers, nexperts, policy, count_load;
    int kv16;                     /* K, V kept as bf16 (bf16 attention: the same bits) */
    int lo, hi, first, last;      /* the chunk: decoder layers [lo, hi), embedding, head */
    int tp, sp;                   /* tensor parallel size, sequence parallelism */
    int Nl, g0;                   /* last forward: rows of the residual stream, first token's index */
    float *gat, *part, *dgat;     /* TP: [N,C] gathered input, row-parallel partial sums, gathered gradient */
    size_t cap;                   /* capacity B*T */
    layer_acts *L;
    float *xf, *lnf, *rstdf;      /* chunk output (final residual), final norm out, rstd */
    float *cos_t, *sin_t;
    /* scratch shared by all layers */
    float *ln, *rstd_tmp;         /* normed input of the current block [N,C], [N] */
    float *hbuf, *gubuf;          /* SELECTIVE: the one h [N,C] and gate|up buffer all layers share */
    float *dres, *dln, *datt, *dq, *dk, *dv;
    float *big1, *big2, *big3;    /* [max(ffn_rows*F, R*Fm, N*Fs)] x2, [twice that] */
    int ffn_rows;                 /* rows of the dense FFN per pass over big1-3 (<= B*T) */
    float *xe, *ye, *ds, *dw, *wrow;
    float *att_scratch, *head_scratch;
    int64_t *load;
    char *arena;
    size_t arena_bytes;
};

typedef struct { char *base; size_t off; int dry; } carver;

static void *carve(carver *cv, size_t bytes) {
    size_t a = (bytes + 63) & ~(size_t)63;
    void *p = cv->dry ? NULL : cv->base + cv->off;
    cv->off += a;
    return p;
}

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

/* One function lays out every activation buffer: run dry to size, then for real. */
static void acts_layout(mt_acts *a, const mt_config *c, int B, int T, int nthr, carver *cv) {
    /* with TP: attention and the dense FFN see all N tokens with the local heads / columns;
     * the residual stream, norms, MoE and head hold Nl = N/tp tokens with SP (else N) */
    const size_t tp = a->tp > 1 ? (size_t)a->tp : 1;
    const size_t Nt = (size_t)B * T, N = a->sp ? Nt / tp : Nt, C = c->hidden_size;
    const size_t H = c->num_attention_heads / tp, G = c->num_key_value_heads / tp, D = c->head_dim;
    const size_t E = c->n_routed_experts;
    const size_t K = c->num_experts_per_tok, Fm = c->moe_intermediate_size;
    const size_t Fs = (size_t)c->n_shared_experts * Fm, F = c->intermediate_size / tp;
    const size_t R = N * K, fl = sizeof(float), il = sizeof(int32_t);
    /* [rows, F]-sized scratch (big1, big2; big3 twice it): sized by the MoE layers; the
     * dense FFN (F wider than the experts' K*Fm) then runs over row chunks that fit */
    size_t bigsz = 0;
    int dense = 0;
    for (int l = a->lo; l < a->hi; l++) {
        if (mt_config_is_moe(c, l)) bigsz = maxz(bigsz, maxz(R * Fm, N * Fs));
        else dense = 1;
    }
    a->ffn_rows = (int)Nt;
    if (dense && F > 0 && bigsz > 0) {
        const size_t floor_rows = Nt < MT_FFN_MIN_ROWS ? Nt : MT_FFN_MIN_ROWS;
        size_t rows = maxz(bigsz / F / 16 * 16, floor_rows);
        a->ffn_rows = (int)(rows < Nt ? rows : Nt);
    }
    bigsz = maxz(bigsz, (size_t)a->ffn_rows * F * dense);
    const int sel = a->policy == MT_RECOMPUTE_SELECTIVE;
    /* kv16 implies the bf16 GEMMs, in which the FFNs keep their gate|up outputs as bf16
     * (SCRATCH_PAIR), and their scratch that only products read (below) */
    const size_t hl = a->kv16 ? sizeof(uint16_t) : fl;
    if (sel) {
        a->hbuf = carve(cv, N * C * fl);
        a->gubuf = E ? carve(cv, maxz(R * 2 * Fm, N * 2 * Fs) * hl) : NULL;
    }
    for (int l = a->lo; l < a->hi; l++) {
        layer_acts *L = &a->L[l - a->lo];
        L->x = carve(cv, N * C * fl);
        L->rstd1 = carve(cv, N * fl);
        L->q = carve(cv, Nt * H * D * fl);
        if (a->kv16) {
            L->k16 = carve(cv, Nt * G * D * sizeof(uint16_t));
            L->v16 = carve(cv, Nt * G * D * sizeof(uint16_t));
        } else {
            L->k = carve(cv, Nt * G * D * fl);
            L->v = carve(cv, Nt * G * D * fl);
        }
        L->att = carve(cv, Nt * H * D * fl);
        L->lse = carve(cv, Nt * H * fl);
        L->h = sel ? a->hbuf : carve(cv, N * C * fl);
        L->rstd2 = carve(cv, N * fl);
        if (!mt_config_is_moe(c, l)) {
            L->gu = carve(cv, Nt * 2 * F * hl);
        } else {
            L->probs = carve(cv, N * E * fl);
            L->sel = carve(cv, R * il);
            L->wsel = carve(cv, R * fl);
            L->slot_row = carve(cv, R * il);
            L->perm_tok = carve(cv, R * il);
            L->eoff = carve(cv, (E + 1) * il);
            L->egu = sel ? a->gubuf : carve(cv, R * 2 * Fm * hl);
            if (Fs) L->sgu = sel ? a->gubuf : carve(cv, N * 2 * Fs * hl);
            L->f = carve(cv, (size_t)B * E * fl);
        }
    }
    a->xf = carve(cv, N * C * fl);
    if (a->last) a->rstdf = carve(cv, N * fl);
    a->cos_t = carve(cv, (size_t)T * D / 2 * fl);
    a->sin_t = carve(cv, (size_t)T * D / 2 * fl);
    a->ln = carve(cv, N * C * fl);
    /* the final norm's output lives only while the head (whose backward runs with its
     * forward) reads it: the blocks' normed-input buffer, free by then */
    if (a->last) a->lnf = a->ln;
    a->rstd_tmp = carve(cv, N * fl);
    a->dres = carve(cv, N * C * fl);
    a->dln = carve(cv, N * C * fl);
    if (tp > 1) {
        a->gat = carve(cv, Nt * C * fl);
        a->part = carve(cv, Nt * C * fl);
        a->dgat = carve(cv, Nt * C * fl);
    }
    /* Three groups of scratch share one region: the attention backward's gradients (only
     * live from the output projection's backward to the QKV projections' backward), the
     * FFN / MoE blocks' buffers (only live inside one block, forward or backward) and the
     * head's logits chunk (only live in the head, after the last layer's forward). No
     * function holds buffers of two groups. */
    const size_t u0 = cv->off;
    a->datt = carve(cv, Nt * H * D * fl);
    a->dq = carve(cv, Nt * H * D * fl);
    a->dk = carve(cv, Nt * G * D * fl);
    a->dv = carve(cv, Nt * G * D * fl);
    const size_t u1 = cv->off;
    cv->off = u0;
    /* the bf16 scratch: the SwiGLU output (big1), the gate|up gradient (big3) and the
     * gathered expert rows (xe) (SCRATCH_PAIR): half the bytes (dact in big2 and the expert
     * outputs in ye stay fp32) */
    a->big1 = carve(cv, bigsz * hl);
    a->big2 = carve(cv, bigsz * fl);
    a->big3 = carve(cv, 2 * bigsz * hl);
    if (E) {
        a->xe = carve(cv, R * C * hl);
        a->ye = carve(cv, R * C * fl);
        a->ds = carve(cv, N * E * fl);
        a->dw = carve(cv, R * fl);
        a->wrow = carve(cv, R * fl);
    }
    const size_t u2 = cv->off;
    cv->off = u0;
    if (a->last) a->head_scratch = carve(cv, mt_head_scratch_floats(c->vocab_size) * fl);
    cv->off = maxz(cv->off, maxz(u1, u2));
    a->att_scratch = carve(cv, (size_t)nthr * mt_attention_scratch_floats(T, (int)D) * fl);
}

int mt_recompute_parse(const char *name) {
    if (strcmp(name, "none") == 0) return MT_RECOMPUTE_NONE;
    if (strcmp(name, "selective") == 0) return MT_RECOMPUTE_SELECTIVE;
    return mt_error("--recompute: unknown policy '%s' (none or selective)", name);
}

size_t mt_acts_bytes_chunk(const mt_config *c, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp, int kv16) {
    mt_acts a;
    memset(&a, 0, sizeof a);
    a.policy = policy;
    a.kv16 = kv16;
    a.tp = tp;
    a.sp = sp && tp > 1;
    a.lo = lo;
    a.hi = hi;
    a.first = first;
    a.last = last;
    a.L = mt_xcalloc((size_t)(hi - lo) + 1, sizeof(layer_acts));
    carver cv = {NULL, 0, 1};
    acts_layout(&a, c, B, T, nthr, &cv);
    free(a.L);
    return cv.off;
}

size_t mt_acts_bytes_policy(const mt_config *c, int B, int T, int nthr, int policy) {
    return mt_acts_bytes_chunk(c, 0, c->num_hidden_layers, 1, 1, B, T, nthr, policy, 1, 0,
                               mt_attention_bf16(c->head_dim));
}

size_t mt_acts_bytes(const mt_config *c, int B, int T, int nthr) {
    return mt_acts_bytes_policy(c, B, T, nthr, MT_RECOMPUTE_NONE);
}

mt_acts *mt_acts_new_chunk(const mt_config *c, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp) {
    MT_ASSERT(policy == MT_RECOMPUTE_NONE || policy == MT_RECOMPUTE_SELECTIVE);
    MT_ASSERT(0 <= lo && lo <= hi && hi <= c->num_hidden_layers);
    mt_acts *a = mt_xcalloc(1, sizeof *a);
    a->B = B;
    a->T = T;
    a->nthr = nthr;
    a->policy = policy;
    a->lo = lo;
    a->hi = hi;
    a->first = first;
    a->last = last;
    a->tp = tp > 1 ? tp : 1;
    a->sp = sp && tp > 1;
    a->cap = (size_t)B * T;
    a->kv16 = mt_attention_bf16(c->head_dim);
    a->L = mt_xcalloc((size_t)(hi - lo) + 1, sizeof(layer_acts));
    a->arena_bytes = mt_acts_bytes_chunk(c, lo, hi, first, last, B, T, nthr, policy, tp, sp, a->kv16);
    a->arena = mt_alloc(a->arena_bytes);
    carver cv = {a->arena, 0, 0};
    acts_layout(a, c, B, T, nthr, &cv);
    mt_rope_table(a->cos_t, a->sin_t, T, c->head_dim, c->rope_theta);
    a->nlayers = c->num_hidden_layers;
    a->nexperts = c->n_routed_experts;
    a->load = mt_xcalloc((size_t)c->num_hidden_layers * (c->n_routed_experts + 1), sizeof(int64_t));
    return a;
}

mt_acts *mt_acts_new_policy(const mt_config *c, int B, int T, int nthr, int policy) {
    return mt_acts_new_chunk(c, 0, c->num_hidden_layers, 1, 1, B, T, nthr, policy, 1, 0);
}

mt_acts *mt_acts_new(const mt_config *c, int B, int T, int nthr) {
    return mt_acts_new_policy(c, B, T, nthr, MT_RECOMPUTE_NONE);
}

size_t mt_acts_arena_bytes(const mt_acts *a) { return a->arena_bytes; }

int mt_acts_rows(const mt_acts *a, int n) { return a->sp ? n / a->tp : n; }

float *mt_acts_input(mt_acts *a) { return a->hi > a->lo ? a->L[0].x : a->xf; }
float *mt_acts_output(mt_acts *a) { return a->xf; }
float *mt_acts_grad(mt_acts *a) { return a->dres; }

void mt_acts_free(mt_acts *a) {
    if (!a) return;
    mt_free(a->arena);
    free(a->L);
    free(a->load);
    free(a);
}

const int64_t *mt_acts_load(const mt_acts *a) { return a->load; }

void mt_acts_reset_load(mt_acts *a) {
    memset(a->load, 0, sizeof(int64_t) * (size_t)a->nlayers * (size_t)a->nexperts);
}

uint64_t mt_acts_routing_hash(const mt_acts *a, const mt_config *c) {
    uint64_t h = 0;
    for (int l = a->lo; l < a->hi; l++) {
        if (!mt_config_is_moe(c, l)) continue;
        for (size_t i = 0; i < (size_t)a->Nl * (size_t)c->num_experts_per_tok; i++)
            h = mt_hash4(h, (uint64_t)l, i, (uint64_t)a->L[l - a->lo].sel[i]);
    }
    return h;
}

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

/* ---------------------------------------------------------------- forward pieces */

/* In bf16 mode the FFNs keep the activations and gradients that only products read (the
 * gathered expert rows and output gradients, the SwiGLU output, the gate|up gradient) as
 * bf16, in the scratch that holds them as fp32 otherwise: the products round them anyway, so
 * the same bits in half the bytes (docs/DESIGN.md, Mixed precision). The gate|up outputs
 * that the backward keeps (gu, egu, sgu) are bf16 too, rounded as the product writes them,
 * as autocast keeps a product's output: the SwiGLU forward and backward both read the
 * rounded values, in fp32 math. One pointer of each pair is set: bf16 (h16) or fp32. */
#define SCRATCH_PAIR(h16, buf, f32, b16) \
    float *f32 = (h16) ? NULL : (buf);  \
    uint16_t *b16 = (h16) ? (uint16_t *)(buf) : NULL

/* SwiGLU FFN with gate|up in one GEMM (Wgu = [gate; up] is [2F, C], adjacent in the layout):
 * out[N,C] = res + (silu(g)*u) Wd^T (res NULL: 0; the residual add in the product's output
 * pass, mt_linear_fwd_res) ; gu[N,2F] is kept for the backward. The input is
 * x, or x16 when it is bf16 (the other NULL). The SwiGLU
 * and the down projection run over chunks of `rows` rows in the scratch a->big1 (the dense
 * FFN, wider than the MoE-sized scratch, passes a->ffn_rows; the shared experts fit: N). */
static void swiglu_ffn_fwd(mt_acts *a, float *out, const float *res, float *gubuf, const float *x,
                           const uint16_t *x16, const float *wgu, const float *wd, int N, int C, int F, int rows) {
    const int h16 = mt_gemm_bf16_enabled();
    SCRATCH_PAIR(h16, a->big1, act, act16);
    SCRATCH_PAIR(h16, gubuf, gu, gu16);
    mt_linear_fwd_x(gu, gu16, x, x16, wgu, N, C, 2 * F, 0.0f);
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int n = N - n0 < rows ? N - n0 : rows;
        const size_t o = (size_t)n0 * 2 * F;
        mt_swiglu_rows_fwd_x(act, act16, gu ? gu + o : NULL, gu16 ? gu16 + o : NULL, n, F);
        if (res) mt_linear_fwd_res(out + (size_t)n0 * C, res + (size_t)n0 * C, act, act16, wd, n, F, C);
        else mt_linear_fwd_x(out + (size_t)n0 * C, NULL, act, act16, wd, n, F, C, 0.0f);
    }
}

/* dx[N,C] = d/dx (overwritten); weight grads accumulate (dwgu is [2F, C]), over the same
 * chunks of rows, in the scratch a->big1 [rows,F], big2 [rows,F], big3 [rows,2F]. */
static void swiglu_ffn_bwd(mt_acts *a, float *dx, float *dwgu, float *dwd, const float *dout, const float *x,
                           const uint16_t *x16, float *gubuf, const float *wgu, const float *wd, int N, int C,
                           int F, int rows) {
    const int h16 = mt_gemm_bf16_enabled();
    float *dact = a->big2;
    SCRATCH_PAIR(h16, a->big1, act, act16);
    SCRATCH_PAIR(h16, a->big3, dgu, dgu16);
    SCRATCH_PAIR(h16, gubuf, gu, gu16);
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int n = N - n0 < rows ? N - n0 : rows;
        const size_t o = (size_t)n0 * 2 * F;
        const float *g = gu ? gu + o : NULL, *dy = dout + (size_t)n0 * C;
        const uint16_t *g16 = gu16 ? gu16 + o : NULL;
        mt_swiglu_rows_fwd_x(act, act16, g, g16, n, F);                       /* recompute the activation */
        mt_linear_bwd_x(dact, dwd, dy, NULL, act, act16, wd, n, F, C, 0.0f); /* da */
        mt_swiglu_rows_bwd_x(dgu, dgu16, dact, g, g16, NULL, n, F);           /* dg|du */
        mt_linear_bwd_x(dx + (size_t)n0 * C, dwgu, dgu, dgu16, x ? x + (size_t)n0 * C : NULL,
                        x16 ? x16 + (size_t)n0 * C : NULL, wgu, n, C, 2 * F, 0.0f);
    }
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
    if (Fs > 0) swiglu_ffn_fwd(a, out, res, L->sgu, ln, ln16, w->sgate, w->sdown, N, C, Fs, N);
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
    if (Fs > 0) swiglu_ffn_fwd(a, out, res, L->sgu, ln, NULL, w->sgate, w->sdown, N, C, Fs, N);
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
static void balance_fwd(const mt_model *m, const mt_acts *a, const layer_acts *L, int B, int T, double *sum_out) {
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
        swiglu_ffn_bwd(a, dln, dw->sgate, dw->sdown, dout, ln, ln16, L->sgu, w->sgate, w->sdown, N, C, Fs, N);
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
        swiglu_ffn_bwd(a, dln, dw->sgate, dw->sdown, dout, ln, NULL, L->sgu, w->sgate, w->sdown, N, C, Fs, N);
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
    mt_model_forward(m, a, inputs, targets, pos, B, T, train, ce_scale, logits, st);
    if (train) mt_model_backward(m, a, inputs, pos, B, T, bal_scale);
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
    const int tp = m->tp ? m->tp->size : 1, h16 = mt_gemm_bf16_enabled() && tp == 1 && !(moe_layer && m->ep);
    if (h16) mt_rmsnorm_fwd16((uint16_t *)a->ln, rstd, x, w, a->Nl, c->hidden_size, eps);
    else mt_rmsnorm_fwd(a->ln, rstd, x, w, a->Nl, c->hidden_size, eps);
    *f = h16 ? NULL : a->ln;
    *h = h16 ? (const uint16_t *)a->ln : NULL;
}

void mt_model_forward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                      const int32_t *pos, int B, int T, int train, float ce_scale, float *logits,
                      mt_step_stats *st) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, H = c->num_attention_heads / tp;
    const int G = c->num_key_value_heads / tp, D = c->head_dim, F = c->intermediate_size / tp;
    const int V = c->vocab_size, lo = a->lo, hi = a->hi;
    const float eps = (float)c->rms_norm_eps;
    MT_ASSERT(T <= a->T && (size_t)N <= a->cap && (tp > 1) == (a->tp > 1));
    MT_ASSERT(!a->kv16 || mt_gemm_bf16_enabled()); /* the bf16 scratch sizes (acts_layout) */
    a->Nl = a->sp ? N / tp : N;
    a->g0 = a->sp ? m->tp->rank * a->Nl : 0;
    MT_ASSERT(!a->sp || N % tp == 0);
    const int Nl = a->Nl;
    a->count_load = train;

    float *x0 = mt_acts_input(a);
    if (a->first) { /* embedding of this rank's tokens */
        const int32_t *tok = inputs + a->g0;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < Nl; n++)
            memcpy(x0 + (size_t)n * C, m->embed + (size_t)tok[n] * C, sizeof(float) * C);
    }

    for (int l = lo; l < hi; l++) {
        layer_acts *L = &a->L[l - lo];
        const mt_layer_w *w = &m->w[l];
        float *xout = l + 1 < hi ? a->L[l + 1 - lo].x : a->xf;
        mt_trace_begin("fwd.attention");
        const float *lnx;
        const uint16_t *ln16;
        norm_in(m, a, 0, L->rstd1, L->x, w->in_norm, &lnx, &ln16);
        const float *lnf = tp > 1 ? tp_in(m, a, a->gat, a->ln, C) : lnx;
        mt_linear_fwd_x(L->q, NULL, lnf, ln16, w->wq, N, C, H * D, 0.0f);
        mt_rope_apply_pos(L->q, a->cos_t, a->sin_t, pos, N, T, H, D, 0);
        if (a->kv16) { /* V's product rounds its output; K in fp32 in the attention backward's
                        * dk (free in the forward), rotated and rounded in one pass */
            mt_linear_fwd_x(a->dk, NULL, lnf, ln16, w->wk, N, C, G * D, 0.0f);
            mt_linear_fwd_x(NULL, L->v16, lnf, ln16, w->wv, N, C, G * D, 0.0f);
            mt_rope_store16(L->k16, a->dk, a->cos_t, a->sin_t, pos, N, T, G, D);
            mt_attention_fwd_kv16(L->att, L->lse, L->q, L->k16, L->v16, pos, B, T, H, G, D, a->att_scratch,
                                  a->nthr);
        } else {
            mt_linear_fwd_x(L->k, NULL, lnf, ln16, w->wk, N, C, G * D, 0.0f);
            mt_linear_fwd_x(L->v, NULL, lnf, ln16, w->wv, N, C, G * D, 0.0f);
            mt_rope_apply_pos(L->k, a->cos_t, a->sin_t, pos, N, T, G, D, 0);
            mt_attention_fwd(L->att, L->lse, L->q, L->k, L->v, pos, B, T, H, G, D, a->att_scratch, a->nthr);
        }
        if (tp == 1) { /* residual add fused into the output projection */
            mt_linear_fwd_res(L->h, L->x, L->att, NULL, w->wo, N, H * D, C);
        } else {       /* row-parallel: partial sums over the local heads, summed over TP */
            mt_linear_fwd(a->part, L->att, w->wo, N, H * D, C, 0.0f);
            tp_out(m, L->h, a->part, N, C);
            mt_add(L->h, L->x, (size_t)Nl * C);
        }
        norm_in(m, a, mt_config_is_moe(c, l), L->rstd2, L->h, w->post_norm, &lnx, &ln16);
        mt_trace_end();
        /* the FFN writes xout = h + FFN(norm(h)) */
        if (!mt_config_is_moe(c, l)) {
            mt_trace_begin("fwd.ffn");
            if (tp == 1) {
                swiglu_ffn_fwd(a, xout, L->h, L->gu, lnx, ln16, w->gate, w->down, N, C, F, a->ffn_rows);
            } else {
                const float *lf = tp_in(m, a, a->gat, a->ln, C);
                swiglu_ffn_fwd(a, a->part, NULL, L->gu, lf, NULL, w->gate, w->down, N, C, F, a->ffn_rows);
                tp_out(m, a->dln, a->part, N, C); /* dln: scratch in the forward */
                mt_copy(xout, L->h, (size_t)Nl * C);
                mt_add(xout, a->dln, (size_t)Nl * C);
            }
        } else {
            mt_trace_begin("fwd.moe");
            if (m->ep) moe_fwd_ep(m, a, L, w, l, B, T, a->ln, L->h, xout, train);
            else moe_fwd(m, a, L, w, l, B, T, lnx, ln16, L->h, xout);
            balance_fwd(m, a, L, B, T, &st->bal_sum[l]);
        }
        mt_trace_end();
    }
    if (!a->last) return;
    mt_trace_begin(train ? "fwd.head+ce (+bwd)" : "fwd.head");
    const int32_t *tg = targets + a->g0;
    mt_rmsnorm_fwd(a->lnf, a->rstdf, a->xf, m->norm, Nl, C, eps);
    int64_t nv = 0;
    for (int n = 0; n < Nl; n++) nv += tg[n] >= 0;
    st->n_valid += nv;
    st->ce_sum += mt_head_ce(train ? a->dln : NULL, train ? m->d_head : NULL, logits, a->lnf,
                             m->head, tg, Nl, C, V, ce_scale, a->head_scratch);
    mt_trace_end();
}

void mt_model_backward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *pos, int B, int T,
                       float bal_scale) {
    const mt_config *c = &m->cfg;
    const int tp = m->tp ? m->tp->size : 1;
    const int N = B * T, C = c->hidden_size, H = c->num_attention_heads / tp;
    const int G = c->num_key_value_heads / tp, D = c->head_dim, F = c->intermediate_size / tp;
    const int lo = a->lo, hi = a->hi, Nl = a->Nl;
    MT_ASSERT(!a->kv16 || mt_gemm_bf16_enabled()); /* the bf16 scratch sizes (acts_layout) */
    float *d = a->dres;
    if (a->last) { /* the head's backward ran with the forward: dln = d(loss)/d(final norm out) */
        mt_zero(d, (size_t)Nl * C);
        mt_rmsnorm_bwd(d, m->d_norm, a->dln, a->xf, m->norm, a->rstdf, Nl, C);
    }
    const float bal_coef = (float)(c->aux_loss_alpha * bal_scale);
    for (int l = hi - 1; l >= lo; l--) {
        layer_acts *L = &a->L[l - lo];
        const mt_layer_w *w = &m->w[l];
        mt_layer_w *dw = &m->g[l];
        if (a->policy == MT_RECOMPUTE_SELECTIVE) { /* h = x + att Wo^T, as in the forward */
            if (tp == 1) {
                mt_linear_fwd_res(L->h, L->x, L->att, NULL, w->wo, N, H * D, C);
            } else {
                mt_linear_fwd(a->part, L->att, w->wo, N, H * D, C, 0.0f);
                tp_out(m, L->h, a->part, N, C);
                mt_add(L->h, L->x, (size_t)Nl * C);
            }
        }
        mt_trace_begin(mt_config_is_moe(c, l) ? "bwd.moe" : "bwd.ffn");
        /* ffn: d is the gradient of the layer output; recompute its normed input */
        const float *lnx;
        const uint16_t *ln16;
        norm_in(m, a, mt_config_is_moe(c, l), a->rstd_tmp, L->h, w->post_norm, &lnx, &ln16);
        if (!mt_config_is_moe(c, l)) {
            if (tp == 1) {
                swiglu_ffn_bwd(a, a->dln, dw->gate, dw->down, d, lnx, ln16, L->gu, w->gate, w->down, N, C, F,
                               a->ffn_rows);
            } else { /* gathered input and output gradient; the input gradient summed over TP */
                const float *lf = tp_in(m, a, a->gat, a->ln, C);
                const float *df = tp_in(m, a, a->dgat, d, C);
                swiglu_ffn_bwd(a, a->part, dw->gate, dw->down, df, lf, NULL, L->gu, w->gate, w->down, N, C, F,
                               a->ffn_rows);
                tp_out(m, a->dln, a->part, N, C);
            }
        } else if (m->ep) {
            moe_bwd_ep(m, a, L, w, dw, T, a->ln, d, a->dln, bal_coef);
        } else {
            moe_bwd(c, a, L, w, dw, T, lnx, ln16, d, a->dln, bal_coef);
        }
        mt_rmsnorm_bwd(d, dw->post_norm, a->dln, L->h, w->post_norm, L->rstd2, Nl, C);
        mt_trace_end();
        mt_trace_begin("bwd.attention");
        /* attention: d is now the gradient of h */
        norm_in(m, a, 0, a->rstd_tmp, L->x, w->in_norm, &lnx, &ln16);
        const float *lnf = tp > 1 ? tp_in(m, a, a->gat, a->ln, C) : lnx;
        const float *df = tp > 1 ? tp_in(m, a, a->dgat, d, C) : d;
        mt_linear_bwd(a->datt, dw->wo, df, L->att, w->wo, N, H * D, C, 0.0f);
        if (a->kv16)
            mt_attention_bwd_kv16(a->dq, a->dk, a->dv, a->datt, L->q, L->k16, L->v16, L->att, L->lse, pos, B, T, H,
                                  G, D, a->att_scratch, a->nthr);
        else
            mt_attention_bwd(a->dq, a->dk, a->dv, a->datt, L->q, L->k, L->v, L->att, L->lse, pos, B, T, H, G, D,
                             a->att_scratch, a->nthr);
        mt_rope_apply_pos(a->dq, a->cos_t, a->sin_t, pos, N, T, H, D, 1);
        mt_rope_apply_pos(a->dk, a->cos_t, a->sin_t, pos, N, T, G, D, 1);
        float *dl = tp > 1 ? a->part : a->dln;
        mt_linear_bwd(dl, NULL, a->dq, lnf, w->wq, N, C, H * D, 0.0f);
        mt_linear_bwd(dl, NULL, a->dk, lnf, w->wk, N, C, G * D, 1.0f);
        mt_linear_bwd(dl, NULL, a->dv, lnf, w->wv, N, C, G * D, 1.0f);
        { /* their weight gradients read lnf packed once, into datt (dead since the attention
           * backward) when it is large enough */
            float *const dws[3] = {dw->wq, dw->wk, dw->wv};
            const float *const dos[3] = {a->dq, a->dk, a->dv};
            const int os[3] = {H * D, G * D, G * D};
            mt_linear_bwd_weight_shared(3, dws, dos, os, lnf, ln16, N, C, a->datt, (size_t)N * H * D);
        }
        if (tp > 1) tp_out(m, a->dln, a->part, N, C);
        mt_rmsnorm_bwd(d, dw->in_norm, a->dln, L->x, w->in_norm, L->rstd1, Nl, C);
        mt_trace_end();
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
