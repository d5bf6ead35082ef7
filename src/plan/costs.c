/* plan/costs.c — per-module parameters, FLOPs and activation bytes (see costs.h).
 *
 * Conventions: a GEMM of an [n, a] input by an [a, b] weight is 2ab FLOPs per row; the
 * backward of a GEMM is twice its forward (input and weight gradients). The causal
 * attention core does QK^T and PV over (T+1)/2 keys on average. */
#include "plan/costs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

static int is_mla(const mt_config *c) { return strcmp(c->attention_type, "mla") == 0; }

/* backward working bytes per token both blocks of a layer hold: the normed input, the
 * residual's gradient and its gradient (elt bytes each), the recomputed 1/rms (fp32) */
static double common_work_tok(double C, int elt) { return 3 * C * elt + 4; }

/* Attention block: fills the attention part of a layer unit (norms included). Parameters and
 * FLOPs come from the trainer's own size functions (model/sizes.h); what is kept for the
 * backward is the trainer's arena (model/acts.c carve_layer) at elt bytes a value. */
static void attention(const mt_config *c, int T, int elt, mt_unit_cost *u) {
    const double C = c->hidden_size, H = c->num_attention_heads, f4 = 4;
    const mt_attn_params ap = mt_attn_param_counts(c);
    double vdim, saved, work, rope_w, up_tok = 0, up_rc = 0;
    if (!is_mla(c)) {
        const double D = c->head_dim, G = c->num_key_value_heads;
        vdim = D;
        /* kept: q, k, v after RoPE, attention output */
        saved = (H * D * 2 + G * D * 2) * elt;
        work = (H * D * 2 + G * D * 2) * elt;        /* datt, dq, dk, dv */
        rope_w = H * D + G * D;
        u->gemm_width = 2 * C * H * D;
    } else {
        /* MLA (DeepSeek-V2/V3): q = q_b(norm(q_a(x))) (or q_proj(x) without q_lora),
         * [c | k_pe] = kv_a(x), [k_nope | v] = kv_b(norm(c)), o_proj. */
        const double ql = c->q_lora_rank, kvl = c->kv_lora_rank;
        const double dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim, qkdim = dn + dr;
        vdim = dv;
        /* kept: the q and kv latents before their norms and their 1/rms (the normed ones are
         * recomputed), the full q and per-head k (k_pe inside), v, attention output */
        saved = (ql + kvl + H * qkdim * 2 + H * dv * 2) * elt + (ql > 0 ? f4 : 0) + f4;
        /* the backward's: datt, dq, dk, dv, d[k_nope | v], k_pe, the normed c, its gradient
         * and c's (and the same three for the q latent) */
        work = (H * qkdim * 2 + H * dv * 2 + H * (dn + dv) + dr + 3 * kvl + 3 * ql) * elt;
        rope_w = H * dr + dr;
        u->gemm_width = 2 * kvl * H * (dn + dv);
        /* selective recompute rebuilds the per-head q, k, v (model/mla.c mla_up): q_b (or
         * q_proj), kv_a's k_pe rows and kv_b run again, into buffers the layers share */
        up_tok = (H * qkdim * 2 + H * dv) * elt;
        up_rc = 2 * ((ql > 0 ? ql : C) * H * qkdim + C * dr + kvl * H * (dn + dv));
        /* moetrain's TP runs the latent projections on every gathered token of each rank */
        u->f_gemm_tp_rep += 2 * ap.shared;
    }
    /* q_a and kv_a (MLA) and the latent norms are whole on every TP rank (the trainer's
     * tp_split_dim; Megatron-Core's down-projections are "duplicated" too) */
    u->p_tp += ap.split;
    u->p_tp_trainer += ap.split;
    u->p_rep += ap.shared + ap.norms + 2 * C;          /* + input and post-attention norms */
    u->p_active += ap.split + ap.shared;
    u->f_gemm += 2 * (ap.split + ap.shared);
    u->f_att += mt_attn_core_flops(c, T);
    /* layer input x, its 1/rms; the attention's log-sum-exp per head; h and its 1/rms */
    const double base = C * elt + f4 + H * f4 + C * elt + f4;
    u->act_tok[MT_RECOMPUTE_KEEP_ALL] += base + saved;
    u->act_tok[MT_RECOMPUTE_NONE] += base + saved;
    /* h recomputed from the attention output (and MLA's q, k, v from the latents) */
    u->act_tok[MT_RECOMPUTE_SELECTIVE] += base + saved - C * elt - up_tok;
    u->f_rc_gemm += 2 * C * H * vdim + up_rc;
    u->work_rc_tok += C * elt + up_tok;                /* ... into buffers shared by the layers */
    u->act_tok[MT_RECOMPUTE_FULL] += C * elt;          /* only the layer input */
    /* both blocks: normed input, residual grad, its grad; the attention's own gradients */
    u->work_tok += common_work_tok(C, elt);
    u->work_att_tok += common_work_tok(C, elt) + work;
    /* two norms (read+write), two residual adds (2 reads + write), RoPE (read+write) */
    u->mem_tok += (4 * C + 6 * C + 2 * rope_w) * elt;
    u->tp_colls += 2;                                  /* all-gather in, reduce-scatter out */
}

