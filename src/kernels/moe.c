/* kernels/moe.c — fused MoE permute/unpermute and grouped expert GEMMs (see moe.h). */
#include "kernels/moe.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "base/common.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ws.h"

enum { PERM_MAX_THREADS = 64, PERM_MAX_E = 4096 };

/* Copies one row of n floats. glibc's memcpy measured ~18% slower on the permute's 2 KiB
 * rows (moetrain bench kernels, moe_permute 0.25 vs 0.21 ms): four 64-byte (AVX2: 32-byte)
 * loads and stores a round instead. */
#ifdef __AVX512F__
typedef __m512 vrow;
#define VROW_W 16
#define VROW_LOAD _mm512_loadu_ps
#define VROW_STORE _mm512_storeu_ps
#else
typedef __m256 vrow;
#define VROW_W 8
#define VROW_LOAD _mm256_loadu_ps
#define VROW_STORE _mm256_storeu_ps
#endif
static inline void row_copy(float *dst, const float *src, int n) {
    int c = 0;
    for (; c + 4 * VROW_W <= n; c += 4 * VROW_W) {
        vrow a = VROW_LOAD(src + c), b = VROW_LOAD(src + c + VROW_W);
        vrow d = VROW_LOAD(src + c + 2 * VROW_W), e = VROW_LOAD(src + c + 3 * VROW_W);
        VROW_STORE(dst + c, a);
        VROW_STORE(dst + c + VROW_W, b);
        VROW_STORE(dst + c + 2 * VROW_W, d);
        VROW_STORE(dst + c + 3 * VROW_W, e);
    }
    if (c < n) memcpy(dst + c, src + c, sizeof(float) * (size_t)(n - c));
}

static int perm_threads(int nthr) { return nthr < 1 ? 1 : nthr > PERM_MAX_THREADS ? PERM_MAX_THREADS : nthr; }

size_t mt_moe_permute_ws_bytes(int E, int nthr) { return mt_ws_round(sizeof(int32_t) * (size_t)E * perm_threads(nthr)); }

void mt_moe_permute(mt_ws ws, float *xe, int32_t *off, int32_t *slot_row, int32_t *row_tok, const float *x,
                    const int32_t *sel, int N, int K, int E, int C) {
    const int R = N * K;
    MT_ASSERT(E <= PERM_MAX_E);
    int nthr = perm_threads(omp_get_max_threads());
    if (R < 4096) nthr = 1; /* not worth a parallel region */
    /* per-thread histograms over contiguous chunks of pairs; chunk boundaries depend on the
     * thread count but the resulting order (pairs in index order inside an expert) does not */
    int32_t *hist = mt_ws_take(&ws, sizeof(int32_t) * (size_t)E * nthr);
#pragma omp parallel num_threads(nthr)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int i0 = (int)((long)R * tid / nt), i1 = (int)((long)R * (tid + 1) / nt);
        int32_t *h = hist + (size_t)tid * E;
        memset(h, 0, sizeof(int32_t) * E);
        for (int i = i0; i < i1; i++) h[sel[i]]++;
#pragma omp barrier
#pragma omp single
        {
            /* exclusive prefix over (expert, thread): expert-major so experts are contiguous */
            int32_t run = 0;
            for (int e = 0; e < E; e++) {
                off[e] = run;
                for (int t = 0; t < nt; t++) {
                    int32_t c = hist[(size_t)t * E + e];
                    hist[(size_t)t * E + e] = run;
                    run += c;
                }
            }
            off[E] = run;
        }
        /* scatter: row of each pair, and the gathered token row, in one pass */
        for (int i = i0; i < i1; i++) {
            int32_t r = h[sel[i]]++;
            slot_row[i] = r;
            row_tok[r] = i / K;
            if (xe) row_copy(xe + (size_t)r * C, x + (size_t)(i / K) * C, C);
        }
    }
}

void mt_moe_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C) {
#pragma omp parallel for schedule(static) if (R >= 4096)
    for (int r = 0; r < R; r++) row_copy(xe + (size_t)r * C, x + (size_t)row_tok[r] * C, C);
}

void mt_moe_gather_x(float *xe, uint16_t *xe16, const float *x, const uint16_t *x16, const int32_t *row_tok, int R,
                     int C) {
    if (!xe16) {
        MT_ASSERT(x);
        mt_moe_gather(xe, x, row_tok, R, C);
        return;
    }
#pragma omp parallel for schedule(static) if (R >= 4096)
    for (int r = 0; r < R; r++) {
        const size_t t = (size_t)row_tok[r] * C;
        if (x16) memcpy(xe16 + (size_t)r * C, x16 + t, sizeof(uint16_t) * C);
        else mt_bf16_store_row(xe16 + (size_t)r * C, x + t, (size_t)C);
    }
}

void mt_moe_permute_bwd(float *dx, const float *dxe, const int32_t *slot_row, int N, int K, int C,
                        int accumulate) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *d = dx + (size_t)t * C;
        if (!accumulate) memset(d, 0, sizeof(float) * C);
        for (int j = 0; j < K; j++) {
            const float *s = dxe + (size_t)slot_row[(size_t)t * K + j] * C;
            for (int c = 0; c < C; c++) d[c] += s[c];
        }
    }
}

