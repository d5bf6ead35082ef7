/* kernels/moe.h — the MoE dispatch path on one device: fused permute / unpermute of the
 * (token, slot) pairs and the grouped expert GEMMs.
 *
 * Letters: N tokens, K slots per token (top-k), E experts, C channels, R = N*K rows of the
 * permuted buffer. sel[N*K] holds the expert of each pair (i = t*K + j). The permutation
 * groups rows by expert, pairs in (token, slot) order inside an expert: off[E+1] are the
 * expert boundaries, slot_row[i] the row of pair i, row_tok[r] the token of row r. */
#ifndef MT_KERNELS_MOE_H
#define MT_KERNELS_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ws.h"

/* Fused permute: counting sort of the pairs by expert and gather of the token rows into
 * xe[R,C] in one pass over the pairs (after a histogram), parallel and deterministic.
 * xe may be NULL (routing tables only). ws: the per-thread histograms,
 * mt_moe_permute_ws_bytes(E, nthr) for nthr = mt_get_threads(). */
size_t mt_moe_permute_ws_bytes(int E, int nthr);
void mt_moe_permute(mt_ws ws, float *xe, int32_t *off, int32_t *slot_row, int32_t *row_tok, const float *x,
                    const int32_t *sel, int N, int K, int E, int C);
/* xe[r] = x[row_tok[r]] for r < R: the permute's gather alone, from its tables (the backward
 * gathers the layer's input and output gradient again) */
void mt_moe_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C);
/* The same into xe, or into xe16 as bf16 (the bits mt_bf16_store writes) when that is not
 * NULL, for rows that only the bf16 products read (train --bf16); the source is x, or x16
 * when x is bf16 already (copied; only into xe16). Bf16 needs mt_bf16_supported(). */
void mt_moe_gather_x(float *xe, uint16_t *xe16, const float *x, const uint16_t *x16, const int32_t *row_tok, int R,
                     int C);
/* dx[N,C] (+= when accumulate) sum over slots of dxe[slot_row[t*K+j]]  (backward of the gather) */
void mt_moe_permute_bwd(float *dx, const float *dxe, const int32_t *slot_row, int N, int K, int C,
                        int accumulate);
/* out[N,C] (+= when accumulate) sum_j w[t*K+j] * ye[slot_row[t*K+j]]  (combine) */
void mt_moe_unpermute(float *out, const float *ye, const float *w, const int32_t *slot_row, int N,
                      int K, int C, int accumulate);

/* o[C] = w * y (first) or o += w * y: one term of an expert combine's weighted sum. The
 * expert exchange (parallel/a2a.c) and the ordered unpermute below both sum with it, so the
 * two round alike. */
static inline void mt_moe_wrow(float *o, const float *y, float w, int C, int first) {
    if (first)
        for (int c = 0; c < C; c++) o[c] = w * y[c];
    else
        for (int c = 0; c < C; c++) o[c] += w * y[c];
}

/* The order an expert-parallel combine sums a token's rows in (parallel/a2a.h): the pairs
 * on one EP rank in slot order, then the ranks of a node in ascending order, then the nodes
 * in ascending order (numbered by their lowest rank), each sum from a copy of its first term. */
typedef struct {
    const int32_t *owner;   /* [E] the EP rank of each expert (by the sel of the combine) */
    const int *node_of;     /* [ranks] */
} mt_moe_sum_order;
/* out[N,C] += the combine of mt_moe_unpermute summed in order o (sel[N*K] the pairs'
 * experts, K <= 512): the bits an expert-parallel layout's combine gives, from experts all
 * local. */
void mt_moe_unpermute_ordered(float *out, const float *ye, const float *w, const int32_t *slot_row,
                              const int32_t *sel, int N, int K, int C, const mt_moe_sum_order *o);

/* Grouped linear over experts: for every expert e, rows off[e]..off[e+1] of in[R,In] times
 * W_e^T where W_e = W + e*wstride is [O,In] (row-major): out[R,O] = beta*out + in W_e^T.
 * One parallel job: tiles of rows of every expert, dynamically scheduled, so the work is
 * balanced whatever the token counts (experts with 0 rows cost nothing).
 * ws (all six functions): the tile list and the products' workspace (kernels/blas.h),
 * mt_grouped_ws_bytes(R, E, O, bf16, nthr) for R rows, the weights' largest O, the
 * precision (bf16 mode or not) and nthr = mt_get_threads(). */
size_t mt_grouped_ws_bytes(int R, int E, int O, int bf16, int nthr);
void mt_grouped_linear_fwd(mt_ws ws, float *out, const float *in, const float *W, size_t wstride,
                           const int32_t *off, int E, int In, int O, float beta);
/* din[R,In] = beta*din + dout[R,O] W_e  (tiles of rows) */
void mt_grouped_linear_bwd_data(mt_ws ws, float *din, const float *dout, const float *W, size_t wstride,
                                const int32_t *off, int E, int In, int O, float beta);
/* dW_e[O,In] += dout_e^T in_e  for every expert (tiles of output rows: each element of dW is
 * summed by one tile over all of the expert's rows, in order: deterministic) */
void mt_grouped_linear_bwd_weight(mt_ws ws, float *dW, size_t wstride, const float *dout, const float *in,
                                  const int32_t *off, int E, int In, int O);
/* The same with inputs given as bf16 instead (train --bf16 keeps the routed experts' rows so):
 * of each pair (in, in16), (dout, dout16) one is given and the other NULL; a bf16 one needs
 * bf16 mode (mt_sgemm_x: the same bits as from the fp32 values it rounds). The forward may
 * write its output as bf16 (out16 instead of out, beta 0: see mt_linear_fwd_x). */
void mt_grouped_linear_fwd_x(mt_ws ws, float *out, uint16_t *out16, const float *in, const uint16_t *in16, const float *W,
                             size_t wstride, const int32_t *off, int E, int In, int O, float beta);
void mt_grouped_linear_bwd_data_x(mt_ws ws, float *din, const float *dout, const uint16_t *dout16, const float *W,
                                  size_t wstride, const int32_t *off, int E, int In, int O, float beta);
void mt_grouped_linear_bwd_weight_x(mt_ws ws, float *dW, size_t wstride, const float *dout, const uint16_t *dout16,
                                    const float *in, const uint16_t *in16, const int32_t *off, int E, int In, int O);

#endif
