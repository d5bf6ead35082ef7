/* tests/test_rollout.c — the rollout engine against the training forward: greedy
 * completions equal those of re-running the whole prefix (mt_model_step) for any slot
 * count; behaviour log-probs equal the log-softmax of the training forward's logits
 * (<= 1e-5), and in fp32 with the forward's products on the decoder's kernel (what RL's
 * trainer runs, mt_acts_fwd_rows) to the bit, as do completions under any slot count,
 * prefill budget or speculative decoding (a query's bits do not depend on the batch), and a
 * 150-position sequence decoded a token at a time (past the attention's 64-key blocks);
 * sampled completions do not depend on the slot count or the prefill budget;
 * the routing record equals the training forward's routing; the sampling rules
 * (greedy ties, top-k, top-p over the renormalised top-k, the inverse CDF) on crafted
 * logits; bad requests are refused. The same engine checks on an MLA model, whose decoder in
 * both cache forms (absorbed: compressed c and k_pe; unabsorbed: per-head k, v) gives the
 * training forward's logits, the absorbed one reading fewer cache bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ops.h"
#include "model/decode.h"
#include "model/model.h"
#include "tinymoe.h"
#include "rl/rollout.h"

static int failures = 0;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

enum { NREQ = 7, MAXNEW = 9, EOT = 3 };

static void config(mt_config *c) { tiny_moe_config(c, 0.01); }

static int32_t prompts[NREQ][12];
static mt_rollout_req reqs[NREQ];

static void make_requests(const mt_config *c) {
    for (int i = 0; i < NREQ; i++) {
        int len = 1 + (int)(mt_hash4(7, (uint64_t)i, 0, 0) % 11);
        for (int j = 0; j < len; j++) prompts[i][j] = (int32_t)(mt_hash4(8, (uint64_t)i, (uint64_t)j, 0) % (uint64_t)c->vocab_size);
        reqs[i] = (mt_rollout_req){prompts[i], len, (uint64_t)(100 + i), (uint64_t)(i % 3)};
    }
}

/* logits of every position of one sequence from the training forward */
static float *full_logits_mode(mt_model *m, const int32_t *seq, int T, int bf16, int rows) {
    const int V = m->cfg.vocab_size;
    mt_acts *a = mt_acts_new(&m->cfg, 1, T, mt_get_threads(), bf16);
    mt_acts_fwd_rows(a, rows);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) tg[t] = -1;
    float *lg = mt_alloc(sizeof(float) * (size_t)T * V);
    mt_step_stats st;
    mt_model_step(m, a, seq, tg, 1, T, 0, 0, 0, lg, &st);
    free(tg);
    mt_acts_free(a);
    return lg;
}
static float *full_logits_prec(mt_model *m, const int32_t *seq, int T, int bf16) {
    return full_logits_mode(m, seq, T, bf16, 0);
}
static float *full_logits(mt_model *m, const int32_t *seq, int T) { return full_logits_prec(m, seq, T, 0); }

static int run(mt_model *m, const mt_rollout_opts *o, mt_completion *out) {
    mt_rollout_stats st;
    int rc = mt_rollout(m, o, reqs, NREQ, out, &st);
    CHECK(rc == 0, "rollout failed: %s", mt_last_error());
    return rc;
}

/* the same tokens and stops; log-probs within tol (0: the same bits) */
static int same_completions(const mt_completion *a, const mt_completion *b, double tol) {
    for (int i = 0; i < NREQ; i++) {
        if (a[i].n != b[i].n || a[i].stopped_eot != b[i].stopped_eot) return 0;
        if (memcmp(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].n)) return 0;
        for (int k = 0; k < a[i].n; k++)
            if (fabs(a[i].logp[k] - b[i].logp[k]) > tol) return 0;
    }
    return 1;
}

static void free_all(mt_completion *c) {
    for (int i = 0; i < NREQ; i++) mt_completion_free(&c[i]);
}

