/* kernels/attention.c — flash attention forward and backward on the CPU (contract in
 * attention.h; plain reference in ref.c).
 *
 * One file of ~1200 lines on purpose: the forward and backward share the tile micro-kernels
 * and transposes below, which stay static (inlined) in the one translation unit each CPU
 * tier compiles (kernels/tier.c); split, they would cross a call boundary per tile.
 *
 * Tiling: query blocks of ATT_BQ rows x key blocks of ATT_BK keys; scores are computed in
 * base 2 (q pre-multiplied by log2(e)/sqrt(D), softmax by 2^x), which saves the
 * exponential's range reduction at no cost in accuracy.
 *
 * Forward (one task = ATT_QG consecutive query blocks of one (batch, head), so all output
 * rows of a task are one thread's): each query block is packed transposed and scaled once,
 * Qt[D][BQ] (16 x 16 register transposes, as the output's way back); then for each key
 * block, copied once into contiguous rows and used by every query block of the task that
 * sees it,
 *   St = K Qt           scores transposed, [keys][queries]: a column is one query, so the
 *                       online-softmax max and sum are vector max/add over rows (no
 *                       horizontal reductions); the column max is taken in the micro-
 *                       kernel's epilogue, where masked lanes are set to -inf;
 *   St = 2^(St - m)     one pass, summing l per column;
 *   Ot = Ot alpha + V^T St   the output accumulated transposed, [D][queries], so the
 *                       rescale 2^(m_old - m_new) is a vector per column, fused into the
 *                       micro-kernel's accumulator load.
 * Tasks run costliest (last query blocks) first so the dynamic schedule ends balanced.
 *
 * Backward (FlashAttention-2; one task = one (batch, kv head)): per head of the group the
 * head's q and dO rows are copied contiguous once and D_i = dO_i . O_i computed; then per
 * key block (K and V packed transposed, [D][BK], and K copied contiguous; in bf16 mode
 * their pair layouts, read straight from k and v) and every query block that sees it:
 *   P  = 2^(Q Kt c - lse2)       exp fused into the score micro-kernel's epilogue;
 *   dS = P (dO Vt - D_i) scale   likewise fused;
 *   dV += P^T dO, dQ += dS K, dK += dS^T Q, straight into dv, dq, dk, whose rows the task
 *   owns (the first contribution to a row initialises it),
 * the last three by one strided micro-kernel (A read through strides, so P^T and dS^T
 * need no copies); in bf16 mode, on a diagonal block they skip the pairs the causal mask
 * zeroes (the same bits for finite inputs, where those terms are exact zeros; an inf in dO,
 * q or k no longer turns masked terms into NaN. T=512 backward 18.7-18.8 against 20.5-23.2
 * ms, `bench kernels`).
 *
 * Vectorisation: with AVX-512 the products are register-blocked FMA micro-kernels of
 * ATT_MR rows x 64 columns (24 zmm accumulators) and the exponential is mt_exp2_512
 * (kernels/vexp.h); with AVX2 (the avx2 tier, kernels/tier.h) tiles of ATT_MR rows x 16
 * columns (12 ymm accumulators), four strips per 64-column block, and mt_exp2_256. Contiguous copies matter:
 * rows of q/k/v are 4*H*D or 4*G*D bytes apart, a stride that maps a 64-row block onto a
 * few L1 sets. Measured (one thread, T=4096, D=64, GFLOP/s fwd/bwd on AMD EPYC Zen 4, best
 * of repeats on a shared machine; SGEMM 1024^3 ~95): previous kernel 62/55, transposed
 * forward + fused epilogues 63/73, + query-block groups 83, + contiguous copies 83/89.
 * Benchmark: tests/test_kernels.c with MT_BENCH=1 (also prints the SGEMM rate).
 *
 * Mixed precision (the GEMMs' bf16 mode, the callers' bf16 argument; needs AVX512-BF16 at compile
 * time and D % 16 == 0): every product multiplies bf16 pairs with fp32 sums (VDPBF16PS);
 * the operands are packed in pairs along the summed index (q, dO once per head; K, V once
 * per key block; P, dS per block), masks, softmax, log-sum-exp and accumulators stay fp32.
 * The scores round q already scaled, bf16(q log2(e)/sqrt(D)), in the forward and in the
 * backward's recomputation alike, so the backward's P is the forward's.
 *
 * Scratch per thread: O(ATT_QG * ATT_BQ * D + ATT_BK * D) for the forward, O(T * D) for the
 * backward (the head's contiguous q and dO, and their pairs in bf16 mode). */
#include "kernels/attention.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/vdot.h"
#include "kernels/vexp.h"
#include "kernels/vecw.h"

#include <immintrin.h>
#ifdef __AVX512F__
#include "kernels/vtrans.h"
#endif

/* Fixed by the AVX-512 micro-kernels: 64 columns = 4 zmm. */
#define ATT_BQ 64
#define ATT_BK 64
#ifndef ATT_MR
#define ATT_MR 6 /* rows of a micro-kernel tile */
#endif
#define NV (ATT_BQ / 16)
_Static_assert(ATT_BQ == ATT_BK, "a key block starting where a query block starts is its diagonal");
#ifndef ATT_QG
#define ATT_QG 8 /* query blocks per forward task: each key block read serves all of them */
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static const float LOG2E = 1.44269504088896341f, LN2 = 0.693147180559945309f;

static int round16(int x) { return (x + 15) & ~15; }

/* the first 64-byte boundary at or after p in a thread's scratch: raw bytes, which the kernels lay out as
 * fp32 and bf16-pair regions */
static void *align64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* Dispatch a row count 0 < m_ < ATT_MR to CALL(rows, ...) with a constant row count (so the
 * micro-kernel's loops unroll and its accumulators stay in registers); the other arguments
 * are passed on. */
_Static_assert(ATT_MR <= 6, "MR_SWITCH dispatches remainders of at most 5 rows");
#define MR_SWITCH(m_, CALL, ...) do { switch (m_) { \
    case 1: CALL(1, __VA_ARGS__); break; case 2: CALL(2, __VA_ARGS__); break; \
    case 3: CALL(3, __VA_ARGS__); break; case 4: CALL(4, __VA_ARGS__); break; \
    default: CALL(5, __VA_ARGS__); break; } } while (0)

/* CALL(rows, ...) for the ATT_MR-row tiles of rows i_ .. n_-1 (advancing i_), then once for
 * the remainder with a constant row count. */
#define FOR_MR_TILES(i_, n_, CALL, ...) do { \
    for (; (i_) + ATT_MR <= (n_); (i_) += ATT_MR) CALL(ATT_MR, __VA_ARGS__); \
    if ((i_) < (n_)) MR_SWITCH((n_) - (i_), CALL, __VA_ARGS__); } while (0)

/* FOR_MR_TILES with CALL(rows, flag), the flag a constant 0 or 1 from the variable f_ (the
 * tile's branches on it fold away) */
#define FOR_MR_TILES_FLAG(f_, i_, n_, CALL) do { \
    if (f_) FOR_MR_TILES(i_, n_, CALL, 1); \
    else FOR_MR_TILES(i_, n_, CALL, 0); } while (0)

#ifdef __AVX512F__

/* Lanes l of the vector starting at column j0 with lo <= j0 + l < hi. */
ALWAYS_INLINE __mmask16 range_mask(int j0, int lo, int hi) {
    int a = lo - j0, e = hi - j0;
    if (a < 0) a = 0;
    if (e > 16) e = 16;
    if (a >= e) return 0;
    return (__mmask16)(((1u << e) - 1u) & ~((1u << a) - 1u));
}

/* ---- forward micro-kernels (columns = the ATT_BQ queries) ---- */

/* St rows j0..j0+mr-1 = K rows j0.. . Qt; with masking, lanes (queries) i whose range
 * [lo_i, hi_i) excludes the key are -inf. Folds the rows into the column max mx. */
ALWAYS_INLINE void st_epilogue(float *St, __m512 acc[ATT_MR][NV], int j0, int mr, int masked, const __m512i *lo,
                               const __m512i *hi, __m512 *mx) {
    for (int r = 0; r < mr; r++) {
        if (masked) {
            __m512i jj = _mm512_set1_epi32(j0 + r);
            for (int u = 0; u < NV; u++) {
                __mmask16 in = _mm512_cmple_epi32_mask(lo[u], jj) & _mm512_cmpgt_epi32_mask(hi[u], jj);
                acc[r][u] = _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), acc[r][u]);
            }
        }
        for (int u = 0; u < NV; u++) {
            _mm512_store_ps(St + (size_t)(j0 + r) * ATT_BQ + 16 * u, acc[r][u]);
            mx[u] = _mm512_max_ps(mx[u], acc[r][u]);
        }
    }
}

