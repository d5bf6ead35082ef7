/* tests/test_kernels.c — every optimised kernel (kernels/ops.h, kernels/blas.h) against its
 * plain reference (kernels/ref.h), in the spirit of ggml's test-backend-ops:
 *  1. optimised vs reference over odd shapes, measured by the normalised error
 *     ||a - b|| / ||b|| (b = reference) against a per-op tolerance;
 *  2. the reference backwards against central finite differences of the reference
 *     forwards, through the scalar loss L = sum(out * R) for a fixed random R (the
 *     optimised backwards are checked there too);
 *  3. determinism: mt_sumsq and mt_rmsnorm_bwd give the same bits with 1, 2 and 3
 *     threads; the attention forward and backward give the same bits with 1 and nthr
 *     threads (and with pos NULL or explicit positions 0..T-1).
 * MT_BENCH=1 runs only the attention benchmark instead (flash vs the unfused reference
 * and the previous query-block kernel, and the SGEMM rate of similar shapes as the
 * yardstick; see bench_attention; MT_BENCH_NOREF=1 skips the slow reference, MT_BENCH=2
 * times the flash kernel only).
 * Outputs that a kernel must overwrite, and all scratch, are pre-filled with NaN so a
 * missed element or a read of stale scratch shows up as a failure. Buffers are allocated
 * at their exact size (not rounded up) so the sanitizer build sees any overrun.
 * One summary line per kernel; exit 1 on any failure. */
#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "kernels/ref.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SALT 0x6b65726eULL
#include "testutil.h"
#include "kstats.h"
#include "testws.h"

/* Two doubles with the same bits (determinism checks); prints both. */
#define CHECK_SAME_D(a, b) do { double a_ = (a), b_ = (b); \
    if (memcmp(&a_, &b_, sizeof(double)) != 0) { \
        fprintf(stderr, "%s:%d: CHECK failed: %s == %s bit-for-bit (%.17g vs %.17g) [%s]\n", \
                __FILE__, __LINE__, #a, #b, a_, b_, where); failures++; } } while (0)

/* ---- statistics: one line per kernel ------------------------------------------------- */

enum {
    S_SGEMM, S_LINEAR_FWD, S_LINEAR_BWD, S_RMSNORM_FWD, S_RMSNORM_BWD, S_ROPE, S_SWIGLU_FWD,
    S_SWIGLU_BWD, S_ATT_FWD, S_ATT_BWD, S_HEAD_LOSS, S_HEAD_GRAD, S_SUMSQ, S_ADAMW,
    S_FD_LINEAR, S_FD_RMSNORM, S_FD_ROPE, S_FD_SWIGLU, S_FD_ATT, S_FD_HEAD, S_COUNT
};

/* Tolerances are on the normalised error ||opt - ref|| / ||ref|| (float kernels vs
 * double references: a few float ulps times sqrt of the reduction length), except the
 * fd_ rows: max over sampled coordinates of |analytic - numeric| / max(|numeric|,
 * 0.1 * rms(gradient)). */
static stat stats[S_COUNT] = {
    [S_SGEMM] = {"sgemm", 1e-5, 0, 0},
    [S_LINEAR_FWD] = {"linear_fwd", 1e-5, 0, 0},
    [S_LINEAR_BWD] = {"linear_bwd", 1e-5, 0, 0},
    [S_RMSNORM_FWD] = {"rmsnorm_fwd", 1e-5, 0, 0},
    [S_RMSNORM_BWD] = {"rmsnorm_bwd", 1e-5, 0, 0},
    [S_ROPE] = {"rope_apply", 1e-5, 0, 0},
    [S_SWIGLU_FWD] = {"swiglu_fwd", 1e-5, 0, 0},
    [S_SWIGLU_BWD] = {"swiglu_bwd", 1e-5, 0, 0},
    [S_ATT_FWD] = {"attention_fwd", 1e-5, 0, 0},
    [S_ATT_BWD] = {"attention_bwd", 1e-5, 0, 0},
    [S_HEAD_LOSS] = {"head_ce loss+logits", 1e-5, 0, 0},
    [S_HEAD_GRAD] = {"head_ce dx,dW", 1e-4, 0, 0},
    [S_SUMSQ] = {"sumsq (rel)", 1e-10, 0, 0},
    [S_ADAMW] = {"adamw", 3e-6, 0, 0},
    [S_FD_LINEAR] = {"fd linear (din,dW)", 1e-2, 0, 0},
    [S_FD_RMSNORM] = {"fd rmsnorm (dx,dw)", 1e-2, 0, 0},
    [S_FD_ROPE] = {"fd rope (inverse)", 1e-2, 0, 0},
    [S_FD_SWIGLU] = {"fd swiglu (dg,du)", 1e-2, 0, 0},
    [S_FD_ATT] = {"fd attention (dq,dk,dv)", 1e-2, 0, 0},
    [S_FD_HEAD] = {"fd head_ce (dx,dW)", 1e-2, 0, 0},
};


/* ---- buffers and data: tests/testutil.h ------------------------------------------ */

/* ---- 1. optimised vs reference ------------------------------------------------------ */

static void test_sgemm(void) {
    static const int Ms[] = {1, 7, 33}, Ns[] = {1, 5, 65}, Ks[] = {0, 1, 17, 64};
    for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
    for (size_t a = 0; a < 3; a++)
    for (size_t b = 0; b < 3; b++)
    for (size_t c = 0; c < 4; c++) {
        int M = Ms[a], N = Ns[b], K = Ks[c];
        /* padded leading dimensions: strided views like the attention kernel's */
        int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
        size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
        float *A = rnd(na, 1 + c, -1, 1), *B = rnd(nb, 2 + b, -1, 1), *C0 = rnd(nc, 3, -1, 1);
        float *C1 = dup(C0, nc), *C2 = dup(C0, nc);
        /* beta 0 must not read C (NaN there): the K == 0 case then zeroes it */
        float beta = (a + b + c) % 3 == 2 ? 0.0f : (a + b + c) % 3 ? 0.3f : 1.0f;
        if (beta == 0.0f) /* the matrix, not the padding the GEMM never touches */
            for (int i = 0; i < M; i++) fill_nan(C1 + (size_t)i * ldc, (size_t)N);
        snprintf(where, sizeof where, "tA=%d tB=%d M=%d N=%d K=%d beta=%g", ta, tb, M, N, K, beta);
        mt_sgemm(tws(), ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C1, ldc);
        mt_ref_sgemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C2, ldc);
        RECORD(S_SGEMM, "C", nerr(C1, C2, nc));
        free(A); free(B); free(C0); free(C1); free(C2);
    }
}

static void test_linear(void) {
    static const int Ns[] = {1, 7, 33, 130}, Is[] = {1, 3, 17, 64, 129}, Os[] = {1, 5, 67};
    static const float betas[] = {0.0f, 1.0f, 0.5f};
    for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 5; b++)
    for (size_t c = 0; c < 3; c++) {
        int N = Ns[a], In = Is[b], O = Os[c];
        float beta = betas[(a + b + c) % 3];
        size_t nin = (size_t)N * In, nw = (size_t)O * In, nout = (size_t)N * O;
        float *x = rnd(nin, 10, -1, 1), *W = rnd(nw, 11, -1, 1), *dy = rnd(nout, 12, -1, 1);
        float *y1 = rnd(nout, 13, -1, 1), *y2 = dup(y1, nout);
        if (beta == 0.0f) { fill_nan(y1, nout); fill_nan(y2, nout); } /* beta 0: not read */
        snprintf(where, sizeof where, "N=%d In=%d O=%d beta=%g", N, In, O, beta);
        mt_linear_fwd(tws(), y1, x, W, N, In, O, beta);
        mt_ref_linear_fwd(y2, x, W, N, In, O, beta);
        RECORD(S_LINEAR_FWD, "out", nerr(y1, y2, nout));

        float *dx1 = rnd(nin, 14, -1, 1), *dx2 = dup(dx1, nin);
        if (beta == 0.0f) { fill_nan(dx1, nin); fill_nan(dx2, nin); }
        float *dW1 = rnd(nw, 15, -1, 1), *dW2 = dup(dW1, nw); /* dW accumulates */
        mt_linear_bwd(tws(), dx1, dW1, dy, x, W, N, In, O, beta);
        mt_ref_linear_bwd(dx2, dW2, dy, x, W, N, In, O, beta);
        RECORD(S_LINEAR_BWD, "din", nerr(dx1, dx2, nin));
        RECORD(S_LINEAR_BWD, "dW", nerr(dW1, dW2, nw));
        /* the NULL-skips: dW only, then din only */
        float *dW3 = rnd(nw, 15, -1, 1), *dx3 = rnd(nin, 14, -1, 1);
        mt_linear_bwd(tws(), NULL, dW3, dy, x, W, N, In, O, beta);
        mt_linear_bwd(tws(), dx3, NULL, dy, x, W, N, In, O, 1.0f);
        RECORD(S_LINEAR_BWD, "dW (din NULL)", nerr(dW3, dW2, nw));
        float *dx4 = rnd(nin, 14, -1, 1);
        mt_ref_linear_bwd(dx4, NULL, dy, x, W, N, In, O, 1.0f);
        RECORD(S_LINEAR_BWD, "din (dW NULL)", nerr(dx3, dx4, nin));
        free(x); free(W); free(dy); free(y1); free(y2); free(dx1); free(dx2); free(dW1);
        free(dW2); free(dW3); free(dx3); free(dx4);
    }
}

