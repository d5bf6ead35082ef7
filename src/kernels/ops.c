/* kernels/ops.c — optimised element-wise, attention, head/CE and optimizer kernels
 * (contracts in ops.h; plain references in ref.c). */
#include "kernels/ops.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"

void mt_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float ss = 0.0f;
        for (int j = 0; j < C; j++) ss += xr[j] * xr[j];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        for (int j = 0; j < C; j++) o[j] = xr[j] * r * w[j];
    }
}

void mt_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                    const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int j = 0; j < C; j++) dot += dy[j] * w[j] * xr[j];
        float c = dot * r * r / (float)C;
        float *d = dx + (size_t)n * C;
        for (int j = 0; j < C; j++) d[j] += r * (dy[j] * w[j] - xr[j] * c);
    }
    if (!dw) return;
    /* column blocks: each dw[j] sums over rows in a fixed order (thread-count independent) */
    const int CB = 16;
#pragma omp parallel for schedule(static)
    for (int j0 = 0; j0 < C; j0 += CB) {
        int j1 = j0 + CB < C ? j0 + CB : C;
        float acc[16] = {0};
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
            float r = rstd[n];
            for (int j = j0; j < j1; j++) acc[j - j0] += dy[j] * xr[j] * r;
        }
        for (int j = j0; j < j1; j++) dw[j] += acc[j - j0];
    }
}

void mt_rope_table(float *cos_t, float *sin_t, int T, int D, double theta) {
    int h = D / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < h; i++) {
            double inv = pow(theta, -2.0 * i / (double)D);
            double a = (double)t * inv;
            cos_t[(size_t)t * h + i] = (float)cos(a);
            sin_t[(size_t)t * h + i] = (float)sin(a);
        }
}

void mt_rope_apply(float *x, const float *cos_t, const float *sin_t, int N, int T, int nh, int D,
                   int inverse) {
    int h = D / 2;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int t = n % T;
        const float *c = cos_t + (size_t)t * h, *s = sin_t + (size_t)t * h;
        for (int head = 0; head < nh; head++) {
            float *v = x + ((size_t)n * nh + head) * D;
            for (int i = 0; i < h; i++) {
                float x1 = v[i], x2 = v[i + h];
                float si = inverse ? -s[i] : s[i];
                v[i] = x1 * c[i] - x2 * si;
                v[i + h] = x2 * c[i] + x1 * si;
            }
        }
    }
}

void mt_swiglu_fwd(float *a, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float z = g[i];
        a[i] = z / (1.0f + expf(-z)) * u[i];
    }
}

void mt_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float z = g[i];
        float sg = 1.0f / (1.0f + expf(-z));
        float silu = z * sg;
        du[i] = da[i] * silu;
        dg[i] = da[i] * u[i] * sg * (1.0f + z * (1.0f - sg));
    }
}

enum { ATT_BQ = 64 };

size_t mt_attention_scratch_floats(int T) { return 2 * (size_t)ATT_BQ * (size_t)T; }

void mt_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                      int B, int T, int H, int G, int D, float *scratch, int nthr) {
    MT_ASSERT(H % G == 0);
    const int rep = H / G;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = mt_attention_scratch_floats(T);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * H; task++) {
        int b = task / H, h = task % H, g = h / rep;
        float *S = scratch + (size_t)omp_get_thread_num() * per;
        const float *kb = k + ((size_t)b * T * G + g) * D;
        const float *vb = v + ((size_t)b * T * G + g) * D;
        for (int t0 = 0; t0 < T; t0 += ATT_BQ) {
            int nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
            int nk = t0 + nq;
            const float *qt = q + (((size_t)b * T + t0) * H + h) * D;
            mt_sgemm(0, 1, nq, nk, D, scale, qt, H * D, kb, G * D, 0.0f, S, nk);
            for (int i = 0; i < nq; i++) {
                float *s = S + (size_t)i * nk;
                int last = t0 + i; /* causal: keys 0..last */
                float m = -INFINITY;
                for (int j = 0; j <= last; j++) m = s[j] > m ? s[j] : m;
                float sum = 0.0f;
                for (int j = 0; j <= last; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
                float inv = 1.0f / sum;
                for (int j = 0; j <= last; j++) s[j] *= inv;
                for (int j = last + 1; j < nk; j++) s[j] = 0.0f;
                lse[((size_t)b * H + h) * T + t0 + i] = m + logf(sum);
            }
            float *ot = out + (((size_t)b * T + t0) * H + h) * D;
            mt_sgemm(0, 0, nq, D, nk, 1.0f, S, nk, vb, G * D, 0.0f, ot, H * D);
        }
    }
}

