/* kernels/bf16_pack.h — fp32 to bf16 pairs, the operand layout of VDPBF16PS (lane j of the
 * result += a.lo*b.lo + a.hi*b.hi over a 32-bit word of two bf16), shared by the bf16 GEMM
 * (gemm_bf16.c) and bf16 attention (attention.c). Conversion rounds to nearest even
 * (VCVTNE2PS2BF16). Include where AVX512-BF16 code is compiled: the functions carry the
 * target attribute, their callers must have it (or -march with it). */
#ifndef MT_KERNELS_BF16_PACK_H
#define MT_KERNELS_BF16_PACK_H

#include <immintrin.h>
#include <stdint.h>

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

#endif
