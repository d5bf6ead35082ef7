/* plan/plan.h — evaluate and search parallel layouts of a model on a cluster.
 *
 * A layout is TP x PP (x VPP chunks per stage) x DP over the devices, an EP group for the
 * routed experts carved out of DP x TP, a micro-batch size, a recompute policy, a flat or
 * hierarchical expert all-to-all and a split of the layers over the P*V virtual stages.
 * Evaluating it (mt_plan_eval) checks that it divides the model and the batch, computes the
 * memory of every pipeline rank (weights, gradients, optimizer state, activations of the
 * micro-batches the schedule keeps in flight, working buffers), the modelled duration of
 * every forward and backward (roofline with efficiencies, TP / EP / PP / DP collectives),
 * then replays the schedule's action lists (parallel/schedule.h) in the simulator (plan/sim.h).
 * mt_plan_search enumerates the space and keeps the N fastest layouts that fit. */
#ifndef MT_PLAN_PLAN_H
#define MT_PLAN_PLAN_H

#include <stdio.h>

#include "model/config.h"
#include "plan/cluster.h"
#include "plan/costs.h"

enum mt_a2a { MT_A2A_FLAT = 0, MT_A2A_HIER };
enum mt_split { MT_SPLIT_EVEN = 0, MT_SPLIT_BALANCED };

enum mt_plan_reason {
    MT_PLAN_OK = 0,
    MT_PLAN_BAD_TP,      /* TP does not divide the heads, the dense FFN or the sequence (SP), or exceeds a node */
    MT_PLAN_BAD_DEVICES, /* TP x PP does not divide the devices */
    MT_PLAN_BAD_EP,      /* EP does not divide the experts or DP x TP */
    MT_PLAN_BAD_BATCH,   /* global batch not a multiple of DP x micro-batch (x PP if interleaved), or
                          * more than MT_PLAN_MAX_MICRO micro-batches */
    MT_PLAN_BAD_SPLIT,   /* fewer layers than virtual stages, VPP > 1 without PP, VPP > 255 */
    MT_PLAN_BAD_RC,      /* a recompute policy the trainer does not have (calibrated CPU files) */
    MT_PLAN_MEMORY,      /* does not fit in device memory */
    MT_PLAN_NREASONS
};
extern const char *const mt_plan_reason_name[MT_PLAN_NREASONS];

enum { MT_PLAN_MAX_STAGES = 512, MT_PLAN_MAX_MICRO = 1 << 16 };

typedef struct {
    int seq;                 /* sequence length T */
    long long global_seqs;   /* sequences per optimizer step */
    int devices;
    int elt;                 /* bytes per activation / weight element: 2 (bf16) */
    int dist_opt;            /* ZeRO-1: optimizer state sharded over (expert-)DP */
    int overlap;             /* the overlapped schedule (train --overlap pipe) on one-stage layouts */
    double imbalance;        /* dropless MoE: busiest EP rank's tokens / mean */
    /* trainer: `train --wire`: the expert exchanges between nodes over the emulated link of
     * wire_bw bytes/s and wire_lat s per message (parallel/wire.h); 0: off */
    double wire_bw, wire_lat;
    /* trainer, on the wire: `--overlap off` (blocking: the gradient buckets' wire time after
     * the backward) rather than block / pipe (buckets behind the last backward but its first
     * layer, train/optimizer.c) */
    int blocking;
    /* trainer != 0: model the moetrain trainer on a CPU cluster (a calibrated file, after
     * mt_cluster_for_device) instead of a Megatron-style GPU job: fp32 weights, gradients
     * and two AdamW moments (no master copy), with dist_opt a gradient shard buffer; the
     * activation arena of model.c (mt_acts_bytes_policy) when PP = EP = 1; MPI's
     * measured scratch and per-peer memory and the rank's measured reserve; the DP
     * reduction after the backward and the parameter all-gather after the optimizer, their
     * local copies not overlapped (their wire time under train --wire is, unless blocking);
     * the checkpoint at the end (every rank gathers the whole model's parameters
     * and moments in memory, train/saveload.c mt_ckpt_save_dist). */
    int trainer;
    int threads;             /* trainer: threads per rank (sizes the arena's per-thread scratch) */
    double bucket_bytes;     /* trainer: gradient all-reduce bucket (--bucket-mb, default 25 MiB) */
    /* trainer: `moetrain train --bf16`: every GEMM (linear layers, LM head, grouped expert
     * GEMMs) at the cluster's bf16 GEMM peak and curve (cl->gemm_bf16_peak, which must be
     * > 0); attention at its bf16-mode efficiency when the file has one (eff_att_bf16), else
     * as in fp32; element-wise work, communication and memory as in fp32; MFU against the
     * bf16 GEMM peak, as the trainer reports it */
    int gemm_bf16;
    /* the KV-cache line of the reports (not part of the training memory): decode_seqs
     * sequences decoded at once by a model replica (a TP x PP group; default 64, the rollout's
     * --slots), each of decode_positions positions (0: seq) */
    int decode_seqs, decode_positions;
} mt_plan_settings;