/* greedy and sampled rollouts against the training forward */
/* exact: fp32 decoding whose attention is the training forward's arithmetic (not absorbed MLA) */
static void check_engine(mt_model *m, int exact) {
    const mt_config *c = &m->cfg;
    const int V = c->vocab_size;
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.max_new = MAXNEW;
    o.eot = EOT;
    o.record_routing = 1;
    mt_completion ref[NREQ], got[NREQ];
    /* greedy, 1 slot: each completion against re-running its whole prefix */
    o.temperature = 0;
    o.slots = 1;
    if (run(m, &o, ref)) return;
    double worst = 0;
    int nmoe = 0, nbits = 0, ntok = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) nmoe += mt_config_is_moe(c, l);
    for (int i = 0; i < NREQ; i++) {
        const mt_completion *co = &ref[i];
        const int T = reqs[i].len + co->n;
        int32_t *seq = mt_xmalloc(sizeof(int32_t) * (size_t)T);
        memcpy(seq, reqs[i].prompt, sizeof(int32_t) * (size_t)reqs[i].len);
        memcpy(seq + reqs[i].len, co->tokens, sizeof(int32_t) * (size_t)co->n);
        float *lg = full_logits(m, seq, T - 1), *lr = full_logits_mode(m, seq, T - 1, 0, 1);
        for (int k = 0; k < co->n; k++) {
            const float *l = lg + (size_t)(reqs[i].len - 1 + k) * V;
            int best = 0;
            double mx = l[0], s = 0;
            for (int j = 1; j < V; j++) if (l[j] > l[best]) best = j;
            mx = l[best];
            for (int j = 0; j < V; j++) s += exp(l[j] - mx);
            CHECK(co->tokens[k] == best, "request %d token %d: engine %d, full forward's argmax %d", i, k,
                  co->tokens[k], best);
            double lp = l[co->tokens[k]] - mx - log(s), e = fabs(lp - co->logp[k]);
            worst = e > worst ? e : worst;
            /* the trainer's log-prob of the token: its forward on the decoder's products */
            const float *r = lr + (size_t)(reqs[i].len - 1 + k) * V;
            float rm = r[0];
            for (int j = 1; j < V; j++) rm = r[j] > rm ? r[j] : rm;
            const float lt = (float)mt_tempered_logp(r, 1.0, rm, co->tokens[k], mt_tempered_sum(r, V, 1.0, rm, NULL));
            nbits += memcmp(&lt, &co->logp[k], sizeof lt) == 0;
            ntok++;
        }
        CHECK(co->stopped_eot == (co->tokens[co->n - 1] == EOT) && (co->stopped_eot || co->n == MAXNEW),
              "request %d: stop rule (n %d, eot %d)", i, co->n, co->stopped_eot);
        /* the routing record: the training forward's routing of the same fed positions */
        mt_acts *a = mt_acts_new(c, 1, T - 1, mt_get_threads(), 0);
        int32_t *tg = mt_xmalloc(sizeof(int32_t) * (size_t)T);
        for (int t = 0; t < T; t++) tg[t] = -1;
        mt_step_stats st;
        memset(&st, 0, sizeof st);
        const mt_loss main_only = {0}; /* no MTP blocks: the rollout records the main stack's routing */
        mt_model_forward(m, a, seq, tg, NULL, 1, T - 1, 0, &main_only, NULL, &st);
        uint64_t h = 0;
        const int K = c->num_experts_per_tok;
        for (int l = 0, q = 0; l < c->num_hidden_layers; l++) {
            if (!mt_config_is_moe(c, l)) continue;
            for (int t = 0; t < T - 1; t++)
                for (int j = 0; j < K; j++)
                    h = mt_hash4(h, (uint64_t)l, (uint64_t)(t * K + j),
                                 (uint64_t)co->routing[((size_t)t * nmoe + q) * K + j]);
            q++;
        }
        CHECK(h == mt_acts_routing_hash(a, c), "request %d: the routing record differs from the training forward's", i);
        mt_acts_free(a);
        free(tg);
        mt_free(lg);
        mt_free(lr);
        free(seq);
    }
    printf("greedy: completions = full-prefix argmax, worst |logp - training logp| %.2e; %d of %d log-probs the "
           "bits of the forward on the decoder's products\n", worst, nbits, ntok);
    CHECK(worst <= 1e-5, "behaviour log-probs differ from the training forward's by %.2e", worst);
    if (exact) CHECK(nbits == ntok, "%d of %d behaviour log-probs differ from the trainer's bits", ntok - nbits, ntok);
    const double tol = exact ? 0 : 1e-5;
    /* without log-probs: the same tokens, logp 0 */
    o.no_logp = 1;
    if (run(m, &o, got)) return;
    int same_tok = 1, zero = 1;
    for (int i = 0; i < NREQ; i++) {
        same_tok &= got[i].n == ref[i].n && memcmp(got[i].tokens, ref[i].tokens, sizeof(int32_t) * (size_t)ref[i].n) == 0;
        for (int k = 0; k < got[i].n; k++) zero &= got[i].logp[k] == 0.0f;
    }
    CHECK(same_tok && zero, "greedy without log-probs: tokens %s, log-probs %s", same_tok ? "same" : "differ",
          zero ? "0" : "not 0");
    free_all(got);
    o.no_logp = 0;
    for (int slots = 2; slots <= 64; slots *= 4) {
        o.slots = slots;
        if (run(m, &o, got)) return;
        CHECK(same_completions(ref, got, tol), "greedy with %d slots differs from 1 slot", slots);
        free_all(got);
    }
    free_all(ref);
    /* the same slots again: the same bits */
    o.slots = 3;
    if (run(m, &o, ref)) return;
    if (run(m, &o, got)) return;
    CHECK(same_completions(ref, got, 0), "two rollouts with the same settings differ");
    free_all(got);
    free_all(ref);
    /* sampled: the draws are keyed by request and position, not by slot or schedule */
    o.temperature = 0.9;
    o.top_k = 6;
    o.top_p = 0.8;
    o.seed = 5;
    o.slots = 1;
    if (run(m, &o, ref)) return;
    o.slots = 3;
    o.prefill_tokens = 2; /* a prompt at a time */
    if (run(m, &o, got)) return;
    CHECK(same_completions(ref, got, tol), "sampled rollout depends on the slots / prefill budget");
    free_all(got);
    o.seed = 6;
    if (run(m, &o, got)) return;
    CHECK(!same_completions(ref, got, 1e-5), "another seed gave the same samples");
    free_all(got);
    free_all(ref);
    printf("sampled: the same completions for 1 and 3 slots, others for another seed\n");
}

