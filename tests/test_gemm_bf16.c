/* tests/test_gemm_bf16.c — the mixed-precision GEMM (kernels/gemm_bf16.c) against a plain
 * reference: operands rounded to bfloat16 by mt_bf16_round, products summed in double. The
 * kernel sums the same bf16 products in fp32, so the error is fp32 summation error,
 * normalised by sum |a*b| (tolerance 1e-6). Cases:
 *   1. the rounding itself: exact values, ties to even, carry into the exponent, inf, NaN;
 *   2. GEMM over odd shapes (1, tile-1, tile+1, K odd, K across the KC block), every
 *      transpose, alpha/beta (beta == 0 must not read C: C starts as NaN there), leading
 *      dimensions larger than the rows, at top level (threads) and inside a parallel region;
 *      beta scaling another matrix than C (mt_gemm_bf16_mixed_cin, mt_linear_fwd_res): the
 *      same bits as copying it to C first;
 *   3. the result does not depend on the threads (1 vs 2: the same bits);
 *   4. mt_sgemm and the grouped expert GEMMs of kernels/moe.c in bf16 mode (experts with 0,
 *      1 and many rows; row tiles grown past the fp32 sizes, weight gradients in several
 *      output tiles, beta and accumulation, a padded expert stride); the LM head with its
 *      packed weight: the same bits as one chunk per call, its logits against the
 *      reference product, loss and gradients within 2e-2 of the fp32 head; the q/k/v
 *      weight gradients with their input packed once: the same bits as one GEMM each (and
 *      the packing ran exactly when the scratch holds it); operands given as bf16
 *      (mt_gemm_bf16_mixed, and the kernels that write and read bf16 activations): the
 *      same bits as from the fp32 values;
 *   5. flash attention in bf16 mode (every product on bf16 pairs, softmax and sums fp32),
 *      forward and backward, against fp32 attention: normalised error within 2e-2 (the
 *      error of bf16 operands), not zero (the bf16 path ran), over lengths that leave odd
 *      rows in the last block, grouped heads and document mode, D up to 128, T beyond one
 *      forward group of query blocks (600, 1100); a head size the pair layout cannot
 *      take (D % 16 != 0) stays fp32 (the same bits); the backward with its diagonal
 *      blocks computed whole gives the same bits as with their masked pairs skipped.
 * Exits 77 (CTest: skipped) on a CPU without AVX512-BF16 or a lower tier forced (MT_CPU_TIER). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kstats.h"
#include "testws.h"

enum { S_ROUND, S_GEMM, S_GEMM_NESTED, S_SGEMM, S_GL_FWD, S_GL_DATA, S_GL_WEIGHT, S_HEAD, S_ATT_FWD, S_ATT_BWD, S_ATT_SUMS, S_COUNT };
static stat stats[S_COUNT] = {
    [S_ROUND] = {"bf16 rounding (exact)", 0, 0, 0},
    [S_GEMM] = {"gemm_bf16", 1e-6, 0, 0},
    [S_GEMM_NESTED] = {"gemm_bf16 in parallel region", 1e-6, 0, 0},
    [S_SGEMM] = {"mt_sgemm in bf16 mode", 1e-6, 0, 0},
    [S_GL_FWD] = {"grouped_linear_fwd bf16", 1e-6, 0, 0},
    [S_GL_DATA] = {"grouped_linear_bwd_data bf16", 1e-6, 0, 0},
    [S_GL_WEIGHT] = {"grouped_linear_bwd_weight bf16", 1e-6, 0, 0},
    [S_HEAD] = {"head_ce bf16 vs fp32", 2e-2, 0, 0},
    [S_ATT_FWD] = {"attention_fwd bf16 vs fp32", 2e-2, 0, 0},
    [S_ATT_SUMS] = {"attention_bwd rows of P sum to 1", 1e-2, 0, 0},
    [S_ATT_BWD] = {"attention_bwd bf16 vs fp32", 2e-2, 0, 0},
};

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_rounding(void) {
    snprintf(where, sizeof where, "rounding");
    struct { uint32_t in, out; } c[] = {
        {0x3f800000u, 0x3f800000u}, /* 1.0 exact */
        {0x3f808000u, 0x3f800000u}, /* halfway, even below: down */
        {0x3f818000u, 0x3f820000u}, /* halfway, odd below: up */
        {0x3f808001u, 0x3f810000u}, /* above halfway: up */
        {0x3f807fffu, 0x3f800000u}, /* below halfway: down */
        {0x3fff8000u, 0x40000000u}, /* carry into the exponent */
        {0x7f7fffffu, 0x7f800000u}, /* largest float rounds to inf */
        {0x7f800000u, 0x7f800000u}, /* inf */
        {0xff800000u, 0xff800000u}, /* -inf */
        {0x80000000u, 0x80000000u}, /* -0 */
        {0x00000001u, 0x00000000u}, /* smallest denormal rounds to 0 */
    };
    double bad = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint32_t got = f_bits(mt_bf16_round(bits_f(c[i].in)));
        if (got != c[i].out) {
            fprintf(stderr, "bf16 round %08x: got %08x want %08x\n", c[i].in, got, c[i].out);
            bad = 1;
        }
    }
    float nan = mt_bf16_round(bits_f(0x7fc00001u)), snan = mt_bf16_round(bits_f(0x7f800001u));
    if (!isnan(nan) || !isnan(snan)) bad = 1; /* a NaN stays a NaN (not inf) */
    RECORD(S_ROUND, "values", bad);
    /* mt_bf16_store, the threaded array form, agrees with it, tails of < 16 values included;
     * fp32 denormals become a signed zero, as in the kernels' conversion (VCVTNEPS2BF16) */
    enum { NS = 16384 * 2 + 37 };
    float *src = mt_alloc(NS * sizeof(float));
    uint16_t *dst = mt_alloc(NS * sizeof(uint16_t) + 64);
    for (size_t i = 0; i < NS; i++) src[i] = bits_f((uint32_t)mt_hash4(31, 0, i, 0) & 0xbfffffffu); /* finite */
    dst[NS] = 0xabcd; /* the value past the end stays */
    mt_bf16_store(dst, src, NS);
    double bad_store = dst[NS] != 0xabcd;
    for (size_t i = 0; i < NS; i++) {
        const uint32_t u = f_bits(src[i]);
        const int denormal = (u & 0x7f800000u) == 0;
        bad_store += dst[i] != (denormal ? (uint16_t)(u >> 16 & 0x8000u) : (uint16_t)(f_bits(mt_bf16_round(src[i])) >> 16));
    }
    RECORD(S_ROUND, "mt_bf16_store", bad_store);
    /* mt_bf16_store_row in place (the LM head rounds its logit gradients so), tail included */
    float *row = mt_alloc(NS * sizeof(float));
    memcpy(row, src, NS * sizeof(float));
    mt_bf16_store_row((uint16_t *)row, row, NS);
    RECORD(S_ROUND, "mt_bf16_store_row in place", memcmp(row, dst, NS * sizeof(uint16_t)) != 0);
    mt_free(row);
    mt_free(src);
    mt_free(dst);
}

static float rnd(uint64_t seed, size_t i) { return mt_u01(mt_hash4(seed, 7, i, 0)) * 2.0f - 1.0f; }

/* max |C - ref| / max sum|a*b| over the matrix */
static double gemm_err(int tA, int tB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, const float *C0, const float *C, int ldc) {
    double maxe = 0, scale = 1e-30;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                double a = mt_bf16_round(tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
                double b = mt_bf16_round(tB ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                s += a * b;
                sa += fabs(a * b);
            }
            double ref = alpha * s + (beta != 0 ? beta * (double)C0[(size_t)i * ldc + j] : 0.0);
            double e = fabs(ref - C[(size_t)i * ldc + j]);
            if (!(e <= maxe)) maxe = e; /* a NaN propagates */
            if (fabs(alpha) * sa + fabs(ref) > scale) scale = fabs(alpha) * sa + fabs(ref);
        }
    return maxe / scale;
}

