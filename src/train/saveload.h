/* train/saveload.h — checkpoints of a training run under any parallel layout: the whole
 * model (and its AdamW moments) gathered to world rank 0, which writes the single-process
 * format (train/checkpoint.h), and scattered back on load, so a run resumes under any
 * layout; trainer_state.json to and from the options; pruning of old checkpoints. */
#ifndef MT_TRAIN_SAVELOAD_H
#define MT_TRAIN_SAVELOAD_H

#include <stddef.h>

#include "data/tokenizer.h"
#include "parallel/dist.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"

/* This rank's part of the model next to the whole model's table. */
typedef struct {
    mt_model *m;               /* this rank's part (parameters) */
    mt_optim *opt;             /* its AdamW moments */
    mt_tensor *full_t;         /* the whole model's tensor table (checkpoint order) */
    int nfull_t;
    size_t nfull;              /* floats of the whole model */
    int whole;                 /* this rank holds the whole model (no TP, PP or EP) */
} mt_ckpt_layout;

/* Writes checkpoint folder dir of the whole model with state_json and tokenizer tk (used on
 * world rank 0 only) from world rank 0 (collective). Returns -1 on rank 0 when writing failed. */
int mt_ckpt_save_dist(const mt_ckpt_layout *l, mt_dist *d, const char *dir, const char *state_json,
                      const mt_tokenizer *tk);
/* Loads the weights (and, when resume, the AdamW moments) of checkpoint dir into this
 * rank's part (collective); cfg is the checkpoint's config. An error on rank 0 is an error
 * on every rank; non-finite values are one unless allow_nonfinite (mt_ckpt_load_weights). */
int mt_ckpt_load_dist(const mt_ckpt_layout *l, mt_dist *d, const char *dir, const mt_config *cfg, int resume,
                      int allow_nonfinite);

/* Every rank: full[nfull] = the whole model's parameters in checkpoint order, assembled
 * point to point from the ranks' parts (collective over the world). */
void mt_ckpt_allgather_whole(const mt_ckpt_layout *l, mt_dist *d, float *full);
/* The same into another layout's part dst (whole tensors only, e.g. an EP rollout copy):
 * dbuf laid out like dst, each rank receiving only what dst holds (collective). */
void mt_ckpt_allgather_part(const mt_ckpt_layout *l, mt_dist *d, const mt_model *dst, float *dbuf);
/* The same on world rank 0 only (full unused elsewhere). */
void mt_ckpt_gather_whole(const mt_ckpt_layout *l, mt_dist *d, float *full);

/* trainer_state.json of a run at state s with options o over dp data-parallel ranks
 * (malloc'd string); with --expert-balance's placement slots[n] and window load[n] (slots
 * NULL: none). */
char *mt_train_state_to_json(const mt_train_opts *o, const mt_trainer_state *s, int dp, const int32_t *slots,
                             const int64_t *load, size_t n);
/* Restores s (step, opt_step, samples) and the options not given on the command line from
 * the trainer_state.json text (len bytes) of checkpoint dir; the global batch (batch x
 * accum x DP) is kept under any DP unless --accum is given. Strict JSON, and every field
 * is checked (type, integer-ness, range; docs/FORMATS.md 4.5) even when a flag overrides
 * it: an error names the file and the key. */
int mt_train_state_from_json(const char *dir, const char *txt, size_t len, mt_train_opts *o, mt_trainer_state *s,
                             int dp);

/* --expert-balance's state in trainer_state.json: the placement slots[L*E] (mt_expert_map's
 * slot_of) and the window's load[L*E] counted since the last re-placement (both NULL when the
 * file has none; -1 with an error naming the file and key when malformed: not n values, or a
 * layer's slots not a permutation of 0 .. E-1). E > 0, within the model's limits. */
int mt_train_state_get_placement(const char *dir, const char *txt, size_t len, int E, size_t n, int32_t **slots,
                                 int64_t **load);

/* After saving checkpoint `saved` (a step_NNNNNNNN name in run folder out): keeps it and the
 * newest keep - 1 checkpoints of earlier steps, removes the earlier others. */
void mt_ckpt_prune(const char *out, int keep, const char *saved);

#endif
