/* rl/grpo.h — the GRPO loss of one RL step as the trainer's per-token head objective
 * (docs/FORMATS.md section 8).
 *
 * A step's completions are laid out as the trainer's rows: row = prompt + completion
 * without its last token (the fed positions), targets = the completion's tokens at the
 * positions that predict them, -1 elsewhere; rows past the completions are padding (fed
 * 0). For completion token t of completion i, with logp under the weights being trained,
 * logp_old recorded by a forward at the start of the step and logp_behav by the rollout:
 *   ratio = exp(logp - logp_old)
 *   pg_t  = -min(ratio A_i, clip(ratio, 1 - eps_low, 1 + eps_high) A_i)
 *   w_t   = min(exp(logp_old - logp_behav), is_cap)           (no gradient)
 *   kl_t  = exp(logp_ref - logp) - (logp_ref - logp) - 1      (k3, only with beta > 0)
 *   loss  = sum_t agg_t (w_t pg_t + beta kl_t)
 * with agg_t the aggregation's weight of the token over the step's global batch:
 * token-mean 1 / (completion tokens), seq-mean-token-mean 1 / (n_i x completions),
 * seq-mean-token-sum-norm 1 / (max_new x completions). All log-probs are of
 * softmax(logits / tau) (tau = 0: tau = 1); logp_ref is recorded by a forward with the
 * frozen reference weights. */
#ifndef MT_RL_GRPO_H
#define MT_RL_GRPO_H

#include <stdint.h>

#include "kernels/ops.h"

enum mt_grpo_agg { MT_AGG_TOKEN_MEAN = 0, MT_AGG_SEQ_MEAN_TOKEN_MEAN, MT_AGG_SEQ_MEAN_TOKEN_SUM_NORM };
/* "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm" -> the enum, or -1 with an error */
int mt_grpo_agg_parse(const char *name);
const char *mt_grpo_agg_name(int agg);

typedef struct {
    double eps_low, eps_high;  /* clip range (default 0.2, 0.2) */
    double is_cap;             /* truncated importance weight's cap (default 5) */
    int no_is_weight;          /* w_t = 1: no correction for stale rollouts (the ablation of --no-is-weight) */
    double beta;               /* weight of the k3 KL to the reference (default 0: none) */
    double temperature;        /* the rollout's tau (0: the tau = 1 distribution) */
    int agg;                   /* enum mt_grpo_agg */
    int max_new;               /* the rollout's max_new_tokens (seq-mean-token-sum-norm) */
} mt_grpo_loss;

void mt_grpo_loss_defaults(mt_grpo_loss *l);

/* One completion of the step: its prompt and completion tokens, the behaviour log-probs
 * of the completion's tokens and its advantage. */
typedef struct {
    const int32_t *prompt;
    int plen;
    const int32_t *tokens;
    const float *logp_behav;
    int n;
    float adv;
    const int32_t *routing;    /* routing replay: the rollout's record (rl/rollout.h), or NULL */
} mt_grpo_seq;

/* This rank's batch of a step and its per-token state ([n_micro*B*T], token mb*B*T + b*T +
 * t): the head objective (obj) records logp_old in the first pass and trains in the
 * second. */
typedef struct {
    int n_micro, B, T, phase;  /* phase 0: record logp_old; 2: logp_ref; 1: the loss */
    int32_t *in, *tg, *fed;    /* the trainer's batch: tokens, targets, fed positions per row */
    float *adv, *behav, *old, *ref, *logp, *aggw;
    uint8_t *clipped;
    double *ratio, *wpg, *kl;  /* the loss pass's terms per token (ratio 0: not computed here) */
    int32_t *replay;           /* [n_micro*B*T x replay_stride] routing replay, or NULL */
    int replay_stride;
    mt_grpo_loss L;
    mt_head_obj obj;
} mt_grpo_batch;

/* Lays nseq completions out as rows (n_micro x B rows of T positions; -1 when they do not
 * fit: a row longer than T or more completions than rows). The aggregation weights use
 * the global batch's completion tokens and completions (over every DP rank). With
 * replay_stride > 0 (MoE layers x K) every completion's routing record becomes the rows'
 * routing replay. */
int mt_grpo_batch_init(mt_grpo_batch *g, const mt_grpo_loss *L, const mt_grpo_seq *seq, int nseq, int n_micro,
                       int B, int T, int64_t global_tokens, int64_t global_seqs, int replay_stride);
void mt_grpo_batch_free(mt_grpo_batch *g);

/* The step's figures from the terms the loss pass recorded on this rank, to be summed over
 * the ranks that ran the head
 * (one TP rank of each without sequence parallelism): [0] loss, [1] pg part, [2] clipped
 * tokens, [3] sum |ratio - 1|, [4] completion tokens, [5] max |logp_old - logp_behav| (a
 * maximum, not a sum), [6] the kl part (unscaled: loss = pg + beta kl). */
enum { MT_GRPO_NSTAT = 7 };
void mt_grpo_stats(const mt_grpo_batch *g, double *s);

#endif