static void gemm_case(int M, int N, int K, int tA, int tB, int nested, float alpha, float beta) {
    snprintf(where, sizeof where, "M %d N %d K %d tA %d tB %d nested %d alpha %g beta %g", M, N, K, tA, tB,
             nested, alpha, beta);
    int lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 5, ldc = N + 2;
    size_t na = (size_t)lda * (tA ? K : M), nb = (size_t)ldb * (tB ? N : K), nc = (size_t)ldc * M;
    float *A = mt_alloc(na * 4), *B = mt_alloc(nb * 4), *C = mt_alloc(nc * 4), *C0 = mt_alloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = rnd(1, i);
    for (size_t i = 0; i < nb; i++) B[i] = rnd(2, i);
    for (size_t i = 0; i < nc; i++) C0[i] = C[i] = beta == 0 ? NAN : rnd(3, i);
    if (nested) {
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 0) mt_gemm_bf16(tws(), tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        }
    } else {
        mt_gemm_bf16(tws(), tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    RECORD(nested ? S_GEMM_NESTED : S_GEMM, "C", gemm_err(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc));
    /* the padding columns of C are untouched */
    int pad_ok = 1;
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            if (f_bits(C[(size_t)i * ldc + j]) != f_bits(C0[(size_t)i * ldc + j])) pad_ok = 0;
    CHECK(pad_ok);
    mt_free(A);
    mt_free(B);
    mt_free(C);
    mt_free(C0);
}

/* K = 0: C = beta*C, zero without reading it when beta == 0; a bf16 output is zero */
static void test_k0(void) {
    snprintf(where, sizeof where, "K 0");
    float C[6] = {1, 2, 3, 4, 5, 6}; /* 2 x 2 with ldc 3: C[2], C[5] are padding */
    mt_gemm_bf16(tws(), 0, 1, 2, 2, 0, 1.0f, NULL, 1, NULL, 1, 0.5f, C, 3);
    CHECK(C[0] == 0.5f && C[1] == 1.0f && C[2] == 3.0f && C[3] == 2.0f && C[4] == 2.5f && C[5] == 6.0f);
    float Z[4] = {NAN, NAN, NAN, NAN};
    mt_gemm_bf16(tws(), 1, 0, 2, 2, 0, 1.0f, NULL, 1, NULL, 1, 0.0f, Z, 2);
    CHECK(Z[0] == 0 && Z[1] == 0 && Z[2] == 0 && Z[3] == 0);
    /* the bf16 output: zeros, the padding (H[2], H[5]) untouched */
    uint16_t H[6] = {1, 2, 3, 4, 5, 6};
    const float one = 1.0f;
    mt_gemm_bf16_mixed_c16(tws(), 0, 1, 2, 2, 0, 1.0f, &one, NULL, 1, &one, NULL, 1, H, 3);
    CHECK(H[0] == 0 && H[1] == 0 && H[2] == 3 && H[3] == 0 && H[4] == 0 && H[5] == 6);
}

/* C = alpha AB + beta Cin (mt_gemm_bf16_mixed_cin, the residual add in the output pass): the
 * same bits as copying Cin to C and accumulating; Cin is not written, C is written whole
 * (it starts as NaN), also with K across the KC block (later K blocks add to C), columns
 * parts (N > M), 2 threads and K = 0; mt_linear_fwd_res the same in bf16 and fp32 modes */
static void cin_case(int M, int N, int K, int tA, float beta) {
    snprintf(where, sizeof where, "cin M %d N %d K %d tA %d beta %g", M, N, K, tA, beta);
    const int lda = tA ? M : K, ldc = N + 3;
    const size_t na = (size_t)M * K + 1, nc = (size_t)ldc * M;
    float *A = mt_alloc(na * 4), *B = mt_alloc(((size_t)N * K + 1) * 4);
    float *Cin = mt_alloc(nc * 4), *C1 = mt_alloc(nc * 4), *C2 = mt_alloc(nc * 4), *keep = mt_alloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = rnd(41, i);
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = rnd(42, i);
    for (size_t i = 0; i < nc; i++) keep[i] = Cin[i] = C1[i] = rnd(43, i);
    for (size_t i = 0; i < nc; i++) C2[i] = (size_t)(i % ldc) < (size_t)N ? NAN : C1[i];
    mt_gemm_bf16_mixed(tws(), tA, 1, M, N, K, 0.75f, A, NULL, lda, B, NULL, K, beta, C1, ldc);
    mt_gemm_bf16_mixed_cin(tws(), tA, 1, M, N, K, 0.75f, A, NULL, lda, B, NULL, K, beta, Cin, C2, ldc);
    CHECK_SAME_F(C1, C2, nc);
    CHECK_SAME_F(Cin, keep, nc);
    mt_free(A);
    mt_free(B);
    mt_free(Cin);
    mt_free(C1);
    mt_free(C2);
    mt_free(keep);
}

static void test_cin(void) {
    static const int dims[][3] = {{1, 1, 1}, {13, 33, 385}, {200, 70, 800}, {30, 700, 1600}, {5, 7, 0}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int tA = 0; tA < 2; tA++) {
            cin_case(dims[d][0], dims[d][1], dims[d][2], tA, 1.0f);
            cin_case(dims[d][0], dims[d][1], dims[d][2], tA, -0.5f);
        }
    const int N = 300, In = 96, O = 40;
    float *x = mt_alloc((size_t)N * In * 4), *W = mt_alloc((size_t)O * In * 4), *res = mt_alloc((size_t)N * O * 4);
    float *y1 = mt_alloc((size_t)N * O * 4), *y2 = mt_alloc((size_t)N * O * 4);
    for (size_t i = 0; i < (size_t)N * In; i++) x[i] = rnd(44, i);
    for (size_t i = 0; i < (size_t)O * In; i++) W[i] = rnd(45, i);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        snprintf(where, sizeof where, "linear_fwd_res bf16 %d", bf16);
        CHECK(tws_bf16(bf16) == 0);
        for (size_t i = 0; i < (size_t)N * O; i++) res[i] = rnd(46, i);
        memcpy(y1, res, (size_t)N * O * 4);
        mt_linear_fwd(tws(), y1, x, W, N, In, O, 1.0f);
        for (size_t i = 0; i < (size_t)N * O; i++) y2[i] = NAN;
        mt_linear_fwd_res(tws(), y2, res, x, NULL, W, N, In, O);
        CHECK_SAME_F(y1, y2, (size_t)N * O);
        mt_linear_fwd_res(tws(), res, res, x, NULL, W, N, In, O); /* in place: accumulate */
        CHECK_SAME_F(y1, res, (size_t)N * O);
    }
    CHECK(tws_bf16(1) == 0);
    mt_free(x);
    mt_free(W);
    mt_free(res);
    mt_free(y1);
    mt_free(y2);
}

static void test_gemm(void) {
    static const int dims[][3] = {{1, 1, 1},     {1, 33, 2},     {11, 31, 3},  {12, 32, 384}, {13, 33, 385},
                                  {25, 65, 767}, {100, 70, 100}, {37, 97, 1},  {200, 17, 800}, {24, 3100, 40},
                                  {257, 129, 33}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++)
                for (int nested = 0; nested < 2; nested++) {
                    gemm_case(dims[d][0], dims[d][1], dims[d][2], tA, tB, nested, 1.0f, 0.0f);
                    if (d % 3 == 0) gemm_case(dims[d][0], dims[d][1], dims[d][2], tA, tB, nested, -0.5f, 1.0f);
                    if (d % 3 == 1) gemm_case(dims[d][0], dims[d][1], dims[d][2], tA, tB, nested, 2.0f, 0.25f);
                }
}

/* 1 thread and 2 threads give the same bits (C splits over threads by rows or by columns,
 * in parts that may repack B; sums never split) */
static void threads_case(int M, int N, int K, int tA, int tB) {
    snprintf(where, sizeof where, "threads M %d N %d K %d tA %d tB %d", M, N, K, tA, tB);
    float *A = mt_alloc((size_t)M * K * 4), *B = mt_alloc((size_t)K * N * 4);
    float *C1 = mt_alloc((size_t)M * N * 4), *C2 = mt_alloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = rnd(4, i);
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = rnd(5, i);
    int nthr = omp_get_max_threads();
    omp_set_num_threads(1);
    mt_gemm_bf16(tws(), tA, tB, M, N, K, 1.0f, A, tA ? M : K, B, tB ? K : N, 0.0f, C1, N);
    omp_set_num_threads(2);
    mt_gemm_bf16(tws(), tA, tB, M, N, K, 1.0f, A, tA ? M : K, B, tB ? K : N, 0.0f, C2, N);
    omp_set_num_threads(nthr);
    CHECK_SAME_F(C1, C2, (size_t)M * N);
    RECORD(S_GEMM, "C (2 threads)", gemm_err(tA, tB, M, N, K, 1.0f, A, tA ? M : K, B, tB ? K : N, 0.0f, NULL, C2, N));
    mt_free(A);
    mt_free(B);
    mt_free(C1);
    mt_free(C2);
}

