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
#include "parallel/distqueue.h"
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

/* The requests of share r of R of step's prompts (its P / R prompts, G samples each: a
 * rollout rank's, or a training DP index's); ptok[P/R] hold the prompts' tokens (grown as
 * needed). */
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

/* Separate deployment (--rollout-ranks R): the last R ranks roll out, the others train, and
 * the completions travel through a DistQueue (parallel/distqueue.h) whose controller is the
 * trainer's rank 0: sample id = (round x P + prompt) x G + sample, where round n holds the
 * prompts of training step n; field 0 the record above (version: the policy that sampled
 * it), field 1 its score. The trainer sends every version it makes, start .. steps - 1 (and
 * steps when it evaluates), each as a header (version, evaluate?, floats) and the weights,
 * non-blocking to every rollout rank; those evaluate a version when asked and send the
 * accuracy back. Round n is sampled with version max(start, n - 1 - max_staleness); with
 * stale_free, with the newest version that has arrived by then (never an older one). */
enum { MT_RL_FIELD_RECORD = 0, MT_RL_FIELD_SCORE, MT_RL_NFIELDS };
/* score: reward, seconds of the rollout that sampled it, the rollout rank's wait for weights
 * before it, and its wait for room in the queue since its previous completion */
enum { MT_RL_SCORE_REWARD = 0, MT_RL_SCORE_ROLLOUT_S, MT_RL_SCORE_WAIT_WEIGHTS, MT_RL_SCORE_WAIT_ROOM, MT_RL_NSCORE };
enum { MT_RL_TAG_PLAN = 11, MT_RL_TAG_WEIGHTS, MT_RL_TAG_ACC, MT_RL_TAG_WHDR };
/* Separate deployment: the trainer's rank 0 sends the order its expert exchange sums in
 * (none without EP) after the plan, and the rollout ranks' copy sums in it (mt_sum_order):
 * the rollout's log-probs then have the trainer's bits. */
void mt_rl_send_sum_order(mt_dist *d, const mt_model *m, int rollout_lead);
/* How many versions the trainer sends, and whether it asks for version v's accuracy. */
int mt_rl_versions_sent(int start, int steps, int eval_on);
int mt_rl_version_evaluated(const mt_rl_opts *o, int v, int start, int steps, int eval_on);
/* The queue of a separate deployment (collective over the job). */
mt_dq *mt_rl_queue_init(mt_dist *d, const mt_rl_opts *o);
/* The rollout ranks' whole run (after mt_dist_set_role): the plan (start step, steps, seed,
 * precision) from the trainer, then the rounds. */
int mt_rl_rollout_server(const mt_rl_opts *o, mt_dist *d, const mt_prompt_set *ps, const mt_prompt_set *ev,
                         size_t longest);

/* The trainer's side: weight snapshots in flight (on its rank 0: max_staleness + 2 of them,
 * each reused once the rollout ranks took it) and the queue. */
typedef struct {
    float *w;
    int64_t hdr[3];
    mt_request *req;             /* [2R]: header and weights to each rollout rank */
} mt_rl_slot;
typedef struct {
    mt_dq *q;
    int R, lead, nslot, next;
    size_t n;                /* floats of the whole weights */
    mt_rl_slot *slot;
    double wait_s;           /* the last take's wait for its samples */
} mt_rl_link;
/* Collective over the job's trainer ranks (and the queue: over the job). */
mt_rl_link *mt_rl_link_init(mt_trainer *t, mt_dist *d, const mt_rl_opts *o, int rollout_lead);
/* The current weights as `version` to every rollout rank, without waiting for them (eval:
 * they evaluate it). Collective over the trainer's ranks. */
void mt_rl_link_send(mt_rl_link *k, mt_trainer *t, mt_dist *d, int version, int eval);
/* The accuracy of the version last sent with eval (collective over the trainer's ranks). */
double mt_rl_link_accuracy(mt_rl_link *k, mt_dist *d);
/* Every completion of round `step` (P x G, prompt-major) on every trainer rank: records
 * rec[P G rec_n], scores[P G MT_RL_NSCORE], versions[P G]; *depth: the samples left in the
 * queue after the take (rounds sampled ahead). Collective over the trainer's ranks. */
void mt_rl_link_take(mt_rl_link *k, mt_dist *d, const mt_rl_opts *o, const mt_rl_rec_shape *sh, int step,
                     int32_t *rec, double *score, int *version, double *depth);
void mt_rl_link_free(mt_rl_link *k, mt_dist *d);

#endif