static void test_rmsnorm(void) {
    static const int Ns[] = {1, 7, 33, 130, 4099}, Cs[] = {1, 3, 17, 64, 257};
    const float eps = 1e-5f;
    for (size_t a = 0; a < 5; a++)
    for (size_t b = 0; b < 5; b++) {
        int N = Ns[a], C = Cs[b];
        if (N == 4099 && C != 64) continue; /* long reduction over rows for dw */
        size_t n = (size_t)N * C;
        /* row scales from 1e-2 to 10 */
        float *x = rnd(n, 20 + b, -1, 1), *w = rnd((size_t)C, 21, 0.5f, 1.5f);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < C; j++) x[(size_t)r * C + j] *= powf(10.0f, (float)(r % 4) - 2.0f);
        float *dy = rnd(n, 22, -1, 1);
        float *y1 = falloc(n), *y2 = falloc(n), *r1 = falloc((size_t)N), *r2 = falloc((size_t)N);
        fill_nan(y1, n); fill_nan(r1, (size_t)N);
        snprintf(where, sizeof where, "N=%d C=%d", N, C);
        mt_rmsnorm_fwd(y1, r1, x, w, N, C, eps);
        mt_ref_rmsnorm_fwd(y2, r2, x, w, N, C, eps);
        RECORD(S_RMSNORM_FWD, "out", nerr(y1, y2, n));
        RECORD(S_RMSNORM_FWD, "rstd", nerr(r1, r2, (size_t)N));

        /* both from the reference rstd, so only the backward differs; dx from 0 */
        float *dx1 = falloc(n), *dx2 = falloc(n);
        memset(dx1, 0, sizeof(float) * n); memset(dx2, 0, sizeof(float) * n);
        float *dw1 = rnd((size_t)C, 23, -1, 1), *dw2 = dup(dw1, (size_t)C);
        mt_rmsnorm_bwd(dx1, dw1, dy, x, w, r2, N, C);
        mt_ref_rmsnorm_bwd(dx2, dw2, dy, x, w, r2, N, C);
        /* C = 1: dx = r w dy (1 - x^2 r^2) = r^3 eps w dy is a cancellation of two terms
         * of size r w dy; measure it against that size instead of its own. */
        if (C == 1) {
            double d = 0, s = 0;
            for (int r = 0; r < N; r++) {
                double e = (double)dx1[r] - dx2[r], t = (double)r2[r] * w[0] * dy[r];
                d += e * e; s += t * t;
            }
            RECORD(S_RMSNORM_BWD, "dx (C=1, vs |r w dy|)", sqrt(d / s));
        } else {
            RECORD(S_RMSNORM_BWD, "dx", nerr(dx1, dx2, n));
        }
        RECORD(S_RMSNORM_BWD, "dw", nerr(dw1, dw2, (size_t)C));
        /* dx accumulates (+=) and dw may be NULL */
        float *dx3 = rnd(n, 24, -1, 1), *dx4 = dup(dx3, n);
        mt_rmsnorm_bwd(dx3, NULL, dy, x, w, r2, N, C);
        mt_ref_rmsnorm_bwd(dx4, NULL, dy, x, w, r2, N, C);
        RECORD(S_RMSNORM_BWD, "dx += (dw NULL)", nerr(dx3, dx4, n));
        free(x); free(w); free(dy); free(y1); free(y2); free(r1); free(r2); free(dx1);
        free(dx2); free(dw1); free(dw2); free(dx3); free(dx4);
    }
}

/* Positions for document mode: row b of pos[B*T] holds documents of the given lengths
 * (lens, terminated by 0; the last document takes what is left of the row). */
static int32_t *make_pos(int B, int T, const int *const *lens) {
    int32_t *pos = mt_xmalloc(sizeof(int32_t) * (B > 0 && T > 0 ? (size_t)B * T : 1));
    for (int b = 0; b < B; b++) {
        const int *len = lens[b];
        int t = 0;
        for (int d = 0; t < T; d++) {
            int n = len && len[d] ? len[d] : T - t;
            for (int i = 0; i < n && t < T; i++, t++) pos[(size_t)b * T + t] = i;
        }
    }
    return pos;
}

static void test_rope(void) {
    static const int Ns[] = {1, 7, 33, 130}, Ts[] = {1, 5, 64}, nhs[] = {1, 3}, Ds[] = {2, 16, 64};
    static const double thetas[] = {1e4, 1e6};
    for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 3; b++)
    for (size_t c = 0; c < 2; c++)
    for (size_t d = 0; d < 3; d++)
    for (size_t e = 0; e < 2; e++)
    for (int inv = 0; inv < 4; inv++) { /* flags: MT_ROPE_INVERSE | MT_ROPE_INTERLEAVE */
        int N = Ns[a], T = Ts[b], nh = nhs[c], D = Ds[d];
        size_t n = (size_t)N * nh * D, nt = (size_t)T * (D / 2);
        float *ct = falloc(nt), *st = falloc(nt);
        mt_rope_table(ct, st, T, D, thetas[e]);
        float *x1 = rnd(n, 30, -1, 1), *x2 = dup(x1, n);
        snprintf(where, sizeof where, "N=%d T=%d nh=%d D=%d theta=%g flags=%d", N, T, nh, D,
                 thetas[e], inv);
        mt_rope_apply(x1, ct, st, N, T, nh, D, inv);
        mt_ref_rope_apply(x2, N, T, nh, D, thetas[e], inv);
        RECORD(S_ROPE, "x", nerr(x1, x2, n));
        free(ct); free(st); free(x1); free(x2);
    }
    /* long positions (angles up to 4095 rad), and forward then inverse = identity */
    int N = 4100, T = 4096, nh = 2, D = 64;
    size_t n = (size_t)N * nh * D, nt = (size_t)T * (D / 2);
    float *ct = falloc(nt), *st = falloc(nt);
    mt_rope_table(ct, st, T, D, 1e4);
    float *x0 = rnd(n, 31, -1, 1), *x1 = dup(x0, n), *x2 = dup(x0, n);
    snprintf(where, sizeof where, "N=%d T=%d nh=%d D=%d theta=1e4", N, T, nh, D);
    mt_rope_apply(x1, ct, st, N, T, nh, D, 0);
    mt_ref_rope_apply(x2, N, T, nh, D, 1e4, 0);
    RECORD(S_ROPE, "x (long)", nerr(x1, x2, n));
    mt_rope_apply(x1, ct, st, N, T, nh, D, 1);
    RECORD(S_ROPE, "inverse(forward(x)) vs x", nerr(x1, x0, n));
    /* interleaved pairs: their own round trip, and not the rotate-half result */
    memcpy(x1, x0, n * sizeof *x1);
    memcpy(x2, x0, n * sizeof *x2);
    mt_rope_apply(x1, ct, st, N, T, nh, D, MT_ROPE_INTERLEAVE);
    mt_ref_rope_apply(x2, N, T, nh, D, 1e4, 0);
    CHECK(nerr(x1, x2, n) > 1e-3);
    mt_rope_apply(x1, ct, st, N, T, nh, D, MT_ROPE_INTERLEAVE | MT_ROPE_INVERSE);
    RECORD(S_ROPE, "interleaved inverse(forward(x)) vs x", nerr(x1, x0, n));
    /* one pair by hand: out[2i] = x[2i] cos a - x[2i+1] sin a at row 1 (position 1), i = 0 */
    memcpy(x1, x0, n * sizeof *x1);
    mt_rope_apply(x1, ct, st, N, T, nh, D, MT_ROPE_INTERLEAVE);
    {
        const float *r0 = x0 + (size_t)1 * nh * D, *r1 = x1 + (size_t)1 * nh * D;
        const double a = 1.0, want0 = r0[0] * cos(a) - r0[1] * sin(a), want1 = r0[1] * cos(a) + r0[0] * sin(a);
        CHECK(fabs(r1[0] - want0) < 1e-5 && fabs(r1[1] - want1) < 1e-5);
    }
    free(ct); free(st); free(x0); free(x1); free(x2);

    /* explicit positions (document mode): 3 rows of 70 tokens, positions restarting at each
     * document (one of length 1), forward and inverse */
    static const int l0[] = {1, 30, 39, 0}, l1[] = {0}, l2[] = {64, 5, 1, 0};
    const int *const docs[] = {l0, l1, l2};
    N = 3 * 70; T = 70; nh = 3; D = 16;
    n = (size_t)N * nh * D; nt = (size_t)T * (D / 2);
    int32_t *pos = make_pos(3, T, docs);
    ct = falloc(nt); st = falloc(nt);
    mt_rope_table(ct, st, T, D, 1e4);
    for (int inv = 0; inv < 4; inv++) {
        x1 = rnd(n, 32, -1, 1); x2 = dup(x1, n);
        snprintf(where, sizeof where, "N=%d T=%d nh=%d D=%d documents flags=%d", N, T, nh, D, inv);
        mt_rope_apply_pos(x1, ct, st, pos, N, T, nh, D, inv);
        mt_ref_rope_apply_pos(x2, pos, N, T, nh, D, 1e4, inv);
        RECORD(S_ROPE, "x (documents)", nerr(x1, x2, n));
        free(x1); free(x2);
    }
    /* strided heads (MLA's q: the last D of every head of W = D + 5 values): the bits of the
     * contiguous rotation of those values; the other 5 untouched */
    enum { WQ = 16 + 5 };
    for (int flags = 0; flags < 4; flags++) {
        float *xs = rnd((size_t)N * nh * WQ, 33, -1, 1), *xs0 = dup(xs, (size_t)N * nh * WQ);
        x1 = falloc(n);
        for (size_t r = 0; r < (size_t)N * nh; r++) memcpy(x1 + r * D, xs + r * WQ + 5, sizeof(float) * D);
        snprintf(where, sizeof where, "N=%d nh=%d D=%d strided flags=%d", N, nh, D, flags);
        mt_rope_apply_ld(xs + 5, ct, st, pos, N, T, nh, D, (size_t)nh * WQ, WQ, flags);
        mt_rope_apply_pos(x1, ct, st, pos, N, T, nh, D, flags);
        int same = 1;
        for (size_t r = 0; r < (size_t)N * nh; r++)
            same &= memcmp(x1 + r * D, xs + r * WQ + 5, sizeof(float) * D) == 0 &&
                    memcmp(xs + r * WQ, xs0 + r * WQ, sizeof(float) * 5) == 0;
        CHECK(same);
        free(xs); free(xs0); free(x1);
    }
    free(pos); free(ct); free(st);
}