ALWAYS_INLINE void st_tile(float *St, const float *K, int ldk, const float *Qt, int D, int j0,
                           int mr, int masked, const __m512i *lo, const __m512i *hi, __m512 *mx) {
    __m512 acc[ATT_MR][NV];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++) acc[r][u] = _mm512_setzero_ps();
    const float *kr = K + (size_t)j0 * ldk;
    for (int c = 0; c < D; c++) {
        __m512 b[NV];
        for (int u = 0; u < NV; u++) b[u] = _mm512_load_ps(Qt + (size_t)c * ATT_BQ + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(kr[(size_t)r * ldk + c]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    st_epilogue(St, acc, j0, mr, masked, lo, hi, mx);
}

ALWAYS_INLINE void st_rows(float *St, const float *K, int ldk, const float *Qt, int nk, int D,
                           int masked, const __m512i *lo, const __m512i *hi, __m512 *mx) {
    int j = 0;
#define ST_CALL(M, MASKED) st_tile(St, K, ldk, Qt, D, j, M, MASKED, lo, hi, mx)
    FOR_MR_TILES(j, nk, ST_CALL, masked);
#undef ST_CALL
}

/* St[nk][ATT_BQ] = K[nk][D] (row stride ldk) . Qt[D][ATT_BQ]; bm[ATT_BQ] = column max.
 * lo/hi (masked only): each query's visible key range relative to the block. */
static void fwd_scores(float *St, float *bm, const float *K, int ldk, const float *Qt, int nk,
                       int D, const int32_t *lo, const int32_t *hi) {
    __m512 mx[NV];
    for (int u = 0; u < NV; u++) mx[u] = _mm512_set1_ps(-INFINITY);
    if (lo) {
        __m512i lv[NV], hv[NV];
        for (int u = 0; u < NV; u++) {
            lv[u] = _mm512_loadu_si512(lo + 16 * u);
            hv[u] = _mm512_loadu_si512(hi + 16 * u);
        }
        st_rows(St, K, ldk, Qt, nk, D, 1, lv, hv, mx);
    } else {
        st_rows(St, K, ldk, Qt, nk, D, 0, NULL, NULL, mx);
    }
    for (int u = 0; u < NV; u++) _mm512_store_ps(bm + 16 * u, mx[u]);
}

/* Online-softmax step over the block: m' = max(m, bm); St = 2^(St - m') in place;
 * l = l 2^(m - m') + column sums; m = m'; alpha = 2^(m - m'). Columns that have seen no
 * key yet keep m = -inf and l = 0 (their subtrahend is 0, their alpha 0). */
static void fwd_softmax(float *St, float *m, float *l, float *alpha, const float *bm, int nk) {
    __m512 ms[NV], sum[NV];
    for (int u = 0; u < NV; u++) {
        __m512 mo = _mm512_load_ps(m + 16 * u), mn = _mm512_max_ps(mo, _mm512_load_ps(bm + 16 * u));
        __mmask16 none = _mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
        ms[u] = _mm512_mask_blend_ps(none, mn, _mm512_setzero_ps());
        _mm512_store_ps(alpha + 16 * u, mt_exp2_512(_mm512_sub_ps(mo, ms[u])));
        _mm512_store_ps(m + 16 * u, mn);
        sum[u] = _mm512_setzero_ps();
    }
    for (int j = 0; j < nk; j++)
        for (int u = 0; u < NV; u++) {
            float *s = St + (size_t)j * ATT_BQ + 16 * u;
            __m512 p = mt_exp2_512(_mm512_sub_ps(_mm512_load_ps(s), ms[u]));
            _mm512_store_ps(s, p);
            sum[u] = _mm512_add_ps(sum[u], p);
        }
    for (int u = 0; u < NV; u++)
        _mm512_store_ps(l + 16 * u, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * u),
                                                    _mm512_load_ps(alpha + 16 * u), sum[u]));
}

/* Ot rows d0..d0+mr-1 = Ot alpha (or 0 when first) + V[:, d0..]^T St. */
ALWAYS_INLINE void ot_tile(float *Ot, const float *V, int ldv, const float *St, int nk, int d0,
                           int mr, int first, const float *alpha) {
    __m512 acc[ATT_MR][NV];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++)
            acc[r][u] = first ? _mm512_setzero_ps()
                              : _mm512_mul_ps(_mm512_load_ps(Ot + (size_t)(d0 + r) * ATT_BQ + 16 * u),
                                              _mm512_load_ps(alpha + 16 * u));
    const float *vr = V + d0;
    for (int j = 0; j < nk; j++) {
        __m512 b[NV];
        for (int u = 0; u < NV; u++) b[u] = _mm512_load_ps(St + (size_t)j * ATT_BQ + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(vr[(size_t)j * ldv + r]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++) _mm512_store_ps(Ot + (size_t)(d0 + r) * ATT_BQ + 16 * u, acc[r][u]);
}

/* Ot[D][ATT_BQ] = Ot alpha (0 when first) + V[nk][D]^T (row stride ldv) . St[nk][ATT_BQ] */
static void fwd_pv(float *Ot, const float *V, int ldv, const float *St, int nk, int D, int first,
                   const float *alpha) {
    int d = 0;
#define OT_CALL(M, FIRST) ot_tile(Ot, V, ldv, St, nk, d, M, FIRST, alpha)
    FOR_MR_TILES_FLAG(first, d, D, OT_CALL);
#undef OT_CALL
}

/* ---- backward micro-kernels (columns = the ATT_BK keys) ---- */

/* rows i0..i0+mr-1 of a score-like tile X = A Bt (A row stride lda, Bt[D][ATT_BK]) and its
 * epilogue: mode 0: P = 2^(X c - sub_i) on the row's visible keys [lo_i, hi_i) (masked
 * only; else all), 0 elsewhere; mode 1: dS = P (X - sub_i) scale, P read from P. */
ALWAYS_INLINE void bt_epilogue(float *C, __m512 acc[ATT_MR][4], int i0, int mr, int mode, int masked,
                               const int *lo, const int *hi, const float *sub, float c, const float *P) {
    for (int r = 0; r < mr; r++) {
        int i = i0 + r;
        __m512 sv = _mm512_set1_ps(sub[i]), cv = _mm512_set1_ps(c);
        for (int u = 0; u < 4; u++) {
            float *dst = C + (size_t)i * ATT_BK + 16 * u;
            __m512 x;
            if (mode == 0) {
                x = mt_exp2_512(_mm512_fmsub_ps(acc[r][u], cv, sv));
                if (masked) x = _mm512_maskz_mov_ps(range_mask(16 * u, lo[i], hi[i]), x);
            } else {
                x = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(acc[r][u], sv), cv),
                                  _mm512_load_ps(P + (size_t)i * ATT_BK + 16 * u));
            }
            _mm512_store_ps(dst, x);
        }
    }
}

ALWAYS_INLINE void bt_tile(float *C, const float *A, int lda, const float *Bt, int D, int i0,
                           int mr, int mode, int masked, const int *lo, const int *hi,
                           const float *sub, float c, const float *P) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = _mm512_setzero_ps();
    const float *ar = A + (size_t)i0 * lda;
    for (int k = 0; k < D; k++) {
        __m512 b[4];
        for (int u = 0; u < 4; u++) b[u] = _mm512_load_ps(Bt + (size_t)k * ATT_BK + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(ar[(size_t)r * lda + k]);
            for (int u = 0; u < 4; u++) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    bt_epilogue(C, acc, i0, mr, mode, masked, lo, hi, sub, c, P);
}

ALWAYS_INLINE void bt_rows(float *C, const float *A, int lda, const float *Bt, int M, int D,
                           int mode, int masked, const int *lo, const int *hi, const float *sub,
                           float c, const float *P) {
    int i = 0;
#define BT_CALL(MM, MASKED) bt_tile(C, A, lda, Bt, D, i, MM, mode, MASKED, lo, hi, sub, c, P)
    FOR_MR_TILES(i, M, BT_CALL, masked);
#undef BT_CALL
}

/* P[M][ATT_BK] = 2^(A Bt c - lse2_i), masked to each row's visible keys when lo != NULL. */
static void bwd_probs(float *P, const float *A, int lda, const float *Bt, int M, int D,
                      const int *lo, const int *hi, const float *lse2, float c) {
    if (lo) bt_rows(P, A, lda, Bt, M, D, 0, 1, lo, hi, lse2, c, NULL);
    else bt_rows(P, A, lda, Bt, M, D, 0, 0, NULL, NULL, lse2, c, NULL);
}

/* dS[M][ATT_BK] = P (A Bt - Di_i) scale */
static void bwd_dscores(float *dS, const float *A, int lda, const float *Bt, int M, int D,
                        const float *Di, float scale, const float *P) {
    bt_rows(dS, A, lda, Bt, M, D, 1, 0, NULL, NULL, Di, scale, P);
}

/* mr x (16 nv) tile of C (+)= A B over K; columns masked by mk; first: C not read. */
ALWAYS_INLINE void nn_tile(float *C, int ldc, const float *A, int ars, int acs, const float *B,
                           int ldb, int K, const __mmask16 *mk, int mr, int nv, int first) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++)
            acc[r][u] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[u], C + (size_t)r * ldc + 16 * u);
    for (int kk = 0; kk < K; kk++) {
        __m512 b[4];
        for (int u = 0; u < nv; u++)
            b[u] = _mm512_maskz_loadu_ps(mk[u], B + (size_t)kk * ldb + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[(size_t)r * ars + (size_t)kk * acs]);
            for (int u = 0; u < nv; u++) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++)
            _mm512_mask_storeu_ps(C + (size_t)r * ldc + 16 * u, mk[u], acc[r][u]);
}

