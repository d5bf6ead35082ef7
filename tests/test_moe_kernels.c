/* tests/test_moe_kernels.c — the MoE kernels (kernels/moe.h) and the gate|up SwiGLU rows
 * (mt_swiglu_rows_* in kernels/ops.h) against their plain references (kernels/ref_moe.h):
 *  1. permute: the routing tables (off, slot_row, row_tok) and the gathered rows must be
 *     EXACTLY those of the unfused reference (argsort + gather), and the same bits with
 *     1, 2 and 3 threads (the fused kernel goes parallel above 4096 pairs); routings
 *     include experts with 0 tokens, an expert with 1 token and all pairs on one expert;
 *  2. permute_bwd, unpermute, grouped linear fwd / bwd_data / bwd_weight and swiglu_rows
 *     fwd / bwd against the references by the normalised error ||a - b|| / ||b|| and a
 *     per-kernel tolerance, on odd shapes (O, In not multiples of the 64-row tiles,
 *     wstride larger than O*In);
 *  3. central finite differences of the reference forwards against both backwards
 *     (grouped linear din, dW; swiglu_rows dgu with and without routing weights), and
 *     the adjoint identity <permute(x), y> = <x, permute_bwd(y)>.
 * Outputs a kernel must overwrite are pre-filled with NaN; weights outside each expert's
 * [O,In] block are NaN (a read shows up) and gradient gaps must stay untouched. Buffers
 * have their exact size so the sanitizer build sees any overrun.
 * One summary line per kernel; exit 1 on any failure. */
#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "kernels/ref_moe.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SALT 0x6d6f65ULL
#include "testutil.h"
#include "kstats.h"
#include "testws.h"

/* ---- statistics: one line per kernel ------------------------------------------------- */

enum {
    S_PERMUTE, S_PERMUTE_THREADS, S_PERMUTE_BWD, S_UNPERMUTE, S_GL_FWD, S_GL_BWD_DATA,
    S_GL_BWD_WEIGHT, S_SWIGLU_ROWS_FWD, S_SWIGLU_ROWS_BWD, S_ADJ_PERMUTE, S_FD_GL, S_FD_SWIGLU_ROWS,
    S_COUNT
};

/* Normalised error tolerances: float kernels vs double references. The permutation rows
 * are exact (0: bit-for-bit tables and copies). permute_bwd / unpermute sum up to K+1 float
 * terms that may cancel (N = 1, C = 1 leaves one output element): 1e-5. fd_ rows: max over sampled coordinates of
 * |analytic - numeric| / max(|numeric|, 0.1 rms(gradient)). */
static stat stats[S_COUNT] = {
    [S_PERMUTE] = {"permute (exact)", 0, 0, 0},
    [S_PERMUTE_THREADS] = {"permute 1/2/3 thr (exact)", 0, 0, 0},
    [S_PERMUTE_BWD] = {"permute_bwd", 1e-5, 0, 0},
    [S_UNPERMUTE] = {"unpermute", 1e-5, 0, 0},
    [S_GL_FWD] = {"grouped_linear_fwd", 1e-5, 0, 0},
    [S_GL_BWD_DATA] = {"grouped_linear_bwd_data", 1e-5, 0, 0},
    [S_GL_BWD_WEIGHT] = {"grouped_linear_bwd_weight", 1e-5, 0, 0},
    [S_SWIGLU_ROWS_FWD] = {"swiglu_rows_fwd", 1e-6, 0, 0},
    [S_SWIGLU_ROWS_BWD] = {"swiglu_rows_bwd", 1e-6, 0, 0},
    [S_ADJ_PERMUTE] = {"adjoint permute/bwd (rel)", 1e-6, 0, 0},
    [S_FD_GL] = {"fd grouped_linear (din,dW)", 1e-2, 0, 0},
    [S_FD_SWIGLU_ROWS] = {"fd swiglu_rows (dgu)", 1e-2, 0, 0},
};

/* ---- buffers and data: tests/testutil.h ------------------------------------------ */

/* ---- routings ------------------------------------------------------------------------ */

enum { ROUTE_RANDOM, ROUTE_SKEWED, ROUTE_ONE, ROUTE_COUNT };
static const char *route_names[ROUTE_COUNT] = {"random", "skewed", "one-expert"};

/* sel[N*K]: ROUTE_RANDOM uniform (repeats allowed: the kernels do not require distinct
 * experts per token); ROUTE_SKEWED: experts e % 3 == 1 get no pair, expert E-1 gets
 * exactly one pair (the middle one), the rest random among the others; ROUTE_ONE: every
 * pair on expert E/2. */