/* SwiGLU of hidden size F on every token (dense FFN or shared experts; selective
 * recomputes the shared experts' gate|up outputs into one buffer shared by the layers). */
static void swiglu(double C, double F, int elt, int shared, mt_unit_cost *u) {
    u->p_tp += 3 * C * F;
    if (!shared) u->p_tp_trainer += 3 * C * F;
    u->p_active += 3 * C * F;
    u->f_gemm += 6 * C * F;
    if (shared) u->f_shared += 6 * C * F;
    u->act_tok[MT_RECOMPUTE_KEEP_ALL] += 3 * F * elt;  /* gate|up outputs, silu(g)*u */
    u->act_tok[MT_RECOMPUTE_NONE] += 2 * F * elt;      /* silu(g)*u recomputed */
    u->act_tok[MT_RECOMPUTE_SELECTIVE] += shared ? 0 : 2 * F * elt;
    if (shared) {
        u->f_rc_gemm += 4 * C * F;
        u->work_rc_tok += 2 * F * elt;
    }
    u->work_tok += 4 * F * elt;
    u->mem_tok += 3 * F * elt;
    u->tp_colls += 2;
}

/* The sandwich norm's two more norms per layer (docs/DESIGN.md): the sublayer outputs before
 * their norms and their 1/rms are kept (selective recomputes the attention's with h), and
 * the backward holds the gradient of a sublayer output. */
static void sandwich(double C, int elt, mt_unit_cost *u) {
    const double f4 = 4;
    u->p_rep += 2 * C;                                 /* pre_mlp and post_mlp norms */
    u->act_tok[MT_RECOMPUTE_KEEP_ALL] += 2 * C * elt + 2 * f4;
    u->act_tok[MT_RECOMPUTE_NONE] += 2 * C * elt + 2 * f4;
    u->act_tok[MT_RECOMPUTE_SELECTIVE] += C * elt + 2 * f4;
    u->work_rc_tok += C * elt;
    u->work_tok += C * elt;
    u->mem_tok += 4 * C * elt;                         /* two norms, read + write */
}

static void layer(const mt_config *c, int l, int T, int elt, mt_unit_cost *u) {
    const double C = c->hidden_size, f4 = 4;
    attention(c, T, elt, u);
    if (c->sandwich_norm) sandwich(C, elt, u);
    if (!mt_config_is_moe(c, l)) {
        u->kind = MT_UNIT_DENSE;
        swiglu(C, c->intermediate_size, elt, 0, u);
        if (u->gemm_width < 2 * C * c->intermediate_size) u->gemm_width = 2 * C * c->intermediate_size;
        return;
    }
    u->kind = MT_UNIT_MOE;
    u->moe = 1;
    const double E = c->n_routed_experts, K = c->num_experts_per_tok, Fm = c->moe_intermediate_size;
    const double Fs = (double)c->n_shared_experts * Fm;
    /* router: fp32 weights and scores, replicated */
    u->p_rep += E * C;
    u->p_active += E * C;
    u->f_gemm += 2 * C * E;
    u->p_expert += 3 * C * Fm * E;
    u->p_active += 3 * C * Fm * K;
    u->f_expert += 6 * C * Fm * K;
    /* kept per token: router probabilities (fp32); selected experts, their weights, slot
     * and permutation indices (4 x k int32/fp32); per (token, slot): expert gate|up */
    const double route = E * f4 + 4 * K * f4;
    u->act_tok[MT_RECOMPUTE_KEEP_ALL] += route;
    u->act_tok[MT_RECOMPUTE_NONE] += route;
    u->act_tok[MT_RECOMPUTE_SELECTIVE] += route;
    u->act_expert_tok[MT_RECOMPUTE_KEEP_ALL] += K * (3 * Fm + C) * elt; /* + silu(g)*u, gathered input */
    u->act_expert_tok[MT_RECOMPUTE_NONE] += K * 2 * Fm * elt;
    u->f_rc_expert += 4 * C * Fm * K;                         /* selective: gate|up again */
    u->work_tok += E * f4;
    u->work_expert_tok += K * (2 * C + 4 * Fm) * elt + 2 * K * f4;
    u->work_rc_expert_tok += K * 2 * Fm * elt;                /* selective's shared gate|up buffer */
    u->mem_tok += E * f4 * 2;
    u->mem_expert_tok += K * (4 * C + 3 * Fm) * elt;          /* permute, unpermute, SwiGLU */
    if (Fs > 0) swiglu(C, Fs, elt, 1, u);
}

