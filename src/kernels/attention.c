/* kernels/attention.c — flash attention forward and backward on the CPU (contract in
 * attention.h; plain reference in ref.c).
 *
 * Tiling: query blocks of ATT_BQ rows x key blocks of ATT_BK keys. Per (query block, key
 * block) the forward computes the scores S = Q K^T of the block, updates each row's
 * running max m and sum l (online softmax: when m grows, l and the output accumulator
 * are rescaled by exp(m_old - m_new)), and adds P V. Key blocks that no row of the query
 * block can see (above the causal diagonal, or outside every row's document) are
 * skipped; inside a block each row's visible keys are one contiguous range, applied as a
 * lane mask. The backward (FlashAttention-2) loops over key blocks, keeps dK and dV of
 * the block in scratch, and for every query block of every head of the kv group
 * recomputes P = exp(s - lse), then dV += P^T dO, dP = dO V^T, dS = P (dP - D_i) scale
 * with D_i = dO_i . O_i, dQ += dS K (straight into dq) and dK += dS^T Q.
 *
 * Vectorisation: three primitives do all the work — C = A Bt (Bt a key block packed
 * transposed, [D][ATT_BK]), C += A B (A read through strides, so P, P^T, dS and dS^T need
 * no copies; B read in place from q/k/v/dout) and the masked row exp. With AVX-512 they
 * are register-blocked FMA micro-kernels (4 rows x 64 columns = 16 zmm accumulators) and
 * a polynomial exp; otherwise plain loops the compiler may vectorise. The block sizes
 * were chosen by measurement (one thread, T=4096, D=64, GFLOP/s fwd/bwd on AMD EPYC
 * Zen 4): BQ x BK = 64x64 61/56, 128x64 62/51, 32x64 58/60, 64x32 58/52, 64x128 37/42
 * (the packed key block and the score tile then no longer fit the 32 KB L1); micro-kernel
 * rows 4: 64/61, 6: 67/59, 2: 55/46. Benchmark: tests/test_kernels.c with MT_BENCH=1.
 *
 * Scratch per thread is O(ATT_BQ * ATT_BK + ATT_BK * D), independent of T. */
#include "kernels/attention.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* Overridable only to measure other block sizes; ATT_BK must be a multiple of 16. */
#ifndef ATT_BQ
#define ATT_BQ 64
#endif
#ifndef ATT_BK
#define ATT_BK 64
#endif
#ifndef ATT_MR
#define ATT_MR 4 /* rows of a micro-kernel tile */
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static int round16(int x) { return (x + 15) & ~15; }

static float *align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

#ifdef __AVX512F__

/* Lanes l of the vector starting at column j0 with lo <= j0 + l < hi. */
ALWAYS_INLINE __mmask16 range_mask(int j0, int lo, int hi) {
    int a = lo - j0, e = hi - j0;
    if (a < 0) a = 0;
    if (e > 16) e = 16;
    if (a >= e) return 0;
    return (__mmask16)(((1u << e) - 1u) & ~((1u << a) - 1u));
}

/* exp(x) to ~2 ulp (Cephes expf polynomial, 2^n by scalef); underflows to 0 below -104. */
ALWAYS_INLINE __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* max of s[lo..hi-1] (lo < hi <= ATT_BK) */
static float row_max(const float *s, int lo, int hi) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j0 = lo & ~15; j0 < hi; j0 += 16) {
        __mmask16 k = range_mask(j0, lo, hi);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + j0));
    }
    return _mm512_reduce_max_ps(m);
}

/* p[j] = exp(s[j] * scale - sub) for lo <= j < hi, 0 for the other j < ATT_BK (p may be
 * s); returns the sum of the p[j]. */
static float row_exp(float *p, const float *s, int lo, int hi, float scale, float sub) {
    const __m512 sc = _mm512_set1_ps(scale), sb = _mm512_set1_ps(sub);
    __m512 acc = _mm512_setzero_ps();
    for (int j0 = 0; j0 < ATT_BK; j0 += 16) {
        __mmask16 k = range_mask(j0, lo, hi);
        __m512 e = _mm512_setzero_ps();
        if (k) {
            __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j0), sc, sb);
            e = _mm512_maskz_mov_ps(k, exp512(x));
            acc = _mm512_add_ps(acc, e);
        }
        _mm512_storeu_ps(p + j0, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* mr x (16 nv) tile of C = A Bt, Bt row stride ATT_BK, C row stride ATT_BK. */
ALWAYS_INLINE void nt_tile(float *C, const float *A, int lda, const float *Bt, int D, int mr,
                           int nv) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++) acc[r][u] = _mm512_setzero_ps();
    for (int c = 0; c < D; c++) {
        __m512 b[4];
        for (int u = 0; u < nv; u++) b[u] = _mm512_loadu_ps(Bt + (size_t)c * ATT_BK + 16 * u);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[(size_t)r * lda + c]);
            for (int u = 0; u < nv; u++) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++) _mm512_storeu_ps(C + (size_t)r * ATT_BK + 16 * u, acc[r][u]);
}

