/* tests/test_grpo.c — the GRPO loss (rl/grpo.h, docs/FORMATS.md section 8) as the trainer's head
 * objective on a tiny MoE model, driven micro-batch by micro-batch as the trainer drives the
 * model (obj.base = mb*B*T, fed rows, bal_scale = 1 / rows with fed > 0):
 *   - on-policy (logp_old recorded with the weights that are trained): ratio is exactly 1,
 *     nothing clips, and the loss is -sum_t agg_t w_t A_i computed here from the completions
 *     (agg_t from the aggregation's definition, w_t = min(exp(logp_old - logp_behav), is_cap)),
 *     for the three aggregations; the token count and max |logp_old - logp_behav| of
 *     mt_grpo_stats; recording logp_old twice gives the same bits;
 *   - off-policy (weights perturbed after logp_old was recorded, some tokens clipped,
 *     0 < clip fraction < 1, some importance weights capped): finite-difference directional
 *     derivatives of loss + aux_loss_alpha * bal_scale * balance (phase-1 forward, logp_old
 *     fixed) against <grads, v>, tensor by tensor, for token-mean, seq-mean-token-mean and
 *     seq-mean-token-sum-norm, at tau 1 and 0.7, and with the k3 KL to a reference
 *     (beta 0.1, logp_ref recorded in phase 2 under other weights; also checked by hand
 *     on-policy);
 *   - padding rows (fed 0) and padded positions change neither the loss nor the gradients;
 *   - batch_init refuses completions that do not fit; agg names parse. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "model/model.h"
#include "tinymoe.h"
#include "rl/grpo.h"

static int failures = 0;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

enum { NSEQ = 6, MAXNEW = 6, MAXP = 6 };
#ifndef PERTURB
#define PERTURB 0.01f
#endif

static void config(mt_config *c) { tiny_moe_config(c, 0.05); } /* large enough that the balance gradient matters */

/* the completions: two groups of 3, advantages of both signs and one 0 */
static int32_t prompt[NSEQ][MAXP], comp[NSEQ][MAXNEW];
static float behav[NSEQ][MAXNEW];
static mt_grpo_seq seqs[NSEQ];
static const float advs[NSEQ] = {1.1547f, -0.5774f, -0.5774f, 0.8f, 0.0f, -1.3f};
static const int plens[NSEQ] = {3, 1, 5, 2, 4, 6};
static const int ns[NSEQ] = {4, 6, 1, 3, 5, 2};
static int Tmin; /* the longest row */

static void make_seqs(int V) {
    Tmin = 0;
    for (int i = 0; i < NSEQ; i++) {
        for (int j = 0; j < plens[i]; j++) prompt[i][j] = (int32_t)(mt_hash4(5, (uint64_t)i, (uint64_t)j, 0) % (uint64_t)V);
        for (int k = 0; k < ns[i]; k++) {
            comp[i][k] = (int32_t)(mt_hash4(6, (uint64_t)i, (uint64_t)k, 0) % (uint64_t)V);
            behav[i][k] = 0.0f;
        }
        seqs[i] = (mt_grpo_seq){.prompt = prompt[i], .plen = plens[i], .tokens = comp[i], .logp_behav = behav[i],
                                .n = ns[i], .adv = advs[i]};
        if (plens[i] + ns[i] - 1 > Tmin) Tmin = plens[i] + ns[i] - 1;
    }
}

static int64_t total_tokens(void) {
    int64_t t = 0;
    for (int i = 0; i < NSEQ; i++) t += ns[i];
    return t;
}

/* The trainer's pass over a batch: every micro-batch forward (and with train its backward,
 * into m->grads, which the caller zeroes); returns the objective's loss (mt_grpo_stats [0])
 * plus aux_loss_alpha * bal_scale * the balance terms (in phase 0: the balance part only).
 * *hash gets the routing decisions and the clipped flags (a finite difference across a
 * routing flip or a clip boundary is not a derivative). */