int mt_cost_units(const mt_config *c, int T, int elt, mt_unit_cost *u) {
    const int L = c->num_hidden_layers, M = c->num_nextn_predict_layers, n = L + M + 2;
    if (!u) return n;
    const double C = c->hidden_size, V = c->vocab_size, f4 = 4;
    memset(u, 0, (size_t)n * sizeof *u);
    /* embedding: vocab-parallel lookup, its output reduce-scattered into the SP region */
    u[0].kind = MT_UNIT_EMBED;
    u[0].p_tp = V * C;
    u[0].tp_colls = 1;
    u[0].mem_tok = C * elt;
    for (int l = 0; l < L; l++) layer(c, l, T, elt, &u[1 + l]);
    /* MTP module k (DeepSeek-V3): norm(h), norm(embed(shifted tokens)), eh_proj [2C -> C],
     * one decoder layer (of the kind of the last layer), the shared head's norm and GEMM
     * (the head weights are the main model's). */
    for (int k = 0; k < M; k++) {
        mt_unit_cost *m = &u[1 + L + k];
        layer(c, L - 1, T, elt, m);
        m->kind = MT_UNIT_MTP;
        m->p_tp += 2 * C * C;
        m->p_rep += 3 * C;
        m->p_active += 2 * C * C + V * C;
        m->f_gemm += 4 * C * C + 2 * V * C;
        for (int r = 0; r < MT_RECOMPUTE_N; r++) m->act_tok[r] += 2 * C * elt + 2 * f4 + C * elt + f4;
        m->work_tok += V * f4;                 /* fp32 logits of its head */
        m->mem_tok += 6 * C * elt;
        m->tp_colls += 3;
    }
    mt_unit_cost *h = &u[n - 1];
    h->kind = MT_UNIT_HEAD;
    h->p_rep = C;                              /* final norm */
    h->p_tp = c->tie_word_embeddings ? 0 : V * C;
    h->p_active = V * C;
    h->f_gemm = 2 * V * C;
    h->gemm_width = 2 * V * C;
    for (int r = 0; r < MT_RECOMPUTE_N; r++) h->act_tok[r] = 2 * C * elt + f4; /* final x, its norm, 1/rms */
    h->work_tok = V * f4;                      /* fp32 logits (vocab-parallel cross-entropy) */
    h->mem_tok = 2 * C * elt + 3 * V * f4;     /* norm; softmax over the logits */
    h->tp_colls = 1;
    return n;
}

static double sum_units(const mt_config *c, int T, int mtp, int what) {
    int n = mt_cost_units(c, T, 4, NULL);
    mt_unit_cost *u = mt_xcalloc((size_t)n, sizeof *u);
    mt_cost_units(c, T, 4, u);
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (u[i].kind == MT_UNIT_MTP && !mtp) continue;
        switch (what) {
        case 0: s += u[i].p_tp + u[i].p_rep + u[i].p_expert; break;
        case 1: s += u[i].p_active; break;
        default: s += 6 * (u[i].f_gemm + u[i].f_expert) / 2 + 3 * u[i].f_att; break;
        }
    }
    free(u);
    return s;
}

double mt_cost_params(const mt_config *c) { return sum_units(c, 1, 0, 0); }
double mt_cost_params_mtp(const mt_config *c) { return sum_units(c, 1, 1, 0); }
double mt_cost_active_params(const mt_config *c) { return sum_units(c, 1, 0, 1); }
double mt_cost_flops_per_token(const mt_config *c, int T) { return sum_units(c, T, 0, 2); }
double mt_cost_model_flops_per_token(const mt_config *c, int T) { return sum_units(c, T, 1, 2); }

double mt_cost_trainer_acts_bytes(const mt_config *c, int lo, int hi, int last, const mt_acts_dims *d) {
    double b = (double)mt_acts_base_bytes(c, last, d) + (double)mt_acts_scratch_bytes(c, lo, hi, last, d);
    for (int l = lo; l < hi; l++) b += (double)mt_acts_layer_bytes(c, l, d);
    return b;
}
