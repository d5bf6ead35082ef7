/* kernels/ops.c — optimised element-wise, head/CE and optimizer kernels
 * (contracts in ops.h; plain references in ref.c). */
#include "kernels/ops.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/vdot.h"
#include "kernels/vexp.h"

/* The row kernels' fp32 rows: `floats` per thread in the caller's workspace, by thread
 * number, for a parallel loop started here (so not inside another parallel region) */
static void rows_ws_check(mt_ws ws, size_t floats) {
    MT_ASSERT(!omp_in_parallel());
    mt_ws_check(ws, sizeof(float) * floats, omp_get_max_threads());
}
#define ROW_WS(ws, floats) ((float *)mt_ws_thread(ws, sizeof(float) * (floats)))

/* one row of RMSNorm: o = x r w, r = 1/rms(x) returned */
static inline float rmsnorm_row(float *o, const float *xr, const float *w, int C, float eps) {
    float ss = mt_dotf(xr, xr, (size_t)C);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int j = 0; j < C; j++) o[j] = xr[j] * r * w[j];
    return r;
}

void mt_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) rstd[n] = rmsnorm_row(out + (size_t)n * C, x + (size_t)n * C, w, C, eps);
}

void mt_rmsnorm_fwd16(mt_ws ws, uint16_t *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    rows_ws_check(ws, (size_t)C);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = ROW_WS(ws, (size_t)C);
        rstd[n] = rmsnorm_row(r, x + (size_t)n * C, w, C, eps);
        mt_bf16_store_row(out + (size_t)n * C, r, (size_t)C);
    }
}

/* Rows per partial sum of dw: fixed, so dw's sums (each partial in row order, then the
 * partials in order) do not depend on the thread count. */
enum { RMS_DW_ROWS = 256 };

void mt_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                    const float *rstd, int N, int C) {
    /* one pass over the rows: dx, and each block of rows' share of dw */
    const int nblk = (N + RMS_DW_ROWS - 1) / RMS_DW_ROWS;
    float *part = dw ? mt_alloc(sizeof(float) * (size_t)nblk * C) : NULL;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        float *pw = part ? part + (size_t)blk * C : NULL;
        int n1 = (blk + 1) * RMS_DW_ROWS < N ? (blk + 1) * RMS_DW_ROWS : N;
        for (int n = blk * RMS_DW_ROWS; n < n1; n++) {
            const float *xr = x + (size_t)n * C, *dy = dout + (size_t)n * C;
            float r = rstd[n], dot = mt_dot3f(dy, w, xr, (size_t)C);
            float c = dot * r * r / (float)C;
            float *d = dx + (size_t)n * C;
            for (int j = 0; j < C; j++) d[j] += r * (dy[j] * w[j] - xr[j] * c);
            if (pw)
                for (int j = 0; j < C; j++) pw[j] += dy[j] * xr[j] * r;
        }
    }
    if (!dw) return;
    for (int blk = 0; blk < nblk; blk++)
        for (int j = 0; j < C; j++) dw[j] += part[(size_t)blk * C + j];
    mt_free(part);
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

/* one head of D = 2h values rotated into out (which may be v): pairs (i, i + h), or with
 * MT_ROPE_INTERLEAVE the neighbours (2i, 2i + 1) */
static inline void rope_head(float *out, const float *v, const float *c, const float *s, int h, int flags) {
    const int inverse = flags & MT_ROPE_INVERSE;
    if (flags & MT_ROPE_INTERLEAVE) {
        for (int i = 0; i < h; i++) {
            float x1 = v[2 * i], x2 = v[2 * i + 1];
            float si = inverse ? -s[i] : s[i];
            out[2 * i] = x1 * c[i] - x2 * si;
            out[2 * i + 1] = x2 * c[i] + x1 * si;
        }
        return;
    }
    for (int i = 0; i < h; i++) {
        float x1 = v[i], x2 = v[i + h];
        float si = inverse ? -s[i] : s[i];
        out[i] = x1 * c[i] - x2 * si;
        out[i + h] = x2 * c[i] + x1 * si;
    }
}

void mt_rope_apply_pos(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int N,
                       int T, int nh, int D, int flags) {
    mt_rope_apply_ld(x, cos_t, sin_t, pos, N, T, nh, D, (size_t)nh * D, (size_t)D, flags);
}