static void test_threads(void) {
    threads_case(301, 200, 777, 0, 1);  /* rows, B one block */
    threads_case(700, 100, 1700, 1, 0); /* rows, B in K blocks, one part per thread */
    threads_case(2100, 100, 1700, 1, 0); /* rows, all of B's K blocks kept: parts after a
                                          * thread's first reuse them */
    threads_case(50, 3300, 900, 0, 0);  /* columns, B in N and K blocks */
}

/* B packed once (mt_gemm_bf16_pack) gives the same bits as mt_gemm_bf16 packing it per
 * call: both layouts of A and B, with alpha and beta, on 1 and 2 threads (row parts, column
 * parts) and across the NR panel, KC and NC block edges; packing leaves the words past
 * mt_gemm_bf16_packed_words alone */
static void packed_case(int M, int N, int K, int tA, int tB) {
    snprintf(where, sizeof where, "packed M %d N %d K %d tA %d tB %d", M, N, K, tA, tB);
    float *A = mt_alloc((size_t)M * K * 4), *B = mt_alloc((size_t)K * N * 4);
    float *C1 = mt_alloc((size_t)M * N * 4), *C2 = mt_alloc((size_t)M * N * 4);
    size_t words = mt_gemm_bf16_packed_words(N, K);
    CHECK(words >= (size_t)N * K / 2 && words <= (size_t)(N + 31) * (K + 1) / 2);
    uint32_t *P = mt_alloc((words + 16) * 4);
    for (int i = 0; i < 16; i++) P[words + i] = 0xdeadbeefu;
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = rnd(8, i);
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = rnd(9, i);
    mt_gemm_bf16_pack(P, tB, N, K, B, tB ? K : N);
    for (int i = 0; i < 16; i++) CHECK(P[words + i] == 0xdeadbeefu);
    int nthr = omp_get_max_threads();
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        for (size_t i = 0; i < (size_t)M * N; i++) C1[i] = C2[i] = rnd(10, i);
        mt_gemm_bf16(tws(), tA, tB, M, N, K, 0.5f, A, tA ? M : K, B, tB ? K : N, -1.0f, C1, N);
        mt_gemm_bf16_packed(tws(), tA, M, N, K, 0.5f, A, tA ? M : K, P, -1.0f, C2, N);
        CHECK_SAME_F(C1, C2, (size_t)M * N);
    }
    omp_set_num_threads(nthr);
    mt_free(A);
    mt_free(B);
    mt_free(C1);
    mt_free(C2);
    mt_free(P);
}

static void test_packed(void) {
    static const int dims[][3] = {{1, 1, 1}, {13, 33, 385}, {300, 70, 1700}, {40, 3100, 97}, {256, 3200, 800}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++) packed_case(dims[d][0], dims[d][1], dims[d][2], tA, tB);
}

/* mt_linear_bwd_weight_shared (q, k, v): with its input packed once into the scratch, the
 * same bits as one mt_linear_bwd weight gradient per layer (which packs per product); with
 * a scratch one word too small, or none, the same again (the unpacked path); in bf16 mode
 * the same again from the input given as bf16; in fp32 mode, OpenBLAS's bits. Odd token counts, widths off the panel, an empty layer, 1 and 2 threads. */
static void shared_wgrad_case(int N, int In, const int *O, int n) {
    snprintf(where, sizeof where, "linear_bwd_weight_shared N %d In %d", N, In);
    float *in = mt_alloc((size_t)N * In * 4), *dout[3], *dW1[3], *dW2[3];
    for (size_t i = 0; i < (size_t)N * In; i++) in[i] = rnd(30, i);
    for (int i = 0; i < n; i++) {
        dout[i] = mt_alloc((size_t)N * (O[i] + 1) * 4);
        dW1[i] = mt_alloc((size_t)(O[i] + 1) * In * 4);
        dW2[i] = mt_alloc((size_t)(O[i] + 1) * In * 4);
        for (size_t j = 0; j < (size_t)N * O[i]; j++) dout[i][j] = rnd(31 + i, j);
    }
    uint16_t *in16 = mt_alloc((size_t)N * In * 2 + 64);
    mt_bf16_store(in16, in, (size_t)N * In);
    const size_t words = mt_gemm_bf16_packed_words(In, N);
    /* scratch of exactly the words needed, and one of a word less (which must not be
     * written: ASan sees a write past it), both filled with a sentinel */
    uint32_t *pack = mt_alloc(words * 4), *shortp = mt_xmalloc((words - 1) * 4); /* exact size */
    const int nthr = omp_get_max_threads();
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int t = 1; t <= 2; t++)
            for (int pw = 0; pw < 3; pw++) { /* scratch: enough, one word short, none */
                CHECK(tws_bf16(bf16) == 0);
                omp_set_num_threads(t);
                for (size_t j = 0; j < words; j++) pack[j] = 0xdeadbeefu;
                for (size_t j = 0; j + 1 < words; j++) shortp[j] = 0xdeadbeefu;
                for (int i = 0; i < n; i++)
                    for (size_t j = 0; j < (size_t)O[i] * In; j++) dW1[i][j] = dW2[i][j] = rnd(40 + i, j);
                for (int i = 0; i < n; i++) mt_linear_bwd(tws(), NULL, dW1[i], dout[i], in, NULL, N, In, O[i], 0.0f);
                mt_linear_bwd_weight_shared(tws(), n, dW2, (const float *const *)dout, O, in, NULL, N, In,
                                            pw == 0 ? (void *)pack : pw == 1 ? (void *)shortp : NULL,
                                            pw == 0 ? words : words - 1);
                for (int i = 0; i < n; i++) CHECK_SAME_F(dW1[i], dW2[i], (size_t)O[i] * In);
                if (bf16) { /* the input given as bf16: the same bits */
                    for (int i = 0; i < n; i++)
                        for (size_t j = 0; j < (size_t)O[i] * In; j++) dW2[i][j] = rnd(40 + i, j);
                    mt_linear_bwd_weight_shared(tws(), n, dW2, (const float *const *)dout, O, NULL, in16, N, In,
                                                pw == 0 ? (void *)pack : pw == 1 ? (void *)shortp : NULL,
                                                pw == 0 ? words : words - 1);
                    for (int i = 0; i < n; i++) CHECK_SAME_F(dW1[i], dW2[i], (size_t)O[i] * In);
                }
                /* the packed path ran (bf16, enough scratch) and only then */
                size_t wrote = 0, wrote_short = 0;
                for (size_t j = 0; j < words; j++) wrote += pack[j] != 0xdeadbeefu;
                for (size_t j = 0; j + 1 < words; j++) wrote_short += shortp[j] != 0xdeadbeefu;
                CHECK((wrote > 0) == (bf16 && pw == 0));
                CHECK(wrote_short == 0);
            }
    omp_set_num_threads(nthr);
    CHECK(tws_bf16(1) == 0);
    for (int i = 0; i < n; i++) {
        mt_free(dout[i]);
        mt_free(dW1[i]);
        mt_free(dW2[i]);
    }
    mt_free(in);
    mt_free(in16);
    mt_free(pack);
    free(shortp);
}

static void test_shared_wgrad(void) {
    static const int o1[3] = {64, 32, 32}, o2[3] = {45, 0, 130}, o3[2] = {13, 7};
    shared_wgrad_case(512, 64, o1, 3);
    shared_wgrad_case(777, 70, o2, 3);   /* K across the KC block, odd; In off the panel */
    shared_wgrad_case(1, 33, o3, 2);
}

static double rel_err(const float *x, const float *y, size_t n);

/* x as the bf16 bits the kernels round it to (mt_bf16_store), in a new buffer */
static uint16_t *to16(const float *x, size_t n) {
    uint16_t *h = mt_alloc(n * sizeof(uint16_t) + 64);
    mt_bf16_store(h, x, n);
    return h;
}

/* mt_gemm_bf16_mixed: A, B or both given as bf16 give the same bits as mt_gemm_bf16 on the
 * fp32 values, for every transpose, odd shapes and leading dimensions (odd: rows start off
 * 4-byte alignment), K across the KC block and odd, with denormals (which both flush), on
 * 1 and 2 threads */
