/* plan/cluster.h — a cluster description for the planner (configs/clusters/NAME.json).
 *
 * Units in the JSON are the ones data sheets use (TFLOP/s, GB, GB/s per direction per
 * device, microseconds); the struct holds SI units (FLOP/s, bytes, bytes/s, seconds).
 * Keys:
 *   name, source (text), assumed (list of keys whose numbers are estimates)
 *   devices, devices_per_node
 *   peak_tflops: {bf16, fp32}, memory_gb, memory_bw_gbs, reserved_gb (runtime,
 *     fragmentation and workspace the framework keeps; default 0)
 *   intra_node: {bw_gbs, latency_us}, inter_node: {bw_gbs, latency_us} (per device, one
 *     direction)
 *   efficiency (optional): {gemm, attention, memory} fractions of peak, defaults 0.7,
 *     0.5, 0.7; gemm_curve: [[GFLOP per GEMM call, efficiency], ...] ascending, used
 *     instead of the constant gemm efficiency (linear in log10 of the size, clamped);
 *     gemm_curve_bf16 (optional): the same for the mixed-precision bf16 GEMM of a CPU
 *     (moetrain train --bf16), as fractions of peak_tflops.bf16; attention_bf16 (optional):
 *     attention in that mode, a fraction of peak_tflops.bf16.
 * A measured file: `moetrain bench --calibrate OUT.json` writes this format (src/plan/calibrate.c),
 * with two more optional sections that describe a CPU node running the moetrain trainer:
 *   cpu: {cores_per_node, by_threads: [{threads, peak_tflops, memory_bw_gbs, attention,
 *     gemm_curve, reserve_mb, peak_tflops_bf16, gemm_curve_bf16, attention_bf16}, ...]}: one rank
 *     alone on the node with that many threads (the three bf16 keys, optional: the bf16 GEMM
 *     and attention of train --bf16, measured when the CPU has AVX512-BF16)
 *     (reserve_mb: the resident memory of a rank that is not a sized buffer: binary,
 *     libraries, BLAS/OpenMP buffers, MPI, allocator slack). A "device" is then one rank
 *     with `threads` threads; with R ranks on a node of C cores each gets the share
 *     min(1, C / (R x threads)) of its rates (mt_cluster_for_device).
 *   mpi: {per_peer_mb (resident memory per other rank on the node), allreduce_bw_gbs,
 *     reduce_scatter_bw_gbs, allgather_bw_gbs (ring-equivalent per-rank bandwidths of
 *     the collectives, measured: time = (g-1)/g x bytes / bw per pass), allreduce_scratch,
 *     reduce_scatter_scratch, allgather_scratch (peak temporary memory of the collective /
 *     its message bytes, max over ranks), ep_layer_s, ep_byte_s (the trainer's expert
 *     exchange of one MoE layer, forward and backward: seconds = ep_layer_s + ep_byte_s x
 *     bytes of (token, expert) rows a rank sends), ranks (how many measured), by_ranks: [the
 *     same keys for fewer ranks at once, with their "ranks"]}; mt_cluster_for_device uses
 *     the entry with the most ranks <= the ranks of the node.
 * With a cpu section the planner models the moetrain trainer (plan.h, mt_plan_settings). */
#ifndef MT_PLAN_CLUSTER_H
#define MT_PLAN_CLUSTER_H

enum { MT_CLUSTER_CURVE_MAX = 16, MT_CLUSTER_THREADS_MAX = 8 };

/* The MPI collectives measured with `ranks` ranks of the node at once (bandwidths in
 * bytes/s, ring-equivalent; scratch = temporary bytes / message bytes). */
typedef struct {
    int ranks;
    double ar_bw, rs_bw, ag_bw, ar_scratch, rs_scratch, ag_scratch;
    /* the trainer's expert exchange of one MoE layer (dispatch, combine, and the backward's
     * gather, dispatch backward and routing-weight return), fitted as
     * ep_layer_s + ep_byte_s x the bytes of the (token, expert) rows a rank sends; 0 = not
     * measured (the link model is used) */
    double ep_layer_s, ep_byte_s;
} mt_cluster_mpi;