void mt_moe_unpermute(float *out, const float *ye, const float *w, const int32_t *slot_row, int N,
                      int K, int C, int accumulate) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        if (!accumulate) memset(o, 0, sizeof(float) * C);
        for (int j = 0; j < K; j++) {
            float wj = w[(size_t)t * K + j];
            const float *y = ye + (size_t)slot_row[(size_t)t * K + j] * C;
            for (int c = 0; c < C; c++) o[c] += wj * y[c];
        }
    }
}

void mt_moe_unpermute_ordered(float *out, const float *ye, const float *w, const int32_t *slot_row,
                              const int32_t *sel, int N, int K, int C, const mt_moe_sum_order *o) {
    MT_ASSERT(K <= 512); /* the model's limit (mt_model_check) */
#pragma omp parallel
    {
        float *p = mt_alloc(sizeof(float) * 3 * (size_t)C), *acc = p + C, *tot = acc + C;
#pragma omp for schedule(static)
        for (int t = 0; t < N; t++) {
            /* the token's pairs by (node, rank, slot): insertion sort of K keys */
            const int32_t *st = sel + (size_t)t * K;
            int ord[512], rk[512], nd[512];
            for (int j = 0; j < K; j++) {
                rk[j] = o->owner[st[j]], nd[j] = o->node_of[rk[j]];
                int q = j;
                for (; q > 0; q--) {
                    const int a = ord[q - 1];
                    if (nd[a] < nd[j] || (nd[a] == nd[j] && rk[a] <= rk[j])) break;
                    ord[q] = a;
                }
                ord[q] = j;
            }
            /* runs of a rank summed into its partial, runs of a node into its sum, the nodes into
             * tot; a run's first sum is written in place (a copy of a first term is exact) */
            for (int q = 0; q < K;) {
                const int n = nd[ord[q]];
                float *a = q == 0 ? tot : acc;
                for (int first_rank = 1; q < K && nd[ord[q]] == n; first_rank = 0) {
                    const int r = rk[ord[q]];
                    float *part = first_rank ? a : p;
                    for (int first = 1; q < K && rk[ord[q]] == r; q++, first = 0) {
                        const size_t i = (size_t)t * K + ord[q];
                        mt_moe_wrow(part, ye + (size_t)slot_row[i] * C, w[i], C, first);
                    }
                    if (!first_rank)
                        for (int c = 0; c < C; c++) a[c] += p[c];
                }
                if (a != tot)
                    for (int c = 0; c < C; c++) tot[c] += acc[c];
            }
            float *y = out + (size_t)t * C;
            if (K > 0)
                for (int c = 0; c < C; c++) y[c] += tot[c];
        }
        mt_free(p);
    }
}

enum { TILE_OUT = 64, TILE_ROWS = 256 };

/* Tiles: large ones amortise the packing of the operand every tile packs again (the expert's
 * weight, or its inputs for the weight gradient), small ones balance the threads. In fp32 the
 * sizes are fixed (not derived from the thread count), so the same rows go to the same SGEMM
 * calls and results do not depend on the threads. The bf16 kernel's result for an element
 * does not depend on the tiling at all, so there tiles grow until each thread has about four. */
static int tile_size(int bf16, int total, int min, int nthr) {
    if (!bf16) return min;
    int t = (total + 4 * nthr - 1) / (4 * nthr);
    t = (t + 15) / 16 * 16;
    return t > min ? t : min;
}

static int tile_rows(int bf16, const int32_t *off, int E) {
    return tile_size(bf16, off[E] - off[0], TILE_ROWS, omp_get_max_threads());
}

/* A tile of a grouped GEMM: expert e, rows [r, r + n) of the permuted rows or, for the
 * weight gradient, output rows [r, r + n) of dW_e; work orders the tiles. */
typedef struct {
    int32_t e, r, n;
    int64_t work;
} tile;

/* The tile list in the caller's workspace: at most R / TILE_ROWS + E row tiles (a partial
 * one per expert), E ceil(O / TILE_OUT) weight-gradient tiles; then the products' own. */
size_t mt_grouped_ws_bytes(int R, int E, int O, int bf16, int nthr) {
    size_t rows = (size_t)R / TILE_ROWS + (size_t)E, outs = (size_t)E * ((O + TILE_OUT - 1) / TILE_OUT);
    return mt_ws_round(sizeof(tile) * (rows > outs ? rows : outs)) + (bf16 ? mt_gemm_ws_bytes(nthr) : 0);
}

static int by_work_desc(const void *a, const void *b) {
    const tile *x = a, *y = b;
    if (x->work != y->work) return x->work > y->work ? -1 : 1;
    return x->e != y->e ? (x->e < y->e ? -1 : 1) : (x->r < y->r ? -1 : x->r > y->r);
}

/* Largest tiles first: the threads take them in that order (dynamic schedule), so the last
 * ones to finish are small and a thread seldom waits for another's big expert at the end.
 * The order changes no result: every tile writes its own part of the output. */
