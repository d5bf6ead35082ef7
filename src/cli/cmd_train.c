/* cli/cmd_train.c — `moetrain train`. */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/blas.h"
#include "parallel/dist.h"
#include "plan/cluster.h"
#include "train/trainer.h"


/* --wire CLUSTER.json: the cluster file's inter-node link, its bandwidth times (and its
 * latency over) this rank's GEMM rate / a device's achieved rate (peak x GEMM efficiency),
 * so that a step here has the cluster's link/compute ratio. Rank 0 measures, all use it. */
static int wire_from_cluster(mt_train_opts *o) {
    static char spec[64];
    const size_t n = strlen(o->wire);
    if (n < 5 || strcmp(o->wire + n - 5, ".json") != 0) return 0;
    mt_cluster cl;
    if (mt_cluster_load(&cl, o->wire) != 0) return -1;
    const double dev = cl.peak_bf16 * cl.eff_gemm;
    if (!(cl.inter_bw > 0) || !(dev > 0))
        return mt_error("--wire %s: the cluster needs inter_node.bw_gbs and peak_tflops.bf16", o->wire);
    mt_dist *d = mt_dist_get();
    double here = 0;
    if (d->rank == 0) {
        if (o->threads > 0) mt_set_threads(o->threads);
        here = mt_gemm_gflops(1024, 0.3, o->bf16) * 1e9;
    }
    mt_group_bcast_f64(&d->all, &here, 1);
    const double s = here / dev, bw = cl.inter_bw * s, lat = cl.inter_lat / s;
    snprintf(spec, sizeof spec, "%.6g,%.6g", bw / 1e9, lat * 1e6);
    if (d->rank == 0)
        printf("wire: %s's inter-node link (%.3g GB/s, %.3g us) at this rank's pace: its GEMM %.3g GFLOP/s against a "
               "device's %.3g TFLOP/s (%.0f%% of peak), so --wire %s\n",
               cl.name, cl.inter_bw / 1e9, cl.inter_lat * 1e6, here / 1e9, dev / 1e12, 100 * cl.eff_gemm, spec);
    o->wire = spec;
    return 0;
}
int mt_cmd_train(int argc, char **argv) {
    mt_train_opts o;
    mt_train_defaults(&o);
    const char *config = NULL;
    double comm_timeout = MT_COMM_TIMEOUT_DEFAULT;
    mt_arg specs[] = {
        {"config", MT_ARG_STR, &config, "model config.json or preset name (configs/NAME.json)", NULL},
        {"data", MT_ARG_STR, &o.data, "folder of token shards (*train*.bin, optional *val*.bin)", NULL},
        {"steps", MT_ARG_INT, &o.steps, "total optimizer steps (default 100)", &o.set_steps},
        {"out", MT_ARG_STR, &o.out, "run folder: checkpoints, metrics.jsonl, loss.png (default with --resume: the resumed run)", NULL},
        {"seed", MT_ARG_U64, &o.seed, "seed of init and data order (default 1)", &o.set_seed},
        {"batch", MT_ARG_INT, &o.batch, "sequences per micro-batch (default 8)", &o.set_batch},
        {"seq", MT_ARG_INT, &o.seq, "sequence length T (default 256)", &o.set_seq},
        {"accum", MT_ARG_INT, &o.accum, "micro-batches per step (gradient accumulation, default 1)", &o.set_accum},
        {"lr", MT_ARG_DBL, &o.lr, "peak learning rate (default 3e-4)", &o.set_lr},
        {"min-lr-ratio", MT_ARG_DBL, &o.min_lr_ratio, "final lr as a fraction of the peak (default 0.1)", &o.set_min_lr},
        {"warmup", MT_ARG_INT, &o.warmup, "linear warmup steps (default min(100, steps/10))", &o.set_warmup},
        {"wd", MT_ARG_DBL, &o.wd, "AdamW decoupled weight decay on matrices (default 0.1)", &o.set_wd},
        {"beta1", MT_ARG_DBL, &o.beta1, "AdamW beta1 (default 0.9)", &o.set_beta1},
        {"beta2", MT_ARG_DBL, &o.beta2, "AdamW beta2 (default 0.95)", &o.set_beta2},
        {"clip", MT_ARG_DBL, &o.clip, "global gradient-norm clip, 0 = off (default 1.0)", &o.set_clip},
        {"init-std", MT_ARG_DBL, &o.init_std, "init std of matrices (default sqrt(1/(2*d*L)))", NULL},
        {"init-scheme", MT_ARG_STR, &o.init_scheme, "init: default (every matrix with --init-std) or tiny (Pangu's TinyInit: the token embedding with std 0.5, the other matrices with --init-std; untied embeddings)", NULL},
        {"threads", MT_ARG_INT, &o.threads, "threads (default: OMP_NUM_THREADS or all cores)", NULL},
        {"resume", MT_ARG_STR, &o.resume, "continue a run exactly from a run or checkpoint folder (its settings, unless given here)", NULL},
        {"init", MT_ARG_STR, &o.init, "start a new run from a checkpoint's weights", NULL},
        {"log-every", MT_ARG_INT, &o.log_every, "steps between progress lines (default 1)", &o.set_log_every},
        {"eval-every", MT_ARG_INT, &o.eval_every, "steps between validation losses, 0 = off (default 0)", &o.set_eval_every},
        {"eval-windows", MT_ARG_INT, &o.eval_windows, "validation windows per evaluation, 0 = all (default 64)", &o.set_eval_windows},
        {"save-every", MT_ARG_INT, &o.save_every, "steps between checkpoints, 0 = only at the end", &o.set_save_every},
        {"keep", MT_ARG_INT, &o.keep, "checkpoints kept: the one just saved and the newest before it, 0 = all (default 2; later steps in the folder are never removed)", &o.set_keep},
        {"max-bad-steps", MT_ARG_INT, &o.max_bad, "stop after this many non-finite steps in a row (default 5)", &o.set_max_bad},
        {"load-every", MT_ARG_INT, &o.load_every, "steps between expert-load reports, 0 = off", &o.set_load_every},
        {"expert-balance", MT_ARG_INT, &o.expert_balance, "with --ep: every N steps place each MoE layer's experts on the EP ranks anew from the tokens they were routed over those steps, moving the experts (weights and AdamW moments) that change rank; 0 = off (default)", &o.set_expert_balance},
        {"metrics", MT_ARG_STR, &o.metrics, "metrics JSONL path (default OUT/metrics.jsonl)", NULL},
        {"peak-gflops", MT_ARG_DBL, &o.peak_gflops, "MFU denominator (default: the GEMM measured at start-up, again when a step beats it and at the end; the highest counts)", NULL},
        {"profile", MT_ARG_BOOL, &o.profile, "print a per-step time breakdown and write OUT/trace_rank<R>.json (Perfetto)", &o.set_profile},
        {"plot", MT_ARG_BOOL, &o.plot, "draw OUT/loss.png with gnuplot at the end", &o.set_plot},
        {"bf16", MT_ARG_BOOL, &o.bf16, "mixed precision: matrix products in bfloat16 with fp32 sums (AVX512-BF16); weights, gradients and optimizer stay fp32", &o.set_bf16},
        {"recompute", MT_ARG_STR, &o.recompute, "memory policy: none (recompute only element-wise results) or selective (also the output projection and gate|up GEMMs)", NULL},
        {"doc-mode", MT_ARG_BOOL, &o.doc_mode, "document mode: attention and positions restart after each --eot", &o.set_doc_mode},
        {"eot", MT_ARG_INT, &o.eot, "end-of-text token id for --doc-mode (default: the data's tokenizer's, 256 for bytes)", &o.set_eot},
        {"quiet", MT_ARG_BOOL, &o.quiet, "no progress output", NULL},
        {"allow-nonfinite", MT_ARG_BOOL, &o.allow_nonfinite, "load a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
        {"dist-opt", MT_ARG_BOOL, &o.dist_opt, "under mpirun: distributed optimizer (ZeRO-1, AdamW state sharded over DP)", NULL},
        {"bucket-mb", MT_ARG_DBL, &o.bucket_mb, "under mpirun: gradient all-reduce bucket size in MiB (default 25)", NULL},
        {"pp", MT_ARG_INT, &o.pp, "under mpirun: pipeline stages (1F1B schedule; DP = ranks / PP; default 1)", NULL},
        {"vpp", MT_ARG_INT, &o.vpp, "model chunks per pipeline rank (interleaved schedule; --accum a multiple of --pp)", NULL},
        {"split", MT_ARG_STR, &o.split, "decoder layers of each of the PP x VPP virtual stages, e.g. 3,2,2,1 (default: even)", NULL},
        {"tp", MT_ARG_INT, &o.tp, "under mpirun: tensor-parallel size (heads and dense FFN split; DP = ranks / (PP x TP))", NULL},
        {"sp", MT_ARG_BOOL, &o.sp, "sequence parallelism with --tp: norms, residuals and MoE on 1/TP of the tokens", NULL},
        {"ep", MT_ARG_INT, &o.ep, "under mpirun: expert-parallel group size, carved out of the DP ranks (default 1)", NULL},
        {"flashcomm-ep", MT_ARG_STR, &o.flashcomm_ep, "with --ep: int8 sends the expert dispatch's token rows as INT8 with a scale per 128 values (0.26x the rows' bytes; the experts compute on the rounded rows, the gradient passes through); off (default)", NULL},
        {"flashcomm", MT_ARG_STR, &o.flashcomm, "with --tp (no --sp): int8 sends each TP all-reduce as a reduce-scatter, INT8 with a scale per 128 values, and an all-gather (0.63x the bytes; rounds the activations and their gradients); off (default)", NULL},
        {"a2a", MT_ARG_STR, &o.a2a, "expert all-to-all: hier (one inter-node copy per node, default) or flat", NULL},
        {"expert-placement", MT_ARG_STR, &o.expert_placement, "experts on the EP ranks: contiguous (default) or shuffled:SEED (a seeded permutation per layer; checkpoints stay logical)", NULL},
        {"aux-scope", MT_ARG_STR, &o.aux_scope, "balance loss over: sequence (each sequence, the default) or ep-group (all tokens of a micro-batch on the EP group's ranks, as Pangu Ultra MoE; its value depends on the layout: --ep, --batch, --sp)", NULL},
        {"comm-timeout", MT_ARG_DBL, &comm_timeout, "under mpirun: seconds one collective may wait before the job is ended as stuck, 0 = never (default 600)", NULL},
        {"ranks-per-node", MT_ARG_INT, &o.ranks_per_node, "emulate nodes of this many consecutive ranks (default: real shared-memory nodes)", NULL},
        {"wire", MT_ARG_STR, &o.wire, "GBPS[,US] or CLUSTER.json: an emulated link between the (--ranks-per-node) nodes for the expert all-to-all, the gradient buckets and the pipeline's messages, GB/s per rank and direction and latency in us, or a cluster file's inter-node link scaled to this machine's compute; TP groups must stay inside a node (default: none)", NULL},
        {"overlap", MT_ARG_STR, &o.overlap, "expert all-to-all: block (default: shared experts computed while the combine / gather travels), pipe (the forward of micro-batch i+1 with the backward of i as two fibers, each one's exchanges behind the other's compute; --accum >= 2) or off (each exchange completes before compute goes on)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("train", "--config FILE --data DIR --steps N --out DIR [flags]", specs, argc, argv, 2,
                           NULL, 0, NULL);
    /* under mpirun an error on any rank ends the whole job, naming the rank */
    const int multi = mt_dist_get()->size > 1;
    if (rc < 0 && multi) mt_dist_abort(mt_last_error());
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (mt_cli_comm_timeout("train", comm_timeout) != 0) return multi ? (mt_dist_abort(mt_last_error()), 1) : mt_cli_fail();
    if (config) o.config = mt_cli_config_path(config);
    /* every rank must run with the same flags: mt_train compares this hash across ranks */
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    for (int i = 2; i < argc; i++) XXH64_update(h, argv[i], strlen(argv[i]) + 1);
    o.args_hash = XXH64_digest(h);
    XXH64_freeState(h);
    if (o.wire && wire_from_cluster(&o) != 0) {
        if (multi) mt_dist_abort(mt_last_error());
        return mt_cli_fail();
    }
    if (mt_train(&o) != 0) {
        if (multi) mt_dist_abort(mt_last_error());
        return mt_cli_fail();
    }
    return 0;
}
