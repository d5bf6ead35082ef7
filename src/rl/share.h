/* rl/share.h — what the rollout and the trainer of `moetrain rl` exchange (rl/rl.c runs the
 * loop): the prompt order, each rollout rank's share of a step's prompts, the completions as
 * fixed-size records, held-out evaluation, and both sides of a separate deployment
 * (--rollout-ranks: the rollout ranks' loop, the trainer's messages to it). */
#ifndef MT_RL_SHARE_H
#define MT_RL_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "data/prompts.h"
#include "parallel/dist.h"
#include "rl/rl.h"
#include "rl/rollout.h"
#include "train/trainer.h"

/* The k-th prompt drawn: an epoch-wise permutation of the n prompts, seeded per epoch. */
typedef struct {
    int64_t n, epoch;
    uint64_t seed;
    int64_t *perm;           /* the current epoch's (malloc'd on first use; free it) */
} mt_prompt_order;
int64_t mt_prompt_order_at(mt_prompt_order *po, int64_t k);

/* The requests of rollout rank r of R at step (its P / R prompts, G samples each); ptok[P/R]
 * hold the prompts' tokens (grown as needed). */
void mt_rl_share_requests(mt_prompt_order *po, const mt_prompt_set *ps, const mt_rl_opts *o, int step, int r, int R,
                          int32_t **ptok, mt_rollout_req *req);

/* Greedy accuracy on the first n held-out prompts, split over the ranks of d's world, each
 * sampling from its whole copy m (collective). */
double mt_rl_heldout_accuracy(mt_model *m, const mt_prompt_set *ev, int n, int max_new, int slots, int bf16,
                              mt_dist *d);

/* Completions travel between ranks as records of rec_n int32: n, eot, tokens[max_new],
 * log-prob bits[max_new], routing[replay_stride x (longest prompt + max_new - 1)]. */
typedef struct {
    size_t rec_n;
    int max_new, replay_stride;
} mt_rl_rec_shape;
/* The records of a run: cfg's MoE layers x top-k expert ids per routed position when the
 * run replays the routing, prompts of at most `longest` tokens. */
mt_rl_rec_shape mt_rl_rec_shape_of(const mt_config *cfg, const mt_rl_opts *o, size_t longest);
/* out[n] = the records of co[n] (their requests req[n]), which are freed. */
void mt_rl_pack_records(const mt_rl_rec_shape *sh, mt_completion *co, const mt_rollout_req *req, int n, int32_t *out);
/* co[n] = the records in[n] (their prompts' requests req[n] give the routing's length). */
void mt_rl_unpack_records(const mt_rl_rec_shape *sh, const int32_t *in, const mt_rollout_req *req, int n,
                          mt_completion *co);

/* Whether the held-out accuracy is evaluated after step (of steps). */
int mt_rl_eval_due(const mt_rl_opts *o, int step, int steps);

/* Separate deployment. The rollout ranks' side (after mt_dist_set_role): the plan (start
 * step, steps, seed, precision) from the trainer, then per step the weights, every rank's
 * share sampled, the records of every completion back; held-out evaluations on the
 * trainer's schedule. The trainer's side: its rank 0 (job rank 0) talks to the rollout
 * ranks' rank 0 (job rank rollout_lead). */
int mt_rl_rollout_server(const mt_rl_opts *o, mt_dist *d, const mt_prompt_set *ps, const mt_prompt_set *ev,
                         size_t longest);
enum { MT_RL_TAG_PLAN = 11, MT_RL_TAG_WEIGHTS, MT_RL_TAG_RECORDS, MT_RL_TAG_ACC };
/* The current weights to the rollout ranks (gathered on the trainer's rank 0; whole holds
 * them there, unused elsewhere). Collective over the trainer's ranks. */
void mt_rl_send_weights(mt_trainer *t, mt_dist *d, float *whole, int rollout_lead);
/* The held-out accuracy of the current weights, evaluated by the rollout ranks. */
double mt_rl_remote_accuracy(mt_trainer *t, mt_dist *d, float *whole, int rollout_lead);

#endif