void mt_rope_apply_ld(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int N, int T, int nh,
                      int D, size_t ldn, size_t ldh, int flags) {
    int h = D / 2;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int t = pos ? pos[n] : n % T;
        const float *c = cos_t + (size_t)t * h, *s = sin_t + (size_t)t * h;
        for (int head = 0; head < nh; head++) {
            float *v = x + (size_t)n * ldn + (size_t)head * ldh;
            rope_head(v, v, c, s, h, flags);
        }
    }
}

void mt_rope_store16(mt_ws ws, uint16_t *out, const float *x, const float *cos_t, const float *sin_t,
                     const int32_t *pos, int N, int T, int nh, int D, int flags) {
    int h = D / 2;
    const size_t W = (size_t)nh * D;
    rows_ws_check(ws, W);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int t = pos ? pos[n] : n % T;
        const float *c = cos_t + (size_t)t * h, *s = sin_t + (size_t)t * h;
        float *r = ROW_WS(ws, W);
        for (int head = 0; head < nh; head++) rope_head(r + (size_t)head * D, x + n * W + (size_t)head * D, c, s, h,
                                                        flags & MT_ROPE_INTERLEAVE);
        mt_bf16_store_row(out + n * W, r, W);
    }
}

void mt_rope_apply(float *x, const float *cos_t, const float *sin_t, int N, int T, int nh, int D,
                   int flags) {
    mt_rope_apply_pos(x, cos_t, sin_t, NULL, N, T, nh, D, flags);
}

/* SwiGLU element spans, shared by the flat and the row-wise forms: a = silu(g) u =
 * g u / (1 + e^-g); backward with sg = sigmoid(g): du = da ws g sg,
 * dg = da ws u sg (1 + g (1 - sg)). Exp and sigmoid from kernels/vexp.h; the tail of a
 * span is one masked vector, so there is no scalar remainder loop. */
#ifdef __AVX512F__
/* silu(g) u of the lanes in k (the others zero) */
static inline __m512 swiglu_vec(const float *g, const float *u, __mmask16 k) {
    __m512 z = _mm512_maskz_loadu_ps(k, g), uu = _mm512_maskz_loadu_ps(k, u);
    __m512 e = mt_exp512(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_div_ps(_mm512_mul_ps(z, uu), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#endif

static void swiglu_fwd_span(float *a, const float *g, const float *u, size_t n) {
#ifdef __AVX512F__
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(a + i, k, swiglu_vec(g + i, u + i, k));
    }
#else
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = mt_tail_mask256(n - i);
        __m256 z = _mm256_maskload_ps(g + i, k), uu = _mm256_maskload_ps(u + i, k);
        __m256 e = mt_exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
        _mm256_maskstore_ps(a + i, k, _mm256_div_ps(_mm256_mul_ps(z, uu), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
#endif
}

static void swiglu_bwd_span(float *dg, float *du, const float *da, const float *g, const float *u,
                            float ws, size_t n) {
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.0f), w = _mm512_set1_ps(ws);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 z = _mm512_maskz_loadu_ps(k, g + i), uu = _mm512_maskz_loadu_ps(k, u + i);
        __m512 dd = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, da + i), w), sg = mt_sigmoid512(z);
        __m512 dsg = _mm512_mul_ps(dd, sg);
        _mm512_mask_storeu_ps(du + i, k, _mm512_mul_ps(dsg, z));
        __m512 t = _mm512_fmadd_ps(z, _mm512_sub_ps(one, sg), one); /* 1 + z (1 - sg) */
        _mm512_mask_storeu_ps(dg + i, k, _mm512_mul_ps(_mm512_mul_ps(dsg, uu), t));
    }
#else
    const __m256 one = _mm256_set1_ps(1.0f), w = _mm256_set1_ps(ws);
    for (size_t i = 0; i < n; i += 8) {
        __m256i k = mt_tail_mask256(n - i);
        __m256 z = _mm256_maskload_ps(g + i, k), uu = _mm256_maskload_ps(u + i, k);
        __m256 dd = _mm256_mul_ps(_mm256_maskload_ps(da + i, k), w), sg = mt_sigmoid256(z);
        __m256 dsg = _mm256_mul_ps(dd, sg);
        _mm256_maskstore_ps(du + i, k, _mm256_mul_ps(dsg, z));
        __m256 t = _mm256_fmadd_ps(z, _mm256_sub_ps(one, sg), one); /* 1 + z (1 - sg) */
        _mm256_maskstore_ps(dg + i, k, _mm256_mul_ps(_mm256_mul_ps(dsg, uu), t));
    }
#endif
}

