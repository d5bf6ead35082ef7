/* parallel/schedule.h — pipeline schedules as data.
 *
 * A schedule is one list of actions per pipeline rank: forward(mb, chunk), backward(mb,
 * chunk), the point-to-point sends and receives around them, and the optimizer step. The
 * trainer's pipeline executor runs the list with non-blocking sends and blocking receives;
 * the planner's simulator (plan/sim.h) replays the very same list with modelled durations,
 * so a new schedule is written once and both agree on what it does.
 *
 * Numbering (Megatron-LM's): with P ranks and V chunks per rank the model is cut into P*V
 * virtual stages; chunk c of rank r is virtual stage s = c*P + r. Micro-batches are 0..M-1.
 * V = 1 is the 1F1B schedule (PipeDream-Flush); V > 1 is the interleaved schedule of
 * Narayanan et al. 2021 (Megatron-LM), which needs M % P == 0. */
#ifndef MT_DIST_SCHEDULE_H
#define MT_DIST_SCHEDULE_H

#include <stdint.h>

enum mt_act_kind {
    MT_ACT_FWD = 0,       /* forward of (mb, chunk) */
    MT_ACT_BWD,           /* backward of (mb, chunk) */
    MT_ACT_SEND_ACT,      /* send the output activation of (mb, chunk) to peer */
    MT_ACT_RECV_ACT,      /* receive the input activation of (mb, chunk) from peer */
    MT_ACT_SEND_GRAD,     /* send the input gradient of (mb, chunk) to peer */
    MT_ACT_RECV_GRAD,     /* receive the output gradient of (mb, chunk) from peer */
    MT_ACT_OPT            /* gradient reduction over DP + optimizer step (once, at the end) */
};

typedef struct {
    uint8_t kind;   /* enum mt_act_kind */
    uint8_t chunk;  /* local chunk index on this rank, 0..V-1 */
    int16_t peer;   /* the other rank of a send/recv, -1 otherwise */
    int32_t mb;     /* micro-batch, -1 for MT_ACT_OPT */
    uint8_t with_next; /* a forward run together with the backward that follows it (overlap) */
} mt_action;

typedef struct {
    int pp, vpp, m;     /* ranks P, chunks per rank V, micro-batches M */
    int *len;           /* [P] actions per rank */
    mt_action **act;    /* [P][len[r]] */
} mt_schedule;

/* Builds the schedule for P ranks, V chunks per rank and M micro-batches: 1F1B for V = 1,
 * interleaved for V > 1. Errors (-1, mt_error) when P, V, M < 1, V > 255, or V > 1 and
 * M % P != 0. */
int mt_schedule_make(mt_schedule *s, int pp, int vpp, int m);
void mt_schedule_free(mt_schedule *s);
/* The overlapped schedule (train --overlap pipe) of a mt_schedule_make list: a forward run
 * together with the oldest backward not yet run (a forward flagged with_next, the backward
 * right after it), so one's expert exchanges travel while the other computes. A rank runs
 * one forward more ahead than in mt_schedule_make (an activation slot more); a pair's
 * receives come before it, its sends after it. One stage: F0, F1+B0, F2+B1, ..., B(M-1).
 * Every consumer that ignores the flag sees a valid schedule. */
int mt_schedule_overlap(mt_schedule *s);

/* Virtual stage of chunk c on rank r. */
static inline int mt_schedule_stage(const mt_schedule *s, int r, int c) { return c * s->pp + r; }

/* Checks the invariants an executor relies on: every (mb, chunk) of a rank is run forward
 * exactly once and backward exactly once, forward first; the receive of an activation or
 * gradient precedes the compute that needs it; every send has exactly one matching receive
 * (same kind, micro-batch and stage) on the peer; one optimizer step, last. 0 or -1 with a
 * message naming the rank and action. */
int mt_schedule_check(const mt_schedule *s);

/* Micro-batches whose activations are held at once on rank r (peak over the list of
 * forwards not yet matched by their backward), in units of one chunk's activations. Gives
 * the activation memory of a schedule without running it. */
int mt_schedule_peak_inflight(const mt_schedule *s, int r);
/* The same per chunk: slots[c] = the peak of chunk c's forwards on rank r not yet matched
 * by their backward (at least 1), i.e. the activation arenas the chunk needs; returns the
 * largest. The pipeline executor allocates this many, the planner counts them. */
int mt_schedule_slots(const mt_schedule *s, int r, int *slots);

#endif
