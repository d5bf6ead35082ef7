/* train/trainer.h — the training loop: micro-batches with gradient accumulation,
 * global-norm clipping, AdamW with warmup + cosine LR, non-finite step skipping, periodic
 * checkpoints, progress line, JSONL metrics, expert-load reports.
 *
 * Under mpirun the world is PP stages x DP ranks (dist/dist.h), with the experts of each
 * stage spread over EP groups carved out of its DP ranks. A step's global batch is
 * batch x accum x DP sequences, DP rank r running micro-batch mb on samples
 * samples + (r*accum + mb)*batch, so the ranks see exactly what one process sees with
 * accum*DP micro-batches. Each stage runs its part of the pipeline schedule
 * (train/pipeline.h; accum = micro-batches). Gradients of the dense part are summed over
 * DP, those of the experts over the expert-DP group, in buckets, or, with dist_opt (ZeRO-1),
 * reduce-scattered so each rank keeps AdamW moments and does the update for its shard only,
 * then the parameters are all-gathered. Rank 0 prints, writes metrics and writes
 * checkpoints in the single-process format (every rank's tensors and moments gathered
 * first), so a run resumes under any layout. */
#ifndef MT_TRAIN_TRAINER_H
#define MT_TRAIN_TRAINER_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    const char *config;      /* config.json path (or preset resolved by the CLI) */
    const char *data;        /* shard folder */
    const char *out;         /* run folder */
    const char *resume;      /* run or checkpoint folder to resume exactly */
    const char *init;        /* checkpoint whose weights start a new run */
    const char *metrics;     /* JSONL path (default out/metrics.jsonl) */
    int steps, batch, seq, accum, threads;
    uint64_t seed;
    double lr, min_lr_ratio, wd, beta1, beta2, eps, clip, init_std;
    double peak_gflops;      /* MFU denominator; 0 = measure an SGEMM at start-up */
    int warmup;
    int log_every, eval_every, eval_windows, save_every, keep, max_bad, load_every;
    int plot;                /* draw loss.png with gnuplot at the end */
    int profile;             /* per-step breakdown + OUT/trace_rank<R>.json (Chrome trace) */
    int doc_mode;            /* attention and positions restart after every eot token */
    const char *recompute;   /* memory policy: "none" (default) or "selective" */
    int eot;                 /* end-of-text token id for doc_mode (default 256: byte tokenizer) */
    int quiet;
    int dist_opt;            /* ZeRO-1: shard the AdamW state and update over DP */
    double bucket_mb;        /* gradient all-reduce bucket size in MiB (default 25) */
    int pp, vpp, ep, tp;     /* pipeline stages, chunks per stage, expert-parallel size, tensor-parallel size */
    int sp;                  /* sequence parallelism (with tp > 1) */
    int bf16;                /* mixed precision: GEMM operands rounded to bf16, fp32 sums and master weights */
    const char *split;       /* layers per virtual stage ("3,2,2,1"); NULL = even */
    const char *a2a;         /* "hier" (default) or "flat" */
    int ranks_per_node;      /* > 0: emulated node size for the hierarchical all-to-all */
    uint64_t args_hash;      /* hash of the command-line flags (ranks must agree) */
    /* given on the command line: with --resume these override the checkpoint's settings */
    int set_lr, set_batch, set_seq, set_accum, set_warmup, set_wd, set_clip;
    int set_steps, set_seed, set_min_lr, set_beta1, set_beta2, set_doc_mode, set_eot, set_bf16;
} mt_train_opts;

void mt_train_defaults(mt_train_opts *o);
/* Runs training; returns 0 on success, -1 with mt_last_error() set. */
int mt_train(const mt_train_opts *o);

/* Learning rate at step s (1-based) of total: linear warmup then cosine to min_ratio*lr. */
double mt_lr_at(int s, int total, int warmup, double lr, double min_ratio);

/* Mean validation CE over the first `windows` windows (file order) of the val split
 * (all when windows <= 0), micro-batches of B; doc_eot >= 0 evaluates in document mode. */
struct mt_loader;
double mt_eval_loss(mt_model *m, mt_acts *a, const struct mt_loader *val, int B, int T, int64_t windows,
                    int32_t doc_eot);

#endif
