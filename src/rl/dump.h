/* rl/dump.h — what `moetrain rl` records of a step for an independent implementation
 * (docs/FORMATS.md 8.1): the rollout dump (--dump-rollouts DIR: DIR/step_NNNNNNNN.json per
 * step) and the first step's gradient (--dump-grads FILE.safetensors).
 *
 * rl.c packs every completion of the step into one record of doubles (so that the DP ranks'
 * records gather with one fixed-size mt_group_gather_f64; token ids and fp32 values are
 * exact in a double) and rank 0 writes the file from the gathered records. */
#ifndef MT_RL_DUMP_H
#define MT_RL_DUMP_H

#include <stdint.h>

#include "data/prompts.h"
#include "model/model.h"

/* A completion's record: MT_RLREC_HEAD fields, then tokens[max_new], logp_behav[max_new],
 * logp_old[max_new] (the first n of each used; logp_old NaN where none was computed). */
enum {
    MT_RLREC_PROMPT = 0, MT_RLREC_SAMPLE, MT_RLREC_N, MT_RLREC_EOT, MT_RLREC_REWARD, MT_RLREC_ADV, MT_RLREC_KEPT,
    MT_RLREC_VERSION, MT_RLREC_HEAD
};
static inline int mt_rlrec_stride(int max_new) { return MT_RLREC_HEAD + 3 * max_new; }

typedef struct {
    int step, version;          /* the step; the policy version it started from (a token's is in its record) */
    const char *checkpoint;     /* the checkpoint holding those weights, NULL when none was saved */
    const char *prompts;        /* the prompt file */
    int prompts_per_step, group;
    int bf16;                   /* the rollout and the trainer ran bf16 products */
    /* sampling */
    double temperature, top_p;
    int top_k, max_new, eot;
    uint64_t seed;
    /* loss */
    double eps_low, eps_high, beta, is_cap, alpha, format_penalty;
    const char *agg;
    int scale, drop_uniform;
    /* what the step recorded */
    int trained, finite;        /* the trainer ran (some completion kept); its update was finite */
    int64_t completions, completion_tokens; /* kept ones, the loss's denominators */
    double loss, pg, kl, clip_fraction, ratio_dev, old_behav_max, balance, grad_norm;
} mt_rl_dump_step;

/* Writes path (via path.tmp + rename) from n records of the given stride, prompt tokens
 * and answers looked up in ps by prompt index. 0, or -1 with an error naming path. */
int mt_rl_dump_write(const char *path, const mt_rl_dump_step *s, const double *rec, int n, int stride,
                     const mt_prompt_set *ps);

/* The model's gradient buffer (this process's whole model) as a safetensors file with the
 * checkpoint's tensor names and order. 0, or -1 with an error. */
int mt_rl_dump_grads(const char *path, const mt_model *m);

#endif
