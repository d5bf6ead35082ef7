/* tests/test_model_grad.c — finite-difference checks of the full model's gradient, tensor by
 * tensor (directional derivatives), for every routing method and scoring function, tied
 * embeddings, a dense-only model, ignored targets and the sandwich norm. Also checks that a forward gives the
 * same loss whatever the thread count and that grads accumulate across micro-batches like a
 * single batch. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "model/model.h"

static int failures = 0;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

static void base_config(mt_config *c) {
    mt_config_defaults(c);
    c->vocab_size = 37;
    c->hidden_size = 16;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 8;
    c->intermediate_size = 24;
    c->max_position_embeddings = 64;
    c->first_k_dense_replace = 1;
    c->n_routed_experts = 8;
    c->num_experts_per_tok = 2;
    c->n_shared_experts = 1;
    c->moe_intermediate_size = 12;
    c->aux_loss_alpha = 0.05;
    c->routed_scaling_factor = 1.0;
    c->norm_topk_prob = 1;
}

/* MLA attention (DeepSeek's shape, scaled down): query compression with rank ql, or none
 * (ql = 0); widths that differ from each other and from the GQA head_dim */
static void mla_config(mt_config *c, int ql) {
    base_config(c);
    snprintf(c->attention_type, sizeof c->attention_type, "mla");
    c->q_lora_rank = ql;
    c->kv_lora_rank = 12;
    c->qk_nope_head_dim = 6;
    c->qk_rope_head_dim = 4;
    c->v_head_dim = 5;
    c->head_dim = 4;
    c->num_key_value_heads = c->num_attention_heads;
    c->rope_interleave = 1;
}

enum { B = 2, T = 9 };

static double loss_of(mt_model *m, mt_acts *a, const int32_t *in, const int32_t *tg, float ce_scale, int train) {
    mt_step_stats st;
    float bal_scale = 1.0f / B;
    mt_model_step(m, a, in, tg, B, T, train, ce_scale, bal_scale, NULL, &st);
    double bal = 0, mtp = 0;
    for (int l = 0; l < mt_config_layers(&m->cfg); l++) bal += st.bal_sum[l];
    for (int k = 1; k <= m->cfg.num_nextn_predict_layers; k++) { /* each block's CE over its own targets */
        const int64_t nv = mt_mtp_valid(tg, B, T, k);
        if (nv) mtp += st.mtp_ce_sum[k - 1] / (double)nv / m->cfg.num_nextn_predict_layers;
    }
    return st.ce_sum * ce_scale + m->cfg.mtp_loss_weight * mtp + m->cfg.aux_loss_alpha * bal_scale * bal;
}