static void mixed_case(int M, int N, int K, int tA, int tB) {
    snprintf(where, sizeof where, "mixed M %d N %d K %d tA %d tB %d", M, N, K, tA, tB);
    int lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 1, ldc = N;
    size_t na = (size_t)lda * (tA ? K : M), nb = (size_t)ldb * (tB ? N : K), nc = (size_t)ldc * M;
    float *A = mt_alloc(na * 4), *B = mt_alloc(nb * 4), *C1 = mt_alloc(nc * 4), *C2 = mt_alloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = i % 97 == 5 ? 1e-39f : rnd(50, i);
    for (size_t i = 0; i < nb; i++) B[i] = i % 89 == 7 ? -2e-39f : rnd(51, i);
    uint16_t *A16 = to16(A, na), *B16 = to16(B, nb);
    const int nthr = omp_get_max_threads();
    for (int t = 1; t <= 2; t++)
        for (int which = 1; which <= 3; which++) { /* A16, B16, both */
            omp_set_num_threads(t);
            for (size_t i = 0; i < nc; i++) C1[i] = C2[i] = rnd(52, i);
            mt_gemm_bf16(tws(), tA, tB, M, N, K, 0.5f, A, lda, B, ldb, -1.0f, C1, ldc);
            mt_gemm_bf16_mixed(tws(), tA, tB, M, N, K, 0.5f, which & 1 ? NULL : A, which & 1 ? A16 : NULL, lda,
                               which & 2 ? NULL : B, which & 2 ? B16 : NULL, ldb, -1.0f, C2, ldc);
            CHECK_SAME_F(C1, C2, nc);
            /* the output as bf16 (mt_gemm_bf16_mixed_c16): the bits of the fp32 output rounded,
             * with K past one block through its fp32 rows; at top level and in a parallel
             * region; the padding past N untouched */
            const int ld16 = N + 3;
            uint16_t *C16 = mt_alloc((size_t)ld16 * M * 2 + 64);
            mt_gemm_bf16(tws(), tA, tB, M, N, K, 0.5f, A, lda, B, ldb, 0.0f, C1, ldc);
            uint16_t *ref = to16(C1, nc);
            const float *a = which & 1 ? NULL : A, *b = which & 2 ? NULL : B;
            const uint16_t *a16 = which & 1 ? A16 : NULL, *b16 = which & 2 ? B16 : NULL;
            for (int nested = 0; nested < 2; nested++) {
                for (size_t i = 0; i < (size_t)ld16 * M; i++) C16[i] = 0xabcd;
                if (nested) {
#pragma omp parallel num_threads(2)
                    if (omp_get_thread_num() == 1) mt_gemm_bf16_mixed_c16(tws(), tA, tB, M, N, K, 0.5f, a, a16, lda, b, b16, ldb, C16, ld16);
                } else {
                    mt_gemm_bf16_mixed_c16(tws(), tA, tB, M, N, K, 0.5f, a, a16, lda, b, b16, ldb, C16, ld16);
                }
                int same = 1;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ld16; j++)
                        same &= C16[(size_t)i * ld16 + j] == (j < N ? ref[(size_t)i * ldc + j] : 0xabcd);
                CHECK(same);
            }
            mt_free(ref);
            mt_free(C16);
        }
    omp_set_num_threads(nthr);
    mt_free(A); mt_free(B); mt_free(C1); mt_free(C2); mt_free(A16); mt_free(B16);
}

/* The kernels that write bf16 activations and gradients (train --bf16: the routed experts'
 * rows, the SwiGLU outputs and gate|up gradients) write the bits mt_bf16_store writes of
 * their fp32 results, and the products that read them give the fp32 inputs' bits: the
 * gather (from fp32 or bf16 rows), RMSNorm, SwiGLU forward (and the routed backward's
 * recomputed, weighted row with its dot product) and backward, RoPE into bf16, the grouped forward, data and
 * weight gradients, the linear forward and backward; the forward products writing bf16
 * (the FFNs' gate|up) and the SwiGLU kernels reading it. */
