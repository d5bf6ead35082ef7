/* train/trainer.h — training of a Mixture-of-Experts model: a trainer object that takes
 * optimizer steps on batches it is given, and the run driver `moetrain train` uses.
 *
 * The trainer (mt_trainer_*) owns the layout, the model's part on this rank, its optimizer
 * state, the pipeline and the data; mt_trainer_step runs one optimizer step on a batch its
 * caller chose (the run driver samples the data; reinforcement learning will pass its own).
 * A step is forward + backward of every micro-batch through the pipeline schedule
 * (train/pipeline.h), gradient reduction, the global norm, clipping and AdamW
 * (train/optimizer.h), skipped when the loss or the norm is not finite. Checkpoints are
 * written in the single-process format from any layout (train/saveload.h).
 *
 * mt_train is the run driver: it samples each step's micro-batches, keeps the cadence of
 * evaluation, checkpoints and progress lines, and reports (train/report.h).
 *
 * Under mpirun the world is PP stages x DP ranks (parallel/dist.h), with the experts of each
 * stage spread over EP groups carved out of its DP ranks. A step's global batch is
 * batch x accum x DP sequences, DP rank r running micro-batch mb on samples
 * samples + (r*accum + mb)*batch, so the ranks see exactly what one process sees with
 * accum*DP micro-batches. Every mt_trainer_* call is collective over the world unless said
 * otherwise; rank 0 prints, writes metrics and writes checkpoints. */
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
    int eot;                 /* end-of-text token id for doc_mode (default: the data's tokenizer's, 256 for bytes) */
    int quiet;
    int allow_nonfinite;     /* load a checkpoint with NaN/Inf values (with a warning) instead of refusing it */
    int dist_opt;            /* ZeRO-1: shard the AdamW state and update over DP */
    double bucket_mb;        /* gradient all-reduce bucket size in MiB (default 25) */
    int pp, vpp, ep, tp;     /* pipeline stages, chunks per stage, expert-parallel size, tensor-parallel size */
    int sp;                  /* sequence parallelism (with tp > 1) */
    int bf16;                /* mixed precision: GEMM operands rounded to bf16, fp32 sums and master weights */
    int rows_fwd;            /* fp32: the forward's products on the decoder's few-row kernel (kernels/rows.h), so
                              * the forward's log-probs are the rollout's bits (RL); the backward keeps OpenBLAS */
    const char *split;       /* layers per virtual stage ("3,2,2,1"); NULL = even */
    const char *a2a;         /* "hier" (default) or "flat" */
    const char *flashcomm;   /* "int8": the TP all-reduces as FlashComm (parallel/tp.h); NULL or "off": fp32 */
    const char *flashcomm_ep; /* "int8": the expert dispatch's token rows as INT8 (parallel/a2a.h); NULL or "off" */
    int ranks_per_node;      /* > 0: emulated node size for the hierarchical all-to-all */
    const char *wire;        /* "GBPS[,US]": the emulated inter-node link (parallel/wire.h); NULL: none */
    const char *overlap;     /* "block" (default: the MoE block computes its shared experts while the
                              * combine / gather is in flight) or "off" (every exchange completes at once) */
    uint64_t args_hash;      /* hash of the command-line flags (ranks must agree) */
    int external_batches;    /* the caller makes every batch (RL): no token shards are read */
    const char *expert_placement; /* "contiguous" (default) or "shuffled:SEED" (mt_expert_map) */
    int expert_balance;      /* > 0: steps between expert re-placements from the load (train/balance.h) */
    const char *aux_scope;   /* balance loss scope: "sequence" (default) or "ep-group" (enum mt_aux_scope) */
    const char *init_scheme; /* "default" (every matrix N(0, std^2)) or "tiny" (TinyInit: the embedding's std 0.5) */
    /* given on the command line: with --resume these override the checkpoint's settings */
    int set_lr, set_batch, set_seq, set_accum, set_warmup, set_wd, set_clip;
    int set_steps, set_seed, set_min_lr, set_beta1, set_beta2, set_doc_mode, set_eot, set_bf16;
    int set_log_every, set_eval_every, set_eval_windows, set_save_every, set_keep, set_max_bad, set_load_every;
    int set_profile, set_plot, set_expert_balance;
    /* where a resume keeps the strings it restores (--metrics, --recompute, --expert-placement,
     * --aux-scope, --init-scheme) */
    char resumed_metrics[4096], resumed_recompute[32], resumed_placement[64], resumed_aux_scope[16];
    char resumed_init_scheme[16];
} mt_train_opts;

