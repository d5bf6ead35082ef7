/* kernels/ref.c — plain single-threaded references of the kernels in ops.c / blas.c
 * (contracts in ref.h). Naive loops with double accumulators; temporaries on the heap.
 * Nothing here is tuned: if a line looks clever, it is a bug. */
#include "kernels/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* ---- dense products ----------------------------------------------------------------- */

void mt_ref_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int p = 0; p < K; p++) {
                double a = transA ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                double b = transB ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            double prev = beta == 0.0f ? 0.0 : (double)beta * *c;
            *c = (float)(alpha * acc + prev);
        }
}

void mt_ref_linear_fwd(float *out, const float *in, const float *W, int N, int In, int O,
                       float beta) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double acc = 0.0;
            for (int i = 0; i < In; i++) acc += (double)in[(size_t)n * In + i] * W[(size_t)o * In + i];
            float *y = &out[(size_t)n * O + o];
            *y = (float)(acc + (beta == 0.0f ? 0.0 : (double)beta * *y));
        }
}

void mt_ref_linear_bwd(float *din, float *dW, const float *dout, const float *in,
                       const float *W, int N, int In, int O, float beta_in) {
    if (din)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < In; i++) {
                double acc = 0.0;
                for (int o = 0; o < O; o++) acc += (double)dout[(size_t)n * O + o] * W[(size_t)o * In + i];
                float *d = &din[(size_t)n * In + i];
                *d = (float)(acc + (beta_in == 0.0f ? 0.0 : (double)beta_in * *d));
            }
    if (dW)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < In; i++) {
                double acc = 0.0;
                for (int n = 0; n < N; n++) acc += (double)dout[(size_t)n * O + o] * in[(size_t)n * In + i];
                dW[(size_t)o * In + i] = (float)(dW[(size_t)o * In + i] + acc);
            }
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

void mt_ref_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C,
                        float eps) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double ss = 0.0;
        for (int j = 0; j < C; j++) ss += (double)xr[j] * xr[j];
        double r = 1.0 / sqrt(ss / C + (double)eps);
        rstd[n] = (float)r;
        for (int j = 0; j < C; j++) out[(size_t)n * C + j] = (float)(xr[j] * r * w[j]);
    }
}

/* y_j = x_j r w_j with r = (mean(x^2)+eps)^(-1/2), dr/dx_k = -r^3 x_k / C, so
 * dx_k = r w_k dy_k - x_k r^3 / C * sum_j dy_j w_j x_j;  dw_j = sum_n dy_j x_j r. */
void mt_ref_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C) {
    double *dwacc = dw ? mt_xcalloc((size_t)C, sizeof(double)) : NULL;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        double r = rstd[n], dot = 0.0;
        for (int j = 0; j < C; j++) dot += (double)dy[j] * w[j] * xr[j];
        for (int j = 0; j < C; j++) {
            double d = r * w[j] * dy[j] - xr[j] * r * r * r / C * dot;
            dx[(size_t)n * C + j] = (float)(dx[(size_t)n * C + j] + d);
            if (dwacc) dwacc[j] += (double)dy[j] * xr[j] * r;
        }
    }
    if (dw)
        for (int j = 0; j < C; j++) dw[j] = (float)(dw[j] + dwacc[j]);
    free(dwacc);
}

/* ---- RoPE --------------------------------------------------------------------------- */

void mt_ref_rope_apply(float *x, int N, int T, int nh, int D, double theta, int flags) {
    mt_ref_rope_apply_pos(x, NULL, N, T, nh, D, theta, flags);
}

void mt_ref_rope_apply_pos(float *x, const int32_t *pos, int N, int T, int nh, int D, double theta,
                           int flags) {
    const int inverse = flags & 1, inter = flags & 2; /* MT_ROPE_INVERSE, MT_ROPE_INTERLEAVE */
    MT_ASSERT(D % 2 == 0 && T > 0);
    int half = D / 2;
    for (int n = 0; n < N; n++) {
        int t = pos ? pos[n] : n % T;
        for (int hd = 0; hd < nh; hd++) {
            float *v = x + ((size_t)n * nh + hd) * D;
            for (int i = 0; i < half; i++) {
                double a = (double)t * pow(theta, -2.0 * i / (double)D);
                if (inverse) a = -a;
                const int i1 = inter ? 2 * i : i, i2 = inter ? 2 * i + 1 : i + half;
                double c = cos(a), s = sin(a), x1 = v[i1], x2 = v[i2];
                v[i1] = (float)(x1 * c - x2 * s);
                v[i2] = (float)(x2 * c + x1 * s);
            }
        }
    }
}

