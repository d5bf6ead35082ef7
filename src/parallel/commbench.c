/* parallel/commbench.c — communication measurements (see commbench.h). */
#include "parallel/commbench.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "base/common.h"
#include "parallel/a2a.h"
#include "parallel/watchdog.h"

mt_bench_link mt_bench_pingpong(mt_dist *d, int peer, int quick) {
    mt_bench_link r = {0, 0};
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

double mt_bench_alltoall(mt_dist *d, size_t block, int reps) {
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

void mt_bench_quiet_barrier(mt_dist *d) {
    MPI_Request req;
    MPI_Ibarrier(d->world, &req);
    mt_watch_begin("MPI_Ibarrier + MPI_Test (quiet barrier)", d->world);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    mt_watch_end();
}

void mt_bench_host_hashes(mt_dist *d, uint64_t *all) {
    char host[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(host, &len);
    unsigned long long h = 1469598103934665603ULL; /* FNV-1a */
    for (int i = 0; i < len; i++) h = (h ^ (unsigned char)host[i]) * 1099511628211ULL;
    MPI_Allgather(&h, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, d->world);
}

void mt_bench_collective(mt_group *grp, int which, size_t bytes, int slices, int reps, double *secs, double *scratch) {
    MPI_Comm comm = grp->comm;
    const size_t n = bytes / sizeof(float), g = (size_t)grp->size;
    MT_ASSERT(slices >= 1);
    float *buf = mt_alloc(n * (size_t)slices * sizeof(float)), *shard = mt_alloc((n / g + 1) * sizeof(float));
    int *cnt = mt_xmalloc(sizeof(int) * g * 2), *dis = cnt + g;
    for (size_t r = 0; r < g; r++) {
        size_t lo = n * r / g, hi = n * (r + 1) / g;
        cnt[r] = (int)(hi - lo);
        dis[r] = (int)lo;
    }
    double best = INFINITY, extra = 0;
    for (int i = 0; i < reps + 1; i++) {
        float *x = buf + n * (size_t)(i % slices);
        double rss = mt_proc_status_kb("VmRSS:");
        int hwm_ok = mt_reset_peak_rss() == 0;
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        if (which == MT_COLL_ALLREDUCE) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, comm);
        else if (which == MT_COLL_REDUCE_SCATTER) MPI_Reduce_scatter(x, shard, cnt, MPI_FLOAT, MPI_SUM, comm);
        else MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, dis, MPI_FLOAT, comm);
        double t = MPI_Wtime() - t0;
        double hwm = mt_proc_status_kb("VmHWM:");
        double e = hwm_ok && hwm > rss ? (hwm - rss) * 1024.0 : 0;
        if (e > extra) extra = e;
        if (i > 0 && t < best) best = t; /* the first one is a warm-up */
    }
    double v[2] = {best, extra};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, comm);
    *secs = v[0];
    *scratch = v[1] / (double)bytes;
    mt_free(buf);
    mt_free(shard);
    free(cnt);
}

void mt_bench_ep_exchange(mt_group *g, int quick, double *layer_s, double *byte_s) {
    MPI_Comm comm = g->comm;
    const int rank = g->rank, size = g->size;
    const int C = 512, K = 2, E = 8 * size, ns[2] = {256, quick ? 1024 : 2048}, reps = quick ? 3 : 6;
    mt_a2a a;
    *layer_s = *byte_s = 0;
    if (mt_a2a_init(&a, comm, 0) != 0) return;
    double t[2];
    for (int q = 0; q < 2; q++) {
        const int N = ns[q];
        float *x = mt_alloc(sizeof(float) * (size_t)N * C), *w = mt_alloc(sizeof(float) * (size_t)N * K);
        float *out = mt_alloc(sizeof(float) * (size_t)N * C), *outk = mt_alloc(sizeof(float) * (size_t)N * (C + K));
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
            float *ye = mt_alloc(sizeof(float) * ((size_t)p.R * C + 1));
            float *v = mt_alloc(sizeof(float) * ((size_t)p.R + 1));
            mt_a2a_combine(&a, &p, out, xe, p.w);
            mt_a2a_gather(&a, &p, ye, out);
            mt_a2a_req rq = {0}; /* the backward's rows with the routing-weight gradients, as the trainer sends them */
            mt_a2a_dispatch_bwd_begin(&a, &p, &rq, ye, v);
            mt_a2a_combine_end(&a, &rq, outk);
            double dt = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
            if (r > 0 && dt < best) best = dt; /* the first one is a warm-up */
            mt_free(ye);
            mt_free(v);
            mt_free(xe);
            mt_a2a_plan_free(&p);
        }
        t[q] = best;
        mt_free(x), mt_free(w), mt_free(out), mt_free(outk);
        free(sel);
    }
    mt_a2a_free(&a);
    const double b1 = (double)ns[0] * K * C * 4, b2 = (double)ns[1] * K * C * 4;
    if (!isfinite(t[0]) || !isfinite(t[1])) return;
    *byte_s = fmax(0, (t[1] - t[0]) / (b2 - b1));
    *layer_s = fmax(0, t[0] - *byte_s * b1);
}
