/* kernels/vexp.h — vectorised exp, exp2 and sigmoid shared by the kernels (attention's
 * softmax, the SwiGLU gates, the LM head's softmax).
 *
 * With AVX-512 each function maps 16 floats, with AVX2 8 (the same polynomials; 2^n
 * applied as two exact products instead of vscalefps); scalar forms (libm) below. Header-only and static inline so the polynomials inline into the
 * callers' loops.
 *
 * Accuracy (measured against double exp over [-104, 89] and exp2 over [-150, 128]): at
 * most 2 ulp for normal results. Edge cases follow expf: exp(x) = +inf for x > 88.73,
 * 0 for x < -103.98 (the denormal results in between are rounded once), -inf -> 0,
 * +inf -> +inf, NaN -> NaN.
 *
 * Method: x = n ln2 + r with n = round(x / ln2) (Cody-Waite two-constant reduction, so r
 * is exact to ~2^-35), e^r by the Cephes expf polynomial on |r| <= ln2/2, and the result
 * scaled by 2^n with vscalefps (which also handles overflow to inf and gradual underflow
 * in one rounding). exp2 needs no reduction error term: t - round(t) is exact, and 2^f on
 * |f| <= 1/2 is a degree-6 minimax fit (relative error 1.6e-8). The clamps keep n within
 * what scalef turns into 0 or inf; they take x as the second operand of min/max, which
 * the instructions return when it is NaN, so NaN propagates. */
#ifndef MT_KERNELS_VEXP_H
#define MT_KERNELS_VEXP_H

#include <math.h>

/* The polynomials, shared by the 16- and 8-lane forms: e^r on |r| <= ln2/2 (Cephes expf),
 * after x = n ln2 + r with ln2 = LN2_HI + LN2_LO; 2^f on |f| <= 1/2 (degree-6 minimax). */
#define MT_EXP_LOG2E 1.44269504088896341f
#define MT_EXP_LN2_HI 0.693359375f
#define MT_EXP_LN2_LO (-2.12194440e-4f)
#define MT_EXP_P(POLY, SET, x) POLY(POLY(POLY(POLY(POLY(SET(1.9875691500e-4f), x, 1.3981999507e-3f), x, 8.3334519073e-3f), \
                                        x, 4.1665795894e-2f), x, 1.6666665459e-1f), x, 5.0000001201e-1f)
#define MT_EXP2_P(POLY, SET, f) POLY(POLY(POLY(POLY(POLY(POLY(SET(1.535335614e-4f), f, 1.339887735e-3f), f, 9.618437849e-3f), \
                                            f, 5.550332367e-2f), f, 2.402264774e-1f), f, 6.931471825e-1f), f, 1.0f)

#ifdef __AVX512F__
#include <immintrin.h>

/* p x + c on 16 lanes, c a float */
#define MT_POLY512(p, x, c) _mm512_fmadd_ps(p, x, _mm512_set1_ps(c))

/* e^x for 16 lanes. */
static inline __attribute__((always_inline)) __m512 mt_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x); /* below: 2^-159 * p rounds to 0 */
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);   /* above: 2^128 * p overflows to inf */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(MT_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MT_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MT_EXP_LN2_LO), r);
    __m512 p = MT_EXP_P(MT_POLY512, _mm512_set1_ps, r);
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* 2^t for 16 lanes, for t >= -160 or NaN (callers pass t <= 0 or clamp themselves; the
 * attention softmax feeds t = s - max, and -inf for masked scores is clamped here). */
static inline __attribute__((always_inline)) __m512 mt_exp2_512(__m512 t) {
    t = _mm512_max_ps(_mm512_set1_ps(-160.0f), t); /* -inf -> 2^-160 -> 0 */
    t = _mm512_min_ps(_mm512_set1_ps(129.0f), t);
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n); /* exact, |f| <= 1/2 */
    __m512 p = MT_EXP2_P(MT_POLY512, _mm512_set1_ps, f);
    return _mm512_scalef_ps(p, n);
}

/* 1 / (1 + e^-z) for 16 lanes: 0 for z < -88.7 (e^-z = inf), 1 for large z, NaN -> NaN. */
static inline __attribute__((always_inline)) __m512 mt_sigmoid512(__m512 z) {
    __m512 e = mt_exp512(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

#endif /* __AVX512F__ */

#ifdef __AVX2__
#include <immintrin.h>

/* p x + c on 8 lanes, c a float */
#define MT_POLY256(p, x, c) _mm256_fmadd_ps(p, x, _mm256_set1_ps(c))

/* p 2^n for n a whole number in [-254, 256] (as floats): two exact power-of-two products,
 * each factor a normal float, so the result rounds once where it is normal (the
 * value vscalefps gives), overflows to inf and underflows gradually to 0. */
static inline __attribute__((always_inline)) __m256 mt_scale2_256(__m256 p, __m256 n) {
    __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1);
    __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 b = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

/* e^x for 8 lanes: mt_exp512's method and constants (the same values where normal). */
static inline __attribute__((always_inline)) __m256 mt_exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-110.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(MT_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MT_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MT_EXP_LN2_LO), r);
    __m256 p = MT_EXP_P(MT_POLY256, _mm256_set1_ps, r);
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    return mt_scale2_256(p, n);
}

/* 2^t for 8 lanes (mt_exp2_512's polynomial). */
static inline __attribute__((always_inline)) __m256 mt_exp2_256(__m256 t) {
    t = _mm256_max_ps(_mm256_set1_ps(-160.0f), t);
    t = _mm256_min_ps(_mm256_set1_ps(129.0f), t);
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n); /* exact, |f| <= 1/2 */
    __m256 p = MT_EXP2_P(MT_POLY256, _mm256_set1_ps, f);
    return mt_scale2_256(p, n);
}

static inline __attribute__((always_inline)) __m256 mt_sigmoid256(__m256 z) {
    __m256 e = mt_exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* lanes i < left (of 8) set: a mask for _mm256_maskload_ps / _mm256_maskstore_ps */
static inline __attribute__((always_inline)) __m256i mt_tail_mask256(size_t left) {
    int k = left >= 8 ? 8 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif /* __AVX2__ */

/* Scalar forms, for odd elements. */
static inline float mt_expf(float x) { return expf(x); }
static inline float mt_exp2f(float x) { return exp2f(x); }
static inline float mt_sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

#endif