static void test_swiglu(void) {
    static const size_t ns[] = {1, 7, 33, 130, 100003};
    for (size_t a = 0; a < 5; a++) {
        size_t n = ns[a];
        float *g = rnd(n, 40, -8, 8), *u = rnd(n, 41, -2, 2), *da = rnd(n, 42, -1, 1);
        float *a1 = falloc(n), *a2 = falloc(n), *dg1 = falloc(n), *du1 = falloc(n);
        float *dg2 = falloc(n), *du2 = falloc(n);
        fill_nan(a1, n); fill_nan(dg1, n); fill_nan(du1, n);
        snprintf(where, sizeof where, "n=%zu", n);
        mt_swiglu_fwd(a1, g, u, n);
        mt_ref_swiglu_fwd(a2, g, u, n);
        RECORD(S_SWIGLU_FWD, "a", nerr(a1, a2, n));
        mt_swiglu_bwd(dg1, du1, da, g, u, n);
        mt_ref_swiglu_bwd(dg2, du2, da, g, u, n);
        RECORD(S_SWIGLU_BWD, "dg", nerr(dg1, dg2, n));
        RECORD(S_SWIGLU_BWD, "du", nerr(du1, du2, n));
        free(g); free(u); free(da); free(a1); free(a2); free(dg1); free(du1); free(dg2); free(du2);
    }
    /* saturating gates: exp overflow must give 0 / identity, never NaN */
    static const float ext[] = {-1000, -100, -88.8f, -30, -1e-8f, 0, 1e-8f, 30, 88.8f, 100, 1000};
    size_t n = sizeof ext / sizeof ext[0];
    float u[11], da[11], a1[11], a2[11], dg1[11], du1[11], dg2[11], du2[11];
    for (size_t i = 0; i < n; i++) { u[i] = 0.5f + (float)i * 0.1f; da[i] = 1.0f - (float)i * 0.15f; }
    snprintf(where, sizeof where, "saturating gates");
    mt_swiglu_fwd(a1, ext, u, n);
    mt_ref_swiglu_fwd(a2, ext, u, n);
    mt_swiglu_bwd(dg1, du1, da, ext, u, n);
    mt_ref_swiglu_bwd(dg2, du2, da, ext, u, n);
    for (size_t i = 0; i < n; i++)
        if (!(isfinite(a1[i]) && isfinite(dg1[i]) && isfinite(du1[i]))) {
            fprintf(stderr, "%s:%d: swiglu g=%g: a=%g dg=%g du=%g not finite\n", __FILE__,
                    __LINE__, (double)ext[i], (double)a1[i], (double)dg1[i], (double)du1[i]);
            failures++;
        }
    RECORD(S_SWIGLU_FWD, "a (saturating)", nerr(a1, a2, n));
    RECORD(S_SWIGLU_BWD, "dg (saturating)", nerr(dg1, dg2, n));
    RECORD(S_SWIGLU_BWD, "du (saturating)", nerr(du1, du2, n));
}


/* Runs fwd+bwd with pos and nthr threads; checks the results have the bits of o..dv. */
static void att_same_bits(const float *o, const float *l, const float *dq, const float *dk,
                          const float *dv, const float *q, const float *k, const float *v,
                          const float *dout, const int32_t *pos, int B, int T, int H, int G,
                          int D, float *scratch, int nthr) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
    float *o3 = falloc(nq), *l3 = falloc(nl), *dq3 = falloc(nq), *dk3 = falloc(nk);
    float *dv3 = falloc(nk);
    mt_attention_fwd(o3, l3, q, k, v, pos, B, T, H, G, D, scratch, nthr, 0);
    mt_attention_bwd(dq3, dk3, dv3, dout, q, k, v, o3, l3, pos, B, T, H, G, D, scratch, nthr, 0);
    CHECK_SAME_F(o3, o, nq);
    CHECK_SAME_F(l3, l, nl);
    CHECK_SAME_F(dq3, dq, nq);
    CHECK_SAME_F(dk3, dk, nk);
    CHECK_SAME_F(dv3, dv, nk);
    free(o3); free(l3); free(dq3); free(dk3); free(dv3);
}

/* One attention case: optimised fwd+bwd vs the unfused reference, with positions pos
 * (NULL: plain causal). amp scales q and k (amp 3 gives peaked softmax rows). With
 * check_threads, the same bits with 1 thread as with nthr; with pos == NULL, also the
 * same bits as with explicit positions 0..T-1. */
static void attention_case(int B, int T, int H, int G, int D, float amp, const int32_t *pos,
                           const char *tag, int check_threads) {
    /* at least 2 (the kernels take the count): the 1-thread check must compare two splits */
    int nthr = omp_get_max_threads() > 2 ? omp_get_max_threads() : 2;
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
    size_t nscr = (size_t)nthr * mt_attention_scratch_floats(T, D);
    uint64_t s = (uint64_t)(B * 1000003 + T * 1009 + H * 101 + G * 11 + D);
    float *q = rnd(nq, 50 + s, -amp, amp), *k = rnd(nk, 51 + s, -amp, amp);
    float *v = rnd(nk, 52 + s, -1, 1), *dout = rnd(nq, 53 + s, -1, 1);
    float *o1 = falloc(nq), *o2 = falloc(nq), *l1 = falloc(nl), *l2 = falloc(nl);
    float *dq1 = falloc(nq), *dk1 = falloc(nk), *dv1 = falloc(nk);
    float *dq2 = falloc(nq), *dk2 = falloc(nk), *dv2 = falloc(nk);
    float *scratch = falloc(nscr);
    fill_nan(o1, nq); fill_nan(l1, nl); fill_nan(dq1, nq); fill_nan(dk1, nk); fill_nan(dv1, nk);
    fill_nan(scratch, nscr);
    snprintf(where, sizeof where, "B=%d T=%d H=%d G=%d D=%d amp=%g %s", B, T, H, G, D, amp, tag);
    mt_attention_fwd(o1, l1, q, k, v, pos, B, T, H, G, D, scratch, nthr, 0);
    mt_ref_attention_fwd(o2, l2, q, k, v, pos, B, T, H, G, D);
    RECORD(S_ATT_FWD, "out", nerr(o1, o2, nq));
    RECORD(S_ATT_FWD, "lse", nerr(l1, l2, nl));
    fill_nan(scratch, nscr);
    mt_attention_bwd(dq1, dk1, dv1, dout, q, k, v, o1, l1, pos, B, T, H, G, D, scratch, nthr, 0);
    mt_ref_attention_bwd(dq2, dk2, dv2, dout, q, k, v, pos, B, T, H, G, D);
    RECORD(S_ATT_BWD, "dq", nerr(dq1, dq2, nq));
    RECORD(S_ATT_BWD, "dk", nerr(dk1, dk2, nk));
    RECORD(S_ATT_BWD, "dv", nerr(dv1, dv2, nk));
    if (check_threads) {
        /* (b, h) and (b, g) tasks are each one thread's: 1 thread gives the same bits */
        att_same_bits(o1, l1, dq1, dk1, dv1, q, k, v, dout, pos, B, T, H, G, D, scratch, 1);
        if (!pos) { /* explicit positions 0..T-1 are plain causal */
            int32_t *p0 = mt_xmalloc(sizeof(int32_t) * (B > 0 && T > 0 ? (size_t)B * T : 1));
            for (int i = 0; i < B * T; i++) p0[i] = i % T;
            att_same_bits(o1, l1, dq1, dk1, dv1, q, k, v, dout, p0, B, T, H, G, D, scratch, nthr);
            free(p0);
        }
    }
    free(q); free(k); free(v); free(dout); free(o1); free(o2); free(l1); free(l2);
    free(dq1); free(dk1); free(dv1); free(dq2); free(dk2); free(dv2); free(scratch);
}

/* Separate key and value widths (mt_attention_fwd_dv, MLA's q/k of dn + dr and v of dv)
 * against the reference at one width D = max(Dk, Dv): q and k zero-padded to D with q scaled
 * by sqrt(D / Dk) (the same scores), v and dout zero-padded (the same output and dv in the
 * first Dv columns); then dq is the reference's times that scale. With Dk == Dv the _dv
 * entry points give the bits of the one-width ones. */