enum { SWIGLU_CHUNK = 1 << 14 };

void mt_swiglu_fwd(float *a, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += SWIGLU_CHUNK)
        swiglu_fwd_span(a + i, g + i, u + i, n - i < SWIGLU_CHUNK ? n - i : SWIGLU_CHUNK);
}

void mt_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += SWIGLU_CHUNK)
        swiglu_bwd_span(dg + i, du + i, da + i, g + i, u + i, 1.0f,
                        n - i < SWIGLU_CHUNK ? n - i : SWIGLU_CHUNK);
}

void mt_swiglu_rows_fwd(float *a, const float *gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F;
        swiglu_fwd_span(a + (size_t)n * F, g, g + F, (size_t)F);
    }
}

float mt_swiglu_row_wgrad(float *a, const float *gu, const float *da, float w, int F) {
    swiglu_fwd_span(a, gu, gu + F, (size_t)F);
    float d = mt_dotf(a, da, (size_t)F);
    for (int f = 0; f < F; f++) a[f] *= w;
    return d;
}

void mt_swiglu_rows_bwd(float *dgu, const float *da, const float *gu, const float *wscale, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F;
        float *dg = dgu + (size_t)n * 2 * F;
        swiglu_bwd_span(dg, dg + F, da + (size_t)n * F, g, g + F, wscale ? wscale[n] : 1.0f, (size_t)F);
    }
}

/* row n of gate|up as fp32: gu's, or gu16's widened into buf [2F] */
static const float *gu_row(const float *gu, const uint16_t *gu16, int n, int F, float *buf) {
    if (!gu16) return gu + (size_t)n * 2 * F;
    mt_bf16_load_row(buf, gu16 + (size_t)n * 2 * F, 2 * (size_t)F);
    return buf;
}

void mt_swiglu_rows_fwd_x(mt_ws ws, float *a, uint16_t *a16, const float *gu, const uint16_t *gu16, int N, int F) {
    if (!a16 && !gu16) {
        mt_swiglu_rows_fwd(a, gu, N, F);
        return;
    }
    rows_ws_check(ws, MT_SWIGLU_WS_FLOATS(F));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = ROW_WS(ws, MT_SWIGLU_WS_FLOATS(F)); /* [0, F) output, [F, 3F) gate|up */
        const float *g = gu_row(gu, gu16, n, F, r + F), *u = g + F;
        if (!a16) {
            swiglu_fwd_span(a + (size_t)n * F, g, u, (size_t)F);
            continue;
        }
        uint16_t *o = a16 + (size_t)n * F;
#if defined(__AVX512BF16__)
        /* swiglu_fwd_span's values, converted as mt_bf16_store does, in registers */
        for (int i = 0; i < F; i += 16) {
            __mmask16 k = F - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (F - i)) - 1u);
            _mm256_mask_storeu_epi16(o + i, k, (__m256i)_mm512_cvtneps_pbh(swiglu_vec(g + i, u + i, k)));
        }
#else
        swiglu_fwd_span(r, g, u, (size_t)F);
        mt_bf16_store_row(o, r, (size_t)F);
#endif
    }
}

float mt_swiglu_row_wgrad_x(mt_ws ws, float *a, uint16_t *a16, const float *gu, const uint16_t *gu16, const float *da,
                            float w, int F) {
    if (!a16 && !gu16) return mt_swiglu_row_wgrad(a, gu, da, w, F);
    /* the calling thread's part (the caller's loop is parallel) */
    mt_ws_check(ws, sizeof(float) * MT_SWIGLU_WS_FLOATS(F), omp_get_num_threads());
    float *r = ROW_WS(ws, MT_SWIGLU_WS_FLOATS(F)); /* [0, F) the activation, [F, 3F) gate|up */
    const float *g = gu_row(gu, gu16, 0, F, r + F);
    if (!a16) return mt_swiglu_row_wgrad(a, g, da, w, F);
    float d = mt_swiglu_row_wgrad(r, g, da, w, F);
    mt_bf16_store_row(a16, r, (size_t)F);
    return d;
}