static void test_bf16_inputs(void) {
    static const int dims[][3] = {{1, 1, 1}, {13, 33, 385}, {300, 70, 1700}, {40, 3100, 97}, {129, 64, 768}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++) mixed_case(dims[d][0], dims[d][1], dims[d][2], tA, tB);
    CHECK(tws_bf16(1) == 0);
    snprintf(where, sizeof where, "bf16 activations");
    const int N = 300, C = 48, F = 37, R = 500, E = 5;
    static const int32_t off[6] = {0, 0, 1, 260, 261, 500};
    float *x = mt_alloc((size_t)N * C * 4), *gu = mt_alloc((size_t)R * 2 * F * 4), *da = mt_alloc((size_t)R * F * 4);
    int32_t *tok = mt_xmalloc(sizeof(int32_t) * R);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = rnd(53, i) * 3.0f;
    for (size_t i = 0; i < (size_t)R * 2 * F; i++) gu[i] = rnd(54, i) * 4.0f;
    for (size_t i = 0; i < (size_t)R * F; i++) da[i] = rnd(55, i);
    for (int r = 0; r < R; r++) tok[r] = (int32_t)((r * 7919) % N);
    /* gather */
    float *xe = mt_alloc((size_t)R * C * 4);
    uint16_t *xe16 = mt_alloc((size_t)R * C * 2 + 64);
    mt_moe_gather(xe, x, tok, R, C);
    mt_moe_gather_x(NULL, xe16, x, NULL, tok, R, C);
    uint16_t *ref16 = to16(xe, (size_t)R * C);
    CHECK(memcmp(xe16, ref16, (size_t)R * C * 2) == 0);
    uint16_t *x16 = to16(x, (size_t)N * C); /* the gather from rows already bf16 */
    memset(xe16, 0, (size_t)R * C * 2);
    mt_moe_gather_x(NULL, xe16, NULL, x16, tok, R, C);
    CHECK(memcmp(xe16, ref16, (size_t)R * C * 2) == 0);
    mt_free(ref16);
    mt_free(x16);
    /* RMSNorm into bf16: the bits of the fp32 output rounded, the same 1/rms */
    {
        float *nw = mt_alloc((size_t)C * 4), *o = mt_alloc((size_t)N * C * 4), *r1 = mt_alloc((size_t)N * 4);
        float *r2 = mt_alloc((size_t)N * 4);
        uint16_t *o16 = mt_alloc((size_t)N * C * 2 + 64);
        for (int j = 0; j < C; j++) nw[j] = 0.5f + rnd(60, (size_t)j);
        mt_rmsnorm_fwd(o, r1, x, nw, N, C, 1e-6f);
        mt_rmsnorm_fwd16(tws(), o16, r2, x, nw, N, C, 1e-6f);
        CHECK_SAME_F(r1, r2, (size_t)N);
        ref16 = to16(o, (size_t)N * C);
        CHECK(memcmp(o16, ref16, (size_t)N * C * 2) == 0);
        mt_free(ref16); mt_free(nw); mt_free(o); mt_free(r1); mt_free(r2); mt_free(o16);
    }
    /* RoPE rotated and rounded in one pass (K in train --bf16): the bits of the in-place
     * rotation rounded, positions restarting (document mode) and n % T, x untouched */
    {
        const int T = 7, nh = 3, D = 18, W = nh * D;
        float *ct = mt_alloc((size_t)T * D / 2 * 4), *st = mt_alloc((size_t)T * D / 2 * 4);
        float *k = mt_alloc((size_t)N * W * 4), *k0 = mt_alloc((size_t)N * W * 4);
        uint16_t *k16 = mt_alloc((size_t)N * W * 2 + 64);
        int32_t *pos = mt_xmalloc(sizeof(int32_t) * N);
        mt_rope_table(ct, st, T, D, 10000.0);
        for (int n = 0; n < N; n++) pos[n] = (n * 5) % 11 % T;
        for (size_t i = 0; i < (size_t)N * W; i++) k[i] = k0[i] = rnd(61, i) * 2.0f;
        for (int withpos = 0; withpos < 2; withpos++) {
            mt_rope_store16(tws(), k16, k, ct, st, withpos ? pos : NULL, N, T, nh, D, 0);
            CHECK_SAME_F(k, k0, (size_t)N * W);
            float *kr = mt_alloc((size_t)N * W * 4);
            memcpy(kr, k, (size_t)N * W * 4);
            mt_rope_apply_pos(kr, ct, st, withpos ? pos : NULL, N, T, nh, D, 0);
            ref16 = to16(kr, (size_t)N * W);
            CHECK(memcmp(k16, ref16, (size_t)N * W * 2) == 0);
            mt_free(ref16);
            mt_free(kr);
        }
        mt_free(ct); mt_free(st); mt_free(k); mt_free(k0); mt_free(k16); free(pos);
    }
    /* SwiGLU rows, and the weighted row of the backward */
    float *act = mt_alloc((size_t)R * F * 4), *actw = mt_alloc((size_t)R * F * 4);
    uint16_t *act16 = mt_alloc((size_t)R * F * 2 + 64), *actw16 = mt_alloc((size_t)R * F * 2 + 64);
    mt_swiglu_rows_fwd(act, gu, R, F);
    mt_swiglu_rows_fwd_x(tws(), NULL, act16, gu, NULL, R, F);
    ref16 = to16(act, (size_t)R * F);
    CHECK(memcmp(act16, ref16, (size_t)R * F * 2) == 0);
    mt_free(ref16);
    int same_dot = 1;
    for (int r = 0; r < R; r++) {
        float w = 0.25f + (float)r / R;
        float d1 = mt_swiglu_row_wgrad(actw + (size_t)r * F, gu + (size_t)r * 2 * F, da + (size_t)r * F, w, F);
        float d2 = mt_swiglu_row_wgrad_x(tws(), NULL, actw16 + (size_t)r * F, gu + (size_t)r * 2 * F, NULL, da + (size_t)r * F,
                                         w, F);
        same_dot &= f_bits(d1) == f_bits(d2);
    }
    CHECK(same_dot);
    ref16 = to16(actw, (size_t)R * F);
    CHECK(memcmp(actw16, ref16, (size_t)R * F * 2) == 0);
    mt_free(ref16);
    /* the backward's dg|du */
    float *dgu = mt_alloc((size_t)R * 2 * F * 4), *ws = mt_alloc((size_t)R * 4);
    uint16_t *dgu16 = mt_alloc((size_t)R * 2 * F * 2 + 64);
    for (int r = 0; r < R; r++) ws[r] = 0.5f + (float)(r % 13) / 7.0f;
    mt_swiglu_rows_bwd(dgu, da, gu, ws, R, F);
    mt_swiglu_rows_bwd_x(tws(), NULL, dgu16, da, gu, NULL, ws, R, F);
    ref16 = to16(dgu, (size_t)R * 2 * F);
    CHECK(memcmp(dgu16, ref16, (size_t)R * 2 * F * 2) == 0);
    mt_free(ref16);
    /* gate|up given as bf16 (train --bf16 keeps it so): every SwiGLU kernel gives the fp32
     * kernel's bits on the values it holds, into fp32 or bf16 outputs */
    {
        uint16_t *gu16 = to16(gu, (size_t)R * 2 * F);
        float *gur = mt_alloc((size_t)R * 2 * F * 4), *o1 = mt_alloc((size_t)R * 2 * F * 4);
        float *o2 = mt_alloc((size_t)R * 2 * F * 4);
        uint16_t *h1 = mt_alloc((size_t)R * 2 * F * 2 + 64), *h2 = mt_alloc((size_t)R * 2 * F * 2 + 64);
        mt_bf16_load_row(gur, gu16, (size_t)R * 2 * F);
        int widened = 1;
        for (size_t i = 0; i < (size_t)R * 2 * F; i++) widened &= f_bits(gur[i]) == (uint32_t)gu16[i] << 16;
        CHECK(widened);
        mt_swiglu_rows_fwd(o1, gur, R, F);
        mt_swiglu_rows_fwd_x(tws(), o2, NULL, NULL, gu16, R, F);
        CHECK_SAME_F(o1, o2, (size_t)R * F);
        mt_swiglu_rows_fwd_x(tws(), NULL, h2, NULL, gu16, R, F);
        mt_bf16_store(h1, o1, (size_t)R * F);
        CHECK(memcmp(h1, h2, (size_t)R * F * 2) == 0);
        int same = 1;
        for (int r = 0; r < R; r++) {
            const float w = 0.25f + (float)r / R;
            const size_t g = (size_t)r * 2 * F, a = (size_t)r * F;
            float d1 = mt_swiglu_row_wgrad(o1 + a, gur + g, da + a, w, F);
            float d2 = mt_swiglu_row_wgrad_x(tws(), o2 + a, NULL, NULL, gu16 + g, da + a, w, F);
            float d3 = mt_swiglu_row_wgrad_x(tws(), NULL, h2 + a, NULL, gu16 + g, da + a, w, F);
            same &= f_bits(d1) == f_bits(d2) && f_bits(d1) == f_bits(d3);
        }
        CHECK(same);
        CHECK_SAME_F(o1, o2, (size_t)R * F);
        mt_bf16_store(h1, o1, (size_t)R * F);
        CHECK(memcmp(h1, h2, (size_t)R * F * 2) == 0);
        mt_swiglu_rows_bwd(o1, da, gur, ws, R, F);
        mt_swiglu_rows_bwd_x(tws(), o2, NULL, da, NULL, gu16, ws, R, F);
        CHECK_SAME_F(o1, o2, (size_t)R * 2 * F);
        mt_swiglu_rows_bwd_x(tws(), NULL, h2, da, NULL, gu16, NULL, R, F);
        mt_swiglu_rows_bwd(o1, da, gur, NULL, R, F);
        mt_bf16_store(h1, o1, (size_t)R * 2 * F);
        CHECK(memcmp(h1, h2, (size_t)R * 2 * F * 2) == 0);
        mt_free(gu16); mt_free(gur); mt_free(o1); mt_free(o2); mt_free(h1); mt_free(h2);
    }
    /* grouped forward (in = xe, In = C), data gradient (dout = dgu, O = 2F, In = C) and
     * weight gradient (dout = dgu, in = xe; and in = act, In = F, dout = y), then the linear
     * forward and backward, from fp32 and from bf16 */
    const int O = 2 * F;
    float *W = mt_alloc((size_t)E * O * C * 4), *y1 = mt_alloc((size_t)R * O * 4), *y2 = mt_alloc((size_t)R * O * 4);
    float *dW1 = mt_alloc((size_t)E * O * C * 4), *dW2 = mt_alloc((size_t)E * O * C * 4);
    float *dx1 = mt_alloc((size_t)R * C * 4), *dx2 = mt_alloc((size_t)R * C * 4);
    for (size_t i = 0; i < (size_t)E * O * C; i++) { W[i] = rnd(56, i); dW1[i] = dW2[i] = rnd(59, i); }
    for (size_t i = 0; i < (size_t)R * O; i++) y1[i] = y2[i] = rnd(58, i);
    for (size_t i = 0; i < (size_t)R * C; i++) dx1[i] = dx2[i] = rnd(57, i);
    mt_grouped_linear_fwd(tws(), y1, xe, W, (size_t)O * C, off, E, C, O, 0.5f);
    mt_grouped_linear_fwd_x(tws(), y2, NULL, NULL, xe16, W, (size_t)O * C, off, E, C, O, 0.5f);
    CHECK_SAME_F(y1, y2, (size_t)R * O);
    { /* the forward's output as bf16: the fp32 output's bits rounded */
        uint16_t *y16 = mt_alloc((size_t)R * O * 2 + 64);
        mt_grouped_linear_fwd(tws(), y1, xe, W, (size_t)O * C, off, E, C, O, 0.0f);
        mt_grouped_linear_fwd_x(tws(), NULL, y16, NULL, xe16, W, (size_t)O * C, off, E, C, O, 0.0f);
        ref16 = to16(y1, (size_t)R * O);
        CHECK(memcmp(y16, ref16, (size_t)R * O * 2) == 0);
        mt_free(ref16);
        mt_linear_fwd(tws(), y1, x, W, N, C, O, 0.0f);
        mt_linear_fwd_x(tws(), NULL, y16, x, NULL, W, N, C, O, 0.0f);
        ref16 = to16(y1, (size_t)N * O);
        CHECK(memcmp(y16, ref16, (size_t)N * O * 2) == 0);
        mt_free(ref16);
        mt_free(y16);
        memcpy(y1, y2, (size_t)R * O * 4); /* equal again for the products below */
    }
    mt_grouped_linear_bwd_data(tws(), dx1, dgu, W, (size_t)O * C, off, E, C, O, -1.0f);
    mt_grouped_linear_bwd_data_x(tws(), dx2, NULL, dgu16, W, (size_t)O * C, off, E, C, O, -1.0f);
    CHECK_SAME_F(dx1, dx2, (size_t)R * C);
    mt_grouped_linear_bwd_weight(tws(), dW1, (size_t)O * C, dgu, xe, off, E, C, O);
    mt_grouped_linear_bwd_weight_x(tws(), dW2, (size_t)O * C, NULL, dgu16, NULL, xe16, off, E, C, O);
    CHECK_SAME_F(dW1, dW2, (size_t)E * O * C);
    mt_grouped_linear_bwd_weight(tws(), dW1, (size_t)C * F, dx1, act, off, E, F, C); /* dout fp32, in bf16 */
    mt_grouped_linear_bwd_weight_x(tws(), dW2, (size_t)C * F, dx1, NULL, NULL, act16, off, E, F, C);
    CHECK_SAME_F(dW1, dW2, (size_t)E * C * F);
    mt_linear_fwd(tws(), y1, act, W, R, F, C, 1.0f);
    mt_linear_fwd_x(tws(), y2, NULL, NULL, act16, W, R, F, C, 1.0f);
    CHECK_SAME_F(y1, y2, (size_t)R * C);
    mt_linear_bwd(tws(), dx1, dW1, dgu, xe, W, R, C, O, 0.0f); /* dgu bf16 as A of both products */
    mt_linear_bwd_x(tws(), dx2, dW2, NULL, dgu16, xe, NULL, W, R, C, O, 0.0f);
    CHECK_SAME_F(dx1, dx2, (size_t)R * C);
    CHECK_SAME_F(dW1, dW2, (size_t)O * C);
    mt_free(dgu); mt_free(ws); mt_free(dgu16); mt_free(dx1); mt_free(dx2);
    mt_free(x); mt_free(gu); mt_free(da); free(tok); mt_free(xe); mt_free(xe16); mt_free(act); mt_free(actw);
    mt_free(act16); mt_free(actw16); mt_free(W); mt_free(y1); mt_free(y2); mt_free(dW1); mt_free(dW2);
}