#define NN_TILE(MM, NVV, FIRST) \
    nn_tile(C + (size_t)r_ * ldc + c0, ldc, A + (size_t)r_ * ars, ars, acs, B + c0, ldb, K, mk, MM, NVV, FIRST)
#define NN_ROWS(NVV, FIRST) do { int r_ = 0; FOR_MR_TILES(r_, M, NN_TILE, NVV, FIRST); } while (0)

/* ROWS(nv, first) with both as constants, from the variables nv (1..4) and first */
#define NV_FIRST_DISPATCH(ROWS) do { \
    if (first) { \
        if (nv == 4) ROWS(4, 1); else if (nv == 3) ROWS(3, 1); else if (nv == 2) ROWS(2, 1); else ROWS(1, 1); \
    } else { \
        if (nv == 4) ROWS(4, 0); else if (nv == 3) ROWS(3, 0); else if (nv == 2) ROWS(2, 0); else ROWS(1, 0); \
    } } while (0)

/* C[M][D] (row stride ldc) (+)= A . B[K][D] (row stride ldb), where A's element (m, k) is
 * A[m * ars + k * acs] (ars = row stride, or acs = row stride for A transposed); with
 * first, C is overwritten (not read). */
static void mm_nn(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb,
                  int M, int K, int D, int first) {
    for (int c0 = 0; c0 < D; c0 += 64) {
        int w = D - c0 < 64 ? D - c0 : 64, nv = (w + 15) / 16;
        __mmask16 mk[4];
        for (int u = 0; u < 4; u++) mk[u] = range_mask(16 * u, 0, w);
        NV_FIRST_DISPATCH(NN_ROWS);
    }
}

#else /* AVX2 + FMA: the same primitives on 8-lane registers */

/* A tile is MR rows x 16 columns (two ymm; 12 accumulators of 16 registers for 6 rows), so
 * a 64-column block is four strips; the strips read the rows of A four times, from L1. */
#define AW 16 /* columns of a tile */
#define AU 2  /* ymm per tile row */

/* integer lanes j0 + 0..7 */
ALWAYS_INLINE __m256i lanes_from(int j0) {
    return _mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* all-ones lanes where lo <= lanes < hi (per lane bounds, or broadcast) */
ALWAYS_INLINE __m256 in_range(__m256i lanes, __m256i lo, __m256i hi) {
    __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(lo, lanes), _mm256_cmpgt_epi32(hi, lanes));
    return _mm256_castsi256_ps(in);
}

/* St rows j0..j0+mr-1, columns q0..q0+15: K rows . Qt; masked: queries whose range excludes
 * the key get -inf; folds the rows into the strip's column max mx[2]. */
ALWAYS_INLINE void st_tile(float *St, const float *K, int ldk, const float *Qt, int D, int j0, int q0, int mr,
                           int masked, const __m256i *lo, const __m256i *hi, __m256 *mx) {
    __m256 acc[ATT_MR][AU];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < AU; u++) acc[r][u] = _mm256_setzero_ps();
    const float *kr = K + (size_t)j0 * ldk;
    for (int c = 0; c < D; c++) {
        __m256 b[AU];
        for (int u = 0; u < AU; u++) b[u] = _mm256_load_ps(Qt + (size_t)c * ATT_BQ + q0 + 8 * u);
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_broadcast_ss(kr + (size_t)r * ldk + c);
            for (int u = 0; u < AU; u++) acc[r][u] = _mm256_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < AU; u++) {
            __m256 x = acc[r][u];
            if (masked) /* key j0 + r is in query i's range: lo_i <= j0 + r < hi_i */
                x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, in_range(_mm256_set1_epi32(j0 + r), lo[u], hi[u]));
            _mm256_store_ps(St + (size_t)(j0 + r) * ATT_BQ + q0 + 8 * u, x);
            mx[u] = _mm256_max_ps(mx[u], x);
        }
}

static void fwd_scores(float *St, float *bm, const float *K, int ldk, const float *Qt, int nk,
                       int D, const int32_t *lo, const int32_t *hi) {
    for (int q0 = 0; q0 < ATT_BQ; q0 += AW) {
        __m256 mx[AU];
        __m256i lv[AU], hv[AU];
        for (int u = 0; u < AU; u++) {
            mx[u] = _mm256_set1_ps(-INFINITY);
            if (lo) {
                lv[u] = _mm256_loadu_si256((const __m256i *)(lo + q0 + 8 * u));
                hv[u] = _mm256_loadu_si256((const __m256i *)(hi + q0 + 8 * u));
            }
        }
        int j = 0;
#define ST_CALL(M, MASKED) st_tile(St, K, ldk, Qt, D, j, q0, M, MASKED, lv, hv, mx)
        FOR_MR_TILES_FLAG(lo != NULL, j, nk, ST_CALL);
#undef ST_CALL
        for (int u = 0; u < AU; u++) _mm256_store_ps(bm + q0 + 8 * u, mx[u]);
    }
}

static void fwd_softmax(float *St, float *m, float *l, float *alpha, const float *bm, int nk) {
    for (int q = 0; q < ATT_BQ; q += 8) {
        __m256 mo = _mm256_load_ps(m + q), mn = _mm256_max_ps(mo, _mm256_load_ps(bm + q));
        __m256 none = _mm256_cmp_ps(mn, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
        __m256 ms = _mm256_blendv_ps(mn, _mm256_setzero_ps(), none);
        __m256 al = mt_exp2_256(_mm256_sub_ps(mo, ms));
        _mm256_store_ps(alpha + q, al);
        _mm256_store_ps(m + q, mn);
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < nk; j++) {
            float *sp = St + (size_t)j * ATT_BQ + q;
            __m256 p = mt_exp2_256(_mm256_sub_ps(_mm256_load_ps(sp), ms));
            _mm256_store_ps(sp, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_store_ps(l + q, _mm256_fmadd_ps(_mm256_load_ps(l + q), al, sum));
    }
}

/* Ot rows d0..d0+mr-1, columns q0..q0+15 = Ot alpha (or 0 when first) + V[:, d0..]^T St */
ALWAYS_INLINE void ot_tile(float *Ot, const float *V, int ldv, const float *St, int nk, int d0, int q0, int mr,
                           int first, const float *alpha) {
    __m256 acc[ATT_MR][AU];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < AU; u++)
            acc[r][u] = first ? _mm256_setzero_ps()
                              : _mm256_mul_ps(_mm256_load_ps(Ot + (size_t)(d0 + r) * ATT_BQ + q0 + 8 * u),
                                              _mm256_load_ps(alpha + q0 + 8 * u));
    const float *vr = V + d0;
    for (int j = 0; j < nk; j++) {
        __m256 b[AU];
        for (int u = 0; u < AU; u++) b[u] = _mm256_load_ps(St + (size_t)j * ATT_BQ + q0 + 8 * u);
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_broadcast_ss(vr + (size_t)j * ldv + r);
            for (int u = 0; u < AU; u++) acc[r][u] = _mm256_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < AU; u++) _mm256_store_ps(Ot + (size_t)(d0 + r) * ATT_BQ + q0 + 8 * u, acc[r][u]);
}

static void fwd_pv(float *Ot, const float *V, int ldv, const float *St, int nk, int D, int first,
                   const float *alpha) {
    for (int q0 = 0; q0 < ATT_BQ; q0 += AW) {
        int d = 0;
#define OT_CALL(M, FIRST) ot_tile(Ot, V, ldv, St, nk, d, q0, M, FIRST, alpha)
        FOR_MR_TILES_FLAG(first, d, D, OT_CALL);
#undef OT_CALL
    }
}

/* rows i0..i0+mr-1, columns c0..c0+15 of X = A Bt (Bt[D][ATT_BK]) and the epilogue of the
 * AVX-512 bt_epilogue: mode 0 P = 2^(X c - sub_i) on [lo_i, hi_i) (masked; else all), 0
 * elsewhere; mode 1 dS = P (X - sub_i) scale */
ALWAYS_INLINE void bt_tile(float *C, const float *A, int lda, const float *Bt, int D, int i0, int c0, int mr,
                           int mode, int masked, const int *lo, const int *hi, const float *sub, float c,
                           const float *P) {
    __m256 acc[ATT_MR][AU];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < AU; u++) acc[r][u] = _mm256_setzero_ps();
    const float *ar = A + (size_t)i0 * lda;
    for (int k = 0; k < D; k++) {
        __m256 b[AU];
        for (int u = 0; u < AU; u++) b[u] = _mm256_load_ps(Bt + (size_t)k * ATT_BK + c0 + 8 * u);
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_broadcast_ss(ar + (size_t)r * lda + k);
            for (int u = 0; u < AU; u++) acc[r][u] = _mm256_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    const __m256 cv = _mm256_set1_ps(c);
    for (int r = 0; r < mr; r++) {
        int i = i0 + r;
        __m256 sv = _mm256_set1_ps(sub[i]);
        for (int u = 0; u < AU; u++) {
            float *dst = C + (size_t)i * ATT_BK + c0 + 8 * u;
            __m256 x;
            if (mode == 0) {
                x = mt_exp2_256(_mm256_fmsub_ps(acc[r][u], cv, sv));
                if (masked)
                    x = _mm256_and_ps(x, in_range(lanes_from(c0 + 8 * u), _mm256_set1_epi32(lo[i]),
                                                  _mm256_set1_epi32(hi[i])));
            } else {
                x = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(acc[r][u], sv), cv),
                                  _mm256_load_ps(P + (size_t)i * ATT_BK + c0 + 8 * u));
            }
            _mm256_store_ps(dst, x);
        }
    }
}