void mt_swiglu_rows_bwd_x(mt_ws ws, float *dgu, uint16_t *dgu16, const float *da, const float *gu,
                          const uint16_t *gu16, const float *wscale, int N, int F) {
    if (!dgu16 && !gu16) {
        mt_swiglu_rows_bwd(dgu, da, gu, wscale, N, F);
        return;
    }
    rows_ws_check(ws, MT_SWIGLU_WS_FLOATS(F));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = ROW_WS(ws, MT_SWIGLU_WS_FLOATS(F)); /* [0, 2F) dg|du, [2F, 4F) gate|up */
        const float *g = gu_row(gu, gu16, n, F, r + 2 * F);
        float *dg = dgu16 ? r : dgu + (size_t)n * 2 * F;
        swiglu_bwd_span(dg, dg + F, da + (size_t)n * F, g, g + F, wscale ? wscale[n] : 1.0f, (size_t)F);
        if (dgu16) mt_bf16_store_row(dgu16 + (size_t)n * 2 * F, r, 2 * (size_t)F);
    }
}

/* max of l[0..V-1] */
static float head_row_max(const float *l, int V) {
#ifdef __AVX512F__
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < V; j += 16) {
        __mmask16 k = V - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (V - j)) - 1u);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, l + j));
    }
    return _mm512_reduce_max_ps(m);
#else
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= V; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(l + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float r = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    for (; j < V; j++) r = l[j] > r ? l[j] : r;
    return r;
#endif
}

/* sum_j e^(l[j] - sub); with out, also out[j] = e^(l[j] - sub) * mul (out may be l) */
static float head_row_exp(float *out, const float *l, int V, float sub, float mul) {
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps(), sb = _mm512_set1_ps(sub), ml = _mm512_set1_ps(mul);
    for (int j = 0; j < V; j += 16) {
        __mmask16 k = V - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (V - j)) - 1u);
        __m512 e = _mm512_maskz_mov_ps(k, mt_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), sb)));
        acc = _mm512_add_ps(acc, e);
        if (out) _mm512_mask_storeu_ps(out + j, k, _mm512_mul_ps(e, ml));
    }
    return _mm512_reduce_add_ps(acc);
#else
    __m256 acc = _mm256_setzero_ps(), sb = _mm256_set1_ps(sub), ml = _mm256_set1_ps(mul);
    for (int j = 0; j < V; j += 8) {
        __m256i k = mt_tail_mask256((size_t)(V - j));
        __m256 e = _mm256_and_ps(mt_exp256(_mm256_sub_ps(_mm256_maskload_ps(l + j, k), sb)), _mm256_castsi256_ps(k));
        acc = _mm256_add_ps(acc, e);
        if (out) _mm256_maskstore_ps(out + j, k, _mm256_mul_ps(e, ml));
    }
    return mt_hsum256(acc);
#endif
}

/* Row stride of the logits chunk: V rounded up to 16 floats, plus 16 when that is a multiple
 * of 256 (1 KiB). With a power-of-two stride (V = 8192: 32 KiB) the rows of a column strip
 * share a few cache sets, and the weight gradient, whose packing reads the chunk in column
 * strips two rows at a time, missed in L1 and L2 even with the chunk cached (packing ran at
 * about half speed; figures in docs/DESIGN.md, "the head"). */
static int head_ld(int V) {
    int ld = (V + 15) / 16 * 16;
    return ld % 256 == 0 ? ld + 16 : ld;
}

size_t mt_head_scratch_floats(int V) { return (size_t)MT_HEAD_ROWS * head_ld(V) + MT_HEAD_ROWS; }

/* The head weight packed in bf16 for the chunks' products (bf16 mode, two chunks or more):
 * as the B of the logits (Wf: k = c, n = v) and of dx (Wb: k = v, n = c). Packed once per
 * call instead of once per chunk and product: the chunks' products ran at 275-300 GFLOP/s
 * packing W each time, 340-357 reading it packed. In the caller's workspace, in front of
 * the products' own; 4 V C bytes. */
static size_t head_packed_words(int N, int C, int V, int bf16, int train) {
    if (!bf16 || N <= MT_HEAD_ROWS) return 0;
    return mt_gemm_bf16_packed_words(V, C) + (train ? mt_gemm_bf16_packed_words(C, V) : 0);
}

size_t mt_head_packed_bytes(int N, int C, int V, int bf16, int train) {
    return head_packed_words(N, C, V, bf16, train) * sizeof(uint32_t);
}

size_t mt_head_ws_bytes(int N, int C, int V, int bf16, int train, int nthr) {
    return bf16 ? mt_ws_round(mt_head_packed_bytes(N, C, V, bf16, train)) + mt_gemm_ws_bytes(nthr) : 0;
}

