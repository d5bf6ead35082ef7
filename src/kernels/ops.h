/* kernels/ops.h — element-wise, head/CE and optimizer kernels on raw pointers
 * (attention: kernels/attention.h).
 *
 * Dimension letters: N rows (= B*T tokens), B batch, T time, C channels (= d),
 * H query heads, G kv heads (Hkv), D head_dim, F hidden size of a SwiGLU, V vocab.
 * A backward "accumulates" (+=) into parameter gradients; activation gradients are
 * overwritten unless the comment says +=. Every optimised kernel has a plain reference
 * (kernels/ref.h) that the tests compare against.
 *
 * Kernels that need scratch take it from the caller (kernels/ws.h): the bf16 row kernels
 * below one fp32 row per thread (their _ws_bytes), the head its packed weight and the
 * GEMMs' buffers. "bf16 mode" is the workspace's precision, ws.bf16 (the head's products
 * run in it); the kernels that only write or read bf16 rows take no mode. */
#ifndef MT_KERNELS_OPS_H
#define MT_KERNELS_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ws.h"

/* out[N,C] = x / sqrt(mean(x^2) + eps) * w;  rstd[N] = 1/sqrt(mean(x^2)+eps) */
void mt_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
/* The same with out written as bf16 (the bits mt_bf16_store writes; bf16 mode only), for a
 * normed input that only products read (train --bf16 without TP or EP). ws: one row of C
 * floats per thread (mt_rmsnorm_fwd16_ws_bytes); called outside parallel regions. */
void mt_rmsnorm_fwd16(mt_ws ws, uint16_t *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
/* inverts the line above: dx[N,C] += d/dx,  dw[C] += d/dw  (dw summed per fixed block of
 * 256 rows, then over the blocks in order: the same bits for any thread count) */
void mt_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                    const float *rstd, int N, int C);

/* RoPE tables, "rotate half": cos/sin[T, D/2] for positions 0..T-1, computed in double. */
void mt_rope_table(float *cos_t, float *sin_t, int T, int D, double theta);
/* In place on x[N, nh, D] where row n has position n % T. flags: MT_ROPE_INVERSE rotates by
 * -angle (the backward of the forward rotation); MT_ROPE_INTERLEAVE pairs neighbouring
 * dimensions (2i, 2i + 1) instead of (i, i + D/2) (config rope_interleave), same angles. */
enum { MT_ROPE_INVERSE = 1, MT_ROPE_INTERLEAVE = 2 };
void mt_rope_apply(float *x, const float *cos_t, const float *sin_t, int N, int T, int nh, int D,
                   int flags);
/* Same with explicit positions pos[N] (< T) of each row, e.g. restarting at every document
 * start in document mode; pos == NULL means n % T. */
void mt_rope_apply_pos(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int N,
                       int T, int nh, int D, int flags);
/* The same on D values of each of nh heads at x + n*ldn + head*ldh (MLA: the RoPE part of
 * every head of q, after its dn unrotated dimensions). */
void mt_rope_apply_ld(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int N, int T, int nh,
                      int D, size_t ldn, size_t ldh, int flags);
/* The forward rotation of x written as bf16 into out (the bits mt_bf16_store writes of what
 * mt_rope_apply_pos leaves in x; x unchanged; bf16 mode only): train --bf16's K, rotated and
 * rounded in one pass. ws: one row of nh D floats per thread (mt_rope_store16_ws_bytes). */
void mt_rope_store16(mt_ws ws, uint16_t *out, const float *x, const float *cos_t, const float *sin_t,
                     const int32_t *pos, int N, int T, int nh, int D, int flags);

/* a[N,F] = silu(g) * u */
void mt_swiglu_fwd(float *a, const float *g, const float *u, size_t n);
/* dg, du from da (overwrite) */
void mt_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u, size_t n);
/* Fused gate|up layout: gu[N, 2F] holds row n as [g(F) | u(F)] (one GEMM computes both).
 * a[N,F] = silu(g) * u ;  the backward writes dgu[N,2F] = [dg | du] from da[N,F]. When
 * wscale != NULL, da of row n is first multiplied by wscale[n] (MoE routing weight). */
void mt_swiglu_rows_fwd(float *a, const float *gu, int N, int F);
void mt_swiglu_rows_bwd(float *dgu, const float *da, const float *gu, const float *wscale, int N, int F);
/* One row of the routed experts' backward: a[F] = silu(g) * u of gu = [g | u] (the
 * activation recomputed), returns a . da (the gradient of the row's routing weight, da the
 * unweighted activation gradient), then a *= w (the weighted activation that the down
 * projection's weight gradient takes). One pass where three went over the rows. */
float mt_swiglu_row_wgrad(float *a, const float *gu, const float *da, float w, int F);
/* The same writing a (dgu) as fp32, or as bf16 (the bits mt_bf16_store writes; bf16 mode
 * only) into a16 (dgu16) when that is not NULL: the activation and gradient that only the
 * bf16 products read, in half the bytes. The returned dot product is the fp32 one. gate|up
 * may be given as bf16 too (gu16 instead of gu: train --bf16 keeps it so); the math is the
 * fp32 math on its values. ws (only read with a bf16 operand): MT_SWIGLU_WS_FLOATS(F) floats
 * per thread, mt_swiglu_ws_bytes; the rows forms run their own parallel loop (so are called
 * outside parallel regions), mt_swiglu_row_wgrad_x uses the calling thread's part. */
