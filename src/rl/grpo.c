/* rl/grpo.c — the GRPO loss as a head objective (see grpo.h). */
#include "rl/grpo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

static const char *const agg_names[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"};

int mt_grpo_agg_parse(const char *name) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, agg_names[i]) == 0) return i;
    return mt_error("--agg '%s': token-mean, seq-mean-token-mean or seq-mean-token-sum-norm", name);
}

const char *mt_grpo_agg_name(int agg) { return agg >= 0 && agg < 3 ? agg_names[agg] : "?"; }

void mt_grpo_loss_defaults(mt_grpo_loss *l) {
    memset(l, 0, sizeof *l);
    l->eps_low = l->eps_high = 0.2;
    l->is_cap = 5.0;
    l->temperature = 1.0;
    l->agg = MT_AGG_TOKEN_MEAN;
    l->max_new = 64;
}

/* dL/dlogp of one token; the head calls it once per target, from several threads */
static double grpo_fn(void *ctx, int64_t row, double logp) {
    mt_grpo_batch *g = ctx;
    if (g->phase == 0 || g->phase == 2) {
        (g->phase == 0 ? g->old : g->ref)[row] = (float)logp;
        return 0.0;
    }
    g->logp[row] = (float)logp;
    const double A = g->adv[row], ratio = exp(logp - (double)g->old[row]);
    const double lo = 1.0 - g->L.eps_low, hi = 1.0 + g->L.eps_high;
    const double rc = ratio < lo ? lo : ratio > hi ? hi : ratio;
    /* min() takes the clipped term only where it is strictly smaller: there the gradient is 0 */
    const int clipped = rc * A < ratio * A;
    g->clipped[row] = (uint8_t)clipped;
    double w = g->L.no_is_weight ? 1.0 : exp((double)g->old[row] - (double)g->behav[row]);
    if (w > g->L.is_cap) w = g->L.is_cap;
    const double dpg = clipped ? 0.0 : -A * ratio;
    /* kl = e^d - d - 1, d = logp_ref - logp; d kl / d logp = 1 - e^d */
    const double dr = (double)g->ref[row] - logp, ed = g->L.beta > 0 ? exp(dr) : 1.0;
    /* the token's terms, for mt_grpo_stats (each row is written by one call) */
    g->ratio[row] = ratio;
    g->wpg[row] = w * -(clipped ? rc * A : ratio * A);
    g->kl[row] = g->L.beta > 0 ? ed - dr - 1.0 : 0.0;
    return (double)g->aggw[row] * (w * dpg + g->L.beta * (1.0 - ed));
}