/* The LM head in bf16 mode over several row chunks packs its weight once per call
 * (mt_gemm_bf16_packed): the same dx and dW bits as calls of one chunk each (which pack
 * per product), and the same loss up to the order of its double sum */
static void test_head_packed(void) {
    const int N = 2 * MT_HEAD_ROWS + 88, C = 40, V = 333; /* 3 chunks, V and C off the panel widths */
    snprintf(where, sizeof where, "head_ce bf16 N %d C %d V %d", N, C, V);
    float *x = mt_alloc((size_t)N * C * 4), *W = mt_alloc((size_t)V * C * 4);
    float *dx1 = mt_alloc((size_t)N * C * 4), *dx2 = mt_alloc((size_t)N * C * 4);
    float *dW1 = mt_alloc((size_t)V * C * 4), *dW2 = mt_alloc((size_t)V * C * 4);
    float *scratch = mt_alloc(mt_head_scratch_floats(V) * 4);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * N);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = rnd(15, i);
    for (size_t i = 0; i < (size_t)V * C; i++) { W[i] = rnd(16, i); dW1[i] = dW2[i] = 0.0f; }
    for (int i = 0; i < N; i++) tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 37) % V);
    CHECK(tws_bf16(1) == 0);
    double l1 = mt_head_ce(tws(), dx1, dW1, NULL, x, W, tg, N, C, V, 1.0f / N, NULL, scratch), l2 = 0;
    for (int n0 = 0; n0 < N; n0 += MT_HEAD_ROWS) {
        int nr = N - n0 < MT_HEAD_ROWS ? N - n0 : MT_HEAD_ROWS;
        l2 += mt_head_ce(tws(), dx2 + (size_t)n0 * C, dW2, NULL, x + (size_t)n0 * C, W, tg + n0, nr, C, V, 1.0f / N, NULL, scratch);
    }
    double l3 = mt_head_ce(tws(), NULL, NULL, NULL, x, W, tg, N, C, V, 1.0f / N, NULL, scratch); /* loss only */
    /* evaluation: the logits of all rows through the packed weight, against the bf16-rounded
     * reference product */
    float *lg = mt_alloc((size_t)N * V * 4);
    double l4 = mt_head_ce(tws(), NULL, NULL, lg, x, W, tg, N, C, V, 1.0f / N, NULL, scratch);
    tws_bf16(0);
    CHECK(fabs(l1 - l2) <= 1e-9 * fabs(l2) && l1 == l3 && l1 == l4);
    CHECK_SAME_F(dx1, dx2, (size_t)N * C);
    CHECK_SAME_F(dW1, dW2, (size_t)V * C);
    RECORD(S_SGEMM, "head logits", gemm_err(0, 1, N, V, C, 1.0f, x, C, W, C, 0.0f, NULL, lg, V));
    /* against the fp32 head: the loss and gradients of bf16 products within bf16's precision */
    float *dx3 = mt_alloc((size_t)N * C * 4), *dW3 = mt_alloc((size_t)V * C * 4);
    memset(dW3, 0, (size_t)V * C * 4);
    double l5 = mt_head_ce(tws(), dx3, dW3, NULL, x, W, tg, N, C, V, 1.0f / N, NULL, scratch);
    RECORD(S_HEAD, "loss", fabs(l1 - l5) / fabs(l5));
    double ex = rel_err(dx1, dx3, (size_t)N * C), ew = rel_err(dW1, dW3, (size_t)V * C);
    RECORD(S_HEAD, "dx,dW", ex > ew ? ex : ew);
    CHECK(memcmp(dx1, dx3, (size_t)N * C * 4) != 0); /* bf16 products did run */
    mt_free(x); mt_free(W); mt_free(dx1); mt_free(dx2); mt_free(dW1); mt_free(dW2); mt_free(scratch);
    mt_free(lg); mt_free(dx3); mt_free(dW3);
    free(tg);
}

/* The grouped expert GEMMs (moe.c) in bf16 mode on experts off[0..E] of rows, In -> O, the
 * expert stride padded by pad floats: every expert's forward, data and weight gradient
 * against the bf16-rounded reference; y and dx get beta * their old values, dW its old
 * values (the weight gradient accumulates); an expert without rows keeps its dW. */
static void grouped_case(int E, const int32_t *off, int In, int O, int pad, float beta) {
    CHECK(tws_bf16(1) == 0 && t_ws.bf16);
    const int R = off[E];
    const size_t ws = (size_t)O * In + (size_t)pad, ny = (size_t)R * O, nx = (size_t)R * In;
    float *x = mt_alloc(nx * 4), *W = mt_alloc(ws * E * 4), *y = mt_alloc(ny * 4), *y0 = mt_alloc(ny * 4);
    float *dy = mt_alloc(ny * 4), *dx = mt_alloc(nx * 4), *dx0 = mt_alloc(nx * 4);
    float *dW = mt_alloc(ws * E * 4), *dW0 = mt_alloc(ws * E * 4);
    for (size_t i = 0; i < nx; i++) { x[i] = rnd(8, i); dx0[i] = dx[i] = beta != 0 ? rnd(17, i) : NAN; }
    for (size_t i = 0; i < ws * E; i++) { W[i] = rnd(9, i); dW0[i] = dW[i] = beta != 0 ? rnd(18, i) : 0.0f; }
    for (size_t i = 0; i < ny; i++) { dy[i] = rnd(10, i); y0[i] = y[i] = beta != 0 ? rnd(19, i) : NAN; }
    mt_grouped_linear_fwd(tws(), y, x, W, ws, off, E, In, O, beta);
    mt_grouped_linear_bwd_data(tws(), dx, dy, W, ws, off, E, In, O, beta);
    mt_grouped_linear_bwd_weight(tws(), dW, ws, dy, x, off, E, In, O);
    double ef = 0, ed = 0, ew = 0;
    int untouched = 1; /* experts without rows, and the stride's padding, keep dW */
    for (int e = 0; e < E; e++) {
        int r0 = off[e], n = off[e + 1] - off[e];
        snprintf(where, sizeof where, "grouped E %d O %d expert %d rows %d beta %g", E, O, e, n, beta);
        for (size_t i = (size_t)O * In; i < ws; i++) untouched &= dW[e * ws + i] == dW0[e * ws + i];
        if (n == 0) {
            untouched &= memcmp(dW + e * ws, dW0 + e * ws, ws * 4) == 0;
            continue;
        }
        double a = gemm_err(0, 1, n, O, In, 1.0f, x + (size_t)r0 * In, In, W + e * ws, In, beta,
                            y0 + (size_t)r0 * O, y + (size_t)r0 * O, O);
        double b = gemm_err(0, 0, n, In, O, 1.0f, dy + (size_t)r0 * O, O, W + e * ws, In, beta,
                            dx0 + (size_t)r0 * In, dx + (size_t)r0 * In, In);
        double c = gemm_err(1, 0, O, In, n, 1.0f, dy + (size_t)r0 * O, O, x + (size_t)r0 * In, In, 1.0f,
                            dW0 + e * ws, dW + e * ws, In);
        ef = a > ef ? a : ef;
        ed = b > ed ? b : ed;
        ew = c > ew ? c : ew;
    }
    CHECK(untouched);
    RECORD(S_GL_FWD, "y", ef);
    RECORD(S_GL_DATA, "dx", ed);
    RECORD(S_GL_WEIGHT, "dW", ew);
    CHECK(tws_bf16(0) == 0 && !t_ws.bf16);
    mt_free(x); mt_free(W); mt_free(y); mt_free(y0); mt_free(dy); mt_free(dx); mt_free(dx0);
    mt_free(dW); mt_free(dW0);
}

