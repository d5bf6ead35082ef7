/* model/ffn.c — the SwiGLU feed-forward block (dense layers and shared experts) (see model.h). */
#include "model/model.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/moe.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/internal.h"

/* SwiGLU FFN with gate|up in one GEMM (Wgu = [gate; up] is [2F, C], adjacent in the layout):
 * out[N,C] = res + (silu(g)*u) Wd^T (res NULL: 0; the residual add in the product's output
 * pass, mt_linear_fwd_res) ; gu[N,2F] is kept for the backward. The input is
 * x, or x16 when it is bf16 (the other NULL); gu, or gu16 in bf16 mode. The SwiGLU
 * and the down projection run over chunks of `rows` rows in the scratch a->big1 (the dense
 * FFN, wider than the MoE-sized scratch, passes a->ffn_rows; the shared experts fit: N). */
void mt_ffn_fwd(mt_acts *a, float *out, const float *res, float *gu, uint16_t *gu16, const float *x,
                const uint16_t *x16, const float *wgu, const float *wd, int N, int C, int F, int rows) {
    float *act = a->big1;
    uint16_t *act16 = a->big1_16;
    mt_linear_fwd_x(a->ws, gu, gu16, x, x16, wgu, N, C, 2 * F, 0.0f);
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int n = N - n0 < rows ? N - n0 : rows;
        const size_t o = (size_t)n0 * 2 * F;
        mt_swiglu_rows_fwd_x(a->ws, act, act16, gu ? gu + o : NULL, gu16 ? gu16 + o : NULL, n, F);
        if (res) mt_linear_fwd_res(a->ws, out + (size_t)n0 * C, res + (size_t)n0 * C, act, act16, wd, n, F, C);
        else mt_linear_fwd_x(a->ws, out + (size_t)n0 * C, NULL, act, act16, wd, n, F, C, 0.0f);
    }
}

/* dx[N,C] = d/dx (overwritten); weight grads accumulate (dwgu is [2F, C]), over the same
 * chunks of rows, in the scratch a->big1 [rows,F], big2 [rows,F], big3 [rows,2F]. */
void mt_ffn_bwd(mt_acts *a, float *dx, float *dwgu, float *dwd, const float *dout, const float *x,
                const uint16_t *x16, const float *gu, const uint16_t *gu16, const float *wgu, const float *wd, int N,
                int C, int F, int rows) {
    float *dact = a->big2, *act = a->big1, *dgu = a->big3;
    uint16_t *act16 = a->big1_16, *dgu16 = a->big3_16;
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int n = N - n0 < rows ? N - n0 : rows;
        const size_t o = (size_t)n0 * 2 * F;
        const float *g = gu ? gu + o : NULL, *dy = dout + (size_t)n0 * C;
        const uint16_t *g16 = gu16 ? gu16 + o : NULL;
        mt_swiglu_rows_fwd_x(a->ws, act, act16, g, g16, n, F);                       /* recompute the activation */
        mt_linear_bwd_x(a->ws, dact, dwd, dy, NULL, act, act16, wd, n, F, C, 0.0f); /* da */
        mt_swiglu_rows_bwd_x(a->ws, dgu, dgu16, dact, g, g16, NULL, n, F);           /* dg|du */
        mt_linear_bwd_x(a->ws, dx + (size_t)n0 * C, dwgu, dgu, dgu16, x ? x + (size_t)n0 * C : NULL,
                        x16 ? x16 + (size_t)n0 * C : NULL, wgu, n, C, 2 * F, 0.0f);
    }
}

