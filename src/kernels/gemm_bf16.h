/* kernels/gemm_bf16.h — mixed-precision GEMM for CPUs with AVX512-BF16 (AMD Zen 4, Intel
 * Cooper Lake / Sapphire Rapids): the operands are fp32 in memory and are rounded to
 * bfloat16 (nearest even) while the GEMM packs them, products are summed in fp32 and C stays
 * fp32. This is what mixed-precision training ("autocast") does to a matrix product, without
 * a bf16 copy of any weight or activation: twice the fp32 FMA rate, no extra memory.
 *
 * Same contract as mt_sgemm (row-major, C = alpha*op(A) op(B) + beta*C, beta == 0 never
 * reads C). Threads over the rows (or columns) of C with the OpenMP threads when called
 * outside a parallel region, runs on the calling thread inside one.
 *
 * Every product takes the packing buffers in ws (kernels/ws.h): mt_gemm_ws_bytes(nthr)
 * for nthr threads, the threads it runs on (mt_get_threads() outside a parallel region,
 * that region's team inside one), each using the part of its thread number. */
#ifndef MT_KERNELS_GEMM_BF16_H
#define MT_KERNELS_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ws.h"

/* 1 when this CPU runs the kernel (AVX512F/BW/VL/DQ and AVX512-BF16). */
int mt_bf16_supported(void);
/* f rounded to the nearest bfloat16 (ties to even), returned as fp32: the value the kernel
 * multiplies (except for fp32 denormals, which the kernel's conversion treats as zero).
 * References and tests use it. */
float mt_bf16_round(float f);
/* dst[i] = the bits of bf16(src[i]) as the kernels convert (the rounding above; denormals
 * become a signed zero), threaded: values kept as bf16 for
 * products that read them rounded anyway (train --bf16's attention K and V). Requires
 * mt_bf16_supported(). */
void mt_bf16_store(uint16_t *dst, const float *src, size_t n);
/* The same on the calling thread (for loops already parallel, e.g. over rows). dst may be
 * src's own memory (in place: each value is written after the values it overwrites were
 * read). */
void mt_bf16_store_row(uint16_t *dst, const float *src, size_t n);
/* dst[i] = the fp32 value of the bf16 bits src[i] (exact; the calling thread) */
void mt_bf16_load_row(float *dst, const uint16_t *src, size_t n);
/* Workspace of the products below for nthr threads: about 5 MiB a thread (A's and B's
 * packed blocks), whatever the shape. */
size_t mt_gemm_ws_bytes(int nthr);
/* Requires mt_bf16_supported(). */
void mt_gemm_bf16(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

/* The same product with A or B (or both) given as bf16: exactly one of A and A16 (B and B16)
 * is not NULL; A16 holds the bits mt_bf16_store writes for A's values (same layout, lda in
 * elements). The result has the same bits as mt_gemm_bf16 on the fp32 values: the kernel
 * rounds them so anyway. For activations and gradients that only products read (train
 * --bf16 keeps the normed inputs and the FFNs' scratch so): half the bytes to write and
 * to pack. */
void mt_gemm_bf16_mixed(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                        const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                        float *C, int ldc);
/* The same with what beta scales read from Cin instead of C: C = alpha op(A) op(B) + beta Cin,
 * Cin [M x N] with C's row stride ldc (Cin == C is mt_gemm_bf16_mixed). A residual add in
 * the product's output pass: the same bits as copying Cin to C and then accumulating. */
void mt_gemm_bf16_mixed_cin(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                            const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                            const float *Cin, float *C, int ldc);
/* The product rounded to bf16: C16 = bf16(alpha op(A) op(B)) (the bits mt_bf16_store writes
 * for mt_gemm_bf16_mixed's fp32 C), ldc in elements. For a product whose output only feeds
 * bf16 reads (train --bf16 keeps the FFNs' gate|up so): half the bytes to write, keep and
 * read. With K up to 768 (one K block) the micro-kernel rounds its finished tiles; deeper
 * products go through an fp32 buffer of 256 rows. */
void mt_gemm_bf16_mixed_c16(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                            const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, uint16_t *C16,
                            int ldc);

/* B packed once for many products (a weight that every chunk of rows multiplies): the
 * kernel's packed layout, B(k, n) rounded to bf16, k < K, n < N (transB as for
 * mt_gemm_bf16). packed holds mt_gemm_bf16_packed_words(N, K) words (about N*K/2).
 * mt_gemm_bf16_packed then computes C = alpha op(A) B + beta C without packing B, with the
 * same bits as mt_gemm_bf16 on the fp32 B. Both require mt_bf16_supported(). */
size_t mt_gemm_bf16_packed_words(int N, int K);
void mt_gemm_bf16_pack(uint32_t *packed, int transB, int N, int K, const float *B, int ldb);
/* The same from B or from B16, B given as bf16 (one of the two NULL; see mt_gemm_bf16_mixed) */
void mt_gemm_bf16_pack_x(uint32_t *packed, int transB, int N, int K, const float *B, const uint16_t *B16, int ldb);
void mt_gemm_bf16_packed(mt_ws ws, int transA, int M, int N, int K, float alpha, const float *A, int lda,
                         const uint32_t *packed, float beta, float *C, int ldc);
/* The same with A given as bf16 instead (A16, A NULL) */
void mt_gemm_bf16_packed_x(mt_ws ws, int transA, int M, int N, int K, float alpha, const float *A, const uint16_t *A16,
                           int lda, const uint32_t *packed, float beta, float *C, int ldc);

#endif