/* MLA: a prompt prefilled in pieces and then decoded one token at a time, in both cache
 * forms, against the training forward's logits of the whole sequence; the cache bytes each
 * form's attention read per token. */
static void check_mla_forms(mt_model *m) {
    const mt_config *c = &m->cfg;
    enum { TS = 40 };
    const int V = c->vocab_size;
    int32_t seq[TS];
    for (int t = 0; t < TS; t++) seq[t] = (int32_t)(mt_hash4(61, (uint64_t)t, 0, 0) % (uint64_t)V);
    float *lg = mt_alloc(sizeof(float) * (size_t)TS * V);
    size_t bytes[2];
    /* bf16's own error: the bf16 training forward against the fp32 one */
    double e16 = 0;
    if (mt_bf16_supported()) {
        float *a = full_logits_prec(m, seq, TS, 0), *b = full_logits_prec(m, seq, TS, 1);
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)TS * V; i++) num += (double)(a[i] - b[i]) * (a[i] - b[i]), den += (double)a[i] * a[i];
        e16 = sqrt(num / den);
        mt_free(a);
        mt_free(b);
    }
    for (int bf = 0; bf <= mt_bf16_supported(); bf++)
    for (int form = 0; form < 2; form++) {
        float *ref = full_logits_prec(m, seq, TS, bf);
        mt_decoder *d = mt_decoder_new_form(m, 2, TS, TS, mt_get_threads(), bf, form);
        CHECK(d != NULL, "decoder: %s", mt_last_error());
        if (!d) return;
        int32_t slot[TS], pos[TS], rows[TS];
        /* positions 0..9 in one call (slot 1), then one at a time */
        for (int t = 0; t < 10; t++) slot[t] = 1, pos[t] = t, rows[t] = t;
        mt_decoder_forward(d, m, seq, slot, pos, 10, rows, 10, lg);
        for (int t = 10; t < TS; t++) {
            int32_t s1 = 1, p1 = t, r0 = 0;
            mt_decoder_forward(d, m, seq + t, &s1, &p1, 1, &r0, 1, lg + (size_t)t * V);
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)TS * V; i++) {
            num += (double)(lg[i] - ref[i]) * (lg[i] - ref[i]);
            den += (double)ref[i] * ref[i];
        }
        bytes[form] = mt_decoder_kv_read(d);
        printf("MLA decode %-11s %s logits vs the %s training forward rel err %.2e, %.0f cache bytes read per "
               "token\n", form ? "absorbed:" : "unabsorbed:", bf ? "bf16" : "fp32", bf ? "bf16" : "fp32",
               sqrt(num / den), (double)bytes[form] / TS);
        if (bf && form) printf("    (bf16 training forward vs fp32: %.2e)\n", e16);
        /* bf16 against the bf16 training forward: absorbed rounds other products (W_kb^h^T q,
         * sum p c), so within bf16's own error (against fp32: e16), not to its bits */
        CHECK(sqrt(num / den) < (bf ? e16 : 1e-5), "MLA decode (%s, %s) differs from the training forward: %.2e",
              form ? "absorbed" : "unabsorbed", bf ? "bf16" : "fp32", sqrt(num / den));
        if (!bf && !form) { /* unabsorbed fp32: the bits of the forward on the decoder's products */
            float *rr = full_logits_mode(m, seq, TS, 0, 1);
            CHECK(memcmp(rr, lg, sizeof(float) * (size_t)TS * V) == 0,
                  "MLA decode (unabsorbed, fp32): not the bits of the forward on the decoder's products");
            mt_free(rr);
        }
        mt_decoder_free(d);
        mt_free(ref);
    }
    const int H = c->num_attention_heads, kvl = c->kv_lora_rank, dr = c->qk_rope_head_dim;
    const double want = (double)H * (c->qk_nope_head_dim + dr + c->v_head_dim) / (kvl + dr);
    CHECK(fabs((double)bytes[0] / (double)bytes[1] - want) < 1e-9, "cache bytes ratio %.3f, want %.3f",
          (double)bytes[0] / (double)bytes[1], want);
    mt_free(lg);
}

