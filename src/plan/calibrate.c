/* plan/calibrate.c — measures this machine into a cluster file (see calibrate.h). */
#include "plan/calibrate.h"

#include <cjson/cJSON.h>
#include <malloc.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "parallel/a2a.h"
#include "parallel/commbench.h"
#include "parallel/dist.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ops.h"
#include "plan/cluster.h"


/* GEMM grid: M rows (tokens) x (N outputs, K inputs) of the "small" config's layers:
 * expert FFN 352, attention projections 512, dense FFN 1408 (and its down projection with
 * K = 1408), LM head 8192. */
static const int CAL_M[] = {64, 256, 1024, 4096};
static const int CAL_NK[][2] = {{352, 512}, {512, 512}, {1408, 512}, {512, 1408}, {8192, 512}};
enum { CAL_NM = 4, CAL_NNK = 5, CAL_NG = CAL_NM * CAL_NNK, CAL_NT = 2 };
static const int CAL_T[CAL_NT] = {512, 4096};
enum { CAL_H = 8, CAL_D = 64, CAL_TOK = 4096 }; /* attention: 8 heads x 64, B*T = 4096 */

/* Everything measured per rank (reduced with MIN over ranks; NaN = not measured, kept as
 * NaN by using -1 sentinels through the reduction). */
typedef struct {
    double gemm[CAL_NG];             /* GFLOP/s, -1 = skipped */
    double gemm_bf16[CAL_NG];        /* the same in bf16 mode (ws.bf16), -1 = not measured */
    double att_f[CAL_NT], att_b[CAL_NT]; /* GFLOP/s fwd, bwd (bwd FLOPs = 2.5 x fwd) */
    double att_f16[CAL_NT], att_b16[CAL_NT]; /* the same in bf16 mode, -1 = not measured */
    double copy_gbs, adamw_gbs;      /* bytes read + written */
} cal_meas;

/* a = the better of a and b, figure by figure (every figure is a rate; -1 = not measured
 * stays -1, as every round skips the same) */
static void cal_meas_best(cal_meas *a, const cal_meas *b) {
    double *x = (double *)a;
    const double *y = (const double *)b;
    for (size_t i = 0; i < sizeof *a / sizeof(double); i++)
        if (y[i] > x[i]) x[i] = y[i];
}

static float *cal_fill(size_t n, uint64_t seed) {
    float *a = mt_alloc(sizeof(float) * (n ? n : 1));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = 2.0f * (float)mt_u01(mt_hash4(seed, i, 0x63616cULL, 0)) - 1.0f;
    return a;
}


/* rate[i * CAL_NNK + j] = GFLOP/s of the forward GEMM of shape (CAL_M[i], CAL_NK[j]), i < nm,
 * in bf16 mode (bf16) or fp32 */
static void time_grid(double *rate, int nm, double bud, const float *x, const float *W, float *y, int bf16) {
    mt_ws ws = {.bf16 = bf16}; /* the precision, and the bf16 GEMM's packing buffers */
    if (bf16) mt_ws_reserve(&ws, mt_gemm_ws_bytes(mt_get_threads()));
    for (int i = 0; i < nm; i++)
        for (int j = 0; j < CAL_NNK; j++) {
            int M = CAL_M[i], N = CAL_NK[j][0], K = CAL_NK[j][1];
            double t;
            MT_BEST_TIME(t, bud, mt_linear_fwd(ws, y, x, W, M, K, N, 0.0f));
            rate[i * CAL_NNK + j] = 2.0 * M * N * K / t * 1e-9;
        }
    mt_ws_free(&ws);
}

/* scale (here and in cal_attention, cal_memory): the share of each timing's budget, 1 / the
 * rounds the one-rank figures are measured in.
 * reserve: the resident bytes that are not the measurement's own buffers, read while they
 * are live (binary, libraries, BLAS / OpenMP per-thread buffers, MPI, allocator slack).
 * bf16: the grid again with every GEMM in bf16 mode (train --bf16's kernel; the CPU has
 * AVX512-BF16), after the reserve was read (the fp32 trainer's) */
