/* parallel/reshard.c — see reshard.h.
 *
 * Protocol: every rank sends rank 0 the list of the tensors it takes part with (whole index,
 * slice, shape: 5 int64 each; MPI_Gather of the counts, MPI_Gatherv of the lists); then the
 * data moves tensor by tensor in that order with blocking sends / receives, rank by rank. */
#include "parallel/reshard.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

enum { HDR = 5 }; /* full_index, tp_dim, tp_off, rows, cols */

/* copy between a part's tensor (maybe a TP slice; `part` points at its first element) and its
 * place in the whole buffer */
static void slice_copy(float *full, const mt_tensor *f, float *part, const int64_t *h, int to_full) {
    float *fb = full + f->offset;
    size_t rows = (size_t)h[3], cols = (size_t)h[4];
    size_t fcols = f->ndim == 2 ? (size_t)f->shape[1] : 1, r0 = 0, c0 = 0;
    if (h[1] == 0) r0 = (size_t)h[2];
    if (h[1] == 1) c0 = (size_t)h[2];
    if (h[1] < 0 || (h[1] == 0 && cols == fcols)) { /* contiguous */
        float *a = fb + r0 * fcols;
        if (to_full) memcpy(a, part, rows * cols * sizeof(float));
        else memcpy(part, a, rows * cols * sizeof(float));
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        float *a = fb + (r0 + r) * fcols + c0, *b = part + r * cols;
        if (to_full) memcpy(a, b, cols * sizeof(float));
        else memcpy(b, a, cols * sizeof(float));
    }
}

static void header(const mt_tensor *t, int64_t *h) {
    h[0] = t->full_index;
    h[1] = t->tp_dim;
    h[2] = t->tp_off;
    h[3] = t->shape[0];
    h[4] = t->ndim == 2 ? t->shape[1] : 1;
}

/* this rank's list: the tensors it owns (gather) or all it holds (scatter) */
static int my_list(const mt_model *part, int gather, int own_tp, int own_dense, int own_expert, int **idx,
                   int64_t **hdr) {
    *idx = mt_xmalloc(sizeof(int) * ((size_t)part->ntensors + 1));
    *hdr = mt_xmalloc(sizeof(int64_t) * HDR * ((size_t)part->ntensors + 1));
    int n = 0;
    for (int i = 0; i < part->ntensors; i++) {
        const mt_tensor *t = &part->tensors[i];
        if (gather) {
            int own = t->tp_dim >= 0 ? own_tp : t->expert >= 0 ? own_expert : own_dense;
            if (t->replica || !own) continue;
        }
        (*idx)[n] = i;
        header(t, *hdr + (size_t)HDR * n);
        n++;
    }
    return n;
}

/* rank 0: every rank's list (counts[size], lists concatenated) */
static int64_t *all_lists(mt_group *g, int n, const int64_t *hdr, int *counts, int *displ) {
    int cnt = n * HDR;
    MPI_Gather(&cnt, 1, MPI_INT, counts, 1, MPI_INT, 0, g->comm);
    int64_t *all = NULL;
    if (g->rank == 0) {
        int tot = 0;
        for (int r = 0; r < g->size; r++) displ[r] = tot, tot += counts[r];
        all = mt_xmalloc(sizeof(int64_t) * ((size_t)tot + 1));
    }
    MPI_Gatherv(hdr, cnt, MPI_INT64_T, all, counts, displ, MPI_INT64_T, 0, g->comm);
    return all;
}

