/* kernels/gemm_bf16.h — mixed-precision GEMM for CPUs with AVX512-BF16 (AMD Zen 4, Intel
 * Cooper Lake / Sapphire Rapids): the operands are fp32 in memory and are rounded to
 * bfloat16 (nearest even) while the GEMM packs them, products are summed in fp32 and C stays
 * fp32. This is what mixed-precision training ("autocast") does to a matrix product, without
 * a bf16 copy of any weight or activation: twice the fp32 FMA rate, no extra memory.
 *
 * Same contract as mt_sgemm (row-major, C = alpha*op(A) op(B) + beta*C, beta == 0 never
 * reads C). Threads over the rows (or columns) of C with the OpenMP threads when called
 * outside a parallel region, runs on the calling thread inside one. */
#ifndef MT_KERNELS_GEMM_BF16_H
#define MT_KERNELS_GEMM_BF16_H

/* 1 when this CPU runs the kernel (AVX512F/BW/VL/DQ and AVX512-BF16). */
int mt_bf16_supported(void);
/* f rounded to the nearest bfloat16 (ties to even), returned as fp32: the value the kernel
 * multiplies (except for fp32 denormals, which the kernel's conversion treats as zero).
 * References and tests use it. */
float mt_bf16_round(float f);
/* Requires mt_bf16_supported(). */
void mt_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

#endif
