/* train/pipeline.c — the pipeline executor (see pipeline.h). */
#include "train/pipeline.h"

#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/fiber.h"
#include "base/trace.h"

int mt_pipe_init(mt_pipe *p, const mt_config *c, int pp, int vpp, int m, int rank, const int *bounds, int B,
                 int T, int nthr, int policy, int tp, int sp, int bf16, int overlap) {
    memset(p, 0, sizeof *p);
    if (vpp > 256) return mt_error("--vpp %d: at most 256 chunks per rank", vpp);
    if (mt_schedule_make(&p->sched, pp, vpp, m) != 0) return -1;
    if (overlap && mt_schedule_overlap(&p->sched) != 0) {
        mt_schedule_free(&p->sched);
        return -1;
    }
    p->P = pp, p->V = vpp, p->M = m, p->rank = rank, p->S = pp * vpp;
    const long tag_ub = mt_dist_tag_ub();
    if ((long)m * p->S * 2 + 2 > tag_ub) {
        mt_schedule_free(&p->sched);
        return mt_error("pipeline: %d micro-batches x %d virtual stages exceed the MPI tag space (%ld)", m, p->S,
                        tag_ub);
    }
    p->maxslot = mt_schedule_slots(&p->sched, rank, p->nslot);
    for (int ch = 0; ch < vpp; ch++) p->last_bwd[ch] = -1;
    for (int i = 0; i < p->sched.len[rank]; i++)
        if (p->sched.act[rank][i].kind == MT_ACT_BWD) p->last_bwd[p->sched.act[rank][i].chunk] = i;
    p->slot = mt_xcalloc((size_t)vpp * p->maxslot, sizeof *p->slot);
    p->slot_mb = mt_xmalloc(sizeof(int) * (size_t)vpp * p->maxslot);
    p->req = mt_xmalloc(sizeof(mt_request) * (size_t)vpp * p->maxslot * 2);
    for (int ch = 0; ch < vpp; ch++) {
        int s = ch * pp + rank;
        p->lo[ch] = bounds[s];
        p->hi[ch] = bounds[s + 1];
        for (int k = 0; k < p->maxslot; k++) {
            size_t i = (size_t)ch * p->maxslot + k;
            p->slot_mb[i] = -1;
            p->req[2 * i] = p->req[2 * i + 1] = MT_REQUEST_NULL;
            if (k >= p->nslot[ch]) continue;
            p->slot[i] = mt_acts_new_chunk(c, p->lo[ch], p->hi[ch], s == 0, s == p->S - 1, B, T, nthr, policy, tp,
                                           sp, bf16);
            p->acts_bytes += mt_acts_arena_bytes(p->slot[i]);
        }
    }
    return 0;
}

void mt_pipe_free(mt_pipe *p) {
    if (p->slot)
        for (int i = 0; i < p->V * p->maxslot; i++) mt_acts_free(p->slot[i]);
    free(p->slot);
    free(p->slot_mb);
    free(p->req);
    mt_schedule_free(&p->sched);
    memset(p, 0, sizeof *p);
}

static void wait_slot(mt_pipe *p, size_t i) {
    if (p->req[2 * i] == MT_REQUEST_NULL && p->req[2 * i + 1] == MT_REQUEST_NULL) return;
    mt_trace_begin("comm.pipeline");
    mt_request_waitall(&p->req[2 * i], 2, p->grp);
    mt_trace_end();
}

void mt_pipe_park(mt_pipe *p) {
    for (int i = 0; i < p->V * p->maxslot; i++) {
        if (!p->slot[i]) continue;
        wait_slot(p, (size_t)i); /* a send still reading the slot must finish first */
        mt_acts_park(p->slot[i]);
    }
}

/* the slot of (chunk, mb): the one it holds, or a free one (its pending sends completed) */
static size_t slot_of(mt_pipe *p, int ch, int mb) {
    size_t base = (size_t)ch * p->maxslot, fr = (size_t)-1;
    for (int k = 0; k < p->nslot[ch]; k++) {
        if (p->slot_mb[base + k] == mb) return base + k;
        if (p->slot_mb[base + k] < 0 && fr == (size_t)-1) fr = base + k;
    }
    MT_ASSERT(fr != (size_t)-1); /* the schedule never holds more than nslot */
    wait_slot(p, fr);
    p->slot_mb[fr] = mb;
    return fr;
}

static int tag_of(const mt_pipe *p, int mb, int sender_stage, int grad) {
    return ((mb * p->S) + sender_stage) * 2 + grad;
}

static void recv_rows(float *buf, size_t n, int peer, int tag, mt_group *g) {
    mt_trace_begin("comm.pipeline");
    mt_group_recv_f32(g, buf, n, peer, tag);
    mt_trace_end();
}

/* one fiber's work: a forward or a backward of one micro-batch */
typedef struct {
    mt_model *m;
    mt_acts *x;
    const int32_t *in, *tg, *ps;
    int B, T;
    mt_loss lm;
    float bal_scale;
    mt_step_stats *st;
} pass_args;

static void fwd_pass(void *v) {
    pass_args *a = v;
    mt_model_forward(a->m, a->x, a->in, a->tg, a->ps, a->B, a->T, 1, &a->lm, NULL, a->st);
}

static void bwd_pass(void *v) {
    pass_args *a = v;
    mt_model_backward(a->m, a->x, a->in, a->ps, a->B, a->T, a->bal_scale);
}

/* the gradient hook on the model for action i when it is its chunk's last backward */
static void grad_hook(const mt_pipe *p, mt_model *m, int i) {
    const int last = p->grad_ready && p->last_bwd[p->sched.act[p->rank][i].chunk] == i;
    m->grad_ready = last ? p->grad_ready : NULL;
}