static void bt_rows(float *C, const float *A, int lda, const float *Bt, int M, int D, int mode,
                    const int *lo, const int *hi, const float *sub, float c, const float *P) {
    for (int c0 = 0; c0 < ATT_BK; c0 += AW) {
        int i = 0;
#define BT_CALL(MM, MASKED) bt_tile(C, A, lda, Bt, D, i, c0, MM, mode, MASKED, lo, hi, sub, c, P)
        FOR_MR_TILES_FLAG(lo != NULL, i, M, BT_CALL);
#undef BT_CALL
    }
}

static void bwd_probs(float *P, const float *A, int lda, const float *Bt, int M, int D,
                      const int *lo, const int *hi, const float *lse2, float c) {
    bt_rows(P, A, lda, Bt, M, D, 0, lo, hi, lse2, c, NULL);
}

static void bwd_dscores(float *dS, const float *A, int lda, const float *Bt, int M, int D,
                        const float *Di, float scale, const float *P) {
    bt_rows(dS, A, lda, Bt, M, D, 1, NULL, NULL, Di, scale, P);
}

/* mr x (8 nv) tile of C (+)= A B over K, columns masked by mk; first: C not read */
ALWAYS_INLINE void nn_tile(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb, int K,
                           const __m256i *mk, int mr, int nv, int first) {
    __m256 acc[ATT_MR][AU];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++)
            acc[r][u] = first ? _mm256_setzero_ps() : _mm256_maskload_ps(C + (size_t)r * ldc + 8 * u, mk[u]);
    for (int kk = 0; kk < K; kk++) {
        __m256 b[AU];
        for (int u = 0; u < nv; u++) b[u] = _mm256_maskload_ps(B + (size_t)kk * ldb + 8 * u, mk[u]);
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_broadcast_ss(A + (size_t)r * ars + (size_t)kk * acs);
            for (int u = 0; u < nv; u++) acc[r][u] = _mm256_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++) _mm256_maskstore_ps(C + (size_t)r * ldc + 8 * u, mk[u], acc[r][u]);
}

#define NN_TILE(MM, NVV, FIRST) \
    nn_tile(C + (size_t)r_ * ldc + c0, ldc, A + (size_t)r_ * ars, ars, acs, B + c0, ldb, K, mk, MM, NVV, FIRST)
#define NN_ROWS(NVV, FIRST) do { int r_ = 0; FOR_MR_TILES(r_, M, NN_TILE, NVV, FIRST); } while (0)

static void mm_nn(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb,
                  int M, int K, int D, int first) {
    for (int c0 = 0; c0 < D; c0 += AW) {
        int w = D - c0 < AW ? D - c0 : AW, nv = (w + 7) / 8;
        __m256i mk[AU];
        for (int u = 0; u < AU; u++) mk[u] = _mm256_castps_si256(in_range(lanes_from(8 * u), _mm256_setzero_si256(),
                                                                          _mm256_set1_epi32(w)));
        if (first) {
            if (nv == 2) NN_ROWS(2, 1); else NN_ROWS(1, 1);
        } else {
            if (nv == 2) NN_ROWS(2, 0); else NN_ROWS(1, 0);
        }
    }
}

#endif

#if defined(__AVX512BF16__)
#include "kernels/bf16_pack.h"
/* ---- mixed precision (train --bf16): every product on bf16 pairs ----
 * Forward scores and P V, backward P, dP, dV += P^T dO, dK += dS^T Q and dQ += dS K
 * multiply bf16 pairs with fp32 sums (VDPBF16PS), as the GEMMs do in that mode. A pair is
 * two consecutive values along the summed index packed in one 32-bit word: q and dO once
 * per head, K and V once per key block, P and dS per block, each in the layout its product
 * reads. Masks, softmax, log-sum-exp and the accumulators stay fp32. */
#define ATT_BF16 1

/* out[p*W + c] = pair(X[2p][c], X[2p+1][c]) (X row stride ldx) for p < (nrows+1)/2, c < W
 * (W a multiple of 16); a missing last row reads as zero. The GEMM's packing (rowmaj). */
static void pair_rows(uint32_t *out, int W, const float *X, int ldx, int nrows) {
    mt_bf16_pack_panel(out, W, X, ldx, 1, 0, nrows, 0, W);
}

/* out[i*(W/2) + p] = pair(X[i][2p], X[i][2p+1]) for i < n (W a multiple of 16): rows
 * converted in place order. */
static void pair_cols(uint32_t *out, int W, const float *X, int ldx, int n) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < W; c += 32) {
            const float *x = X + (size_t)i * ldx + c;
            int two = W - c >= 32; /* else 16 floats left: 8 words */
            __m512 hi = two ? _mm512_loadu_ps(x + 16) : _mm512_setzero_ps();
            __m512i v = mt_bf16_pairs(_mm512_loadu_ps(x), hi);
            _mm512_mask_storeu_epi32(out + (size_t)i * (W / 2) + c / 2, two ? 0xffff : 0x00ff, v);
        }
}

/* mr x (16 nv) tile of C (+)= A B over pairs p0 <= p < p1: A word (r, p) at A[r*ars + p*aps],
 * B words [p][ldb]; first: C not read. */
ALWAYS_INLINE void nn_tile_bf16(float *C, int ldc, const uint32_t *A, size_t ars, size_t aps, const uint32_t *B,
                                int ldb, int p0, int p1, int mr, int nv, int first) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++) acc[r][u] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(C + (size_t)r * ldc + 16 * u);
    for (int p = p0; p < p1; p++) {
        __m512bh b[4];
        for (int u = 0; u < nv; u++) b[u] = (__m512bh)_mm512_loadu_si512(B + (size_t)p * ldb + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[(size_t)r * ars + (size_t)p * aps]);
            for (int u = 0; u < nv; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], a, b[u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++) _mm512_storeu_ps(C + (size_t)r * ldc + 16 * u, acc[r][u]);
}

#define NN16_TILE(MM, NVV, FIRST) \
    nn_tile_bf16(C + (size_t)r_ * ldc + c0, ldc, A + (size_t)r_ * ars, ars, aps, B + c0, ldb, \
                 diag > 0 ? r_ / 2 : 0, diag < 0 && (r_ + (MM) - 1) / 2 + 1 < kp ? (r_ + (MM) - 1) / 2 + 1 : kp, \
                 MM, NVV, FIRST)
#define NN16_ROWS(NVV, FIRST) do { int r_ = 0; FOR_MR_TILES(r_, M, NN16_TILE, NVV, FIRST); } while (0)

/* C[M][D] (row stride ldc) (+)= A B: A word (m, p) at A[m*ars + p*aps], B words [kp][D]
 * (ldb = D); D a multiple of 16. On a diagonal block (the key block at the query block's
 * start) the causal mask zeroes A's words of keys after the query, and the products skip
 * them: diag > 0, rows are keys and pairs queries (dV, dK): row m needs the pairs from m/2;
 * diag < 0, rows are queries and pairs keys (dQ): row m needs the pairs up to m/2. */
static void mm_nn_bf16(float *C, int ldc, const uint32_t *A, size_t ars, size_t aps, const uint32_t *B, int M,
                       int kp, int D, int first, int diag) {
    const int ldb = D;
    for (int c0 = 0; c0 < D; c0 += 64) {
        int nv = (D - c0) / 16 < 4 ? (D - c0) / 16 : 4;
        NV_FIRST_DISPATCH(NN16_ROWS);
    }
}
#undef NN16_ROWS
#undef NN16_TILE

/* out[p*ATT_BK + j] = pair(X[j][2p], X[j][2p+1]) (X row stride ldx) for j < nk, p < D/2,
 * zero for nk <= j < ATT_BK: a key block transposed into pairs along D. The GEMM's packing
 * (16 keys x 16 pairs per register transpose). */
static void pair_t(uint32_t *out, const float *X, int ldx, int nk, int D) {
    mt_bf16_pack_panel(out, ATT_BK, X, ldx, 0, 0, D, 0, nk);
}

/* ---- the same layouts from K and V already stored as bf16 (train --bf16 keeps them so:
 * every product reads them rounded, so the stored halves give the same bits) ---- */

/* Kr [n][D/2] words = the rows themselves (pairs along D are consecutive bf16) */
static void pair_cols16(uint32_t *out, const uint16_t *X, int ldx, int n, int D) {
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * (D / 2), X + (size_t)i * ldx, sizeof(uint16_t) * D);
}