void mt_train_defaults(mt_train_opts *o);
/* Runs training; returns 0 on success, -1 with mt_last_error() set. */
int mt_train(const mt_train_opts *o);

typedef struct mt_trainer mt_trainer;

/* Where training stands: what trainer_state.json keeps besides the options. */
typedef struct {
    int step;                /* optimizer steps taken (skipped ones included); the next is step + 1 */
    int opt_step;            /* AdamW updates applied: the bias-correction step */
    uint64_t samples;        /* sequences stepped on: the run driver's position in the data */
    int bad;                 /* non-finite steps in a row */
} mt_trainer_state;

/* This DP rank's micro-batches of one step, micro-batch mb at offset mb*B*T of each array:
 * tokens, targets (< 0: ignored) and document positions (NULL unless doc mode; with
 * o->doc_mode they must be given). Every pipeline stage needs the whole batch. Its shape is
 * the one the trainer was built for (o->accum x o->batch x o->seq). The loss is
 * cross-entropy over the valid targets, or with obj a per-token objective of the targets'
 * log-probs (RL, kernels/ops.h: token mb*B*T + b*T + t of this rank's batch); fed (NULL:
 * every position) gives the real positions of each row [n_micro*B]: the balance loss counts
 * only those, averaged over the rows with any (the global batch's). */
typedef struct {
    int n_micro, B, T;
    const int32_t *in, *tg, *pos;
    const struct mt_head_obj *obj;
    const int32_t *fed;
    const int32_t *replay;   /* routing replay per token, replay_stride ints (mt_loss); NULL: none */
    int replay_stride;
} mt_batch;

/* One step's figures, the same on every rank (global batch). */
typedef struct {
    int step;                /* the step just taken (mt_trainer_state.step) */
    double loss;             /* ce + mtp_loss_weight x mtp + aux_loss_alpha x balance */
    double ce, balance;      /* mean CE over the valid targets; balance loss summed over MoE layers */
    double mtp;              /* the MTP blocks' mean CE (each over its own valid targets), averaged
                              * over the blocks; 0 without them (or when they did not run: RL) */
    double grad_norm;        /* global gradient norm, before clipping */
    double lr;               /* learning rate of the update (the schedule's at this step) */
    int finite;              /* loss and norm finite; 0: the update was skipped */
    int64_t n_valid;         /* valid targets (the CE normaliser) */
    size_t tokens;           /* tokens of the global batch */
} mt_step_result;

/* Builds a trainer from options (collective): the layout, the config (resume > init >
 * --config, a resume restoring the run's settings and position), the data, the model's part
 * on this rank with its weights (initialised or loaded), the optimizer and the pipeline.
 * Checks the options and that every rank agrees. Returns 0, or -1 with mt_last_error() set
 * and *t NULL. */
int mt_trainer_init(mt_trainer **t, const mt_train_opts *o);
void mt_trainer_free(mt_trainer *t);
/* The options in force (a resume's settings, defaults resolved), the model config and
 * where training stands (local, no communication). */
const mt_train_opts *mt_trainer_opts(const mt_trainer *t);
const mt_config *mt_trainer_config(const mt_trainer *t);
const mt_trainer_state *mt_trainer_get_state(const mt_trainer *t);
/* This rank's part of the model (the whole model under pure data parallelism): what a
 * rollout on the same ranks samples from. */
mt_model *mt_trainer_model(mt_trainer *t);
/* 1 when this rank's part is the whole model (no TP, PP or EP). */
int mt_trainer_holds_whole(const mt_trainer *t);
/* Every rank: full = the whole model's current weights in checkpoint order (the layout of
 * mt_model_init_infer's buffer), sent point to point from the parts (collective). */
