/* model/layout.c — the parameter layout (tensor table of the whole model and of a part), FLOP counts, and the model object: allocation, binding, seeded init (see model.h). */
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

/* The tensors of decoder layer l (main stack or MTP block) from index n; returns the next. */
static int layer_tensors(const mt_config *c, mt_tensor *t, int n, size_t *offp, int l) {
    const int C = c->hidden_size, H = c->num_attention_heads, G = c->num_key_value_heads;
    const int D = c->head_dim, F = c->intermediate_size, E = c->n_routed_experts;
    const int Fm = c->moe_intermediate_size, Fs = c->n_shared_experts * Fm, mla = mt_config_is_mla(c);
    const int mtp = l >= c->num_hidden_layers;
    size_t off = *offp;
    {
        const char *p = "model.layers";
        if (mtp) { /* the block's input: its embedding and hidden-state norms and their projection */
            n = add_tensor(t, n, &off, 0, MT_R_ENORM, l, -1, C, 0, "%s.%d.enorm.weight", p, l);
            n = add_tensor(t, n, &off, 0, MT_R_HNORM, l, -1, C, 0, "%s.%d.hnorm.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_EH_PROJ, l, -1, C, 2 * (int64_t)C, "%s.%d.eh_proj.weight", p, l);
        }
        n = add_tensor(t, n, &off, 0, MT_R_IN_NORM, l, -1, C, 0, "%s.%d.input_layernorm.weight", p, l);
        if (mla) {
            const int ql = c->q_lora_rank, kvl = c->kv_lora_rank, dn = c->qk_nope_head_dim;
            const int dr = c->qk_rope_head_dim, dv = c->v_head_dim;
            const int64_t HQ = (int64_t)H * (dn + dr);
            if (ql > 0) {
                n = add_tensor(t, n, &off, 1, MT_R_WQA, l, -1, ql, C, "%s.%d.self_attn.q_a_proj.weight", p, l);
                n = add_tensor(t, n, &off, 0, MT_R_QA_NORM, l, -1, ql, 0, "%s.%d.self_attn.q_a_layernorm.weight", p,
                               l);
                n = add_tensor(t, n, &off, 1, MT_R_WQ, l, -1, HQ, ql, "%s.%d.self_attn.q_b_proj.weight", p, l);
            } else {
                n = add_tensor(t, n, &off, 1, MT_R_WQ, l, -1, HQ, C, "%s.%d.self_attn.q_proj.weight", p, l);
            }
            n = add_tensor(t, n, &off, 1, MT_R_WKVA, l, -1, kvl + dr, C, "%s.%d.self_attn.kv_a_proj_with_mqa.weight",
                           p, l);
            n = add_tensor(t, n, &off, 0, MT_R_KVA_NORM, l, -1, kvl, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_WKVB, l, -1, (int64_t)H * (dn + dv), kvl,
                           "%s.%d.self_attn.kv_b_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_WO, l, -1, C, (int64_t)H * dv, "%s.%d.self_attn.o_proj.weight", p, l);
        } else {
            n = add_tensor(t, n, &off, 1, MT_R_WQ, l, -1, (int64_t)H * D, C, "%s.%d.self_attn.q_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_WK, l, -1, (int64_t)G * D, C, "%s.%d.self_attn.k_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_WV, l, -1, (int64_t)G * D, C, "%s.%d.self_attn.v_proj.weight", p, l);
            n = add_tensor(t, n, &off, 1, MT_R_WO, l, -1, C, (int64_t)H * D, "%s.%d.self_attn.o_proj.weight", p, l);
        }
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
        if (c->sandwich_norm) { /* last in the layer: the tables of other models keep their order */
            n = add_tensor(t, n, &off, 0, MT_R_PRE_MLP_NORM, l, -1, C, 0, "%s.%d.pre_mlp_layernorm.weight", p, l);
            n = add_tensor(t, n, &off, 0, MT_R_POST_MLP_NORM, l, -1, C, 0, "%s.%d.post_mlp_layernorm.weight", p, l);
        }
        if (mtp) n = add_tensor(t, n, &off, 0, MT_R_MTP_NORM, l, -1, C, 0, "%s.%d.shared_head.norm.weight", p, l);
    }
    *offp = off;
    return n;
}

int mt_model_layout(const mt_config *c, mt_tensor *t, size_t *nparams) {
    const int C = c->hidden_size;
    size_t off = 0;
    int n = 0;
    n = add_tensor(t, n, &off, 1, MT_R_EMBED, -1, -1, c->vocab_size, C, "model.embed_tokens.weight");
    /* the MTP blocks after the main stack, as their layer indices say */
    for (int l = 0; l < mt_config_layers(c); l++) n = layer_tensors(c, t, n, &off, l);
    n = add_tensor(t, n, &off, 0, MT_R_NORM, -1, -1, C, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) n = add_tensor(t, n, &off, 1, MT_R_HEAD, -1, -1, c->vocab_size, C, "lm_head.weight");
    if (nparams) *nparams = off;
    return n;
}

void mt_part_whole(mt_part *s, const mt_config *c) {
    memset(s, 0, sizeof *s);
    s->ep_rank = 0;
    s->ep_size = 1;
    for (int l = 0; l < mt_config_layers(c) && l < 256; l++) s->layer[l] = 1;
    s->embed = s->head = 1;
    s->tp_rank = 0;
    s->tp_size = 1;
    s->sp = 0;
}

void mt_expert_map_contiguous(mt_expert_map *m, const mt_config *c) {
    m->L = mt_config_layers(c);
    m->E = c->n_routed_experts;
    const size_t n = (size_t)m->L * m->E;
    m->slot_of = mt_xmalloc(sizeof(int32_t) * (n + 1));
    m->expert_of = mt_xmalloc(sizeof(int32_t) * (n + 1));
    for (size_t i = 0; i < n; i++) m->slot_of[i] = m->expert_of[i] = (int32_t)(i % (size_t)m->E);
}

int mt_expert_map_parse(mt_expert_map *m, const mt_config *c, const char *spec) {
    memset(m, 0, sizeof *m);
    if (strcmp(spec, "contiguous") == 0) {
        mt_expert_map_contiguous(m, c);
        return 0;
    }
    char *end = NULL;
    unsigned long long seed = 0;
    if (strncmp(spec, "shuffled:", 9) == 0 && spec[9] >= '0' && spec[9] <= '9') seed = strtoull(spec + 9, &end, 10);
    if (!end || *end)
        return mt_error("--expert-placement '%s': contiguous or shuffled:SEED (SEED a non-negative integer)", spec);
    mt_expert_map_contiguous(m, c);
    /* Fisher-Yates per layer, each draw a pure function of (seed, layer, index) */
    for (int l = 0; l < m->L; l++) {
        int32_t *eo = m->expert_of + (size_t)l * m->E;
        for (int i = m->E - 1; i > 0; i--) {
            int j = (int)(mt_hash4(seed, 0x657870u, (uint64_t)l, (uint64_t)i) % (uint64_t)(i + 1));
            int32_t t = eo[i];
            eo[i] = eo[j];
            eo[j] = t;
        }
        for (int s = 0; s < m->E; s++) m->slot_of[(size_t)l * m->E + eo[s]] = s;
    }
    return 0;
}

void mt_expert_map_free(mt_expert_map *m) {
    free(m->slot_of);
    free(m->expert_of);
    memset(m, 0, sizeof *m);
}

/* the dimension a tensor is split along under tensor parallelism, -1 if replicated:
 * column-parallel (rows of the weight) q, k, v, gate, up, MLA's kv_b (its rows head-major,
 * as q's); row-parallel (columns) o, down. MLA's q_a and kv_a (and their norms) are shared
 * by all heads: replicated. */
static int tp_split_dim(int role) {
    switch (role) {
    case MT_R_WQ: case MT_R_WK: case MT_R_WV: case MT_R_GATE: case MT_R_UP: case MT_R_WKVB: return 0;
    case MT_R_WO: case MT_R_DOWN: return 1;
    default: return -1;
    }
}

/* does the part hold full tensor t? 2 = as a replica (the embedding on the last pipeline
 * stage: the tied head, or the MTP blocks' input) */
static int part_holds(const mt_config *c, const mt_part *sh, const mt_tensor *t) {
    if (t->layer >= 0) {
        if (!sh->layer[t->layer]) return 0;
        if (t->expert < 0) return 1;
        int le = c->n_routed_experts / sh->ep_size;
        int slot = sh->slot_of ? sh->slot_of[(size_t)t->layer * c->n_routed_experts + t->expert] : t->expert;
        return slot / le == sh->ep_rank;
    }
    if (t->role == MT_R_EMBED)
        return sh->embed ? 1 : (sh->head && (c->tie_word_embeddings || c->num_nextn_predict_layers > 0)) ? 2 : 0;
    return sh->head;
}

/* The whole table's order with each MoE layer's routed experts in slot order (gate|up pairs
 * kept together, then the down projections): a rank's experts are then consecutive, as the
 * grouped GEMMs index them. The identity for the contiguous placement. */
static int *placement_order(const mt_config *c, const mt_part *sh, const mt_tensor *all, int nf) {
    int *order = mt_xmalloc(sizeof(int) * ((size_t)nf + 1));
    for (int i = 0; i < nf; i++) order[i] = i;
    if (!sh->slot_of) return order;
    const int E = c->n_routed_experts;
    for (int i = 0; i < nf;) {
        if (all[i].expert < 0) { i++; continue; }
        /* a run: [gate e, up e] for every e, or down e for every e, of one layer */
        const int l = all[i].layer, per = all[i].role == MT_R_EDOWN ? 1 : 2;
        const int32_t *so = sh->slot_of + (size_t)l * E;
        for (int k = 0; k < E * per; k++) order[i + per * so[all[i + k].expert] + k % per] = i + k;
        i += E * per;
    }
    return order;
}

int mt_model_layout_part(const mt_config *c, const mt_part *sh, mt_tensor *t, size_t *nparams,
                          size_t *n_tp, size_t *n_dense) {
    mt_part full;
    if (!sh) {
        mt_part_whole(&full, c);
        sh = &full;
    }
    int nf = mt_model_layout(c, NULL, NULL);
    mt_tensor *all = mt_xcalloc((size_t)nf, sizeof *all);
    mt_model_layout(c, all, NULL);
    int *order = placement_order(c, sh, all, nf);
    /* pass 0: TP slices; pass 1: the other tensors but the routed experts under EP; pass 2:
     * those experts */
    const int tp = sh->tp_size > 1 ? sh->tp_size : 1;
    size_t off = 0, ntp = 0, nd = 0;
    int n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (int oi = 0; oi < nf; oi++) {
            const int i = order[oi];
            int h = part_holds(c, sh, &all[i]);
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
    free(order);
    if (nparams) *nparams = off;
    if (n_tp) *n_tp = ntp;
    if (n_dense) *n_dense = nd;
    return n;
}

double mt_model_active_params(const mt_config *c) {
    const double C = c->hidden_size;
    const mt_attn_params ap = mt_attn_param_counts(c); /* model/sizes.h: the planner's too */
    double total = 0;
    for (int l = 0; l < mt_config_layers(c); l++) {
        total += ap.split + ap.shared;
        if (!mt_config_is_moe(c, l))
            total += 3.0 * C * c->intermediate_size;
        else
            total += C * c->n_routed_experts +
                     3.0 * C * c->moe_intermediate_size * (c->num_experts_per_tok + c->n_shared_experts);
    }
    /* the head, run by the main stack and by each MTP block, and each block's eh_proj */
    total += (double)c->vocab_size * C * (1 + c->num_nextn_predict_layers);
    total += 2.0 * C * C * c->num_nextn_predict_layers;
    return total;
}

double mt_model_flops_per_token(const mt_config *c, int T) {
    /* causal attention's scores and values, (T+1)/2 keys a token (model/sizes.h) */
    const double att = mt_attn_core_flops(c, T);
    return 6.0 * mt_model_active_params(c) + 3.0 * att * mt_config_layers(c);
}

/* ---------------------------------------------------------------- model */

static int slot_of(const mt_model *m, const mt_tensor *t) {
    return m->slot_of ? m->slot_of[(size_t)t->layer * m->cfg.n_routed_experts + t->expert] : t->expert;
}

/* points the per-layer views at a buffer laid out by the model's table (the first local
 * expert of each layer: the one in the rank's first slot) */
static void bind(const mt_model *m, float *base, mt_layer_w *w, float **embed, float **norm,
                 float **head) {
    const mt_config *c = &m->cfg;
    const int e0 = m->part.ep_rank * (c->n_routed_experts / m->part.ep_size);
    memset(w, 0, sizeof *w * (size_t)mt_config_layers(c));
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
        case MT_R_EGATE: if (slot_of(m, t) == e0) L->egate = p; break;
        case MT_R_EUP: if (slot_of(m, t) == e0) L->eup = p; break;
        case MT_R_EDOWN: if (slot_of(m, t) == e0) L->edown = p; break;
        case MT_R_SGATE: L->sgate = p; break;
        case MT_R_SUP: L->sup = p; break;
        case MT_R_SDOWN: L->sdown = p; break;
        case MT_R_PRE_MLP_NORM: L->pre_mlp_norm = p; break;
        case MT_R_POST_MLP_NORM: L->post_mlp_norm = p; break;
        case MT_R_WQA: L->wqa = p; break;
        case MT_R_QA_NORM: L->qa_norm = p; break;
        case MT_R_WKVA: L->wkva = p; break;
        case MT_R_KVA_NORM: L->kva_norm = p; break;
        case MT_R_WKVB: L->wkvb = p; break;
        case MT_R_ENORM: L->enorm = p; break;
        case MT_R_HNORM: L->hnorm = p; break;
        case MT_R_EH_PROJ: L->eh_proj = p; break;
        case MT_R_MTP_NORM: L->mtp_norm = p; break;
        default: MT_ASSERT(0);
        }
    }
    if (c->tie_word_embeddings) *head = *embed;
}

int mt_model_check(const mt_config *cfg, const char *what) {
    if (cfg->num_hidden_layers > 256)
        return mt_error("%s: key num_hidden_layers: %d exceeds the trainer's limit of 256", what,
                        cfg->num_hidden_layers);
    if (cfg->n_routed_experts > MAX_E)
        return mt_error("%s: key n_routed_experts: %d exceeds the trainer's limit of %d", what, cfg->n_routed_experts,
                        MAX_E);
    if (cfg->num_experts_per_tok > 512)
        return mt_error("%s: key num_experts_per_tok: %d exceeds the trainer's limit of 512", what,
                        cfg->num_experts_per_tok);
    if (cfg->num_nextn_predict_layers > MT_MAX_MTP)
        return mt_error("%s: key num_nextn_predict_layers: %d exceeds the trainer's limit of %d", what,
                        cfg->num_nextn_predict_layers, MT_MAX_MTP);
    if (mt_config_layers(cfg) > 256)
        return mt_error("%s: num_hidden_layers + num_nextn_predict_layers = %d exceeds the trainer's limit of 256",
                        what, mt_config_layers(cfg));
    size_t n;
    mt_model_layout(cfg, NULL, &n);
    if (n == SIZE_MAX) return mt_error("%s: the parameter count overflows (the sizes are absurd)", what);
    return 0;
}

static int init_part(mt_model *m, const mt_config *cfg, const mt_part *sh, const mt_ep_ops *ep, const mt_tp_ops *tp,
                     int with_grads) {
    memset(m, 0, sizeof *m);
    if (mt_model_check(cfg, "model config") != 0) return -1; /* callers with a file checked it under its name */
    m->cfg = *cfg;
    if (sh) m->part = *sh;
    else mt_part_whole(&m->part, cfg);
    MT_ASSERT(m->part.ep_size >= 1 && (cfg->n_routed_experts == 0 || cfg->n_routed_experts % m->part.ep_size == 0));
    MT_ASSERT(m->part.ep_size == 1 || ep != NULL);
    m->ep = m->part.ep_size > 1 ? ep : NULL;
    if (m->part.tp_size < 1) m->part.tp_size = 1;
    MT_ASSERT(m->part.tp_size == 1 || tp != NULL);
    m->tp = m->part.tp_size > 1 ? tp : NULL;
    if (m->part.slot_of && cfg->n_routed_experts > 0) { /* the model's own copy */
        const size_t n = (size_t)mt_config_layers(cfg) * cfg->n_routed_experts;
        m->slot_of = mt_xmalloc(sizeof(int32_t) * n);
        memcpy(m->slot_of, m->part.slot_of, sizeof(int32_t) * n);
    }
    m->part.slot_of = m->slot_of;
    m->ntensors = mt_model_layout_part(cfg, &m->part, NULL, NULL, NULL, NULL);
    m->tensors = mt_xcalloc((size_t)m->ntensors + 1, sizeof(mt_tensor));
    mt_model_layout_part(cfg, &m->part, m->tensors, &m->nparams, &m->n_tp, &m->n_dense);
    const size_t bytes = (m->nparams + 1) * sizeof(float); /* nparams < SIZE_MAX / 8: mt_model_check */
    m->params = mt_try_alloc(bytes);
    m->grads = m->params && with_grads ? mt_try_alloc(bytes) : NULL;
    if (!m->params || (with_grads && !m->grads)) {
        mt_free(m->params);
        free(m->tensors);
        free(m->slot_of);
        memset(m, 0, sizeof *m);
        return mt_error("model: %zu parameters: %.1f GiB of weights and as much of gradients cannot be allocated",
                        (size_t)(bytes / sizeof(float) - 1), (double)bytes / 1073741824.0);
    }
    m->w = mt_xcalloc((size_t)mt_config_layers(cfg), sizeof(mt_layer_w));
    m->g = mt_xcalloc((size_t)mt_config_layers(cfg), sizeof(mt_layer_w));
    bind(m, m->params, m->w, &m->embed, &m->norm, &m->head);
    if (with_grads) bind(m, m->grads, m->g, &m->d_embed, &m->d_norm, &m->d_head);
    return 0;
}

int mt_model_init_part(mt_model *m, const mt_config *cfg, const mt_part *sh, const mt_ep_ops *ep,
                        const mt_tp_ops *tp) {
    return init_part(m, cfg, sh, ep, tp, 1);
}

int mt_model_init(mt_model *m, const mt_config *cfg) { return mt_model_init_part(m, cfg, NULL, NULL, NULL); }

int mt_model_init_infer(mt_model *m, const mt_config *cfg) { return init_part(m, cfg, NULL, NULL, NULL, 0); }

int mt_model_init_infer_part(mt_model *m, const mt_config *cfg, const mt_part *sh, const mt_ep_ops *ep,
                             const mt_tp_ops *tp) {
    return init_part(m, cfg, sh, ep, tp, 0);
}

void mt_model_slots(const mt_model *m, int32_t *slot) {
    const size_t n = (size_t)mt_config_layers(&m->cfg) * m->cfg.n_routed_experts, E = (size_t)m->cfg.n_routed_experts;
    for (size_t i = 0; i < n; i++) slot[i] = m->slot_of ? m->slot_of[i] : (int32_t)(i % E);
}

void mt_model_set_placement(mt_model *m, const int32_t *slot_of) {
    const mt_config *c = &m->cfg;
    const size_t n = (size_t)mt_config_layers(c) * c->n_routed_experts;
    if (!m->slot_of) m->slot_of = mt_xmalloc(sizeof(int32_t) * (n + 1));
    memcpy(m->slot_of, slot_of, sizeof(int32_t) * n);
    m->part.slot_of = m->slot_of;
    size_t np = 0, ntp = 0, nd = 0;
    const int nt = mt_model_layout_part(c, &m->part, m->tensors, &np, &ntp, &nd);
    MT_ASSERT(nt == m->ntensors && np == m->nparams && ntp == m->n_tp && nd == m->n_dense);
    bind(m, m->params, m->w, &m->embed, &m->norm, &m->head);
    if (m->grads) bind(m, m->grads, m->g, &m->d_embed, &m->d_norm, &m->d_head);
}

void mt_sum_order_init(mt_sum_order *o, const mt_model *src) {
    MT_ASSERT(src->ep);
    const int P = src->ep->size, E = src->cfg.n_routed_experts, LE = E / P, L = mt_config_layers(&src->cfg);
    o->ranks = P;
    o->owner = mt_xmalloc(sizeof(int32_t) * ((size_t)L * E + 1));
    o->node_of = mt_xmalloc(sizeof(int) * (size_t)P);
    mt_model_slots(src, o->owner);
    for (size_t i = 0; i < (size_t)L * E; i++) o->owner[i] /= LE;
    for (int r = 0; r < P; r++) o->node_of[r] = src->ep->node_of ? src->ep->node_of[r] : 0;
}

void mt_sum_order_free(mt_sum_order *o) {
    free(o->owner);
    free(o->node_of);
    memset(o, 0, sizeof *o);
}

void mt_model_sum_like(mt_model *m, const mt_model *src) {
    MT_ASSERT(!m->ep && src->cfg.n_routed_experts == m->cfg.n_routed_experts);
    mt_sum_order_free(&m->sum_order);
    mt_sum_order_init(&m->sum_order, src);
}

void mt_model_free(mt_model *m) {
    free(m->slot_of);
    mt_sum_order_free(&m->sum_order);
    mt_free(m->params);
    mt_free(m->grads);
    free(m->tensors);
    free(m->w);
    free(m->g);
    memset(m, 0, sizeof *m);
}

void mt_model_init_weights(mt_model *m, uint64_t seed, float std) { mt_model_init_weights_embed(m, seed, std, std); }

/* the initial value of norm weight t: 1, or the depth-scaled sandwich norm's gain of a
 * sublayer output, c / sqrt(L): the 2L outputs join the residual stream with an RMS that
 * shrinks with depth, so the stream's RMS at the top does not grow with L */
static float norm_init(const mt_config *c, const mt_tensor *t) {
    if (!c->sandwich_norm || (t->role != MT_R_POST_NORM && t->role != MT_R_POST_MLP_NORM)) return 1.0f;
    const double k = t->role == MT_R_POST_NORM ? MT_DSSN_C_ATTN : MT_DSSN_C_MLP;
    return (float)(k / sqrt((double)c->num_hidden_layers));
}

void mt_model_init_weights_embed(mt_model *m, uint64_t seed, float std0, float embed_std) {
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            const float g = norm_init(&m->cfg, t);
            for (size_t j = 0; j < t->numel; j++) p[j] = g;
            continue;
        }
        const float std = t->role == MT_R_EMBED ? embed_std : std0;
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

float *mt_model_use_params(mt_model *m, float *params) {
    float *prev = m->params;
    m->params = params;
    bind(m, m->params, m->w, &m->embed, &m->norm, &m->head);
    return prev;
}

void mt_model_zero_grads(mt_model *m) { mt_zero(m->grads, m->nparams); }