double mt_head_ce(mt_ws ws, float *dx, float *dW, float *logits, const float *x, const float *W,
                  const int32_t *targets, int N, int C, int V, float grad_scale, const mt_head_obj *obj, float *scratch) {
    double total = 0.0;
    const int ldl = head_ld(V);
    void *chunk = scratch; /* the logits chunk [MT_HEAD_ROWS, ldl]: fp32, then (l16) bf16 in place */
    float *L = chunk, *rowloss = scratch + (size_t)MT_HEAD_ROWS * ldl;
    uint16_t *L16w = chunk;
    const uint32_t *Wf = NULL, *Wb = NULL;
    /* in bf16 mode the chunk's logit gradients are rounded in place (rows 2 ldl values
     * apart): both products read them rounded anyway, so the same bits from half the bytes */
    const int l16 = dx && ws.bf16;
    const uint16_t *L16 = l16 ? L16w : NULL;
    const size_t words = head_packed_words(N, C, V, ws.bf16, dx != NULL);
    if (words) {
        size_t wf = mt_gemm_bf16_packed_words(V, C);
        uint32_t *p = mt_ws_take(&ws, words * sizeof(uint32_t));
        mt_gemm_bf16_pack(p, 1, V, C, W, C);
        if (dx) mt_gemm_bf16_pack(p + wf, 0, C, V, W, C);
        Wf = p;
        Wb = dx ? p + wf : NULL;
    }
    for (int n0 = 0; n0 < N; n0 += MT_HEAD_ROWS) {
        int nr = N - n0 < MT_HEAD_ROWS ? N - n0 : MT_HEAD_ROWS;
        const float *xc = x + (size_t)n0 * C;
        if (Wf) mt_gemm_bf16_packed(ws, 0, nr, V, C, 1.0f, xc, C, Wf, 0.0f, L, ldl);
        else mt_sgemm(ws, 0, 1, nr, V, C, 1.0f, xc, C, W, C, 0.0f, L, ldl);
        if (logits)
            for (int i = 0; i < nr; i++) memcpy(logits + (size_t)(n0 + i) * V, L + (size_t)i * ldl, sizeof(float) * V);
#pragma omp parallel for schedule(static)
        for (int i = 0; i < nr; i++) {
            float *l = L + (size_t)i * ldl;
            int tgt = targets[n0 + i];
            float m = head_row_max(l, V);
            /* an objective's logp from the raw logits, as the rollout computes it, rounded to
             * float as logp_old and logp_behav are kept (on-policy the ratio is then exactly 1) */
            double lp = 0;
            if (obj && tgt >= 0) lp = (float)mt_tempered_logp(l, obj->tau, m, tgt, mt_tempered_sum(l, V, obj->tau, m, NULL));
            /* an objective's temperature: the row scaled in place, its gradient by inv_tau; the
             * scaled max is m scaled (x -> x s rounded is monotone for s > 0) */
            if (obj && obj->inv_tau != 1.0) {
                const float s = (float)obj->inv_tau;
                for (int j = 0; j < V; j++) l[j] *= s;
                m *= s;
            }
            float lse = m + logf(head_row_exp(NULL, l, V, m, 1.0f));
            rowloss[i] = tgt >= 0 ? lse - l[tgt] : 0.0f;
            float gs = grad_scale;
            if (obj && tgt >= 0) gs = (float)(-obj->fn(obj->ctx, obj->base + n0 + i, lp) * obj->inv_tau);
            if (dx) {
                if (tgt < 0) memset(l, 0, sizeof(float) * V);
                else {
                    head_row_exp(l, l, V, lse, gs);
                    l[tgt] -= gs;
                }
                /* in place (row i of the bf16 view starts where row i of the fp32 one does): writes trail reads */
                if (l16) mt_bf16_store_row(L16w + (size_t)i * 2 * ldl, l, (size_t)V);
            }
        }
        for (int i = 0; i < nr; i++) total += rowloss[i];
        const float *Lf = l16 ? NULL : L;
        const int lda = l16 ? 2 * ldl : ldl;
        if (Wb) { /* (only when training) */
            mt_gemm_bf16_packed_x(ws, 0, nr, C, V, 1.0f, Lf, L16, lda, Wb, 0.0f, dx + (size_t)n0 * C, C);
            if (dW) mt_sgemm_x(ws, 1, 0, V, C, nr, 1.0f, Lf, L16, lda, xc, NULL, C, 1.0f, dW, C);
        } else if (dx) {
            mt_sgemm_x(ws, 0, 0, nr, C, V, 1.0f, Lf, L16, lda, W, NULL, C, 0.0f, dx + (size_t)n0 * C, C);
            if (dW) mt_sgemm_x(ws, 1, 0, V, C, nr, 1.0f, Lf, L16, lda, xc, NULL, C, 1.0f, dW, C);
        }
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
            part[c - c0] = mt_sumsq_d(x + i0, i1 - i0);
        }
        for (size_t c = c0; c < c1; c++) total += part[c - c0];
    }
    return total;
}

