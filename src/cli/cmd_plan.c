/* cli/cmd_plan.c — `moetrain plan`: search (or evaluate one) parallel layout of a model on a
 * cluster with the planner of src/plan (cost models + schedule simulation). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "parallel/wire.h"
#include "plan/plan.h"

int mt_cmd_plan(int argc, char **argv);

/* A cluster argument: a file, or a preset name in configs/clusters/ (found next to the model
 * presets). */
static const char *cluster_path(const char *name) {
    static char buf[4096];
    struct stat st;
    if (stat(name, &st) == 0 || strchr(name, '/') || strstr(name, ".json")) return name;
    const char *demo = mt_cli_config_path("demo");
    const char *slash = strrchr(demo, '/');
    int dir = slash ? (int)(slash - demo) : 0;
    snprintf(buf, sizeof buf, "%.*s%sclusters/%s.json", dir, demo, dir ? "/" : "", name);
    return stat(buf, &st) == 0 ? buf : name;
}

/* "1536" or "1536seq" sequences, "12.5Mtok" / "12582912tok" tokens; K/M/G multiply. */
static int parse_batch(const char *s, int T, long long *seqs) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return mt_error("moetrain plan: --global-batch: expected a number, got '%s'", s);
    if (*end == 'K' || *end == 'k') { v *= 1e3; end++; }
    else if (*end == 'M') { v *= 1e6; end++; }
    else if (*end == 'G') { v *= 1e9; end++; }
    int tokens = 0;
    if (!strcmp(end, "tok") || !strcmp(end, "tokens")) tokens = 1;
    else if (*end && strcmp(end, "seq") && strcmp(end, "seqs"))
        return mt_error("moetrain plan: --global-batch: unknown unit '%s' (seq or tok)", end);
    double q = tokens ? v / T : v;
    if (q < 1 || q != (double)(long long)q)
        return mt_error("moetrain plan: --global-batch: %s is not a whole number of %d-token sequences", s, T);
    *seqs = (long long)q;
    return 0;
}