void mt_pipe_train(mt_pipe *p, mt_model *m, mt_group *pp, const int32_t *inputs, const int32_t *targets,
                   const int32_t *pos, int B, int T, const mt_loss *loss, float bal_scale, mt_step_stats *st) {
    const size_t BT = (size_t)B * T;
    const size_t NC = (size_t)mt_acts_rows(p->slot[0], (int)BT) * (size_t)m->cfg.hidden_size;
    MT_ASSERT(NC <= (size_t)INT32_MAX);
    p->grp = pp;
    const mt_action *act = p->sched.act[p->rank];
    for (int i = 0; i < p->sched.len[p->rank]; i++) {
        const mt_action *a = &act[i];
        if (a->kind == MT_ACT_OPT) break;
        const int ch = a->chunk, mb = a->mb, s = ch * p->P + p->rank;
        size_t k = slot_of(p, ch, mb);
        mt_acts *x = p->slot[k];
        const int32_t *in = inputs + (size_t)mb * BT, *tg = targets + (size_t)mb * BT;
        const int32_t *ps = pos ? pos + (size_t)mb * BT : NULL;
        switch (a->kind) {
        case MT_ACT_RECV_ACT: recv_rows(mt_acts_input(x), NC, a->peer, tag_of(p, mb, s - 1, 0), pp); break;
        case MT_ACT_RECV_GRAD: recv_rows(mt_acts_grad(x), NC, a->peer, tag_of(p, mb, s + 1, 1), pp); break;
        case MT_ACT_SEND_ACT:
            mt_group_isend_f32(pp, mt_acts_output(x), NC, a->peer, tag_of(p, mb, s, 0), &p->req[2 * k]);
            break;
        case MT_ACT_SEND_GRAD:
            mt_group_isend_f32(pp, mt_acts_grad(x), NC, a->peer, tag_of(p, mb, s, 1), &p->req[2 * k + 1]);
            break;
        case MT_ACT_FWD: {
            mt_head_obj obj;
            const mt_loss lm = mt_loss_micro(loss, mb, B, T, &obj);
            if (!a->with_next) {
                mt_model_forward(m, x, in, tg, ps, B, T, 1, &lm, NULL, st);
                break;
            }
            /* the forward and the next action, a backward of this stage, as two fibers */
            const mt_action *nb = &act[++i];
            MT_ASSERT(nb->kind == MT_ACT_BWD);
            grad_hook(p, m, i);
            size_t kb = slot_of(p, nb->chunk, nb->mb);
            const size_t ob = (size_t)nb->mb * BT;
            pass_args fa = {m, x, in, tg, ps, B, T, lm, 0, st};
            pass_args ba = {.m = m, .x = p->slot[kb], .in = inputs + ob, .ps = pos ? pos + ob : NULL, .B = B, .T = T,
                            .bal_scale = bal_scale};
            mt_trace_begin("overlap.pair");
            mt_fiber_pair(fwd_pass, &fa, bwd_pass, &ba);
            mt_trace_end();
            m->grad_ready = NULL;
            if (nb->chunk * p->P + p->rank == 0) p->slot_mb[kb] = -1; /* stage 0: free after its backward */
            break;
        }
        case MT_ACT_BWD:
            grad_hook(p, m, i);
            mt_model_backward(m, x, in, ps, B, T, bal_scale);
            m->grad_ready = NULL;
            break;
        default: MT_ASSERT(0);
        }
        /* a slot is free after its backward (and after the send of its input gradient,
         * which follows the backward in the list; wait_slot completes it before reuse) */
        if (a->kind == MT_ACT_SEND_GRAD || (a->kind == MT_ACT_BWD && s == 0)) p->slot_mb[k] = -1;
    }
    for (int i = 0; i < p->V * p->maxslot; i++) wait_slot(p, (size_t)i);
}

void mt_pipe_eval(mt_pipe *p, mt_model *m, mt_group *pp, const int32_t *inputs, const int32_t *targets,
                  const int32_t *pos, int nb, int T, const mt_loss *loss, mt_step_stats *st) {
    const size_t NC = (size_t)mt_acts_rows(p->slot[0], nb * T) * (size_t)m->cfg.hidden_size;
    p->grp = pp;
    for (int ch = 0; ch < p->V; ch++) {
        const int s = ch * p->P + p->rank;
        const size_t k = (size_t)ch * p->maxslot;
        mt_acts *x = p->slot[k];
        wait_slot(p, k);
        if (s > 0) recv_rows(mt_acts_input(x), NC, (p->rank + p->P - 1) % p->P, tag_of(p, 0, s - 1, 0), pp);
        mt_model_forward(m, x, inputs, targets, pos, nb, T, 0, loss, NULL, st);
        if (s < p->S - 1)
            mt_group_isend_f32(pp, mt_acts_output(x), NC, (p->rank + 1) % p->P, tag_of(p, 0, s, 0), &p->req[2 * k]);
    }
    for (int ch = 0; ch < p->V; ch++) wait_slot(p, (size_t)ch * p->maxslot);
}

void mt_pipe_load(const mt_pipe *p, const mt_config *c, int64_t *out) {
    const size_t n = (size_t)mt_config_layers(c) * c->n_routed_experts;
    for (int i = 0; i < p->V * p->maxslot; i++) {
        if (!p->slot[i]) continue;
        const int64_t *ld = mt_acts_load(p->slot[i]);
        for (size_t j = 0; j < n; j++) out[j] += ld[j];
    }
}

void mt_pipe_reset_load(mt_pipe *p) {
    for (int i = 0; i < p->V * p->maxslot; i++)
        if (p->slot[i]) mt_acts_reset_load(p->slot[i]);
}