/* ---- SwiGLU ------------------------------------------------------------------------- */

static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

void mt_ref_swiglu_fwd(float *a, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = (float)((double)g[i] * sigmoid(g[i]) * u[i]);
}

/* d silu(z)/dz = s + z s (1 - s), s = sigmoid(z) */
void mt_ref_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u,
                       size_t n) {
    for (size_t i = 0; i < n; i++) {
        double z = g[i], s = sigmoid(z);
        du[i] = (float)((double)da[i] * z * s);
        dg[i] = (float)((double)da[i] * u[i] * (s + z * s * (1.0 - s)));
    }
}

/* ---- attention ---------------------------------------------------------------------- */

/* Offsets into q/out [B,T,H,D] and k/v [B,T,G,D]. */
static size_t qidx(int b, int t, int h, int T, int H, int D) {
    return (((size_t)b * T + t) * H + h) * D;
}
static size_t kidx(int b, int t, int g, int T, int G, int D) {
    return (((size_t)b * T + t) * G + g) * D;
}

/* First key row i of sequence b sees (0 without pos). */
static int ref_first_key(const int32_t *pos, int b, int i, int T) {
    return pos ? i - pos[(size_t)b * T + i] : 0;
}

/* P[T,T] = masked softmax of the scaled scores of (b, h); lse[T] of each row. Entries a
 * row does not see (after it, or before its document) are 0. */
static void ref_attention_probs(double *P, double *lse, const float *q, const float *k,
                                const int32_t *pos, int b, int h, int T, int H, int G, int D) {
    int g = h / (H / G);
    double scale = 1.0 / sqrt((double)D);
    for (int i = 0; i < T; i++) {
        double *p = P + (size_t)i * T, m = -INFINITY;
        int j0 = ref_first_key(pos, b, i, T);
        MT_ASSERT(j0 >= 0 && j0 <= i);
        for (int j = 0; j < T; j++) {
            if (j > i || j < j0) { p[j] = 0.0; continue; }
            const float *qi = q + qidx(b, i, h, T, H, D), *kj = k + kidx(b, j, g, T, G, D);
            double s = 0.0;
            for (int c = 0; c < D; c++) s += (double)qi[c] * kj[c];
            p[j] = s * scale;
            if (p[j] > m) m = p[j];
        }
        double sum = 0.0;
        for (int j = j0; j <= i; j++) sum += exp(p[j] - m);
        lse[i] = m + log(sum);
        for (int j = j0; j <= i; j++) p[j] = exp(p[j] - lse[i]);
    }
}

void mt_ref_attention_fwd(float *out, float *lse, const float *q, const float *k,
                          const float *v, const int32_t *pos, int B, int T, int H, int G,
                          int D) {
    MT_ASSERT(G > 0 && H % G == 0);
    double *P = mt_xmalloc(sizeof(double) * (size_t)T * T);
    double *l = mt_xmalloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / G);
            ref_attention_probs(P, l, q, k, pos, b, h, T, H, G, D);
            for (int i = 0; i < T; i++) {
                lse[((size_t)b * H + h) * T + i] = (float)l[i];
                float *o = out + qidx(b, i, h, T, H, D);
                for (int c = 0; c < D; c++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += P[(size_t)i * T + j] * v[kidx(b, j, g, T, G, D) + c];
                    o[c] = (float)acc;
                }
            }
        }
    free(P);
    free(l);
}

/* With s = scale q.k, P = softmax(s), o = P v:
 *   dv_j += sum_i P_ij do_i;  dP_ij = do_i . v_j;  dS_ij = P_ij (dP_ij - sum_l P_il dP_il)
 *   dq_i = scale sum_j dS_ij k_j;  dk_j += scale sum_i dS_ij q_i. */