static void attention_dv_case(int B, int T, int H, int G, int Dk, int Dv, const int32_t *pos, const char *tag) {
    int nthr = omp_get_max_threads() > 2 ? omp_get_max_threads() : 2;
    const int D = Dk > Dv ? Dk : Dv;
    const size_t rows_q = (size_t)B * T * H, rows_k = (size_t)B * T * G, nl = (size_t)B * H * T;
    const size_t nscr = (size_t)nthr * mt_attention_scratch_floats(T, D);
    const uint64_t s = (uint64_t)(B * 7919 + T * 131 + H * 17 + G * 5 + Dk * 3 + Dv);
    float *q = rnd(rows_q * Dk, 70 + s, -1, 1), *k = rnd(rows_k * Dk, 71 + s, -1, 1);
    float *v = rnd(rows_k * Dv, 72 + s, -1, 1), *dout = rnd(rows_q * Dv, 73 + s, -1, 1);
    float *qp = falloc(rows_q * D), *kp = falloc(rows_k * D), *vp = falloc(rows_k * D), *dop = falloc(rows_q * D);
    const float r = sqrtf((float)D / (float)Dk);
    for (size_t i = 0; i < rows_q; i++)
        for (int c = 0; c < D; c++) {
            qp[i * D + c] = c < Dk ? q[i * Dk + c] * r : 0.0f;
            dop[i * D + c] = c < Dv ? dout[i * Dv + c] : 0.0f;
        }
    for (size_t i = 0; i < rows_k; i++)
        for (int c = 0; c < D; c++) {
            kp[i * D + c] = c < Dk ? k[i * Dk + c] : 0.0f;
            vp[i * D + c] = c < Dv ? v[i * Dv + c] : 0.0f;
        }
    float *o1 = falloc(rows_q * Dv), *l1 = falloc(nl), *dq1 = falloc(rows_q * Dk), *dk1 = falloc(rows_k * Dk);
    float *dv1 = falloc(rows_k * Dv), *o2 = falloc(rows_q * D), *l2 = falloc(nl), *dq2 = falloc(rows_q * D);
    float *dk2 = falloc(rows_k * D), *dv2 = falloc(rows_k * D), *scratch = falloc(nscr);
    fill_nan(o1, rows_q * Dv); fill_nan(dq1, rows_q * Dk); fill_nan(dk1, rows_k * Dk); fill_nan(dv1, rows_k * Dv);
    fill_nan(scratch, nscr);
    snprintf(where, sizeof where, "B=%d T=%d H=%d G=%d Dk=%d Dv=%d %s", B, T, H, G, Dk, Dv, tag);
    mt_attention_fwd_dv(o1, l1, q, k, v, pos, B, T, H, G, Dk, Dv, scratch, nthr, 0);
    fill_nan(scratch, nscr);
    mt_attention_bwd_dv(dq1, dk1, dv1, dout, q, k, v, o1, l1, pos, B, T, H, G, Dk, Dv, scratch, nthr, 0);
    mt_ref_attention_fwd(o2, l2, qp, kp, vp, pos, B, T, H, G, D);
    mt_ref_attention_bwd(dq2, dk2, dv2, dop, qp, kp, vp, pos, B, T, H, G, D);
    /* the reference's results cut to the kernel's widths (dq scaled back) */
    for (size_t i = 0; i < rows_q; i++) {
        for (int c = 0; c < Dv; c++) o2[i * Dv + c] = o2[i * D + c];
        for (int c = 0; c < Dk; c++) dq2[i * Dk + c] = dq2[i * D + c] * r;
    }
    for (size_t i = 0; i < rows_k; i++) {
        for (int c = 0; c < Dk; c++) dk2[i * Dk + c] = dk2[i * D + c];
        for (int c = 0; c < Dv; c++) dv2[i * Dv + c] = dv2[i * D + c];
    }
    RECORD(S_ATT_FWD, "out (Dk != Dv)", nerr(o1, o2, rows_q * Dv));
    RECORD(S_ATT_FWD, "lse (Dk != Dv)", nerr(l1, l2, nl));
    RECORD(S_ATT_BWD, "dq (Dk != Dv)", nerr(dq1, dq2, rows_q * Dk));
    RECORD(S_ATT_BWD, "dk (Dk != Dv)", nerr(dk1, dk2, rows_k * Dk));
    RECORD(S_ATT_BWD, "dv (Dk != Dv)", nerr(dv1, dv2, rows_k * Dv));
    if (Dk == Dv) { /* the one-width entry points: the same bits */
        float *o3 = falloc(rows_q * Dv), *l3 = falloc(nl), *dq3 = falloc(rows_q * Dk), *dk3 = falloc(rows_k * Dk);
        float *dv3 = falloc(rows_k * Dv);
        mt_attention_fwd(o3, l3, q, k, v, pos, B, T, H, G, Dk, scratch, nthr, 0);
        mt_attention_bwd(dq3, dk3, dv3, dout, q, k, v, o3, l3, pos, B, T, H, G, Dk, scratch, nthr, 0);
        CHECK_SAME_F(o3, o1, rows_q * Dv);
        CHECK_SAME_F(dq3, dq1, rows_q * Dk);
        CHECK_SAME_F(dk3, dk1, rows_k * Dk);
        CHECK_SAME_F(dv3, dv1, rows_k * Dv);
        free(o3); free(l3); free(dq3); free(dk3); free(dv3);
    }
    free(q); free(k); free(v); free(dout); free(qp); free(kp); free(vp); free(dop);
    free(o1); free(l1); free(dq1); free(dk1); free(dv1); free(o2); free(l2); free(dq2); free(dk2); free(dv2);
    free(scratch);
}

static void test_attention(void) {
    /* T = 59: 9 tiles of 6 key/query rows + a remainder of 5 (1, 2, 3, 4 come from the others) */
    static const int Ts[] = {1, 2, 59, 63, 64, 65, 130, 257}, Ds[] = {8, 16, 64};
    static const int HG[][2] = {{1, 1}, {4, 2}, {8, 1}};
    for (size_t a = 0; a < 8; a++)
    for (size_t b = 0; b < 3; b++)
    for (size_t c = 0; c < 3; c++) {
        int T = Ts[a], H = HG[b][0], G = HG[b][1], D = Ds[c];
        int B = (T == 2 || T == 65) ? 2 : 1;
        if (T == 257 && H * D > 64) continue; /* keep the O(T^2) reference cheap */
        attention_case(B, T, H, G, D, 1.0f, NULL, "causal", T == 65 || (T == 130 && b == 1));
    }
    attention_case(2, 130, 4, 2, 2, 1.0f, NULL, "causal", 0);  /* smallest even D */
    attention_case(1, 100, 2, 1, 40, 1.0f, NULL, "causal", 0); /* D not a multiple of 16 */
    attention_case(1, 70, 1, 1, 80, 1.0f, NULL, "causal", 0);  /* D > 64 */
    attention_case(2, 130, 4, 2, 16, 3.0f, NULL, "causal peaked", 0);
    attention_case(1, 200, 4, 2, 64, 1.0f, NULL, "causal", 0);
    attention_case(1, 70, 1, 1, 128, 1.0f, NULL, "causal", 0); /* D = 128: two 64-column blocks */
    /* T > 512: the forward's later groups of 8 query blocks (each a task of its own) */
    attention_case(1, 600, 2, 1, 16, 1.0f, NULL, "causal", 1);
    /* separate key / value widths: MLA's (dn + dr, dv) shapes, wider values, odd widths */
    attention_dv_case(1, 130, 4, 4, 48, 32, NULL, "causal");
    attention_dv_case(2, 70, 2, 2, 24, 80, NULL, "causal");
    attention_dv_case(1, 65, 3, 1, 10, 6, NULL, "causal");
    attention_dv_case(1, 100, 2, 2, 32, 32, NULL, "causal");

    /* document mode: odd lengths, a document of length 1 (also first and last), documents
     * ending on and across the 64-row tile boundaries, and a row that is one document */
    static const int r0[] = {37, 1, 26, 65, 1, 0}, r1[] = {0}, r2[] = {1, 1, 3, 59, 64, 2, 0};
    static const int r3[] = {130, 0}, r4[] = {129, 0}, r5[] = {5, 7, 9, 11, 13, 0};
    const int *const rows[] = {r0, r1, r2, r3, r4, r5};
    int32_t *pos = make_pos(6, 130, rows);
    attention_case(6, 130, 4, 2, 16, 1.0f, pos, "documents", 1);
    attention_case(6, 130, 1, 1, 64, 3.0f, pos, "documents peaked", 0);
    attention_case(6, 130, 8, 1, 8, 1.0f, pos, "documents", 0);
    attention_dv_case(6, 130, 2, 2, 40, 16, pos, "documents");
    free(pos);
    static const int s0[] = {1, 0}, s1[] = {70, 99, 1, 0}, s2[] = {200, 1, 0};
    const int *const rows2[] = {s0, s1, s2};
    pos = make_pos(3, 257, rows2);
    attention_case(3, 257, 2, 2, 32, 1.0f, pos, "documents", 1);
    free(pos);
    /* T > 512 in document mode: the second group's queries still see key 0 (a document of
     * 530), the third group's start at key block 960 (its first document starts at 1023,
     * one token before the group) */
    static const int d0[] = {530, 1, 492, 77, 0};
    const int *const rows3[] = {d0};
    pos = make_pos(1, 1100, rows3);
    attention_case(1, 1100, 1, 1, 16, 1.0f, pos, "documents", 1);
    free(pos);
}