static double pass(mt_model *m, mt_acts *a, mt_grpo_batch *g, int train, uint64_t *hash, double *stats) {
    const int B = g->B, T = g->T;
    const size_t BT = (size_t)B * T;
    int rows = 0;
    for (int i = 0; i < g->n_micro * B; i++) rows += g->fed[i] > 0;
    const float bal_scale = rows ? 1.0f / (float)rows : 0.0f;
    double bal = 0;
    uint64_t h = 0;
    for (int mb = 0; mb < g->n_micro; mb++) {
        mt_head_obj obj = g->obj;
        obj.base = (int64_t)mb * (int64_t)BT;
        const mt_loss lo = {.ce_scale = 0.0f, .obj = &obj, .fed = g->fed + (size_t)mb * B};
        mt_step_stats st;
        memset(&st, 0, sizeof st);
        mt_model_forward(m, a, g->in + mb * BT, g->tg + mb * BT, NULL, B, T, train, &lo, NULL, &st);
        if (train) mt_model_backward(m, a, g->in + mb * BT, NULL, B, T, bal_scale);
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) bal += st.bal_sum[l];
        h = mt_hash4(h, mt_acts_routing_hash(a, &m->cfg), (uint64_t)mb, 1);
    }
    double s[MT_GRPO_NSTAT];
    mt_grpo_stats(g, s);
    if (stats) memcpy(stats, s, sizeof s);
    const size_t NT = (size_t)g->n_micro * BT;
    for (size_t i = 0; i < NT; i++)
        if (g->tg[i] >= 0) h = mt_hash4(h, i, g->clipped[i], 2);
    if (hash) *hash = h;
    return (g->phase == 1 ? s[0] : 0.0) + m->cfg.aux_loss_alpha * (double)bal_scale * bal;
}

/* A batch for L with behaviour log-probs near logp_old under the current weights:
 * logp_behav = logp_old + delta, delta in [-0.3, 0.3], and one token 2.5 above logp_old
 * (w = exp(2.5) > is_cap: capped); then logp_old recorded again (phase 0). */
static void make_batch(mt_model *m, mt_acts *a, mt_grpo_batch *g, const mt_grpo_loss *L, int n_micro, int B, int T) {
    MT_ASSERT(mt_grpo_batch_init(g, L, seqs, NSEQ, n_micro, B, T, total_tokens(), NSEQ, 0) == 0);
    g->phase = 0;
    pass(m, a, g, 0, NULL, NULL);
    for (int i = 0; i < NSEQ; i++)
        for (int k = 0; k < ns[i]; k++) {
            const float old = g->old[(size_t)i * T + (size_t)(plens[i] - 1 + k)];
            float d = 0.6f * mt_u01(mt_hash4(9, (uint64_t)i, (uint64_t)k, 0)) - 0.3f;
            if (i == 1 && k == 2) d = -2.5f;
            behav[i][k] = old + d;
        }
    float *old0 = mt_xmalloc(sizeof(float) * (size_t)n_micro * B * T);
    memcpy(old0, g->old, sizeof(float) * (size_t)n_micro * B * T);
    mt_grpo_batch_free(g);
    MT_ASSERT(mt_grpo_batch_init(g, L, seqs, NSEQ, n_micro, B, T, total_tokens(), NSEQ, 0) == 0);
    g->phase = 0;
    pass(m, a, g, 0, NULL, NULL);
    int same = 1;
    for (int i = 0; i < NSEQ; i++)
        for (int k = 0; k < ns[i]; k++) {
            const size_t at = (size_t)i * T + (size_t)(plens[i] - 1 + k);
            same &= memcmp(&g->old[at], &old0[at], sizeof(float)) == 0;
        }
    CHECK(same, "recording logp_old twice with the same weights gave different bits");
    free(old0);
}

/* logp_ref (phase 2) under a frozen reference: the current weights moved by another
 * perturbation, then put back */