static void make_routing(int32_t *sel, int N, int K, int E, int kind, uint64_t seed) {
    size_t R = (size_t)N * K;
    for (size_t i = 0; i < R; i++) {
        uint64_t h = mt_hash4(seed, i, 0x726f757465ULL, (uint64_t)kind);
        int e = (int)(h % (uint64_t)E);
        if (kind == ROUTE_ONE) e = E / 2;
        if (kind == ROUTE_SKEWED && E >= 3) {
            /* allowed experts: e % 3 != 1 and e != E-1, i.e. {0, 2, 3, 5, 6, ...} \ {E-1} */
            do e = (int)((h = mt_hash4(h, 1, 2, 3)) % (uint64_t)E);
            while (e % 3 == 1 || e == E - 1);
        }
        sel[i] = e;
    }
    if (kind == ROUTE_SKEWED && E >= 3 && (E - 1) % 3 != 1) sel[R / 2] = E - 1;
}

/* ---- 1. permute ------------------------------------------------------------------------ */

typedef struct {
    float *xe;
    int32_t *off, *slot_row, *row_tok;
} perm_out;

static perm_out perm_alloc(size_t R, size_t C, int E, int with_xe) {
    perm_out p = {with_xe ? falloc(R * C) : NULL, ialloc((size_t)E + 1), ialloc(R), ialloc(R)};
    if (p.xe) fill_nan(p.xe, R * C);
    for (size_t i = 0; i < R; i++) p.slot_row[i] = p.row_tok[i] = -7;
    for (int e = 0; e <= E; e++) p.off[e] = -7;
    return p;
}
static void perm_free(perm_out *p) {
    free(p->xe); free(p->off); free(p->slot_row); free(p->row_tok);
}

/* all tables and rows of a and b exactly equal; records 0 or 1 (a failure) for stat s */
static void perm_same(int s, const perm_out *a, const perm_out *b, size_t R, size_t C, int E) {
    int bad = 0;
    bad |= CHECK_SAME_I(a->off, b->off, (size_t)E + 1);
    bad |= CHECK_SAME_I(a->slot_row, b->slot_row, R);
    bad |= CHECK_SAME_I(a->row_tok, b->row_tok, R);
    if (a->xe && b->xe) bad |= CHECK_SAME_F(a->xe, b->xe, R * C);
    stats[s].cases++;
    if (bad) stats[s].maxerr = 1;
}