static void head_case(int N, int C, int V, int ignore_all) {
    size_t nx = (size_t)N * C, nw = (size_t)V * C, nl = (size_t)N * V;
    uint64_t s = (uint64_t)(N * 10007 + C * 101 + V);
    float *x = rnd(nx, 60 + s, -1, 1), *W = rnd(nw, 61 + s, -0.5f, 0.5f);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * (size_t)N);
    int valid = 0;
    for (int n = 0; n < N; n++) {
        uint64_t h = mt_hash4(62 + s, (uint64_t)n, 0, 0);
        tg[n] = (ignore_all || h % 5 == 0) ? -1 : (int32_t)((h >> 8) % (uint64_t)V);
        valid += tg[n] >= 0;
    }
    float gs = 1.0f / (float)(valid ? valid : 1);
    float *dx1 = falloc(nx), *dx2 = falloc(nx), *lg1 = falloc(nl), *lg2 = falloc(nl);
    float *dW1 = rnd(nw, 63, -1, 1), *dW2 = dup(dW1, nw), *lg3 = falloc(nl);
    float *scratch = falloc(mt_head_scratch_floats(V));
    fill_nan(dx1, nx); fill_nan(lg1, nl); fill_nan(lg3, nl);
    fill_nan(scratch, mt_head_scratch_floats(V));
    snprintf(where, sizeof where, "N=%d C=%d V=%d valid=%d", N, C, V, valid);
    double L1 = mt_head_ce(tws(), dx1, dW1, lg1, x, W, tg, N, C, V, gs, NULL, scratch);
    double L2 = mt_ref_head_ce(dx2, dW2, lg2, x, W, tg, N, C, V, gs);
    CHECK(isfinite(L1));
    RECORD(S_HEAD_LOSS, "loss", L2 != 0 ? fabs(L1 - L2) / fabs(L2) : fabs(L1));
    RECORD(S_HEAD_LOSS, "logits", nerr(lg1, lg2, nl));
    RECORD(S_HEAD_GRAD, "dx", nerr(dx1, dx2, nx));
    RECORD(S_HEAD_GRAD, "dW", nerr(dW1, dW2, nw));
    if (ignore_all) {
        CHECK_SAME_D(L1, 0.0);
        float *zero = falloc(nx);
        memset(zero, 0, sizeof(float) * nx);
        CHECK_SAME_F(dx1, zero, nx);
        free(zero);
    }
    /* evaluation path (no gradients) returns the same loss bits */
    fill_nan(scratch, mt_head_scratch_floats(V));
    double L3 = mt_head_ce(tws(), NULL, NULL, lg3, x, W, tg, N, C, V, gs, NULL, scratch);
    CHECK_SAME_D(L3, L1);
    CHECK_SAME_F(lg3, lg1, nl);
    double L4 = mt_head_ce(tws(), NULL, NULL, NULL, x, W, tg, N, C, V, gs, NULL, scratch);
    CHECK_SAME_D(L4, L1);
    free(x); free(W); free(tg); free(dx1); free(dx2); free(lg1); free(lg2); free(dW1);
    free(dW2); free(lg3); free(scratch);
}

static void test_head(void) {
    /* V = 256: the logits chunk's row stride padded past a multiple of 1 KiB */
    static const int Ns[] = {1, 7, 130, MT_HEAD_ROWS + 1}, Cs[] = {3, 16, 64}, Vs[] = {5, 33, 256, 300};
    for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 3; b++)
    for (size_t c = 0; c < 4; c++) head_case(Ns[a], Cs[b], Vs[c], 0);
    head_case(130, 16, 33, 1);
    head_case(1, 16, 33, 1);
}

static void test_sumsq(void) {
    static const size_t ns[] = {0, 1, 7, 65536, 65537 * 3 + 1, (size_t)65536 * 257 + 5};
    int saved = omp_get_max_threads();
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        size_t n = ns[a];
        float *x = rnd(n, 70, -2, 2);
        snprintf(where, sizeof where, "n=%zu", n);
        double s0 = mt_sumsq(x, n), r = mt_ref_sumsq(x, n);
        RECORD(S_SUMSQ, "sum", r != 0 ? fabs(s0 - r) / r : fabs(s0));
        /* bit-identical for any thread count */
        double st[3];
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            st[t - 1] = mt_sumsq(x, n);
        }
        omp_set_num_threads(saved);
        CHECK_SAME_D(st[0], st[1]);
        CHECK_SAME_D(st[0], st[2]);
        CHECK_SAME_D(st[0], s0);
        free(x);
    }
}

/* mt_zero: small buffers (memset) and large ones (streaming stores from the first 64-byte
 * boundary on, plain stores before and after), at every alignment of the start, and the
 * floats around the span left alone. */
static void test_zero(void) {
    static const size_t ns[] = {0, 1, 17, 100000, ((size_t)1 << 22) + 3, ((size_t)1 << 22) * 3 + 37};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t skew = 0; skew < 16; skew += a < 4 ? 1 : 5) {
            size_t n = ns[a], total = n + skew + 2;
            float *buf = rnd(total, 71, 1, 2); /* no zeros */
            mt_zero(buf + skew + 1, n);
            size_t bad = 0;
            for (size_t i = 0; i < total; i++) {
                int inside = i >= skew + 1 && i < skew + 1 + n;
                if (inside ? buf[i] != 0.0f : buf[i] == 0.0f) bad++;
            }
            if (bad) {
                fprintf(stderr, "mt_zero n=%zu at float offset %zu: %zu floats wrong\n", n, skew + 1, bad);
                failures++;
            }
            free(buf);
        }
}

static void test_rmsnorm_bwd_threads(void) {
    int saved = omp_get_max_threads();
    int N = 1031, C = 257;
    size_t n = (size_t)N * C;
    snprintf(where, sizeof where, "N=%d C=%d, threads 1 vs 2, 3", N, C);
    float *x = rnd(n, 80, -1, 1), *w = rnd((size_t)C, 81, 0.5f, 1.5f), *dy = rnd(n, 82, -1, 1);
    float *y = falloc(n), *r = falloc((size_t)N);
    mt_rmsnorm_fwd(y, r, x, w, N, C, 1e-5f);
    float *dx[3], *dw[3];
    for (int t = 1; t <= 3; t++) {
        dx[t - 1] = rnd(n, 83, -1, 1);
        dw[t - 1] = rnd((size_t)C, 84, -1, 1);
        omp_set_num_threads(t);
        mt_rmsnorm_bwd(dx[t - 1], dw[t - 1], dy, x, w, r, N, C);
    }
    omp_set_num_threads(saved);
    for (int t = 1; t < 3; t++) {
        CHECK_SAME_F(dw[t], dw[0], (size_t)C);
        CHECK_SAME_F(dx[t], dx[0], n);
    }
    for (int t = 0; t < 3; t++) { free(dx[t]); free(dw[t]); }
    free(x); free(w); free(dy); free(y); free(r);
}

static void test_adamw(void) {
    static const size_t ns[] = {1, 7, 33, 4099};
    static const float wds[] = {0.0f, 0.1f}, gss[] = {1.0f, 0.5f};
    /* beta2 near 1: the bias correction 1 - beta2^t is then a small difference of numbers
     * near 1, which a float pow would get wrong by ~1e-3 relative at t = 2 */
    static const float b2s[] = {0.95f, 0.99999f};
    for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 2; b++)
    for (size_t c = 0; c < 2; c++)
    for (size_t e = 0; e < 2; e++) {
        size_t n = ns[a];
        const float lr = 1e-2f, b1 = 0.9f, b2 = b2s[e], eps = 1e-8f;
        float *p0 = rnd(n, 90, -0.05f, 0.05f);
        float *p1 = dup(p0, n), *p2 = dup(p0, n);
        float *m1 = falloc(n), *v1 = falloc(n), *m2 = falloc(n), *v2 = falloc(n);
        memset(m1, 0, sizeof(float) * n); memset(v1, 0, sizeof(float) * n);
        memset(m2, 0, sizeof(float) * n); memset(v2, 0, sizeof(float) * n);
        float *g = falloc(n), *d1 = falloc(n), *d2 = falloc(n);
        /* steps 1..5 with fresh gradients (some exactly 0), then a late step 1000 */
        for (int step = 1; step <= 6; step++) {
            int st = step <= 5 ? step : 1000;
            fill(g, n, 91 + (uint64_t)step, -1, 1);
            for (size_t i = 4; i < n; i += 5) g[i] = 0.0f;
            float *pb = dup(p1, n);
            mt_adamw(p1, g, m1, v1, n, lr, b1, b2, eps, wds[b], gss[c], st);
            mt_ref_adamw(p2, g, m2, v2, n, lr, b1, b2, eps, wds[b], gss[c], st);
            for (size_t i = 0; i < n; i++) { d1[i] = p1[i] - pb[i]; d2[i] = p2[i] - pb[i]; }
            snprintf(where, sizeof where, "n=%zu wd=%g gscale=%g beta2=%g step=%d", n, wds[b], gss[c], b2, st);
            RECORD(S_ADAMW, "p", nerr(p1, p2, n));
            RECORD(S_ADAMW, "m", nerr(m1, m2, n));
            RECORD(S_ADAMW, "v", nerr(v1, v2, n));
            RECORD(S_ADAMW, "update", nerr(d1, d2, n));
            memcpy(p2, p1, sizeof(float) * n); /* compare each step from the same state */
            memcpy(m2, m1, sizeof(float) * n);
            memcpy(v2, v1, sizeof(float) * n);
            free(pb);
        }
        free(p0); free(p1); free(p2); free(m1); free(v1); free(m2); free(v2); free(g);
        free(d1); free(d2);
    }
}

/* mt_adamw_multi (the trainer's optimizer: many tensors of the flat buffers in one parallel
 * job) against mt_adamw on each tensor alone, which the test above compares with the
 * reference: the same bits for every tensor, with lengths that end inside, on and just past
 * the 16384-element chunks it splits work into, gaps between tensors (never written) and
 * tensors out of buffer order, decay on some only, and 1-3 threads. */
