/* parallel/ep.c — mt_ep_ops over the a2a collective (see ep.h). */
#include "parallel/ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "parallel/dist.h"
#include "kernels/ops.h"

void mt_ep_count_rows(const mt_a2a *a, const int32_t *sel, int N, int K, int E, mt_ep_count *c) {
    const int P = a->size, LE = E / P;
    unsigned char *rk = mt_xcalloc((size_t)P, 1), *nd = mt_xcalloc((size_t)a->nnodes, 1);
    for (int t = 0; t < N; t++) {
        memset(rk, 0, (size_t)P);
        memset(nd, 0, (size_t)a->nnodes);
        for (int j = 0; j < K; j++) {
            int r = sel[(size_t)t * K + j] / LE;
            rk[r] = 1;
            nd[a->node_of[r]] = 1;
        }
        for (int r = 0; r < P; r++) {
            if (!rk[r] || r == a->rank) continue;
            int remote = a->node_of[r] != a->node_id;
            if (remote) c->inter_rows[0]++;
            else c->intra_rows[0]++;
            if (!remote) {
                c->intra_rows[1]++; /* own node: sent directly */
            } else {                /* remote node: the relay fans out to the others */
                int n = a->node_of[r], sz = a->node_start[n + 1] - a->node_start[n];
                int relay = a->node_rank[a->node_start[n] + a->local % sz];
                if (r != relay) c->intra_rows[1]++;
            }
        }
        for (int n = 0; n < a->nnodes; n++)
            if (nd[n] && n != a->node_id) c->inter_rows[1]++;
    }
    free(rk);
    free(nd);
}

/* The exchange's state of one batch. Split (mt_ep.split): the combine, the gather and the
 * dispatch backward (with the routing-weight gradients beside its rows) are in flight from
 * the call that begins them to wait(), the block computing the shared experts or the gate|up
 * weight gradient meanwhile; the dispatch, which nothing can overlap inside the block,
 * completes in its call (in a fiber pair the other fiber computes while it travels). Otherwise
 * every operation completes in its call. What an operation writes into the caller's buffer
 * appears at wait() either way. */
typedef struct {
    mt_a2a_plan plan;
    mt_ep_count rows;      /* rows of one exchange along this plan */
    float *sum;            /* [N, C] combine / [N, C + K] dispatch_bwd result before it reaches the caller */
    float *dst;            /* pending: the caller's buffer and how it receives sum */
    int accumulate;
    float *vs;             /* pending dispatch_bwd: where the K values of each token go */
    mt_a2a_req req;        /* the combine (or dispatch backward) or gather in flight */
    float *gather_dst;     /* the gather's destination */
    double t_begin;        /* when the operation in flight began (the trace's in-flight span) */
} ep_plan;

/* the [N, C + K] buffer a combine or dispatch_bwd sums into, kept for the batch's next one */
static float *plan_sum(ep_plan *pp) {
    if (!pp->sum) pp->sum = mt_alloc(sizeof(float) * ((size_t)pp->plan.N * (pp->plan.C + pp->plan.K) + 1));
    return pp->sum;
}

/* completes the operation in flight, if any (the wait is exposed communication) */
static void ep_finish(mt_ep *e, ep_plan *pp) {
    if (pp->req.kind == 0) return;
    mt_trace_begin("comm.a2a.wait");
    if (pp->req.kind == 1) mt_a2a_combine_end(&e->a2a, &pp->req, plan_sum(pp));
    else mt_a2a_gather_end(&e->a2a, &pp->req, pp->gather_dst);
    mt_trace_end();
    mt_trace_async("a2a in flight", pp->t_begin, mt_now());
}

static void add_count(mt_ep *e, const ep_plan *p) {
    for (int m = 0; m < 2; m++) {
        e->count.inter_rows[m] += p->rows.inter_rows[m];
        e->count.intra_rows[m] += p->rows.intra_rows[m];
    }
}

static void ep_dispatch(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16, const int32_t *sel,
                        const float *w, int N, int K, int C, int E) {
    mt_ep *e = ctx;
    MT_ASSERT(x && !x16); /* rows travel as fp32 (bf16_rows = 0) */
    ep_plan *pp = mt_xcalloc(1, sizeof *pp);
    mt_a2a_plan *p = &pp->plan;
    float *xe = NULL;
    mt_ep_count_rows(&e->a2a, sel, N, K, E, &pp->rows);
    add_count(e, pp);
    mt_trace_begin("comm.a2a");
    int rc = mt_a2a_dispatch(&e->a2a, e->mode, p, &xe, x, sel, w, N, K, C, E);
    mt_trace_end();
    if (rc != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "expert-parallel dispatch failed: %s", mt_last_error());
        mt_dist_abort(msg);
    }
    if (e->nrows == e->caprows) {
        e->caprows = e->caprows ? 2 * e->caprows : 256;
        e->rows = mt_xrealloc(e->rows, sizeof(int64_t) * (size_t)e->caprows);
    }
    e->rows[e->nrows++] = p->R;
    b->R = p->R;
    b->off = p->off;
    b->xe = xe;
    b->xe16 = NULL;
    b->w = p->w;
    b->plan = pp;
}

static void ep_combine(void *ctx, mt_ep_batch *b, float *out, const float *y) {
    mt_ep *e = ctx;
    ep_plan *pp = b->plan;
    MT_ASSERT(!pp->dst);
    add_count(e, pp);
    mt_trace_begin("comm.a2a");
    pp->t_begin = mt_now();
    mt_a2a_combine_begin(&e->a2a, &pp->plan, &pp->req, y, pp->plan.w);
    mt_trace_end();
    if (!e->split) ep_finish(e, pp);
    pp->dst = out;
    pp->accumulate = 1;
}

