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
#include "dist/a2a.h"
#include "dist/dist.h"
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
    double gemm_bf16[CAL_NG];        /* the same in bf16 mode (mt_set_gemm_bf16), -1 = not measured */
    double att_f[CAL_NT], att_b[CAL_NT]; /* GFLOP/s fwd, bwd (bwd FLOPs = 2.5 x fwd) */
    double att_f16[CAL_NT], att_b16[CAL_NT]; /* the same in bf16 mode, -1 = not measured */
    double copy_gbs, adamw_gbs;      /* bytes read + written */
} cal_meas;

static float *cal_fill(size_t n, uint64_t seed) {
    float *a = mt_alloc(sizeof(float) * (n ? n : 1));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = 2.0f * (float)mt_u01(mt_hash4(seed, i, 0x63616cULL, 0)) - 1.0f;
    return a;
}

static double cal_status_kb(const char *key);

/* rate[i * CAL_NNK + j] = GFLOP/s of the forward GEMM of shape (CAL_M[i], CAL_NK[j]), i < nm,
 * in the current precision mode */
static void time_grid(double *rate, int nm, double bud, const float *x, const float *W, float *y) {
    for (int i = 0; i < nm; i++)
        for (int j = 0; j < CAL_NNK; j++) {
            int M = CAL_M[i], N = CAL_NK[j][0], K = CAL_NK[j][1];
            double t;
            MT_BEST_TIME(t, bud, mt_linear_fwd(y, x, W, M, K, N, 0.0f));
            rate[i * CAL_NNK + j] = 2.0 * M * N * K / t * 1e-9;
        }
}

/* reserve: the resident bytes that are not the measurement's own buffers, read while they
 * are live (binary, libraries, BLAS / OpenMP per-thread buffers, MPI, allocator slack).
 * bf16: the grid again with every GEMM in bf16 mode (train --bf16's kernel; the CPU has
 * AVX512-BF16), after the reserve was read (the fp32 trainer's) */
static void cal_gemm(cal_meas *m, int quick, double *reserve, int bf16) {
    const double bud = quick ? 0.03 : 0.25;
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
    time_grid(m->gemm, nm, bud, x, W, y);
    if (reserve) {
        /* memory freed by the calibration's earlier phases stays in the heap (mt_memory_policy):
         * hand it back first, so only what a process really keeps is counted */
        malloc_trim(0);
        *reserve = cal_status_kb("VmRSS:") * 1024.0 - 4.0 * (double)(in_max + w_max + out_max);
    }
    if (bf16 && mt_set_gemm_bf16(1) == 0) {
        time_grid(m->gemm_bf16, nm, bud, x, W, y);
        mt_set_gemm_bf16(0);
    }
    mt_free(x); mt_free(W); mt_free(y);
}

static double cal_att_flops(int T) { /* causal forward of CAL_TOK tokens, as the planner counts */
    return 4.0 * CAL_D * CAL_H * (double)T * (T + 1) / 2.0 * (CAL_TOK / T);
}

/* bf16: also in bf16 mode (train --bf16: attention's products on bf16 pairs) */
static void cal_attention(cal_meas *m, int quick, int bf16) {
    const double bud = quick ? 0.05 : 0.4;
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
            if (mode && mt_set_gemm_bf16(1) != 0) break;
            double tf, tb;
            MT_BEST_TIME(tf, bud, mt_attention_fwd(o, l, q, k, v, NULL, B, T, CAL_H, CAL_H, CAL_D, scratch, nthr));
            MT_BEST_TIME(tb, bud, mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, NULL, B, T, CAL_H, CAL_H, CAL_D,
                                               scratch, nthr));
            if (mode) mt_set_gemm_bf16(0);
            rate_f[mode][i] = ff / tf * 1e-9;
            rate_b[mode][i] = 2.5 * ff / tb * 1e-9;
        }
        mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(o); mt_free(l);
        mt_free(dq); mt_free(dk); mt_free(dv); mt_free(scratch);
    }
}

static void cal_memory(cal_meas *m, int quick) {
    const double bud = quick ? 0.1 : 0.5;
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

/* A "Key:   123 kB" line of /proc/self/status, in kB (0 if missing). */
static double cal_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) { kb = strtod(line + n, NULL); break; }
    fclose(f);
    return kb;
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

/* ---- MPI -------------------------------------------------------------------------- */

typedef struct {
    double lat_s, bw;      /* one-way latency (s) and bandwidth (bytes/s) of a ping-pong */
} cal_link;