int mt_grpo_batch_init(mt_grpo_batch *g, const mt_grpo_loss *L, const mt_grpo_seq *seq, int nseq, int n_micro,
                       int B, int T, int64_t global_tokens, int64_t global_seqs, int replay_stride) {
    memset(g, 0, sizeof *g);
    const int rows = n_micro * B;
    if (nseq > rows) return mt_error("grpo: %d completions do not fit %d rows", nseq, rows);
    for (int i = 0; i < nseq; i++)
        if (seq[i].plen < 1 || seq[i].n < 1 || seq[i].plen + seq[i].n - 1 > T)
            return mt_error("grpo: completion %d (%d prompt + %d completion tokens) does not fit %d positions", i,
                            seq[i].plen, seq[i].n, T);
    const size_t NT = (size_t)rows * T;
    g->n_micro = n_micro, g->B = B, g->T = T, g->L = *L;
    g->in = mt_xcalloc(NT, sizeof(int32_t));
    g->tg = mt_xmalloc(sizeof(int32_t) * NT);
    g->fed = mt_xcalloc((size_t)rows, sizeof(int32_t));
    g->adv = mt_xcalloc(NT, sizeof(float));
    g->behav = mt_xcalloc(NT, sizeof(float));
    g->old = mt_xcalloc(NT, sizeof(float));
    g->ref = mt_xcalloc(NT, sizeof(float));
    g->logp = mt_xcalloc(NT, sizeof(float));
    g->aggw = mt_xcalloc(NT, sizeof(float));
    g->clipped = mt_xcalloc(NT, 1);
    g->ratio = mt_xcalloc(NT, sizeof(double));
    g->wpg = mt_xcalloc(NT, sizeof(double));
    g->kl = mt_xcalloc(NT, sizeof(double));
    for (size_t i = 0; i < NT; i++) g->tg[i] = -1;
    if (replay_stride > 0) {
        for (int i = 0; i < nseq; i++)
            if (!seq[i].routing) {
                mt_grpo_batch_free(g);
                return mt_error("grpo: routing replay without the rollout's routing record (completion %d)", i);
            }
        g->replay_stride = replay_stride;
        g->replay = mt_xmalloc(sizeof(int32_t) * NT * (size_t)replay_stride);
        for (size_t i = 0; i < NT * (size_t)replay_stride; i++) g->replay[i] = -1; /* padding: route as usual */
    }
    for (int i = 0; i < nseq; i++) {
        const mt_grpo_seq *s = &seq[i];
        const size_t r = (size_t)i * T;
        memcpy(g->in + r, s->prompt, sizeof(int32_t) * (size_t)s->plen);
        memcpy(g->in + r + s->plen, s->tokens, sizeof(int32_t) * (size_t)(s->n - 1));
        g->fed[i] = s->plen + s->n - 1;
        if (g->replay)
            memcpy(g->replay + r * (size_t)replay_stride, s->routing,
                   sizeof(int32_t) * (size_t)g->fed[i] * (size_t)replay_stride);
        double w = 0;
        if (L->agg == MT_AGG_TOKEN_MEAN) w = 1.0 / (double)global_tokens;
        else if (L->agg == MT_AGG_SEQ_MEAN_TOKEN_MEAN) w = 1.0 / ((double)s->n * (double)global_seqs);
        else w = 1.0 / ((double)L->max_new * (double)global_seqs);
        for (int k = 0; k < s->n; k++) { /* position plen-1+k predicts completion token k */
            const size_t at = r + (size_t)(s->plen - 1 + k);
            g->tg[at] = s->tokens[k];
            g->adv[at] = s->adv;
            g->behav[at] = s->logp_behav[k];
            g->aggw[at] = (float)w;
        }
    }
    const double tau = L->temperature > 0 ? L->temperature : 1.0;
    g->obj = (mt_head_obj){1.0 / tau, tau, grpo_fn, g, 0};
    return 0;
}

void mt_grpo_batch_free(mt_grpo_batch *g) {
    free(g->in), free(g->tg), free(g->fed), free(g->adv), free(g->behav), free(g->old), free(g->ref), free(g->logp);
    free(g->aggw);
    free(g->clipped);
    free(g->ratio), free(g->wpg), free(g->kl);
    free(g->replay);
    memset(g, 0, sizeof *g);
}

void mt_grpo_stats(const mt_grpo_batch *g, double *s) {
    memset(s, 0, sizeof(double) * MT_GRPO_NSTAT);
    const size_t NT = (size_t)g->n_micro * g->B * g->T;
    for (size_t i = 0; i < NT; i++) {
        if (g->tg[i] < 0 || g->ratio[i] == 0) continue; /* no target, or the head ran elsewhere */
        s[0] += g->aggw[i] * (g->wpg[i] + g->L.beta * g->kl[i]);
        s[1] += g->aggw[i] * g->wpg[i];
        s[2] += g->clipped[i];
        s[3] += fabs(g->ratio[i] - 1.0);
        s[4] += 1;
        s[6] += g->aggw[i] * g->kl[i];
        const double dev = fabs((double)g->old[i] - (double)g->behav[i]);
        if (dev > s[5]) s[5] = dev;
    }
}