static void order_tiles(tile *t, int n) { qsort(t, (size_t)n, sizeof *t, by_work_desc); }

/* row tiles of every expert: out_rows = in_rows op(W_e), op = W^T (fwd) or W (bwd data);
 * out16: the forward's output as bf16 instead */
static void grouped_rows(mt_ws ws, float *out, uint16_t *out16, const float *in, const uint16_t *in16, const float *W,
                         size_t wstride, const int32_t *off, int E, int In, int O, float beta, int data_grad) {
    const int TR = tile_rows(ws.bf16, off, E);
    int n = 0;
    for (int e = 0; e < E; e++) n += (off[e + 1] - off[e] + TR - 1) / TR;
    tile *tiles = mt_ws_take(&ws, sizeof(tile) * (size_t)n);
    n = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r += TR) {
            int rows = off[e + 1] - r < TR ? off[e + 1] - r : TR;
            tiles[n++] = (tile){e, r, rows, rows};
        }
    order_tiles(tiles, n);
    const tile *tl = tiles;
    const int K = data_grad ? O : In, M = data_grad ? In : O; /* inner and output widths */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        int e = tl[i].e, r = tl[i].r, rows = tl[i].n;
        const float *a = in ? in + (size_t)r * K : NULL;
        const uint16_t *a16 = in16 ? in16 + (size_t)r * K : NULL;
        if (out16) mt_linear_fwd_x(ws, NULL, out16 + (size_t)r * M, a, a16, W + (size_t)e * wstride, rows, In, O, 0.0f);
        else mt_sgemm_x(ws, 0, !data_grad, rows, M, K, 1.0f, a, a16, K, W + (size_t)e * wstride, NULL, In, beta,
                        out + (size_t)r * M, M);
    }
}

void mt_grouped_linear_fwd_x(mt_ws ws, float *out, uint16_t *out16, const float *in, const uint16_t *in16, const float *W,
                             size_t wstride, const int32_t *off, int E, int In, int O, float beta) {
    grouped_rows(ws, out, out16, in, in16, W, wstride, off, E, In, O, beta, 0);
}

void mt_grouped_linear_fwd(mt_ws ws, float *out, const float *in, const float *W, size_t wstride,
                           const int32_t *off, int E, int In, int O, float beta) {
    grouped_rows(ws, out, NULL, in, NULL, W, wstride, off, E, In, O, beta, 0);
}

void mt_grouped_linear_bwd_data_x(mt_ws ws, float *din, const float *dout, const uint16_t *dout16, const float *W,
                                  size_t wstride, const int32_t *off, int E, int In, int O, float beta) {
    grouped_rows(ws, din, NULL, dout, dout16, W, wstride, off, E, In, O, beta, 1);
}

void mt_grouped_linear_bwd_data(mt_ws ws, float *din, const float *dout, const float *W, size_t wstride,
                                const int32_t *off, int E, int In, int O, float beta) {
    grouped_rows(ws, din, NULL, dout, NULL, W, wstride, off, E, In, O, beta, 1);
}

void mt_grouped_linear_bwd_weight_x(mt_ws ws, float *dW, size_t wstride, const float *dout, const uint16_t *dout16,
                                    const float *in, const uint16_t *in16, const int32_t *off, int E, int In, int O) {
    int n = 0, active = 0;
    for (int e = 0; e < E; e++) active += off[e + 1] > off[e];
    const int TO = active ? tile_size(ws.bf16, O * active, TILE_OUT, omp_get_max_threads()) : TILE_OUT;
    tile *tiles = mt_ws_take(&ws, sizeof(tile) * (size_t)active * ((O + TO - 1) / TO));
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e])
            for (int o = 0; o < O; o += TO) {
                int no = O - o < TO ? O - o : TO;
                tiles[n++] = (tile){e, o, no, (int64_t)no * (off[e + 1] - off[e])};
            }
    order_tiles(tiles, n);
    const tile *tl = tiles;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        int e = tl[i].e, o0 = tl[i].r, no = tl[i].n;
        int r0 = off[e], rows = off[e + 1] - off[e];
        /* dW_e[o0:o0+no, :] += dout[r0:, o0:o0+no]^T in[r0:, :] */
        const size_t a0 = (size_t)r0 * O + o0, b0 = (size_t)r0 * In;
        mt_sgemm_x(ws, 1, 0, no, In, rows, 1.0f, dout ? dout + a0 : NULL, dout16 ? dout16 + a0 : NULL, O,
                   in ? in + b0 : NULL, in16 ? in16 + b0 : NULL, In, 1.0f,
                   dW + (size_t)e * wstride + (size_t)o0 * In, In);
    }
}

void mt_grouped_linear_bwd_weight(mt_ws ws, float *dW, size_t wstride, const float *dout, const float *in,
                                  const int32_t *off, int E, int In, int O) {
    mt_grouped_linear_bwd_weight_x(ws, dW, wstride, dout, NULL, in, NULL, off, E, In, O);
}