static void test_adamw_multi(void) {
    enum { NT = 6 };
    static const size_t len[NT] = {16384, 1, 40000, 7, 16385, 16383};
    static const size_t off[NT] = {50000, 3, 66400, 10, 20, 106400};
    static const int decay[NT] = {1, 0, 1, 0, 1, 1};
    const size_t n = 106400 + 16383 + 5; /* last tensor's end, and a gap after it */
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    int saved = omp_get_max_threads();
    float *p0 = rnd(n, 95, -0.05f, 0.05f), *g = rnd(n, 96, -1, 1);
    float *pr = dup(p0, n), *mr = falloc(n), *vr = falloc(n);
    memset(mr, 0, sizeof(float) * n); memset(vr, 0, sizeof(float) * n);
    for (int step = 1; step <= 3; step++)
        for (int t = 0; t < NT; t++)
            mt_adamw(pr + off[t], g + off[t], mr + off[t], vr + off[t], len[t], lr, b1, b2, eps,
                     decay[t] ? wd : 0.0f, gs, step);
    for (int th = 1; th <= 3; th++) {
        float *p = dup(p0, n), *m = falloc(n), *v = falloc(n);
        memset(m, 0, sizeof(float) * n); memset(v, 0, sizeof(float) * n);
        omp_set_num_threads(th);
        for (int step = 1; step <= 3; step++)
            mt_adamw_multi(p, g, m, v, NT, off, len, decay, lr, b1, b2, eps, wd, gs, step);
        omp_set_num_threads(saved);
        snprintf(where, sizeof where, "adamw_multi threads=%d", th);
        /* gaps (p0, m = v = 0 there) and tensors alike: the same bits as the per-tensor calls */
        CHECK_SAME_F(p, pr, n);
        CHECK_SAME_F(m, mr, n);
        CHECK_SAME_F(v, vr, n);
        free(p); free(m); free(v);
    }
    free(p0); free(g); free(pr); free(mr); free(vr);
}

/* ---- 2. finite differences ---------------------------------------------------------- */

/* finite differences: fd_worst() in tests/testutil.h, recorded under statistic s */
static void fd_check(int s, const char *what, float *param, size_t n, const float *g_ref,
                     const float *g_opt, loss_fn f, void *ctx, uint64_t seed, int nco, double eps) {
    RECORD(s, what, fd_worst(what, param, n, g_ref, g_opt, f, ctx, seed, nco, eps, stats[s].tol));
}

typedef struct {
    int N, In, O;
    float *x, *W, *R, *y;
} fd_linear_ctx;
static double fd_linear_loss(void *p) {
    fd_linear_ctx *c = p;
    mt_ref_linear_fwd(c->y, c->x, c->W, c->N, c->In, c->O, 0.0f);
    return dot_d(c->y, c->R, (size_t)c->N * c->O);
}
static void fd_linear(void) {
    fd_linear_ctx c = {.N = 4, .In = 5, .O = 3};
    size_t nx = (size_t)c.N * c.In, nw = (size_t)c.O * c.In, ny = (size_t)c.N * c.O;
    c.x = rnd(nx, 100, -1, 1); c.W = rnd(nw, 101, -1, 1); c.R = rnd(ny, 102, -1, 1);
    c.y = falloc(ny);
    float *dx = falloc(nx), *dW = falloc(nw), *dx2 = falloc(nx), *dW2 = falloc(nw);
    memset(dW, 0, sizeof(float) * nw); memset(dW2, 0, sizeof(float) * nw);
    mt_ref_linear_bwd(dx, dW, c.R, c.x, c.W, c.N, c.In, c.O, 0.0f);
    mt_linear_bwd(tws(), dx2, dW2, c.R, c.x, c.W, c.N, c.In, c.O, 0.0f);
    snprintf(where, sizeof where, "N=%d In=%d O=%d", c.N, c.In, c.O);
    fd_check(S_FD_LINEAR, "din", c.x, nx, dx, dx2, fd_linear_loss, &c, 103, 20, 1e-3);
    fd_check(S_FD_LINEAR, "dW", c.W, nw, dW, dW2, fd_linear_loss, &c, 104, 15, 1e-3);
    free(c.x); free(c.W); free(c.R); free(c.y); free(dx); free(dW); free(dx2); free(dW2);
}

typedef struct {
    int N, C;
    float eps;
    float *x, *w, *R, *y, *r;
} fd_rms_ctx;
static double fd_rms_loss(void *p) {
    fd_rms_ctx *c = p;
    mt_ref_rmsnorm_fwd(c->y, c->r, c->x, c->w, c->N, c->C, c->eps);
    return dot_d(c->y, c->R, (size_t)c->N * c->C);
}
static void fd_rmsnorm(void) {
    fd_rms_ctx c = {.N = 3, .C = 8, .eps = 1e-5f};
    size_t n = (size_t)c.N * c.C;
    c.x = rnd(n, 110, -1, 1); c.w = rnd((size_t)c.C, 111, 0.5f, 1.5f); c.R = rnd(n, 112, -1, 1);
    c.y = falloc(n); c.r = falloc((size_t)c.N);
    float *dx = falloc(n), *dw = falloc((size_t)c.C), *dx2 = falloc(n), *dw2 = falloc((size_t)c.C);
    float *r2 = falloc((size_t)c.N);
    memset(dx, 0, sizeof(float) * n); memset(dw, 0, sizeof(float) * (size_t)c.C);
    memset(dx2, 0, sizeof(float) * n); memset(dw2, 0, sizeof(float) * (size_t)c.C);
    fd_rms_loss(&c);
    mt_ref_rmsnorm_bwd(dx, dw, c.R, c.x, c.w, c.r, c.N, c.C);
    mt_rmsnorm_fwd(c.y, r2, c.x, c.w, c.N, c.C, c.eps);
    mt_rmsnorm_bwd(dx2, dw2, c.R, c.x, c.w, r2, c.N, c.C);
    snprintf(where, sizeof where, "N=%d C=%d", c.N, c.C);
    fd_check(S_FD_RMSNORM, "dx", c.x, n, dx, dx2, fd_rms_loss, &c, 113, 20, 1e-3);
    fd_check(S_FD_RMSNORM, "dw", c.w, (size_t)c.C, dw, dw2, fd_rms_loss, &c, 114, 8, 1e-3);
    free(c.x); free(c.w); free(c.R); free(c.y); free(c.r); free(dx); free(dw); free(dx2);
    free(dw2); free(r2);
}

typedef struct {
    int N, T, nh, D;
    double theta;
    float *x, *R, *y;
} fd_rope_ctx;
static double fd_rope_loss(void *p) {
    fd_rope_ctx *c = p;
    size_t n = (size_t)c->N * c->nh * c->D;
    memcpy(c->y, c->x, sizeof(float) * n);
    mt_ref_rope_apply(c->y, c->N, c->T, c->nh, c->D, c->theta, 0);
    return dot_d(c->y, c->R, n);
}
static void fd_rope(void) {
    fd_rope_ctx c = {.N = 6, .T = 4, .nh = 2, .D = 8, .theta = 10.0}; /* big angles */
    size_t n = (size_t)c.N * c.nh * c.D, nt = (size_t)c.T * (c.D / 2);
    c.x = rnd(n, 120, -1, 1); c.R = rnd(n, 121, -1, 1); c.y = falloc(n);
    /* the backward of the rotation is the inverse rotation applied to dL/dout = R */
    float *g = dup(c.R, n), *g2 = dup(c.R, n), *ct = falloc(nt), *st = falloc(nt);
    mt_ref_rope_apply(g, c.N, c.T, c.nh, c.D, c.theta, 1);
    mt_rope_table(ct, st, c.T, c.D, c.theta);
    mt_rope_apply(g2, ct, st, c.N, c.T, c.nh, c.D, 1);
    snprintf(where, sizeof where, "N=%d T=%d nh=%d D=%d", c.N, c.T, c.nh, c.D);
    fd_check(S_FD_ROPE, "dx", c.x, n, g, g2, fd_rope_loss, &c, 122, 20, 1e-3);
    free(c.x); free(c.R); free(c.y); free(g); free(g2); free(ct); free(st);
}

typedef struct {
    size_t n;
    float *g, *u, *R, *a;
} fd_swiglu_ctx;
static double fd_swiglu_loss(void *p) {
    fd_swiglu_ctx *c = p;
    mt_ref_swiglu_fwd(c->a, c->g, c->u, c->n);
    return dot_d(c->a, c->R, c->n);
}
static void fd_swiglu(void) {
    fd_swiglu_ctx c = {.n = 50};
    c.g = rnd(c.n, 130, -5, 5); c.u = rnd(c.n, 131, -2, 2); c.R = rnd(c.n, 132, -1, 1);
    c.a = falloc(c.n);
    float *dg = falloc(c.n), *du = falloc(c.n), *dg2 = falloc(c.n), *du2 = falloc(c.n);
    mt_ref_swiglu_bwd(dg, du, c.R, c.g, c.u, c.n);
    mt_swiglu_bwd(dg2, du2, c.R, c.g, c.u, c.n);
    snprintf(where, sizeof where, "n=%zu", c.n);
    fd_check(S_FD_SWIGLU, "dg", c.g, c.n, dg, dg2, fd_swiglu_loss, &c, 133, 20, 1e-3);
    fd_check(S_FD_SWIGLU, "du", c.u, c.n, du, du2, fd_swiglu_loss, &c, 134, 20, 1e-3);
    free(c.g); free(c.u); free(c.R); free(c.a); free(dg); free(du); free(dg2); free(du2);
}