/* Ping-pong between world ranks 0 and `peer` (every rank calls; only the two take part). */
static cal_link cal_pingpong(mt_dist *d, int peer, int quick) {
    cal_link r = {0, 0};
    const int iters = quick ? 200 : 1000, big_iters = quick ? 5 : 20;
    const size_t big = quick ? (size_t)4 << 20 : (size_t)16 << 20;
    char *buf = mt_xcalloc(big, 1);
    double res[2] = {0, 0};
    mt_dist_barrier(d);
    if (d->rank == 0 || d->rank == peer) {
        const int other = d->rank == 0 ? peer : 0;
        for (int pass = 0; pass < 2; pass++) {
            const size_t bytes = pass ? big : 8;
            const int n = pass ? big_iters : iters;
            for (int w = 0; w < 2; w++) { /* warm-up round trips, then the timed ones */
                int reps = w ? n : 3;
                double t0 = MPI_Wtime();
                for (int i = 0; i < reps; i++) {
                    if (d->rank == 0) {
                        MPI_Send(buf, (int)bytes, MPI_BYTE, other, 7, d->world);
                        MPI_Recv(buf, (int)bytes, MPI_BYTE, other, 7, d->world, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(buf, (int)bytes, MPI_BYTE, other, 7, d->world, MPI_STATUS_IGNORE);
                        MPI_Send(buf, (int)bytes, MPI_BYTE, other, 7, d->world);
                    }
                }
                if (w) res[pass] = (MPI_Wtime() - t0) / (2.0 * reps); /* one way */
            }
        }
    }
    MPI_Bcast(res, 2, MPI_DOUBLE, 0, d->world);
    free(buf);
    r.lat_s = res[0];
    double t = res[1] - res[0];
    r.bw = (double)big / (t > 0 ? t : res[1]);
    return r;
}

/* MPI_Alltoall over the world with `block` bytes per pair: seconds of the slowest rank. */
static double cal_alltoall(mt_dist *d, size_t block, int reps) {
    char *s = mt_xcalloc(block * (size_t)d->size, 1), *r = mt_xcalloc(block * (size_t)d->size, 1);
    double best = INFINITY;
    for (int i = 0; i < reps + 1; i++) {
        mt_dist_barrier(d);
        double t0 = MPI_Wtime();
        MPI_Alltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE, d->world);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, d->world);
        if (i > 0 && t < best) best = t; /* the first one is a warm-up */
    }
    free(s);
    free(r);
    return best;
}

/* The ranks other than 0 wait without spinning (a blocking MPI call polls and would take
 * a core from the rank that measures alone). */
static void cal_quiet_barrier(mt_dist *d) {
    MPI_Request req;
    MPI_Ibarrier(d->world, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* One collective as the trainer calls it: time of the slowest rank (best of reps after a
 * warm-up) and its temporary memory (VmHWM over VmRSS before the call, max over ranks). */
enum { COLL_ALLREDUCE = 0, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_N };
static const char *const coll_name[COLL_N] = {"allreduce", "reduce_scatter", "allgather"};

static void cal_collective(MPI_Comm comm, int which, size_t bytes, int reps, double *secs, double *scratch) {
    int crank, csize;
    MPI_Comm_rank(comm, &crank);
    MPI_Comm_size(comm, &csize);
    const size_t n = bytes / sizeof(float), g = (size_t)csize;
    float *x = mt_alloc(n * sizeof(float)), *shard = mt_alloc((n / g + 1) * sizeof(float));
    int *cnt = mt_xmalloc(sizeof(int) * g * 2), *dis = cnt + g;
    for (size_t r = 0; r < g; r++) {
        size_t lo = n * r / g, hi = n * (r + 1) / g;
        cnt[r] = (int)(hi - lo);
        dis[r] = (int)lo;
    }
    double best = INFINITY, extra = 0;
    for (int i = 0; i < reps + 1; i++) {
        double rss = cal_status_kb("VmRSS:");
        int hwm_ok = mt_reset_peak_rss() == 0;
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        if (which == COLL_ALLREDUCE) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, comm);
        else if (which == COLL_REDUCE_SCATTER) MPI_Reduce_scatter(x, shard, cnt, MPI_FLOAT, MPI_SUM, comm);
        else MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, dis, MPI_FLOAT, comm);
        double t = MPI_Wtime() - t0;
        double hwm = cal_status_kb("VmHWM:");
        double e = hwm_ok && hwm > rss ? (hwm - rss) * 1024.0 : 0;
        if (e > extra) extra = e;
        if (i > 0 && t < best) best = t; /* the first one is a warm-up */
    }
    double v[2] = {best, extra};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, comm);
    *secs = v[0];
    *scratch = v[1] / (double)bytes;
    mt_free(x);
    mt_free(shard);
    free(cnt);
}

