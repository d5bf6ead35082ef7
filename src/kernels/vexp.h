/* kernels/vexp.h — vectorised exp, exp2 and sigmoid shared by the kernels (attention's
 * softmax, the SwiGLU gates, the LM head's softmax).
 *
 * With AVX-512 each function maps 16 floats; without it the scalar forms below are the
 * fallback (libm). Header-only and static inline so the polynomials inline into the
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

#ifdef __AVX512F__
#include <immintrin.h>

/* e^x for 16 lanes. */
static inline __attribute__((always_inline)) __m512 mt_exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x); /* below: 2^-159 * p rounds to 0 */
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);   /* above: 2^128 * p overflows to inf */
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

/* 2^t for 16 lanes, for t >= -160 or NaN (callers pass t <= 0 or clamp themselves; the
 * attention softmax feeds t = s - max, and -inf for masked scores is clamped here). */
static inline __attribute__((always_inline)) __m512 mt_exp2_512(__m512 t) {
    t = _mm512_max_ps(_mm512_set1_ps(-160.0f), t); /* -inf -> 2^-160 -> 0 */
    t = _mm512_min_ps(_mm512_set1_ps(129.0f), t);
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n); /* exact, |f| <= 1/2 */
    __m512 p = _mm512_set1_ps(1.535335614e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887735e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437849e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332367e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264774e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471825e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 1 / (1 + e^-z) for 16 lanes: 0 for z < -88.7 (e^-z = inf), 1 for large z, NaN -> NaN. */
static inline __attribute__((always_inline)) __m512 mt_sigmoid512(__m512 z) {
    __m512 e = mt_exp512(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

#endif /* __AVX512F__ */

/* Scalar forms: the fallback without AVX-512 and for odd elements. */
static inline float mt_expf(float x) { return expf(x); }
static inline float mt_exp2f(float x) { return exp2f(x); }
static inline float mt_sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

#endif