static void perturb(mt_model *m, uint64_t seed, float scale);
static void record_ref(mt_model *m, mt_acts *a, mt_grpo_batch *g) {
    float *keep = mt_xmalloc(sizeof(float) * m->nparams);
    memcpy(keep, m->params, sizeof(float) * m->nparams);
    perturb(m, 31, PERTURB);
    g->phase = 2;
    pass(m, a, g, 0, NULL, NULL);
    memcpy(m->params, keep, sizeof(float) * m->nparams);
    free(keep);
}

static double agg_weight(const mt_grpo_loss *L, int i) {
    if (L->agg == MT_AGG_TOKEN_MEAN) return 1.0 / (double)total_tokens();
    if (L->agg == MT_AGG_SEQ_MEAN_TOKEN_MEAN) return 1.0 / ((double)ns[i] * NSEQ);
    return 1.0 / ((double)L->max_new * NSEQ);
}

static void loss_params(mt_grpo_loss *L, int agg, double tau) {
    mt_grpo_loss_defaults(L);
    L->agg = agg;
    L->temperature = tau;
    L->max_new = MAXNEW + 2; /* the rollout's max_new, not the longest completion */
}

/* on-policy: ratio 1, loss = -sum agg w A by hand */
static void check_on_policy(mt_model *m, mt_acts *a, int agg, double tau, double beta) {
    mt_grpo_loss L;
    loss_params(&L, agg, tau);
    L.beta = beta;
    mt_grpo_batch g;
    make_batch(m, a, &g, &L, 2, 3, Tmin);
    if (beta > 0) record_ref(m, a, &g);
    g.phase = 1;
    double s[MT_GRPO_NSTAT];
    mt_model_zero_grads(m);
    pass(m, a, &g, 1, NULL, s);
    double want = 0, want_kl = 0, maxdev = 0;
    int capped = 0;
    for (int i = 0; i < NSEQ; i++)
        for (int k = 0; k < ns[i]; k++) {
            const size_t at = (size_t)i * g.T + (size_t)(plens[i] - 1 + k);
            const double old = g.old[at], dr = (double)g.ref[at] - old;
            double w = exp(old - behav[i][k]);
            if (w > L.is_cap) w = L.is_cap, capped++;
            const double kl = beta > 0 ? exp(dr) - dr - 1 : 0.0;
            want += agg_weight(&L, i) * (-w * advs[i] + beta * kl);
            want_kl += agg_weight(&L, i) * kl;
            if (fabs(old - behav[i][k]) > maxdev) maxdev = fabs(old - behav[i][k]);
        }
    printf("on-policy %-24s tau %.1f beta %.2f: loss %+.8f, by hand %+.8f (kl %.3e), sum |ratio-1| %g, clipped %g, "
           "%d capped\n", mt_grpo_agg_name(agg), tau, beta, s[0], want, want_kl, s[3], s[2], capped);
    CHECK(s[3] == 0.0, "%s: on-policy sum |ratio - 1| = %g, want exactly 0", mt_grpo_agg_name(agg), s[3]);
    CHECK(s[2] == 0.0, "%s: on-policy %g tokens clipped", mt_grpo_agg_name(agg), s[2]);
    CHECK(fabs(s[0] - want) <= 1e-6 * fabs(want) + 1e-9, "%s: loss %.9f, by hand %.9f", mt_grpo_agg_name(agg), s[0],
          want);
    CHECK(fabs(s[1] + beta * s[6] - s[0]) <= 1e-12 * fabs(s[0]), "pg part %.9f + beta x kl %.9f != loss %.9f", s[1],
          s[6], s[0]);
    CHECK(fabs(s[6] - want_kl) <= 1e-6 * want_kl + 1e-12, "kl part %.9g, by hand %.9g", s[6], want_kl);
    CHECK((beta > 0) == (want_kl > 0), "beta %g but kl %g", beta, want_kl);
    CHECK(s[4] == (double)total_tokens(), "completion tokens %g, want %lld", s[4], (long long)total_tokens());
    CHECK(fabs(s[5] - maxdev) <= 1e-6, "max |old - behav| %g, want %g", s[5], maxdev);
    CHECK(capped == 1, "the test meant one capped importance weight, got %d", capped);
    mt_grpo_batch_free(&g);
}

