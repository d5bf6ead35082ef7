/* kernels/rows.c — the decode's few-row fp32 products (see rows.h). */
#include "kernels/rows.h"

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>

#include "kernels/blas.h"
#include "kernels/vecw.h"

/* A block is WR rows of B (weights) by XR rows of A: WR*XR accumulators of LANES floats
 * (AVX-512: 16 of 32 registers; AVX2: 8 of 16), each summing the products of lane l at
 * k = l, l + LANES, ... in order. The tail of K is loaded masked (zeros). */
#ifdef __AVX512F__
enum { WR = 4, XR = 4, LANES = MT_VW };
#else
enum { WR = 4, XR = 2, LANES = MT_VW };
#endif

/* The lane sums of the WR*XR accumulators v[XR i + j] (weight row i, A row j) in one vector,
 * by a fixed tree of adds: the sum of v[XR i + j] ends in lane 4j + i, so lanes 4j .. 4j+3
 * are the outputs of A row j for weight rows 0..3. */
static inline mt_vf reduce_block(const mt_vf *v) {
#ifdef __AVX512F__
    __m512 c[8], e[4], g[2];
    for (int p = 0; p < 8; p++) /* halves: lanes 0-7 from v[2p], 8-15 from v[2p+1] */
        c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int q = 0; q < 4; q++) /* quarter t: v[4q + t] */
        e[q] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], 0xDD));
    for (int s = 0; s < 2; s++) /* quarter t: 2 lanes of v[8s + t], 2 of v[8s + 4 + t] */
        g[s] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * s], e[2 * s + 1], 0x44),
                             _mm512_shuffle_ps(e[2 * s], e[2 * s + 1], 0xEE));
    /* lane 4t + u: v[4u + t] */
    return _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xDD));
#else
    __m256 c[4], e[2];
    for (int p = 0; p < 4; p++) /* halves: v[2p], v[2p + 1] */
        c[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    for (int q = 0; q < 2; q++) /* half h: 2 lanes of v[4q + h], 2 of v[4q + 2 + h] */
        e[q] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * q], c[2 * q + 1], 0x44),
                             _mm256_shuffle_ps(c[2 * q], c[2 * q + 1], 0xEE));
    /* lane 4h + u: v[2u + h] */
    return _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], 0x88), _mm256_shuffle_ps(e[0], e[1], 0xDD));
#endif
}

/* C rows m .. m+XR-1, columns o .. o+WR-1 (those below M and N). Rows past the edge repeat
 * the last one (their results are dropped), so every element takes the same path. With pf,
 * the weight rows pf .. pf+WR-1 (the next block's) are prefetched meanwhile: the weights come
 * from memory once per call, and the hardware prefetcher alone left the loads waiting. */
static inline void block(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                         float beta, float *C, int ldc, int m, int o, int pf) {
    const float *a[XR], *b[WR];
    for (int j = 0; j < XR; j++) a[j] = A + (size_t)(m + j < M ? m + j : M - 1) * lda;
    for (int i = 0; i < WR; i++) b[i] = B + (size_t)(o + i < N ? o + i : N - 1) * ldb;
    const float *p[WR];
    for (int i = 0; i < WR; i++) p[i] = B + (size_t)(pf >= 0 && pf + i < N ? pf + i : o) * ldb;
    mt_vf acc[WR * XR];
#pragma GCC unroll 16
    for (int t = 0; t < WR * XR; t++) acc[t] = mt_vf_zero();
    int k = 0;
    for (; k + LANES <= K; k += LANES) {
        mt_vf w[WR], x[XR];
        if (pf >= 0) {
#pragma GCC unroll 4
            for (int i = 0; i < WR; i++) _mm_prefetch((const char *)(p[i] + k), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int i = 0; i < WR; i++) {
            w[i] = mt_vf_load(b[i] + k);
            __asm__("" : "+x"(w[i])); /* one load each: GCC would fold it into every FMA */
        }
#pragma GCC unroll 4
        for (int j = 0; j < XR; j++) x[j] = mt_vf_load(a[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < WR; i++)
#pragma GCC unroll 4
            for (int j = 0; j < XR; j++) acc[XR * i + j] = mt_vf_fma(x[j], w[i], acc[XR * i + j]);
    }
    if (k < K) {
        const mt_vmask tm = mt_vf_tail((size_t)(K - k));
        mt_vf w[WR], x[XR];
        for (int i = 0; i < WR; i++) w[i] = mt_vf_load_tail(b[i] + k, tm);
        for (int j = 0; j < XR; j++) x[j] = mt_vf_load_tail(a[j] + k, tm);
        for (int i = 0; i < WR; i++)
            for (int j = 0; j < XR; j++) acc[XR * i + j] = mt_vf_fma(x[j], w[i], acc[XR * i + j]);
    }
    float r[LANES];
    _Static_assert(WR == 4 && XR * WR == LANES, "reduce_block's layout: lanes 4j + i");
#ifdef __AVX512F__
    _mm512_storeu_ps(r, reduce_block(acc));
#else
    _mm256_storeu_ps(r, reduce_block(acc));
#endif
    const int nj = M - m < XR ? M - m : XR, ni = N - o < WR ? N - o : WR;
    for (int j = 0; j < nj; j++) {
        float *c = C + (size_t)(m + j) * ldc + o;
        for (int i = 0; i < ni; i++) c[i] = beta == 0.0f ? alpha * r[4 * j + i] : alpha * r[4 * j + i] + beta * c[i];
    }
}

/* weight-row blocks [lo, hi): a chunk of them stays in L2 while the rows of A pass in
 * groups that fit L1 */
static void run(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                float *C, int ldc, int lo, int hi) {
    const size_t row = sizeof(float) * (size_t)K;
    int ocb = (int)((256u << 10) / (row * WR)), mc = (int)((24u << 10) / row) / XR * XR;
    if (ocb < 1) ocb = 1;
    if (mc < XR) mc = XR;
    for (int oc = lo; oc < hi; oc += ocb) {
        const int oe = oc + ocb < hi ? oc + ocb : hi;
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int me = m0 + mc < M ? m0 + mc : M;
            for (int ob = oc; ob < oe; ob++)
                for (int m = m0; m < me; m += XR)
                    block(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, m, ob * WR,
                          m == m0 && ob + 1 < oe ? (ob + 1) * WR : -1);
        }
    }
}

void mt_rows_gemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        mt_gemm_scale_c(M, N, beta, C, ldc);
        return;
    }
    const int nob = (N + WR - 1) / WR;
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nthr > nob) nthr = nob;
    if ((double)M * N * K < 65536.0) nthr = 1; /* too small to be worth waking a thread */
    if (nthr <= 1) {
        run(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0, nob);
        return;
    }
#pragma omp parallel for num_threads(nthr) schedule(static, 1)
    for (int t = 0; t < nthr; t++)
        run(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, (int)((long)nob * t / nthr), (int)((long)nob * (t + 1) / nthr));
}