static void move(mt_group *g, const mt_tensor *full_t, float *full, const mt_model *part, float *pbuf,
                 int gather, int own_tp, int own_dense, int own_expert) {
    int *idx;
    int64_t *hdr;
    int n = my_list(part, gather, own_tp, own_dense, own_expert, &idx, &hdr);
    const int single = g->size == 1 || g->comm == MPI_COMM_NULL;
    if (single || g->rank == 0) /* rank 0's own tensors: local copies */
        for (int k = 0; k < n; k++)
            slice_copy(full, &full_t[hdr[HDR * k]], pbuf + part->tensors[idx[k]].offset, hdr + HDR * k, gather);
    if (single) {
        free(idx);
        free(hdr);
        return;
    }
    double t0 = MPI_Wtime();
    int *counts = mt_xmalloc(sizeof(int) * (size_t)g->size * 2), *displ = counts + g->size;
    int64_t *all = all_lists(g, n, hdr, counts, displ);
    if (g->rank == 0) {
        size_t maxn = 0;
        for (int r = 1; r < g->size; r++)
            for (int k = 0; k < counts[r] / HDR; k++) {
                const int64_t *h = all + displ[r] + HDR * k;
                if ((size_t)(h[3] * h[4]) > maxn) maxn = (size_t)(h[3] * h[4]);
            }
        float *tmp = mt_alloc((maxn + 1) * sizeof(float));
        for (int r = 1; r < g->size; r++)
            for (int k = 0; k < counts[r] / HDR; k++) {
                const int64_t *h = all + displ[r] + HDR * k;
                const size_t ne = (size_t)(h[3] * h[4]);
                MT_ASSERT(ne <= (size_t)INT32_MAX);
                if (gather) {
                    MPI_Recv(tmp, (int)ne, MPI_FLOAT, r, 0, g->comm, MPI_STATUS_IGNORE);
                    slice_copy(full, &full_t[h[0]], tmp, h, 1);
                } else {
                    slice_copy(full, &full_t[h[0]], tmp, h, 0);
                    MPI_Send(tmp, (int)ne, MPI_FLOAT, r, 0, g->comm);
                }
            }
        mt_free(tmp);
    } else {
        for (int k = 0; k < n; k++) {
            const mt_tensor *t = &part->tensors[idx[k]];
            MT_ASSERT(t->numel <= (size_t)INT32_MAX);
            if (gather) MPI_Send(pbuf + t->offset, (int)t->numel, MPI_FLOAT, 0, 0, g->comm);
            else MPI_Recv(pbuf + t->offset, (int)t->numel, MPI_FLOAT, 0, 0, g->comm, MPI_STATUS_IGNORE);
        }
    }
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    free(all);
    free(counts);
    free(idx);
    free(hdr);
}

void mt_reshard_gather(mt_group *g, const mt_tensor *full_t, const mt_model *part, const float *pbuf, int own_tp,
                       int own_dense, int own_expert, float *full) {
    move(g, full_t, full, part, (float *)pbuf, 1, own_tp, own_dense, own_expert);
}

void mt_reshard_scatter(mt_group *g, const mt_tensor *full_t, const float *full, const mt_model *part,
                        float *pbuf) {
    move(g, full_t, (float *)full, part, pbuf, 0, 0, 0, 0);
}

void mt_reshard_extract(const mt_tensor *full_t, const float *full, const mt_model *part, float *pbuf) {
    mt_group self = {.comm = MPI_COMM_NULL, .rank = 0, .size = 1}; /* a group of one: local slice copies only */
    move(&self, full_t, (float *)full, part, pbuf, 0, 0, 0, 0);
}

void mt_reshard_allgather(mt_group *g, const mt_tensor *full_t, int nfull, const mt_model *part, const float *pbuf,
                          int own_tp, int own_dense, int own_expert, float *full) {
    mt_reshard_allgather_to(g, full_t, nfull, part, pbuf, own_tp, own_dense, own_expert, full_t, nfull, full);
}

/* The rectangle of the whole tensor a piece with header h covers: first row, first column,
 * rows, columns (a TP slice's rows or columns; a 1-D tensor is one column). */
static void rect_of(const int64_t *h, int64_t *r) {
    r[0] = h[1] == 0 ? h[2] : 0;
    r[1] = h[1] == 1 ? h[2] : 0;
    r[2] = h[3], r[3] = h[4];
}

/* o = the overlap of pieces a and b of the same tensor (headers); its float count */
static size_t overlap(const int64_t *a, const int64_t *b, int64_t *o) {
    int64_t ra[4], rb[4];
    rect_of(a, ra);
    rect_of(b, rb);
    for (int k = 0; k < 2; k++) {
        const int64_t lo = ra[k] > rb[k] ? ra[k] : rb[k];
        const int64_t hi = ra[k] + ra[k + 2] < rb[k] + rb[k + 2] ? ra[k] + ra[k + 2] : rb[k] + rb[k + 2];
        o[k] = lo, o[k + 2] = hi > lo ? hi - lo : 0;
    }
    return (size_t)(o[2] * o[3]);
}

