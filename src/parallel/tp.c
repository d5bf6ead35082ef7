/* parallel/tp.c — see tp.h. */
#include "parallel/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"

static void tp_gather(void *ctx, float *full, const float *local, size_t n) {
    mt_tp *t = ctx;
    MT_ASSERT(n <= (size_t)INT32_MAX);
    mt_trace_begin("comm.tp");
    double t0 = MPI_Wtime();
    MPI_Allgather(local, (int)n, MPI_FLOAT, full, (int)n, MPI_FLOAT, t->g->comm);
    t->st.bytes += (int64_t)(4 * (double)n * (t->g->size - 1)), t->st.bytes_fp32 += (int64_t)(4 * (double)n * (t->g->size - 1));
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    mt_trace_end();
}

/* Blocks [lo, hi) of nb owned by rank r of W: whole blocks, so each scale has one owner. */
static void block_range(size_t nb, int r, int W, size_t *lo, size_t *hi) {
    *lo = nb * (size_t)r / (size_t)W, *hi = nb * (size_t)(r + 1) / (size_t)W;
}

void mt_q8_encode(const float *x, size_t n, float *sc, int8_t *q, double *err_sq, double *ref_sq) {
    const size_t B = MT_FLASHCOMM_BLOCK;
    double err = 0, ref = 0;
    for (size_t s = 0, b = 0; s < n; s += B, b++) {
        const size_t e = s + B < n ? s + B : n;
        float amax = 0;
        for (size_t i = s; i < e; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const float scale = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        sc[b] = scale;
        for (size_t i = s; i < e; i++) {
            const float v = rintf(x[i] * inv);
            q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            const double d = (double)q[i] * scale - x[i];
            err += d * d, ref += (double)x[i] * x[i];
        }
    }
    *err_sq += err, *ref_sq += ref;
}

void mt_tp_allreduce_int8(mt_tp *t, float *x, size_t n) {
    const int W = t->g->size, me = t->g->rank;
    const size_t B = MT_FLASHCOMM_BLOCK, nb = (n + B - 1) / B;
    /* rank r's part: values dsp[r] .. + cnt[r] (whole blocks), sent as its blocks' scales then
     * its INT8 values, bc[r] bytes at bd[r] of the gathered buffer */
    int *cnt = t->cnt, *dsp = cnt + W, *bc = dsp + W, *bd = bc + W;
    size_t most = 0, longest = 0;
    for (int r = 0; r < W; r++) {
        size_t lo, hi;
        block_range(nb, r, W, &lo, &hi);
        const size_t a = lo * B, e = hi * B < n ? hi * B : n;
        cnt[r] = (int)(e > a ? e - a : 0), dsp[r] = (int)a, bc[r] = (int)(4 * (hi - lo) + (size_t)cnt[r]);
        most = (size_t)bc[r] > most ? (size_t)bc[r] : most;
        longest = (size_t)cnt[r] > longest ? (size_t)cnt[r] : longest;
    }
    most = (most + 3) & ~(size_t)3; /* the next part's scales stay 4-byte aligned */
    for (int r = 0; r < W; r++) bd[r] = (int)(most * (size_t)r);
    /* scratch: the summed part (fp32), this rank's packed part, every rank's */
    const size_t sum_bytes = (4 * (longest + 1) + 63) & ~(size_t)63, need = sum_bytes + most * (size_t)(W + 1);
    if (t->cap < need) {
        free(t->buf);
        t->cap = need;
        t->buf = mt_xmalloc(t->cap);
    }
    float *sum = (float *)t->buf;
    uint8_t *pk = t->buf + sum_bytes, *all = pk + most;
    MPI_Reduce_scatter(x, sum, cnt, MPI_FLOAT, MPI_SUM, t->g->comm); /* rank r's blocks summed on rank r */
    size_t lo, hi;
    block_range(nb, me, W, &lo, &hi);
    mt_q8_encode(sum, (size_t)cnt[me], (float *)pk, (int8_t *)(pk + 4 * (hi - lo)), &t->st.err_sq, &t->st.ref_sq);
    MPI_Allgatherv(pk, bc[me], MPI_BYTE, all, bc, bd, MPI_BYTE, t->g->comm);
    for (int r = 0; r < W; r++) { /* dequantise every part, this rank's too */
        const float *rs = (const float *)(all + bd[r]);
        const int8_t *rq = (const int8_t *)(all + bd[r] + (size_t)bc[r] - (size_t)cnt[r]);
        for (size_t i = 0; i < (size_t)cnt[r]; i++) x[(size_t)dsp[r] + i] = (float)rq[i] * rs[i / B];
    }
    const double f = (double)(W - 1) / W;
    t->st.bytes += (int64_t)(f * 4 * (double)n + f * (double)n + f * 4 * (double)nb);
    t->st.bytes_fp32 += (int64_t)(2 * f * 4 * (double)n);
}

static void tp_reduce(void *ctx, float *out, float *full, size_t n) {
    mt_tp *t = ctx;
    MT_ASSERT(n <= (size_t)INT32_MAX);
    mt_trace_begin("comm.tp");
    double t0 = MPI_Wtime();
    const double f = (double)(t->g->size - 1) / t->g->size;
    if (t->ops.sp) {
        MPI_Reduce_scatter_block(full, out, (int)(n / (size_t)t->g->size), MPI_FLOAT, MPI_SUM, t->g->comm);
        t->st.bytes += (int64_t)(f * 4 * (double)n), t->st.bytes_fp32 += (int64_t)(f * 4 * (double)n);
    } else if (t->flash) {
        mt_tp_allreduce_int8(t, full, n);
        if (out != full) memcpy(out, full, n * sizeof(float));
    } else {
        t->st.bytes += (int64_t)(2 * f * 4 * (double)n), t->st.bytes_fp32 += (int64_t)(2 * f * 4 * (double)n);
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

void mt_tp_init(mt_tp *t, mt_group *g, int sp, int flash) {
    memset(t, 0, sizeof *t);
    t->g = g;
    t->flash = flash && !sp;
    t->cnt = mt_xmalloc(sizeof(int) * 4 * (size_t)g->size);
    t->ops = (mt_tp_ops){.ctx = t, .rank = g->rank, .size = g->size, .sp = sp, .gather = tp_gather,
                         .reduce = tp_reduce, .sum_f32 = tp_sum_f32, .sum_f64 = tp_sum_f64};
}

void mt_tp_free(mt_tp *t) {
    free(t->buf), free(t->cnt);
    t->buf = NULL, t->cnt = NULL, t->cap = 0;
}