/* pair_rows from bf16 rows: out[p*W + c] = (X[2p][c], X[2p+1][c]), a missing last row zero */
static void pair_rows16(uint32_t *out, int W, const uint16_t *X, int ldx, int nrows) {
    static const uint16_t ilo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t ihi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i lo = _mm512_loadu_si512(ilo), hi = _mm512_loadu_si512(ihi);
    for (int p = 0; p < (nrows + 1) / 2; p++) {
        const uint16_t *r0 = X + (size_t)2 * p * ldx, *r1 = r0 + ldx;
        const int have1 = 2 * p + 1 < nrows;
        uint32_t *o = out + (size_t)p * W;
        for (int c = 0; c < W; c += 32) {
            const int two = W - c >= 32; /* else 16 values left */
            const __mmask32 m = two ? 0xffffffffu : 0xffffu;
            __m512i a = _mm512_maskz_loadu_epi16(m, r0 + c);
            __m512i b = have1 ? _mm512_maskz_loadu_epi16(m, r1 + c) : _mm512_setzero_si512();
            _mm512_storeu_si512(o + c, _mm512_permutex2var_epi16(a, lo, b));
            if (two) _mm512_storeu_si512(o + c + 16, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* pair_t from bf16 rows: out[p*ATT_BK + j] = word p of row j, zero for nk <= j < ATT_BK
 * (a 16 x 16 transpose of 32-bit words per step) */
static void pair_t16(uint32_t *out, const uint16_t *X, int ldx, int nk, int D) {
    const int np = D / 2;
    for (int j0 = 0; j0 < ATT_BK; j0 += 16)
        for (int p0 = 0; p0 < np; p0 += 16) {
            const int w = np - p0 < 16 ? np - p0 : 16;
            const __mmask16 m = (__mmask16)((1u << w) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < nk ? _mm512_maskz_loadu_epi32(m, X + (size_t)(j0 + i) * ldx + 2 * p0)
                                   : _mm512_setzero_si512();
            mt_transpose16(r);
            for (int pp = 0; pp < w; pp++) _mm512_storeu_si512(out + (size_t)(p0 + pp) * ATT_BK + j0, r[pp]);
        }
}

/* The score-like tiles of bt_tile with the product on bf16 pairs: A words [rows][D/2]
 * (pairs along D), Bt words [D/2][ATT_BK]. */
ALWAYS_INLINE void bt_tile_bf16(float *C, const uint32_t *A, const uint32_t *Bt, int kp, int i0, int mr, int mode,
                                int masked, const int *lo, const int *hi, const float *sub, float c,
                                const float *P) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = _mm512_setzero_ps();
    const uint32_t *ar = A + (size_t)i0 * kp;
    for (int p = 0; p < kp; p++) {
        __m512bh b[4];
        for (int u = 0; u < 4; u++) b[u] = (__m512bh)_mm512_loadu_si512(Bt + (size_t)p * ATT_BK + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ar[(size_t)r * kp + p]);
            for (int u = 0; u < 4; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], a, b[u]);
        }
    }
    bt_epilogue(C, acc, i0, mr, mode, masked, lo, hi, sub, c, P);
}

ALWAYS_INLINE void bt_rows_bf16(float *C, const uint32_t *A, const uint32_t *Bt, int M, int D, int mode, int masked,
                                const int *lo, const int *hi, const float *sub, float c, const float *P) {
    int i = 0, kp = D / 2;
#define BT16_CALL(MM, MASKED) bt_tile_bf16(C, A, Bt, kp, i, MM, mode, MASKED, lo, hi, sub, c, P)
    FOR_MR_TILES(i, M, BT16_CALL, masked);
#undef BT16_CALL
}

/* bwd_probs and bwd_dscores with A (q or dO rows) and Bt (K or V block) as bf16 pairs; the
 * q pairs come scaled by log2(e)/sqrt(D), as the forward rounds them, so the scores need no
 * scale */
static void bwd_probs_bf16(float *P, const uint32_t *A, const uint32_t *Bt, int M, int D, const int *lo,
                           const int *hi, const float *lse2) {
    if (lo) bt_rows_bf16(P, A, Bt, M, D, 0, 1, lo, hi, lse2, 1.0f, NULL);
    else bt_rows_bf16(P, A, Bt, M, D, 0, 0, NULL, NULL, lse2, 1.0f, NULL);
}

static void bwd_dscores_bf16(float *dS, const uint32_t *A, const uint32_t *Bt, int M, int D, const float *Di,
                             float scale, const float *P) {
    bt_rows_bf16(dS, A, Bt, M, D, 1, 0, NULL, NULL, Di, scale, P);
}

/* Forward on pairs: scores from K words [nk][D/2] and Qt words [D/2][ATT_BQ]; the output
 * from V words [nk/2][D] (pairs along keys) and the probabilities' words [nk/2][ATT_BQ]. */
ALWAYS_INLINE void st_tile_bf16(float *St, const uint32_t *K, const uint32_t *Qt, int kp, int j0, int mr, int masked,
                                const __m512i *lo, const __m512i *hi, __m512 *mx) {
    __m512 acc[ATT_MR][NV];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++) acc[r][u] = _mm512_setzero_ps();
    const uint32_t *kr = K + (size_t)j0 * kp;
    for (int p = 0; p < kp; p++) {
        __m512bh b[NV];
        for (int u = 0; u < NV; u++) b[u] = (__m512bh)_mm512_loadu_si512(Qt + (size_t)p * ATT_BQ + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)kr[(size_t)r * kp + p]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], a, b[u]);
        }
    }
    st_epilogue(St, acc, j0, mr, masked, lo, hi, mx);
}

static void fwd_scores_bf16(float *St, float *bm, const uint32_t *K, const uint32_t *Qt, int nk, int D,
                            const int32_t *lo, const int32_t *hi) {
    __m512 mx[NV];
    __m512i lv[NV], hv[NV];
    const int kp = D / 2, masked = lo != NULL;
    for (int u = 0; u < NV; u++) {
        mx[u] = _mm512_set1_ps(-INFINITY);
        lv[u] = masked ? _mm512_loadu_si512(lo + 16 * u) : _mm512_setzero_si512();
        hv[u] = masked ? _mm512_loadu_si512(hi + 16 * u) : _mm512_setzero_si512();
    }
    int j = 0;
#define ST16_CALL(M, MASKED) st_tile_bf16(St, K, Qt, kp, j, M, MASKED, lv, hv, mx)
    FOR_MR_TILES_FLAG(masked, j, nk, ST16_CALL);
#undef ST16_CALL
    for (int u = 0; u < NV; u++) _mm512_store_ps(bm + 16 * u, mx[u]);
}

ALWAYS_INLINE void ot_tile_bf16(float *Ot, const uint32_t *V, const uint32_t *St, int kp, int D, int d0, int mr,
                                int first, const float *alpha) {
    __m512 acc[ATT_MR][NV];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++)
            acc[r][u] = first ? _mm512_setzero_ps()
                              : _mm512_mul_ps(_mm512_load_ps(Ot + (size_t)(d0 + r) * ATT_BQ + 16 * u),
                                              _mm512_load_ps(alpha + 16 * u));
    for (int p = 0; p < kp; p++) {
        __m512bh b[NV];
        for (int u = 0; u < NV; u++) b[u] = (__m512bh)_mm512_loadu_si512(St + (size_t)p * ATT_BQ + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)V[(size_t)p * D + d0 + r]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], a, b[u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < NV; u++) _mm512_store_ps(Ot + (size_t)(d0 + r) * ATT_BQ + 16 * u, acc[r][u]);
}

static void fwd_pv_bf16(float *Ot, const uint32_t *V, const uint32_t *St, int nk, int D, int first,
                        const float *alpha) {
    const int kp = (nk + 1) / 2;
    int d = 0;
#define OT16_CALL(M, FIRST) ot_tile_bf16(Ot, V, St, kp, D, d, M, FIRST, alpha)
    FOR_MR_TILES_FLAG(first, d, D, OT16_CALL);
#undef OT16_CALL
}
#endif

static int g_diag_skip = 1;

void mt_attention_set_diag_skip(int on) { g_diag_skip = on != 0; }

int mt_attention_bf16_built(void) {
#if defined(ATT_BF16)
    return 1;
#else
    return 0;
#endif
}

/* 1 when attention runs on bf16 pairs: the GEMMs' bf16 mode, a build with AVX512-BF16, and
 * D a multiple of 16 (the pair layouts' vectors) */
int mt_attention_bf16(int gemm_bf16, int D) {
#if defined(ATT_BF16)
    return gemm_bf16 && D % 16 == 0;
#else
    (void)gemm_bf16;
    (void)D;
    return 0;
#endif
}


/* Scratch words of the bf16 forward per thread (0 without it): K of a key block in pairs
 * along D, V in pairs along keys, the probabilities in pairs along keys. */
static size_t fwd_bf16_floats(int D) {
#if defined(ATT_BF16)
    return (size_t)ATT_BK * D + (size_t)ATT_BK * ATT_BQ / 2 + 64;
#else
    (void)D;
    return 0;
#endif
}

/* Scratch words of the bf16 backward per thread (0 without it): q and dO of one head in
 * pairs along T and along D, K of a key block in pairs along keys, K and V in pairs along D,
 * P and dS in two pair layouts. */
static size_t bwd_bf16_floats(int T, int D) {
#if defined(ATT_BF16)
    return 2 * (size_t)((T + 2) / 2) * D + (size_t)T * D + (size_t)ATT_BK / 2 * D + (size_t)ATT_BK * D +
           3 * (size_t)ATT_BQ * ATT_BK / 2 + 64;
#else
    (void)T;
    (void)D;
    return 0;
#endif
}