void mt_copy(float *dst, const float *src, size_t n) {
    enum { CH = 1 << 15 };
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += CH) memcpy(dst + i, src + i, sizeof(float) * (n - i < CH ? n - i : CH));
}

void mt_add(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Zeroes n floats with stores that bypass the caches (no read of each line before it is
 * written); for buffers far larger than the caches, such as the gradients. */
#ifdef __AVX512F__
enum { ZW = 16 }; /* floats per streamed store */
#define STREAM_ZERO(p) _mm512_stream_ps(p, _mm512_setzero_ps())
#else
enum { ZW = 8 };
#define STREAM_ZERO(p) _mm256_stream_ps(p, _mm256_setzero_ps())
#endif
static void zero_stream(float *dst, size_t n) {
    const uintptr_t align = sizeof(float) * ZW;
    size_t head = (size_t)((align - ((uintptr_t)dst & (align - 1))) & (align - 1)) / sizeof(float);
    if (n > head + ZW) {
        memset(dst, 0, sizeof(float) * head);
        size_t i = head;
        for (; i + ZW <= n; i += ZW) STREAM_ZERO(dst + i);
        memset(dst + i, 0, sizeof(float) * (n - i));
        _mm_sfence();
        return;
    }
    memset(dst, 0, sizeof(float) * n);
}

void mt_zero(float *dst, size_t n) {
    enum { CH = 1 << 15, STREAM_FLOATS = 1 << 22 };
    const int stream = n >= STREAM_FLOATS; /* 16 MiB and more: more than the caches hold */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += CH) {
        size_t len = n - i < CH ? n - i : CH;
        if (stream) zero_stream(dst + i, len);
        else memset(dst + i, 0, sizeof(float) * len);
    }
}

static void adamw_range(float *p, const float *g, float *m, float *v, size_t n, float step_size,
                        float sbc2, float decay, float beta1, float beta2, float eps, float gscale) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / sbc2 + eps);
    }
}

void mt_adamw_multi(float *p, const float *g, float *m, float *v, int ntensors, const size_t *off,
                    const size_t *len, const int *decay, float lr, float beta1, float beta2, float eps,
                    float wd, float gscale, int step) {
    enum { CH = 1 << 14 };
    /* bias corrections in double (as PyTorch's Python scalars): 1 - beta^t in float loses
     * most of its digits when beta is near 1 */
    const double bc1 = 1.0 - pow((double)beta1, step), bc2 = 1.0 - pow((double)beta2, step);
    const float step_size = (float)(lr / bc1), sbc2 = (float)sqrt(bc2);
    /* chunk list: (tensor, start) pairs, built on the fly by prefix counts */
    size_t total_chunks = 0;
    for (int t = 0; t < ntensors; t++) total_chunks += (len[t] + CH - 1) / CH;
#pragma omp parallel
    {
        int t = 0;
        size_t base = 0; /* first chunk index of tensor t */
#pragma omp for schedule(static)
        for (size_t c = 0; c < total_chunks; c++) {
            if (c < base) { t = 0; base = 0; } /* chunks come in increasing order per thread */
            while (c >= base + (len[t] + CH - 1) / CH) { base += (len[t] + CH - 1) / CH; t++; }
            size_t s0 = (c - base) * CH, n = len[t] - s0 < CH ? len[t] - s0 : CH;
            size_t o = off[t] + s0;
            adamw_range(p + o, g + o, m + o, v + o, n, step_size, sbc2, decay[t] ? 1.0f - lr * wd : 1.0f,
                        beta1, beta2, eps, gscale);
        }
    }
}

void mt_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float wd, float gscale, int step) {
    const size_t off = 0;
    const int decay = 1;
    mt_adamw_multi(p, g, m, v, 1, &off, &n, &decay, lr, beta1, beta2, eps, wd, gscale, step);
}
