/* kernels/vecw.h — the tier's widest float vector, for kernels written once for both widths
 * (kernels/tier.h compiles them per tier): 16 lanes with AVX-512, 8 with AVX2. Lane-wise
 * operations only, so a kernel's per-lane arithmetic is the same at either width; masked
 * loads and stores for tails (lanes i < left). */
#ifndef MT_KERNELS_VECW_H
#define MT_KERNELS_VECW_H

#include <stddef.h>
#include <immintrin.h>

#include "kernels/vdot.h"
#include "kernels/vexp.h"

#ifdef __AVX512F__
enum { MT_VW = 16 };
typedef __m512 mt_vf;
typedef __mmask16 mt_vmask;
#define mt_vf_zero _mm512_setzero_ps
#define mt_vf_set1 _mm512_set1_ps
#define mt_vf_load _mm512_loadu_ps
#define mt_vf_store _mm512_storeu_ps
#define mt_vf_fma _mm512_fmadd_ps
#define mt_vf_mul _mm512_mul_ps
#define mt_vf_sub _mm512_sub_ps
#define mt_vf_exp2 mt_exp2_512
#define mt_vf_first _mm512_cvtss_f32
static inline mt_vmask mt_vf_tail(size_t left) { return vdot_tail_mask(left); }
static inline mt_vf mt_vf_load_tail(const float *p, mt_vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void mt_vf_store_tail(float *p, mt_vmask m, mt_vf x) { _mm512_mask_storeu_ps(p, m, x); }
#else
enum { MT_VW = 8 };
typedef __m256 mt_vf;
typedef __m256i mt_vmask;
#define mt_vf_zero _mm256_setzero_ps
#define mt_vf_set1 _mm256_set1_ps
#define mt_vf_load _mm256_loadu_ps
#define mt_vf_store _mm256_storeu_ps
#define mt_vf_fma _mm256_fmadd_ps
#define mt_vf_mul _mm256_mul_ps
#define mt_vf_sub _mm256_sub_ps
#define mt_vf_exp2 mt_exp2_256
#define mt_vf_first _mm256_cvtss_f32
static inline mt_vmask mt_vf_tail(size_t left) { return mt_tail_mask256(left); }
static inline mt_vf mt_vf_load_tail(const float *p, mt_vmask m) { return _mm256_maskload_ps(p, m); }
static inline void mt_vf_store_tail(float *p, mt_vmask m, mt_vf x) { _mm256_maskstore_ps(p, m, x); }
#endif

#endif
