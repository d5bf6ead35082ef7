/* train/trainer_impl.h — the trainer object's fields, for the units of train/ that work on
 * it (trainer.c, run.c); everyone else goes through train/trainer.h. */
#ifndef MT_TRAIN_TRAINER_IMPL_H
#define MT_TRAIN_TRAINER_IMPL_H

#include "data/loader.h"
#include "data/tokenizer.h"
#include "parallel/a2a.h"
#include "parallel/dist.h"
#include "parallel/ep.h"
#include "parallel/tp.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/trainer.h"

struct mt_trainer {
    mt_train_opts o;              /* in force: resumed settings, defaults resolved */
    char out[4096];               /* o.out when it defaults to the resumed run's folder */
    char ckdir[4096];             /* checkpoint resumed or initialised from ("" = none) */
    mt_config cfg;
    char cfg_path[4200];          /* the file cfg was read from, for messages */
    mt_dist *d;
    mt_trainer_state st;
    int start_step;               /* st.step at start-up (a resume's step) */
    int nthr;
    mt_a2a_mode a2a_mode;
    enum { MT_OVERLAP_OFF, MT_OVERLAP_BLOCK, MT_OVERLAP_PIPE } overlap; /* train --overlap */
    int flash_ep;             /* train --flashcomm-ep int8: the dispatch rows as INT8 */
    int *bounds;                  /* layers of virtual stage s: [bounds[s], bounds[s+1]) */
    mt_model m;                   /* this rank's part */
    mt_pipe pipe;
    mt_ep ep;
    int have_ep;
    mt_tp tp;
    mt_tensor *full_t;            /* the whole model's tensor table (checkpoints, resharding) */
    size_t nfull;
    int nfull_t;
    int whole;                    /* this rank holds the whole model (no TP, PP or EP) */
    mt_optim opt;
    size_t opt_bytes;             /* AdamW moments of the fullest rank */
    size_t bucket_bytes;          /* gradient all-reduce bucket */
    mt_loader *train, *val;       /* val: NULL without a val split or --eval-every */
    mt_tokenizer tok;             /* the data's (or the checkpoint's): copied into checkpoints */
    double *red;                  /* the loss terms' reduction [1 + layers] */
    int64_t *rep_load;            /* [L*E] expert load pulled and not yet reported (--load-every) */
    int64_t *bal_load;            /* [L*E] the --expert-balance window's load (NULL: off) */
    int32_t *resume_slots;        /* [L*E] a resumed run's placement (its trainer_state.json), or NULL */
};

#endif