static void ep_gather(void *ctx, mt_ep_batch *b, float *xr, uint16_t *xr16, const float *x) {
    mt_ep *e = ctx;
    ep_plan *pp = b->plan;
    MT_ASSERT(xr && !xr16 && pp->req.kind == 0);
    add_count(e, pp);
    mt_trace_begin("comm.a2a");
    pp->t_begin = mt_now();
    pp->gather_dst = xr;
    mt_a2a_gather_begin(&e->a2a, &pp->plan, &pp->req, x);
    mt_trace_end();
    if (!e->split) ep_finish(e, pp);
}

static void ep_redispatch(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16) {
    (void)ctx, (void)b, (void)x, (void)x16; /* the dispatched rows are kept until release */
}

static void ep_dispatch_bwd(void *ctx, mt_ep_batch *b, float *dx, const float *dxe, int accumulate, float *vs,
                            const float *v) {
    mt_ep *e = ctx;
    ep_plan *pp = b->plan;
    MT_ASSERT(!pp->dst && pp->req.kind == 0);
    add_count(e, pp);
    mt_trace_begin("comm.a2a");
    pp->t_begin = mt_now();
    mt_a2a_dispatch_bwd_begin(&e->a2a, &pp->plan, &pp->req, dxe, v); /* rows of C + K: dx, the values */
    mt_trace_end();
    if (!e->split) ep_finish(e, pp);
    pp->dst = dx;
    pp->accumulate = accumulate;
    pp->vs = vs;
}

static int ep_test(void *ctx, mt_ep_batch *b) {
    (void)ctx;
    ep_plan *pp = b->plan;
    return !pp || mt_a2a_test(&pp->req);
}

static void ep_wait(void *ctx, mt_ep_batch *b) {
    mt_ep *e = ctx;
    ep_plan *pp = b->plan;
    if (!pp) return;
    ep_finish(e, pp);
    if (!pp->dst) return;
    const int N = pp->plan.N, C = pp->plan.C, K = pp->plan.K;
    if (pp->vs) { /* rows of C + K: the token's row, then its K values (one parallel loop,
                   * not a parallel region per token) */
        float *dst = pp->dst, *vs = pp->vs;
        const float *sum = pp->sum;
        const int acc = pp->accumulate;
#pragma omp parallel for schedule(static)
        for (int t = 0; t < N; t++) {
            const float *r = sum + (size_t)t * (C + K);
            float *d = dst + (size_t)t * C;
            if (acc)
                for (int c = 0; c < C; c++) d[c] += r[c];
            else
                memcpy(d, r, sizeof(float) * (size_t)C);
            memcpy(vs + (size_t)t * K, r + C, sizeof(float) * (size_t)K);
        }
    } else if (pp->accumulate) {
        mt_add(pp->dst, pp->sum, (size_t)N * C);
    } else {
        mt_copy(pp->dst, pp->sum, (size_t)N * C);
    }
    pp->dst = NULL;
    pp->vs = NULL;
}

static void ep_release(void *ctx, mt_ep_batch *b) {
    (void)ctx;
    if (b->plan) {
        ep_plan *pp = b->plan;
        MT_ASSERT(!pp->dst && pp->req.kind == 0);
        mt_a2a_plan_free(&pp->plan);
        mt_free(pp->sum);
        free(pp);
    }
    mt_free((float *)b->xe);
    memset(b, 0, sizeof *b);
}

static void ep_sum_f64(void *ctx, double *x, size_t n) {
    mt_ep *e = ctx;
    MT_ASSERT(n <= (size_t)1 << 30);
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, e->a2a.ep);
}

int mt_ep_init(mt_ep *e, MPI_Comm ep, int ranks_per_node, mt_a2a_mode mode, int split) {
    memset(e, 0, sizeof *e);
    if (mt_a2a_init(&e->a2a, ep, ranks_per_node) != 0) return -1;
    e->mode = mode;
    e->split = split != 0;
    e->ops = (mt_ep_ops){.ctx = e, .rank = e->a2a.rank, .size = e->a2a.size, .dispatch = ep_dispatch,
                         .combine = ep_combine, .gather = ep_gather, .redispatch = ep_redispatch,
                         .dispatch_bwd = ep_dispatch_bwd, .test = ep_test,
                         .wait = ep_wait, .release = ep_release, .sum_f64 = ep_sum_f64,
                         .node_of = e->a2a.node_of};
    return 0;
}

void mt_ep_free(mt_ep *e) {
    mt_a2a_free(&e->a2a);
    free(e->rows);
}

double mt_ep_imbalance(mt_ep *e) {
    const int n = e->nrows;
    if (n == 0) return 1.0;
    int64_t *mx = mt_xmalloc(sizeof(int64_t) * (size_t)n * 2), *sum = mx + n;
    MPI_Allreduce(e->rows, mx, n, MPI_INT64_T, MPI_MAX, e->a2a.ep);
    MPI_Allreduce(e->rows, sum, n, MPI_INT64_T, MPI_SUM, e->a2a.ep);
    double a = 0, b = 0;
    for (int i = 0; i < n; i++) a += (double)mx[i], b += (double)sum[i] / e->a2a.size;
    free(mx);
    return b > 0 ? a / b : 1.0;
}
