/* train/balance.c — expert placement from measured load (see balance.h). */
#include "train/balance.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/config.h"
#include "parallel/wire.h"

typedef struct {
    int64_t load;
    int e;
} expert_load;

static int heavier_first(const void *a, const void *b) {
    const expert_load *x = a, *y = b;
    if (x->load != y->load) return x->load > y->load ? -1 : 1;
    return x->e - y->e;
}

/* the busiest rank's tokens under placement slot[E] */
static double busiest(const int64_t *load, const int32_t *slot, int E, int P) {
    int64_t r[MT_BALANCE_MAX_RANKS] = {0}, mx = 0;
    const int LE = E / P;
    for (int e = 0; e < E; e++) r[slot[e] / LE] += load[e];
    for (int p = 0; p < P; p++) mx = r[p] > mx ? r[p] : mx;
    return (double)mx;
}

int mt_balance_layer(const int64_t *load, const int32_t *cur, int E, int P, int32_t *nxt, double *busy0,
                     double *busy1, double *mean) {
    MT_ASSERT(P >= 1 && P <= MT_BALANCE_MAX_RANKS && E % P == 0);
    const int LE = E / P;
    int64_t total = 0;
    for (int e = 0; e < E; e++) total += load[e];
    *mean = (double)total / P;
    *busy0 = *busy1 = busiest(load, cur, E, P);
    memcpy(nxt, cur, sizeof(int32_t) * (size_t)E);
    if (P == 1 || total == 0) return 0;
    expert_load *order = mt_xmalloc(sizeof *order * (size_t)E);
    int *owner = mt_xmalloc(sizeof(int) * (size_t)E);
    int64_t tok[MT_BALANCE_MAX_RANKS] = {0};
    int room[MT_BALANCE_MAX_RANKS];
    for (int p = 0; p < P; p++) room[p] = LE;
    for (int e = 0; e < E; e++) order[e] = (expert_load){load[e], e};
    qsort(order, (size_t)E, sizeof *order, heavier_first);
    for (int i = 0; i < E; i++) {
        const int e = order[i].e, home = cur[e] / LE;
        int best = -1;
        for (int p = 0; p < P; p++) {
            if (!room[p]) continue;
            if (best < 0 || tok[p] < tok[best] || (tok[p] == tok[best] && p == home && best != home)) best = p;
        }
        owner[e] = best;
        tok[best] += load[e];
        room[best]--;
    }
    int64_t mx = 0;
    for (int p = 0; p < P; p++) mx = tok[p] > mx ? tok[p] : mx;
    int moved = 0;
    if ((double)mx <= 0.99 * *busy0) {
        /* stayers keep their slots; the slots freed on each rank go to its arrivals */
        unsigned char *used = mt_xcalloc((size_t)E, 1);
        for (int e = 0; e < E; e++)
            if (owner[e] == cur[e] / LE) used[cur[e]] = 1;
        for (int e = 0; e < E; e++) { /* ascending id: the arrivals' order */
            if (owner[e] == cur[e] / LE) continue;
            int s = owner[e] * LE;
            while (used[s]) s++;
            MT_ASSERT(s < (owner[e] + 1) * LE);
            used[s] = 1;
            nxt[e] = s;
            moved++;
        }
        free(used);
        *busy1 = (double)mx;
    }
    free(order);
    free(owner);
    return moved;
}