/* Bt[D][ATT_BK] = X[nk][D]^T (X row stride ld), columns nk..ATT_BK-1 zero. */
static void pack_t(float *Bt, const float *X, int ld, int nk, int D) {
    for (int n = 0; n < nk; n++)
        for (int c = 0; c < D; c++) Bt[(size_t)c * ATT_BK + n] = X[(size_t)n * ld + c];
    for (int c = 0; c < D; c++)
        for (int n = nk; n < ATT_BK; n++) Bt[(size_t)c * ATT_BK + n] = 0.0f;
}

/* dst[c*ldd + i] = src[i*lds + c] * (cs ? cs[c] : s) for i < rows, c < cols: a block
 * transposed (and scaled per source column) in 16 x 16 register tiles. The scalar loop it
 * replaced read or wrote one float per cycle or slower and took a third of the forward. */
static void transpose_scale(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols,
                            const float *cs, float s) {
#ifdef __AVX512F__
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int nr = rows - r0 < 16 ? rows - r0 : 16;
        __mmask16 mr = (__mmask16)((1u << nr) - 1u);
        for (int c0 = 0; c0 < cols; c0 += 16) {
            int nc = cols - c0 < 16 ? cols - c0 : 16;
            __mmask16 mc = (__mmask16)((1u << nc) - 1u);
            __m512 sc = cs ? _mm512_maskz_loadu_ps(mc, cs + c0) : _mm512_set1_ps(s);
            __m512i t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(mc, src + (r0 + i) * lds + c0), sc))
                              : _mm512_setzero_si512();
            mt_transpose16(t);
            for (int j = 0; j < nc; j++) _mm512_mask_storeu_ps(dst + (c0 + j) * ldd + r0, mr, _mm512_castsi512_ps(t[j]));
        }
    }
#else
    for (int r0 = 0; r0 < rows; r0 += 8) {
        int nr = rows - r0 < 8 ? rows - r0 : 8;
        for (int c0 = 0; c0 < cols; c0 += 8) {
            int nc = cols - c0 < 8 ? cols - c0 : 8;
            if (nr < 8 || nc < 8) { /* an edge block */
                for (int i = 0; i < nr; i++)
                    for (int c = 0; c < nc; c++)
                        dst[(c0 + c) * ldd + r0 + i] = src[(r0 + i) * lds + c0 + c] * (cs ? cs[c0 + c] : s);
                continue;
            }
            __m256 sc = cs ? _mm256_loadu_ps(cs + c0) : _mm256_set1_ps(s), t[8], u[8];
            for (int i = 0; i < 8; i++) t[i] = _mm256_mul_ps(_mm256_loadu_ps(src + (r0 + i) * lds + c0), sc);
            for (int i = 0; i < 8; i += 2) {
                u[i] = _mm256_unpacklo_ps(t[i], t[i + 1]);
                u[i + 1] = _mm256_unpackhi_ps(t[i], t[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                t[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
                t[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xee);
                t[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                t[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xee);
            }
            /* t[0..3] hold columns 0,1,2,3 (low lanes) and 4,5,6,7 (high) of rows 0-3; t[4..7] of rows 4-7 */
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (c0 + i) * ldd + r0, _mm256_permute2f128_ps(t[i], t[i + 4], 0x20));
                _mm256_storeu_ps(dst + (c0 + i + 4) * ldd + r0, _mm256_permute2f128_ps(t[i], t[i + 4], 0x31));
            }
        }
    }
#endif
}

/* Y[n][D] = X[n][D] (X row stride ld): a block of rows made contiguous, so the micro-
 * kernels stream it without the cache-set conflicts of the 4*G*D-byte row stride. */
static void copy_rows(float *Y, const float *X, int ld, int n, int D) {
    for (int i = 0; i < n; i++) memcpy(Y + (size_t)i * D, X + (size_t)i * ld, sizeof(float) * D);
}

/* The keys of block [k0, k0+nk) that query row t0+i sees, relative to k0, as the
 * half-open range [lo[i], hi[i]) (empty when lo >= hi), for i < nq; rows nq..ATT_BQ-1
 * get empty ranges. pb: the row's positions or NULL. Returns 0 when no row sees any key
 * of the block, 2 when every row i < nq sees all ATT_BK keys (no masking needed), else 1.
 * *first (when not NULL): 1 when no row sees a key before k0, so that a seen block is the
 * first one the rows see. */
static int block_ranges(int32_t *lo, int32_t *hi, const int32_t *pb, int t0, int nq, int k0, int nk, int *first) {
    int any = 0, full = nk == ATT_BK, before = 0;
    for (int i = 0; i < nq; i++) {
        int t = t0 + i, a = (pb ? t - pb[t] : 0) - k0, e = t - k0 + 1;
        lo[i] = a > 0 ? a : 0;
        hi[i] = e < nk ? e : nk;
        any |= lo[i] < hi[i];
        full &= lo[i] == 0 && hi[i] == ATT_BK;
        before |= a < 0;
    }
    for (int i = nq; i < ATT_BQ; i++) lo[i] = hi[i] = 0;
    if (first) *first = !before;
    return any ? 1 + full : 0;
}

/* Forward state of one query block: Qt[D][BQ], Ot[D][BQ], m[BQ], l[BQ] + first flag,
 * padded to 64 bytes. */
static size_t fwd_qblock_floats(int D) { return 2 * (size_t)D * ATT_BQ + 2 * ATT_BQ + 16; }

size_t mt_attention_scratch_floats(int T, int D) {
    size_t Dp = (size_t)round16(D);
    size_t fwd = (size_t)ATT_BK * ATT_BQ + 2 * ATT_BQ + ATT_QG * fwd_qblock_floats(D) +
                 2 * (size_t)ATT_BK * Dp + fwd_bf16_floats(D);
    size_t bwd = 3 * (size_t)D * ATT_BK + 2 * (size_t)T * D + 2 * (size_t)ATT_BQ * ATT_BK +
                 2 * (size_t)T + ATT_BQ + bwd_bf16_floats(T, D);
    return (fwd > bwd ? fwd : bwd) + 16; /* + room to align to 64 bytes */
}

/* Asserts 0 <= pos[t] <= t for the B rows (the masks rely on it). */
static void check_pos(const int32_t *pos, int B, int T) {
    if (!pos) return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) MT_ASSERT(pos[(size_t)b * T + t] >= 0 && pos[(size_t)b * T + t] <= t);
}

/* k, v fp32, or (bf16 mode only) k16, v16. Dk: width of q and k, Dv: of v and out (the same
 * for GQA; MLA's q/k carry the RoPE part, its v does not). The scratch is laid out for the
 * wider of the two. */