static void check_sampling(void) {
    float scratch[64];
    double lp;
    const float tie[5] = {1.0f, 3.0f, 0.5f, 3.0f, -1.0f};
    CHECK(mt_sample_token(tie, 5, 0, 0, 1, 0.7, &lp, scratch) == 1, "greedy: ties go to the lower id");
    double s = 0;
    for (int j = 0; j < 5; j++) s += exp(tie[j] - 3.0);
    CHECK(fabs(lp - (0 - log(s))) < 1e-12, "greedy logp is the tau = 1 log-softmax");
    /* the inverse CDF: draws on a grid reproduce the tempered probabilities */
    const float l[5] = {0.3f, -0.2f, 1.1f, 0.0f, 0.7f};
    const double tau = 0.7;
    double p[5], z = 0;
    for (int j = 0; j < 5; j++) z += p[j] = exp(l[j] / tau);
    int cnt[5] = {0};
    const int ND = 100000;
    for (int d = 0; d < ND; d++) {
        int t = mt_sample_token(l, 5, tau, 0, 1, (d + 0.5) / ND, &lp, scratch);
        cnt[t]++;
        double want = log(p[t] / z);
        CHECK(fabs(lp - want) < 1e-6, "logp of token %d: %.9f vs %.9f", t, lp, want);
        if (fabs(lp - want) >= 1e-6) break;
    }
    for (int j = 0; j < 5; j++)
        CHECK(fabs(cnt[j] / (double)ND - p[j] / z) < 2e-4, "token %d drawn %.5f of the time, p = %.5f", j,
              cnt[j] / (double)ND, p[j] / z);
    /* top-k = 2 keeps tokens 2 and 4; top-p 0.5 over those keeps token 2 only when its
     * renormalised probability reaches 0.5 */
    int seen[5] = {0};
    for (int d = 0; d < 1000; d++) seen[mt_sample_token(l, 5, tau, 2, 1, (d + 0.5) / 1000, &lp, scratch)]++;
    CHECK(seen[0] + seen[1] + seen[3] == 0 && seen[2] > 0 && seen[4] > 0, "top-k 2 kept other tokens");
    const double p2 = p[2] / (p[2] + p[4]);
    for (int d = 0; d < 1000; d++) seen[mt_sample_token(l, 5, tau, 2, p2 - 1e-3, (d + 0.5) / 1000, &lp, scratch)] += 10000;
    CHECK(seen[4] < 10000, "top-p below token 2's renormalised mass still kept token 4");
    int any4 = 0;
    for (int d = 0; d < 1000; d++) any4 |= mt_sample_token(l, 5, tau, 2, p2 + 1e-3, (d + 0.5) / 1000, &lp, scratch) == 4;
    CHECK(any4, "top-p above token 2's renormalised mass dropped token 4");
    /* the untruncated logp whatever the truncation */
    mt_sample_token(l, 5, tau, 1, 1, 0.3, &lp, scratch);
    CHECK(fabs(lp - log(p[2] / z)) < 1e-6, "top-k changed the behaviour logp");
    printf("sampling rules: ties, inverse CDF over %d draws, top-k, top-p, untruncated logp\n", ND);
}