void mt_balance_move(const mt_model *m, float *const *arr, const size_t *lo, int narr, MPI_Comm comm, int rank,
                       int P, const int *node_of, int l, const int32_t *cur, const int32_t *nxt) {
    const mt_config *c = &m->cfg;
    const int E = c->n_routed_experts, LE = E / P;
    const size_t gu = (size_t)2 * c->moe_intermediate_size * c->hidden_size, dn = (size_t)c->hidden_size * c->moe_intermediate_size;
    const size_t per = (gu + dn) * (size_t)narr; /* an expert's floats on the wire */
    const size_t ogu = (size_t)(m->w[l].egate - m->params), odn = (size_t)(m->w[l].edown - m->params);
    int *scnt = mt_xcalloc((size_t)P * 4, sizeof(int)), *sdis = scnt + P, *rcnt = sdis + P, *rdis = rcnt + P;
    int nsend = 0, nrecv = 0;
    for (int e = 0; e < E; e++) {
        const int from = cur[e] / LE, to = nxt[e] / LE;
        if (from == to) continue;
        if (from == rank) scnt[to]++, nsend++;
        if (to == rank) rcnt[from]++, nrecv++;
    }
    /* counted in experts: one MPI type of an expert's floats (a large model's would overflow
     * an int count of floats) */
    MT_ASSERT(per < (size_t)1 << 31);
    MPI_Datatype xt;
    MPI_Type_contiguous((int)per, MPI_FLOAT, &xt);
    MPI_Type_commit(&xt);
    for (int p = 0, s = 0, r = 0; p < P; p++) {
        sdis[p] = s, rdis[p] = r;
        s += scnt[p], r += rcnt[p];
    }
    float *sb = mt_alloc(sizeof(float) * (per * (size_t)nsend + 1)), *rb = mt_alloc(sizeof(float) * (per * (size_t)nrecv + 1));
    /* packed by destination rank, then expert id (the receiver unpacks in the same order) */
    int *at = mt_xcalloc((size_t)P, sizeof(int));
    for (int e = 0; e < E; e++) {
        const int from = cur[e] / LE, to = nxt[e] / LE;
        if (from != rank || to == rank) continue;
        float *o = sb + ((size_t)sdis[to] + (size_t)at[to]) * per;
        const size_t k = (size_t)(cur[e] - rank * LE);
        for (int a = 0; a < narr; a++, o += gu + dn) {
            memcpy(o, arr[a] + (ogu - lo[a]) + k * gu, sizeof(float) * gu);
            memcpy(o + gu, arr[a] + (odn - lo[a]) + k * dn, sizeof(float) * dn);
        }
        at[to]++;
    }
    MPI_Alltoallv(sb, scnt, sdis, xt, rb, rcnt, rdis, xt, comm);
    MPI_Type_free(&xt);
    if (mt_wire_get()->on && node_of) { /* the experts bound for other nodes on this rank's link */
        int64_t *bytes = mt_xcalloc((size_t)P, sizeof(int64_t));
        double *arrive = mt_xcalloc((size_t)P * 2, sizeof(double)), *when = arrive + P;
        for (int p = 0; p < P; p++)
            if (node_of[p] != node_of[rank]) bytes[p] = (int64_t)scnt[p] * (int64_t)per * (int64_t)sizeof(float);
        mt_wire_stamp(bytes, P, (rank + 1) % P, arrive);
        MPI_Alltoall(arrive, 1, MPI_DOUBLE, when, 1, MPI_DOUBLE, comm);
        double last = 0;
        for (int p = 0; p < P; p++) last = when[p] > last ? when[p] : last;
        mt_wire_sleep_until(last);
        free(bytes);
        free(arrive);
    }
    memset(at, 0, sizeof(int) * (size_t)P);
    for (int e = 0; e < E; e++) {
        const int from = cur[e] / LE, to = nxt[e] / LE;
        if (to != rank || from == rank) continue;
        const float *i = rb + ((size_t)rdis[from] + (size_t)at[from]) * per;
        const size_t k = (size_t)(nxt[e] - rank * LE);
        for (int a = 0; a < narr; a++, i += gu + dn) {
            memcpy(arr[a] + (ogu - lo[a]) + k * gu, i, sizeof(float) * gu);
            memcpy(arr[a] + (odn - lo[a]) + k * dn, i + gu, sizeof(float) * dn);
        }
        at[from]++;
    }
    free(at);
    mt_free(sb);
    mt_free(rb);
    free(scnt);
}
