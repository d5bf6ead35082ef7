/* parallel/tp.h — the model's tensor-parallel collectives (mt_tp_ops, model/model.h) over the
 * TP group of the layout: all-gather / reduce-scatter with sequence parallelism, all-reduce
 * without. Their time is counted as communication (mt_dist.comm_s) and traced as
 * "comm.tp".
 *
 * FlashComm (flash = 1, no SP): the all-reduce becomes a reduce-scatter in fp32, each rank's
 * summed range rounded to INT8 with one fp32 scale per block of 128 values (absmax / 127,
 * round to nearest), and an all-gather of the INT8 blocks and scales; every rank, the range's
 * owner too, keeps the dequantised values, so the TP ranks stay identical. Backwards see the
 * rounding as the identity (the model's backward is unchanged). Bytes a rank sends: (W-1)/W
 * x (4n + n + n/32) against 2 (W-1)/W x 4n for the fp32 all-reduce, 0.63x. */
#ifndef MT_DIST_TP_H
#define MT_DIST_TP_H

#include <stdint.h>

#include "parallel/dist.h"
#include "model/model.h"

#define MT_FLASHCOMM_BLOCK 128
/* FlashComm's rounding: x[n] as INT8 codes q[n] with a scale per block of
 * MT_FLASHCOMM_BLOCK values (sc[b] = max |x| of the block / 127, q = round(x / sc)); adds the
 * squared rounding error and the squared values to *err_sq and *ref_sq. Decoding is q * sc. */
void mt_q8_encode(const float *x, size_t n, float *sc, int8_t *q, double *err_sq, double *ref_sq);

typedef struct {
    int64_t bytes;          /* sent by this rank in the TP reductions (a ring's count) */
    int64_t bytes_fp32;     /* what the fp32 all-reduce of the same values would send */
    double err_sq, ref_sq;  /* FlashComm: sum of squared rounding errors and of squared values */
} mt_tp_stats;

typedef struct {
    mt_tp_ops ops;
    mt_group *g;
    int flash;
    mt_tp_stats st;
    uint8_t *buf;           /* FlashComm scratch (grown as needed) */
    int *cnt;               /* [4 x size]: each rank's part, as counts and offsets */
    size_t cap;
} mt_tp;

void mt_tp_init(mt_tp *t, mt_group *g, int sp, int flash);
void mt_tp_free(mt_tp *t);

/* For tests: the FlashComm all-reduce of x[n] in place (collective over t's group). */
void mt_tp_allreduce_int8(mt_tp *t, float *x, size_t n);

#endif