void mt_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                      const float *k, const float *v, const float *out, const float *lse,
                      int B, int T, int H, int G, int D, float *scratch, int nthr) {
    MT_ASSERT(H % G == 0);
    const int rep = H / G;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t per = mt_attention_scratch_floats(T);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int task = 0; task < B * G; task++) {
        int b = task / G, g = task % G;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *dP = P + (size_t)ATT_BQ * T;
        const float *kb = k + ((size_t)b * T * G + g) * D;
        const float *vb = v + ((size_t)b * T * G + g) * D;
        float *dkb = dk + ((size_t)b * T * G + g) * D;
        float *dvb = dv + ((size_t)b * T * G + g) * D;
        for (int t = 0; t < T; t++) {
            memset(dkb + (size_t)t * G * D, 0, sizeof(float) * D);
            memset(dvb + (size_t)t * G * D, 0, sizeof(float) * D);
        }
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            for (int t0 = 0; t0 < T; t0 += ATT_BQ) {
                int nq = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
                int nk = t0 + nq;
                size_t row0 = ((size_t)b * T + t0) * H + h;
                const float *qt = q + row0 * D, *dot = dout + row0 * D, *ot = out + row0 * D;
                const float *l = lse + ((size_t)b * H + h) * T + t0;
                mt_sgemm(0, 1, nq, nk, D, scale, qt, H * D, kb, G * D, 0.0f, P, nk);
                for (int i = 0; i < nq; i++) {
                    float *p = P + (size_t)i * nk;
                    int last = t0 + i;
                    for (int j = 0; j <= last; j++) p[j] = expf(p[j] - l[i]);
                    for (int j = last + 1; j < nk; j++) p[j] = 0.0f;
                }
                /* dV += P^T dO */
                mt_sgemm(1, 0, nk, D, nq, 1.0f, P, nk, dot, H * D, 1.0f, dvb, G * D);
                /* dP = dO V^T */
                mt_sgemm(0, 1, nq, nk, D, 1.0f, dot, H * D, vb, G * D, 0.0f, dP, nk);
                for (int i = 0; i < nq; i++) {
                    const float *o = ot + (size_t)i * H * D, *d = dot + (size_t)i * H * D;
                    float Di = 0.0f;
                    for (int c = 0; c < D; c++) Di += o[c] * d[c];
                    float *p = P + (size_t)i * nk, *dp = dP + (size_t)i * nk;
                    for (int j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - Di) * scale;
                }
                /* dQ = dS K ; dK += dS^T Q */
                mt_sgemm(0, 0, nq, D, nk, 1.0f, dP, nk, kb, G * D, 0.0f, dq + row0 * D, H * D);
                mt_sgemm(1, 0, nk, D, nq, 1.0f, dP, nk, qt, H * D, 1.0f, dkb, G * D);
            }
        }
    }
}

enum { HEAD_ROWS = 128 };

size_t mt_head_scratch_floats(int V) { return (size_t)HEAD_ROWS * V + HEAD_ROWS; }

double mt_head_ce(float *dx, float *dW, float *logits, const float *x, const float *W,
                  const int32_t *targets, int N, int C, int V, float grad_scale, float *scratch) {
    double total = 0.0;
    float *L = scratch, *rowloss = scratch + (size_t)HEAD_ROWS * V;
    for (int n0 = 0; n0 < N; n0 += HEAD_ROWS) {
        int nr = N - n0 < HEAD_ROWS ? N - n0 : HEAD_ROWS;
        const float *xc = x + (size_t)n0 * C;
        mt_linear_fwd(L, xc, W, nr, C, V, 0.0f);
        if (logits) memcpy(logits + (size_t)n0 * V, L, sizeof(float) * (size_t)nr * V);
#pragma omp parallel for schedule(static)
        for (int i = 0; i < nr; i++) {
            float *l = L + (size_t)i * V;
            int tgt = targets[n0 + i];
            float m = -INFINITY;
            for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
            float sum = 0.0f;
            for (int j = 0; j < V; j++) sum += expf(l[j] - m);
            float lse = m + logf(sum);
            rowloss[i] = tgt >= 0 ? lse - l[tgt] : 0.0f;
            if (dx) {
                if (tgt < 0) { memset(l, 0, sizeof(float) * V); continue; }
                for (int j = 0; j < V; j++) l[j] = expf(l[j] - lse) * grad_scale;
                l[tgt] -= grad_scale;
            }
        }
        for (int i = 0; i < nr; i++) total += rowloss[i];
        if (dx) mt_linear_bwd(dx + (size_t)n0 * C, dW, L, xc, W, nr, C, V, 0.0f);
    }
    return total;
}

enum { SUMSQ_CHUNK = 1 << 16 };

double mt_sumsq(const float *x, size_t n) {
    size_t nch = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double total = 0.0;
    /* fixed chunking, partials summed in chunk order: independent of thread count */
    enum { BATCH = 256 };
    double part[BATCH];
    for (size_t c0 = 0; c0 < nch; c0 += BATCH) {
        size_t c1 = c0 + BATCH < nch ? c0 + BATCH : nch;
#pragma omp parallel for schedule(static)
        for (size_t c = c0; c < c1; c++) {
            size_t i0 = c * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
            double s = 0.0;
            for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
            part[c - c0] = s;
        }
        for (size_t c = c0; c < c1; c++) total += part[c - c0];
    }
    return total;
}

void mt_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float wd, float gscale, int step) {
    const float bc1 = 1.0f - powf(beta1, (float)step);
    const float bc2 = 1.0f - powf(beta2, (float)step);
    const float step_size = lr / bc1, sbc2 = sqrtf(bc2), decay = 1.0f - lr * wd;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / sbc2 + eps);
    }
}
