/* tests/test_a2a.c — expert-parallel dispatch / combine (parallel/a2a.h) under MPI.
 *
 * Usage: mpirun -np P test_a2a [ranks_per_node]   (a plain run is one rank: one node)
 *        mpirun -np P test_a2a bench RANKS_PER_NODE N C K   (bench/bench_a2a.sh)
 * For several routings (E = 16, K = 2 and 8; uniform; some ranks receiving nothing; every
 * token's experts on one remote node; a rank with no tokens):
 *  - FLAT and HIER dispatch give bit-identical layouts (rows, off, src/tok/slot/w);
 *  - both equal a reference computed from every rank's inputs gathered on every rank;
 *  - FLAT and HIER combine, dispatch backward and gather are bit-identical and
 *    equal the reference, which follows the documented summation order (and are within
 *    1e-6 of the plain slot-order sum, relative to the sum of |terms|);
 *  - HIER sends no more inter-node bytes than FLAT, strictly fewer on the "one remote node"
 *    routing when a node has more than one rank;
 *  - bad input on one rank makes every rank return -1 (no hang);
 *  - (Open MPI, several ranks) a combine's wait completes while a peer that sent its rows
 *    makes no MPI call: it does not wait for the peer to take this rank's rows.
 * Prints byte counts per routing and "a2a: N checks passed, M failed"; exit 1 on failure. */
#define TEST_SALT 0xa2a0ULL
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/common.h"
#include "kernels/moe.h"
#include "parallel/a2a.h"
#include "parallel/wire.h"
#include "testutil.h"

#include "mpicheck.h"

enum { E = 16, C = 24 };
enum { R_UNIFORM, R_SKIP_RANK1, R_REMOTE_NODE };
static const char *rname[] = {"uniform", "rank 1 receives nothing", "all experts on one remote node"};

/* the expert output of a pair, a pure function of (source rank, token, slot, c) */
static float yval(int src, int t, int j, int c) { return mt_u01(mt_hash4(src, t, j, c + 7)) * 2.0f - 1.0f; }

typedef struct {
    int P, *N, *noff; /* tokens per rank and their offsets in the global arrays */
    float *x, *w;
    int32_t *sel;
} global;

static void sum_tree(const mt_a2a *a, const global *g, int K, int src, int t, float wscale, float *out,
                     const float *const *terms) {
    /* nodes ascending; ranks of a node ascending; pairs of a rank in slot order; every
     * sum starts from a copy of its first term (a2a.h) */
    (void)wscale;
    int LE = E / g->P, first_node = 1;
    float acc[C], racc[C];
    for (int n = 0; n < a->nnodes; n++) {
        int first_rank = 1;
        for (int i = a->node_start[n]; i < a->node_start[n + 1]; i++) {
            int r = a->node_rank[i], first = 1;
            for (int j = 0; j < K; j++) {
                if (g->sel[(size_t)(g->noff[src] + t) * K + j] / LE != r) continue;
                const float *term = terms[j];
                if (first)
                    for (int c = 0; c < C; c++) racc[c] = term[c];
                else
                    for (int c = 0; c < C; c++) racc[c] += term[c];
                first = 0;
            }
            if (first) continue;
            if (first_rank) memcpy(acc, racc, sizeof acc);
            else
                for (int c = 0; c < C; c++) acc[c] += racc[c];
            first_rank = 0;
        }
        if (first_rank) continue;
        if (first_node) memcpy(out, acc, sizeof acc);
        else
            for (int c = 0; c < C; c++) out[c] += acc[c];
        first_node = 0;
    }
}

