/* parallel/ep.h — the model's expert-parallel exchange (mt_ep_ops, model/model.h) over MPI,
 * implemented with the dispatch / combine collective of parallel/a2a.h, flat or hierarchical.
 *
 * The exchange keeps byte counters (inter-node, intra-node) for the trainer to report. An
 * error inside an exchange (inconsistent counts, an expert out of range) is a broken
 * invariant: it ends the job naming the rank (mt_dist_abort). */
#ifndef MT_DIST_EP_H
#define MT_DIST_EP_H

#include "parallel/a2a.h"
#include "model/model.h"

/* Token rows one exchange moves for a routing, counted for both modes ([0] flat, [1]
 * hierarchical) whichever mode runs, so a run reports what the other would have sent. */
typedef struct {
    int64_t inter_rows[2], intra_rows[2];
} mt_ep_count;

typedef struct {
    mt_ep_ops ops;
    mt_a2a a2a;
    mt_a2a_mode mode;
    int split;             /* the combine, gather and dispatch backward stay in flight until wait() */
    mt_ep_count count;     /* accumulated over every exchange (dispatch, combine and backwards) */
    int64_t *rows;         /* rows this rank received in each dispatch so far */
    int nrows, caprows;
} mt_ep;

/* The load imbalance the dispatches so far had (collective over the EP group): the sum over
 * dispatches of the busiest rank's rows over the sum of the mean rank's rows (1 = even). A
 * dispatch waits for its busiest rank, so this is the factor the experts' work is slowed by. */
double mt_ep_imbalance(mt_ep *e);

/* Rows sent by this rank for tokens routed to sel[N*K] (no communication). */
void mt_ep_count_rows(const mt_a2a *a, const int32_t *sel, int N, int K, int E, mt_ep_count *c);

/* Collective over ep: ranks_per_node as in mt_a2a_init (0 = shared-memory nodes); split:
 * the combine, gather and dispatch backward complete at the model's wait() (computing
 * meanwhile), else in the call that begins them. The results are the same bits either way. */
int mt_ep_init(mt_ep *e, MPI_Comm ep, int ranks_per_node, mt_a2a_mode mode, int split);
void mt_ep_free(mt_ep *e);

#endif