void mt_ref_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const int32_t *pos, int B, int T,
                          int H, int G, int D) {
    MT_ASSERT(G > 0 && H % G == 0);
    const double scale = 1.0 / sqrt((double)D);
    size_t nkv = (size_t)B * T * G * D;
    double *P = mt_xmalloc(sizeof(double) * (size_t)T * T);
    double *dS = mt_xmalloc(sizeof(double) * (size_t)T * T);
    double *l = mt_xmalloc(sizeof(double) * (size_t)T);
    double *dk_acc = mt_xcalloc(nkv, sizeof(double));
    double *dv_acc = mt_xcalloc(nkv, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / G);
            ref_attention_probs(P, l, q, k, pos, b, h, T, H, G, D);
            for (int i = 0; i < T; i++) {
                const float *doi = dout + qidx(b, i, h, T, H, D);
                double rowdot = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *vj = v + kidx(b, j, g, T, G, D);
                    double dp = 0.0;
                    for (int c = 0; c < D; c++) dp += (double)doi[c] * vj[c];
                    dS[(size_t)i * T + j] = dp;
                    rowdot += P[(size_t)i * T + j] * dp;
                }
                for (int j = 0; j <= i; j++) {
                    double pij = P[(size_t)i * T + j];
                    dS[(size_t)i * T + j] = pij * (dS[(size_t)i * T + j] - rowdot);
                    double *dvj = dv_acc + kidx(b, j, g, T, G, D);
                    for (int c = 0; c < D; c++) dvj[c] += pij * doi[c];
                }
            }
            for (int i = 0; i < T; i++) {
                const float *qi = q + qidx(b, i, h, T, H, D);
                float *dqi = dq + qidx(b, i, h, T, H, D);
                for (int c = 0; c < D; c++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += dS[(size_t)i * T + j] * k[kidx(b, j, g, T, G, D) + c];
                    dqi[c] = (float)(acc * scale);
                }
                for (int j = 0; j <= i; j++) {
                    double *dkj = dk_acc + kidx(b, j, g, T, G, D);
                    double d = dS[(size_t)i * T + j] * scale;
                    for (int c = 0; c < D; c++) dkj[c] += d * qi[c];
                }
            }
        }
    for (size_t i = 0; i < nkv; i++) {
        dk[i] = (float)dk_acc[i];
        dv[i] = (float)dv_acc[i];
    }
    free(P); free(dS); free(l); free(dk_acc); free(dv_acc);
}

/* ---- LM head + cross-entropy -------------------------------------------------------- */

double mt_ref_head_ce(float *dx, float *dW, float *logits, const float *x, const float *W,
                      const int32_t *targets, int N, int C, int V, float grad_scale) {
    double *l = mt_xmalloc(sizeof(double) * (size_t)(V > 0 ? V : 1));
    double *dW_acc = dx && dW ? mt_xcalloc((size_t)V * C, sizeof(double)) : NULL;
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double m = -INFINITY;
        for (int j = 0; j < V; j++) {
            double acc = 0.0;
            for (int c = 0; c < C; c++) acc += (double)xr[c] * W[(size_t)j * C + c];
            l[j] = acc;
            if (acc > m) m = acc;
            if (logits) logits[(size_t)n * V + j] = (float)acc;
        }
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp(l[j] - m);
        double lse = m + log(sum);
        int tgt = targets[n];
        MT_ASSERT(tgt < V);
        if (tgt >= 0) total += lse - l[tgt];
        if (!dx) continue;
        float *dxr = dx + (size_t)n * C;
        if (tgt < 0) { memset(dxr, 0, sizeof(float) * (size_t)C); continue; }
        /* dlogit_j = grad_scale * (softmax_j - [j == tgt]) */
        for (int j = 0; j < V; j++) l[j] = grad_scale * (exp(l[j] - lse) - (j == tgt ? 1.0 : 0.0));
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int j = 0; j < V; j++) acc += l[j] * W[(size_t)j * C + c];
            dxr[c] = (float)acc;
        }
        if (dW_acc)
            for (int j = 0; j < V; j++)
                for (int c = 0; c < C; c++) dW_acc[(size_t)j * C + c] += l[j] * xr[c];
    }
    if (dW_acc)
        for (size_t i = 0; i < (size_t)V * C; i++) dW[i] = (float)(dW[i] + dW_acc[i]);
    free(dW_acc);
    free(l);
    return total;
}

/* ---- reductions and optimizer ------------------------------------------------------- */

double mt_ref_sumsq(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void mt_ref_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float gscale, int step) {
    MT_ASSERT(step >= 1);
    double b1 = beta1, b2 = beta2;
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * gscale;
        double mi = b1 * m[i] + (1.0 - b1) * gi;
        double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
        double pi = (double)p[i] * (1.0 - (double)lr * wd);
        pi -= (double)lr * (mi / bc1) / (sqrt(vi / bc2) + (double)eps);
        m[i] = (float)mi;
        v[i] = (float)vi;
        p[i] = (float)pi;
    }
}
