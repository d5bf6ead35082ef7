/* train/optimizer.h — the trainer's optimizer over this rank's part of the model: gradient
 * reduction, the global gradient norm, clipping and AdamW.
 *
 * The flat parameter buffer (model/model.h: [TP slices | replicated | routed experts]) is cut
 * into three regions, each reduced over its own group: the TP slices over DP, the replicated
 * tensors over DP (x TP with sequence parallelism, where every TP rank saw other tokens), the
 * routed experts held here over the expert-DP group. Without dist_opt each region is summed
 * in buckets and every rank updates all of it; with dist_opt (ZeRO-1) it is reduce-scattered,
 * each rank keeps the AdamW moments of its shard only and updates that, then the parameters
 * are all-gathered. The reductions go in buckets that can start during the backward and the
 * all-gather can be left for the next forward (below): the same buckets either way, so the
 * same bits. */
#ifndef MT_TRAIN_OPTIMIZER_H
#define MT_TRAIN_OPTIMIZER_H

#include <stddef.h>

#include "parallel/dist.h"
#include "model/model.h"

/* One region of the flat buffer with the group its gradients are reduced over. */
typedef struct {
    size_t lo, n;                 /* range of the flat buffer */
    size_t olo, on;               /* the optimizer's range: all of it, or this rank's shard (dist_opt) */
    mt_group *g;
    float *m, *v;                 /* AdamW moments [on] */
    float *grange;                /* dist_opt: this rank's shard of the summed gradient */
    int nt;                       /* tensor table for the optimizer, clipped to [olo, olo+on) and */
    size_t *t_off, *t_len;        /* relative to olo */
    int *t_decay;
    int nn;                       /* what the gradient norm counts: contiguous runs of the table */
    size_t *n_off, *n_len;        /* without replicas (the tied embedding's copy), relative to olo */
} mt_opt_region;

enum { MT_OPT_REGIONS = 3 };      /* TP slices, replicated, routed experts */

/* MPI's non-blocking all-reduce keeps scratch of its message's size until it completes
 * (Open MPI's libnbc: the whole message; half with its ring), so at most this many bytes of
 * all-reduce buckets (or one bucket, if larger) stay in flight: the oldest complete in MPI
 * before another starts. The emulated wire's time still counts at the end. The environment
 * variable MT_BUCKET_INFLIGHT_MB sets another bound (the tests make every bucket wait). */
#define MT_OPT_INFLIGHT_BYTES ((size_t)64 << 20)

/* A gradient bucket: part [b0, b1) of a region, reduced by one collective. */
typedef struct {
    int reg;
    size_t b0, b1;                /* relative to the region's lo */
    mt_coll c;                    /* its gradients' reduction */
    mt_coll ag;                   /* ZeRO-1: its parameters' all-gather */
} mt_grad_bucket;

typedef struct {
    mt_opt_region reg[MT_OPT_REGIONS];
    float *mom_m, *mom_v;         /* without dist_opt: every region's moments, laid out like the parameters */
    int dist_opt;
    int tp_dup[MT_OPT_REGIONS];   /* the region is the same on every TP rank (TP without SP) */
    int tp_rank;
    size_t bytes;                 /* this rank's moments */
    /* the gradient buckets (cut by the first mt_optim_reduce_start): a region's buckets run
     * from its end down, as the backward finishes its layers */
    size_t bucket_bytes;
    mt_grad_bucket *bk;
    int nbk;
    int first_bk[MT_OPT_REGIONS + 1]; /* region r's buckets: bk[first_bk[r] .. first_bk[r+1]) */
    int *issue;                   /* [nbk] buckets in the order they were started this step */
    int nissued;
    int mpi_done;                 /* issue[0 .. mpi_done) are complete in MPI (all-reduce only) */
    size_t inflight;              /* bytes of the all-reduces started and not complete in MPI */
    size_t inflight_max;          /* the bound; 0: MT_OPT_INFLIGHT_BYTES (the trainer sets MT_BUCKET_INFLIGHT_MB's) */
    int next_bk[MT_OPT_REGIONS];  /* region r's next bucket to start (counting down) */
    /* readiness: region r's tensors, by offset, and how far down its gradients are final */
    int nrt[MT_OPT_REGIONS];
    size_t *rt_off[MT_OPT_REGIONS];  /* tensor start, relative to the region's lo */
    int *rt_layer[MT_OPT_REGIONS];   /* its layer; -1: at the end only (embedding); -2: after any layer */
    int rt_next[MT_OPT_REGIONS];     /* the next tensor (counting down) not yet final */
    unsigned char layer_done[1024];
    int any_layer;
    /* ZeRO-1 with defer_params: the parameter all-gather left in flight after the update,
     * each region's buckets waited for in order (ag_next) as the next forward reaches them */
    int defer_params, ag_pending;
    int ag_next[MT_OPT_REGIONS];
} mt_optim;