static void cal_gemm(cal_meas *m, int quick, double scale, double *reserve, int bf16) {
    const double bud = (quick ? 0.03 : 0.25) * scale;
    const int nm = quick ? CAL_NM - 1 : CAL_NM; /* --quick: no M = 4096 */
    size_t in_max = 0, w_max = 0, out_max = 0;
    for (int j = 0; j < CAL_NNK; j++) {
        size_t N = (size_t)CAL_NK[j][0], K = (size_t)CAL_NK[j][1], M = (size_t)CAL_M[nm - 1];
        if (M * K > in_max) in_max = M * K;
        if (N * K > w_max) w_max = N * K;
        if (M * N > out_max) out_max = M * N;
    }
    float *x = cal_fill(in_max, 1), *W = cal_fill(w_max, 2), *y = cal_fill(out_max, 3);
    for (int i = 0; i < CAL_NG; i++) m->gemm[i] = m->gemm_bf16[i] = -1;
    time_grid(m->gemm, nm, bud, x, W, y, 0);
    if (reserve) {
        /* memory freed by the calibration's earlier phases stays in the heap (mt_memory_policy):
         * hand it back first, so only what a process really keeps is counted */
        malloc_trim(0);
        *reserve = mt_proc_status_kb("VmRSS:") * 1024.0 - 4.0 * (double)(in_max + w_max + out_max);
    }
    if (bf16 && mt_gemm_bf16_check(1) == 0) time_grid(m->gemm_bf16, nm, bud, x, W, y, 1);
    mt_free(x); mt_free(W); mt_free(y);
}

static double cal_att_flops(int T) { /* causal forward of CAL_TOK tokens, as the planner counts */
    return 4.0 * CAL_D * CAL_H * (double)T * (T + 1) / 2.0 * (CAL_TOK / T);
}

/* bf16: also in bf16 mode (train --bf16: attention's products on bf16 pairs) */
static void cal_attention(cal_meas *m, int quick, double scale, int bf16) {
    const double bud = (quick ? 0.05 : 0.4) * scale;
    const int nthr = mt_get_threads();
    for (int i = 0; i < CAL_NT; i++) {
        m->att_f[i] = m->att_b[i] = m->att_f16[i] = m->att_b16[i] = -1;
        if (quick && CAL_T[i] > 512) continue;
        const int T = CAL_T[i], B = CAL_TOK / T;
        size_t n = (size_t)B * T * CAL_H * CAL_D, nl = (size_t)B * CAL_H * T;
        float *q = cal_fill(n, 10), *k = cal_fill(n, 11), *v = cal_fill(n, 12), *dout = cal_fill(n, 13);
        float *o = cal_fill(n, 14), *l = cal_fill(nl, 15), *dq = cal_fill(n, 16), *dk = cal_fill(n, 17);
        float *dv = cal_fill(n, 18);
        float *scratch = mt_alloc(sizeof(float) * (size_t)nthr * mt_attention_scratch_floats(T, CAL_D));
        const double ff = cal_att_flops(T);
        double *rate_f[2] = {m->att_f, m->att_f16}, *rate_b[2] = {m->att_b, m->att_b16};
        for (int mode = 0; mode <= bf16; mode++) { /* fp32, then (bf16) in bf16 mode */
            if (mode && mt_gemm_bf16_check(1) != 0) break;
            double tf, tb;
            MT_BEST_TIME(tf, bud,
                         mt_attention_fwd(o, l, q, k, v, NULL, B, T, CAL_H, CAL_H, CAL_D, scratch, nthr, mode));
            MT_BEST_TIME(tb, bud, mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, NULL, B, T, CAL_H, CAL_H, CAL_D,
                                               scratch, nthr, mode));
            rate_f[mode][i] = ff / tf * 1e-9;
            rate_b[mode][i] = 2.5 * ff / tb * 1e-9;
        }
        mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(o); mt_free(l);
        mt_free(dq); mt_free(dk); mt_free(dv); mt_free(scratch);
    }
}

static void cal_memory(cal_meas *m, int quick, double scale) {
    const double bud = (quick ? 0.1 : 0.5) * scale;
    const size_t n = quick ? (size_t)4 << 20 : (size_t)16 << 20; /* 16 MB / 64 MB of floats */
    float *a = cal_fill(n, 20), *b = cal_fill(n, 21), *g = cal_fill(n, 22), *v = cal_fill(n, 23);
    double t;
    MT_BEST_TIME(t, bud, mt_copy(b, a, n));
    m->copy_gbs = 8.0 * n / t * 1e-9; /* read + write */
    mt_zero(b, n);
    mt_zero(v, n);
    int step = 1;
    MT_BEST_TIME(t, bud, mt_adamw(a, g, b, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step++));
    m->adamw_gbs = 28.0 * n / t * 1e-9; /* reads p, g, m, v; writes p, m, v */
    mt_free(a); mt_free(b); mt_free(g); mt_free(v);
}