int mt_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *cluster = NULL, *gb = NULL, *layout = NULL, *dtype = "bf16", *optim = "adamw";
    const char *overlap = NULL, *wire = NULL;
    int T = 8192, devices = 0, top = 10, json = 0, explain = 0, no_dist_opt = 0, quiet = 0, threads = 0, per_node = 0;
    int bf16 = 0, dtype_given = 0, decode_batch = 64, decode_ctx = 0, ctx_given = 0;
    double imbalance = 0, bucket_mb = 25;
    mt_arg specs[] = {
        {"model", MT_ARG_STR, &model, "model config.json or preset name (required)", NULL},
        {"config", MT_ARG_STR, &model, "same as --model", NULL},
        {"cluster", MT_ARG_STR, &cluster, "cluster JSON or preset name in configs/clusters (required)", NULL},
        {"seq", MT_ARG_INT, &T, "sequence length (default 8192)", NULL},
        {"global-batch", MT_ARG_STR, &gb, "sequences per step (1536, 1536seq) or tokens (12582912tok; K, M, G = 10^3, 10^6, 10^9); default 2^24 = 16.8M tokens", NULL},
        {"devices", MT_ARG_INT, &devices, "devices (overrides the cluster file)", NULL},
        {"devices-per-node", MT_ARG_INT, &per_node, "devices per node (overrides the cluster file; calibrated CPU files: default all devices on one node)", NULL},
        {"threads", MT_ARG_INT, &threads, "calibrated CPU files: threads per device (rank); default the most measured", NULL},
        {"bucket-mb", MT_ARG_DBL, &bucket_mb, "calibrated CPU files: the trainer's gradient all-reduce bucket in MiB (default 25)", NULL},
        {"dtype", MT_ARG_STR, &dtype, "bf16 (default; fp32 master weights and gradients) or fp32 (calibrated CPU files: the moetrain trainer)", &dtype_given},
        {"bf16", MT_ARG_BOOL, &bf16, "calibrated CPU files: the trainer's `train --bf16` (GEMMs and attention at their measured bf16 rates, all else fp32); implies --dtype fp32", NULL},
        {"optimizer", MT_ARG_STR, &optim, "adamw (the only one)", NULL},
        {"no-dist-opt", MT_ARG_BOOL, &no_dist_opt, "replicate the optimizer state (default: sharded over DP)", NULL},
        {"overlap", MT_ARG_STR, &overlap, "pipe: the overlapped schedule (train --overlap pipe: each forward with the oldest backward not yet run, each one's expert exchanges hidden behind the other's compute); block or off (default): the exchanges count in full", NULL},
        {"wire", MT_ARG_STR, &wire, "calibrated CPU files: GBPS[,US], the trainer's `train --wire`: the expert exchanges, DP gradient buckets and pipeline messages between nodes (--devices-per-node) over an emulated link of GBPS GB/s per rank and US us per message", NULL},
        {"imbalance", MT_ARG_DBL, &imbalance, "dropless MoE: busiest EP rank's tokens / mean (default 1.2)", NULL},
        {"decode-batch", MT_ARG_INT, &decode_batch, "the KV-cache line: sequences a model replica decodes at once (default 64, the rollout's --slots)", NULL},
        {"decode-context", MT_ARG_INT, &decode_ctx, "the KV-cache line: positions of each (default --seq)", &ctx_given},
        {"top", MT_ARG_INT, &top, "layouts in the table (default 10)", NULL},
        {"layout", MT_ARG_STR, &layout, "evaluate one layout: tp=8,pp=16,vpp=2,ep=32,mb=1,rc=none,a2a=hier,split=balanced (rc: keep-all, none, selective, full)", NULL},
        {"explain", MT_ARG_BOOL, &explain, "say what separates the best layout from the next ones", NULL},
        {"json", MT_ARG_BOOL, &json, "print JSON instead of tables", NULL},
        {"quiet", MT_ARG_BOOL, &quiet, "no progress line", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("plan", "--model M --cluster C [--seq T --global-batch B --devices N] [--layout L]",
                           specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!model || !cluster) {
        mt_error("moetrain plan: --model and --cluster are required");
        return mt_cli_fail();
    }
    mt_config c;
    mt_cluster cl;
    if (mt_config_load(&c, mt_cli_config_path(model)) != 0) return mt_cli_fail();
    if (mt_cluster_load(&cl, cluster_path(cluster)) != 0) return mt_cli_fail();
    if (mt_config_check_seq(&c, T, "moetrain plan: --seq") != 0) return mt_cli_fail();
    mt_plan_settings st;
    mt_plan_settings_default(&st);
    st.seq = T;
    st.devices = devices > 0 ? devices : cl.devices;
    st.dist_opt = !no_dist_opt;
    if (overlap && strcmp(overlap, "pipe") != 0 && strcmp(overlap, "block") != 0 && strcmp(overlap, "off") != 0) {
        mt_error("moetrain plan: --overlap '%s': pipe, block or off", overlap);
        return mt_cli_fail();
    }
    st.overlap = overlap && strcmp(overlap, "pipe") == 0;
    st.blocking = overlap && strcmp(overlap, "off") == 0;
    if (!(bucket_mb > 0)) { /* integers are never negative (the parser) */
        mt_error("moetrain plan: --bucket-mb must be positive");
        return mt_cli_fail();
    }
    if (threads > 0 && cl.ncpu == 0) {
        mt_error("moetrain plan: --threads needs a cluster file with a cpu section (moetrain bench --calibrate)");
        return mt_cli_fail();
    }
    if (bf16) {
        /* train --bf16 keeps fp32 weights, gradients and activations: the trainer mode */
        if (dtype_given && strcmp(dtype, "fp32")) {
            mt_error("moetrain plan: --bf16 models `moetrain train --bf16` (fp32 storage, bf16 GEMMs): use it "
                     "without --dtype or with --dtype fp32");
            return mt_cli_fail();
        }
        if (cl.ncpu == 0) {
            mt_error("moetrain plan: --bf16 models `moetrain train --bf16` and needs a calibrated cluster file "
                     "(moetrain bench --calibrate); %s has no cpu section", cl.name);
            return mt_cli_fail();
        }
        dtype = "fp32";
    }
    if (cl.ncpu > 0) {
        /* a calibrated CPU machine: a device is one rank of the moetrain trainer with its
         * threads; ranks share the node's cores */
        int pn = per_node > 0 ? per_node : st.devices;
        if (mt_cluster_for_device(&cl, threads > 0 ? threads : cl.cpu[cl.ncpu - 1].threads, pn) != 0)
            return mt_cli_fail();
        st.trainer = !strcmp(dtype, "fp32");
        if (bf16 && !(cl.gemm_bf16_peak > 0)) {
            mt_error("moetrain plan: --bf16: cluster %s has no bf16 GEMM measurement for %d threads (the "
                     "calibrating CPU lacks AVX512-BF16, or the file predates it; moetrain bench --calibrate "
                     "records it on a CPU that has it)", cl.name, cl.dev_threads);
            return mt_cli_fail();
        }
        st.gemm_bf16 = bf16;
        st.threads = cl.dev_threads;
        st.bucket_bytes = bucket_mb * 1048576.0;
    } else if (per_node > 0) {
        if (st.devices % per_node != 0) { /* as a cluster file must have it */
            mt_error("moetrain plan: --devices-per-node %d does not divide the %d devices", per_node, st.devices);
            return mt_cli_fail();
        }
        cl.per_node = per_node;
    }
    if (wire) {
        if (!st.trainer) {
            mt_error("moetrain plan: --wire models `moetrain train --wire` and needs a calibrated cluster file "
                     "(moetrain bench --calibrate) with --dtype fp32");
            return mt_cli_fail();
        }
        if (mt_wire_parse(wire, &st.wire_bw, &st.wire_lat) != 0) return mt_cli_fail();
    }
    if (imbalance != 0) {
        if (imbalance < 1 || imbalance > 1000) {
            mt_error("moetrain plan: --imbalance must be in [1, 1000] (the busiest expert's load over the mean; got %g)",
                     imbalance);
            return mt_cli_fail();
        }
        st.imbalance = imbalance;
    }
    if (!strcmp(dtype, "fp32")) {
        st.elt = 4;
        cl.peak_bf16 = cl.peak_fp32; /* the compute peak of the training dtype */
    } else if (strcmp(dtype, "bf16")) {
        mt_error("moetrain plan: --dtype: '%s' is not supported (bf16 or fp32)", dtype);
        return mt_cli_fail();
    }
    if (strcmp(optim, "adamw")) {
        mt_error("moetrain plan: --optimizer: '%s' is not supported (adamw)", optim);
        return mt_cli_fail();
    }
    if (decode_batch < 1) {
        mt_error("moetrain plan: --decode-batch must be at least 1");
        return mt_cli_fail();
    }
    if (ctx_given && mt_config_check_seq(&c, decode_ctx, "moetrain plan: --decode-context") != 0) return mt_cli_fail();
    st.decode_seqs = decode_batch;
    st.decode_positions = decode_ctx;
    if (top < 1 || top > 1000) {
        mt_error("moetrain plan: --top must be in 1..1000");
        return mt_cli_fail();
    }
    if (gb) {
        if (parse_batch(gb, T, &st.global_seqs) != 0) return mt_cli_fail();
    } else {
        st.global_seqs = (16LL << 20) / T > 0 ? (16LL << 20) / T : 1;
    }

    if (explain && (layout || json))
        mt_warn("--explain compares the best layouts of a search: it has no effect with --%s", layout ? "layout" : "json");
    if (layout) {
        mt_layout l;
        /* without rc=: the trainer's default (none) on a calibrated CPU file, else keep-all */
        if (mt_layout_parse(&l, layout, st.trainer ? MT_RECOMPUTE_NONE : MT_RECOMPUTE_KEEP_ALL) != 0)
            return mt_cli_fail();
        if (l.dp > 0 && l.dp * l.tp * l.pp != st.devices) {
            mt_error("moetrain plan: --layout dp=%d: DP is the devices over TP x PP, %d / (%d x %d)", l.dp,
                     st.devices, l.tp, l.pp);
            return mt_cli_fail();
        }
        mt_plan_result r;
        mt_plan_eval(&c, &cl, &st, &l, &r);
        if (json) {
            char *txt = mt_plan_json(&r, 1, NULL);
            printf("%s\n", txt);
            free(txt);
        } else {
            printf("plan: %s on %d x %s, seq %d, global batch %lld sequences (%.3gM tokens)\n", model,
                   st.devices, cl.name, T, st.global_seqs, st.global_seqs * (double)T / 1e6);
            mt_plan_print_detail(stdout, &r);
        }
        return r.reason == MT_PLAN_OK ? 0 : 1;
    }

    mt_plan_result *best = mt_xcalloc((size_t)top, sizeof *best);
    mt_plan_stats stats;
    int n = mt_plan_search(&c, &cl, &st, best, top, &stats, !quiet && !json && isatty(2));
    if (json) {
        char *txt = mt_plan_json(best, n, &stats);
        printf("%s\n", txt);
        free(txt);
    } else {
        printf("plan: %s on %d x %s, seq %d, global batch %lld sequences (%.3gM tokens), %s%s, %s optimizer\n",
               model, st.devices, cl.name, T, st.global_seqs, st.global_seqs * (double)T / 1e6, dtype,
               st.gemm_bf16 ? " (GEMMs bf16)" : "",
               st.dist_opt ? "distributed" : "replicated");
        if (st.overlap) printf("the overlapped schedule (expert exchanges behind the other micro-batch)\n");
        printf("searched %lld layouts in %.2f s: %lld fit (%lld simulated, %lld pruned by a lower bound)\n",
               stats.layouts, stats.seconds, stats.feasible, stats.simulated, stats.pruned);
        for (int i = 1; i < MT_PLAN_NREASONS; i++)
            if (stats.infeasible[i]) printf("  infeasible: %8lld  %s\n", stats.infeasible[i], mt_plan_reason_name[i]);
        if (n == 0) {
            printf("no layout fits\n");
        } else {
            mt_plan_print_table(stdout, best, n);
            printf("\nbest:\n");
            mt_plan_print_detail(stdout, &best[0]);
            if (explain) mt_plan_print_explain(stdout, best, n);
        }
    }
    free(best);
    return n > 0 ? 0 : 1;
}