static void attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const uint16_t *k16,
                     const uint16_t *v16, const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv,
                     float *scratch, int nthr, int gemm_bf16) {
    MT_ASSERT(B >= 0 && T >= 0 && G > 0 && H % G == 0 && Dk > 0 && Dk % 2 == 0 && Dv > 0 && nthr >= 1);
    const int bf16 = mt_attention_bf16(gemm_bf16, Dk) && mt_attention_bf16(gemm_bf16, Dv);
    MT_ASSERT(!k16 || bf16);
    check_pos(pos, B, T);
    const int Dm = Dk > Dv ? Dk : Dv;
    const int rep = H / G, nqb = (T + ATT_BQ - 1) / ATT_BQ, nbh = B * H;
    const int ngr = (nqb + ATT_QG - 1) / ATT_QG;
    const float c2 = LOG2E / sqrtf((float)Dk); /* scores in base 2 */
    const size_t per = mt_attention_scratch_floats(T, Dm), qstride = fwd_qblock_floats(Dm);
    /* one task per group of ATT_QG query blocks of each (b, h), the costliest (last)
     * groups first so the dynamic schedule ends balanced */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < ngr * nbh; task++) {
        int gr = ngr - 1 - task / nbh, b = task % nbh / H, h = task % H, g = h / rep;
        float *St = align64(scratch + (size_t)omp_get_thread_num() * per);
        float *bm = St + (size_t)ATT_BK * ATT_BQ, *alpha = bm + ATT_BQ, *Kc = alpha + ATT_BQ;
        float *Vc = Kc + (size_t)ATT_BK * round16(Dm), *blk = Vc + (size_t)ATT_BK * round16(Dm);
#if defined(ATT_BF16)
        /* after the query blocks' state: K pairs along D [BK][Dk/2], V pairs along keys
         * [BK/2][Dv], probabilities pairs along keys [BK/2][BQ] */
        uint32_t *Kr = align64(blk + (size_t)ATT_QG * qstride), *Vp = Kr + (size_t)ATT_BK * Dm / 2;
        uint32_t *St2 = Vp + (size_t)ATT_BK / 2 * Dm;
#endif
        int32_t lo[ATT_BQ], hi[ATT_BQ];
        const int32_t *pb = pos ? pos + (size_t)b * T : NULL;
        int qb0 = gr * ATT_QG, qb1 = qb0 + ATT_QG < nqb ? qb0 + ATT_QG : nqb;
        int t0g = qb0 * ATT_BQ, tend = qb1 * ATT_BQ < T ? qb1 * ATT_BQ : T;
        int smin = t0g; /* first key any query of the group sees */
        for (int t = t0g; t < tend; t++)
            if (pb && t - pb[t] < smin) smin = t - pb[t];
        if (!pb) smin = 0;
        /* per query block: Qt[Dk][BQ] (scaled), Ot[Dv][BQ], m, l, first flag */
        for (int qb = qb0; qb < qb1; qb++) {
            float *Qt = blk + (size_t)(qb - qb0) * qstride, *m = Qt + 2 * (size_t)Dm * ATT_BQ, *l = m + ATT_BQ;
            int t0 = qb * ATT_BQ, nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
            const float *qt = q + (((size_t)b * T + t0) * H + h) * Dk;
            transpose_scale(Qt, ATT_BQ, qt, (size_t)H * Dk, nq, Dk, NULL, c2);
            if (nq < ATT_BQ)
                for (int c = 0; c < Dk; c++) memset(Qt + (size_t)c * ATT_BQ + nq, 0, sizeof(float) * (ATT_BQ - nq));
            for (int i = 0; i < ATT_BQ; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
            l[ATT_BQ] = 1.0f; /* first-block flag */
#if defined(ATT_BF16)
            /* bf16: Qt becomes words [Dk/2][BQ] in place (row p of the words is written after
             * rows 2p and 2p+1 of the floats were read) */
            if (bf16) pair_rows((uint32_t *)Qt, ATT_BQ, Qt, ATT_BQ, Dk);
#endif
        }
        for (int k0 = smin / ATT_BK * ATT_BK; k0 < tend; k0 += ATT_BK) {
            int nk = T - k0 < ATT_BK ? T - k0 : ATT_BK;
            const size_t kr0 = ((size_t)b * T + k0) * G + g, k0o = kr0 * Dk, v0o = kr0 * Dv;
            const float *kb = k16 ? NULL : k + k0o, *vb = k16 ? NULL : v + v0o;
            if (!bf16) {
                copy_rows(Kc, kb, G * Dk, nk, Dk);
                copy_rows(Vc, vb, G * Dv, nk, Dv);
            }
#if defined(ATT_BF16)
            else if (k16) {
                pair_cols16(Kr, k16 + k0o, G * Dk, nk, Dk);
                pair_rows16(Vp, Dv, v16 + v0o, G * Dv, nk);
            } else { /* the pair layouts read the rows once, straight from k and v */
                pair_cols(Kr, Dk, kb, G * Dk, nk);
                pair_rows(Vp, Dv, vb, G * Dv, nk);
            }
#endif
            for (int qb = k0 / ATT_BQ > qb0 ? k0 / ATT_BQ : qb0; qb < qb1; qb++) {
                float *Qt = blk + (size_t)(qb - qb0) * qstride, *Ot = Qt + (size_t)Dm * ATT_BQ;
                float *m = Ot + (size_t)Dm * ATT_BQ, *l = m + ATT_BQ;
                int t0 = qb * ATT_BQ, nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
                int kind = block_ranges(lo, hi, pb, t0, nq, k0, nk, NULL);
                if (!kind) continue;
#if defined(ATT_BF16)
                if (bf16) {
                    fwd_scores_bf16(St, bm, Kr, (const uint32_t *)Qt, nk, Dk, kind == 1 ? lo : NULL, hi);
                    fwd_softmax(St, m, l, alpha, bm, nk);
                    pair_rows(St2, ATT_BQ, St, ATT_BQ, nk);
                    fwd_pv_bf16(Ot, Vp, St2, nk, Dv, l[ATT_BQ] != 0.0f, alpha);
                    l[ATT_BQ] = 0.0f;
                    continue;
                }
#endif
                fwd_scores(St, bm, Kc, Dk, Qt, nk, Dk, kind == 1 ? lo : NULL, hi);
                fwd_softmax(St, m, l, alpha, bm, nk);
                fwd_pv(Ot, Vc, Dv, St, nk, Dv, l[ATT_BQ] != 0.0f, alpha); /* Ot = Ot alpha + V^T P^T */
                l[ATT_BQ] = 0.0f;
            }
        }
        /* every query sees itself, so some block was processed and l > 0 */
        for (int qb = qb0; qb < qb1; qb++) {
            float *Ot = blk + (size_t)(qb - qb0) * qstride + (size_t)Dm * ATT_BQ;
            float *m = Ot + (size_t)Dm * ATT_BQ, *l = m + ATT_BQ;
            int t0 = qb * ATT_BQ, nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
            float inv[ATT_BQ];
            for (int i = 0; i < nq; i++) {
                inv[i] = 1.0f / l[i];
                lse[((size_t)b * H + h) * T + t0 + i] = m[i] * LN2 + logf(l[i]);
            }
            transpose_scale(out + (((size_t)b * T + t0) * H + h) * Dv, (size_t)H * Dv, Ot, ATT_BQ, Dv, nq, inv, 1.0f);
        }
    }
}

void mt_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr, int bf16) {
    attn_fwd(out, lse, q, k, v, NULL, NULL, pos, B, T, H, G, D, D, scratch, nthr, bf16);
}

void mt_attention_fwd_kv16(float *out, float *lse, const float *q, const uint16_t *k, const uint16_t *v,
                           const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                           int nthr) {
    attn_fwd(out, lse, q, NULL, NULL, k, v, pos, B, T, H, G, D, D, scratch, nthr, 1);
}

void mt_attention_fwd_dv(float *out, float *lse, const float *q, const float *k, const float *v,
                         const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv, float *scratch,
                         int nthr, int bf16) {
    attn_fwd(out, lse, q, k, v, NULL, NULL, pos, B, T, H, G, Dk, Dv, scratch, nthr, bf16);
}

/* One query over its P keys with attn_fwd's arithmetic for that query: the same scores (q
 * scaled by c2, one FMA chain over D from zero), blocks of ATT_BK keys from key 0, in each
 * the same max, 2^x, running sum (keys in order), rescale and FMA chains of the output, the
 * same 1 / l. The flash kernel's lanes are queries; here they are keys (scores) and output
 * columns, whose per-lane operations are the same, so the bits are mt_attention_fwd's for
 * the last query of a row holding these keys (plain causal or a document starting at key 0). */
size_t mt_attention_row_scratch_floats(int Dk, int Dv) { return ATT_BK + (size_t)Dk + (size_t)Dv; }

void mt_attention_row(float *out, const float *q, const float *Kb, size_t ldkb, const float *V, size_t ldv, int P,
                      int Dk, int Dv, float *scratch) {
    MT_ASSERT(P >= 1 && Dk > 0 && Dv > 0);
    float *sb = scratch, *qs = sb + ATT_BK, *o = qs + Dk; /* one block's scores, q scaled, the output sums */
    const float c2 = LOG2E / sqrtf((float)Dk);
    for (int c = 0; c < Dk; c++) qs[c] = q[c] * c2;
    float m = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 < P; k0 += ATT_BK) {
        const int nk = P - k0 < ATT_BK ? P - k0 : ATT_BK, nv = (nk + MT_VW - 1) / MT_VW;
        mt_vf acc[ATT_BK / MT_VW];
        const float *kb[ATT_BK / MT_VW];
        for (int u = 0; u < nv; u++) {
            acc[u] = mt_vf_zero();
            kb[u] = Kb + (size_t)((k0 + MT_VW * u) / 16) * ldkb + (k0 + MT_VW * u) % 16;
        }
        for (int c = 0; c < Dk; c++) {
            const mt_vf b = mt_vf_set1(qs[c]);
            for (int u = 0; u < nv; u++) acc[u] = mt_vf_fma(mt_vf_load(kb[u] + (size_t)c * 16), b, acc[u]);
        }
        float bm = -INFINITY;
        for (int u = 0; u < nv; u++) mt_vf_store(sb + MT_VW * u, acc[u]);
        for (int j = 0; j < nk; j++) bm = sb[j] > bm ? sb[j] : bm;
        const float mn = m > bm ? m : bm, ms = mn == -INFINITY ? 0.0f : mn;
        const float alpha = mt_vf_first(mt_vf_exp2(mt_vf_set1(m - ms)));
        m = mn;
        for (int u = 0; u < nv; u++) mt_vf_store(sb + MT_VW * u, mt_vf_exp2(mt_vf_sub(mt_vf_load(sb + MT_VW * u), mt_vf_set1(ms))));
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) sum += sb[j];
        l = fmaf(l, alpha, sum);
        for (int d0 = 0; d0 < Dv; d0 += MT_VW) {
            const mt_vmask tm = mt_vf_tail((size_t)(Dv - d0));
            mt_vf y = k0 == 0 ? mt_vf_zero() : mt_vf_mul(mt_vf_load_tail(o + d0, tm), mt_vf_set1(alpha));
            for (int j = 0; j < nk; j++)
                y = mt_vf_fma(mt_vf_load_tail(V + (size_t)(k0 + j) * ldv + d0, tm), mt_vf_set1(sb[j]), y);
            mt_vf_store_tail(o + d0, tm, y);
        }
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < Dv; d++) out[d] = o[d] * inv;
}

