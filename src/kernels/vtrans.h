/* kernels/vtrans.h — in-register transpose of a 16 x 16 block of 32-bit words (floats, or
 * bf16 pairs), shared by the bf16 GEMM's packing (gemm_bf16.c) and attention's layout
 * changes (attention.c). The function carries the AVX-512F target attribute; callers must
 * have it (or -march with it). */
#ifndef MT_KERNELS_VTRANS_H
#define MT_KERNELS_VTRANS_H

#include <immintrin.h>

/* r[i] word j -> r[j] word i */
__attribute__((target("avx512f"), always_inline)) static inline void mt_transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* each 128-bit lane now holds a transposed 4 x 4 block; move the blocks */
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

#endif
