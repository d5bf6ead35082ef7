/* kernels/ref_moe.c — plain single-threaded references of the MoE kernels and the gate|up
 * SwiGLU rows (contracts in ref_moe.h). The permutation is computed the unfused way
 * (argsort, then gather); everything else is a loop over the existing references. */
#include "kernels/ref_moe.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/ref.h"

/* ---- permutation -------------------------------------------------------------------- */

typedef struct {
    int32_t expert, index;
} pair_key;

/* (expert, index): the index breaks ties, so qsort (not stable itself) gives the order of
 * a stable sort by expert. */
static int pair_key_cmp(const void *pa, const void *pb) {
    const pair_key *a = pa, *b = pb;
    if (a->expert != b->expert) return a->expert < b->expert ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

void mt_ref_moe_permute(float *xe, int32_t *off, int32_t *slot_row, int32_t *row_tok,
                        const float *x, const int32_t *sel, int N, int K, int E, int C) {
    MT_ASSERT(N >= 0 && K > 0 && E > 0 && C >= 0);
    size_t R = (size_t)N * K;
    pair_key *keys = mt_xmalloc(sizeof(pair_key) * (R ? R : 1));
    for (size_t i = 0; i < R; i++) {
        MT_ASSERT(sel[i] >= 0 && sel[i] < E);
        keys[i].expert = sel[i];
        keys[i].index = (int32_t)i;
    }
    qsort(keys, R, sizeof(pair_key), pair_key_cmp);
    /* expert boundaries: first sorted row of each expert */
    size_t r = 0;
    for (int e = 0; e <= E; e++) {
        while (r < R && keys[r].expert < e) r++;
        off[e] = (int32_t)r;
    }
    for (size_t s = 0; s < R; s++) {
        slot_row[keys[s].index] = (int32_t)s;
        row_tok[s] = keys[s].index / K;
    }
    /* the separate gather pass: xe = x.index_select(0, row_tok) */
    if (xe)
        for (size_t s = 0; s < R; s++)
            for (int c = 0; c < C; c++) xe[s * C + c] = x[(size_t)row_tok[s] * C + c];
    free(keys);
}

/* pair of each row (inverse of slot_row); asserts slot_row is a permutation of 0..R-1 */
static int32_t *pairs_of_rows(const int32_t *slot_row, size_t R) {
    int32_t *pair = mt_xmalloc(sizeof(int32_t) * (R ? R : 1));
    for (size_t r = 0; r < R; r++) pair[r] = -1;
    for (size_t i = 0; i < R; i++) {
        MT_ASSERT(slot_row[i] >= 0 && (size_t)slot_row[i] < R && pair[slot_row[i]] < 0);
        pair[slot_row[i]] = (int32_t)i;
    }
    return pair;
}

/* out[N,C] (+= when accumulate) = index_add over rows r of scale(r) * src[r] into token
 * pair(r) / K, accumulated in double; scale NULL means 1. */
static void index_add_rows(float *out, const float *src, const float *scale,
                           const int32_t *slot_row, int N, int K, int C, int accumulate) {
    size_t R = (size_t)N * K, n = (size_t)N * C;
    int32_t *pair = pairs_of_rows(slot_row, R);
    double *acc = mt_xcalloc(n ? n : 1, sizeof(double));
    for (size_t r = 0; r < R; r++) {
        size_t t = (size_t)pair[r] / K;
        double s = scale ? scale[pair[r]] : 1.0;
        for (int c = 0; c < C; c++) acc[t * C + c] += s * src[r * C + c];
    }
    for (size_t i = 0; i < n; i++) out[i] = (float)((accumulate ? (double)out[i] : 0.0) + acc[i]);
    free(acc);
    free(pair);
}

void mt_ref_moe_permute_bwd(float *dx, const float *dxe, const int32_t *slot_row, int N, int K,
                            int C, int accumulate) {
    index_add_rows(dx, dxe, NULL, slot_row, N, K, C, accumulate);
}

void mt_ref_moe_unpermute(float *out, const float *ye, const float *w, const int32_t *slot_row,
                          int N, int K, int C, int accumulate) {
    index_add_rows(out, ye, w, slot_row, N, K, C, accumulate);
}

/* ---- grouped linear ----------------------------------------------------------------- */

void mt_ref_grouped_linear_fwd(float *out, const float *in, const float *W, size_t wstride,
                               const int32_t *off, int E, int In, int O, float beta) {
    for (int e = 0; e < E; e++) {
        MT_ASSERT(off[e + 1] >= off[e]);
        mt_ref_linear_fwd(out + (size_t)off[e] * O, in + (size_t)off[e] * In, W + (size_t)e * wstride,
                          off[e + 1] - off[e], In, O, beta);
    }
}

void mt_ref_grouped_linear_bwd_data(float *din, const float *dout, const float *W,
                                    size_t wstride, const int32_t *off, int E, int In, int O,
                                    float beta) {
    for (int e = 0; e < E; e++) {
        MT_ASSERT(off[e + 1] >= off[e]);
        mt_ref_linear_bwd(din + (size_t)off[e] * In, NULL, dout + (size_t)off[e] * O, NULL,
                          W + (size_t)e * wstride, off[e + 1] - off[e], In, O, beta);
    }
}

void mt_ref_grouped_linear_bwd_weight(float *dW, size_t wstride, const float *dout,
                                      const float *in, const int32_t *off, int E, int In, int O) {
    for (int e = 0; e < E; e++) {
        MT_ASSERT(off[e + 1] >= off[e]);
        mt_ref_linear_bwd(NULL, dW + (size_t)e * wstride, dout + (size_t)off[e] * O,
                          in + (size_t)off[e] * In, NULL, off[e + 1] - off[e], In, O, 0.0f);
    }
}

/* ---- SwiGLU on gate|up rows ---------------------------------------------------------- */

/* g[N,F], u[N,F] <- the two halves of gu[N,2F] */
static void split_halves(float *g, float *u, const float *gu, int N, int F) {
    for (size_t n = 0; n < (size_t)N; n++) {
        memcpy(g + n * F, gu + n * 2 * F, sizeof(float) * F);
        memcpy(u + n * F, gu + n * 2 * F + F, sizeof(float) * F);
    }
}

void mt_ref_swiglu_rows_fwd(float *a, const float *gu, int N, int F) {
    size_t n = (size_t)N * F;
    float *g = mt_xmalloc(sizeof(float) * (n ? n : 1)), *u = mt_xmalloc(sizeof(float) * (n ? n : 1));
    split_halves(g, u, gu, N, F);
    mt_ref_swiglu_fwd(a, g, u, n);
    free(g);
    free(u);
}

void mt_ref_swiglu_rows_bwd(float *dgu, const float *da, const float *gu, const float *wscale,
                            int N, int F) {
    size_t n = (size_t)N * F, nb = sizeof(float) * (n ? n : 1);
    float *g = mt_xmalloc(nb), *u = mt_xmalloc(nb), *d = mt_xmalloc(nb), *dg = mt_xmalloc(nb),
          *du = mt_xmalloc(nb);
    split_halves(g, u, gu, N, F);
    /* the routing weight scales da first (a float product, as the contract says) */
    for (size_t r = 0; r < (size_t)N; r++)
        for (int f = 0; f < F; f++) d[r * F + f] = wscale ? da[r * F + f] * wscale[r] : da[r * F + f];
    mt_ref_swiglu_bwd(dg, du, d, g, u, n);
    for (size_t r = 0; r < (size_t)N; r++) {
        memcpy(dgu + r * 2 * F, dg + r * F, sizeof(float) * F);
        memcpy(dgu + r * 2 * F + F, du + r * F, sizeof(float) * F);
    }
    free(g);
    free(u);
    free(d);
    free(dg);
    free(du);
}