void mt_trainer_gather_whole(mt_trainer *t, float *full);
/* The same on the trainer's rank 0 only (full unused elsewhere), and the whole model's floats. */
void mt_trainer_gather_whole_root(mt_trainer *t, float *full);
size_t mt_trainer_whole_floats(const mt_trainer *t);
/* RL's switch to the rollout layout (collective): mt_trainer_gather_whole into full, then
 * the trainer parks what it does not need until its next step: its part's parameters (full
 * holds them), gradients and activations give their pages back. mt_trainer_from_rollout
 * restores the part's parameters from full (local copies; full unchanged since), after
 * which full may be released. Nothing else may run on the trainer in between. */
void mt_trainer_to_rollout(mt_trainer *t, float *full);
/* The switch to a rollout layout whose part roll (whole tensors: no TP or PP; its routed
 * experts split over a group) this rank holds: roll->params filled from the trainer's parts,
 * each rank receiving only roll's tensors (collective); gradients and activations parked as
 * above, the part's own parameters kept (roll cannot restore them), so no switch back. */
void mt_trainer_to_rollout_part(mt_trainer *t, mt_model *roll);
/* buf (laid out like this rank's part, nparams floats) = the weights of checkpoint ckpt (a
 * run or step folder of the same architecture), under any layout (collective). RL reloads
 * its frozen reference this way when it resumes. */
int mt_trainer_load_params(mt_trainer *t, const char *ckpt, float *buf);
void mt_trainer_from_rollout(mt_trainer *t, const float *full);

/* One optimizer step on batch b: forward and backward of every micro-batch through the
 * pipeline schedule, gradient reduction, global norm, clipping and AdamW at the learning
 * rate of the schedule (mt_lr_at); the update is skipped (state.bad counts it) when the
 * loss or the norm is not finite. Fills *r. -1 (before any collective) when b does not have
 * the trainer's shape. */
int mt_trainer_step(mt_trainer *t, const mt_batch *b, mt_step_result *r);
/* Forward only of batch b (its shape as for a step, obj required): the objective's fn sees
 * every target's log-prob under the current weights; nothing changes (collective). */
int mt_trainer_logprobs(mt_trainer *t, const mt_batch *b);
/* Mean validation CE over the first `windows` windows of val (all when <= 0), in
 * micro-batches of o->batch (document mode with o->doc_mode), split over the DP ranks,
 * under any layout. */
struct mt_loader;
double mt_trainer_eval(mt_trainer *t, const struct mt_loader *val, int64_t windows);
/* Writes checkpoint OUT/step_NNNNNNNN of the current step (rank 0 writes the whole model,
 * moments and trainer_state.json), points OUT/latest at it and prunes older ones (--keep).
 * dir gets its path. Returns -1 on rank 0 when writing failed. */
int mt_trainer_save(mt_trainer *t, char *dir, size_t cap);
/* Expert load since the last call (tokens per expert, layer-major [L*E], over the global
 * batch; on every rank); resets the counters. */
void mt_trainer_expert_load(mt_trainer *t, int64_t *load);
/* The experts' load imbalance over the EP ranks (1 without EP). */
double mt_trainer_ep_imbalance(mt_trainer *t);
/* --expert-balance: places every MoE layer's experts anew from the window's load and moves
 * those that change rank (train/balance.h); collective over all ranks. moved: experts moved;
 * busy_before / after: over the MoE layers, the sum of the busiest EP rank's tokens in the
 * window over the sum of the ranks' mean, under the old and the new placement. */
typedef struct {
    int moved;
    double busy_before, busy_after;
} mt_balance_stats;
void mt_trainer_balance(mt_trainer *t, mt_balance_stats *bs);

/* Learning rate at step s (1-based) of total: linear warmup then cosine to min_ratio*lr. */
double mt_lr_at(int s, int total, int warmup, double lr, double min_ratio);

/* Mean validation CE over the first `windows` windows (file order) of the val split
 * (all when windows <= 0), micro-batches of B; doc_eot >= 0 evaluates in document mode.
 * One process, the whole model (moetrain eval). */
double mt_eval_loss(mt_model *m, mt_acts *a, const struct mt_loader *val, int B, int T, int64_t windows,
                    int32_t doc_eot);

#endif