/* scope: the balance loss's (enum mt_aux_scope; one process: ep-group is the micro-batch's) */
static void check_config_scope(const char *what, const mt_config *c, int ignore_some, int scope) {
    mt_model m;
    if (mt_model_init(&m, c) != 0) { CHECK(0, "%s: init: %s", what, mt_last_error()); return; }
    m.aux_scope = scope;
    mt_model_init_weights(&m, 42, 0.2f);
    /* norms away from 1 so their gradients matter */
    for (int i = 0; i < m.ntensors; i++)
        if (m.tensors[i].ndim == 1)
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] = 1.0f + 0.3f * mt_normal(9, (uint64_t)i, j);
    mt_acts *a = mt_acts_new(c, B, T, mt_get_threads(), 0);
    int32_t in[B * T], tg[B * T];
    int nvalid = 0;
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(3, (uint64_t)i, 0, 0) % (uint64_t)c->vocab_size);
        tg[i] = (int32_t)(mt_hash4(4, (uint64_t)i, 0, 0) % (uint64_t)c->vocab_size);
        if (ignore_some && i % 4 == 1) tg[i] = -1;
        nvalid += tg[i] >= 0;
    }
    float ce_scale = 1.0f / (float)nvalid;
    mt_model_zero_grads(&m);
    double L0 = loss_of(&m, a, in, tg, ce_scale, 1);
    const uint64_t h0 = mt_acts_routing_hash(a, c);
    int skipped = 0;
    CHECK(isfinite(L0), "%s: loss not finite", what);
    float *grad = mt_alloc(m.nparams * sizeof(float));
    memcpy(grad, m.grads, m.nparams * sizeof(float));
    double worst = 0;
    const char *worst_name = "";
    int checked = 0;
    for (int i = 0; i < m.ntensors; i++) {
        const mt_tensor *t = &m.tensors[i];
        float *p = m.params + t->offset;
        /* direction v = g/rms(g) + N(0,1) on this tensor only: the g part gives the
         * difference quotient a large signal over float32 noise, the random part checks the
         * directions the gradient itself does not point to */
        float *v = mt_alloc(t->numel * sizeof(float));
        double gv = 0, gnorm = 0;
        for (size_t j = 0; j < t->numel; j++) gnorm += (double)grad[t->offset + j] * grad[t->offset + j];
        double grms = sqrt(gnorm / (double)t->numel);
        for (size_t j = 0; j < t->numel; j++) {
            v[j] = (grms > 0 ? (float)(grad[t->offset + j] / grms) : 0.0f) + mt_normal(77, (uint64_t)i, j);
            gv += (double)grad[t->offset + j] * v[j];
        }
        if (gnorm == 0) {  /* an expert no token reached has zero gradient: check the loss ignores it */
            mt_free(v);
            continue;
        }
        /* central difference; a step that flips a routing decision is not smooth: shrink it */
        float *saved = mt_alloc(t->numel * sizeof(float));
        memcpy(saved, p, t->numel * sizeof(float));
        double eps = fmin(4e-3, 2e-3 / fabs(gv)), fd = 0; /* loss moves by ~2e-3: linear regime */
        int smooth = 0;
        for (int tries = 0; tries < 4 && !smooth; tries++, eps /= 4) {
            double D[2];
            smooth = 1;
            for (int r = 0; r < 2; r++) {
                double e = r ? eps / 2 : eps;
                for (size_t j = 0; j < t->numel; j++) p[j] = saved[j] + (float)e * v[j];
                double Lp = loss_of(&m, a, in, tg, ce_scale, 0);
                smooth &= mt_acts_routing_hash(a, c) == h0;
                for (size_t j = 0; j < t->numel; j++) p[j] = saved[j] - (float)e * v[j];
                double Lm = loss_of(&m, a, in, tg, ce_scale, 0);
                smooth &= mt_acts_routing_hash(a, c) == h0;
                D[r] = (Lp - Lm) / (2 * e);
            }
            fd = (4 * D[1] - D[0]) / 3; /* Richardson: cancels the O(eps^2) term */
        }
        memcpy(p, saved, t->numel * sizeof(float));
        if (!smooth) { skipped++; mt_free(saved); mt_free(v); continue; }
        double err = fabs(fd - gv) / fmax(fabs(gv), 1e-2);
        if (err > worst) { worst = err; worst_name = t->name; }
        CHECK(err < 2e-2, "%s: %s: analytic %.6e vs numeric %.6e (rel err %.2e)", what, t->name, gv, fd, err);
        checked++;
        mt_free(saved);
        mt_free(v);
    }
    printf("%-28s loss %.5f, %d tensors checked (%d skipped: routing flips), worst rel err %.2e (%s)\n", what, L0,
           checked, skipped, worst, worst_name);
    CHECK(skipped * 4 <= checked, "%s: too many tensors skipped for routing flips (%d)", what, skipped);
    mt_free(grad);
    mt_acts_free(a);
    mt_model_free(&m);
}

static void check_config(const char *what, const mt_config *c, int ignore_some) {
    check_config_scope(what, c, ignore_some, MT_AUX_SEQUENCE);
}

/* The ep-group scope in one process: the balance over the micro-batch's tokens together, which
 * is not the mean of the sequences' balances; B times it (one value per sequence) in bal_sum. */
