/* plan/sim.c — discrete-event replay of pipeline schedules (see sim.h).
 *
 * Message arrival times are fixed when the sender runs, so the result does not depend on
 * the order in which ranks are advanced: the loop sweeps the ranks, advancing each until
 * it blocks on a message not yet sent, until every list is done. */
#include "plan/sim.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* one fiber's walk through a pass: its next piece and when the rows of the exchange it
 * started last arrive (< 0: none in flight) */
typedef struct {
    const mt_sim_pass *p;
    int i;
    double due, copy;
} walk;

/* the fiber's turn from *now: it waits for its exchange in flight, then runs its next piece
 * up to the hand-over (or the tail). Waits add to *ex; returns 1 when the pass has ended. */
static int walk_turn(walk *w, double *now, double *link, double *ex) {
    if (w->due >= 0) {
        const double t = w->due > *now + w->copy ? w->due : *now + w->copy;
        *ex += t - *now;
        *now = t;
        w->due = -1;
    }
    if (w->i == w->p->n) {
        *now += w->p->tail + w->p->tail_in;
        *ex += w->p->tail_in;
        return 1;
    }
    const mt_sim_piece *q = &w->p->p[w->i++];
    *now += q->c0 + q->in;
    *ex += q->in;
    const double s = *link > *now ? *link : *now;
    *link = s + q->wire;
    w->due = *link + q->lat;
    w->copy = q->copy;
    *now += q->c1;
    return 0;
}

/* a forward and the backward after it as two fibers (b NULL: a pass alone), from *now on
 * the rank's link; returns the exposed exchange time */
static double run_passes(const mt_sim_pass *a, const mt_sim_pass *b, double *now, double *link) {
    walk wa = {a, 0, -1, 0}, wb = {b, 0, -1, 0};
    int da = 0, db = b == NULL;
    double ex = 0;
    while (!da || !db) {
        if (!da) da = walk_turn(&wa, now, link, &ex);
        if (!db) db = walk_turn(&wb, now, link, &ex);
    }
    return ex;
}

void mt_sim_run(const mt_schedule *s, const mt_sim_cost *c, mt_sim_result *out) {
    const int P = s->pp, V = s->vpp, M = s->m, S = P * V;
    const size_t nmsg = 2 * (size_t)S * M;
    double *arrive = mt_xmalloc(nmsg * sizeof(double));
    for (size_t i = 0; i < nmsg; i++) arrive[i] = -1;
    double *t = mt_xcalloc((size_t)P * 6, sizeof(double));
    double *comm = t + P, *busy = t + 2 * P, *cend = t + 3 * P;  /* comm stream; compute s; last compute end */
    double *xep = t + 4 * P, *link = t + 5 * P;                   /* exposed expert exchanges; link free at */
    int *pc = mt_xcalloc((size_t)P * (V + 1), sizeof(int));
    int *bwd_left = pc + P;                                       /* [P*V] backwards still to run */
    for (int i = 0; i < P * V; i++) bwd_left[i] = M;
    memset(out, 0, sizeof *out);
    int done = 0;
    while (done < P) {
        int progress = 0;
        done = 0;
        for (int r = 0; r < P; r++) {
            const mt_action *list = s->act[r];
            int i = pc[r];
            double now = t[r];
            for (; i < s->len[r]; i++) {
                const mt_action *a = &list[i];
                const int st = a->chunk * P + r;
                if (a->kind == MT_ACT_RECV_ACT || a->kind == MT_ACT_RECV_GRAD) {
                    double at = arrive[((size_t)(a->kind == MT_ACT_RECV_GRAD) * S + st) * M + a->mb];
                    if (at < 0) break;                 /* not sent yet: blocked */
                    if (at > now) now = at;
                } else if (a->kind == MT_ACT_FWD || a->kind == MT_ACT_BWD) {
                    double d = a->kind == MT_ACT_FWD ? c->fwd[st] : c->bwd[st], e = 0;
                    if (c->fwd_pass) {
                        const mt_sim_pass *pa = a->kind == MT_ACT_FWD ? &c->fwd_pass[st] : &c->bwd_pass[st], *pb = NULL;
                        if (a->with_next) { /* the pair: this forward and the backward after it */
                            MT_ASSERT(i + 1 < s->len[r] && list[i + 1].kind == MT_ACT_BWD);
                            a = &list[++i]; /* what follows is the backward's bookkeeping */
                            pb = &c->bwd_pass[a->chunk * P + r];
                        }
                        double end = now;
                        e = run_passes(pa, pb, &end, &link[r]);
                        d = end - now;
                    }
                    now += d;
                    busy[r] += d;
                    xep[r] += e;
                    cend[r] = now;
                    const int sa = a->chunk * P + r;
                    if (a->kind == MT_ACT_BWD && --bwd_left[sa] == 0 && c->grad_sync)
                        comm[r] = (comm[r] > now ? comm[r] : now) + c->grad_sync[sa];
                } else if (a->kind == MT_ACT_SEND_ACT) {
                    arrive[((size_t)0 * S + st + 1) * M + a->mb] = now + c->p2p;
                } else if (a->kind == MT_ACT_SEND_GRAD) {
                    arrive[((size_t)1 * S + st - 1) * M + a->mb] = now + c->p2p;
                } else { /* MT_ACT_OPT */
                    if (comm[r] > now) {
                        if (comm[r] - now > out->exposed_dp) out->exposed_dp = comm[r] - now;
                        now = comm[r];
                    }
                    now += c->opt ? c->opt[r] : 0;
                }
            }
            if (i != pc[r]) progress = 1;
            pc[r] = i;
            t[r] = now;
            if (i == s->len[r]) done++;
        }
        MT_ASSERT(progress || done == P); /* a schedule that deadlocks is a generator bug */
    }
    double idle = 0;
    for (int r = 0; r < P; r++) {
        if (t[r] > out->step) out->step = t[r];
        if (cend[r] > out->pipe) out->pipe = cend[r];
        if (busy[r] > out->busy_max) out->busy_max = busy[r];
        if (xep[r] > out->exposed_ep) out->exposed_ep = xep[r];
    }
    for (int r = 0; r < P; r++) idle += out->pipe - busy[r];
    out->bubble = out->pipe > 0 ? idle / (P * out->pipe) : 0;
    free(arrive);
    free(t);
    free(pc);
}
