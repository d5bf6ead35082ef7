/* rl/rl.h — `moetrain rl`: GRPO post-training with verifiable rewards.
 *
 * Each step: P prompts (an epoch-wise seeded permutation of the prompt file), G completions
 * each sampled by the rollout engine (rl/rollout.h) with the current weights, rewards
 * (rl/reward.h), group advantages (rl/advantage.h), a forward that records logp_old, then
 * one optimizer step of the trainer (train/trainer.h) on the GRPO loss (rl/grpo.h). Under
 * mpirun, co-located (default): every rank rolls out P / ranks prompts, from its own
 * weights under data parallelism, from a whole copy filled by a layout switch each step when
 * training splits the model (RL Fusion), or from its part of an EP or TP rollout layout (a
 * TP group samples its ranks' prompts together); the completions then go to the trainer's
 * DP ranks.
 * Separate (rollout_ranks R > 0): the last R ranks only roll out, the others only train;
 * the weights go to the rollout ranks and the completions back each step. With beta >
 * 0 the --init weights stay as the frozen reference (one more copy of the parameters) and a
 * third forward records logp_ref; with routing replay the rollout records every fed
 * position's experts and both trainer forwards use them. Rank 0
 * prints a progress line per step and writes OUT/metrics.jsonl; checkpoints are the
 * trainer's. With dump_rollouts rank 0 also writes each step's rollouts, gathered from the
 * ranks, and what the step recorded (docs/FORMATS.md 8.1): with the checkpoint the step
 * started from (--init for step 1; OUT/step_<s-1> when saved) an independent implementation
 * recomputes the loss; dump_grads adds the first trained step's gradient. */
#ifndef MT_RL_RL_H
#define MT_RL_RL_H

#include <stdint.h>

#include "train/trainer.h"

typedef struct {
    mt_train_opts train;         /* init (required), out, steps, lr, ..., threads, seed */
    const char *prompts;         /* prompt file (PROMPT\tANSWER per line) */
    const char *eval_prompts;    /* held-out prompt file (optional) */
    const char *task;            /* reward: "math" */
    int group;                   /* completions per prompt G (>= 2) */
    int prompts_per_step;        /* P */
    int micro_batch;             /* rows per trainer micro-batch (0: min(8, the rank's completions)) */
    int max_new, top_k, slots;
    double temperature, top_p;
    double eps_low, eps_high, is_cap, format_penalty;
    const char *agg;             /* aggregation name (default token-mean) */
    int no_scale, drop_uniform;
    int eval_every, eval_n;      /* held-out greedy accuracy: every N steps (0: start and end), prompts */
    const char *dump_rollouts;   /* folder: every step's rollouts as step_NNNNNNNN.json (rl/dump.h) */
    const char *dump_grads;      /* file: the first trained step's summed gradient (one process) */
    double beta;                 /* k3 KL to the --init weights (frozen reference); 0 = none */
    int routing_replay;          /* the trainer's forwards route as the rollout did */
    int speculative;             /* rollouts decode speculatively with the model's MTP block (rl/rollout.h) */
    int rollout_ranks;           /* separate deployment: the last R ranks roll out; 0 = co-located */
    int rollout_ep;              /* co-located: the rollout's routed experts split over groups of this many
                                  * consecutive ranks (a copy of the rest on each); 1 = a whole copy per rank */
    int rollout_tp;              /* co-located: the rollout's attention heads and dense FFN split over groups of
                                  * this many consecutive ranks (tensor parallelism, no SP); 1 = none */
    int max_staleness;           /* StaleSync: step n trains on rollouts of version >= n - 1 - s (0: synchronous) */
    int stale_free;              /* separate: sample with the newest version arrived (else exactly n - 1 - s) */
    int no_is_weight;            /* w_t = 1: no truncated importance weight (the ablation) */
    int profile;                 /* a Chrome trace per rank: OUT/trace_rank<R>.json */
} mt_rl_opts;

void mt_rl_defaults(mt_rl_opts *o);
/* Runs RL; 0, or -1 with mt_last_error() set. */
int mt_rl(const mt_rl_opts *o);

#endif