/* adds scale * N(0,1) to every parameter (the step's weights move off the recorded policy) */
static void perturb(mt_model *m, uint64_t seed, float scale) {
    for (size_t j = 0; j < m->nparams; j++) m->params[j] += scale * mt_normal(seed, 0, j);
}

/* the finite-difference check of the phase-1 loss along random directions, tensor by tensor */
static void check_fd(mt_model *m, mt_acts *a, int agg, double tau, double beta) {
    mt_grpo_loss L;
    loss_params(&L, agg, tau);
    L.beta = beta;
    L.eps_low = L.eps_high = 0.1;
    const char *what = mt_grpo_agg_name(agg);
    float *saved_all = mt_xmalloc(sizeof(float) * m->nparams);
    memcpy(saved_all, m->params, sizeof(float) * m->nparams);
    mt_grpo_batch g;
    make_batch(m, a, &g, &L, 2, 3, Tmin);
    if (beta > 0) record_ref(m, a, &g);
    perturb(m, 17, PERTURB);
    g.phase = 1;
    mt_model_zero_grads(m);
    double s[MT_GRPO_NSTAT];
    uint64_t h0;
    const double L0 = pass(m, a, &g, 1, &h0, s);
    const double cf = s[2] / s[4];
    CHECK(cf > 0 && cf < 1, "%s: clip fraction %.3f: the check needs some clipped tokens and some not", what, cf);
    CHECK(s[3] > 0, "%s: off-policy but ratio 1 everywhere", what);
    CHECK((beta > 0) == (s[6] > 0), "%s: beta %g, kl part %g", what, beta, s[6]);
    CHECK(isfinite(L0), "%s: loss not finite", what);
    float *grad = mt_xmalloc(sizeof(float) * m->nparams);
    memcpy(grad, m->grads, sizeof(float) * m->nparams);
    double worst = 0;
    const char *worst_name = "";
    int checked = 0, skipped = 0, zero = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        float *v = mt_xmalloc(sizeof(float) * t->numel);
        double gv = 0, gnorm = 0;
        for (size_t j = 0; j < t->numel; j++) gnorm += (double)grad[t->offset + j] * grad[t->offset + j];
        if (gnorm == 0) { zero++; free(v); continue; } /* an expert no fed token reached */
        const double grms = sqrt(gnorm / (double)t->numel);
        for (size_t j = 0; j < t->numel; j++) {
            v[j] = (float)(grad[t->offset + j] / grms) + mt_normal(78, (uint64_t)i, j);
            gv += (double)grad[t->offset + j] * v[j];
        }
        float *saved = mt_xmalloc(sizeof(float) * t->numel);
        memcpy(saved, p, sizeof(float) * t->numel);
        double eps = fmin(4e-3, 2e-3 / fabs(gv)), fd = 0;
        int smooth = 0;
        for (int tries = 0; tries < 4 && !smooth; tries++, eps /= 4) {
            double D[2];
            smooth = 1;
            for (int r = 0; r < 2; r++) {
                const double e = r ? eps / 2 : eps;
                uint64_t h;
                for (size_t j = 0; j < t->numel; j++) p[j] = saved[j] + (float)e * v[j];
                const double Lp = pass(m, a, &g, 0, &h, NULL);
                smooth &= h == h0;
                for (size_t j = 0; j < t->numel; j++) p[j] = saved[j] - (float)e * v[j];
                const double Lm = pass(m, a, &g, 0, &h, NULL);
                smooth &= h == h0;
                D[r] = (Lp - Lm) / (2 * e);
            }
            fd = (4 * D[1] - D[0]) / 3;
        }
        memcpy(p, saved, sizeof(float) * t->numel);
        free(saved);
        free(v);
        if (!smooth) { skipped++; continue; }
        const double err = fabs(fd - gv) / fmax(fabs(gv), 1e-2);
        if (err > worst) worst = err, worst_name = t->name;
        CHECK(err < 2e-2, "%s tau %.1f: %s: analytic %.6e vs numeric %.6e (rel err %.2e)", what, tau, t->name, gv, fd,
              err);
        checked++;
    }
    printf("off-policy %-23s tau %.1f beta %.2f: loss %+.6f, clip fraction %.3f, mean |ratio-1| %.3f, kl %.2e, %d "
           "tensors checked (%d skipped: routing flip or clip boundary, %d zero), worst rel err %.2e (%s)\n",
           what, tau, beta, L0, cf, s[3] / s[4], s[6], checked, skipped, zero, worst, worst_name);
    CHECK(skipped * 4 <= checked, "%s: too many tensors skipped (%d)", what, skipped);
    CHECK(checked > m->ntensors / 2, "%s: only %d of %d tensors checked", what, checked, m->ntensors);
    free(grad);
    mt_grpo_batch_free(&g);
    memcpy(m->params, saved_all, sizeof(float) * m->nparams);
    free(saved_all);
}