static void permute_case(int N, int K, int E, int C, int kind, int thr_max) {
    size_t R = (size_t)N * K, nx = (size_t)N * C, ne = R * C;
    snprintf(where, sizeof where, "N=%d K=%d E=%d C=%d routing=%s", N, K, E, C, route_names[kind]);
    int32_t *sel = ialloc(R);
    make_routing(sel, N, K, E, kind, (uint64_t)(N * 131 + K * 17 + E * 7 + C));
    float *x = rnd(nx, 1 + (uint64_t)C, -1, 1);
    perm_out ref = perm_alloc(R, (size_t)C, E, 1);
    mt_ref_moe_permute(ref.xe, ref.off, ref.slot_row, ref.row_tok, x, sel, N, K, E, C);
    /* the reference itself: boundaries match a histogram, every row holds its expert */
    CHECK(ref.off[0] == 0 && (size_t)ref.off[E] == R);
    for (int e = 0; e < E; e++) {
        size_t cnt = 0;
        for (size_t i = 0; i < R; i++) cnt += sel[i] == e;
        CHECK((size_t)(ref.off[e + 1] - ref.off[e]) == cnt);
    }
    if (kind == ROUTE_SKEWED && E >= 3 && (E - 1) % 3 != 1) CHECK(ref.off[E] - ref.off[E - 1] == 1);
    if (kind == ROUTE_SKEWED && E >= 3) CHECK(ref.off[2] - ref.off[1] == 0);

    /* optimised, with 1..thr_max threads: identical to the reference and to each other */
    int saved = omp_get_max_threads();
    for (int th = 1; th <= thr_max; th++) {
        omp_set_num_threads(th);
        perm_out opt = perm_alloc(R, (size_t)C, E, 1);
        mt_moe_permute(tws(), opt.xe, opt.off, opt.slot_row, opt.row_tok, x, sel, N, K, E, C);
        perm_same(th == 1 ? S_PERMUTE : S_PERMUTE_THREADS, &opt, &ref, R, (size_t)C, E);
        /* routing tables only (xe NULL) */
        perm_out tab = perm_alloc(R, (size_t)C, E, 0);
        mt_moe_permute(tws(), NULL, tab.off, tab.slot_row, tab.row_tok, x, sel, N, K, E, C);
        perm_same(th == 1 ? S_PERMUTE : S_PERMUTE_THREADS, &tab, &ref, R, (size_t)C, E);
        perm_free(&opt);
        perm_free(&tab);
    }
    omp_set_num_threads(saved);
    /* the gather alone, from the tables: the permute's rows, bit for bit */
    {
        float *g = falloc(ne ? ne : 1);
        fill_nan(g, ne);
        mt_moe_gather(g, x, ref.row_tok, (int)R, C);
        CHECK_SAME_F(g, ref.xe, ne);
        free(g);
    }

    /* permute_bwd and unpermute, overwrite (NaN-filled outputs) and accumulate */
    float *dxe = rnd(ne, 2, -1, 1), *w = rnd(R, 3, 0, 1);
    for (int acc = 0; acc < 2; acc++) {
        float *d1 = rnd(nx, 4, -1, 1), *d2 = dup(d1, nx), *o1 = rnd(nx, 5, -1, 1), *o2 = dup(o1, nx);
        if (!acc) { fill_nan(d1, nx); fill_nan(o1, nx); }
        mt_moe_permute_bwd(d1, dxe, ref.slot_row, N, K, C, acc);
        mt_ref_moe_permute_bwd(d2, dxe, ref.slot_row, N, K, C, acc);
        RECORD(S_PERMUTE_BWD, acc ? "dx +=" : "dx", nerr(d1, d2, nx));
        mt_moe_unpermute(o1, dxe, w, ref.slot_row, N, K, C, acc);
        mt_ref_moe_unpermute(o2, dxe, w, ref.slot_row, N, K, C, acc);
        RECORD(S_UNPERMUTE, acc ? "out +=" : "out", nerr(o1, o2, nx));
        free(d1); free(d2); free(o1); free(o2);
    }
    /* adjoint: <xe, dxe> with xe = permute(x) equals <x, permute_bwd(dxe)> */
    float *dx = falloc(nx);
    mt_moe_permute_bwd(dx, dxe, ref.slot_row, N, K, C, 0);
    double lhs = dot_d(ref.xe, dxe, ne), rhs = dot_d(x, dx, nx);
    double scale = sqrt(dot_d(ref.xe, ref.xe, ne) * dot_d(dxe, dxe, ne));
    RECORD(S_ADJ_PERMUTE, "<Px,y> vs <x,P'y>", scale > 0 ? fabs(lhs - rhs) / scale : fabs(lhs - rhs));
    free(dx); free(dxe); free(w); free(sel); free(x);
    perm_free(&ref);
}

static void test_permute(void) {
    static const int Ns[] = {1, 7, 33, 1000, 5000}, Ks[] = {1, 2, 8}, Es[] = {1, 3, 16, 64},
                     Cs[] = {1, 5, 64, 147}; /* 147 = two 64-float rounds of the row copy + a tail */
    for (size_t a = 0; a < 5; a++)
    for (size_t b = 0; b < 3; b++)
    for (size_t c = 0; c < 4; c++)
    for (size_t d = 0; d < 4; d++)
    for (int kind = 0; kind < ROUTE_COUNT; kind++) {
        int N = Ns[a], K = Ks[b], E = Es[c], C = Cs[d];
        if (E == 1 && kind != ROUTE_RANDOM) continue; /* all the same routing */
        /* thread counts matter only where the kernel goes parallel (> 4096 pairs) */
        int thr = (size_t)N * K >= 4096 ? 3 : 2;
        permute_case(N, K, E, C, kind, thr);
    }
    /* many experts: with 5 threads the per-thread histograms spill to the heap
     * (E * threads > 16384) */
    permute_case(3000, 2, 4096, 3, ROUTE_RANDOM, 5);
    permute_case(3000, 2, 4096, 3, ROUTE_SKEWED, 5);
}

/* ---- 2. grouped linear ----------------------------------------------------------------- */

/* W[E * wstride]: expert blocks [O,In] random, the gaps between blocks NaN */
static float *expert_weights(int E, int In, int O, size_t wstride, uint64_t seed) {
    size_t nw = (size_t)E * wstride;
    float *W = falloc(nw);
    fill_nan(W, nw);
    for (int e = 0; e < E; e++) fill(W + (size_t)e * wstride, (size_t)O * In, seed + (uint64_t)e, -1, 1);
    return W;
}