#define NT_ROWS(NV) do { \
    int r_ = 0; \
    for (; r_ + ATT_MR <= M; r_ += ATT_MR) \
        nt_tile(C + (size_t)r_ * ATT_BK + n0, A + (size_t)r_ * lda, lda, Bt + n0, D, ATT_MR, NV); \
    for (; r_ < M; r_++) \
        nt_tile(C + (size_t)r_ * ATT_BK + n0, A + (size_t)r_ * lda, lda, Bt + n0, D, 1, NV); \
} while (0)

/* C[M][ATT_BK] = A[M][D] (row stride lda) . Bt[D][ATT_BK] */
static void mm_nt(float *C, const float *A, int lda, const float *Bt, int M, int D) {
    for (int n0 = 0; n0 < ATT_BK; n0 += 64) {
        int nv = (ATT_BK - n0) / 16;
        if (nv >= 4) NT_ROWS(4);
        else if (nv == 3) NT_ROWS(3);
        else if (nv == 2) NT_ROWS(2);
        else NT_ROWS(1);
    }
}

/* mr x (16 nv) tile of C += A B over K; columns masked by mk. */
ALWAYS_INLINE void nn_tile(float *C, int ldc, const float *A, int ars, int acs, const float *B,
                           int ldb, int K, const __mmask16 *mk, int mr, int nv) {
    __m512 acc[ATT_MR][4];
    for (int r = 0; r < mr; r++)
        for (int u = 0; u < nv; u++)
            acc[r][u] = _mm512_maskz_loadu_ps(mk[u], C + (size_t)r * ldc + 16 * u);
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

#define NN_ROWS(NV) do { \
    int r_ = 0; \
    for (; r_ + ATT_MR <= M; r_ += ATT_MR) \
        nn_tile(C + (size_t)r_ * ldc + c0, ldc, A + (size_t)r_ * ars, ars, acs, B + c0, ldb, K, \
                mk, ATT_MR, NV); \
    for (; r_ < M; r_++) \
        nn_tile(C + (size_t)r_ * ldc + c0, ldc, A + (size_t)r_ * ars, ars, acs, B + c0, ldb, K, \
                mk, 1, NV); \
} while (0)

/* C[M][D] (row stride ldc) += A . B[K][D] (row stride ldb), where A's element (m, k) is
 * A[m * ars + k * acs] (ars = row stride, or acs = row stride for A transposed). */
static void mm_nn(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb,
                  int M, int K, int D) {
    for (int c0 = 0; c0 < D; c0 += 64) {
        int w = D - c0 < 64 ? D - c0 : 64, nv = (w + 15) / 16;
        __mmask16 mk[4];
        for (int u = 0; u < 4; u++) mk[u] = range_mask(16 * u, 0, w);
        if (nv == 4) NN_ROWS(4);
        else if (nv == 3) NN_ROWS(3);
        else if (nv == 2) NN_ROWS(2);
        else NN_ROWS(1);
    }
}

#else /* portable fallback: the same primitives as plain loops */

static float row_max(const float *s, int lo, int hi) {
    float m = -INFINITY;
    for (int j = lo; j < hi; j++) m = s[j] > m ? s[j] : m;
    return m;
}

static float row_exp(float *p, const float *s, int lo, int hi, float scale, float sub) {
    float sum = 0.0f;
    for (int j = 0; j < ATT_BK; j++) {
        float e = j >= lo && j < hi ? expf(s[j] * scale - sub) : 0.0f;
        p[j] = e;
        sum += e;
    }
    return sum;
}

static void mm_nt(float *C, const float *A, int lda, const float *Bt, int M, int D) {
    for (int r = 0; r < M; r++) {
        float *c = C + (size_t)r * ATT_BK;
        for (int n = 0; n < ATT_BK; n++) c[n] = 0.0f;
        for (int d = 0; d < D; d++) {
            float a = A[(size_t)r * lda + d];
            const float *b = Bt + (size_t)d * ATT_BK;
            for (int n = 0; n < ATT_BK; n++) c[n] += a * b[n];
        }
    }
}

static void mm_nn(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb,
                  int M, int K, int D) {
    for (int r = 0; r < M; r++) {
        float *c = C + (size_t)r * ldc;
        for (int kk = 0; kk < K; kk++) {
            float a = A[(size_t)r * ars + (size_t)kk * acs];
            const float *b = B + (size_t)kk * ldb;
            for (int d = 0; d < D; d++) c[d] += a * b[d];
        }
    }
}

#endif

