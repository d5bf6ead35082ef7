/* kernels/ref_moe.h — plain references of the MoE kernels (kernels/moe.h) and of the fused
 * gate|up SwiGLU rows (mt_swiglu_rows_* in kernels/ops.h).
 *
 * The oracle for tests/test_moe_kernels.c and the baseline of `moetrain bench kernels`.
 * Arguments follow moe.h / ops.h exactly (same order, letters and overwrite / +=
 * conventions) with the prefix mt_ref_ instead of mt_. One thread, double accumulation,
 * heap temporaries. The permutation is built the UNFUSED way, as PyTorch does it (keys,
 * a stable argsort, then a separate gather), so a bug in the fused counting sort cannot
 * be reproduced here by construction. */
#ifndef MT_KERNELS_REF_MOE_H
#define MT_KERNELS_REF_MOE_H

#include <stddef.h>
#include <stdint.h>

/* sel[N*K] -> off[E+1], slot_row[N*K], row_tok[N*K], xe[N*K,C] (xe may be NULL).
 * Pairs i = t*K + j sorted by (sel[i], i) with qsort (the index makes the order total,
 * i.e. a stable sort by expert); row r of the sorted list is pair order[r]. Then
 * slot_row[order[r]] = r, row_tok[r] = order[r] / K, and a gather xe[r] = x[row_tok[r]].
 * Requires 0 <= sel[i] < E. */
void mt_ref_moe_permute(float *xe, int32_t *off, int32_t *slot_row, int32_t *row_tok,
                        const float *x, const int32_t *sel, int N, int K, int E, int C);
/* dx[N,C] (+= when accumulate) = index_add over rows r of dxe[r] into token row_tok(r),
 * row_tok recovered from slot_row (the backward of the gather above). */
void mt_ref_moe_permute_bwd(float *dx, const float *dxe, const int32_t *slot_row, int N, int K,
                            int C, int accumulate);
/* out[N,C] (+= when accumulate): tmp[r] = w[pair(r)] * ye[r] (the weights multiply), then
 * index_add of tmp into out by token (scatter-add), in double. */
void mt_ref_moe_unpermute(float *out, const float *ye, const float *w, const int32_t *slot_row,
                          int N, int K, int C, int accumulate);

/* Grouped linear as a loop over experts e of mt_ref_linear_fwd / mt_ref_linear_bwd on rows
 * off[e]..off[e+1] with W_e = W + e*wstride ([O,In]). Contracts as in moe.h. */
void mt_ref_grouped_linear_fwd(float *out, const float *in, const float *W, size_t wstride,
                               const int32_t *off, int E, int In, int O, float beta);
void mt_ref_grouped_linear_bwd_data(float *din, const float *dout, const float *W,
                                    size_t wstride, const int32_t *off, int E, int In, int O,
                                    float beta);
void mt_ref_grouped_linear_bwd_weight(float *dW, size_t wstride, const float *dout,
                                      const float *in, const int32_t *off, int E, int In, int O);

/* gu[N,2F] rows [g | u] -> a[N,F] = silu(g) * u, through mt_ref_swiglu_fwd on the split
 * halves. */
void mt_ref_swiglu_rows_fwd(float *a, const float *gu, int N, int F);
/* dgu[N,2F] = [dg | du] from da[N,F] (times wscale[n] when wscale != NULL), through
 * mt_ref_swiglu_bwd on the split halves. */
void mt_ref_swiglu_rows_bwd(float *dgu, const float *da, const float *gu, const float *wscale,
                            int N, int F);

#endif
