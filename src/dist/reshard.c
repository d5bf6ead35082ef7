/* dist/reshard.c — see reshard.h. */
#include "dist/reshard.h"

#include <string.h>

#include "base/common.h"

enum { CHUNK = 1 << 26 }; /* floats per MPI call */

/* copy between a part's tensor (maybe a TP slice) and its place in the whole tensor f */
static void slice_copy(float *full, const mt_tensor *f, float *part, const mt_tensor *t, int to_full) {
    MT_ASSERT(strcmp(f->name, t->name) == 0);
    float *fb = full + f->offset;
    size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    size_t fcols = f->ndim == 2 ? (size_t)f->shape[1] : 1, r0 = 0, c0 = 0;
    if (t->tp_dim < 0) MT_ASSERT(f->numel == t->numel);
    if (t->tp_dim == 0) r0 = (size_t)t->tp_off;
    if (t->tp_dim == 1) c0 = (size_t)t->tp_off;
    for (size_t r = 0; r < rows; r++) {
        float *a = fb + (r0 + r) * fcols + c0, *b = part + t->offset + r * cols;
        if (to_full) memcpy(a, b, cols * sizeof(float));
        else memcpy(b, a, cols * sizeof(float));
    }
}

void mt_reshard_gather(mt_group *g, int root, const mt_tensor *full_t, size_t nfull, const mt_model *part,
                       const float *pbuf, int own_tp, int own_dense, int own_expert, float *full) {
    memset(full, 0, nfull * sizeof(float));
    for (int i = 0; i < part->ntensors; i++) {
        const mt_tensor *t = &part->tensors[i];
        int own = t->tp_dim >= 0 ? own_tp : t->expert >= 0 ? own_expert : own_dense;
        if (t->replica || !own) continue;
        slice_copy(full, &full_t[t->full_index], (float *)pbuf, t, 1);
    }
    if (g->size == 1 || g->comm == MPI_COMM_NULL) return;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < nfull; i += CHUNK) {
        int c = (int)(nfull - i < CHUNK ? nfull - i : CHUNK);
        if (root < 0) MPI_Allreduce(MPI_IN_PLACE, full + i, c, MPI_FLOAT, MPI_SUM, g->comm);
        else if (g->rank == root) MPI_Reduce(MPI_IN_PLACE, full + i, c, MPI_FLOAT, MPI_SUM, root, g->comm);
        else MPI_Reduce(full + i, NULL, c, MPI_FLOAT, MPI_SUM, root, g->comm);
    }
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
}

void mt_reshard_scatter(mt_group *g, const mt_tensor *full_t, float *full, size_t nfull, const mt_model *part,
                        float *pbuf) {
    mt_group_bcast_f32(g, full, nfull);
    for (int i = 0; i < part->ntensors; i++) {
        const mt_tensor *t = &part->tensors[i];
        slice_copy(full, &full_t[t->full_index], pbuf, t, 0);
    }
}