/* Bt[D][ATT_BK] = X[nk][D]^T (X row stride ld), columns nk..ATT_BK-1 zero. */
static void pack_t(float *Bt, const float *X, int ld, int nk, int D) {
    for (int n = 0; n < nk; n++)
        for (int c = 0; c < D; c++) Bt[(size_t)c * ATT_BK + n] = X[(size_t)n * ld + c];
    for (int c = 0; c < D; c++)
        for (int n = nk; n < ATT_BK; n++) Bt[(size_t)c * ATT_BK + n] = 0.0f;
}

/* The keys of block [k0, k0+nk) that query row t0+i sees, relative to k0, as the
 * half-open range [lo[i], hi[i]) (empty when lo >= hi). pb: the row's positions or NULL.
 * Returns whether any row of the query block sees any key of the block. */
static int block_ranges(int *lo, int *hi, const int32_t *pb, int t0, int nq, int k0, int nk) {
    int any = 0;
    for (int i = 0; i < nq; i++) {
        int t = t0 + i, a = (pb ? t - pb[t] : 0) - k0, e = t - k0 + 1;
        lo[i] = a > 0 ? a : 0;
        hi[i] = e < nk ? e : nk;
        any |= lo[i] < hi[i];
    }
    return any;
}

size_t mt_attention_scratch_floats(int T, int D) {
    (void)T;
    size_t Dp = (size_t)round16(D);
    size_t fwd = (size_t)D * ATT_BK + (size_t)ATT_BQ * ATT_BK + (size_t)ATT_BQ * Dp + 2 * ATT_BQ;
    size_t bwd = 2 * (size_t)D * ATT_BK + 2 * (size_t)ATT_BQ * ATT_BK + 2 * (size_t)ATT_BK * Dp +
                 ATT_BQ;
    return (fwd > bwd ? fwd : bwd) + 16; /* + room to align to 64 bytes */
}

/* Asserts 0 <= pos[t] <= t for the B rows (the masks rely on it). */
static void check_pos(const int32_t *pos, int B, int T) {
    if (!pos) return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) MT_ASSERT(pos[(size_t)b * T + t] >= 0 && pos[(size_t)b * T + t] <= t);
}

void mt_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr) {
    MT_ASSERT(B >= 0 && T >= 0 && G > 0 && H % G == 0 && D > 0 && D % 2 == 0 && nthr >= 1);
    check_pos(pos, B, T);
    const int rep = H / G, Dp = round16(D);
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = mt_attention_scratch_floats(T, D);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * H; task++) {
        int b = task / H, h = task % H, g = h / rep;
        float *Kt = align64(scratch + (size_t)omp_get_thread_num() * per);
        float *S = Kt + (size_t)D * ATT_BK, *O = S + ATT_BQ * ATT_BK;
        float *m = O + (size_t)ATT_BQ * Dp, *l = m + ATT_BQ;
        int lo[ATT_BQ], hi[ATT_BQ];
        const int32_t *pb = pos ? pos + (size_t)b * T : NULL;
        for (int t0 = 0; t0 < T; t0 += ATT_BQ) {
            int nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ, smin = 0; /* first key seen */
            if (pb) {
                smin = t0;
                for (int i = 0; i < nq; i++)
                    if (t0 + i - pb[t0 + i] < smin) smin = t0 + i - pb[t0 + i];
            }
            memset(O, 0, sizeof(float) * (size_t)nq * Dp);
            for (int i = 0; i < nq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
            const float *qt = q + (((size_t)b * T + t0) * H + h) * D;
            for (int k0 = smin / ATT_BK * ATT_BK; k0 < t0 + nq; k0 += ATT_BK) {
                int nk = T - k0 < ATT_BK ? T - k0 : ATT_BK;
                if (!block_ranges(lo, hi, pb, t0, nq, k0, nk)) continue;
                const float *kb = k + (((size_t)b * T + k0) * G + g) * D;
                const float *vb = v + (((size_t)b * T + k0) * G + g) * D;
                pack_t(Kt, kb, G * D, nk, D);
                mm_nt(S, qt, H * D, Kt, nq, D);
                for (int i = 0; i < nq; i++) {
                    float *s = S + (size_t)i * ATT_BK;
                    if (lo[i] >= hi[i]) { memset(s, 0, sizeof(float) * ATT_BK); continue; }
                    float mn = fmaxf(m[i], row_max(s, lo[i], hi[i]) * scale);
                    float alpha = expf(m[i] - mn); /* 0 on the row's first block */
                    l[i] = l[i] * alpha + row_exp(s, s, lo[i], hi[i], scale, mn);
                    m[i] = mn;
                    if (alpha != 1.0f)
                        for (int c = 0; c < D; c++) O[(size_t)i * Dp + c] *= alpha;
                }
                mm_nn(O, Dp, S, ATT_BK, 1, vb, G * D, nq, nk, D); /* O += P V */
            }
            for (int i = 0; i < nq; i++) {
                float inv = 1.0f / l[i], *o = out + (((size_t)b * T + t0 + i) * H + h) * D;
                for (int c = 0; c < D; c++) o[c] = O[(size_t)i * Dp + c] * inv;
                lse[((size_t)b * H + h) * T + t0 + i] = m[i] + logf(l[i]);
            }
        }
    }
}

