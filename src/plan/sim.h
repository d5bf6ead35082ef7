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

typedef struct {
    const double *fwd, *bwd;   /* [P*V] seconds per micro-batch, by virtual stage */
    double p2p;                /* seconds per activation or gradient message */
    const double *grad_sync;   /* [P*V] seconds of a stage's DP gradient reduction, or NULL */
    const double *opt;         /* [P] seconds of the optimizer step (and what follows), or NULL */
    /* [P*V] the expert exchanges' part of fwd / bwd, or NULL. A forward flagged with_next
     * (the overlapped schedule) and the backward after it run together: each one's
     * exchanges travel while the other computes, and both share the rank's link, so the pair
     * takes max(compute of both, exchanges of both) */
    const double *fwd_a2a, *bwd_a2a;
} mt_sim_cost;

typedef struct {
    double step;        /* until the last rank finishes its optimizer step */
    double pipe;        /* until the last compute action of any rank */
    double bubble;      /* mean over ranks of idle time / pipe, during the pipeline */
    double busy_max;    /* compute seconds of the busiest rank */
    double exposed_dp;  /* max over ranks of the wait for gradient reduction before the optimizer */
    double exposed_ep;  /* max over ranks of the expert-exchange time not hidden: unpaired
                         * actions' and what pairs leave (0 without fwd_a2a) */
} mt_sim_result;

/* Replays s with the costs c. Aborts (MT_ASSERT) on a schedule that deadlocks. */
void mt_sim_run(const mt_schedule *s, const mt_sim_cost *c, mt_sim_result *out);

#endif