/* mt_sgemm dispatches to the kernel in bf16 mode; the grouped expert GEMMs (moe.c) follow */
static void test_dispatch_and_grouped(void) {
    CHECK(tws_bf16(1) == 0 && t_ws.bf16);
    {
        const int M = 70, N = 90, K = 130;
        snprintf(where, sizeof where, "mt_sgemm M %d N %d K %d", M, N, K);
        float *A = mt_alloc((size_t)M * K * 4), *B = mt_alloc((size_t)N * K * 4), *C = mt_alloc((size_t)M * N * 4);
        for (size_t i = 0; i < (size_t)M * K; i++) A[i] = rnd(6, i);
        for (size_t i = 0; i < (size_t)N * K; i++) B[i] = rnd(7, i);
        mt_sgemm(tws(), 0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        RECORD(S_SGEMM, "C", gemm_err(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, NULL, C, N));
        mt_free(A);
        mt_free(B);
        mt_free(C);
    }
    CHECK(tws_bf16(0) == 0 && !t_ws.bf16);
    /* experts with 0, 1, 600 and 37 rows; In 48, O 40 */
    static const int32_t off4[5] = {0, 0, 1, 601, 638};
    grouped_case(4, off4, 48, 40, 0, 0.0f);
    /* 3000 rows over 16 experts (two empty, one of 1 row): more rows than 4 tiles of 256 per
     * thread, so the bf16 row tiles grow past the fp32 sizes (to 384: the 400-row experts
     * take two); a padded expert stride; beta 0.5 and dW accumulated onto values */
    static const int32_t off16[17] = {0, 0, 1, 400, 400, 655, 900, 1100, 1400, 1401, 1700, 1900, 2100, 2400,
                                      2600, 2800, 3000};
    grouped_case(16, off16, 48, 100, 7, 0.5f);
    /* few experts, O 200: the weight gradient in output tiles of 80 rows (80, 80, 40) */
    static const int32_t off3[4] = {0, 500, 501, 900};
    grouped_case(3, off3, 40, 200, 3, 1.0f);
}

/* max |x - y| / max |y| */
static double rel_err(const float *x, const float *y, size_t n) {
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= e)) e = d;
        if (fabs(y[i]) > m) m = fabs(y[i]);
    }
    return e / m;
}

static void attention_case(int B, int T, int H, int G, int D, int doc) {
    snprintf(where, sizeof where, "attention B %d T %d H %d G %d D %d doc %d", B, T, H, G, D, doc);
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D;
    float *q = mt_alloc(nq * 4), *k = mt_alloc(nk * 4), *v = mt_alloc(nk * 4), *dout = mt_alloc(nq * 4);
    float *out = mt_alloc(nq * 4), *lse = mt_alloc((size_t)B * H * T * 4);
    float *out16 = mt_alloc(nq * 4), *lse16 = mt_alloc((size_t)B * H * T * 4);
    float *g32[3], *g16[3];
    size_t n3[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        g32[i] = mt_alloc(n3[i] * 4);
        g16[i] = mt_alloc(n3[i] * 4);
    }
    for (size_t i = 0; i < nq; i++) { q[i] = rnd(11, i); dout[i] = rnd(12, i); }
    for (size_t i = 0; i < nk; i++) { k[i] = rnd(13, i); v[i] = rnd(14, i); }
    int32_t *pos = NULL;
    if (doc) { /* documents of 37 tokens */
        pos = mt_xmalloc(sizeof(int32_t) * B * T);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) pos[(size_t)b * T + t] = t % 37;
    }
    const int nthr = 2;
    float *scratch = mt_alloc(mt_attention_scratch_floats(T, D) * nthr * 4);
    mt_attention_fwd(out, lse, q, k, v, pos, B, T, H, G, D, scratch, nthr, t_ws.bf16);
    mt_attention_bwd(g32[0], g32[1], g32[2], dout, q, k, v, out, lse, pos, B, T, H, G, D, scratch, nthr, t_ws.bf16);
    CHECK(tws_bf16(1) == 0);
    mt_attention_fwd(out16, lse16, q, k, v, pos, B, T, H, G, D, scratch, nthr, t_ws.bf16);
    mt_attention_bwd(g16[0], g16[1], g16[2], dout, q, k, v, out16, lse16, pos, B, T, H, G, D, scratch, nthr, t_ws.bf16);
    CHECK(mt_attention_bf16(t_ws.bf16, D) == (D % 16 == 0 && mt_attention_bf16_built()));
    if (mt_attention_bf16(t_ws.bf16, D)) {
        /* K and V kept as bf16 (train --bf16's layout): the same bits as from fp32 K and V */
        uint16_t *k16 = mt_alloc(nk * 2), *v16 = mt_alloc(nk * 2);
        float *o2 = mt_alloc(nq * 4), *l2 = mt_alloc((size_t)B * H * T * 4), *g2[3];
        for (int i = 0; i < 3; i++) g2[i] = mt_alloc(n3[i] * 4);
        mt_bf16_store(k16, k, nk);
        mt_bf16_store(v16, v, nk);
        int same = 1; /* the rounding the products apply (test_rounding) */
        for (size_t i = 0; i < nk; i++) same &= k16[i] == (uint16_t)(f_bits(mt_bf16_round(k[i])) >> 16);
        CHECK(same);
        /* scratch and outputs poisoned: the kv16 path must write all it reads */
        const size_t nscr = mt_attention_scratch_floats(T, D) * nthr;
        for (size_t i = 0; i < nscr; i++) scratch[i] = NAN;
        for (size_t i = 0; i < nq; i++) o2[i] = NAN;
        for (int i = 0; i < 3; i++)
            for (size_t j = 0; j < n3[i]; j++) g2[i][j] = NAN;
        mt_attention_fwd_kv16(o2, l2, q, k16, v16, pos, B, T, H, G, D, scratch, nthr);
        for (size_t i = 0; i < nscr; i++) scratch[i] = NAN;
        mt_attention_bwd_kv16(g2[0], g2[1], g2[2], dout, q, k16, v16, o2, l2, pos, B, T, H, G, D, scratch, nthr);
        CHECK_SAME_F(o2, out16, nq);
        CHECK_SAME_F(l2, lse16, (size_t)B * H * T);
        for (int i = 0; i < 3; i++) CHECK_SAME_F(g2[i], g16[i], n3[i]);
        /* diagonal blocks computed whole: the same bits as with the masked pairs skipped */
        mt_attention_set_diag_skip(0);
        for (int i = 0; i < 3; i++)
            for (size_t j = 0; j < n3[i]; j++) g2[i][j] = NAN;
        mt_attention_bwd(g2[0], g2[1], g2[2], dout, q, k, v, out16, lse16, pos, B, T, H, G, D, scratch, nthr, t_ws.bf16);
        mt_attention_set_diag_skip(1);
        for (int i = 0; i < 3; i++) CHECK_SAME_F(g2[i], g16[i], n3[i]);
        for (int i = 0; i < 3; i++) mt_free(g2[i]);
        mt_free(k16); mt_free(v16); mt_free(o2); mt_free(l2);
    }
    tws_bf16(0);
    CHECK(!mt_attention_bf16(t_ws.bf16, D));
    if (D % 16 == 0 && mt_attention_bf16_built()) {
        double eo = rel_err(out16, out, nq), el = rel_err(lse16, lse, (size_t)B * H * T);
        RECORD(S_ATT_FWD, "out,lse", eo > el ? eo : el);
        CHECK(memcmp(out16, out, nq * 4) != 0);
        double worst = 0;
        int differ = 0;
        for (int i = 0; i < 3; i++) {
            double e = rel_err(g16[i], g32[i], n3[i]);
            worst = e > worst ? e : worst;
            differ |= memcmp(g16[i], g32[i], n3[i] * 4) != 0;
        }
        RECORD(S_ATT_BWD, "dq,dk,dv", worst);
        CHECK(differ);
    } else { /* fp32 attention: D % 16 != 0, or a build without the bf16 kernels */
        CHECK_SAME_F(out16, out, nq);
        for (int i = 0; i < 3; i++) CHECK_SAME_F(g16[i], g32[i], n3[i]);
    }
    free(pos);
    mt_free(scratch);
    for (int i = 0; i < 3; i++) {
        mt_free(g32[i]);
        mt_free(g16[i]);
    }
    mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(out); mt_free(lse);
    mt_free(out16); mt_free(lse16);
}