/* the same completions with padding rows (fed 0) and padded positions: same loss and grads */
static void check_padding(mt_model *m, int agg) {
    mt_grpo_loss L;
    loss_params(&L, agg, 0.7);
    L.eps_low = L.eps_high = 0.1;
    float *saved_all = mt_xmalloc(sizeof(float) * m->nparams);
    memcpy(saved_all, m->params, sizeof(float) * m->nparams);
    const int shapes[2][3] = {{1, NSEQ, 0}, {3, 4, 5}}; /* n_micro, B, extra positions */
    double loss[2], st[2][MT_GRPO_NSTAT];
    float *gr[2];
    for (int v = 0; v < 2; v++) {
        memcpy(m->params, saved_all, sizeof(float) * m->nparams);
        const int nm = shapes[v][0], B = shapes[v][1], T = Tmin + shapes[v][2];
        mt_acts *a = mt_acts_new(&m->cfg, B, T, mt_get_threads(), 0);
        mt_grpo_batch g;
        make_batch(m, a, &g, &L, nm, B, T);
        perturb(m, 17, PERTURB);
        g.phase = 1;
        mt_model_zero_grads(m);
        loss[v] = pass(m, a, &g, 1, NULL, st[v]);
        gr[v] = mt_xmalloc(sizeof(float) * m->nparams);
        memcpy(gr[v], m->grads, sizeof(float) * m->nparams);
        int pad_rows = 0;
        for (int r = 0; r < nm * B; r++) pad_rows += g.fed[r] == 0;
        CHECK(pad_rows == nm * B - NSEQ, "%d padding rows, want %d", pad_rows, nm * B - NSEQ);
        mt_grpo_batch_free(&g);
        mt_acts_free(a);
    }
    double num = 0, den = 0;
    for (size_t j = 0; j < m->nparams; j++) {
        num += ((double)gr[0][j] - gr[1][j]) * ((double)gr[0][j] - gr[1][j]);
        den += (double)gr[0][j] * gr[0][j];
    }
    const double rel = sqrt(num / den);
    printf("padding (%s): 1 x %d rows of %d vs 3 x 4 rows of %d: loss %.9f vs %.9f, clipped %g vs %g, grad rel diff "
           "%.2e\n", mt_grpo_agg_name(agg), NSEQ, Tmin, Tmin + 5, loss[0], loss[1], st[0][2], st[1][2], rel);
    CHECK(fabs(loss[0] - loss[1]) <= 1e-5 * fabs(loss[0]), "padding changed the loss: %.9f vs %.9f", loss[0], loss[1]);
    CHECK(st[0][2] == st[1][2] && st[0][4] == st[1][4], "padding changed the clipped or token counts");
    CHECK(rel < 1e-5, "padding changed the gradients: rel diff %.3e", rel);
    free(gr[0]), free(gr[1]);
    memcpy(m->params, saved_all, sizeof(float) * m->nparams);
    free(saved_all);
}

