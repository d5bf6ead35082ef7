/* rl/rollout.h — the rollout engine: completions of many prompts sampled with a KV cache
 * (model/decode.h), used by `generate`, `eval` and RL.
 *
 * Requests (a prompt's tokens, its index in the prompt set and a sample index) are served
 * by a pool of `slots` sequences decoded together; when a sequence ends (end-of-text, which
 * is kept as its last completion token, or max_new tokens) its slot takes the next pending
 * request, whose prompt is prefilled in the same forward as the others' next tokens
 * (continuous batching). Sampling (docs/FORMATS.md, section 7): temperature tau (0 = greedy,
 * lowest token id on ties), then top-k, then top-p over the renormalised top-k
 * distribution (the smallest set of most probable tokens, ties to the lower id, whose
 * probability reaches p). The uniform draw of a token is a pure function of (seed, step,
 * prompt index, sample index, completion position), not of the slot a request is served
 * in or when. The same settings give the same bits for any thread count; another slot
 * count changes the batch the products see: in fp32 (GQA or unabsorbed MLA) nothing moves, a
 * row's numbers do not depend on its batch; absorbed MLA and bf16 move the logits by rounding
 * only (log-probs within 1e-5), so a token can change only where a draw falls within that of
 * a boundary between two tokens. Every completion token
 * records its behaviour log-prob: log softmax(logits / tau) of the token, untruncated
 * (tau = 0: tau = 1). */
#ifndef MT_RL_ROLLOUT_H
#define MT_RL_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct {
    double temperature;      /* 0 = greedy */
    int top_k;               /* 0 = off */
    double top_p;            /* 1 = off */
    int max_new;             /* completion tokens at most */
    int eot;                 /* end-of-text token id: ends a completion (-1: none) */
    uint64_t seed, step;     /* the draws' keys (step: the training step the rollout is for) */
    int slots;               /* sequences decoded together */
    int prefill_tokens;      /* prompt tokens one forward may prefill (0: 4 x slots) */
    int record_routing;      /* keep each fed position's experts (routing replay) */
    int bf16;                /* the decoder's products in bf16 (mixed precision, as train --bf16), else fp32 */
    int speculative;         /* the model's MTP block drafts the token after next, verified in the next
                              * forward (the same draws, so the same tokens up to rounding) */
    int no_logp;             /* no behaviour log-probs (completions' logp 0): greedy decoding then skips the
                              * pass over the vocabulary that computes them (generate, held-out accuracy) */
    void (*poll)(void *ctx); /* called after every forward (e.g. to serve a DistQueue); NULL: none */
    void *poll_ctx;
} mt_rollout_opts;

void mt_rollout_defaults(mt_rollout_opts *o);

typedef struct {
    const int32_t *prompt;   /* [len] tokens, fed as they are */
    int len;
    uint64_t prompt_index, sample_index;
} mt_rollout_req;

typedef struct {
    int32_t *tokens;         /* [n] completion tokens (a final eot included) */
    float *logp;             /* [n] behaviour log-probs */
    int n;
    int stopped_eot;         /* ended with the eot token (else at max_new) */
    /* record_routing: the experts of every fed position (the prompt's, then the
     * completion's but its last token), [(len + n - 1) x MoE layers x K], layer-major per
     * position; NULL otherwise */
    int32_t *routing;
} mt_completion;

void mt_completion_free(mt_completion *c);

typedef struct {
    int64_t prompt_tokens, completion_tokens;
    int forwards;            /* model forwards (prefill and decode) */
    int64_t drafted, accepted; /* speculative: draft tokens fed, and those the model's own draw confirmed */
    double seconds;          /* wall time of the rollout */
    size_t bytes;            /* memory of the decoder (KV cache, scratch) */
} mt_rollout_stats;

/* Completions of n requests into out[n] (free each with mt_completion_free). Every prompt
 * must be non-empty and len + max_new <= max_position_embeddings (else -1 with an error
 * naming the request). The model must be whole on this rank but for its routed experts
 * and TP slices: with the experts split over an EP group (m->ep) the call is collective
 * over the group, each rank with its own requests (n may be 0), and lasts until the group's
 * last sequence ends; the tokens are those of a whole model up to rounding (the experts'
 * products see the group's rows). A tensor-parallel model (m->tp)
 * is collective over its TP group, every rank with the same requests and getting the same
 * completions (checked after every forward: a rank whose tokens differ fails them all with
 * an error); not both EP and TP. */
int mt_rollout(mt_model *m, const mt_rollout_opts *o, const mt_rollout_req *req, int n, mt_completion *out,
               mt_rollout_stats *st);

/* One sampling decision on logits l[V] (the draw u in [0, 1)); *logp gets the behaviour
 * log-prob of the returned token (logp NULL with tau 0: the argmax alone, no normaliser).
 * scratch: 3V floats. Exposed for tests. */
int mt_sample_token(const float *l, int V, double tau, int top_k, double top_p, double u, double *logp,
                    float *scratch);

#endif
