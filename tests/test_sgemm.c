/* tests/test_sgemm.c — the fp32 GEMM (mt_sgemm over OpenBLAS, kernels/blas.c):
 *   1. against the plain reference (ref.c, sums in double) over odd shapes, every transpose,
 *      alpha/beta and leading dimensions larger than the rows: normalised error 1e-5;
 *   2. the same bits for 1, 2 and 3 threads, at top level (C split into parts) and inside a
 *      parallel region of 1 or 2 threads, or an inactive one (if(0)) of 2: OpenBLAS's own
 *      threading of its Haswell/Zen kernels rounds by where it splits C, so a product must
 *      never be split by the thread count. (A product at top level and the same one inside a
 *      region may differ: the model makes each of its products in one of the two places.)
 *   3. the decoder's few-row products (ws.rows: C = alpha A B^T + beta C, kernels/rows.h) against
 *      the reference, and an element's bits depending on its rows of A and B only: each row of A
 *      alone, a window of B's rows at another offset, 1-3 threads and inside a region all give
 *      the bits of the whole call.
 * Runs with whatever BLAS kernel OpenBLAS picked (OPENBLAS_CORETYPE forces one). */
#include <omp.h>
#include <stdio.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/ref.h"
#include "kernels/rows.h"
#include "kstats.h"
#include "testutil.h"
#include "testws.h"

enum { S_GEMM, S_ROWS, S_COUNT };
static stat stats[S_COUNT] = {{"sgemm", 1e-5, 0, 0}, {"rows (decode)", 1e-5, 0, 0}};

typedef struct { int M, N, K; } shape;

static const shape shapes[] = {
    {1, 1, 1},      {3, 5, 7},       {17, 33, 65},   {64, 64, 64},     {100, 37, 53},  {256, 128, 128},
    {128, 256, 256}, {8, 128, 4096}, {16, 16, 4096}, {512, 1040, 128}, {1040, 96, 200}, {700, 500, 300},
};

/* C = alpha op(A) op(B) + beta C with nthr threads; inside: 1 in a parallel region of nthr,
 * 2 in an inactive one (if(0)) of a process with nthr threads */