typedef struct {
    int tp, pp, vpp, ep, dp, mb, rc, a2a, split;
} mt_layout;

typedef struct {
    mt_layout l;
    int reason;              /* enum mt_plan_reason */
    int m;                   /* micro-batches per step */
    double step, tok_s, mfu, bubble;
    /* seconds per step on the busiest rank: compute (incl. recompute), exposed TP
     * collectives, exposed all-to-all, exposed pipeline p2p, exposed DP reduction and
     * parameter gather, optimizer */
    double t_compute, t_tp, t_a2a, t_p2p, t_dp, t_opt;
    double exposed_comm;     /* t_tp + t_a2a + t_p2p + t_dp */
    /* memory of the fullest pipeline rank, bytes */
    int mem_rank;
    double mem_total, mem_weights, mem_grads, mem_opt, mem_acts, mem_work, mem_comm, mem_reserved;
    double mem_step;         /* the training step's peak (= mem_total unless the checkpoint is higher) */
    double mem_ckpt;         /* trainer: peak while writing the checkpoint (0 if not modelled) */
    double mem_ckpt_extra;   /* trainer: of which the checkpoint's own buffers */
    int gemm_bf16;           /* the settings' gemm_bf16 (the train flags get --bf16) */
    /* KV cache of decoding the settings' decode_seqs x decode_positions with the layout's
     * split, elt bytes a value (model/sizes.h mt_kv_cache_bytes, the rollout engine's size
     * function): on pipeline rank kv_rank, the one with the most decoder layers (kv_layers),
     * per device (a per-head cache is split over TP, MLA's absorbed latent is whole on every
     * TP rank) and for the whole model (what the rollout engine holds on a rank); MLA in the
     * decoder's absorbed form and unabsorbed (GQA: both the same) */
    int kv_seqs, kv_positions, kv_elt, kv_rank, kv_layers;
    int kv_mla, kv_width, kv_width_unabs; /* MLA?; values a position and layer, k and v */
    double kv_dev, kv_model, kv_dev_unabs, kv_model_unabs;
    int nstages;
    int layers[MT_PLAN_MAX_STAGES]; /* decoder layers of each virtual stage */
} mt_plan_result;

typedef struct {
    long long layouts, simulated, pruned, feasible;
    long long infeasible[MT_PLAN_NREASONS];
    double seconds;
} mt_plan_stats;

void mt_plan_settings_default(mt_plan_settings *s);

/* Evaluates one layout (l->dp is derived and overwritten). The result's reason says
 * whether it is feasible; the times are filled for every layout that divides the model,
 * including ones that do not fit in memory. */
void mt_plan_eval(const mt_config *c, const mt_cluster *cl, const mt_plan_settings *st,
                  const mt_layout *l, mt_plan_result *res);

/* Searches the layout space; best[0..n) gets the fastest feasible layouts (returns how
 * many). progress != 0 prints a progress line on stderr. */
int mt_plan_search(const mt_config *c, const mt_cluster *cl, const mt_plan_settings *st,
                   mt_plan_result *best, int n, mt_plan_stats *stats, int progress);

/* "tp=8,pp=16,vpp=2,ep=32,mb=1,rc=selective,a2a=hier,split=balanced" (omitted keys: 1,
 * rc_default, flat, even; dp is derived; rc: none, selective, full, selective-gemm). -1 with
 * a message on a bad string. */
int mt_layout_parse(mt_layout *l, const char *s, int rc_default);
void mt_layout_format(const mt_layout *l, char *buf, size_t n);

/* Reports: the ranked table, one layout in detail, what separates the first result from
 * the next ones, and JSON (a malloc'd string). */
void mt_plan_print_table(FILE *f, const mt_plan_result *r, int n);
void mt_plan_print_detail(FILE *f, const mt_plan_result *r);
void mt_plan_print_explain(FILE *f, const mt_plan_result *r, int n);
char *mt_plan_json(const mt_plan_result *r, int n, const mt_plan_stats *stats);

#endif