/* The trainer's expert exchange of one MoE layer (dist/ep.c: dispatch and combine forward;
 * gather, dispatch backward and the routing weights' return backward) over comm, the
 * slowest rank's best time, at two token counts per rank (C = 512, top-2 of 8 experts per
 * rank, uniform random routing, so no rank waits for a busier one): fitted as
 * layer_s + byte_s x bytes of the rows a rank sends (n x k x C x 4). */
static void cal_ep_exchange(MPI_Comm comm, int quick, double *layer_s, double *byte_s) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int C = 512, K = 2, E = 8 * size, ns[2] = {256, quick ? 1024 : 2048}, reps = quick ? 3 : 6;
    mt_a2a a;
    *layer_s = *byte_s = 0;
    if (mt_a2a_init(&a, comm, 0) != 0) return;
    double t[2];
    for (int q = 0; q < 2; q++) {
        const int N = ns[q];
        float *x = mt_alloc(sizeof(float) * (size_t)N * C), *w = mt_alloc(sizeof(float) * (size_t)N * K);
        float *out = mt_alloc(sizeof(float) * (size_t)N * C), *vs = mt_alloc(sizeof(float) * (size_t)N * K);
        int32_t *sel = mt_xmalloc(sizeof(int32_t) * (size_t)N * K);
        for (int i = 0; i < N * C; i++) x[i] = (float)(i % 97) * 0.01f;
        for (int i = 0; i < N; i++) {
            int e0 = (int)(mt_hash4(7, (uint64_t)rank, (uint64_t)i, 0) % (uint64_t)E);
            int e1 = (int)((e0 + 1 + mt_hash4(7, (uint64_t)rank, (uint64_t)i, 1) % (uint64_t)(E - 1)) % (uint64_t)E);
            sel[i * K] = e0, sel[i * K + 1] = e1;
            w[i * K] = 0.6f, w[i * K + 1] = 0.4f;
        }
        double best = INFINITY;
        for (int r = 0; r < reps + 1; r++) {
            MPI_Barrier(comm);
            double t0 = MPI_Wtime();
            mt_a2a_plan p;
            float *xe = NULL;
            if (mt_a2a_dispatch(&a, MT_A2A_FLAT, &p, &xe, x, sel, w, N, K, C, E) != 0) break;
            float *ye = mt_alloc(sizeof(float) * ((size_t)p.R * C + 1)), *v = mt_alloc(sizeof(float) * ((size_t)p.R + 1));
            mt_a2a_combine(&a, &p, out, xe, p.w);
            mt_a2a_gather(&a, &p, ye, out);
            mt_a2a_dispatch_bwd(&a, &p, out, ye);
            mt_a2a_to_source(&a, &p, vs, v);
            double dt = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
            if (r > 0 && dt < best) best = dt; /* the first one is a warm-up */
            mt_free(ye);
            mt_free(v);
            mt_free(xe);
            mt_a2a_plan_free(&p);
        }
        t[q] = best;
        mt_free(x), mt_free(w), mt_free(out), mt_free(vs);
        free(sel);
    }
    mt_a2a_free(&a);
    const double b1 = (double)ns[0] * K * C * 4, b2 = (double)ns[1] * K * C * 4;
    if (!isfinite(t[0]) || !isfinite(t[1])) return;
    *byte_s = fmax(0, (t[1] - t[0]) / (b2 - b1));
    *layer_s = fmax(0, t[0] - *byte_s * b1);
}

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