/* Routing replay: after the weights move, a forward given the rollout's routing record
 * routes exactly as the rollout did, while its own top-k no longer does. */
static void check_replay(mt_model *m) {
    const mt_config *c = &m->cfg;
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.max_new = MAXNEW, o.eot = EOT, o.record_routing = 1, o.temperature = 0;
    mt_completion ref[NREQ];
    if (run(m, &o, ref)) return;
    int nmoe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) nmoe += mt_config_is_moe(c, l);
    const int K = c->num_experts_per_tok, rw = nmoe * K;
    float *saved = mt_alloc(sizeof(float) * m->nparams);
    memcpy(saved, m->params, sizeof(float) * m->nparams);
    for (size_t i = 0; i < m->nparams; i++) m->params[i] += 0.3f * (mt_u01(mt_hash4(77, i, 0, 0)) - 0.5f);
    int flips = 0, replay_ok = 1;
    for (int i = 0; i < NREQ; i++) {
        const mt_completion *co = &ref[i];
        const int T = reqs[i].len + co->n - 1;
        int32_t *seq = mt_xmalloc(sizeof(int32_t) * (size_t)(T + 1)), *tg = mt_xmalloc(sizeof(int32_t) * (size_t)T);
        memcpy(seq, reqs[i].prompt, sizeof(int32_t) * (size_t)reqs[i].len);
        memcpy(seq + reqs[i].len, co->tokens, sizeof(int32_t) * (size_t)(co->n - 1));
        for (int t = 0; t < T; t++) tg[t] = -1;
        uint64_t want = 0;
        for (int l = 0, q = 0; l < c->num_hidden_layers; l++) {
            if (!mt_config_is_moe(c, l)) continue;
            for (int t = 0; t < T; t++)
                for (int j = 0; j < K; j++)
                    want = mt_hash4(want, (uint64_t)l, (uint64_t)(t * K + j), (uint64_t)co->routing[((size_t)t * nmoe + q) * K + j]);
            q++;
        }
        for (int rep = 0; rep < 2; rep++) {
            mt_acts *a = mt_acts_new(c, 1, T, mt_get_threads(), 0);
            mt_step_stats st;
            memset(&st, 0, sizeof st);
            const mt_loss loss = {0.0f, NULL, NULL, rep ? co->routing : NULL, rep ? rw : 0, NULL, NULL};
            mt_model_forward(m, a, seq, tg, NULL, 1, T, 0, &loss, NULL, &st);
            const int same = mt_acts_routing_hash(a, c) == want;
            if (rep) replay_ok &= same;
            else flips += !same;
            mt_acts_free(a);
        }
        free(seq);
        free(tg);
    }
    memcpy(m->params, saved, sizeof(float) * m->nparams);
    mt_free(saved);
    free_all(ref);
    printf("routing replay: %d of %d sequences route otherwise after the update; replayed, all as recorded: %s\n", flips,
           NREQ, replay_ok ? "yes" : "no");
    CHECK(flips > 0, "the perturbation changed no routing: the replay check is vacuous");
    CHECK(replay_ok, "a replayed forward did not route as the rollout recorded");
}