/* One rank alone on a CPU node with `threads` threads. */
typedef struct {
    int threads;
    double peak;                     /* FLOP/s */
    double mem_bw, eff_att;          /* bytes/s, fraction */
    double reserve;                  /* bytes */
    int ncurve;
    double curve_flops[MT_CLUSTER_CURVE_MAX], curve_eff[MT_CLUSTER_CURVE_MAX];
    /* the bf16 GEMM (train --bf16): peak FLOP/s (0 = not measured) and its curve; attention
     * in that mode (its products on bf16 pairs), a fraction of peak_bf16 (0 = not measured) */
    double peak_bf16, eff_att_bf16;
    int ncurve_bf16;
    double curve_bf16_flops[MT_CLUSTER_CURVE_MAX], curve_bf16_eff[MT_CLUSTER_CURVE_MAX];
} mt_cluster_cpu;

typedef struct {
    char name[64];
    int devices, per_node;
    double peak_bf16, peak_fp32;     /* FLOP/s */
    double mem_bytes, mem_bw;        /* bytes, bytes/s */
    double reserved_bytes;
    double intra_bw, intra_lat;      /* bytes/s per device and direction, seconds */
    double inter_bw, inter_lat;
    double eff_gemm, eff_att, eff_mem;
    int ncurve;
    double curve_flops[MT_CLUSTER_CURVE_MAX], curve_eff[MT_CLUSTER_CURVE_MAX];
    /* the mixed-precision bf16 GEMM of a CPU (moetrain train --bf16): its peak in FLOP/s
     * (0 = not measured: a file without the bf16 keys, or a CPU without AVX512-BF16) and
     * its curve (ncurve_bf16 = 0: none, the fp32 curve is used). Top level: peak_bf16 and
     * efficiency.gemm_curve_bf16; after mt_cluster_for_device: the cpu entry's. */
    double gemm_bf16_peak;
    int ncurve_bf16;
    double curve_bf16_flops[MT_CLUSTER_CURVE_MAX], curve_bf16_eff[MT_CLUSTER_CURVE_MAX];
    /* attention in bf16 mode, a fraction of gemm_bf16_peak (0 = not measured: attention at
     * eff_att of the fp32 peak). Top level: efficiency.attention_bf16 */
    double eff_att_bf16;
    /* CPU node (0 entries: not described) */
    int cores, ncpu;
    mt_cluster_cpu cpu[MT_CLUSTER_THREADS_MAX];
    /* measured MPI figures (0 = not measured: the link bandwidth / no extra memory) */
    double mpi_per_peer, ar_bw, rs_bw, ag_bw, ar_scratch, rs_scratch, ag_scratch;
    double ep_layer_s, ep_byte_s;    /* the expert exchange, as in mt_cluster_mpi */
    int mpi_ranks;                   /* ranks of the entry in use (0: none) */
    int nmpi;                        /* mpi.by_ranks and the top level, ascending in ranks */
    mt_cluster_mpi mpi[8];
    /* set by mt_cluster_for_device: threads per rank, ranks per node, CPU share */
    int dev_threads, dev_per_node;
    double dev_share;
} mt_cluster;

/* Loads a cluster file; -1 with a message naming the file and key on error. */
int mt_cluster_load(mt_cluster *cl, const char *path);
/* Parses from a JSON string; `what` names the source in messages. */
int mt_cluster_parse(mt_cluster *cl, const char *json, const char *what);
/* Makes `cl` describe one rank with `threads` threads, `per_node` ranks on a node of a CPU
 * cluster: peak, GEMM curve, bf16 GEMM peak and curve (gemm_bf16_peak = 0 when the entry
 * has none), attention efficiency, memory bandwidth and reserve of the
 * nearest measured thread count (scaled linearly in the threads when it was not measured),
 * each rate and the collectives' bandwidths times the CPU share min(1, cores / (per_node x
 * threads)); devices_per_node = per_node. -1 with a message without a cpu section. */
int mt_cluster_for_device(mt_cluster *cl, int threads, int per_node);
/* GEMM efficiency for one GEMM call of `flops` FLOPs. */
double mt_cluster_gemm_eff(const mt_cluster *cl, double flops);
/* The same for the bf16 GEMM (its curve, else the fp32 one), a fraction of gemm_bf16_peak. */
double mt_cluster_gemm_eff_bf16(const mt_cluster *cl, double flops);

#endif