/* the rectangle o from src (laid out as rectangle sr) into dst (laid out as dr) */
static void rect_copy(float *dst, const int64_t *dr, const float *src, const int64_t *sr, const int64_t *o) {
    for (int64_t i = 0; i < o[2]; i++)
        memcpy(dst + (size_t)((o[0] + i - dr[0]) * dr[3] + o[1] - dr[1]),
               src + (size_t)((o[0] + i - sr[0]) * sr[3] + o[1] - sr[1]), sizeof(float) * (size_t)o[3]);
}

/* the overlap of source piece sh (data src) and destination piece dh (data dst), copied */
static void piece_copy(float *dst, const int64_t *dh, const float *src, const int64_t *sh) {
    int64_t o[4], sr[4], dr[4];
    if (!overlap(sh, dh, o)) return;
    rect_of(sh, sr);
    rect_of(dh, dr);
    rect_copy(dst, dr, src, sr, o);
}

void mt_reshard_allgather_to(mt_group *g, const mt_tensor *full_t, int nfull, const mt_model *part, const float *pbuf,
                             int own_tp, int own_dense, int own_expert, const mt_tensor *dst_t, int ndst, float *dbuf) {
    (void)full_t;
    int *idx;
    int64_t *hdr;
    const int n = my_list(part, 1, own_tp, own_dense, own_expert, &idx, &hdr);
    int *where = mt_xmalloc(sizeof(int) * ((size_t)nfull + 1)); /* whole index -> this rank's dst tensor, or -1 */
    int64_t *dh = mt_xmalloc(sizeof(int64_t) * HDR * ((size_t)ndst + 1)); /* this rank's dst pieces */
    for (int i = 0; i < nfull; i++) where[i] = -1;
    for (int k = 0; k < ndst; k++) {
        MT_ASSERT(dst_t[k].full_index >= 0 && dst_t[k].full_index < nfull);
        where[dst_t[k].full_index] = k;
        header(&dst_t[k], dh + (size_t)HDR * k);
    }
    for (int k = 0; k < n; k++) { /* this rank's own tensors: local copies */
        const int w = where[hdr[HDR * k]];
        if (w >= 0) piece_copy(dbuf + dst_t[w].offset, dh + (size_t)HDR * w, pbuf + part->tensors[idx[k]].offset, hdr + HDR * k);
    }
    const int single = g->size == 1 || g->comm == MPI_COMM_NULL;
    if (single) {
        free(where), free(dh), free(idx), free(hdr);
        return;
    }
    double t0 = MPI_Wtime();
    const int S = g->size, r = g->rank;
    /* every rank's list of owned pieces (in the order its blocks pack them) and of the pieces
     * its dst holds */
    int *counts = mt_xmalloc(sizeof(int) * (size_t)S * 4), *displ = counts + S, cnt = n * HDR, dcnt = ndst * HDR;
    int *dcounts = counts + 2 * S, *ddispl = counts + 3 * S;
    MPI_Allgather(&cnt, 1, MPI_INT, counts, 1, MPI_INT, g->comm);
    MPI_Allgather(&dcnt, 1, MPI_INT, dcounts, 1, MPI_INT, g->comm);
    int tot = 0, dtot = 0;
    for (int q = 0; q < S; q++) displ[q] = tot, tot += counts[q], ddispl[q] = dtot, dtot += dcounts[q];
    int64_t *all = mt_xmalloc(sizeof(int64_t) * ((size_t)tot + 1)), *held = mt_xmalloc(sizeof(int64_t) * ((size_t)dtot + 1));
    MPI_Allgatherv(hdr, cnt, MPI_INT64_T, all, counts, displ, MPI_INT64_T, g->comm);
    MPI_Allgatherv(dh, dcnt, MPI_INT64_T, held, dcounts, ddispl, MPI_INT64_T, g->comm);
    /* the floats of each round: to rank r + j the overlaps of this rank's pieces with what its
     * dst holds, from rank r - j the overlaps of that rank's pieces with this rank's dst */
    int *peer = mt_xmalloc(sizeof(int) * ((size_t)nfull + 1)); /* whole index -> the peer's dst piece, or -1 */
    for (int i = 0; i < nfull; i++) peer[i] = -1;
    size_t *sendf = mt_xcalloc((size_t)S * 2, sizeof(size_t)), *recvf = sendf + S, maxr = 0, maxs = 0;
    int64_t o[4];
    for (int j = 1; j < S; j++) {
        const int dst = (r + j) % S, src = (r - j + S) % S;
        const int64_t *ph = held + ddispl[dst];
        for (int k = 0; k < dcounts[dst] / HDR; k++) peer[ph[HDR * k]] = k;
        for (int k = 0; k < n; k++)
            if (peer[hdr[HDR * k]] >= 0) sendf[j] += overlap(hdr + HDR * k, ph + (size_t)HDR * peer[hdr[HDR * k]], o);
        for (int k = 0; k < dcounts[dst] / HDR; k++) peer[ph[HDR * k]] = -1;
        for (int k = 0; k < counts[src] / HDR; k++) {
            const int64_t *h = all + displ[src] + HDR * k;
            if (where[h[0]] >= 0) recvf[j] += overlap(h, dh + (size_t)HDR * where[h[0]], o);
        }
        maxr = recvf[j] > maxr ? recvf[j] : maxr;
        maxs = sendf[j] > maxs ? sendf[j] : maxs;
    }
    uint64_t mx = maxs > maxr ? maxs : maxr;
    MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_UINT64_T, MPI_MAX, g->comm);
    float *send = mt_alloc((maxs + 1) * sizeof(float)), *recv = mt_alloc((maxr + 1) * sizeof(float));
    /* round j: to rank r + j, from rank r - j; no rank waits on another's round, and each
     * holds one block in flight. Every rank makes the same number of calls per round (at
     * least one, even for empty blocks), so that each send meets its receive */
    const size_t win = (size_t)1 << 30, nwin = (size_t)mx / win + 1;
    for (int j = 1; j < S; j++) {
        const int dst = (r + j) % S, src = (r - j + S) % S;
        const int64_t *ph = held + ddispl[dst];
        for (int k = 0; k < dcounts[dst] / HDR; k++) peer[ph[HDR * k]] = k;
        for (size_t k = 0, off = 0; k < (size_t)n; k++) { /* each overlap packed as a dense rectangle */
            const int64_t *h = hdr + HDR * k;
            if (peer[h[0]] < 0) continue;
            const size_t ne = overlap(h, ph + (size_t)HDR * peer[h[0]], o);
            if (!ne) continue;
            int64_t sr[4];
            rect_of(h, sr);
            rect_copy(send + off, o, pbuf + part->tensors[idx[k]].offset, sr, o);
            off += ne;
        }
        for (int k = 0; k < dcounts[dst] / HDR; k++) peer[ph[HDR * k]] = -1;
        for (size_t w = 0, at = 0; w < nwin; w++, at += win) {
            const size_t sc = at < sendf[j] ? (sendf[j] - at < win ? sendf[j] - at : win) : 0;
            const size_t rc = at < recvf[j] ? (recvf[j] - at < win ? recvf[j] - at : win) : 0;
            MPI_Sendrecv(send + at, (int)sc, MPI_FLOAT, dst, 0, recv + at, (int)rc, MPI_FLOAT, src, 0, g->comm,
                         MPI_STATUS_IGNORE);
        }
        size_t off = 0;
        for (int k = 0; k < counts[src] / HDR; k++) {
            const int64_t *h = all + displ[src] + HDR * k;
            if (where[h[0]] < 0) continue;
            const int64_t *mh = dh + (size_t)HDR * where[h[0]];
            const size_t ne = overlap(h, mh, o);
            if (!ne) continue;
            int64_t dr[4];
            rect_of(mh, dr);
            rect_copy(dbuf + dst_t[where[h[0]]].offset, dr, recv + off, o, o);
            off += ne;
        }
    }
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    mt_free(send);
    mt_free(recv);
    free(peer);
    free(sendf);
    free(held);
    free(dh);
    free(where);
    free(all);
    free(counts);
    free(idx);
    free(hdr);
}