static void run_case(mt_a2a *a, int K, int routing, uint64_t seed) {
    const int P = a->size, me = a->rank, LE = E / P;
    global g = {P, mt_xmalloc(sizeof(int) * P), mt_xmalloc(sizeof(int) * (P + 1)), NULL, NULL, NULL};
    for (int r = 0; r < P; r++) g.N[r] = (P > 2 && r == 2) ? 0 : 29 + 11 * r;
    g.noff[0] = 0;
    for (int r = 0; r < P; r++) g.noff[r + 1] = g.noff[r] + g.N[r];
    const int Nt = g.noff[P], N = g.N[me];
    /* a remote node with at least K experts (else the routing falls back to K' = its size) */
    int rn = (a->node_id + 1) % a->nnodes;
    int rn_e = (a->node_start[rn + 1] - a->node_start[rn]) * LE;
    if (routing == R_REMOTE_NODE && K > rn_e) K = rn_e;
    /* every rank builds its own tokens; then all are gathered */
    float *x = rnd((size_t)N * C, seed + me, -1, 1), *w = rnd((size_t)N * K, seed + 100 + me, 0.1f, 1);
    int32_t *sel = ialloc((size_t)N * K);
    int allowed[E], na;
    for (int t = 0; t < N; t++) {
        na = 0;
        for (int e = 0; e < E; e++) {
            int o = e / LE;
            if (routing == R_SKIP_RANK1 && P > 1 && o == 1) continue;
            if (routing == R_REMOTE_NODE && a->node_of[o] != rn) continue;
            allowed[na++] = e;
        }
        for (int j = 0; j < K; j++) { /* K distinct experts: partial Fisher-Yates */
            int q = j + (int)(mt_hash4(seed, me, t, j) % (uint64_t)(na - j));
            int tmp = allowed[j];
            allowed[j] = allowed[q], allowed[q] = tmp;
            sel[(size_t)t * K + j] = allowed[j];
        }
    }
    g.x = falloc((size_t)Nt * C);
    g.w = falloc((size_t)Nt * K);
    g.sel = ialloc((size_t)Nt * K);
    int *cnt = mt_xmalloc(sizeof(int) * P), *dis = mt_xmalloc(sizeof(int) * P);
    for (int r = 0; r < P; r++) cnt[r] = g.N[r] * C, dis[r] = g.noff[r] * C;
    MPI_Allgatherv(x, N * C, MPI_FLOAT, g.x, cnt, dis, MPI_FLOAT, MPI_COMM_WORLD);
    for (int r = 0; r < P; r++) cnt[r] = g.N[r] * K, dis[r] = g.noff[r] * K;
    MPI_Allgatherv(w, N * K, MPI_FLOAT, g.w, cnt, dis, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Allgatherv(sel, N * K, MPI_INT32_T, g.sel, cnt, dis, MPI_INT32_T, MPI_COMM_WORLD);

    /* reference layout of this rank */
    int Rr = 0;
    for (int i = 0; i < Nt * K; i++) Rr += g.sel[i] / LE == me;
    int32_t *roff = ialloc(LE + 1), *rsrc = ialloc(Rr), *rtok = ialloc(Rr), *rslot = ialloc(Rr);
    float *rw = falloc(Rr), *rxe = falloc((size_t)Rr * C);
    int r = 0;
    for (int le = 0; le < LE; le++) {
        roff[le] = r;
        for (int s = 0; s < P; s++)
            for (int t = 0; t < g.N[s]; t++)
                for (int j = 0; j < K; j++) {
                    size_t i = (size_t)(g.noff[s] + t) * K + j;
                    if (g.sel[i] != me * LE + le) continue;
                    rsrc[r] = s, rtok[r] = t, rslot[r] = j, rw[r] = g.w[i];
                    memcpy(rxe + (size_t)r * C, g.x + (size_t)(g.noff[s] + t) * C, sizeof(float) * C);
                    r++;
                }
    }
    roff[LE] = r;

    mt_a2a_plan pl[2];
    float *xe[2], *out[2], *dx[2], *xg[2], *vs[2];
    mt_a2a_bytes b[2];
    float *dout = rnd((size_t)N * C, seed + 200 + me, -1, 1);
    for (int m = 0; m < 2; m++) {
        memset(&a->bytes, 0, sizeof a->bytes);
        int rc = mt_a2a_dispatch(a, (mt_a2a_mode)m, &pl[m], &xe[m], x, sel, w, N, K, C, E);
        CHECK(rc == 0, "dispatch mode %d: %s", m, mt_last_error());
        if (rc) exit(1);
        const mt_a2a_plan *p = &pl[m];
        float *y = falloc((size_t)p->R * C);
        for (int q = 0; q < p->R; q++)
            for (int c = 0; c < C; c++) y[(size_t)q * C + c] = yval(p->src[q], p->tok[q], p->slot[q], c);
        out[m] = falloc((size_t)N * C);
        mt_a2a_combine(a, p, out[m], y, p->w);
        b[m] = a->bytes;
        MPI_Allreduce(MPI_IN_PLACE, &b[m], 5, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        dx[m] = falloc((size_t)N * C);
        mt_a2a_dispatch_bwd(a, p, dx[m], y);
        /* gather: dout rows unweighted along the plan */
        xg[m] = falloc((size_t)p->R * C);
        mt_a2a_gather(a, p, xg[m], dout);
        /* the trainer's backward, over the wire in the hierarchical mode: the input gradients
         * with a value per pair beside them; [dx | vs] per token, dx the bits of dispatch_bwd
         * (vs checked below: each pair gets the value its expert rank set) */
        float *v = falloc((size_t)p->R);
        for (int q = 0; q < p->R; q++) v[q] = (float)(p->src[q] * 100000 + p->tok[q] * 16 + p->slot[q]) - 0.5f;
        vs[m] = falloc((size_t)N * K);
        {
            mt_wire_set(m ? 2e8 : 0, m ? 50e-6 : 0);
            mt_a2a_req rq = {0};
            float *dv = falloc((size_t)N * (C + K));
            mt_a2a_dispatch_bwd_begin(a, p, &rq, y, v);
            mt_a2a_combine_end(a, &rq, dv);
            int bd = 0;
            for (int t = 0; t < N; t++) {
                bd += memcmp(dv + (size_t)t * (C + K), dx[m] + (size_t)t * C, sizeof(float) * C) != 0;
                memcpy(vs[m] + (size_t)t * K, dv + (size_t)t * (C + K) + C, sizeof(float) * K);
            }
            CHECK(bd == 0, "dispatch_bwd with values: %d token rows differ from dispatch_bwd, mode %d", bd, m);
            mt_wire_set(0, 0);
            free(dv);
        }
        free(v);
        {   /* split phase, a combine and a gather in flight at once (the hierarchical mode over an
             * emulated 0.2 GB/s link): the same bits as the blocking calls */
            mt_wire_set(m ? 2e8 : 0, m ? 50e-6 : 0);
            mt_a2a_req rq[2];
            memset(rq, 0, sizeof rq);
            float *o2 = falloc((size_t)N * C), *x2 = falloc((size_t)p->R * C);
            mt_a2a_combine_begin(a, p, &rq[0], y, p->w);
            mt_a2a_gather_begin(a, p, &rq[1], dout);
            while (!mt_a2a_test(&rq[0]) || !mt_a2a_test(&rq[1])) {
            }
            mt_a2a_gather_end(a, &rq[1], x2);
            mt_a2a_combine_end(a, &rq[0], o2);
            CHECK(!memcmp(o2, out[m], sizeof(float) * (size_t)N * C), "split-phase combine != blocking, mode %d", m);
            CHECK(!memcmp(x2, xg[m], sizeof(float) * (size_t)p->R * C), "split-phase gather != blocking, mode %d", m);
            CHECK(rq[0].kind == 0 && rq[1].kind == 0, "requests not released, mode %d", m);
            mt_wire_set(0, 0);
            free(o2);
            free(x2);
        }
        free(y);
    }
    {   /* the values return to pair t*K+j of this rank exactly as its expert rank set them */
        int badv = 0;
        for (int m = 0; m < 2; m++)
            for (int t = 0; t < N; t++)
                for (int j = 0; j < K; j++)
                    badv += vs[m][(size_t)t * K + j] != (float)(me * 100000 + t * 16 + j) - 0.5f;
        CHECK(badv == 0, "dispatch_bwd's values: %d not returned to their pair", badv);
    }
    const mt_a2a_plan *F = &pl[0], *H = &pl[1];
    /* layouts: FLAT == HIER == reference */
    CHECK(F->R == Rr && H->R == Rr, "R flat %d hier %d ref %d", F->R, H->R, Rr);
    if (F->R == Rr && H->R == Rr) {
        size_t ri = sizeof(int32_t) * (size_t)Rr;
        for (int m = 0; m < 2; m++) {
            const mt_a2a_plan *p = &pl[m];
            CHECK(!memcmp(p->off, roff, sizeof(int32_t) * (LE + 1)), "off, mode %d", m);
            CHECK(!memcmp(p->src, rsrc, ri) && !memcmp(p->tok, rtok, ri) && !memcmp(p->slot, rslot, ri),
                  "src/tok/slot, mode %d", m);
            CHECK(!memcmp(p->w, rw, sizeof(float) * Rr), "weights, mode %d", m);
            CHECK(!memcmp(xe[m], rxe, sizeof(float) * (size_t)Rr * C), "dispatched rows, mode %d", m);
        }
        /* gather reference: dout[tok_r] of the source rank */
        float *gd = falloc((size_t)Nt * C);
        int *c2 = mt_xmalloc(sizeof(int) * P), *d2 = mt_xmalloc(sizeof(int) * P);
        for (int s = 0; s < P; s++) c2[s] = g.N[s] * C, d2[s] = g.noff[s] * C;
        MPI_Allgatherv(dout, N * C, MPI_FLOAT, gd, c2, d2, MPI_FLOAT, MPI_COMM_WORLD);
        int badg = 0;
        for (int q = 0; q < Rr; q++)
            for (int c = 0; c < C; c++) {
                const float *go = gd + (size_t)(g.noff[rsrc[q]] + rtok[q]) * C;
                badg += xg[0][(size_t)q * C + c] != go[c] || xg[1][(size_t)q * C + c] != go[c];
            }
        CHECK(badg == 0, "gather vs reference: %d values differ", badg);
        free(gd), free(c2), free(d2);
    }
    /* combine, dispatch backward: FLAT == HIER == tree reference; plain sum within 1e-5 */
    CHECK(!memcmp(out[0], out[1], sizeof(float) * (size_t)N * C), "combine flat vs hier");
    CHECK(!memcmp(dx[0], dx[1], sizeof(float) * (size_t)N * C), "dispatch_bwd flat vs hier");
    int bo = 0, bx = 0;
    double maxrel = 0.0;
    float *tw = falloc((size_t)K * C), *ty = falloc((size_t)K * C), ref[C], refx[C];
    const float *pw[64], *py[64];
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < K; j++) {
            float wj = g.w[(size_t)(g.noff[me] + t) * K + j];
            for (int c = 0; c < C; c++) {
                ty[j * C + c] = yval(me, t, j, c);
                tw[j * C + c] = wj * ty[j * C + c];
            }
            pw[j] = tw + j * C, py[j] = ty + j * C;
        }
        sum_tree(a, &g, K, me, t, 1, ref, pw);
        sum_tree(a, &g, K, me, t, 1, refx, py);
        for (int c = 0; c < C; c++) {
            bo += out[0][(size_t)t * C + c] != ref[c];
            bx += dx[0][(size_t)t * C + c] != refx[c];
            double s = 0.0, sa = 0.0; /* error relative to sum |terms| (the float bound) */
            for (int j = 0; j < K; j++) s += (double)tw[j * C + c], sa += fabs((double)tw[j * C + c]);
            double d = fabs(out[0][(size_t)t * C + c] - s) / sa;
            if (d > maxrel) maxrel = d;
        }
    }
    CHECK(bo == 0 && bx == 0, "combine / dispatch_bwd vs tree reference: %d / %d values differ", bo, bx);
    CHECK(maxrel < 1e-6, "combine vs plain slot-order sum: max err / sum|terms| %.3g", maxrel);
    {   /* the same sums from every expert row on this rank, in the exchange's order (kernels/moe.h:
         * RL's rollout copy summing as its trainer's layout): the combine's bits */
        int32_t owner[E], *srow = ialloc((size_t)N * K + 1);
        for (int e = 0; e < E; e++) owner[e] = e / LE;
        float *yr = falloc((size_t)N * K * C + 1), *ol = falloc((size_t)N * C + 1);
        for (int i = 0; i < N * K; i++) {
            srow[i] = N * K - 1 - i; /* rows in another order than the pairs */
            for (int c = 0; c < C; c++) yr[(size_t)srow[i] * C + c] = yval(me, i / K, i % K, c);
        }
        memset(ol, 0, sizeof(float) * (size_t)N * C);
        const mt_moe_sum_order so = {.owner = owner, .node_of = a->node_of};
        mt_moe_unpermute_ordered(ol, yr, g.w + (size_t)g.noff[me] * K, srow, g.sel + (size_t)g.noff[me] * K, N, K,
                                 C, &so);
        int bl = 0;
        for (size_t i = 0; i < (size_t)N * C; i++) bl += ol[i] != out[0][i];
        CHECK(bl == 0, "ordered local unpermute vs the combine: %d values differ", bl);
        free(srow), free(yr), free(ol);
    }
    free(tw), free(ty);
    /* bytes */
    if (me == 0) {
        printf("P=%d nodes=%d K=%d %-32s inter: flat %8lld hier %8lld (rows %8lld / %8lld)  intra: flat %8lld hier %8lld\n",
               P, a->nnodes, K, rname[routing], (long long)b[0].inter, (long long)b[1].inter,
               (long long)b[0].inter_rows, (long long)b[1].inter_rows, (long long)b[0].intra, (long long)b[1].intra);
        fflush(stdout);
    }
    CHECK(b[1].inter <= b[0].inter, "hier inter %lld > flat %lld", (long long)b[1].inter, (long long)b[0].inter);
    CHECK(b[1].inter_rows <= b[0].inter_rows, "hier inter rows > flat");
    if (routing == R_REMOTE_NODE && a->nnodes > 1 && K > 1) {
        /* several experts of a token on one remote node: strictly fewer, if they can be on
         * different ranks there (a node of one rank dedupes already in FLAT) */
        int multi = 0;
        for (int n = 0; n < a->nnodes; n++) multi |= a->node_start[n + 1] - a->node_start[n] > 1;
        if (multi) CHECK(b[1].inter < b[0].inter, "hier inter %lld not < flat %lld", (long long)b[1].inter,
                         (long long)b[0].inter);
    }
    for (int m = 0; m < 2; m++) {
        mt_a2a_plan_free(&pl[m]);
        mt_free(xe[m]), free(out[m]), free(dx[m]), free(xg[m]), free(vs[m]);
    }
    free(x), free(w), free(sel), free(dout), free(g.x), free(g.w), free(g.sel), free(g.N), free(g.noff);
    free(cnt), free(dis), free(roff), free(rsrc), free(rtok), free(rslot), free(rw), free(rxe);
}

