/* kernels/gemm_bf16.c — mixed-precision GEMM: fp32 operands rounded to bfloat16 while they
 * are packed, products summed in fp32 (AVX512-BF16 VDPBF16PS). See gemm_bf16.h.
 *
 * Structure (Goto/BLIS): C is cut into NC-column blocks, K into KC-deep blocks, and A into
 * MC-row blocks; each block of B is packed once (converted to bf16) into NR-wide micro-panels
 * and each block of A into MR-high micro-panels, then a register-blocked micro-kernel computes
 * an MR x NR tile of C from one micro-panel of each. VDPBF16PS multiplies *pairs* along K:
 * lane j of dst += a[2p]*b[2p][j] + a[2p+1]*b[2p+1][j]. So a packed panel stores, for every
 * pair p of K indices, the two bf16 values of one row (of A) or one column (of B) side by side
 * as one 32-bit word: A panel [kp][MR] words, B panel [kp][NR] words; odd K is padded with 0.
 * Rounding is to nearest even (VCVTNE2PS2BF16 and the scalar equivalent), as PyTorch's casts. */
#include "kernels/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"

#define MR 12
#define NR 32           /* two zmm of fp32 lanes */
#define KC 384          /* K indices per block (192 pairs): B micro-panel 24 KiB, in L1 */
#define MC 192          /* rows of A per block: 144 KiB packed, in L2 */
#define NC 3072         /* columns of B per block: 2.25 MiB packed, in L3 */

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

int mt_bf16_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
}

/* fp32 -> bf16, round to nearest even (NaN kept quiet), the rule of VCVTNEPS2BF16 */
static inline uint32_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

float mt_bf16_round(float f) {
    uint32_t u = bf16_bits(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static inline uint32_t pair_bits(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

/* Element (r, k) of an operand that is stored row-major with leading dimension ld, or
 * transposed (stored as [k][r]). */
static inline float el(const float *X, int ld, int trans, int r, int k) {
    return trans ? X[(size_t)k * ld + r] : X[(size_t)r * ld + k];
}

/* 16-bit lane permutation that interleaves [x0..x15 | y0..y15] (as VCVTNE2PS2BF16 returns
 * two rows) into [x0 y0 x1 y1 ...]: the 32-bit pair words of 16 columns. */
BF16_TARGET static inline __m512i interleave_idx(void) {
    static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_loadu_si512(idx);
}

/* Packs w columns (rows, when trans) x0.. of rows k0..k0+kc of an operand into words
 * out[p*W + c] = pair(X(k0+2p, x0+c), X(k0+2p+1, x0+c)), c < W, zero beyond w / kc.
 * "rowmaj" means element (k, x) is at X[k*ld + x] (pairs come from two rows, lanes are
 * contiguous); otherwise element (k, x) is at X[x*ld + k] (pairs are contiguous). */
BF16_TARGET static void pack_panel(uint32_t *out, int W, const float *X, int ld, int rowmaj, int k0, int kc,
                                   int x0, int w) {
    int kp = (kc + 1) / 2;
    if (rowmaj) {
        const __m512i perm = interleave_idx();
        for (int p = 0; p < kp; p++) {
            int k = k0 + 2 * p;
            const float *r0 = X + (size_t)k * ld + x0;
            const float *r1 = r0 + ld;
            int have1 = 2 * p + 1 < kc;
            uint32_t *o = out + (size_t)p * W;
            for (int c = 0; c < W; c += 16) {
                int n = w - c;
                __mmask16 m = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
                __m512 a = _mm512_maskz_loadu_ps(m, r0 + c);
                __m512 b = have1 ? _mm512_maskz_loadu_ps(m, r1 + c) : _mm512_setzero_ps();
                __m512i v = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                __mmask16 ms = W - c >= 16 ? 0xffff : (__mmask16)((1u << (W - c)) - 1);
                _mm512_mask_storeu_epi32(o + c, ms, _mm512_permutexvar_epi16(perm, v));
            }
        }
    } else {
        for (int c = 0; c < W; c++) {
            if (c >= w) {
                for (int p = 0; p < kp; p++) out[(size_t)p * W + c] = 0;
                continue;
            }
            const float *src = X + (size_t)(x0 + c) * ld + k0;
            int p = 0;
            for (; 2 * p + 32 <= kc; p += 16) {
                __m512 a = _mm512_loadu_ps(src + 2 * p), b = _mm512_loadu_ps(src + 2 * p + 16);
                uint32_t tmp[16];
                _mm512_storeu_si512(tmp, (__m512i)_mm512_cvtne2ps_pbh(b, a));
                for (int i = 0; i < 16; i++) out[(size_t)(p + i) * W + c] = tmp[i];
            }
            for (; p < kp; p++) {
                int k = 2 * p;
                out[(size_t)p * W + c] = pair_bits(src[k], k + 1 < kc ? src[k + 1] : 0.0f);
            }
        }
    }
}

/* Packs rows x0.. of an operand whose pairs are contiguous (element (x, k) at X[x*ld + k])
 * row by row: out[c*kp + p] = pair(X(x0+c, k0+2p), X(x0+c, k0+2p+1)), zero rows beyond w.
 * A straight conversion, no transposition: the micro-kernel reads such an A panel with a
 * row stride (micro_kernel_rows). */
BF16_TARGET static void pack_rows(uint32_t *out, int W, const float *X, int ld, int k0, int kc, int x0, int w) {
    int kp = (kc + 1) / 2;
    for (int c = 0; c < W; c++) {
        uint32_t *o = out + (size_t)c * kp;
        if (c >= w) {
            memset(o, 0, sizeof(uint32_t) * kp);
            continue;
        }
        const float *src = X + (size_t)(x0 + c) * ld + k0;
        for (int k = 0; k < kc; k += 32) {
            int n = kc - k;
            __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
            __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m0, src + k), b = _mm512_maskz_loadu_ps(m1, src + k + 16);
            int words = (n + 1) / 2 < 16 ? (n + 1) / 2 : 16;
            _mm512_mask_storeu_epi32(o + k / 2, (__mmask16)((1u << words) - 1), (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}

/* C[mr x nr] (ldc) = alpha * A_panel . B_panel + (first ? beta * C : C); beta == 0 never reads C.
 * Word (r, p) of the A panel is a[r*ars + p*aps]. */
BF16_TARGET static inline __attribute__((always_inline)) void micro_kernel_any(
    int kp, const uint32_t *a, size_t ars, size_t aps, const uint32_t *b, float *C, int ldc, int mr, int nr,
    float alpha, float beta, int first) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR + 16);
        const uint32_t *ap = a + (size_t)p * aps;
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r * ars]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int r = 0; r < mr; r++) {
        float *c = C + (size_t)r * ldc;
        __m512 x0 = _mm512_mul_ps(acc[r][0], va), x1 = _mm512_mul_ps(acc[r][1], va);
        if (!first) {
            x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, c));
            x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, c + 16));
        } else if (beta != 0.0f) {
            x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), x0);
            x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), x1);
        }
        _mm512_mask_storeu_ps(c, m0, x0);
        _mm512_mask_storeu_ps(c + 16, m1, x1);
    }
}