/* error of the expert blocks only; the gaps must hold the same bits in a and b */
static double blocks_err(const float *a, const float *b, int E, int In, int O, size_t wstride) {
    double d = 0, r = 0;
    size_t blk = (size_t)O * In;
    for (int e = 0; e < E; e++) {
        const float *pa = a + (size_t)e * wstride, *pb = b + (size_t)e * wstride;
        for (size_t i = 0; i < blk; i++) {
            double x = (double)pa[i] - pb[i];
            d += x * x;
            r += (double)pb[i] * pb[i];
        }
        if (wstride > blk) CHECK_SAME_F(pa + blk, pb + blk, wstride - blk);
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void grouped_case(int N, int K, int E, int In, int O, size_t wstride, int kind, float beta) {
    size_t R = (size_t)N * K, nin = R * In, nout = R * O, nw = (size_t)E * wstride;
    snprintf(where, sizeof where, "N=%d K=%d E=%d In=%d O=%d wstride=%zu routing=%s beta=%g", N, K, E,
             In, O, wstride, route_names[kind], beta);
    int32_t *sel = ialloc(R), *off = ialloc((size_t)E + 1), *slot = ialloc(R), *tok = ialloc(R);
    make_routing(sel, N, K, E, kind, (uint64_t)(N + 7 * E));
    mt_ref_moe_permute(NULL, off, slot, tok, NULL, sel, N, K, E, 0);
    float *W = expert_weights(E, In, O, wstride, 50);
    float *in = rnd(nin, 51, -1, 1), *dout = rnd(nout, 52, -1, 1);

    float *y1 = rnd(nout, 53, -1, 1), *y2 = dup(y1, nout);
    if (beta == 0.0f) { fill_nan(y1, nout); fill_nan(y2, nout); } /* beta 0: not read */
    mt_grouped_linear_fwd(tws(), y1, in, W, wstride, off, E, In, O, beta);
    mt_ref_grouped_linear_fwd(y2, in, W, wstride, off, E, In, O, beta);
    RECORD(S_GL_FWD, "out", nerr(y1, y2, nout));

    float *d1 = rnd(nin, 54, -1, 1), *d2 = dup(d1, nin);
    if (beta == 0.0f) { fill_nan(d1, nin); fill_nan(d2, nin); }
    mt_grouped_linear_bwd_data(tws(), d1, dout, W, wstride, off, E, In, O, beta);
    mt_ref_grouped_linear_bwd_data(d2, dout, W, wstride, off, E, In, O, beta);
    RECORD(S_GL_BWD_DATA, "din", nerr(d1, d2, nin));

    /* dW accumulates; gaps hold a sentinel that must survive */
    float *g1 = falloc(nw);
    for (size_t i = 0; i < nw; i++) g1[i] = -12345.0f;
    for (int e = 0; e < E; e++) fill(g1 + (size_t)e * wstride, (size_t)O * In, 55, -1, 1);
    float *g2 = dup(g1, nw);
    mt_grouped_linear_bwd_weight(tws(), g1, wstride, dout, in, off, E, In, O);
    mt_ref_grouped_linear_bwd_weight(g2, wstride, dout, in, off, E, In, O);
    RECORD(S_GL_BWD_WEIGHT, "dW", blocks_err(g1, g2, E, In, O, wstride));
    for (size_t i = (size_t)O * In; i < wstride; i++) CHECK(g1[i] == -12345.0f);
    free(sel); free(off); free(slot); free(tok); free(W); free(in); free(dout); free(y1);
    free(y2); free(d1); free(d2); free(g1); free(g2);
}

static void test_grouped_linear(void) {
    static const int Ns[] = {1, 7, 33, 1000}, Es[] = {1, 3, 16, 64};
    static const int IOs[][2] = {{1, 1}, {5, 7}, {67, 66}, {130, 33}, {64, 129}};
    static const float betas[] = {0.0f, 1.0f, 0.5f};
    int k = 0;
    for (size_t a = 0; a < 4; a++)
    for (size_t c = 0; c < 4; c++)
    for (size_t d = 0; d < 5; d++)
    for (int kind = 0; kind < ROUTE_COUNT; kind++) {
        int N = Ns[a], E = Es[c], In = IOs[d][0], O = IOs[d][1];
        if (E == 1 && kind != ROUTE_RANDOM) continue;
        if (N == 1000 && In * O > 5000 && kind == ROUTE_SKEWED) continue; /* runtime */
        size_t ws = (size_t)O * In + (k % 2 ? 37 : 0); /* padded expert blocks */
        grouped_case(N, 2, E, In, O, ws, kind, betas[k % 3]);
        k++;
    }
    /* the gate|up layout: weights [E, 2Fm, C]; the fused product (O = 2Fm, wstride =
     * 2Fm*C), the gate half alone (O = Fm, same wstride) and the down projection */
    static const int Fms[] = {1, 35, 70};
    for (size_t f = 0; f < 3; f++) {
        int Fm = Fms[f], C = 67;
        for (int kind = 0; kind < ROUTE_COUNT; kind++) {
            grouped_case(300, 2, 16, C, 2 * Fm, (size_t)2 * Fm * C, kind, 0.0f);
            grouped_case(300, 2, 16, C, Fm, (size_t)2 * Fm * C, kind, 1.0f);
            grouped_case(300, 2, 16, Fm, C, (size_t)Fm * C, kind, 0.0f);
        }
    }
}

/* ---- 2b. swiglu rows ------------------------------------------------------------------ */

static void test_swiglu_rows(void) {
    static const int Ns[] = {1, 7, 33, 1000}, Fs[] = {1, 5, 67, 352};
    for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++)
    for (int ws = 0; ws < 2; ws++) {
        int N = Ns[a], F = Fs[b];
        size_t n = (size_t)N * F, n2 = 2 * n;
        snprintf(where, sizeof where, "N=%d F=%d wscale=%s", N, F, ws ? "yes" : "NULL");
        float *gu = rnd(n2, 60, -8, 8), *da = rnd(n, 61, -1, 1), *w = ws ? rnd((size_t)N, 62, 0, 1) : NULL;
        /* u in [-2, 2]: rescale the second half of every row */
        for (size_t r = 0; r < (size_t)N; r++)
            for (int f = 0; f < F; f++) gu[r * 2 * F + F + f] *= 0.25f;
        float *a1 = falloc(n), *a2 = falloc(n), *g1 = falloc(n2), *g2 = falloc(n2);
        fill_nan(a1, n); fill_nan(g1, n2);
        mt_swiglu_rows_fwd(a1, gu, N, F);
        mt_ref_swiglu_rows_fwd(a2, gu, N, F);
        RECORD(S_SWIGLU_ROWS_FWD, "a", nerr(a1, a2, n));
        mt_swiglu_rows_bwd(g1, da, gu, w, N, F);
        mt_ref_swiglu_rows_bwd(g2, da, gu, w, N, F);
        RECORD(S_SWIGLU_ROWS_BWD, "dgu", nerr(g1, g2, n2));
        /* the routed backward's row pass: the activation, its dot with da, then weighted */
        if (w) {
            float *a3 = falloc(n);
            for (int r = 0; r < N; r++) {
                float d = mt_swiglu_row_wgrad(a3 + (size_t)r * F, gu + (size_t)r * 2 * F, da + (size_t)r * F, w[r], F);
                double dref = 0;
                for (int f = 0; f < F; f++) dref += (double)a2[(size_t)r * F + f] * da[(size_t)r * F + f];
                CHECK(fabs(d - dref) <= 1e-5 * (1 + fabs(dref)));
                for (int f = 0; f < F; f++) CHECK(a3[(size_t)r * F + f] == a1[(size_t)r * F + f] * w[r]);
            }
            free(a3);
        }
        free(gu); free(da); free(w); free(a1); free(a2); free(g1); free(g2);
    }
}

/* ---- 3. finite differences ------------------------------------------------------------ */

/* finite differences: fd_worst() in tests/testutil.h, recorded under statistic s */
static void fd_check(int s, const char *what, float *param, size_t n, const float *g_ref,
                     const float *g_opt, loss_fn f, void *ctx, uint64_t seed, int nco, double eps) {
    RECORD(s, what, fd_worst(what, param, n, g_ref, g_opt, f, ctx, seed, nco, eps, stats[s].tol));
}

typedef struct {
    int E, In, O;
    size_t R, wstride;
    const int32_t *off;
    float *x, *W, *Rw, *y;
} fd_gl_ctx;
static double fd_gl_loss(void *p) {
    fd_gl_ctx *c = p;
    mt_ref_grouped_linear_fwd(c->y, c->x, c->W, c->wstride, c->off, c->E, c->In, c->O, 0.0f);
    return dot_d(c->y, c->Rw, c->R * c->O);
}
static void fd_grouped_linear(void) {
    /* 4 experts, one without rows, one with a single row; padded blocks */
    static const int32_t off[] = {0, 3, 3, 4, 9};
    fd_gl_ctx c = {.E = 4, .In = 5, .O = 3, .R = 9, .off = off};
    c.wstride = (size_t)c.O * c.In + 2;
    size_t nx = c.R * c.In, nw = (size_t)c.E * c.wstride, ny = c.R * c.O;
    c.x = rnd(nx, 70, -1, 1); c.W = rnd(nw, 71, -1, 1); c.Rw = rnd(ny, 72, -1, 1); c.y = falloc(ny);
    float *dx = falloc(nx), *dx2 = falloc(nx), *dW = falloc(nw), *dW2 = falloc(nw);
    memset(dW, 0, sizeof(float) * nw); memset(dW2, 0, sizeof(float) * nw);
    mt_ref_grouped_linear_bwd_data(dx, c.Rw, c.W, c.wstride, off, c.E, c.In, c.O, 0.0f);
    mt_grouped_linear_bwd_data(tws(), dx2, c.Rw, c.W, c.wstride, off, c.E, c.In, c.O, 0.0f);
    mt_ref_grouped_linear_bwd_weight(dW, c.wstride, c.Rw, c.x, off, c.E, c.In, c.O);
    mt_grouped_linear_bwd_weight(tws(), dW2, c.wstride, c.Rw, c.x, off, c.E, c.In, c.O);
    snprintf(where, sizeof where, "E=%d In=%d O=%d R=%zu wstride=%zu", c.E, c.In, c.O, c.R, c.wstride);
    fd_check(S_FD_GL, "din", c.x, nx, dx, dx2, fd_gl_loss, &c, 73, 25, 1e-3);
    fd_check(S_FD_GL, "dW", c.W, nw, dW, dW2, fd_gl_loss, &c, 74, 40, 1e-3);
    free(c.x); free(c.W); free(c.Rw); free(c.y); free(dx); free(dx2); free(dW); free(dW2);
}

typedef struct {
    int N, F;
    float *gu, *Rw, *w, *a;
} fd_sw_ctx;
/* L = sum_n w[n] sum_f a[n,f] R[n,f]  (w = 1 when NULL): the routing weight enters as the
 * backward's wscale */
static double fd_sw_loss(void *p) {
    fd_sw_ctx *c = p;
    mt_ref_swiglu_rows_fwd(c->a, c->gu, c->N, c->F);
    double L = 0;
    for (int n = 0; n < c->N; n++)
        L += (c->w ? c->w[n] : 1.0) * dot_d(c->a + (size_t)n * c->F, c->Rw + (size_t)n * c->F, (size_t)c->F);
    return L;
}
static void fd_swiglu_rows(void) {
    for (int ws = 0; ws < 2; ws++) {
        fd_sw_ctx c = {.N = 3, .F = 5};
        size_t n = (size_t)c.N * c.F;
        c.gu = rnd(2 * n, 80, -4, 4); c.Rw = rnd(n, 81, -1, 1); c.a = falloc(n);
        c.w = ws ? rnd((size_t)c.N, 82, 0.1f, 1) : NULL;
        float *g1 = falloc(2 * n), *g2 = falloc(2 * n);
        mt_ref_swiglu_rows_bwd(g1, c.Rw, c.gu, c.w, c.N, c.F);
        mt_swiglu_rows_bwd(g2, c.Rw, c.gu, c.w, c.N, c.F);
        snprintf(where, sizeof where, "N=%d F=%d wscale=%s", c.N, c.F, ws ? "yes" : "NULL");
        fd_check(S_FD_SWIGLU_ROWS, ws ? "dgu (wscale)" : "dgu", c.gu, 2 * n, g1, g2, fd_sw_loss, &c,
                 83, 30, 1e-3);
        free(c.gu); free(c.Rw); free(c.a); free(c.w); free(g1); free(g2);
    }
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv);
    double t0 = mt_now();
    if (omp_get_max_threads() < 2) omp_set_num_threads(2);
    test_permute();
    test_grouped_linear();
    test_swiglu_rows();
    fd_grouped_linear();
    fd_swiglu_rows();
    return print_stats("test_moe_kernels", stats, S_COUNT, mt_now() - t0, omp_get_max_threads(),
                       mt_blas_corename());
}
