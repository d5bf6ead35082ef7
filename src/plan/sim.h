/* plan/sim.h — discrete-event replay of a pipeline schedule (parallel/schedule.h) with
 * modelled durations.
 *
 * Each rank runs its action list in order on one compute stream: a compute action takes
 * its modelled time, a send is non-blocking (the message arrives p2p seconds after the
 * sender finishes the compute that produced it), a receive waits for its message. After
 * the last backward of a chunk, the chunk's data-parallel gradient reduction starts on the
 * rank's communication stream (overlapping the remaining backwards); the optimizer step
 * waits for all of them. A forward paired with the next backward (train --overlap pipe)
 * runs together with it (mt_sim_cost). */
#ifndef MT_PLAN_SIM_H
#define MT_PLAN_SIM_H

#include "parallel/schedule.h"

/* One piece of a pass under the overlapped schedule (train --overlap pipe): `c0` seconds of
 * compute and `in` seconds of small exchanges waited for in place, then an expert exchange
 * starts (its `wire` seconds queue on the rank's one link, its rows arrive `lat` after they
 * leave it) and `c1` more seconds of the fiber's own compute run (the shared experts) before
 * it hands the thread to the other fiber. When the fiber runs again it waits for the rows and
 * for `copy` seconds of MPI copying them (which the wait itself does: it is never hidden). */
typedef struct { double c0, in, wire, lat, copy, c1; } mt_sim_piece;
typedef struct {
    const mt_sim_piece *p;
    int n;
    double tail, tail_in; /* after the last piece: compute, and small exchanges in place */
} mt_sim_pass;

typedef struct {
    const double *fwd, *bwd;   /* [P*V] seconds per micro-batch, by virtual stage */
    double p2p;                /* seconds per activation or gradient message */
    const double *grad_sync;   /* [P*V] seconds of a stage's DP gradient reduction, or NULL */
    const double *opt;         /* [P] seconds of the optimizer step (and what follows), or NULL */
    /* [P*V] each forward's and backward's pieces, or NULL (then fwd / bwd). A forward
     * flagged with_next (the overlapped schedule) and the backward after it run as two
     * fibers, as the trainer runs them: a fiber runs one piece, hands over, and on its next
     * turn waits for that piece's exchange; both fibers' exchanges queue on the rank's link.
     * A forward or backward alone runs its pieces in turn, each exchange hidden only by the
     * piece's own c1 */
    const mt_sim_pass *fwd_pass, *bwd_pass;
} mt_sim_cost;

typedef struct {
    double step;        /* until the last rank finishes its optimizer step */
    double pipe;        /* until the last compute action of any rank */
    double bubble;      /* mean over ranks of idle time / pipe, during the pipeline */
    double busy_max;    /* compute seconds of the busiest rank */
    double exposed_dp;  /* max over ranks of the wait for gradient reduction before the optimizer */
    double exposed_ep;  /* max over ranks of the expert-exchange time not hidden: the waits
                         * of the passes' fibers (0 without fwd_pass) */
} mt_sim_result;

/* Replays s with the costs c. Aborts (MT_ASSERT) on a schedule that deadlocks. */
void mt_sim_run(const mt_schedule *s, const mt_sim_cost *c, mt_sim_result *out);

#endif