/* A panel packed k-major ([kp][MR], by pack_panel) or row-major ([MR][kp], by pack_rows) */
BF16_TARGET static void micro_kernel(int kp, const uint32_t *a, const uint32_t *b, float *C, int ldc, int mr,
                                     int nr, float alpha, float beta, int first) {
    micro_kernel_any(kp, a, 1, MR, b, C, ldc, mr, nr, alpha, beta, first);
}

BF16_TARGET static void micro_kernel_rows(int kp, const uint32_t *a, const uint32_t *b, float *C, int ldc,
                                          int mr, int nr, float alpha, float beta, int first) {
    micro_kernel_any(kp, a, (size_t)kp, 1, b, C, ldc, mr, nr, alpha, beta, first);
}

/* Packing buffers: per thread for the A blocks and for calls made inside a parallel region;
 * one shared B block for a top-level call, packed by all threads together. Grown on demand
 * and kept (the GEMM runs thousands of times per step). */
static _Thread_local uint32_t *t_apack, *t_bpack;
static uint32_t *g_bpack;

static uint32_t *ensure(uint32_t **buf, size_t words) {
    if (!*buf) *buf = mt_alloc(words * 4);
    return *buf;
}

/* The GEMM on rows [m0, m1) of C, by thread t of nt; B blocks are packed by all nt threads
 * into bp (shared when nt > 1: the threads meet at a barrier before and after each block). */
BF16_TARGET static void gemm_blocks(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                                    int lda, const float *B, int ldb, float beta, float *C, int ldc,
                                    uint32_t *bp, int t, int nt, int m0, int m1) {
    (void)M;
    uint32_t *ap = ensure(&t_apack, (size_t)MC * (KC / 2));
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC, npan = (nc + NR - 1) / NR;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC, kp = (kc + 1) / 2;
            /* B(k, n): transB stores it at B[n*ldb + k] (pairs contiguous), else B[k*ldb + n] */
            for (int q = npan * t / nt; q < npan * (t + 1) / nt; q++) {
                int jr = q * NR, w = nc - jr < NR ? nc - jr : NR;
                pack_panel(bp + (size_t)jr * kp, NR, B, ldb, !transB, pc, kc, jc + jr, w);
            }
            if (nt > 1) {
#pragma omp barrier
            }
            for (int ic = m0; ic < m1; ic += MC) {
                int mc = m1 - ic < MC ? m1 - ic : MC;
                /* A(m, k): transA stores it at A[k*lda + m] (two rows give a pair), else A[m*lda + k] */
                for (int ir = 0; ir < mc; ir += MR) {
                    int h = mc - ir < MR ? mc - ir : MR;
                    if (transA) pack_panel(ap + (size_t)ir * kp, MR, A, lda, 1, pc, kc, ic + ir, h);
                    else pack_rows(ap + (size_t)ir * kp, MR, A, lda, pc, kc, ic + ir, h);
                }
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        float *c = C + (size_t)(ic + ir) * ldc + jc + jr;
                        if (transA)
                            micro_kernel(kp, ap + (size_t)ir * kp, bp + (size_t)jr * kp, c, ldc, mr, nr, alpha, beta, pc == 0);
                        else
                            micro_kernel_rows(kp, ap + (size_t)ir * kp, bp + (size_t)jr * kp, c, ldc, mr, nr, alpha, beta,
                                              pc == 0);
                    }
                }
            }
            if (nt > 1) {
#pragma omp barrier
            }
        }
    }
}

void mt_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nthr > 1 && ((double)M * N * K < 2e6 || M < 2 * MR)) nthr = 1;
    if (nthr == 1) {
        gemm_blocks(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                    ensure(&t_bpack, (size_t)NC * (KC / 2)), 0, 1, 0, M);
        return;
    }
    /* top level: the threads share each packed block of B and split the rows of C (whole
     * MR panels); a row's result does not depend on the split */
    uint32_t *bp = ensure(&g_bpack, (size_t)NC * (KC / 2));
    int panels = (M + MR - 1) / MR;
#pragma omp parallel num_threads(nthr)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int m0 = panels * t / nt * MR, m1 = panels * (t + 1) / nt * MR;
        if (m1 > M) m1 = M;
        gemm_blocks(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bp, t, nt, m0, m1);
    }
}