/* MemTotal and MemAvailable in bytes; -1 if /proc/meminfo cannot be read. */
static int cal_meminfo(double *total, double *avail) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    *total = *avail = 0;
    while (fgets(line, sizeof line, f)) {
        double kb;
        if (sscanf(line, "MemTotal: %lf kB", &kb) == 1) *total = kb * 1024;
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) *avail = kb * 1024;
    }
    fclose(f);
    return *total > 0 ? 0 : -1;
}

static double r4(double x);

/* the cluster file's names of the collectives timed by mt_bench_collective */
static const char *const coll_name[MT_COLL_N] = {"allreduce", "reduce_scatter", "allgather"};

/* ---- curve ------------------------------------------------------------------------ */

/* peak = the best rate of `gemm` (m->gemm: SGEMM, m->gemm_bf16: the bf16 GEMM); curve =
 * rate / peak binned by FLOPs per call (log-spaced, FLOP-weighted); attention efficiency
 * against that peak (taken from the SGEMM call). Returns the curve points (0 and peak 0
 * when nothing was measured). */
static int cal_curve(const double *gemm, const double *att_f, const double *att_b, double *peak_out, double *gflop, double *eff, double *att_out, int *natt_out) {
    double peak = 0, lo = INFINITY, hi = 0;
    for (int i = 0; i < CAL_NG; i++) {
        if (gemm[i] <= 0) continue;
        double f = 2.0 * CAL_M[i / CAL_NNK] * CAL_NK[i % CAL_NNK][0] * CAL_NK[i % CAL_NNK][1];
        if (gemm[i] > peak) peak = gemm[i];
        if (f < lo) lo = f;
        if (f > hi) hi = f;
    }
    enum { NB = 10 };
    double bf[NB] = {0}, bt[NB] = {0}, blog[NB] = {0};
    int bn[NB] = {0};
    const double w = (log10(hi) - log10(lo)) / NB;
    if (peak <= 0) { /* not measured (bf16 without AVX512-BF16) */
        *peak_out = *att_out = 0;
        if (natt_out) *natt_out = 0;
        return 0;
    }
    for (int i = 0; i < CAL_NG; i++) {
        if (gemm[i] <= 0) continue;
        double f = 2.0 * CAL_M[i / CAL_NNK] * CAL_NK[i % CAL_NNK][0] * CAL_NK[i % CAL_NNK][1];
        int b = w > 0 ? (int)((log10(f) - log10(lo)) / w) : 0;
        if (b >= NB) b = NB - 1;
        bf[b] += f;
        bt[b] += f / (gemm[i] * 1e9); /* seconds: the bin's efficiency is FLOP-weighted */
        blog[b] += log10(f);
        bn[b]++;
    }
    int n = 0;
    double last = 0;
    for (int b = 0; b < NB; b++) {
        if (!bn[b]) continue;
        double g = r4(pow(10, blog[b] / bn[b]) * 1e-9), e = r4(fmin(1.0, bf[b] / bt[b] * 1e-9 / peak));
        if (!(g > last)) continue; /* rounding merged two bins */
        last = g;
        gflop[n] = g;
        eff[n++] = e;
    }
    /* attention: the planner counts backward = 2 x forward, so its efficiency is 3 x fwd
     * FLOPs / (fwd + bwd time); the mean over the measured T */
    double att = 0;
    int natt = 0;
    for (int i = 0; i < CAL_NT; i++) {
        if (att_f[i] <= 0) continue;
        double ff = cal_att_flops(CAL_T[i]), t = ff / (att_f[i] * 1e9) + 2.5 * ff / (att_b[i] * 1e9);
        att += 3 * ff / t * 1e-9 / peak;
        natt++;
    }
    *att_out = fmin(1.0, natt ? att / natt : 0.5);
    if (natt_out) *natt_out = natt;
    *peak_out = peak;
    return n;
}

/* ---- output ----------------------------------------------------------------------- */

/* o[name] = [[M, N, K, GFLOP/s], ...] over the measured shapes of the grid */
static void add_gemm_rates(cJSON *o, const char *name, const double *rate) {
    cJSON *arr = cJSON_AddArrayToObject(o, name);
    for (int i = 0; i < CAL_NG; i++) {
        if (rate[i] <= 0) continue;
        cJSON *row = cJSON_CreateArray();
        cJSON_AddItemToArray(row, cJSON_CreateNumber(CAL_M[i / CAL_NNK]));
        cJSON_AddItemToArray(row, cJSON_CreateNumber(CAL_NK[i % CAL_NNK][0]));
        cJSON_AddItemToArray(row, cJSON_CreateNumber(CAL_NK[i % CAL_NNK][1]));
        cJSON_AddItemToArray(row, cJSON_CreateNumber(r4(rate[i])));
        cJSON_AddItemToArray(arr, row);
    }
}

