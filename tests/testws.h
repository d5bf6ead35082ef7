/* tests/testws.h — the kernels' workspace a C test owns (kernels/ws.h): tws() gives it grown
 * to the GEMMs' need for the threads in use plus room for the other kernels' needs at the
 * tests' shapes (the head's packed weight, tile lists, histograms, rows: well under 64 MiB).
 * A view: call tws() again after changing the thread count. Its precision (ws.bf16, the
 * products' mode) is fp32 until tws_bf16(1), which fails (-1, with an error) where bf16
 * cannot run. */
#ifndef MT_TESTS_TESTWS_H
#define MT_TESTS_TESTWS_H

#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ws.h"

static mt_ws t_ws;

static inline mt_ws tws(void) {
    mt_ws_reserve(&t_ws, mt_gemm_ws_bytes(mt_get_threads()) + ((size_t)64 << 20));
    return t_ws;
}

static inline int tws_bf16(int on) {
    if (mt_gemm_bf16_check(on) != 0) return -1;
    t_ws.bf16 = on != 0;
    return 0;
}

#endif
