/* dist/reshard.c — see reshard.h. */
#include "dist/reshard.h"

#include <string.h>

#include "base/common.h"

enum { CHUNK = 1 << 26 }; /* floats per MPI call */

void mt_reshard_gather(mt_group *g, int root, const mt_tensor *full_t, size_t nfull, const mt_model *part,
                       const float *pbuf, int own_dense, int own_expert, float *full) {
    memset(full, 0, nfull * sizeof(float));
    for (int i = 0; i < part->ntensors; i++) {
        const mt_tensor *t = &part->tensors[i];
        if (t->replica || !(t->expert >= 0 ? own_expert : own_dense)) continue;
        const mt_tensor *f = &full_t[t->full_index];
        MT_ASSERT(f->numel == t->numel && strcmp(f->name, t->name) == 0);
        memcpy(full + f->offset, pbuf + t->offset, t->numel * sizeof(float));
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
        const mt_tensor *f = &full_t[t->full_index];
        MT_ASSERT(f->numel == t->numel && strcmp(f->name, t->name) == 0);
        memcpy(pbuf + t->offset, full + f->offset, t->numel * sizeof(float));
    }
}