static double r4(double x) { /* 4 significant digits: readable files */
    char b[32];
    snprintf(b, sizeof b, "%.4g", x);
    return strtod(b, NULL);
}

static cJSON *num_pair(double a, double b) {
    cJSON *p = cJSON_CreateArray();
    cJSON_AddItemToArray(p, cJSON_CreateNumber(a));
    cJSON_AddItemToArray(p, cJSON_CreateNumber(b));
    return p;
}

static cJSON *link_obj(double bw, double lat) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bw_gbs", r4(bw * 1e-9));
    cJSON_AddNumberToObject(o, "latency_us", r4(lat * 1e6));
    return o;
}

/* The CPUs this process may run on. Not the calling thread's affinity: mt_set_threads pins
 * each OpenMP thread (the main one included) to one of the allowed CPUs (kernels/blas.c), so
 * the union over a parallel region of `cores` threads (all pinned to distinct CPUs, or all
 * with the process's own set when it is bound to one CPU or MT_PIN=0). Leaves the
 * threads at `cores`: the caller sets them again. */
static int cal_cpus_allowed(int cores) {
    mt_set_threads(cores);
    cpu_set_t all;
    CPU_ZERO(&all);
#pragma omp parallel num_threads(cores)
    {
        cpu_set_t one;
        if (sched_getaffinity(0, sizeof one, &one) == 0) {
#pragma omp critical
            CPU_OR(&all, &all, &one);
        }
    }
    int n = CPU_COUNT(&all);
    return n > 0 ? n : 1;
}