static void check_errors(mt_model *m) {
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.max_new = m->cfg.max_position_embeddings;
    mt_completion out[1];
    mt_rollout_stats st;
    int32_t t[2] = {1, 2};
    mt_rollout_req r = {t, 2, 0, 0};
    CHECK(mt_rollout(m, &o, &r, 1, out, &st) != 0 && strstr(mt_last_error(), "max_position_embeddings"),
          "a prompt + max_new past max_position_embeddings was accepted");
    o.max_new = 4;
    t[1] = m->cfg.vocab_size;
    CHECK(mt_rollout(m, &o, &r, 1, out, &st) != 0 && strstr(mt_last_error(), "vocabulary"),
          "a token outside the vocabulary was accepted");
    r.len = 0;
    CHECK(mt_rollout(m, &o, &r, 1, out, &st) != 0, "an empty prompt was accepted");
}

/* A sequence past several 64-key blocks (the attention's online-softmax blocks) and 16-position
 * cache blocks: prefilled in one call, then decoded a token at a time in slot 1 of 3, the
 * decoder's logits are the bits of the forward on the decoder's products (fp32, GQA). */
static void check_long_decode(const mt_config *base) {
    enum { TS = 150, PRE = 21 };
    mt_config c = *base;
    c.max_position_embeddings = 160;
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 7, 0.4f);
    const int V = c.vocab_size;
    int32_t seq[TS], slot[PRE], pos[PRE], rows[PRE];
    for (int t = 0; t < TS; t++) seq[t] = (int32_t)(mt_hash4(63, (uint64_t)t, 0, 0) % (uint64_t)V);
    float *lg = mt_alloc(sizeof(float) * (size_t)TS * V), *ref = full_logits_mode(&m, seq, TS, 0, 1);
    mt_decoder *d = mt_decoder_new(&m, 3, TS, TS, mt_get_threads(), 0);
    CHECK(d != NULL, "decoder: %s", mt_last_error());
    if (d) {
        for (int t = 0; t < PRE; t++) slot[t] = 1, pos[t] = t, rows[t] = t;
        mt_decoder_forward(d, &m, seq, slot, pos, PRE, rows, PRE, lg);
        for (int t = PRE; t < TS; t++) {
            int32_t s1 = 1, p1 = t, r0 = 0;
            mt_decoder_forward(d, &m, seq + t, &s1, &p1, 1, &r0, 1, lg + (size_t)t * V);
        }
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)TS * V; i++) bad += memcmp(&lg[i], &ref[i], sizeof(float)) != 0;
        printf("long decode: %d positions, %zu of %zu logits differ from the forward on the decoder's products\n", TS,
               bad, (size_t)TS * V);
        CHECK(bad == 0, "long decode: %zu logits differ", bad);
        mt_decoder_free(d);
    }
    mt_free(lg);
    mt_free(ref);
    mt_model_free(&m);
}

/* speculative decoding (MTP drafts): the same completions as plain decoding, greedy and
 * sampled, in fewer forwards when drafts are accepted; min_accept: the acceptance the greedy
 * run must reach */
static void check_speculative(mt_model *m, const char *what, double min_accept, int exact) {
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.max_new = 14;
    o.eot = -1;
    o.slots = 5;
    for (int sampled = 0; sampled < 2; sampled++) {
        o.temperature = sampled ? 0.8 : 0.0;
        o.top_k = sampled ? 20 : 0;
        o.top_p = sampled ? 0.9 : 1.0;
        mt_completion a[NREQ], b[NREQ];
        mt_rollout_stats sa, sb;
        o.speculative = 0;
        CHECK(mt_rollout(m, &o, reqs, NREQ, a, &sa) == 0, "%s: rollout: %s", what, mt_last_error());
        o.speculative = 1;
        CHECK(mt_rollout(m, &o, reqs, NREQ, b, &sb) == 0, "%s: speculative rollout: %s", what, mt_last_error());
        const double acc = sb.drafted ? (double)sb.accepted / (double)sb.drafted : 0.0;
        printf("%s, %s: %d -> %d forwards, %lld drafts, acceptance %.1f%%\n", what, sampled ? "sampled" : "greedy",
               sa.forwards, sb.forwards, (long long)sb.drafted, 100 * acc);
        CHECK(same_completions(a, b, exact ? 0 : 1e-5), "%s, %s: speculative decoding changed the completions", what,
              sampled ? "sampled" : "greedy");
        CHECK(sb.drafted > 0 && sb.accepted <= sb.drafted, "%s: %lld drafts, %lld accepted", what,
              (long long)sb.drafted, (long long)sb.accepted);
        /* the forwards are those of the longest completion: fewer only when its drafts are right */
        CHECK(sb.forwards <= sa.forwards && (min_accept == 0 || sb.forwards < sa.forwards),
              "%s: %d forwards with drafts, %d without", what, sb.forwards, sa.forwards);
        if (!sampled) CHECK(acc >= min_accept, "%s: greedy acceptance %.3f < %.3f", what, acc, min_accept);
        free_all(a);
        free_all(b);
    }
}