/* bench mode (bench/bench_a2a.sh): uniform top-K routing of N tokens x Cb per rank; one
 * dispatch + combine per mode; prints bytes summed over ranks and the slowest rank's time */
static int bench(int rpn, int N, int Cb, int K) {
    mt_a2a a;
    if (mt_a2a_init(&a, MPI_COMM_WORLD, rpn)) return 1;
    const int me = a.rank;
    float *x = rnd((size_t)N * Cb, 5 + me, -1, 1), *w = rnd((size_t)N * K, 9 + me, 0, 1);
    int32_t *sel = ialloc((size_t)N * K);
    for (int t = 0; t < N; t++) {
        int e[E];
        for (int i = 0; i < E; i++) e[i] = i;
        for (int j = 0; j < K; j++) {
            int q = j + (int)(mt_hash4(77, me, t, j) % (uint64_t)(E - j)), tmp = e[j];
            e[j] = e[q], e[q] = tmp;
            sel[(size_t)t * K + j] = e[j];
        }
    }
    float *out = falloc((size_t)N * Cb);
    for (int m = 0; m < 2; m++) {
        double best = 1e30;
        mt_a2a_bytes b = {0};
        for (int it = 0; it < 3; it++) {
            mt_a2a_plan p;
            float *xe;
            memset(&a.bytes, 0, sizeof a.bytes);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (mt_a2a_dispatch(&a, (mt_a2a_mode)m, &p, &xe, x, sel, w, N, K, Cb, E)) return 1;
            mt_a2a_combine(&a, &p, out, xe, p.w); /* identity experts: y = xe */
            double dt = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (dt < best) best = dt;
            b = a.bytes;
            mt_a2a_plan_free(&p);
            mt_free(xe);
        }
        MPI_Allreduce(MPI_IN_PLACE, &b, 5, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (me == 0)
            printf("%d %d %d %s %lld %lld %lld %lld %.4f\n", a.size, a.nnodes, K, m ? "hier" : "flat",
                   (long long)b.inter, (long long)b.inter_rows, (long long)b.intra, (long long)b.intra_rows, best);
    }
    free(x), free(w), free(sel), free(out);
    mt_a2a_free(&a);
    return 0;
}

/* The wire's queue (parallel/wire.h): bulk messages one after another on the link, a small
 * one ahead of them, the bulk after it later by the small one's time on the link. */
static void test_wire_queue(void) {
    const double bw = 1e6, lat = 1e-3;
    mt_wire_set(bw, lat);
    int64_t big[2] = {500000, 0}, small[2] = {0, 1000};
    double a1[2], a2[2], a3[2];
    const double t0 = mt_now();
    mt_wire_stamp(big, 2, 0, a1);   /* 0.5 s on the link */
    mt_wire_stamp(small, 2, 0, a2); /* 1 ms, ahead of it */
    mt_wire_stamp(big, 2, 1, a3);   /* after both */
    const double t1 = mt_now();
    CHECK(a1[1] == 0 && a2[0] == 0, "a peer without bytes has no arrival");
    CHECK(a1[0] >= t0 + 0.5 + lat && a1[0] <= t1 + 0.5 + lat, "bulk: arrives %g s after the stamp", a1[0] - t0);
    CHECK(a2[1] <= t1 + 0.001 + lat && a2[1] < a1[0] - 0.4, "small: %g s after the stamp, the bulk's %g s", a2[1] - t0,
          a1[0] - t0);
    CHECK(fabs(a3[0] - a1[0] - 0.5 - 0.001) < 1e-9, "second bulk: %g s after the first (0.501 s: its own and the small one's)",
          a3[0] - a1[0]);
    mt_wire_set(0, 0);
}

/* Every rank dispatches rows to every rank and starts the combine back. Rank 0 then makes no
 * MPI call until the others have finished their combine (files in a directory rank 0 made),
 * up to 60 s: a wait that needed rank 0 to take its peers' rows (a collective's, or one
 * that completes the sends too) would hold them there. Rows of 64 KiB and more travel by
 * Open MPI's rendezvous, which moves them only inside a receiver's MPI calls; other MPI
 * libraries may need the sender inside MPI too, so it runs under Open MPI only. */
static void test_wait_without_peer(mt_a2a *a) {
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(ver, &len);
    if (a->size < 2 || !strstr(ver, "Open MPI")) return;
    enum { N = 32, K = 2, CB = 2048 };
    char dir[64] = "";
    if (a->rank == 0) CHECK(mkdtemp(strcpy(dir, "/tmp/test_a2a.XXXXXX")) != NULL, "mkdtemp failed");
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    float *x = mt_xcalloc((size_t)N * CB, sizeof(float)), *out = mt_xcalloc((size_t)N * CB, sizeof(float)), *xe = NULL;
    int32_t sel[N * K];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) sel[t * K + j] = (t * K + j) % E; /* every rank's experts */
    for (size_t i = 0; i < (size_t)N * CB; i++) x[i] = (float)(i % 97) * 0.01f;
    mt_a2a_plan p;
    CHECK(mt_a2a_dispatch(a, MT_A2A_FLAT, &p, &xe, x, sel, NULL, N, K, CB, E) == 0, "dispatch: %s", mt_last_error());
    mt_a2a_req r = {0};
    mt_a2a_combine_begin(a, &p, &r, xe, NULL);
    char path[96];
    if (a->rank == 0) {
        int seen = 0;
        for (int ms = 0; ms < 60000 && seen < a->size - 1; ms++) {
            seen = 0;
            for (int q = 1; q < a->size; q++) {
                snprintf(path, sizeof path, "%s/r%d", dir, q);
                FILE *f = fopen(path, "r");
                if (f) seen++, fclose(f);
            }
            if (seen < a->size - 1) nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        CHECK(seen == a->size - 1, "%d of %d ranks finished their combine while rank 0 made no MPI call", seen,
              a->size - 1);
    }
    mt_a2a_combine_end(a, &r, out);
    if (a->rank != 0) {
        snprintf(path, sizeof path, "%s/r%d", dir, a->rank);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL, "cannot write %s", path);
        if (f) fclose(f);
    }
    /* out[t] = sum of the token's K rows, each x[t] (weights 1) */
    int bad = 0;
    for (size_t i = 0; i < (size_t)N * CB; i++) bad += out[i] != (float)K * x[i];
    CHECK(bad == 0, "combine without a peer in MPI: %d wrong values", bad);
    MPI_Barrier(MPI_COMM_WORLD);
    if (a->rank == 0) {
        for (int q = 1; q < a->size; q++) {
            snprintf(path, sizeof path, "%s/r%d", dir, q);
            remove(path);
        }
        remove(dir);
    }
    mt_free(xe);
    mt_a2a_plan_free(&p);
    free(x);
    free(out);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        int rc = argc == 6 ? bench(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5])) : 2;
        if (rc == 2 && g_rank == 0) fprintf(stderr, "usage: test_a2a bench RANKS_PER_NODE N C K\n");
        if (rc == 1) fprintf(stderr, "test_a2a: rank %d: %s\n", g_rank, mt_last_error());
        MPI_Finalize();
        return rc;
    }
    int rpn = argc > 1 ? atoi(argv[1]) : 0;
    mt_a2a a;
    CHECK(mt_a2a_init(&a, MPI_COMM_WORLD, rpn) == 0, "init: %s", mt_last_error());
    if (E % a.size != 0) {
        if (g_rank == 0) fprintf(stderr, "test_a2a: %d ranks do not divide E=%d\n", a.size, E);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (g_rank == 0) test_wire_queue();
    const int Ks[2] = {2, 8};
    for (int ki = 0; ki < 2; ki++)
        for (int routing = 0; routing < 3; routing++) run_case(&a, Ks[ki], routing, 1000 * ki + 10 * routing + 1);

    test_wait_without_peer(&a);

    /* bad input on one rank: every rank gets -1 */
    {
        int32_t sel[2] = {0, a.rank == a.size - 1 ? E : 1};
        float x[C] = {0}, *xe = NULL;
        mt_a2a_plan p;
        for (int m = 0; m < 2; m++) {
            int rc = mt_a2a_dispatch(&a, (mt_a2a_mode)m, &p, &xe, x, sel, NULL, 1, 2, C, E);
            CHECK(rc == -1 && xe == NULL, "bad expert on the last rank: rc %d (mode %d)", rc, m);
            if (g_rank == 0 && m == 0) printf("bad input -> every rank: %s\n", mt_last_error());
        }
        /* a bad shape on one rank (K = 0): it sends its failure flag, every rank fails alike */
        const int32_t ok_sel[2] = {0, 1};
        for (int m = 0; m < 2; m++) {
            const int bad_rank = a.size - 1, k = a.rank == bad_rank ? 0 : 2;
            int rc = mt_a2a_dispatch(&a, (mt_a2a_mode)m, &p, &xe, x, ok_sel, NULL, 1, k, C, E);
            CHECK(rc == -1 && xe == NULL, "bad shape on rank %d: rc %d here (mode %d)", bad_rank, rc, m);
        }
        /* and the exchange works after a failed one */
        for (int m = 0; m < 2; m++) {
            int rc = mt_a2a_dispatch(&a, (mt_a2a_mode)m, &p, &xe, x, ok_sel, NULL, 1, 2, C, E);
            CHECK(rc == 0 && p.R >= 0, "dispatch after a failure: rc %d (mode %d): %s", rc, m, mt_last_error());
            if (rc == 0) {
                mt_free(xe);
                mt_a2a_plan_free(&p);
            }
        }
    }
    mt_a2a_free(&a);
    int tot[2] = {g_pass, g_fail};
    MPI_Allreduce(MPI_IN_PLACE, tot, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("a2a: %d checks passed, %d failed\n", tot[0], tot[1]);
    MPI_Finalize();
    return tot[1] ? 1 : 0;
}