static void run(int ta, int tb, const shape *s, float alpha, const float *A, int lda, const float *B, int ldb,
                float beta, float *C, int ldc, int nthr, int inside) {
    mt_set_threads(nthr);
    if (!inside) {
        mt_sgemm(tws(), ta, tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel num_threads(nthr) if (inside == 1)
#pragma omp single
    mt_sgemm(tws(), ta, tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void test_shape(const shape *s, int ta, int tb) {
    const int M = s->M, N = s->N, K = s->K, pad = 3;
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = rnd(na, 11 + M, -1, 1), *B = rnd(nb, 12 + N, -1, 1), *C0 = rnd(nc, 13 + K, -1, 1);
    float *ref = dup(C0, nc), *C = falloc(nc);
    const float alpha = 0.75f, beta = 0.5f;
    mt_ref_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, ref, ldc);
    float *first[2] = {NULL, NULL}; /* per place: top level, inside a region */
    const int cfg[][2] = {{1, 0}, {2, 0}, {3, 0}, {1, 1}, {2, 1}, {2, 2}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        snprintf(where, sizeof where, "M=%d N=%d K=%d ta=%d tb=%d, %d threads%s", M, N, K, ta, tb, cfg[c][0],
                 cfg[c][1] == 2 ? " in an inactive region" : cfg[c][1] ? " inside a region" : "");
        memcpy(C, C0, sizeof(float) * nc);
        run(ta, tb, s, alpha, A, lda, B, ldb, beta, C, ldc, cfg[c][0], cfg[c][1]);
        RECORD(S_GEMM, "vs reference", nerr(C, ref, nc));
        const int in = cfg[c][1] != 0;
        if (!first[in]) first[in] = dup(C, nc);
        else CHECK_SAME_F(C, first[in], nc);
    }
    mt_free(A); mt_free(B); mt_free(C0); mt_free(ref); mt_free(C); mt_free(first[0]); mt_free(first[1]);
}

/* the few-row kernel through mt_sgemm (transA 0, transB 1) */
static void rows_call(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc, int nthr, int inside) {
    mt_set_threads(nthr);
    mt_ws ws = tws();
    ws.rows = 1;
#pragma omp parallel num_threads(nthr) if (inside)
#pragma omp single
    mt_sgemm(ws, 0, 1, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void test_rows(int M, int N, int K, float beta) {
    const int pad = 5, lda = K + pad, ldb = K + 3, ldc = N + pad;
    const size_t na = (size_t)M * lda, nb = (size_t)N * ldb, nc = (size_t)M * ldc;
    float *A = rnd(na, 21 + M, -1, 1), *B = rnd(nb, 22 + N, -1, 1), *C0 = rnd(nc, 23 + K, -1, 1);
    float *ref = dup(C0, nc), *C = dup(C0, nc), *D = falloc(nc);
    const float alpha = beta == 0.0f ? 1.0f : 0.75f;
    snprintf(where, sizeof where, "rows M=%d N=%d K=%d beta=%g", M, N, K, beta);
    mt_ref_sgemm(0, 1, M, N, K, alpha, A, lda, B, ldb, beta, ref, ldc);
    rows_call(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 2, 0);
    RECORD(S_ROWS, "vs reference", nerr(C, ref, nc));
    memcpy(D, C0, sizeof(float) * nc); /* mt_sgemm ran the kernel, not OpenBLAS */
    mt_rows_gemm(M, N, K, alpha, A, lda, B, ldb, beta, D, ldc);
    CHECK_SAME_F(D, C, nc);
    const int cfg[][2] = {{1, 0}, {3, 0}, {2, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) { /* threads, inside a region */
        memcpy(D, C0, sizeof(float) * nc);
        rows_call(M, N, K, alpha, A, lda, B, ldb, beta, D, ldc, cfg[c][0], cfg[c][1]);
        CHECK_SAME_F(D, C, nc);
    }
    memcpy(D, C0, sizeof(float) * nc); /* each row of A alone */
    for (int m = 0; m < M; m++)
        rows_call(1, N, K, alpha, A + (size_t)m * lda, lda, B, ldb, beta, D + (size_t)m * ldc, ldc, 2, 0);
    CHECK_SAME_F(D, C, nc);
    if (N > 2) { /* B's rows 1 .. N-2: the blocks of 4 fall elsewhere */
        memcpy(D, C0, sizeof(float) * nc);
        rows_call(M, N - 2, K, alpha, A, lda, B + ldb, ldb, beta, D + 1, ldc, 2, 0);
        for (int m = 0; m < M; m++) CHECK_SAME_F(D + (size_t)m * ldc + 1, C + (size_t)m * ldc + 1, N - 2);
    }
    mt_free(A); mt_free(B); mt_free(C0); mt_free(ref); mt_free(C); mt_free(D);
}

int main(void) {
    double t0 = mt_now();
    const int rows_shapes[][3] = {{1, 1, 1}, {1, 7, 15}, {3, 5, 17}, {8, 704, 512}, {9, 512, 352},
                                  {64, 130, 512}, {5, 33, 1408}, {70, 300, 40}, {2, 8192, 64}};
    for (size_t i = 0; i < sizeof rows_shapes / sizeof rows_shapes[0]; i++)
        for (int b = 0; b < 2; b++) test_rows(rows_shapes[i][0], rows_shapes[i][1], rows_shapes[i][2], b ? 0.5f : 0.0f);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) test_shape(&shapes[i], ta, tb);
    mt_set_threads(2);
    return print_stats("test_sgemm", stats, S_COUNT, mt_now() - t0, mt_get_threads(), mt_blas_corename());
}