#define MT_SWIGLU_WS_FLOATS(F) (4 * (size_t)(F))
void mt_swiglu_rows_fwd_x(mt_ws ws, float *a, uint16_t *a16, const float *gu, const uint16_t *gu16, int N, int F);
float mt_swiglu_row_wgrad_x(mt_ws ws, float *a, uint16_t *a16, const float *gu, const uint16_t *gu16, const float *da,
                            float w, int F);
void mt_swiglu_rows_bwd_x(mt_ws ws, float *dgu, uint16_t *dgu16, const float *da, const float *gu,
                          const uint16_t *gu16, const float *wscale, int N, int F);
/* The row kernels' workspace for nthr threads */
static inline size_t mt_rmsnorm_fwd16_ws_bytes(int C, int nthr) {
    return (size_t)nthr * mt_ws_round(sizeof(float) * (size_t)C);
}
static inline size_t mt_rope_store16_ws_bytes(int nh, int D, int nthr) {
    return (size_t)nthr * mt_ws_round(sizeof(float) * (size_t)nh * D);
}
static inline size_t mt_swiglu_ws_bytes(int F, int nthr) {
    return (size_t)nthr * mt_ws_round(sizeof(float) * MT_SWIGLU_WS_FLOATS(F));
}

/* LM head fused with cross-entropy, over row chunks (no [N,V] logits buffer).
 * x[N,C] final-normed activations, W[V,C]. targets < 0 are ignored.
 * Returns the SUM of per-token losses over valid targets (double). If dx != NULL it
 * writes dx[N,C] = d(loss_sum * grad_scale)/dx and dW[V,C] += ... (training); if
 * logits != NULL the full logits[N,V] are also stored (evaluation, small N).
 * scratch: mt_head_scratch_floats(V) floats. Chunks of MT_HEAD_ROWS rows: the weight
 * gradient's product sums over a chunk's rows, and with 512 (one 768-deep block of the bf16
 * GEMM) it runs its 8192 x 512 fp32 accumulator through memory half as often as with 256. */
#define MT_HEAD_ROWS 512
size_t mt_head_scratch_floats(int V);
/* Memory the head needs besides the scratch: in bf16 mode with more rows than one chunk
 * (MT_HEAD_ROWS), its weight packed in bf16 for the chunks' products (kernels/gemm_bf16.h),
 * one layout for the logits and, when training, one for dx: about 2 V C bytes each. The
 * workspace ws of mt_head_ce is that and the GEMMs' (mt_gemm_ws_bytes) for nthr threads in
 * bf16 mode, nothing in fp32: mt_head_ws_bytes. */
size_t mt_head_packed_bytes(int N, int C, int V, int bf16, int train);
size_t mt_head_ws_bytes(int N, int C, int V, int bf16, int train, int nthr);
/* A per-token objective in place of cross-entropy (RL): for a row with a target, fn gets
 * logp = log softmax(logits / tau)[target] (mt_tempered_logp, the rollout's formula, rounded
 * to float) and returns dL/dlogp (the head then writes dL/dlogits = dL/dlogp * inv_tau *
 * (onehot - softmax)); it may record logp by row. Called from several threads at once, once
 * per row; row = base + the row's index. With an objective the return value is the sum of
 * -logp as the head's float log-softmax gives it (for reports) and grad_scale is unused. */
typedef struct mt_head_obj {
    double inv_tau, tau; /* 1 / tau for the gradient; tau for logp */
    double (*fn)(void *ctx, int64_t row, double logp);
    void *ctx;
    int64_t base;
} mt_head_obj;

/* sum_j exp((l_j - mx) / t) over V fp32 logits in double, terms added in order (mx: their
 * max), and e[j] = (float) of each term when e != NULL; with it, the log-probability of tok
 * under softmax(l / t). One definition for the rollout's behaviour log-probs
 * (mt_sample_token) and the RL trainer's (mt_head_ce with an objective): the same logits give
 * the same bits. */
static inline double mt_tempered_sum(const float *l, int V, double t, float mx, float *e) {
    double sum = 0;
    for (int j = 0; j < V; j++) {
        const double x = exp((double)(l[j] - mx) / t);
        sum += x;
        if (e) e[j] = (float)x;
    }
    return sum;
}
static inline double mt_tempered_logp(const float *l, double t, float mx, int tok, double sum) {
    return (double)(l[tok] - mx) / t - log(sum);
}
double mt_head_ce(mt_ws ws, float *dx, float *dW, float *logits, const float *x, const float *W,
                  const int32_t *targets, int N, int C, int V, float grad_scale, const mt_head_obj *obj, float *scratch);

/* Parallel copy / zero of n floats (large buffers: a serial memcpy would leave the other
 * threads waiting). */
void mt_copy(float *dst, const float *src, size_t n);
void mt_zero(float *dst, size_t n);
/* dst[i] += src[i], in parallel. */
void mt_add(float *dst, const float *src, size_t n);

/* Sum of squares (double, deterministic fixed-chunk order). */
double mt_sumsq(const float *x, size_t n);
/* AdamW on n elements: decoupled weight decay wd (0 for norms).
 * p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p); grads scaled by gscale first. */
void mt_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float wd, float gscale, int step);
/* AdamW over many tensors in one parallel job: tensor i is [off[i], off[i]+len[i]) of the
 * flat buffers with decay flag decay[i] (wd applies when set). Work is split into fixed
 * chunks, so the result does not depend on the thread count. */
void mt_adamw_multi(float *p, const float *g, float *m, float *v, int ntensors, const size_t *off,
                    const size_t *len, const int *decay, float lr, float beta1, float beta2, float eps,
                    float wd, float gscale, int step);

#endif