/* AdamW's hyper-parameters (the learning rate is given per step). */
typedef struct {
    double beta1, beta2, eps, wd;
    double clip;                  /* global gradient-norm clip, 0 = off */
} mt_adamw_hp;

/* Sets up the regions of model m (this rank's part) in layout d, the moments zeroed. */
void mt_optim_init(mt_optim *op, const mt_model *m, mt_dist *d, int dist_opt);
void mt_optim_free(mt_optim *op);

/* Gradient buckets of bucket_bytes: mt_optim_reduce_start before every step's backward (the
 * first call cuts them); with train --overlap block / pipe, mt_optim_layer_done(layer) after a layer's last backward of the step (every
 * gradient of its tensors final) starts the buckets that are now final and polls those in
 * flight. Every rank of a group must start the same buckets in the same order: the same layers
 * finish in the same order on the ranks of a DP / expert-DP group. */
void mt_optim_reduce_start(mt_optim *op, const mt_model *m, size_t bucket_bytes);
void mt_optim_layer_done(mt_optim *op, mt_model *m, int layer);
/* Sums the gradients of the whole backward (collective): the tied embedding's two copies
 * (first and last pipeline stage), then every region over its group (dist_opt: this rank's
 * shard of the sum only), in the buckets, those not started during the backward
 * started now; returns when all are done. The buckets are the same with or without the
 * overlap, so are the sums, bit for bit. */
void mt_optim_reduce(mt_optim *op, mt_model *m, mt_dist *d);
/* The global gradient norm after mt_optim_reduce (collective over the world): every
 * parameter counted once. */
double mt_optim_grad_norm(const mt_optim *op, const mt_model *m, mt_dist *d);
/* One AdamW update at bias-correction step `step` with the gradients scaled by the clip
 * (grad_norm above hp->clip), then (dist_opt) the updated shards all-gathered: with
 * defer_params left in flight, in buckets, for the next forward (mt_optim_params_ready). */
void mt_optim_update(mt_optim *op, mt_model *m, const mt_adamw_hp *hp, double lr, double grad_norm, int step);

/* defer_params: waits for the parameter buckets that layer `layer` (INT_MAX: every one) and
 * everything before it in the buffer need (the first layer's call covers the embedding).
 * Anything that reads the parameters other than the next step's forward calls it with
 * INT_MAX first. Without a pending all-gather it returns at once. */
void mt_optim_params_ready(mt_optim *op, int layer);

/* dist_opt: this rank's moments laid out like its parameters (fm, fv of m->nparams), the
 * regions' shards all-gathered over their groups (collective); and back. */
void mt_optim_moments_full(mt_optim *op, float *fm, float *fv);
void mt_optim_moments_take(mt_optim *op, const float *fm, const float *fv);
/* The same for region r alone, into fm, fv of reg[r].n floats (fm[0]: the region's start). */
void mt_optim_region_full(mt_optim *op, int r, float *fm, float *fv);
void mt_optim_region_take(mt_optim *op, int r, const float *fm, const float *fv);

#endif