static void attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const uint16_t *k16, const uint16_t *v16, const float *out, const float *lse,
                     const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv, float *scratch, int nthr,
                     int gemm_bf16) {
    MT_ASSERT(B >= 0 && T >= 0 && G > 0 && H % G == 0 && Dk > 0 && Dk % 2 == 0 && Dv > 0 && nthr >= 1);
    const int bf16 = mt_attention_bf16(gemm_bf16, Dk) && mt_attention_bf16(gemm_bf16, Dv);
    MT_ASSERT(!k16 || bf16);
    check_pos(pos, B, T);
    const int rep = H / G, Dm = Dk > Dv ? Dk : Dv;
    const float scale = 1.0f / sqrtf((float)Dk), c2 = LOG2E * scale;
    const size_t per = mt_attention_scratch_floats(T, Dm);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * G; task++) {
        int b = task / G, g = task % G;
        float *Kt = align64(scratch + (size_t)omp_get_thread_num() * per);
        float *Vt = Kt + (size_t)Dm * ATT_BK, *P = Vt + (size_t)Dm * ATT_BK;
        float *S = P + ATT_BQ * ATT_BK, *Kc = S + ATT_BQ * ATT_BK, *Qc = Kc + (size_t)Dm * ATT_BK;
        float *dOc = Qc + (size_t)T * Dm, *Di = dOc + (size_t)T * Dm, *l2 = Di + T;
#if defined(ATT_BF16)
        /* pair buffers after l2 (64-byte aligned): q and dO of the head, K of the block, P and
         * dS pairs along queries ([BQ/2][BK]), dS pairs along keys ([BQ][BK/2]) */
        const size_t hp = (size_t)((T + 2) / 2) * Dm;
        uint32_t *Qp = align64(l2 + T + ATT_BQ), *dOp = Qp + hp, *Kp = dOp + hp;
        uint32_t *P2 = Kp + (size_t)ATT_BK / 2 * Dm, *S2 = P2 + ATT_BQ / 2 * ATT_BK, *Sr = S2 + ATT_BQ / 2 * ATT_BK;
        uint32_t *Qr = Sr + ATT_BQ * ATT_BK / 2, *dOr = Qr + (size_t)T * Dm / 2, *Kt2 = dOr + (size_t)T * Dm / 2;
        uint32_t *Vt2 = Kt2 + (size_t)Dm / 2 * ATT_BK;
#endif
        int32_t lo[ATT_BQ], hi[ATT_BQ];
        const int32_t *pb = pos ? pos + (size_t)b * T : NULL;
        const int ldq = H * Dk, ldo = H * Dv, ldk = G * Dk, ldv = G * Dv;
        /* this task owns dq of heads g*rep .. g*rep+rep-1 of row b, and the rows of dk, dv
         * of kv head g; the first key block a query block sees writes its dq rows, the
         * others add to them */
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            /* the head's q and dO rows made contiguous (streamed once per key block),
             * D_i = dO_i . O_i and the base-2 log-sum-exp of every row */
            size_t hr0 = (size_t)b * T * H + h;
            copy_rows(Qc, q + hr0 * Dk, ldq, T, Dk);
            copy_rows(dOc, dout + hr0 * Dv, ldo, T, Dv);
#if defined(ATT_BF16)
            if (bf16) { /* from the contiguous copies: measured faster than from the strided rows */
                pair_rows(Qp, Dk, Qc, Dk, T);
                pair_rows(dOp, Dv, dOc, Dv, T);
                /* the scores exactly as the forward made them, from bf16(q c2) (not bf16(q) c2,
                 * whose error grows with the scores and made P disagree with lse); Qc is not
                 * read again in bf16 mode */
                for (size_t i = 0; i < (size_t)T * Dk; i++) Qc[i] *= c2;
                pair_cols(Qr, Dk, Qc, Dk, T);
                pair_cols(dOr, Dv, dOc, Dv, T);
            }
#endif
            for (int t = 0; t < T; t++) {
                Di[t] = mt_dotf(out + (hr0 + (size_t)t * H) * Dv, dOc + (size_t)t * Dv, (size_t)Dv);
                l2[t] = lse[((size_t)b * H + h) * T + t] * LOG2E;
            }
            for (int k0 = 0; k0 < T; k0 += ATT_BK) {
                int nk = T - k0 < ATT_BK ? T - k0 : ATT_BK, first = h == g * rep;
                size_t kr0 = ((size_t)b * T + k0) * G + g;
                const float *kb = k16 ? NULL : k + kr0 * Dk, *vb = k16 ? NULL : v + kr0 * Dv;
                if (!bf16) {
                    copy_rows(Kc, kb, ldk, nk, Dk);
                    pack_t(Kt, kb, ldk, nk, Dk);
                    pack_t(Vt, vb, ldv, nk, Dv);
                }
#if defined(ATT_BF16)
                else if (k16) {
                    pair_rows16(Kp, Dk, k16 + kr0 * Dk, ldk, nk);
                    pair_t16(Kt2, k16 + kr0 * Dk, ldk, nk, Dk);
                    pair_t16(Vt2, v16 + kr0 * Dv, ldv, nk, Dv);
                } else { /* the pair layouts instead of the fp32 copy and transposed packs */
                    pair_rows(Kp, Dk, kb, ldk, nk);
                    pair_t(Kt2, kb, ldk, nk, Dk);
                    pair_t(Vt2, vb, ldv, nk, Dv);
                }
#endif
                /* queries before k0 see no key of the block */
                for (int t0 = k0 / ATT_BQ * ATT_BQ; t0 < T; t0 += ATT_BQ) {
                    int nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
                    int dq_first; /* the block writes the query block's dq rows, the next ones add */
                    int kind = block_ranges(lo, hi, pb, t0, nq, k0, nk, &dq_first);
                    if (!kind) continue;
                    size_t row0 = ((size_t)b * T + t0) * H + h;
                    const float *qc = Qc + (size_t)t0 * Dk, *doc = dOc + (size_t)t0 * Dv;
#if defined(ATT_BF16)
                    if (bf16) {
                        const int qp = (nq + 1) / 2;
                        bwd_probs_bf16(P, Qr + (size_t)t0 * Dk / 2, Kt2, nq, Dk, kind == 1 ? lo : NULL, hi, l2 + t0);
                        pair_rows(P2, ATT_BK, P, ATT_BK, nq);
                        const int diag = t0 == k0 && g_diag_skip; /* P, dS zero above the diagonal */
                        mm_nn_bf16(dv + kr0 * Dv, ldv, P2, 1, ATT_BK, dOp + (size_t)t0 / 2 * Dv, nk, qp, Dv, first,
                                   diag);
                        bwd_dscores_bf16(S, dOr + (size_t)t0 * Dv / 2, Vt2, nq, Dv, Di + t0, scale, P);
                        pair_rows(S2, ATT_BK, S, ATT_BK, nq);
                        pair_cols(Sr, ATT_BK, S, ATT_BK, nq);
                        mm_nn_bf16(dq + row0 * Dk, ldq, Sr, ATT_BK / 2, 1, Kp, nq, (nk + 1) / 2, Dk, dq_first, -diag);
                        mm_nn_bf16(dk + kr0 * Dk, ldk, S2, 1, ATT_BK, Qp + (size_t)t0 / 2 * Dk, nk, qp, Dk, first,
                                   diag);
                        first = 0;
                        continue;
                    }
#endif
                    bwd_probs(P, qc, Dk, Kt, nq, Dk, kind == 1 ? lo : NULL, hi, l2 + t0, c2);
                    mm_nn(dv + kr0 * Dv, ldv, P, 1, ATT_BK, doc, Dv, nk, nq, Dv, first); /* dV += P^T dO */
                    bwd_dscores(S, doc, Dv, Vt, nq, Dv, Di + t0, scale, P); /* dS = P (dO V^T - Di) scale */
                    mm_nn(dq + row0 * Dk, ldq, S, ATT_BK, 1, Kc, Dk, nq, nk, Dk, dq_first); /* dQ += dS K */
                    mm_nn(dk + kr0 * Dk, ldk, S, 1, ATT_BK, qc, Dk, nk, nq, Dk, first); /* dK += dS^T Q */
                    first = 0;
                }
                if (first) /* no query sees the block (cannot happen: a key sees itself) */
                    for (int j = 0; j < nk; j++) {
                        memset(dk + (kr0 + (size_t)j * G) * Dk, 0, sizeof(float) * Dk);
                        memset(dv + (kr0 + (size_t)j * G) * Dv, 0, sizeof(float) * Dv);
                    }
            }
        }
    }
}

void mt_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                      const float *k, const float *v, const float *out, const float *lse,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr, int bf16) {
    attn_bwd(dq, dk, dv, dout, q, k, v, NULL, NULL, out, lse, pos, B, T, H, G, D, D, scratch, nthr, bf16);
}

void mt_attention_bwd_kv16(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const uint16_t *k, const uint16_t *v, const float *out, const float *lse,
                           const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                           int nthr) {
    attn_bwd(dq, dk, dv, dout, q, NULL, NULL, k, v, out, lse, pos, B, T, H, G, D, D, scratch, nthr, 1);
}

void mt_attention_bwd_dv(float *dq, float *dk, float *dv, const float *dout, const float *q,
                         const float *k, const float *v, const float *out, const float *lse,
                         const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv, float *scratch,
                         int nthr, int bf16) {
    attn_bwd(dq, dk, dv, dout, q, k, v, NULL, NULL, out, lse, pos, B, T, H, G, Dk, Dv, scratch, nthr, bf16);
}