int mt_calibrate_under_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
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
    if (mpi) MPI_Allreduce(MPI_IN_PLACE, &bf16, 1, MPI_INT, MPI_MIN, d->world);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    const int aff = cal_cpus_allowed(cores);
    int nsolo = 0, solo_t[MT_CLUSTER_THREADS_MAX];
    for (int t = 1; t <= aff && nsolo < MT_CLUSTER_THREADS_MAX; t *= 2) solo_t[nsolo++] = t;
    if (solo_t[nsolo - 1] < aff && nsolo < MT_CLUSTER_THREADS_MAX) solo_t[nsolo++] = aff;
    cal_meas solo[MT_CLUSTER_THREADS_MAX];
    double solo_res[MT_CLUSTER_THREADS_MAX];
    for (int i = 0; i < nsolo; i++) {
        if (root) {
            mt_set_threads(solo_t[i]);
            memset(&solo[i], 0, sizeof solo[i]);
            cal_gemm(&solo[i], quick, &solo_res[i], bf16);
            cal_attention(&solo[i], 1, bf16); /* T = 512 only */
            cal_memory(&solo[i], quick);
        }
        if (mpi) cal_quiet_barrier(d);
    }
    mt_set_threads(cal_threads);

    /* 2. every rank at once with the calibration's threads (the top-level figures) */
    cal_meas m;
    memset(&m, 0, sizeof m);
    if (mpi) mt_dist_barrier(d);
    cal_gemm(&m, quick, NULL, bf16);
    cal_attention(&m, quick, bf16);
    cal_memory(&m, quick);
    /* the slowest rank's figures (-1 = skipped stays -1: every rank skips the same) */
    if (mpi) MPI_Allreduce(MPI_IN_PLACE, &m, (int)(sizeof m / sizeof(double)), MPI_DOUBLE, MPI_MIN, d->world);

    /* links: partners of rank 0 on the same node and on another node (host name hash) */
    const double rss_mpi0 = cal_status_kb("RssShmem:"); /* MPI's shared-memory segments */
    cal_link intra = {0, 0}, inter = {0, 0};
    double a2a_s = 0, a2a_small_s = 0;
    const size_t a2a_block = quick ? (size_t)256 << 10 : (size_t)1 << 20;
    int have_intra = 0, have_inter = 0;
    if (mpi) {
        char host[MPI_MAX_PROCESSOR_NAME];
        int len = 0;
        MPI_Get_processor_name(host, &len);
        unsigned long long h = 1469598103934665603ULL, *all = mt_xmalloc(sizeof *all * (size_t)d->size);
        for (int i = 0; i < len; i++) h = (h ^ (unsigned char)host[i]) * 1099511628211ULL;
        MPI_Allgather(&h, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, d->world);
        int pin = -1, pout = -1;
        for (int r = 1; r < d->size; r++) {
            if (all[r] == all[0] && pin < 0) pin = r;
            if (all[r] != all[0] && pout < 0) pout = r;
        }
        free(all);
        if (pin > 0) { intra = cal_pingpong(d, pin, quick); have_intra = 1; }
        if (pout > 0) { inter = cal_pingpong(d, pout, quick); have_inter = 1; }
        a2a_s = cal_alltoall(d, a2a_block, quick ? 3 : 10);
        a2a_small_s = cal_alltoall(d, 8, quick ? 20 : 100);
    }
    /* 3. the trainer's collectives on a large message (its gradients are 100s of MB):
     * ring-equivalent bandwidth and temporary memory; the resident shared memory MPI adds
     * per other rank of the node (RssShmem before and after all the MPI traffic: private
     * heap growth would mix in the allocator's slack) */
    const size_t coll_bytes = quick ? (size_t)64 << 20 : (size_t)256 << 20, ar_bytes = (size_t)25 << 20;
    /* on the first g = 2, 4, ... and all ranks at once (the others wait without spinning):
     * with more ranks than cores the collectives share them, as the trainer's ranks do */
    enum { NG = 8 };
    int ngs = 0, gs[NG];
    double coll_s[NG][COLL_N], coll_scr[NG][COLL_N], per_peer = 0, ep_s[NG][2];
    memset(ep_s, 0, sizeof ep_s);
    memset(coll_s, 0, sizeof coll_s);
    memset(coll_scr, 0, sizeof coll_scr);
    if (mpi) {
        for (int g = 2; g < d->size && ngs < NG - 1; g *= 2) gs[ngs++] = g;
        gs[ngs++] = d->size;
        for (int i = 0; i < ngs; i++) {
            MPI_Comm sub;
            MPI_Comm_split(d->world, d->rank < gs[i], d->rank, &sub);
            /* the all-reduce on the trainer's default bucket (25 MiB), the others on the message */
            if (d->rank < gs[i]) {
                for (int k = 0; k < COLL_N; k++)
                    cal_collective(sub, k, k == COLL_ALLREDUCE ? ar_bytes : coll_bytes,
                                   k == COLL_ALLREDUCE ? 6 : quick ? 3 : 4, &coll_s[i][k], &coll_scr[i][k]);
                cal_ep_exchange(sub, quick, &ep_s[i][0], &ep_s[i][1]);
            }
            MPI_Comm_free(&sub);
            cal_quiet_barrier(d);
        }
        double grow = (cal_status_kb("RssShmem:") - rss_mpi0) * 1024.0;
        MPI_Allreduce(MPI_IN_PLACE, &grow, 1, MPI_DOUBLE, MPI_MAX, d->world);
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
            for (int k = 0; k < COLL_N; k++) {
                const double f = (g - 1) / g * (double)(k == COLL_ALLREDUCE ? ar_bytes : coll_bytes);
                char key[64];
                snprintf(key, sizeof key, "%s_bw_gbs", coll_name[k]);
                cJSON_AddNumberToObject(e, key, r4((k == COLL_ALLREDUCE ? 2 : 1) * f / coll_s[i][k] * 1e-9));
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