void mt_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                      const float *k, const float *v, const float *out, const float *lse,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr) {
    MT_ASSERT(B >= 0 && T >= 0 && G > 0 && H % G == 0 && D > 0 && D % 2 == 0 && nthr >= 1);
    check_pos(pos, B, T);
    const int rep = H / G, Dp = round16(D);
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = mt_attention_scratch_floats(T, D);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * G; task++) {
        int b = task / G, g = task % G;
        float *Kt = align64(scratch + (size_t)omp_get_thread_num() * per);
        float *Vt = Kt + (size_t)D * ATT_BK, *P = Vt + (size_t)D * ATT_BK;
        float *S = P + ATT_BQ * ATT_BK, *dK = S + ATT_BQ * ATT_BK;
        float *dV = dK + (size_t)ATT_BK * Dp, *Di = dV + (size_t)ATT_BK * Dp;
        int lo[ATT_BQ], hi[ATT_BQ];
        const int32_t *pb = pos ? pos + (size_t)b * T : NULL;
        /* this task owns dq of heads g*rep .. g*rep+rep-1 (contiguous) of row b */
        for (int t = 0; t < T; t++)
            memset(dq + (((size_t)b * T + t) * H + (size_t)g * rep) * D, 0, sizeof(float) * rep * D);
        for (int k0 = 0; k0 < T; k0 += ATT_BK) {
            int nk = T - k0 < ATT_BK ? T - k0 : ATT_BK;
            const float *kb = k + (((size_t)b * T + k0) * G + g) * D;
            const float *vb = v + (((size_t)b * T + k0) * G + g) * D;
            pack_t(Kt, kb, G * D, nk, D);
            pack_t(Vt, vb, G * D, nk, D);
            memset(dK, 0, sizeof(float) * (size_t)nk * Dp);
            memset(dV, 0, sizeof(float) * (size_t)nk * Dp);
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                /* queries before k0 see no key of the block */
                for (int t0 = k0 / ATT_BQ * ATT_BQ; t0 < T; t0 += ATT_BQ) {
                    int nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
                    if (!block_ranges(lo, hi, pb, t0, nq, k0, nk)) continue;
                    size_t row0 = ((size_t)b * T + t0) * H + h;
                    const float *qt = q + row0 * D, *dot = dout + row0 * D, *ot = out + row0 * D;
                    const float *lr = lse + ((size_t)b * H + h) * T + t0;
                    mm_nt(S, qt, H * D, Kt, nq, D);
                    for (int i = 0; i < nq; i++) {
                        float *p = P + (size_t)i * ATT_BK;
                        if (lo[i] < hi[i]) row_exp(p, S + (size_t)i * ATT_BK, lo[i], hi[i], scale, lr[i]);
                        else memset(p, 0, sizeof(float) * ATT_BK);
                    }
                    mm_nn(dV, Dp, P, 1, ATT_BK, dot, H * D, nk, nq, D); /* dV += P^T dO */
                    mm_nt(S, dot, H * D, Vt, nq, D);                    /* dP = dO V^T */
                    for (int i = 0; i < nq; i++) {
                        const float *o = ot + (size_t)i * H * D, *d = dot + (size_t)i * H * D;
                        float acc = 0.0f;
                        for (int c = 0; c < D; c++) acc += o[c] * d[c];
                        Di[i] = acc;
                    }
                    for (int i = 0; i < nq; i++) {
                        const float *p = P + (size_t)i * ATT_BK;
                        float *s = S + (size_t)i * ATT_BK, di = Di[i];
                        for (int j = 0; j < ATT_BK; j++) s[j] = p[j] * (s[j] - di) * scale;
                    }
                    mm_nn(dq + row0 * D, H * D, S, ATT_BK, 1, kb, G * D, nq, nk, D); /* dQ += dS K */
                    mm_nn(dK, Dp, S, 1, ATT_BK, qt, H * D, nk, nq, D);               /* dK += dS^T Q */
                }
            }
            for (int j = 0; j < nk; j++) {
                size_t o = (((size_t)b * T + k0 + j) * G + g) * D;
                memcpy(dk + o, dK + (size_t)j * Dp, sizeof(float) * D);
                memcpy(dv + o, dV + (size_t)j * Dp, sizeof(float) * D);
            }
        }
    }
}