typedef struct {
    int B, T, H, G, D;
    const int32_t *pos;
    float *q, *k, *v, *R, *out, *lse;
} fd_att_ctx;
static double fd_att_loss(void *p) {
    fd_att_ctx *c = p;
    mt_ref_attention_fwd(c->out, c->lse, c->q, c->k, c->v, c->pos, c->B, c->T, c->H, c->G, c->D);
    return dot_d(c->out, c->R, (size_t)c->B * c->T * c->H * c->D);
}
static void fd_attention_case(int B, int T, int H, int G, int D, const int32_t *pos,
                              uint64_t seed) {
    fd_att_ctx c = {.B = B, .T = T, .H = H, .G = G, .D = D, .pos = pos};
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D;
    c.q = rnd(nq, seed, -1, 1); c.k = rnd(nk, seed + 1, -1, 1); c.v = rnd(nk, seed + 2, -1, 1);
    c.R = rnd(nq, seed + 3, -1, 1);
    c.out = falloc(nq); c.lse = falloc((size_t)B * H * T);
    float *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
    float *dq2 = falloc(nq), *dk2 = falloc(nk), *dv2 = falloc(nk);
    float *o2 = falloc(nq), *l2 = falloc((size_t)B * H * T);
    int nthr = omp_get_max_threads();
    float *scratch = falloc((size_t)nthr * mt_attention_scratch_floats(T, D));
    mt_ref_attention_bwd(dq, dk, dv, c.R, c.q, c.k, c.v, pos, B, T, H, G, D);
    mt_attention_fwd(o2, l2, c.q, c.k, c.v, pos, B, T, H, G, D, scratch, nthr, 0);
    mt_attention_bwd(dq2, dk2, dv2, c.R, c.q, c.k, c.v, o2, l2, pos, B, T, H, G, D, scratch, nthr, 0);
    snprintf(where, sizeof where, "B=%d T=%d H=%d G=%d D=%d%s", B, T, H, G, D,
             pos ? " documents" : "");
    fd_check(S_FD_ATT, "dq", c.q, nq, dq, dq2, fd_att_loss, &c, seed + 4, 20, 1e-2);
    fd_check(S_FD_ATT, "dk", c.k, nk, dk, dk2, fd_att_loss, &c, seed + 5, 20, 1e-2);
    fd_check(S_FD_ATT, "dv", c.v, nk, dv, dv2, fd_att_loss, &c, seed + 6, 20, 1e-2);
    free(c.q); free(c.k); free(c.v); free(c.R); free(c.out); free(c.lse); free(dq); free(dk);
    free(dv); free(dq2); free(dk2); free(dv2); free(o2); free(l2); free(scratch);
}
static void fd_attention(void) {
    fd_attention_case(2, 7, 4, 2, 8, NULL, 140);  /* GQA, one tile */
    fd_attention_case(1, 70, 2, 1, 4, NULL, 150); /* crosses the 64-row tile boundary */
    static const int r0[] = {3, 1, 61, 0}, r1[] = {1, 66, 0};
    const int *const rows[] = {r0, r1};
    int32_t *pos = make_pos(2, 70, rows);
    fd_attention_case(2, 70, 2, 1, 8, pos, 160); /* documents, one of length 1 */
    free(pos);
}

typedef struct {
    int N, C, V;
    float gs;
    float *x, *W;
    int32_t *tg;
} fd_head_ctx;
static double fd_head_loss(void *p) {
    fd_head_ctx *c = p;
    return c->gs * mt_ref_head_ce(NULL, NULL, NULL, c->x, c->W, c->tg, c->N, c->C, c->V, 0.0f);
}
static void fd_head(void) {
    int32_t tg[5] = {3, -1, 0, 6, 3};
    fd_head_ctx c = {.N = 5, .C = 6, .V = 7, .gs = 0.25f, .tg = tg};
    size_t nx = (size_t)c.N * c.C, nw = (size_t)c.V * c.C;
    c.x = rnd(nx, 160, -1, 1); c.W = rnd(nw, 161, -1, 1);
    float *dx = falloc(nx), *dW = falloc(nw), *dx2 = falloc(nx), *dW2 = falloc(nw);
    float *scratch = falloc(mt_head_scratch_floats(c.V));
    memset(dW, 0, sizeof(float) * nw); memset(dW2, 0, sizeof(float) * nw);
    mt_ref_head_ce(dx, dW, NULL, c.x, c.W, c.tg, c.N, c.C, c.V, c.gs);
    mt_head_ce(tws(), dx2, dW2, NULL, c.x, c.W, c.tg, c.N, c.C, c.V, c.gs, NULL, scratch);
    snprintf(where, sizeof where, "N=%d C=%d V=%d", c.N, c.C, c.V);
    fd_check(S_FD_HEAD, "dx", c.x, nx, dx, dx2, fd_head_loss, &c, 162, 20, 1e-3);
    fd_check(S_FD_HEAD, "dW", c.W, nw, dW, dW2, fd_head_loss, &c, 163, 20, 1e-3);
    free(c.x); free(c.W); free(dx); free(dW); free(dx2); free(dW2); free(scratch);
}

/* ---- 4. benchmark (MT_BENCH=1) ------------------------------------------------------ */

/* The attention kernel this file's flash kernel replaced (query blocks of 64 rows, a whole
 * score row per block through BLAS, scalar expf), kept only as the benchmark's baseline. */
enum { OLD_BQ = 64 };

static size_t old_attention_scratch_floats(int T) { return 2 * (size_t)OLD_BQ * (size_t)T; }

static void old_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int H, int G, int D, float *scratch, int nthr) {
    MT_ASSERT(H % G == 0);
    const int rep = H / G;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = old_attention_scratch_floats(T);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * H; task++) {
        int b = task / H, h = task % H, g = h / rep;
        float *S = scratch + (size_t)omp_get_thread_num() * per;
        const float *kb = k + ((size_t)b * T * G + g) * D;
        const float *vb = v + ((size_t)b * T * G + g) * D;
        for (int t0 = 0; t0 < T; t0 += OLD_BQ) {
            int nq = T - t0 < OLD_BQ ? T - t0 : OLD_BQ;
            int nk = t0 + nq;
            const float *qt = q + (((size_t)b * T + t0) * H + h) * D;
            mt_sgemm(tws(), 0, 1, nq, nk, D, scale, qt, H * D, kb, G * D, 0.0f, S, nk);
            for (int i = 0; i < nq; i++) {
                float *s = S + (size_t)i * nk;
                int last = t0 + i; /* causal: keys 0..last */
                float m = -INFINITY;
                for (int j = 0; j <= last; j++) m = s[j] > m ? s[j] : m;
                float sum = 0.0f;
                for (int j = 0; j <= last; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
                float inv = 1.0f / sum;
                for (int j = 0; j <= last; j++) s[j] *= inv;
                for (int j = last + 1; j < nk; j++) s[j] = 0.0f;
                lse[((size_t)b * H + h) * T + t0 + i] = m + logf(sum);
            }
            float *ot = out + (((size_t)b * T + t0) * H + h) * D;
            mt_sgemm(tws(), 0, 0, nq, D, nk, 1.0f, S, nk, vb, G * D, 0.0f, ot, H * D);
        }
    }
}

static void old_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             int B, int T, int H, int G, int D, float *scratch, int nthr) {
    MT_ASSERT(H % G == 0);
    const int rep = H / G;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = old_attention_scratch_floats(T);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * G; task++) {
        int b = task / G, g = task % G;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *dP = P + (size_t)OLD_BQ * T;
        const float *kb = k + ((size_t)b * T * G + g) * D;
        const float *vb = v + ((size_t)b * T * G + g) * D;
        float *dkb = dk + ((size_t)b * T * G + g) * D;
        float *dvb = dv + ((size_t)b * T * G + g) * D;
        for (int t = 0; t < T; t++) {
            memset(dkb + (size_t)t * G * D, 0, sizeof(float) * D);
            memset(dvb + (size_t)t * G * D, 0, sizeof(float) * D);
        }
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            for (int t0 = 0; t0 < T; t0 += OLD_BQ) {
                int nq = T - t0 < OLD_BQ ? T - t0 : OLD_BQ;
                int nk = t0 + nq;
                size_t row0 = ((size_t)b * T + t0) * H + h;
                const float *qt = q + row0 * D, *dot = dout + row0 * D, *ot = out + row0 * D;
                const float *l = lse + ((size_t)b * H + h) * T + t0;
                mt_sgemm(tws(), 0, 1, nq, nk, D, scale, qt, H * D, kb, G * D, 0.0f, P, nk);
                for (int i = 0; i < nq; i++) {
                    float *p = P + (size_t)i * nk;
                    int last = t0 + i;
                    for (int j = 0; j <= last; j++) p[j] = expf(p[j] - l[i]);
                    for (int j = last + 1; j < nk; j++) p[j] = 0.0f;
                }
                /* dV += P^T dO */
                mt_sgemm(tws(), 1, 0, nk, D, nq, 1.0f, P, nk, dot, H * D, 1.0f, dvb, G * D);
                /* dP = dO V^T */
                mt_sgemm(tws(), 0, 1, nq, nk, D, 1.0f, dot, H * D, vb, G * D, 0.0f, dP, nk);
                for (int i = 0; i < nq; i++) {
                    const float *o = ot + (size_t)i * H * D, *d = dot + (size_t)i * H * D;
                    float Di = 0.0f;
                    for (int c = 0; c < D; c++) Di += o[c] * d[c];
                    float *p = P + (size_t)i * nk, *dp = dP + (size_t)i * nk;
                    for (int j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - Di) * scale;
                }
                /* dQ = dS K ; dK += dS^T Q */
                mt_sgemm(tws(), 0, 0, nq, D, nk, 1.0f, dP, nk, kb, G * D, 0.0f, dq + row0 * D, H * D);
                mt_sgemm(tws(), 1, 0, nk, D, nq, 1.0f, dP, nk, qt, H * D, 1.0f, dkb, G * D);
            }
        }
    }
}


/* Best-of-reps seconds of one call of the statement. */
#define BENCH_TIME(best, reps, stmt) do { \
    best = 1e30; \
    for (int r_ = 0; r_ < (reps); r_++) { double t_ = mt_now(); stmt; t_ = mt_now() - t_; \
        if (t_ < best) best = t_; } } while (0)

/* Single-thread and nthr-thread SGEMM rates of attention-like shapes, the yardstick for
 * the attention rates: C[4096,4096] = A[4096,64] B[4096,64]^T (all scores of one head at
 * T=4096) and 64-row blocks C[64,64] += A[64,64] B[64,64] swept over 4096 x 4096 (one
 * query block times one key block, as the flash kernel multiplies). */
