/* kernels/rows.h — the decode's fp32 products: C = alpha A B^T + beta C for a few rows of A.
 *
 * A decode step multiplies a few rows (64 tokens, ~8 per routed expert) by every weight
 * matrix once. OpenBLAS packs the whole weight into its own layout on every call, which
 * costs as much as the product at that size. This kernel reads each weight row where it lies:
 * a block of weight rows stays in L1 while every row of A is multiplied by it, and A stays in
 * L1/L2 while the weight streams through once per call.
 *
 * C[M,N] = alpha A[M,K] B[N,K]^T + beta C (row-major, leading dimensions lda, ldb, ldc;
 * beta 0: C is not read). Each element is its own fixed-order sum (SIMD-lane partial sums
 * over k, then a fixed reduction tree): its bits depend on its row of A, its row of B and K
 * only, never on M, N, the blocking or the threads. Threads split N when called outside a
 * parallel region; inside one, the calling thread does it all.
 *
 * The decoder runs it (kernels/ws.h: ws.rows; MT_DECODE_BLAS=1 turns it off, to compare), and
 * so does RL's trainer in its forwards (model.h: mt_acts_fwd_rows), so that the two compute the
 * same log-probs to the bit; pretraining keeps OpenBLAS. Compiled per CPU tier
 * (kernels/tier.h): AVX-512 sums 16 lanes, AVX2 8, so the tiers differ in the last bits. */
#ifndef MT_KERNELS_ROWS_H
#define MT_KERNELS_ROWS_H

void mt_rows_gemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc);

#endif