int mt_calibrate(const char *path, int quick) {
    mt_dist *d = mt_dist_get();
    const int mpi = d->initialized && d->size > 1, root = !mpi || d->rank == 0;
    const double t_start = mt_now();
    if (root) {
        printf("calibrate: BLAS kernel %s, %d threads per rank", mt_blas_corename(), mt_get_threads());
        if (mpi) printf(", %d ranks measuring at once (%d on this node)", d->size, d->local_size);
        printf("\n");
        fflush(stdout);
    }
    /* 1. one rank alone on the node with 1, 2, 4 ... cores threads (the others sleep):
     * what a device of `threads` threads gets when the node is not shared */
    const int cal_threads = mt_get_threads();
    /* the bf16 GEMM of train --bf16, when every rank's CPU has AVX512-BF16 */
    int bf16 = mt_bf16_supported();
    if (mpi) mt_group_min_i32(&d->all, &bf16, 1);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    const int aff = cal_cpus_allowed(cores);
    int nsolo = 0, solo_t[MT_CLUSTER_THREADS_MAX];
    for (int t = 1; t <= aff && nsolo < MT_CLUSTER_THREADS_MAX; t *= 2) solo_t[nsolo++] = t;
    if (solo_t[nsolo - 1] < aff && nsolo < MT_CLUSTER_THREADS_MAX) solo_t[nsolo++] = aff;
    /* in rounds (each timing's budget split over them), keeping each figure's best: on a
     * shared host a neighbour's burst then spoils one round's figures, not the file (four
     * one-round calibrations within an hour on the Xeon gave the memory bandwidth 15-28 GB/s) */
    const int rounds = quick ? 1 : 3;
    cal_meas solo[MT_CLUSTER_THREADS_MAX];
    double solo_res[MT_CLUSTER_THREADS_MAX];
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < nsolo; i++) {
            if (root) {
                mt_set_threads(solo_t[i]);
                cal_meas r;
                memset(&r, 0, sizeof r);
                cal_gemm(&r, quick, 1.0 / rounds, k == 0 ? &solo_res[i] : NULL, bf16);
                cal_attention(&r, 1, 1.0 / rounds, bf16); /* T = 512 only */
                cal_memory(&r, quick, 1.0 / rounds);
                if (k == 0) solo[i] = r;
                else cal_meas_best(&solo[i], &r);
            }
            if (mpi) mt_bench_quiet_barrier(d);
        }
    mt_set_threads(cal_threads);

    /* 2. every rank at once with the calibration's threads (the top-level figures) */
    cal_meas m;
    memset(&m, 0, sizeof m);
    if (mpi) mt_dist_barrier(d);
    cal_gemm(&m, quick, 1.0, NULL, bf16);
    cal_attention(&m, quick, 1.0, bf16);
    cal_memory(&m, quick, 1.0);
    /* the slowest rank's figures (-1 = skipped stays -1: every rank skips the same) */
    if (mpi) mt_group_min_f64(&d->all, (double *)&m, sizeof m / sizeof(double));

    /* links: partners of rank 0 on the same node and on another node (host name hash) */
    const double rss_mpi0 = mt_proc_status_kb("RssShmem:"); /* MPI's shared-memory segments */
    mt_bench_link intra = {0, 0}, inter = {0, 0};
    double a2a_s = 0, a2a_small_s = 0;
    const size_t a2a_block = quick ? (size_t)256 << 10 : (size_t)1 << 20;
    int have_intra = 0, have_inter = 0;
    if (mpi) {
        uint64_t *all = mt_xmalloc(sizeof *all * (size_t)d->size);
        mt_bench_host_hashes(d, all);
        int pin = -1, pout = -1;
        for (int r = 1; r < d->size; r++) {
            if (all[r] == all[0] && pin < 0) pin = r;
            if (all[r] != all[0] && pout < 0) pout = r;
        }
        free(all);
        if (pin > 0) { intra = mt_bench_pingpong(d, pin, quick); have_intra = 1; }
        if (pout > 0) { inter = mt_bench_pingpong(d, pout, quick); have_inter = 1; }
        a2a_s = mt_bench_alltoall(d, a2a_block, quick ? 3 : 10);
        a2a_small_s = mt_bench_alltoall(d, 8, quick ? 20 : 100);
    }
    /* 3. the trainer's collectives on a large message (its gradients are 100s of MB):
     * ring-equivalent bandwidth and temporary memory; the resident shared memory MPI adds
     * per other rank of the node (RssShmem before and after all the MPI traffic: private
     * heap growth would mix in the allocator's slack) */
    const size_t coll_bytes = quick ? (size_t)64 << 20 : (size_t)256 << 20, ar_bytes = (size_t)25 << 20;
    /* twice the last-level cache (sysconf's figure; 400 MiB at least, 1 GiB at most; --quick 4) */
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    int ar_slices = (int)((2.0 * (llc > 0 ? (double)llc : 0) + (double)ar_bytes - 1) / (double)ar_bytes);
    ar_slices = quick ? 4 : ar_slices < 16 ? 16 : ar_slices > 40 ? 40 : ar_slices;
    /* on the first g = 2, 4, ... and all ranks at once (the others wait without spinning):
     * with more ranks than cores the collectives share them, as the trainer's ranks do */
    enum { NG = 8 };
    int ngs = 0, gs[NG];
    double coll_s[NG][MT_COLL_N], coll_scr[NG][MT_COLL_N], per_peer = 0, ep_s[NG][2];
    memset(ep_s, 0, sizeof ep_s);
    memset(coll_s, 0, sizeof coll_s);
    memset(coll_scr, 0, sizeof coll_scr);
    if (mpi) {
        for (int g = 2; g < d->size && ngs < NG - 1; g *= 2) gs[ngs++] = g;
        gs[ngs++] = d->size;
        for (int i = 0; i < ngs; i++) {
            mt_group sub;
            mt_group_split(&d->all, d->rank < gs[i], d->rank, &sub);
            /* the all-reduce on the trainer's default bucket (25 MiB), each call on another of
             * ar_slices (a gradient buffer larger than the caches), the others on the message */
            if (d->rank < gs[i]) {
                for (int k = 0; k < MT_COLL_N; k++)
                    mt_bench_collective(&sub, k, k == MT_COLL_ALLREDUCE ? ar_bytes : coll_bytes,
                                        k == MT_COLL_ALLREDUCE ? ar_slices : 1, k == MT_COLL_ALLREDUCE ? 6 : quick ? 3 : 4,
                                        &coll_s[i][k], &coll_scr[i][k]);
                mt_bench_ep_exchange(&sub, quick, &ep_s[i][0], &ep_s[i][1]);
            }
            mt_group_free(&sub);
            mt_bench_quiet_barrier(d);
        }
        double grow = (mt_proc_status_kb("RssShmem:") - rss_mpi0) * 1024.0;
        mt_group_max_f64(&d->all, &grow, 1);
        per_peer = d->local_size > 1 ? fmax(0, grow) / (d->local_size - 1) : 0;
    }
    if (!root) return 0;

    double mem_total = 0, mem_avail = 0;
    int have_mem = cal_meminfo(&mem_total, &mem_avail) == 0;
    const int per_node = mpi ? d->local_size : 1, devices = mpi ? d->size : 1;

    double peak, att_eff, cg[MT_CLUSTER_CURVE_MAX], ce[MT_CLUSTER_CURVE_MAX];
    double peak_b = 0, att_eff_b = 0, cgb[MT_CLUSTER_CURVE_MAX], ceb[MT_CLUSTER_CURVE_MAX];
    int natt = 0;
    const int ncurve = cal_curve(m.gemm, m.att_f, m.att_b, &peak, cg, ce, &att_eff, &natt);
    /* bf16: the GEMM curve and attention (its products on bf16 pairs), against the bf16 peak */
    const int ncurve_b = cal_curve(m.gemm_bf16, m.att_f16, m.att_b16, &peak_b, cgb, ceb, &att_eff_b, NULL);
    const double mem_eff = fmin(1.0, m.adamw_gbs / m.copy_gbs);

    char date[64], host[128] = "localhost", src[512];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    gethostname(host, sizeof host - 1);
    snprintf(src, sizeof src, "measured by moetrain bench --calibrate on %s (%s, %d threads per rank%s)", date,
             host, mt_get_threads(), quick ? ", --quick" : "");

    cJSON *root_o = cJSON_CreateObject();
    char name[64];
    snprintf(name, sizeof name, "calibrated-%.40s", host);
    cJSON_AddStringToObject(root_o, "name", name);
    cJSON_AddStringToObject(root_o, "source", src);
    cJSON *assumed = cJSON_AddArrayToObject(root_o, "assumed");
    if (ncurve_b == 0)
        cJSON_AddItemToArray(assumed, cJSON_CreateString("peak_tflops.bf16 (= measured fp32: no AVX512-BF16, "
                                                         "moetrain's GEMMs run in fp32)"));
    if (!have_intra)
        cJSON_AddItemToArray(assumed, cJSON_CreateString("intra_node (single rank: bw = copy bandwidth, latency 1 us)"));
    if (!have_inter)
        cJSON_AddItemToArray(assumed, cJSON_CreateString("inter_node (no rank on another node: copied from intra_node)"));
    if (natt < CAL_NT)
        cJSON_AddItemToArray(assumed, cJSON_CreateString("efficiency.attention from T = 512 only (--quick)"));
    if (!have_mem) cJSON_AddItemToArray(assumed, cJSON_CreateString("memory_gb (no /proc/meminfo: 1 GB)"));
    cJSON_AddNumberToObject(root_o, "devices", devices);
    cJSON_AddNumberToObject(root_o, "devices_per_node", per_node);
    cJSON *pk = cJSON_AddObjectToObject(root_o, "peak_tflops");
    cJSON_AddNumberToObject(pk, "bf16", r4((ncurve_b ? peak_b : peak) * 1e-3)); /* the bf16 GEMM (train --bf16) */
    cJSON_AddNumberToObject(pk, "fp32", r4(peak * 1e-3));
    cJSON_AddNumberToObject(root_o, "memory_gb", have_mem ? r4(mem_total / per_node * 1e-9) : 1);
    cJSON_AddNumberToObject(root_o, "memory_bw_gbs", r4(m.copy_gbs));
    if (have_mem && mem_total > mem_avail)
        cJSON_AddNumberToObject(root_o, "reserved_gb", r4((mem_total - mem_avail) / per_node * 1e-9));
    /* links: intra bandwidth = the all-to-all's per-rank rate (every rank sending at once,
     * as in the trainer's collectives) when lower than the ping-pong's */
    double a2a_bw = mpi ? (double)a2a_block * (d->size - 1) / a2a_s : 0;
    double ibw = have_intra ? fmin(intra.bw, a2a_bw) : m.copy_gbs * 1e9, ilat = have_intra ? intra.lat_s : 1e-6;
    cJSON_AddItemToObject(root_o, "intra_node", link_obj(ibw, ilat));
    cJSON_AddItemToObject(root_o, "inter_node", have_inter ? link_obj(inter.bw, inter.lat_s) : link_obj(ibw, ilat));
    cJSON *eff = cJSON_AddObjectToObject(root_o, "efficiency");
    cJSON_AddNumberToObject(eff, "attention", r4(att_eff));
    cJSON_AddNumberToObject(eff, "memory", r4(mem_eff));
    cJSON *curve = cJSON_AddArrayToObject(eff, "gemm_curve");
    for (int i = 0; i < ncurve; i++) cJSON_AddItemToArray(curve, num_pair(cg[i], ce[i]));
    if (ncurve_b) {
        cJSON_AddNumberToObject(eff, "attention_bf16", r4(att_eff_b));
        cJSON *cb = cJSON_AddArrayToObject(eff, "gemm_curve_bf16");
        for (int i = 0; i < ncurve_b; i++) cJSON_AddItemToArray(cb, num_pair(cgb[i], ceb[i]));
    }
    /* the node's CPU: one rank alone with each thread count (plan --threads) */
    cJSON *cpu = cJSON_AddObjectToObject(root_o, "cpu");
    cJSON_AddNumberToObject(cpu, "cores_per_node", cores);
    cJSON *byt = cJSON_AddArrayToObject(cpu, "by_threads");
    for (int i = 0; i < nsolo; i++) {
        double speak, sae, g[MT_CLUSTER_CURVE_MAX], e[MT_CLUSTER_CURVE_MAX];
        double speak_b, sae_b = 0, gb[MT_CLUSTER_CURVE_MAX], eb[MT_CLUSTER_CURVE_MAX];
        int nc = cal_curve(solo[i].gemm, solo[i].att_f, solo[i].att_b, &speak, g, e, &sae, NULL);
        int ncb = cal_curve(solo[i].gemm_bf16, solo[i].att_f16, solo[i].att_b16, &speak_b, gb, eb,
                            &sae_b, NULL);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "threads", solo_t[i]);
        cJSON_AddNumberToObject(o, "peak_tflops", r4(speak * 1e-3));
        cJSON_AddNumberToObject(o, "memory_bw_gbs", r4(solo[i].copy_gbs));
        cJSON_AddNumberToObject(o, "attention", r4(sae));
        cJSON_AddNumberToObject(o, "reserve_mb", r4(fmax(0, solo_res[i]) / 1048576.0));
        cJSON *c = cJSON_AddArrayToObject(o, "gemm_curve");
        for (int j = 0; j < nc; j++) cJSON_AddItemToArray(c, num_pair(g[j], e[j]));
        if (ncb) { /* the bf16 GEMM of train --bf16 */
            cJSON_AddNumberToObject(o, "peak_tflops_bf16", r4(speak_b * 1e-3));
            cJSON_AddNumberToObject(o, "attention_bf16", r4(sae_b));
            cJSON *cb = cJSON_AddArrayToObject(o, "gemm_curve_bf16");
            for (int j = 0; j < ncb; j++) cJSON_AddItemToArray(cb, num_pair(gb[j], eb[j]));
        }
        cJSON_AddItemToArray(byt, o);
    }
    if (mpi) {
        /* ring-equivalent per-rank bandwidths: all-reduce = 2 (g-1)/g bytes / bw, the
         * reduce-scatter and all-gather (g-1)/g bytes / bw */
        cJSON *mo = cJSON_AddObjectToObject(root_o, "mpi");
        cJSON_AddNumberToObject(mo, "ranks", d->size);
        cJSON_AddNumberToObject(mo, "per_peer_mb", r4(per_peer / 1048576.0));
        cJSON_AddNumberToObject(mo, "message_mb", (double)(coll_bytes >> 20));
        cJSON_AddNumberToObject(mo, "allreduce_message_mb", (double)(ar_bytes >> 20));
        cJSON *br = cJSON_AddArrayToObject(mo, "by_ranks");
        for (int i = 0; i < ngs; i++) {
            /* the last entry (all ranks) also at the top level */
            cJSON *e = i == ngs - 1 ? mo : cJSON_CreateObject();
            const double g = gs[i];
            if (i < ngs - 1) cJSON_AddNumberToObject(e, "ranks", gs[i]);
            for (int k = 0; k < MT_COLL_N; k++) {
                const double f = (g - 1) / g * (double)(k == MT_COLL_ALLREDUCE ? ar_bytes : coll_bytes);
                char key[64];
                snprintf(key, sizeof key, "%s_bw_gbs", coll_name[k]);
                cJSON_AddNumberToObject(e, key, r4((k == MT_COLL_ALLREDUCE ? 2 : 1) * f / coll_s[i][k] * 1e-9));
                snprintf(key, sizeof key, "%s_scratch", coll_name[k]);
                cJSON_AddNumberToObject(e, key, r4(coll_scr[i][k]));
            }
            cJSON_AddNumberToObject(e, "ep_layer_s", ep_s[i][0]);
            cJSON_AddNumberToObject(e, "ep_byte_s", ep_s[i][1]);
            if (i < ngs - 1) cJSON_AddItemToArray(br, e);
        }
    }
    if (aff < cores)
        cJSON_AddItemToArray(assumed, cJSON_CreateString("cpu.by_threads beyond the CPUs this process may run on "
                                                         "(mpirun binds ranks to cores: use --bind-to none)"));
    /* extras the planner ignores (docs/PLAN.md): the raw figures */
    cJSON *ms = cJSON_AddObjectToObject(root_o, "measured");
    cJSON_AddStringToObject(ms, "blas", mt_blas_corename());
    cJSON_AddNumberToObject(ms, "threads", mt_get_threads());
    add_gemm_rates(ms, "sgemm_gflops", m.gemm);
    if (ncurve_b) add_gemm_rates(ms, "bf16_gemm_gflops", m.gemm_bf16);
    cJSON *at = cJSON_AddArrayToObject(ms, "attention_gflops");
    for (int i = 0; i < CAL_NT; i++) {
        if (m.att_f[i] <= 0) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "T", CAL_T[i]);
        cJSON_AddNumberToObject(o, "tokens", CAL_TOK);
        cJSON_AddNumberToObject(o, "heads", CAL_H);
        cJSON_AddNumberToObject(o, "head_dim", CAL_D);
        cJSON_AddNumberToObject(o, "fwd", r4(m.att_f[i]));
        cJSON_AddNumberToObject(o, "bwd", r4(m.att_b[i]));
        cJSON_AddItemToArray(at, o);
    }
    cJSON_AddNumberToObject(ms, "copy_gbs", r4(m.copy_gbs));
    cJSON_AddNumberToObject(ms, "adamw_gbs", r4(m.adamw_gbs));
    cJSON_AddNumberToObject(ms, "elementwise_mb", quick ? 16 : 64);
    if (have_mem) cJSON_AddNumberToObject(ms, "mem_available_gb", r4(mem_avail * 1e-9));
    if (mpi) {
        cJSON_AddNumberToObject(ms, "ranks", d->size);
        if (have_intra) cJSON_AddItemToObject(ms, "pingpong_intra", link_obj(intra.bw, intra.lat_s));
        if (have_inter) cJSON_AddItemToObject(ms, "pingpong_inter", link_obj(inter.bw, inter.lat_s));
        cJSON *a = cJSON_AddObjectToObject(ms, "alltoall");
        cJSON_AddNumberToObject(a, "block_kb", (double)a2a_block / 1024);
        cJSON_AddNumberToObject(a, "ms", r4(a2a_s * 1e3));
        cJSON_AddNumberToObject(a, "per_rank_gbs", r4(a2a_bw * 1e-9));
        cJSON_AddNumberToObject(a, "latency_us", r4(a2a_small_s * 1e6));
    }
    cJSON_AddNumberToObject(ms, "seconds", r4(mt_now() - t_start));
    char *text = cJSON_Print(root_o);
    cJSON_Delete(root_o);
    size_t len = strlen(text);
    char *out = mt_xmalloc(len + 2);
    memcpy(out, text, len);
    out[len] = '\n';
    cJSON_free(text);

    /* the file must load back: the planner's parser is the judge */
    mt_cluster chk;
    out[len + 1] = 0;
    int rc = mt_cluster_parse(&chk, out, "calibrate: generated cluster");
    if (rc == 0) rc = mt_write_file_atomic(path, out, len + 1);
    if (rc == 0) {
        printf("calibrate: sgemm peak %.1f GFLOP/s (%d shapes, %d curve points), ", peak,
               quick ? CAL_NG - CAL_NNK : CAL_NG, ncurve);
        if (ncurve_b) printf("bf16 gemm peak %.1f GFLOP/s (%d curve points), ", peak_b, ncurve_b);
        else printf("no bf16 gemm (no AVX512-BF16), ");
        printf("attention eff %.2f, copy %.1f GB/s, adamw %.1f GB/s, memory %.1f GB", att_eff, m.copy_gbs,
               m.adamw_gbs, mem_total / per_node * 1e-9);
        if (mpi)
            printf(", intra %.2f GB/s %.1f us, all-to-all %.2f GB/s per rank", ibw * 1e-9, ilat * 1e6, a2a_bw * 1e-9);
        printf("\ncalibrate: wrote %s in %.1f s\n", path, mt_now() - t_start);
    }
    free(out);
    return rc;
}