static void check_init_errors(void) {
    mt_grpo_loss L;
    mt_grpo_loss_defaults(&L);
    mt_grpo_batch g;
    CHECK(mt_grpo_batch_init(&g, &L, seqs, NSEQ, 1, NSEQ - 1, Tmin, total_tokens(), NSEQ, 0) != 0,
          "%d completions accepted into %d rows", NSEQ, NSEQ - 1);
    CHECK(mt_grpo_batch_init(&g, &L, seqs, NSEQ, 2, 3, Tmin - 1, total_tokens(), NSEQ, 0) != 0,
          "a row of %d positions accepted into %d", Tmin, Tmin - 1);
    CHECK(strstr(mt_last_error(), "does not fit") != NULL, "error: %s", mt_last_error());
    CHECK(mt_grpo_agg_parse("token-mean") == MT_AGG_TOKEN_MEAN &&
          mt_grpo_agg_parse("seq-mean-token-mean") == MT_AGG_SEQ_MEAN_TOKEN_MEAN &&
          mt_grpo_agg_parse("seq-mean-token-sum-norm") == MT_AGG_SEQ_MEAN_TOKEN_SUM_NORM,
          "aggregation names do not parse");
    CHECK(mt_grpo_agg_parse("bogus") < 0 && strstr(mt_last_error(), "bogus"), "--agg bogus accepted");
    /* the layout: row i = prompt + completion but its last token; targets at the positions that predict */
    MT_ASSERT(mt_grpo_batch_init(&g, &L, seqs, NSEQ, 2, 4, Tmin + 1, total_tokens(), NSEQ, 0) == 0);
    int ok = 1;
    for (int r = 0; r < 8; r++) {
        const int32_t *in = g.in + (size_t)r * g.T, *tg = g.tg + (size_t)r * g.T;
        const int fed = r < NSEQ ? plens[r] + ns[r] - 1 : 0;
        ok &= g.fed[r] == fed;
        for (int t = 0; t < g.T; t++) {
            int32_t want_in = 0, want_tg = -1;
            if (r < NSEQ && t < plens[r]) want_in = prompt[r][t];
            else if (r < NSEQ && t < fed) want_in = comp[r][t - plens[r]];
            if (r < NSEQ && t >= plens[r] - 1 && t < fed) want_tg = comp[r][t - plens[r] + 1];
            ok &= in[t] == want_in && tg[t] == want_tg;
        }
    }
    CHECK(ok, "the batch layout is not prompt + completion[:-1] with targets at the predicting positions");
    mt_grpo_batch_free(&g);
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv); /* the OpenBLAS kernel the product runs (moetrain sets it at start-up) */
    mt_set_threads(2);
    mt_config c;
    config(&c);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 3, 0.3f);
    for (int i = 0; i < m.ntensors; i++) /* norms away from 1 so their gradients matter */
        if (m.tensors[i].ndim == 1)
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] = 1.0f + 0.3f * mt_normal(9, (uint64_t)i, j);
    make_seqs(c.vocab_size);
    check_init_errors();
    mt_acts *a = mt_acts_new(&c, 3, Tmin, mt_get_threads(), 0);
    for (int agg = 0; agg < 3; agg++) {
        check_on_policy(&m, a, agg, 1.0, 0.0);
        check_on_policy(&m, a, agg, 0.7, 0.0);
    }
    check_on_policy(&m, a, MT_AGG_SEQ_MEAN_TOKEN_MEAN, 0.7, 0.1);
    check_fd(&m, a, MT_AGG_TOKEN_MEAN, 1.0, 0.0);
    for (int agg = 0; agg < 3; agg++) check_fd(&m, a, agg, 0.7, 0.0);
    check_fd(&m, a, MT_AGG_TOKEN_MEAN, 0.7, 0.1);
    mt_acts_free(a);
    check_padding(&m, MT_AGG_TOKEN_MEAN);
    check_padding(&m, MT_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    mt_model_free(&m);
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("all GRPO checks passed\n");
    return 0;
}