static void check_group_scope(void) {
    mt_config c;
    base_config(&c);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 21, 0.3f);
    mt_acts *a = mt_acts_new(&c, B, T, mt_get_threads(), 0);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(41, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
        tg[i] = (int32_t)(mt_hash4(42, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
    }
    mt_step_stats st;
    double seq[2] = {0, 0}, grp = 0, one[2] = {0, 0};
    mt_model_step(&m, a, in, tg, B, T, 0, 1.0f, 1.0f, NULL, &st);
    for (int l = 0; l < c.num_hidden_layers; l++) seq[0] += st.bal_sum[l];
    m.aux_scope = MT_AUX_EP_GROUP;
    mt_model_step(&m, a, in, tg, B, T, 0, 1.0f, 1.0f, NULL, &st);
    for (int l = 0; l < c.num_hidden_layers; l++) grp += st.bal_sum[l];
    /* each sequence alone is a group of its own: the sequence scope's values */
    for (int b = 0; b < B; b++) {
        mt_model_step(&m, a, in + b * T, tg + b * T, 1, T, 0, 1.0f, 1.0f, NULL, &st);
        for (int l = 0; l < c.num_hidden_layers; l++) one[b] += st.bal_sum[l];
    }
    seq[1] = one[0] + one[1];
    printf("%-28s sequence %.6f, ep-group %.6f (per-sequence groups: %.6f)\n", "balance scope", seq[0] / B, grp / B,
           seq[1] / B);
    CHECK(fabs(seq[1] - seq[0]) <= 1e-6 * fabs(seq[0]), "one-sequence groups differ from the sequence scope");
    CHECK(fabs(grp - seq[0]) > 1e-4 * fabs(seq[0]), "the ep-group scope gave the sequence scope's balance");
    mt_acts_free(a);
    mt_model_free(&m);
}

/* micro-batch accumulation: two micro-batches of B/2 accumulate the gradient of one batch of B */
static void check_accumulation(void) {
    mt_config c;
    base_config(&c);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 5, 0.3f);
    mt_acts *a = mt_acts_new(&c, B, T, mt_get_threads(), 0);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(13, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
        tg[i] = (int32_t)(mt_hash4(14, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
    }
    mt_step_stats st;
    mt_model_zero_grads(&m);
    mt_model_step(&m, a, in, tg, B, T, 1, 1.0f / (B * T), 1.0f / B, NULL, &st);
    float *g1 = mt_alloc(m.nparams * sizeof(float));
    memcpy(g1, m.grads, m.nparams * sizeof(float));
    mt_model_zero_grads(&m);
    for (int mb = 0; mb < B; mb++)
        mt_model_step(&m, a, in + mb * T, tg + mb * T, 1, T, 1, 1.0f / (B * T), 1.0f / B, NULL, &st);
    double num = 0, den = 0;
    for (size_t i = 0; i < m.nparams; i++) {
        num += ((double)g1[i] - m.grads[i]) * ((double)g1[i] - m.grads[i]);
        den += (double)g1[i] * g1[i];
    }
    double rel = sqrt(num / den);
    printf("%-28s rel diff %.2e\n", "accumulation 1x2 vs 2x1", rel);
    CHECK(rel < 1e-5, "gradient accumulation differs from one batch: %.3e", rel);
    /* thread-count independence of the forward */
    mt_set_threads(1);
    double l1 = loss_of(&m, a, in, tg, 1.0f / (B * T), 0);
    mt_set_threads(2);
    double l2 = loss_of(&m, a, in, tg, 1.0f / (B * T), 0);
    printf("%-28s 1 thread %.9f, 2 threads %.9f\n", "thread count", l1, l2);
    CHECK(fabs(l1 - l2) <= 1e-6 * fabs(l1), "loss depends on thread count: %.9f vs %.9f", l1, l2);
    mt_free(g1);
    mt_acts_free(a);
    mt_model_free(&m);
}

/* routing selection rules, including ties */
static void check_routing(void) {
    mt_config c;
    base_config(&c);
    int sel[8];
    float p[8] = {0.1f, 0.3f, 0.3f, 0.05f, 0.05f, 0.1f, 0.05f, 0.05f};
    c.topk_method = MT_TOPK_GREEDY;
    mt_route_select(&c, p, sel);
    CHECK(sel[0] == 1 && sel[1] == 2, "greedy tie: got %d %d", sel[0], sel[1]);
    /* group_limited: 4 groups of 2, keep 2 groups by max: groups 0 (0.3), 1 (0.3) */
    float q[8] = {0.01f, 0.2f, 0.3f, 0.02f, 0.25f, 0.25f, 0.1f, 0.05f};
    c.n_group = 4; c.topk_group = 2; c.topk_method = MT_TOPK_GROUP_LIMITED;
    mt_route_select(&c, q, sel);
    /* group maxima: g0 .2, g1 .3, g2 .25, g3 .1 -> keep g1, g2 -> experts 2 (.3), 4 (.25, tie with 5 -> lower) */
    CHECK(sel[0] == 2 && sel[1] == 4, "group_limited: got %d %d", sel[0], sel[1]);
    c.n_group = 2; c.topk_method = MT_TOPK_MOGE;
    mt_route_select(&c, q, sel);
    /* moge: 1 per group of 4: g0 -> 2 (.3), g1 -> 4 (.25 tie 5 -> lower) */
    CHECK((sel[0] == 2 && sel[1] == 4), "moge: got %d %d", sel[0], sel[1]);
}

/* Selective recompute gives the same bits as keeping everything, with less memory. */
static void check_recompute(int sandwich, int mla) {
    mt_config c;
    if (mla) mla_config(&c, mla == 2 ? 0 : 10); /* 2: no query compression (q rebuilt from the input) */
    else base_config(&c);
    c.num_nextn_predict_layers = mla == 2; /* and an MTP block, whose layer recomputes as the others */
    c.sandwich_norm = sandwich;
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 11, 0.3f);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(31, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
        tg[i] = (int32_t)(mt_hash4(32, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
    }
    float *g0 = mt_alloc(m.nparams * sizeof(float));
    double loss[2];
    for (int pol = 0; pol < 2; pol++) {
        mt_acts *a = mt_acts_new_policy(&c, B, T, mt_get_threads(), pol, 0);
        mt_model_zero_grads(&m);
        loss[pol] = loss_of(&m, a, in, tg, 1.0f / (B * T), 1);
        if (pol == 0) memcpy(g0, m.grads, m.nparams * sizeof(float));
        mt_acts_free(a);
    }
    size_t diff = 0;
    for (size_t i = 0; i < m.nparams; i++) diff += memcmp(&g0[i], &m.grads[i], sizeof(float)) != 0;
    size_t b0 = mt_acts_bytes_policy(&c, 8, 64, 2, MT_RECOMPUTE_NONE, 0);
    size_t b1 = mt_acts_bytes_policy(&c, 8, 64, 2, MT_RECOMPUTE_SELECTIVE, 0);
    printf("%-28s loss %.9f vs %.9f, %zu gradient values differ, activations %zu -> %zu bytes\n",
           mla == 2 ? "selective recompute (MLA, no q_lora, MTP)"
           : mla ? (sandwich ? "selective recompute (MLA, sandwich)" : "selective recompute (MLA)")
               : sandwich ? "selective recompute, sandwich" : "selective recompute",
           loss[0], loss[1], diff, b0, b1);
    CHECK(loss[0] == loss[1] && diff == 0, "selective recompute changed the results");
    CHECK(b1 < b0, "selective recompute does not save memory");
    mt_free(g0);
    mt_model_free(&m);
}

/* A shuffled expert placement: the same weights by name (init keyed by the tensor's index
 * in the whole model), the experts in another order in the buffer; the loss and every
 * tensor's gradient have the same bits (one process: the combine sums a token's slots in
 * routing order whatever the placement). bf16 too when the CPU has it. */
static void check_placement(void) {
    mt_config c;
    base_config(&c);
    c.n_routed_experts = 8;
    mt_expert_map map;
    CHECK(mt_expert_map_parse(&map, &c, "shuffled:3") == 0, "parse: %s", mt_last_error());
    int moved = 0;
    for (int i = 0; i < c.num_hidden_layers * c.n_routed_experts; i++) moved += map.slot_of[i] != i % c.n_routed_experts;
    CHECK(moved > 0, "shuffled:3 left every expert in place");
    mt_expert_map bad;
    CHECK(mt_expert_map_parse(&bad, &c, "shuffled:x") != 0 && mt_expert_map_parse(&bad, &c, "striped") != 0,
          "bad placements accepted");
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(41, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
        tg[i] = (int32_t)(mt_hash4(42, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
    }
    for (int bf = 0; bf < 1 + mt_bf16_supported(); bf++) {
        mt_model m[2];
        double loss[2];
        for (int v = 0; v < 2; v++) {
            mt_part sh;
            mt_part_whole(&sh, &c);
            sh.slot_of = v ? map.slot_of : NULL;
            MT_ASSERT(mt_model_init_part(&m[v], &c, &sh, NULL, NULL) == 0);
            mt_model_init_weights(&m[v], 13, 0.3f);
            mt_acts *a = mt_acts_new(&c, B, T, mt_get_threads(), bf);
            mt_model_zero_grads(&m[v]);
            loss[v] = loss_of(&m[v], a, in, tg, 1.0f / (B * T), 1);
            mt_acts_free(a);
        }
        int moved_t = 0, differ = 0;
        for (int i = 0; i < m[0].ntensors; i++) {
            const mt_tensor *t0 = &m[0].tensors[i], *t1 = mt_model_find(&m[1], t0->name);
            MT_ASSERT(t1);
            moved_t += t1->offset != t0->offset;
            differ += memcmp(m[0].params + t0->offset, m[1].params + t1->offset, t0->numel * sizeof(float)) != 0 ||
                      memcmp(m[0].grads + t0->offset, m[1].grads + t1->offset, t0->numel * sizeof(float)) != 0;
        }
        printf("%-28s loss %.9f vs %.9f, %d tensors moved, %d differ (%s)\n", "shuffled expert placement",
               loss[0], loss[1], moved_t, differ, bf ? "bf16" : "fp32");
        CHECK(loss[0] == loss[1] && differ == 0 && moved_t > 0, "the placement changed the results");
        mt_model_free(&m[0]);
        mt_model_free(&m[1]);
    }
    mt_expert_map_free(&map);
}

/* Document mode: a packed row gives the same logits and gradients as its documents run
 * one by one as separate rows (balance loss off: it is defined per row). */
static void check_doc_mode(int mla) {
    mt_config c;
    if (mla) mla_config(&c, 0);
    else base_config(&c);
    c.aux_loss_alpha = 0.0;
    const int32_t EOT = 36;
    enum { TP = 13 };
    int32_t in[TP], tg[TP], pos[TP];
    for (int i = 0; i < TP; i++) {
        in[i] = (int32_t)(mt_hash4(21, (uint64_t)i, 0, 0) % 30);
        tg[i] = (int32_t)(mt_hash4(22, (uint64_t)i, 0, 0) % 30);
    }
    in[0] = in[4] = in[7] = EOT; /* documents [0], [1..4], [5..7], [8..12] */
    mt_doc_positions(in, 1, TP, EOT, pos);
    const int expect[TP] = {0, 0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4};
    for (int i = 0; i < TP; i++) CHECK(pos[i] == expect[i], "doc position %d: %d, want %d", i, pos[i], expect[i]);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 8, 0.3f);
    mt_acts *a = mt_acts_new(&c, 1, TP, mt_get_threads(), 0);
    float *lp = mt_alloc(sizeof(float) * TP * c.vocab_size), *ls = mt_alloc(sizeof(float) * TP * c.vocab_size);
    mt_step_stats st;
    float scale = 1.0f / TP;
    mt_model_zero_grads(&m);
    mt_model_step_pos(&m, a, in, tg, pos, 1, TP, 1, scale, 1.0f, lp, &st);
    double packed_ce = st.ce_sum;
    float *gp = mt_alloc(m.nparams * sizeof(float));
    memcpy(gp, m.grads, m.nparams * sizeof(float));
    mt_model_zero_grads(&m);
    const int starts[] = {0, 1, 5, 8, TP};
    double sep_ce = 0;
    for (int d = 0; d < 4; d++) {
        int s0 = starts[d], len = starts[d + 1] - s0;
        mt_model_step(&m, a, in + s0, tg + s0, 1, len, 1, scale, 1.0f, ls + (size_t)s0 * c.vocab_size, &st);
        sep_ce += st.ce_sum;
    }
    double num = 0, den = 0;
    for (int i = 0; i < TP * c.vocab_size; i++) { num += (double)(lp[i] - ls[i]) * (lp[i] - ls[i]); den += (double)ls[i] * ls[i]; }
    double gnum = 0, gden = 0;
    for (size_t i = 0; i < m.nparams; i++) { gnum += (double)(gp[i] - m.grads[i]) * (gp[i] - m.grads[i]); gden += (double)m.grads[i] * m.grads[i]; }
    printf("%-28s logits rel err %.2e, ce %.6f vs %.6f, grad rel err %.2e\n",
           mla ? "document mode (MLA)" : "document mode packed=split",
           sqrt(num / den), packed_ce, sep_ce, sqrt(gnum / gden));
    CHECK(sqrt(num / den) < 1e-5, "document mode logits differ from separate documents: %.3e", sqrt(num / den));
    CHECK(fabs(packed_ce - sep_ce) <= 1e-5 * fabs(sep_ce), "document mode loss differs: %.8f vs %.8f", packed_ce, sep_ce);
    CHECK(sqrt(gnum / gden) < 1e-5, "document mode gradients differ: %.3e", sqrt(gnum / gden));
    mt_free(gp);
    mt_free(lp);
    mt_free(ls);
    mt_acts_free(a);
    mt_model_free(&m);
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv); /* the OpenBLAS kernel the product runs (moetrain sets it at start-up) */
    mt_set_threads(2);
    check_routing();
    mt_config c;
    base_config(&c);
    check_config("softmax greedy", &c, 0);
    base_config(&c); c.scoring_func = MT_SCORING_SIGMOID;
    check_config("sigmoid greedy", &c, 0);
    base_config(&c); c.n_group = 4; c.topk_group = 2; c.topk_method = MT_TOPK_GROUP_LIMITED;
    check_config("softmax group_limited", &c, 0);
    base_config(&c); c.n_group = 2; c.topk_method = MT_TOPK_MOGE; c.scoring_func = MT_SCORING_SIGMOID;
    check_config("sigmoid moge", &c, 0);
    base_config(&c); c.n_group = 2; c.topk_method = MT_TOPK_MOGE;
    check_config("softmax moge", &c, 0);
    base_config(&c); c.norm_topk_prob = 0; c.routed_scaling_factor = 2.5; c.n_shared_experts = 0;
    check_config("no norm, scale 2.5, no shared", &c, 0);
    base_config(&c); c.tie_word_embeddings = 1; c.num_key_value_heads = 4;
    check_config("tied embeddings, MHA", &c, 1);
    base_config(&c); c.n_routed_experts = 0; c.num_experts_per_tok = 0; c.first_k_dense_replace = 3;
    check_config("dense only, ignored targets", &c, 1);
    /* the sandwich norm: its four norms per layer in every routing family, dense and tied */
    base_config(&c); c.sandwich_norm = 1;
    check_config("sandwich, softmax greedy", &c, 0);
    base_config(&c); c.sandwich_norm = 1; c.n_group = 2; c.topk_method = MT_TOPK_MOGE;
    c.scoring_func = MT_SCORING_SIGMOID; c.n_shared_experts = 0;
    check_config("sandwich, sigmoid moge", &c, 0);
    base_config(&c); c.sandwich_norm = 1; c.n_routed_experts = 0; c.num_experts_per_tok = 0;
    c.first_k_dense_replace = 3; c.tie_word_embeddings = 1; c.rope_interleave = 1;
    check_config("sandwich, dense, tied, rope2", &c, 1);
    /* the balance loss over the micro-batch's tokens (--aux-scope ep-group in one process) */
    base_config(&c);
    check_config_scope("ep-group scope, softmax", &c, 0, MT_AUX_EP_GROUP);
    base_config(&c); c.scoring_func = MT_SCORING_SIGMOID; c.sandwich_norm = 1;
    check_config_scope("ep-group scope, sigmoid, sw", &c, 0, MT_AUX_EP_GROUP);
    check_group_scope();
    mla_config(&c, 10);
    check_config("MLA, q_lora", &c, 0);
    mla_config(&c, 0); c.rope_interleave = 0; c.scoring_func = MT_SCORING_SIGMOID;
    check_config("MLA, no q_lora, rotate-half", &c, 1);
    mla_config(&c, 10); c.tie_word_embeddings = 1; c.n_routed_experts = 0; c.num_experts_per_tok = 0;
    c.first_k_dense_replace = 3;
    check_config("MLA, dense, tied", &c, 0);
    mla_config(&c, 10); c.qk_nope_head_dim = 0;
    check_config("MLA, no nope dimensions", &c, 0);
    mla_config(&c, 10); c.sandwich_norm = 1; /* Pangu's block: MLA under the sandwich norm */
    check_config("MLA, sandwich", &c, 0);
    /* multi-token prediction: D = 1 and 2, with MoE or dense blocks, MLA, the sandwich norm,
     * tied embeddings and ignored targets */
    base_config(&c); c.num_nextn_predict_layers = 1;
    check_config("MTP 1", &c, 0);
    base_config(&c); c.num_nextn_predict_layers = 2; c.mtp_loss_weight = 0.7; c.scoring_func = MT_SCORING_SIGMOID;
    check_config("MTP 2, sigmoid, ignored", &c, 1);
    base_config(&c); c.num_nextn_predict_layers = 1; c.n_routed_experts = 0; c.num_experts_per_tok = 0;
    c.first_k_dense_replace = 3; c.tie_word_embeddings = 1;
    check_config("MTP 1, dense, tied", &c, 0);
    mla_config(&c, 10); c.sandwich_norm = 1; c.num_nextn_predict_layers = 2;
    check_config("MTP 2, MLA, sandwich", &c, 0);
    check_accumulation();
    check_doc_mode(0);
    check_doc_mode(1);
    check_recompute(0, 0);
    check_recompute(1, 0);
    check_recompute(0, 1);
    check_recompute(1, 1);
    check_recompute(0, 2);
    check_placement();
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("all model gradient checks passed\n");
    return 0;
}