/* An MTP model whose drafts are right: the sublayers' output projections are zero, so h^0 is
 * the token's embedding and the main head's next token a function f of the current one;
 * eh_proj = [I | 0] makes the block's output the next token's normed embedding, so its
 * head gives f(next) (rmsnorm is idempotent up to eps). */
static void rig_drafts(mt_model *m) {
    const int C = m->cfg.hidden_size;
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        if (t->role == MT_R_WO || t->role == MT_R_DOWN || t->role == MT_R_EDOWN || t->role == MT_R_SDOWN)
            memset(p, 0, sizeof(float) * t->numel);
        if (t->ndim == 1) for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        if (t->role == MT_R_EH_PROJ) {
            memset(p, 0, sizeof(float) * t->numel);
            for (int r = 0; r < C; r++) p[(size_t)r * 2 * C + r] = 1.0f;
        }
    }
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv); /* the OpenBLAS kernel the product runs (moetrain sets it at start-up) */
    mt_set_threads(2);
    mt_config c;
    config(&c);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 3, 0.4f);
    make_requests(&c);
    check_sampling();
    check_engine(&m, 1);
    check_replay(&m);
    check_errors(&m);
    check_long_decode(&c);
    {
        mt_completion out[NREQ];
        mt_rollout_stats st;
        mt_rollout_opts o;
        mt_rollout_defaults(&o);
        o.max_new = 4;
        o.speculative = 1;
        CHECK(mt_rollout(&m, &o, reqs, NREQ, out, &st) != 0 && strstr(mt_last_error(), "MTP"),
              "speculative decoding without an MTP block was accepted");
    }
    mt_model_free(&m);
    /* multi-token prediction: MTP drafts, random (few accepted) and right by construction */
    c.num_nextn_predict_layers = 1;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 3, 0.4f);
    check_engine(&m, 1);
    check_speculative(&m, "MTP, random drafts", 0.0, 1);
    rig_drafts(&m);
    check_speculative(&m, "MTP, right drafts", 0.9, 1);
    mt_model_free(&m);
    c.num_nextn_predict_layers = 0;
    /* the sandwich norm: the decoder's extra norms against the training forward's */
    c.sandwich_norm = 1;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 3, 0.4f);
    printf("sandwich norm:\n");
    check_engine(&m, 1);
    check_replay(&m);
    mt_model_free(&m);
    c.sandwich_norm = 0;
    /* MLA with query compression, DeepSeek's interleaved RoPE; the engine on it, both forms */
    snprintf(c.attention_type, sizeof c.attention_type, "mla");
    c.q_lora_rank = 24;
    c.kv_lora_rank = 16;
    c.qk_nope_head_dim = 8;
    c.qk_rope_head_dim = 4;
    c.v_head_dim = 6;
    c.head_dim = 4;
    c.num_key_value_heads = c.num_attention_heads = 8;
    c.rope_interleave = 1;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 3, 0.4f);
    printf("-- MLA model --\n");
    check_engine(&m, 0);
    check_mla_forms(&m);
    mt_model_free(&m);
    c.sandwich_norm = 1; /* MLA under the sandwich norm */
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 5, 0.4f);
    printf("-- MLA model, sandwich norm --\n");
    check_engine(&m, 0);
    mt_model_free(&m);
    c.num_nextn_predict_layers = 1; /* Pangu's shape: MLA, sandwich norm, MTP drafts */
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 5, 0.4f);
    check_speculative(&m, "MLA + sandwich + MTP", 0.0, 0);
    mt_model_free(&m);
    c.num_nextn_predict_layers = 0;
    c.sandwich_norm = 0;
    c.qk_nope_head_dim = 0; /* every query / key dimension rotated: no key part in kv_b */
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 4, 0.4f);
    check_mla_forms(&m);
    mt_model_free(&m);
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("all rollout checks passed\n");
    return 0;
}
