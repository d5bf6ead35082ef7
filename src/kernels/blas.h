/* kernels/blas.h — dense matrix products through CBLAS (OpenBLAS, OpenMP flavour), and
 * the check that OpenBLAS runs a kernel that fits this CPU.
 *
 * Layout: row-major; a linear layer's weight W is [O, I] and is applied as y = x W^T
 * (PyTorch nn.Linear). Shapes: N rows (tokens), I inputs, O outputs.
 *
 * Every product takes the caller's workspace ws (kernels/ws.h), whose ws.bf16 says the
 * precision it runs in: bf16 (mixed precision, kernels/gemm_bf16.h, which packs its operands
 * in ws: mt_gemm_ws_bytes(threads)) or fp32 (OpenBLAS, which does not read ws, so there an
 * empty one ({0}) will do). "bf16 mode" below means ws.bf16. */
#ifndef MT_KERNELS_BLAS_H
#define MT_KERNELS_BLAS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ws.h"

/* Call first thing in main(), before any BLAS call. Debian's OpenBLAS 0.3.21 picks its
 * kernel from a CPU table that may not know this CPU and then falls back to a slow
 * generic one. If the kernel tier in use (kernels/tier.h) is avx512 or above but OpenBLAS
 * chose a kernel without AVX-512, this re-executes the program with
 * OPENBLAS_CORETYPE=SkylakeX; in the avx2 tier, with Haswell when OpenBLAS chose a kernel
 * without AVX2 or one with AVX-512 (as an AVX2 CPU would run). OpenBLAS reads it only at
 * load time; a given OPENBLAS_CORETYPE is kept. It also sets OMP_WAIT_POLICY=passive when unset (spinning
 * OpenMP threads starve a shared machine), then with a short spin before sleeping
 * (GOMP_SPINCOUNT=5000) unless that is set or the threads of all ranks on the node do not
 * fit its CPUs. MT_NO_BLAS_FIX=1 disables all of it. argv must be main's argv. */
void mt_blas_init(int argc, char **argv);
/* The kernel name OpenBLAS reports ("SkylakeX", "Haswell", ...). */
const char *mt_blas_corename(void);
/* Threads the BLAS and our OpenMP loops use. */
void mt_set_threads(int n);
int mt_get_threads(void);

/* out[N,O] = beta*out + in[N,In] @ W[O,In]^T */
void mt_linear_fwd(mt_ws ws, float *out, const float *in, const float *W, int N, int In, int O, float beta);
/* din[N,In] = beta_in*din + dout[N,O] @ W[O,In]   (skipped when din == NULL)
 * dW[O,In] += dout[N,O]^T @ in[N,In]              (skipped when dW == NULL) */
void mt_linear_bwd(mt_ws ws, float *din, float *dW, const float *dout, const float *in, const float *W,
                   int N, int In, int O, float beta_in);
/* The same with an activation or gradient that only products read given as bf16 instead
 * (train --bf16 keeps some so): of each pair (A, A16), (in, in16), (dout, dout16) one is
 * given, the other NULL (either may be NULL where the product that reads it is skipped).
 * A bf16 operand needs bf16 mode (mt_gemm_bf16_mixed: the same bits as from the fp32
 * values it rounds); with none these are mt_sgemm, mt_linear_fwd and mt_linear_bwd. */
void mt_sgemm_x(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, const uint16_t *A16,
                int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc);
/* mt_linear_fwd_x may also write its output as bf16 (out16 instead of out, beta 0; bf16 mode:
 * the bits mt_bf16_store writes for the fp32 output, mt_gemm_bf16_mixed_c16) */
void mt_linear_fwd_x(mt_ws ws, float *out, uint16_t *out16, const float *in, const uint16_t *in16, const float *W, int N,
                     int In, int O, float beta);
void mt_linear_bwd_x(mt_ws ws, float *din, float *dW, const float *dout, const uint16_t *dout16, const float *in,
                     const uint16_t *in16, const float *W, int N, int In, int O, float beta_in);
/* out[N,O] = res[N,O] + in[N,In] @ W[O,In]^T (in or in16 as above): a residual add. In bf16
 * mode the product reads res in its output pass (mt_gemm_bf16_mixed_cin), else res is copied
 * to out first (res == out: accumulate); the same bits either way. */
void mt_linear_fwd_res(mt_ws ws, float *out, const float *res, const float *in, const uint16_t *in16, const float *W, int N,
                       int In, int O);
/* dW[i][O[i],In] += dout[i][N,O[i]]^T @ in[N,In] for i < n: the weight gradients of linear
 * layers that read one input (q, k and v). In bf16 mode, when the scratch pack holds
 * mt_gemm_bf16_packed_words(In, N) words (pack_words), `in` is packed (rounded) once for all
 * of them instead of by every product on every thread; the same bits either way. `in` may
 * be given as bf16 instead (in16; one of the two NULL; see mt_linear_bwd_x). */
void mt_linear_bwd_weight_shared(mt_ws ws, int n, float *const *dW, const float *const *dout, const int *O,
                                 const float *in, const uint16_t *in16, int N, int In, void *pack,
                                 size_t pack_words);
/* General strided GEMM: C[M,N] = alpha*op(A) op(B) + beta*C, row-major, fp32 in memory.
 * Runs OpenBLAS SGEMM, or in bf16 mode (ws.bf16) the mixed-precision kernel of
 * kernels/gemm_bf16.h: operands rounded to bfloat16, products summed in fp32. */
void mt_sgemm(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* C = beta*C, and 0 (not read) when beta == 0: a GEMM with K = 0. */
void mt_gemm_scale_c(int M, int N, float beta, float *C, int ldc);

/* Whether mixed precision (on != 0) can run here: 0, or -1 with mt_last_error() set below
 * the avx512bf16 kernel tier (kernels/tier.h). Whoever takes a precision from the user
 * (--bf16) checks it before building the objects that run in it (ws.bf16). */
int mt_gemm_bf16_check(int on);

/* Thread-seconds of useful work since an arbitrary origin: the time every thread spent
 * running the bodies of top-level OpenMP parallel regions (ours and OpenBLAS's) plus the
 * main thread's time outside them (kernels/busy.c). Over a span of wall time dt with n
 * threads, 1 - (difference) / (n dt) is the share of thread time spent waiting or
 * synchronising: thread wake-ups, unequal shares of work, serial code, whether the threads
 * sleep or spin meanwhile. Falls back to process CPU time if the program was not built
 * with GCC's libgomp (then spinning would count as work). */
double mt_busy_time(void);
/* Top-level parallel regions started so far. */
long mt_parallel_regions(void);

/* Measured GEMM throughput (GFLOP/s) of an n^3 GEMM with the current threads, in bf16 (1)
 * or fp32 (0). */
double mt_gemm_gflops(int n, double min_seconds, int bf16);

#endif
