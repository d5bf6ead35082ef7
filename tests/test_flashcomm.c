/* tests/test_flashcomm.c — FlashComm's all-reduce (parallel/tp.h: reduce-scatter, INT8 with a
 * scale per 128 values, all-gather) under MPI.
 *
 * Usage: mpirun -np N test_flashcomm   (tests/test_flashcomm_mpi.sh; a plain run is 1 rank)
 * For sizes that are and are not multiples of 128, smaller than a block per rank (ranks that
 * own nothing), a block of zeros and a block with one large value:
 *  - every rank ends with the same bits;
 *  - each element is within half a step (absmax / 127 / 2 of its block of the exact sum) of
 *    the sum of every rank's values, zeros stay exact zeros;
 *  - the byte counters say <= 0.65x the fp32 all-reduce's on large messages.
 * Prints "flashcomm: N checks passed, M failed"; exit 1 on failure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "mpicheck.h"
#include "parallel/dist.h"
#include "parallel/tp.h"

static float val(int rank, size_t i, int kind) {
    const float u = mt_u01(mt_hash4((uint64_t)rank, i, 0xf1a5, (uint64_t)kind)) * 2 - 1;
    if (kind == 1 && i / MT_FLASHCOMM_BLOCK == 1) return 0.0f;           /* block 1: zeros */
    if (kind == 1 && i == 2 * MT_FLASHCOMM_BLOCK + 5) return 1000.0f * u; /* one outlier in block 2 */
    return u * (1.0f + (float)(i % 7));
}

static void run_case(mt_dist *d, mt_tp *t, size_t n, int kind) {
    const int W = d->size;
    float *x = mt_xmalloc(sizeof(float) * (n + 1));
    double *exact = mt_xcalloc(n + 1, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        x[i] = val(d->rank, i, kind);
        for (int r = 0; r < W; r++) exact[i] += val(r, i, kind);
    }
    mt_tp_allreduce_int8(t, x, n);
    /* the same bits on every rank */
    float *r0 = mt_xmalloc(sizeof(float) * (n + 1));
    memcpy(r0, x, sizeof(float) * n);
    mt_group_bcast_f32(&d->all, r0, n);
    CHECK(memcmp(r0, x, sizeof(float) * n) == 0, "n %zu kind %d: ranks differ", n, kind);
    size_t bad = 0;
    double worst = 0;
    for (size_t b = 0; b * MT_FLASHCOMM_BLOCK < n; b++) {
        const size_t s = b * MT_FLASHCOMM_BLOCK, e = s + MT_FLASHCOMM_BLOCK < n ? s + MT_FLASHCOMM_BLOCK : n;
        double amax = 0;
        for (size_t i = s; i < e; i++) amax = fabs(exact[i]) > amax ? fabs(exact[i]) : amax;
        const double half = amax / 127.0 / 2.0 + 1e-5 * amax; /* + the fp32 sum's own rounding */
        for (size_t i = s; i < e; i++) {
            const double err = fabs(x[i] - exact[i]);
            worst = err / (amax > 0 ? amax : 1) > worst ? err / (amax > 0 ? amax : 1) : worst;
            bad += err > half || (exact[i] == 0 && x[i] != 0);
        }
    }
    CHECK(bad == 0, "n %zu kind %d: %zu elements beyond half a step (worst %.3g of the block's absmax)", n, kind, bad,
          worst);
    free(x), free(exact), free(r0);
}

int main(int argc, char **argv) {
    mt_dist *d = mpicheck_init(&argc, &argv);
    if (!d) return 1;
    if (mt_dist_set_layout(d, 1, d->size, 0, 1) != 0) {
        fprintf(stderr, "%s\n", mt_last_error());
        return 1;
    }
    mt_tp t;
    mt_tp_init(&t, &d->tp, 0, 1);
    const size_t sizes[] = {1, 100, 128, 129, 3 * 128, 1000, 65536 + 77};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int kind = 0; kind < 2; kind++) run_case(d, &t, sizes[k], kind);
    /* bytes: a large message against the fp32 all-reduce's */
    mt_tp_stats before = t.st;
    float *x = mt_xcalloc(1 << 20, sizeof(float));
    mt_tp_allreduce_int8(&t, x, 1 << 20);
    const double ratio = (double)(t.st.bytes - before.bytes) / (double)(t.st.bytes_fp32 - before.bytes_fp32);
    if (d->size > 1) CHECK(ratio <= 0.65, "bytes %.3f of the fp32 all-reduce's", ratio);
    if (d->rank == 0 && d->size > 1) printf("  %d ranks: bytes %.3fx the fp32 all-reduce's\n", d->size, ratio);
    free(x);
    mt_tp_free(&t);
    int64_t s[2] = {g_pass, g_fail};
    mt_group_sum_i64(&d->all, s, 2);
    if (d->rank == 0) printf("flashcomm: %lld checks passed, %lld failed\n", (long long)s[0], (long long)s[1]);
    mt_dist_finalize();
    return s[1] ? 1 : 0;
}
