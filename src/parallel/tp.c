/* parallel/tp.c — see tp.h. */
#include "parallel/tp.h"

#include <string.h>

#include "base/common.h"
#include "base/trace.h"

static void tp_gather(void *ctx, float *full, const float *local, size_t n) {
    mt_tp *t = ctx;
    MT_ASSERT(n <= (size_t)INT32_MAX);
    mt_trace_begin("comm.tp");
    double t0 = MPI_Wtime();
    MPI_Allgather(local, (int)n, MPI_FLOAT, full, (int)n, MPI_FLOAT, t->g->comm);
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    mt_trace_end();
}

static void tp_reduce(void *ctx, float *out, float *full, size_t n) {
    mt_tp *t = ctx;
    MT_ASSERT(n <= (size_t)INT32_MAX);
    mt_trace_begin("comm.tp");
    double t0 = MPI_Wtime();
    if (t->ops.sp) {
        MPI_Reduce_scatter_block(full, out, (int)(n / (size_t)t->g->size), MPI_FLOAT, MPI_SUM, t->g->comm);
    } else {
        MPI_Allreduce(MPI_IN_PLACE, full, (int)n, MPI_FLOAT, MPI_SUM, t->g->comm);
        if (out != full) memcpy(out, full, n * sizeof(float));
    }
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    mt_trace_end();
}

static void tp_sum_f32(void *ctx, float *x, size_t n) {
    mt_tp *t = ctx;
    mt_group_sum_f32(t->g, x, n);
}

static void tp_sum_f64(void *ctx, double *x, size_t n) {
    mt_tp *t = ctx;
    mt_group_sum_f64(t->g, x, n);
}

void mt_tp_init(mt_tp *t, mt_group *g, int sp) {
    t->g = g;
    t->ops = (mt_tp_ops){.ctx = t, .rank = g->rank, .size = g->size, .sp = sp, .gather = tp_gather,
                         .reduce = tp_reduce, .sum_f32 = tp_sum_f32, .sum_f64 = tp_sum_f64};
}
