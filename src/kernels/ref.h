/* kernels/ref.h — plain reference implementations of every kernel in ops.h and blas.h.
 *
 * These are the oracle the kernel tests compare the optimised code against: naive loops,
 * one thread, double accumulation, no tiling, no BLAS. Arguments follow ops.h / blas.h
 * (same order, same dimension letters, same overwrite / += conventions) with the prefix
 * mt_ref_ instead of mt_; the differences are named at each function (no scratch or
 * thread-count arguments; RoPE takes theta instead of tables; the attention backward
 * recomputes the probabilities from q and k instead of trusting the forward's out/lse).
 * Speed is irrelevant here: obviousness is the point. */
#ifndef MT_KERNELS_REF_H
#define MT_KERNELS_REF_H

#include <stddef.h>
#include <stdint.h>

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
 * A is [M,lda] (or [K,lda] when transA), B is [K,ldb] (or [N,ldb] when transB).
 * beta == 0 means C is not read (BLAS convention). */
void mt_ref_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* out[N,O] = beta*out + in[N,In] @ W[O,In]^T   (beta == 0: out not read) */
void mt_ref_linear_fwd(float *out, const float *in, const float *W, int N, int In, int O,
                       float beta);
/* din[N,In] = beta_in*din + dout[N,O] @ W[O,In]   (skipped when din == NULL)
 * dW[O,In] += dout[N,O]^T @ in[N,In]              (skipped when dW == NULL) */
void mt_ref_linear_bwd(float *din, float *dW, const float *dout, const float *in,
                       const float *W, int N, int In, int O, float beta_in);

/* out[N,C] = x[N,C] / sqrt(mean(x^2) + eps) * w[C];  rstd[N] = 1/sqrt(mean(x^2)+eps) */
void mt_ref_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C,
                        float eps);
/* Backward of the line above: dx[N,C] += d/dx, dw[C] += d/dw (dw may be NULL).
 * rstd[N] is the forward's (it is the value the backward linearises around). */
void mt_ref_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C);

/* In place on x[N, nh, D], row n at position t = n % T, "rotate half" (docs/FORMATS.md):
 *   out[i]     = x[i] cos a - x[i+D/2] sin a
 *   out[i+D/2] = x[i+D/2] cos a + x[i] sin a,    a = t * theta^(-2i/D), i < D/2,
 * with a, cos a, sin a computed in double (no tables). inverse=1 rotates by -a. */
void mt_ref_rope_apply(float *x, int N, int T, int nh, int D, double theta, int flags);
/* The same with row n at position pos[n] (document mode); pos == NULL means n % T. flags as
 * mt_rope_apply's: 1 inverse, 2 interleaved pairs (2i, 2i + 1). */
void mt_ref_rope_apply_pos(float *x, const int32_t *pos, int N, int T, int nh, int D, double theta,
                           int flags);

/* a[n] = silu(g) * u = g / (1 + exp(-g)) * u */
void mt_ref_swiglu_fwd(float *a, const float *g, const float *u, size_t n);
/* dg[n], du[n] (overwrite) from da[n] */
void mt_ref_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u,
                       size_t n);

/* Causal GQA attention, unfused: the full T x T score matrix of each (b, h) is built.
 * q[B,T,H,D], k,v[B,T,G,D] -> out[B,T,H,D], lse[B,H,T] (natural log-sum-exp of each row
 * of scaled scores s = q.k / sqrt(D)). Query head h reads kv head h / (H/G). Query t
 * sees keys j with t - pos[t] <= j <= t (pos[B*T]: position inside the document, as in
 * kernels/attention.h; NULL = positions 0..T-1, plain causal). */
void mt_ref_attention_fwd(float *out, float *lse, const float *q, const float *k,
                          const float *v, const int32_t *pos, int B, int T, int H, int G,
                          int D);
/* dq[B,T,H,D], dk, dv[B,T,G,D] (all overwrite) from dout[B,T,H,D]; recomputes the
 * softmax from q and k (no out/lse inputs, so a wrong forward cannot hide a wrong
 * backward). */
void mt_ref_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const int32_t *pos, int B, int T,
                          int H, int G, int D);

/* LM head + cross-entropy: logits[N,V] = x[N,C] @ W[V,C]^T; returns the SUM over rows with
 * targets[n] >= 0 of lse(logits[n]) - logits[n][targets[n]] (rows with target < 0 are
 * ignored). If dx != NULL: dx[N,C] = d(loss_sum*grad_scale)/dx (overwrite; zero rows for
 * ignored targets) and, if dW != NULL, dW[V,C] += d(loss_sum*grad_scale)/dW. If logits !=
 * NULL the logits are stored. */
double mt_ref_head_ce(float *dx, float *dW, float *logits, const float *x, const float *W,
                      const int32_t *targets, int N, int C, int V, float grad_scale);

/* Sum of squares of x[n], double. */
double mt_ref_sumsq(const float *x, size_t n);

/* One AdamW step (PyTorch torch.optim.AdamW, decoupled decay) on p[n], m[n], v[n]:
 *   g' = gscale * g;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
 *   p = p * (1 - lr wd) - lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
 * in double per element (state stored back as float). step counts from 1. */
void mt_ref_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float gscale, int step);

#endif
