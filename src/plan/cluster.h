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
 *     instead of the constant gemm efficiency (linear in log10 of the size, clamped).
 * A measured file: `moetrain bench --calibrate OUT.json` writes this format (src/plan/calibrate.c). */
#ifndef MT_PLAN_CLUSTER_H
#define MT_PLAN_CLUSTER_H

enum { MT_CLUSTER_CURVE_MAX = 16 };

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
} mt_cluster;

/* Loads a cluster file; -1 with a message naming the file and key on error. */
int mt_cluster_load(mt_cluster *cl, const char *path);
/* Parses from a JSON string; `what` names the source in messages. */
int mt_cluster_parse(mt_cluster *cl, const char *json, const char *what);
/* GEMM efficiency for one GEMM call of `flops` FLOPs. */
double mt_cluster_gemm_eff(const mt_cluster *cl, double flops);

#endif
