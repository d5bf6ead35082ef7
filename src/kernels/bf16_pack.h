/* kernels/bf16_pack.h — fp32 to bf16 pairs, the operand layout of VDPBF16PS (lane j of the
 * result += a.lo*b.lo + a.hi*b.hi over a 32-bit word of two bf16), shared by the bf16 GEMM
 * (gemm_bf16.c) and bf16 attention (attention.c). Conversion rounds to nearest even
 * (VCVTNE2PS2BF16). Include where AVX512-BF16 code is compiled: the functions carry the
 * target attribute, their callers must have it (or -march with it). */
#ifndef MT_KERNELS_BF16_PACK_H
#define MT_KERNELS_BF16_PACK_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/vtrans.h"

#define MT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* 16 words of consecutive pairs: word i = (x[2i], x[2i+1]) of the 32 floats lo (0..15), hi (16..31) */
MT_BF16_TARGET static inline __m512i mt_bf16_pairs(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* 16 words interleaving two rows: word i = (a[i], b[i]) */
MT_BF16_TARGET static inline __m512i mt_bf16_interleave(__m512 a, __m512 b) {
    static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), mt_bf16_pairs(a, b));
}

/* The bf16 GEMM's operand layout, also bf16 attention's: words out[p*W + c] =
 * pair(X(k0+2p, x0+c), X(k0+2p+1, x0+c)) for p < (kc+1)/2, c < W, zero beyond w columns
 * and kc rows. "rowmaj": element (k, x) is at X[k*ld + x] (a pair from two rows, converted
 * and interleaved; in place, out == X with ld == W, works: pair row p is written after rows
 * 2p and 2p+1 were read); otherwise at X[x*ld + k] (a pair from one row: 16 rows converted,
 * then transposed in registers). Inline, so each caller's constant W specialises it. */
MT_BF16_TARGET static inline void mt_bf16_pack_panel(uint32_t *out, int W, const float *X, int ld, int rowmaj, int k0,
                                                     int kc, int x0, int w) {
    int kp = (kc + 1) / 2;
    if (rowmaj) {
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
                __mmask16 ms = W - c >= 16 ? 0xffff : (__mmask16)((1u << (W - c)) - 1);
                _mm512_mask_storeu_epi32(o + c, ms, mt_bf16_interleave(a, b));
            }
        }
    } else {
        /* 16 columns x 16 pairs at a time: convert 16 rows of 32 floats, transpose the
         * 16 x 16 words in registers, store 16 words per pair */
        for (int c0 = 0; c0 < W; c0 += 16) {
            int cw = W - c0 < 16 ? W - c0 : 16;
            __mmask16 ms = (__mmask16)((1u << cw) - 1);
            for (int p0 = 0; p0 < kp; p0 += 16) {
                int n = kc - 2 * p0; /* floats left in each row */
                __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
                __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
                __m512i r[16];
                for (int i = 0; i < 16; i++) {
                    if (c0 + i >= w) {
                        r[i] = _mm512_setzero_si512();
                        continue;
                    }
                    const float *src = X + (size_t)(x0 + c0 + i) * ld + k0 + 2 * p0;
                    r[i] = mt_bf16_pairs(_mm512_maskz_loadu_ps(m0, src), _mm512_maskz_loadu_ps(m1, src + 16));
                }
                mt_transpose16(r);
                int np = kp - p0 < 16 ? kp - p0 : 16;
                for (int j = 0; j < np; j++) _mm512_mask_storeu_epi32(out + (size_t)(p0 + j) * W + c0, ms, r[j]);
            }
        }
    }
}

/* mt_bf16_pack_panel from values already stored as bf16 (the bits mt_bf16_store writes):
 * the same words, so the products have the same bits as from the fp32 values they round.
 * "rowmaj" (a pair from two rows): the two rows' values widened and one shifted into the
 * high half; otherwise the pairs are the row's consecutive values, read as 32-bit words
 * (any alignment) and transposed 16 x 16 in registers, with no conversion. The loops repeat
 * mt_bf16_pack_panel's on purpose: one body for both types (the element type a constant
 * argument, the loads in two helpers) made the specialised clones' code larger and packed
 * bf16 rows in pairs slower. */
MT_BF16_TARGET static inline void mt_bf16_pack_panel16(uint32_t *out, int W, const uint16_t *X, int ld, int rowmaj,
                                                       int k0, int kc, int x0, int w) {
    int kp = (kc + 1) / 2;
    if (rowmaj) {
        for (int p = 0; p < kp; p++) {
            int k = k0 + 2 * p;
            const uint16_t *r0 = X + (size_t)k * ld + x0;
            const uint16_t *r1 = r0 + ld;
            int have1 = 2 * p + 1 < kc;
            uint32_t *o = out + (size_t)p * W;
            for (int c = 0; c < W; c += 16) {
                int n = w - c;
                __mmask16 m = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
                __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + c));
                __m512i b = have1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + c)) : _mm512_setzero_si512();
                __mmask16 ms = W - c >= 16 ? 0xffff : (__mmask16)((1u << (W - c)) - 1);
                _mm512_mask_storeu_epi32(o + c, ms, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
            }
        }
    } else {
        for (int c0 = 0; c0 < W; c0 += 16) {
            int cw = W - c0 < 16 ? W - c0 : 16;
            __mmask16 ms = (__mmask16)((1u << cw) - 1);
            for (int p0 = 0; p0 < kp; p0 += 16) {
                int n = kc - 2 * p0; /* values left in each row */
                __mmask32 m = n >= 32 ? 0xffffffffu : (__mmask32)((1u << n) - 1);
                __m512i r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = c0 + i < w ? _mm512_maskz_loadu_epi16(m, X + (size_t)(x0 + c0 + i) * ld + k0 + 2 * p0)
                                      : _mm512_setzero_si512();
                mt_transpose16(r);
                int np = kp - p0 < 16 ? kp - p0 : 16;
                for (int j = 0; j < np; j++) _mm512_mask_storeu_epi32(out + (size_t)(p0 + j) * W + c0, ms, r[j]);
            }
        }
    }
}

#endif