/* Separate key and value widths (MLA: q/k of dn + dr, v of dv) in bf16 mode against fp32
 * at the same widths: bf16 pairs when both widths are multiples of 16 (then different bits
 * within bf16's rounding), else the fp32 bits. */
static void attention_dv_case(int B, int T, int H, int Dk, int Dv) {
    snprintf(where, sizeof where, "attention_dv B %d T %d H %d Dk %d Dv %d", B, T, H, Dk, Dv);
    const size_t rq = (size_t)B * T * H, nl = (size_t)B * H * T;
    const size_t n3[3] = {rq * Dk, rq * Dk, rq * Dv}; /* dq, dk, dv (G = H) */
    float *q = mt_alloc(rq * Dk * 4), *k = mt_alloc(rq * Dk * 4), *v = mt_alloc(rq * Dv * 4);
    float *dout = mt_alloc(rq * Dv * 4), *o32 = mt_alloc(rq * Dv * 4), *o16 = mt_alloc(rq * Dv * 4);
    float *l32 = mt_alloc(nl * 4), *l16 = mt_alloc(nl * 4), *g32[3], *g16[3];
    for (int i = 0; i < 3; i++) g32[i] = mt_alloc(n3[i] * 4), g16[i] = mt_alloc(n3[i] * 4);
    for (size_t i = 0; i < rq * Dk; i++) { q[i] = rnd(21, i); k[i] = rnd(23, i); }
    for (size_t i = 0; i < rq * Dv; i++) { v[i] = rnd(24, i); dout[i] = rnd(22, i); }
    const int nthr = 2, Dm = Dk > Dv ? Dk : Dv;
    float *scratch = mt_alloc(mt_attention_scratch_floats(T, Dm) * nthr * 4);
    tws_bf16(0);
    mt_attention_fwd_dv(o32, l32, q, k, v, NULL, B, T, H, H, Dk, Dv, scratch, nthr, t_ws.bf16);
    mt_attention_bwd_dv(g32[0], g32[1], g32[2], dout, q, k, v, o32, l32, NULL, B, T, H, H, Dk, Dv, scratch, nthr,
                        t_ws.bf16);
    CHECK(tws_bf16(1) == 0);
    mt_attention_fwd_dv(o16, l16, q, k, v, NULL, B, T, H, H, Dk, Dv, scratch, nthr, t_ws.bf16);
    mt_attention_bwd_dv(g16[0], g16[1], g16[2], dout, q, k, v, o16, l16, NULL, B, T, H, H, Dk, Dv, scratch, nthr,
                        t_ws.bf16);
    const int pairs = mt_attention_bf16(t_ws.bf16, Dk) && mt_attention_bf16(t_ws.bf16, Dv);
    tws_bf16(0);
    if (pairs) {
        double eo = rel_err(o16, o32, rq * Dv), el = rel_err(l16, l32, nl);
        RECORD(S_ATT_FWD, "out,lse (Dk != Dv)", eo > el ? eo : el);
        CHECK(memcmp(o16, o32, rq * Dv * 4) != 0);
        double worst = 0;
        for (int i = 0; i < 3; i++) {
            double e = rel_err(g16[i], g32[i], n3[i]);
            worst = e > worst ? e : worst;
        }
        RECORD(S_ATT_BWD, "dq,dk,dv (Dk != Dv)", worst);
    } else {
        CHECK_SAME_F(o16, o32, rq * Dv);
        for (int i = 0; i < 3; i++) CHECK_SAME_F(g16[i], g32[i], n3[i]);
    }
    mt_free(scratch);
    for (int i = 0; i < 3; i++) mt_free(g32[i]), mt_free(g16[i]);
    mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(o32); mt_free(o16); mt_free(l32); mt_free(l16);
}

/* The backward rebuilds the forward's probabilities: with dO one-hot at (query i, column 0),
 * dV[key][0] = P[i][key], so the sum over keys is row i's sum of P, 1. With scores of
 * standard deviation ~20 (q, k of amplitude 8) a backward that rounds its scores otherwise
 * than the forward (bf16(q) log2(e)/sqrt(D) against bf16(q log2(e)/sqrt(D))) is several
 * percent off; within bf16's rounding of P it is ~1e-3. */
static void attention_prob_sums(int bf16) {
    const int T = 200, D = 64;
    const size_t n = (size_t)T * D;
    float *q = mt_alloc(n * 4), *k = mt_alloc(n * 4), *v = mt_alloc(n * 4), *dout = mt_alloc(n * 4);
    float *out = mt_alloc(n * 4), *lse = mt_alloc((size_t)T * 4), *dq = mt_alloc(n * 4), *dk = mt_alloc(n * 4);
    float *dv = mt_alloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        q[i] = 8.0f * rnd(21, i);
        k[i] = 8.0f * rnd(22, i);
        v[i] = rnd(23, i);
    }
    float *scratch = mt_alloc(mt_attention_scratch_floats(T, D) * 2 * 4);
    if (bf16) CHECK(tws_bf16(1) == 0);
    mt_attention_fwd(out, lse, q, k, v, NULL, 1, T, 1, 1, D, scratch, 2, t_ws.bf16);
    static const int rows[] = {3, 64, 100, 150, 199};
    double worst = 0;
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        memset(dout, 0, n * 4);
        dout[(size_t)rows[r] * D] = 1.0f;
        mt_attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, NULL, 1, T, 1, 1, D, scratch, 2, t_ws.bf16);
        double sum = 0;
        for (int t = 0; t < T; t++) sum += dv[(size_t)t * D];
        worst = fabs(sum - 1.0) > worst ? fabs(sum - 1.0) : worst;
    }
    tws_bf16(0);
    snprintf(where, sizeof where, "attention rows of P, T %d D %d bf16 %d", T, D, bf16);
    RECORD(S_ATT_SUMS, bf16 ? "bf16" : "fp32", worst);
    mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(out); mt_free(lse); mt_free(dq); mt_free(dk);
    mt_free(dv); mt_free(scratch);
}

static void test_attention(void) {
    attention_prob_sums(0);
    attention_prob_sums(1);
    attention_case(2, 64, 2, 2, 64, 0);
    attention_case(1, 97, 4, 2, 64, 0);  /* last query block: 33 rows (an odd pair) */
    attention_case(2, 130, 2, 1, 32, 1); /* grouped heads, D 32, document mode */
    attention_case(1, 70, 2, 2, 16, 0);
    attention_case(1, 59, 2, 2, 32, 0);  /* row tiles of 6 with a remainder of 5 */
    attention_case(1, 50, 2, 2, 24, 0);  /* D % 16 != 0: fp32 */
    attention_case(1, 130, 2, 2, 128, 0); /* D 128: two 64-column blocks */
    attention_case(1, 70, 1, 1, 48, 0);   /* one head, D 48: three 16-column vectors */
    attention_case(2, 5, 1, 1, 16, 1);    /* shorter than a tile */
    attention_case(1, 600, 2, 1, 64, 0);  /* T > 512: the forward's later query-block groups */
    attention_case(1, 1100, 1, 1, 16, 1); /* ... in document mode, starting at later key blocks */
    attention_dv_case(1, 130, 2, 48, 32);  /* MLA-like widths: q/k 48, v 32 */
    attention_dv_case(1, 70, 2, 32, 80);   /* wider values */
    attention_dv_case(1, 70, 2, 24, 16);   /* q/k not a multiple of 16: fp32 */
}

int main(void) {
    if (!mt_bf16_supported()) {
        printf("test_gemm_bf16: the kernel tier in use (CPU or MT_CPU_TIER) has no AVX512-BF16: skipped\n");
        CHECK(mt_gemm_bf16_check(1) != 0 && tws_bf16(1) != 0); /* refused, with a message */
        return failures ? 1 : 77;
    }
    mt_set_threads(2);
    double t0 = mt_now();
    test_rounding();
    test_k0();
    test_gemm();
    test_cin();
    test_threads();
    test_packed();
    test_shared_wgrad();
    test_bf16_inputs();
    test_head_packed();
    test_dispatch_and_grouped();
    test_attention();
    return print_stats("test_gemm_bf16", stats, S_COUNT, mt_now() - t0, mt_get_threads(), "gemm_bf16");
}