static void bench_sgemm_ref(int nthr) {
    const int n = 4096, K = 64;
    float *A = rnd((size_t)n * K, 5, -1, 1), *Bm = rnd((size_t)n * K, 6, -1, 1);
    float *C = falloc((size_t)n * n);
    double f = 2.0 * n * n * K, t;
    printf("%-34s %4s %10s %9s\n", "sgemm reference", "thr", "ms", "GFLOP/s");
    for (int th = 0; th < 2; th++) {
        int nt = th ? nthr : 1;
        mt_set_threads(nt);
        BENCH_TIME(t, 5, mt_sgemm(tws(), 0, 1, n, n, K, 1.0f, A, K, Bm, K, 0.0f, C, n));
        printf("%-34s %4d %10.2f %9.1f\n", "sgemm NT 4096x4096 K=64", nt, t * 1e3, f / t * 1e-9);
    }
    mt_set_threads(1);
    BENCH_TIME(t, 5, for (int i0 = 0; i0 < n; i0 += 64) for (int j0 = 0; j0 < n; j0 += 64)
        mt_sgemm(tws(), 0, 0, 64, 64, K, 1.0f, A + (size_t)i0 * K, K, Bm + (size_t)j0 * K, 64, 1.0f,
                 C + (size_t)i0 * n + j0, n));
    printf("%-34s %4d %10.2f %9.1f\n", "sgemm NN 64x64x64 blocks", 1, t * 1e3, f / t * 1e-9);
    BENCH_TIME(t, 5, mt_sgemm(tws(), 0, 0, 1024, 1024, 1024, 1.0f, C, 1024, C + (1 << 20), 1024, 0.0f,
                              C + (2 << 20), 1024));
    printf("%-34s %4d %10.2f %9.1f\n", "sgemm NN 1024x1024x1024", 1, t * 1e3, 2.0 * (1 << 30) / t * 1e-9);
    mt_set_threads(nthr);
    free(A); free(Bm); free(C);
}

/* Flash attention vs the unfused reference (full score matrix, 1 thread, double) and the
 * previous kernel, H=8 G=8 D=64 at B=8 T=512 and B=1 T=4096, causal FLOPs: fwd
 * 2*2*D*H*T(T+1)/2 per sequence, bwd 2.5x that. MT_BENCH=2: the flash kernel only. */
static void bench_attention(void) {
    const int H = 8, G = 8, D = 64, nthr = omp_get_max_threads();
    const int flash_only = atoi(getenv("MT_BENCH")) >= 2;
    static const int Ts[] = {512, 4096}, Bs[] = {8, 1};
    bench_sgemm_ref(nthr);
    printf("attention benchmark: H=%d G=%d D=%d, %d threads (ref: 1 thread)\n", H, G, D, nthr);
    printf("%5s %2s %4s %-6s %4s %10s %9s %12s\n", "T", "B", "pass", "kernel", "thr", "ms", "GFLOP/s",
           "flash speedup");
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++) {
        int T = Ts[a], B = Bs[a];
        size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
        float *q = rnd(nq, 1, -1, 1), *k = rnd(nk, 2, -1, 1), *v = rnd(nk, 3, -1, 1);
        float *dout = rnd(nq, 4, -1, 1), *o = falloc(nq), *l = falloc(nl), *dq = falloc(nq);
        float *dk = falloc(nk), *dv = falloc(nk);
        size_t nsf = mt_attention_scratch_floats(T, D), nso = old_attention_scratch_floats(T);
        float *scratch = falloc((size_t)nthr * (nsf > nso ? nsf : nso));
        double ff = 2.0 * 2.0 * D * H * (double)T * (T + 1) / 2.0 * B, fb = 2.5 * ff;
        int reps = T <= 512 ? 10 : 3;
        double tf[2][3], tb[2][3]; /* [1 thread, nthr][flash, old, ref] */
        for (int th = 0; th < 2; th++) {
            int n = th ? nthr : 1;
            BENCH_TIME(tf[th][0], reps, mt_attention_fwd(o, l, q, k, v, NULL, B, T, H, G, D, scratch, n, 0));
            BENCH_TIME(tb[th][0], reps, mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, NULL, B, T, H, G, D, scratch, n, 0));
            tf[th][1] = tb[th][1] = NAN;
            if (flash_only) continue;
            BENCH_TIME(tf[th][1], reps, old_attention_fwd(o, l, q, k, v, B, T, H, G, D, scratch, n));
            BENCH_TIME(tb[th][1], reps, old_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, B, T, H, G, D, scratch, n));
        }
        tf[0][2] = tb[0][2] = tf[1][2] = tb[1][2] = NAN;
        if (!getenv("MT_BENCH_NOREF") && !flash_only) { /* about a minute at T=4096 */
            BENCH_TIME(tf[0][2], 1, mt_ref_attention_fwd(o, l, q, k, v, NULL, B, T, H, G, D));
            BENCH_TIME(tb[0][2], 1, mt_ref_attention_bwd(dq, dk, dv, dout, q, k, v, NULL, B, T, H, G, D));
        }
        static const char *names[] = {"flash", "old", "ref"};
        for (int pass = 0; pass < 2; pass++)
            for (int th = 0; th < 2; th++)
                for (int kk = 0; kk < 3; kk++) {
                    double t = pass ? tb[th][kk] : tf[th][kk], f = pass ? fb : ff;
                    double flash = pass ? tb[th][0] : tf[th][0];
                    if (isnan(t)) continue;
                    printf("%5d %2d %4s %-6s %4d %10.2f %9.1f %11.2fx\n", T, B, pass ? "bwd" : "fwd",
                           names[kk], th ? nthr : 1, t * 1e3, f / t * 1e-9, t / flash);
                }
        free(q); free(k); free(v); free(dout); free(o); free(l); free(dq); free(dk); free(dv);
        free(scratch);
    }
}

/* mt_attention_row (the decoder's attention over its cache) against mt_attention_fwd_dv: for
 * every query of a row and every head, the same bits as the forward's output, with the keys in
 * the decoder's layout (blocks of 16 positions, transposed); T crossing the 64-key blocks, the
 * 16-key groups and the 8/16-lane tails of Dk and Dv, GQA, peaked scores (rescales). */
static void attention_row_case(int T, int H, int G, int Dk, int Dv, float amp) {
    const int nthr = 2;
    const size_t nq = (size_t)T * H, nk = (size_t)T * G;
    float *q = rnd(nq * Dk, 90 + T, -amp, amp), *k = rnd(nk * Dk, 91 + T, -1, 1), *v = rnd(nk * Dv, 92 + T, -1, 1);
    const int Dm = Dk > Dv ? Dk : Dv;
    float *o = falloc(nq * Dv), *l = falloc((size_t)H * T), *scratch = falloc((size_t)nthr * mt_attention_scratch_floats(T, Dm));
    mt_attention_fwd_dv(o, l, q, k, v, NULL, 1, T, H, G, Dk, Dv, scratch, nthr, 0);
    const size_t ldkb = (size_t)Dk * 16, nb = (size_t)(T + 15) / 16;
    float *kb = falloc(nb * ldkb), *out = falloc((size_t)Dv), *rs = falloc(mt_attention_row_scratch_floats(Dk, Dv));
    long bad = 0;
    for (int g = 0; g < G; g++) {
        fill_nan(kb, nb * ldkb); /* positions past T: read with their block, never used */
        for (int t = 0; t < T; t++)
            for (int c = 0; c < Dk; c++) kb[(size_t)t / 16 * ldkb + (size_t)c * 16 + t % 16] = k[((size_t)t * G + g) * Dk + c];
        for (int h = g * (H / G); h < (g + 1) * (H / G); h++)
            for (int t = 0; t < T; t++) {
                mt_attention_row(out, q + ((size_t)t * H + h) * Dk, kb, ldkb, v + (size_t)g * Dv, (size_t)G * Dv, t + 1,
                                 Dk, Dv, rs);
                bad += memcmp(out, o + ((size_t)t * H + h) * Dv, sizeof(float) * Dv) != 0;
            }
    }
    snprintf(where, sizeof where, "row attention T=%d H=%d G=%d Dk=%d Dv=%d amp %.0f", T, H, G, Dk, Dv, amp);
    if (bad) {
        fprintf(stderr, "CHECK failed: %ld of %zu query rows not the forward's bits [%s]\n", bad, nq, where);
        failures++;
    }
    free(q); free(k); free(v); free(o); free(l); free(scratch); free(kb); free(out); free(rs);
}

static void test_attention_row(void) {
    attention_row_case(1, 2, 1, 64, 64, 1.0f);
    attention_row_case(17, 4, 2, 64, 64, 1.0f);
    attention_row_case(65, 2, 2, 32, 32, 3.0f);
    attention_row_case(130, 4, 1, 48, 32, 1.0f);
    attention_row_case(200, 2, 2, 10, 6, 3.0f);
    attention_row_case(140, 1, 1, 24, 80, 1.0f);
    attention_row_case(70, 2, 1, 128, 128, 1.0f);
    attention_row_case(90, 2, 1, 40, 40, 1.0f); /* Dk, Dv: full vectors, then a partial one */
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv);
    if (getenv("MT_BENCH") && atoi(getenv("MT_BENCH")) > 0) {
        bench_attention();
        return 0;
    }
    double t0 = mt_now();
    test_sgemm();
    test_linear();
    test_rmsnorm();
    test_rmsnorm_bwd_threads();
    test_rope();
    test_swiglu();
    test_attention();
    test_attention_row();
    test_head();
    test_sumsq();
    test_zero();
    test_adamw();
    test_adamw_multi();
    fd_linear();
    fd_rmsnorm();
    fd_rope();
    fd_swiglu();
    fd_attention();
    fd_head();
    return print_stats("test_kernels", stats, S_COUNT, mt_now() - t0, omp_get_max_threads(), mt_blas_corename());
}
