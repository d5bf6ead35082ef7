/* kernels/ws.h — the kernels' workspace: scratch memory that the caller sizes and owns.
 *
 * A kernel that needs memory beyond its operands (the GEMM's packing buffers, a row of
 * fp32 before it is rounded to bf16, the grouped GEMMs' tile list, the head's packed
 * weight) takes an mt_ws by value: a view [p, p + cap) of the caller's memory. Each such
 * kernel has a size function (..._ws_bytes, by shape and by the threads the caller will
 * run, mt_get_threads()) and checks the view is large enough; no kernel keeps memory
 * between calls. A kernel that calls another carves its own part off the front of the
 * view (mt_ws_take) and passes the rest on, so the sizes add up the same way. Per-thread
 * parts are indexed by omp_get_thread_num() (mt_ws_thread).
 *
 * The owner (the model's activations, a decoder, a test) holds one mt_ws and grows it
 * between calls with mt_ws_reserve, never while a kernel runs.
 *
 * It is also the call's execution context: bf16 is the precision the products run in
 * (0: fp32 through OpenBLAS; 1: mixed precision, kernels/gemm_bf16.h, which needs
 * mt_bf16_supported()), so two owners in one process may run in different precisions
 * (e.g. a bf16 training model next to an fp32 rollout copy). The owner sets it once, when
 * it sizes its buffers for that precision; the views mt_ws_take leaves keep it, and an
 * empty workspace ({0}) is fp32's, which needs none. */
#ifndef MT_KERNELS_WS_H
#define MT_KERNELS_WS_H

#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"

typedef struct mt_ws {
    void *p;
    size_t cap; /* bytes */
    int bf16;   /* the products' precision: bf16 operands, fp32 sums (1), or fp32 (0) */
    int rows;   /* fp32 forward products (A B^T) by the few-row kernel (kernels/rows.h), not
                   OpenBLAS: the decoder's, whose calls have a few rows per weight */
} mt_ws;

/* a kernel given too small a workspace: a bug of its caller */
__attribute__((noreturn)) static inline void mt_ws_short(size_t need, size_t cap) {
    fprintf(stderr, "moetrain: kernel workspace too small: %zu bytes needed, %zu given\n", need, cap);
    abort();
}

/* bytes rounded up to whole cache lines: every part of a workspace starts on one */
static inline size_t mt_ws_round(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* the first `bytes` of *ws for the caller; *ws becomes the rest (aborts if too small) */
static inline void *mt_ws_take(mt_ws *ws, size_t bytes) {
    bytes = mt_ws_round(bytes);
    if (bytes > ws->cap) mt_ws_short(bytes, ws->cap);
    void *p = ws->p;
    ws->p = (char *)ws->p + bytes;
    ws->cap -= bytes;
    return p;
}

/* Part t of nparts per-thread parts of per_thread bytes each at the front of ws, for the
 * calling thread (t = omp_get_thread_num()); checks once that all parts fit. */
static inline void mt_ws_check(mt_ws ws, size_t per_thread, int nparts) {
    if (mt_ws_round(per_thread) * (size_t)nparts > ws.cap) mt_ws_short(mt_ws_round(per_thread) * (size_t)nparts, ws.cap);
}
static inline void *mt_ws_thread(mt_ws ws, size_t per_thread) {
    return (char *)ws.p + mt_ws_round(per_thread) * (size_t)omp_get_thread_num();
}

/* The owner's side: grow to at least `bytes` (the contents are not kept), free (both keep
 * the precision). */
static inline void mt_ws_reserve(mt_ws *ws, size_t bytes) {
    if (bytes <= ws->cap) return;
    mt_free(ws->p);
    ws->p = mt_alloc(bytes);
    ws->cap = bytes;
}
static inline void mt_ws_free(mt_ws *ws) {
    mt_free(ws->p);
    ws->p = NULL;
    ws->cap = 0;
}

#endif
