/* tests/test_reshard.c — moving weights between layouts in memory (parallel/reshard.h) under
 * MPI: mt_reshard_allgather_to from a training layout's parts into another layout's parts.
 *
 * Usage: mpirun -np N test_reshard   (N = 1, 2 or 4; tests/test_reshard_mpi.sh)
 * Every element of the whole "demo" model gets a value of its own; each rank's source part
 * is cut from it (mt_reshard_extract), the parts are moved into the destination layout, and
 * every destination element must equal the whole model's, bit for bit:
 *  - from the experts split over all ranks (the other tensors owned by rank 0) into a whole
 *    copy on every rank, and into EP parts over groups of 2 ranks;
 *  - from TP2 slices (owned by the TP ranks of DP index 0; the experts split over the DP
 *    indices, owned by TP rank 0) into EP parts over all ranks (RL's --rollout-ep switch);
 *  - from EP parts and from TP2 slices into TP2 parts whose TP rank is another one
 *    (RL's --rollout-tp switch: slices cut from whole tensors and from other slices).
 * Prints "reshard: N checks passed, M failed"; exit 1 on failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/config.h"
#include "model/model.h"
#include "mpicheck.h"
#include "parallel/dist.h"
#include "parallel/reshard.h"

/* a part's tensor table (no buffers: the moves read tensors and ntensors only) */
static void part_table(mt_model *m, const mt_config *c, const mt_part *sh) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->part = *sh;
    m->ntensors = mt_model_layout_part(c, sh, NULL, NULL, NULL, NULL);
    m->tensors = mt_xcalloc((size_t)m->ntensors + 1, sizeof(mt_tensor));
    mt_model_layout_part(c, sh, m->tensors, &m->nparams, &m->n_tp, &m->n_dense);
}

static mt_part ep_part(const mt_config *c, int rank, int size) {
    mt_part s;
    mt_part_whole(&s, c);
    s.ep_rank = rank, s.ep_size = size;
    return s;
}

/* src (this rank's part, cut from whole) -> dst (NULL: the whole model) */
static void move_case(mt_dist *d, const mt_config *c, const mt_tensor *full_t, int nfull, const float *whole,
                        const mt_part *src_sh, int own_tp, int own_dense, int own_expert, const mt_part *dst_sh,
                        const char *what) {
    mt_model src, dst;
    part_table(&src, c, src_sh);
    float *sbuf = mt_xmalloc(sizeof(float) * (src.nparams + 1));
    mt_reshard_extract(full_t, whole, &src, sbuf);
    const mt_tensor *dt = full_t;
    int nd = nfull;
    size_t nparams = 0;
    for (int i = 0; i < nfull; i++) nparams += full_t[i].numel;
    if (dst_sh) {
        part_table(&dst, c, dst_sh);
        dt = dst.tensors, nd = dst.ntensors, nparams = dst.nparams;
    }
    float *dbuf = mt_xmalloc(sizeof(float) * (nparams + 1)), *want = mt_xmalloc(sizeof(float) * (nparams + 1));
    for (size_t i = 0; i < nparams; i++) dbuf[i] = -1.0f; /* every element must be written */
    if (dst_sh) mt_reshard_extract(full_t, whole, &dst, want);
    else memcpy(want, whole, sizeof(float) * nparams);
    mt_reshard_allgather_to(&d->all, full_t, nfull, &src, sbuf, own_tp, own_dense, own_expert, dt, nd, dbuf);
    size_t bad = 0;
    for (size_t i = 0; i < nparams; i++) bad += memcmp(&dbuf[i], &want[i], sizeof(float)) != 0;
    CHECK(bad == 0, "%s: %zu of %zu elements differ from the whole model's", what, bad, nparams);
    if (d->rank == 0) printf("  %s: %zu floats on rank 0, bit for bit\n", what, nparams);
    free(sbuf), free(dbuf), free(want);
    free(src.tensors);
    if (dst_sh) free(dst.tensors);
}

int main(int argc, char **argv) {
    mt_dist *d = mpicheck_init(&argc, &argv);
    if (!d) return 1;
    const int W = d->size, r = d->rank;
    char path[4200];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash : path, sizeof path - (size_t)(slash ? slash - path : 0), "/../configs/demo.json");
    mt_config c;
    if (mt_config_load(&c, path) != 0) {
        fprintf(stderr, "%s\n", mt_last_error());
        return 1;
    }
    if (W != 1 && W != 2 && W != 4) {
        if (r == 0) fprintf(stderr, "test_reshard: run it on 1, 2 or 4 ranks\n");
        mt_dist_finalize();
        return 2;
    }
    const int nfull = mt_model_layout(&c, NULL, NULL);
    mt_tensor *full_t = mt_xcalloc((size_t)nfull, sizeof(mt_tensor));
    size_t nw = 0;
    mt_model_layout(&c, full_t, &nw);
    float *whole = mt_xmalloc(sizeof(float) * (nw + 1));
    for (size_t i = 0; i < nw; i++) whole[i] = mt_u01(mt_hash4(i, 0x5e5a, 0, 0)) * 2 - 1;

    /* experts over all ranks, the rest owned by rank 0 */
    const mt_part epw = ep_part(&c, r, W);
    move_case(d, &c, full_t, nfull, whole, &epw, 0, r == 0, 1, NULL, "EP over all -> whole copies");
    if (W >= 2) {
        const mt_part ep2 = ep_part(&c, r % 2, 2);
        move_case(d, &c, full_t, nfull, whole, &epw, 0, r == 0, 1, &ep2, "EP over all -> EP over pairs");
    }
    /* TP2 (W >= 2): slices by TP rank r % 2, the experts split over the W / 2 DP indices */
    mt_part tp = ep_part(&c, W >= 2 ? r / 2 : 0, W >= 2 ? W / 2 : 1);
    tp.tp_rank = W >= 2 ? r % 2 : 0, tp.tp_size = W >= 2 ? 2 : 1;
    move_case(d, &c, full_t, nfull, whole, &tp, r < 2, r == 0, r % 2 == 0, &epw,
              W >= 2 ? "TP2 x DP -> EP over all" : "whole -> EP 1");
    if (W >= 2) { /* into TP2 rollout parts (--rollout-tp 2): the slices cut out of whole
                   * tensors, and out of other slices with the TP ranks crossed over */
        mt_part tp2;
        mt_part_whole(&tp2, &c);
        tp2.tp_rank = (r + 1) % 2, tp2.tp_size = 2;
        move_case(d, &c, full_t, nfull, whole, &epw, 0, r == 0, 1, &tp2, "EP over all -> TP2 parts");
        move_case(d, &c, full_t, nfull, whole, &tp, r < 2, r == 0, r % 2 == 0, &tp2, "TP2 x DP -> TP2 parts, crossed");
    }
    free(whole);
    free(full_t);
    int64_t s[2] = {g_pass, g_fail};
    mt_group_sum_i64(&d->all, s, 2);
    if (r == 0) printf("reshard: %lld checks passed, %lld failed\n", (long long)s[0], (long long)s[1]);
    mt_dist_finalize();
    return s[1] ? 1 : 0;
}
