/* parallel/schedule.c — 1F1B and interleaved pipeline schedules as per-rank action lists
 * (see schedule.h). The compute order follows Megatron-LM's
 * forward_backward_pipelining_with_interleaving: a warm-up of forwards, a steady state of
 * one forward then one backward, and a cool-down of backwards. */
#include "parallel/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* The k-th forward (or backward) of a rank: which chunk and micro-batch. Micro-batches go
 * through the rank's chunks in groups of P, so the P ranks stay busy on one chunk while the
 * first micro-batches reach the next one. Backwards take the chunks in reverse order. */
static void kth(int k, int pp, int vpp, int backward, int *chunk, int *mb) {
    int group = k / (pp * vpp), in = k % (pp * vpp);
    *chunk = in / pp;
    if (backward) *chunk = vpp - 1 - *chunk;
    *mb = group * pp + in % pp;
}

static void push(mt_action *list, int *n, int kind, int chunk, int peer, int mb) {
    mt_action *a = &list[(*n)++];
    a->kind = (uint8_t)kind;
    a->chunk = (uint8_t)chunk;
    a->peer = (int16_t)peer;
    a->mb = mb;
    a->with_next = 0;
}

/* A compute action with the receive before it and the send after it. The first virtual
 * stage has no input to receive and the last no output to send (and the reverse for
 * gradients). */
static void emit(mt_action *list, int *n, int r, int pp, int vpp, int chunk, int mb, int backward) {
    const int S = pp * vpp, s = chunk * pp + r;
    const int next = (r + 1) % pp, prev = (r + pp - 1) % pp;
    if (!backward) {
        if (s > 0) push(list, n, MT_ACT_RECV_ACT, chunk, prev, mb);
        push(list, n, MT_ACT_FWD, chunk, -1, mb);
        if (s < S - 1) push(list, n, MT_ACT_SEND_ACT, chunk, next, mb);
    } else {
        if (s < S - 1) push(list, n, MT_ACT_RECV_GRAD, chunk, next, mb);
        push(list, n, MT_ACT_BWD, chunk, -1, mb);
        if (s > 0) push(list, n, MT_ACT_SEND_GRAD, chunk, prev, mb);
    }
}

int mt_schedule_make(mt_schedule *s, int pp, int vpp, int m) {
    memset(s, 0, sizeof *s);
    if (pp < 1 || vpp < 1 || m < 1 || vpp > 255 || pp > 32767)
        return mt_error("schedule: need 1 <= pp <= 32767, 1 <= vpp <= 255, micro-batches >= 1 "
                        "(got pp %d, vpp %d, m %d)", pp, vpp, m);
    if (vpp > 1 && m % pp != 0)
        return mt_error("schedule: the interleaved schedule needs micro-batches (%d) to be a "
                        "multiple of pp (%d)", m, pp);
    s->pp = pp;
    s->vpp = vpp;
    s->m = m;
    s->len = mt_xcalloc((size_t)pp, sizeof *s->len);
    s->act = mt_xcalloc((size_t)pp, sizeof *s->act);
    const int total = m * vpp; /* forwards (and backwards) per rank */
    for (int r = 0; r < pp; r++) {
        s->act[r] = mt_xmalloc(((size_t)total * 6 + 1) * sizeof(mt_action));
        /* Warm-up: enough forwards that the last stage can start its first backward as
         * soon as possible. 1F1B: rank r runs P-r-1 forwards ahead; interleaved: two per
         * rank still downstream plus a full round of P over the other V-1 chunks. */
        int warm = vpp == 1 ? pp - r - 1 : (pp - r - 1) * 2 + (vpp - 1) * pp;
        if (warm > total) warm = total;
        int n = 0, f = 0, b = 0, c, mb;
        for (int i = 0; i < warm; i++, f++) {
            kth(f, pp, vpp, 0, &c, &mb);
            emit(s->act[r], &n, r, pp, vpp, c, mb, 0);
        }
        for (int i = 0; i < total - warm; i++, f++, b++) {
            kth(f, pp, vpp, 0, &c, &mb);
            emit(s->act[r], &n, r, pp, vpp, c, mb, 0);
            kth(b, pp, vpp, 1, &c, &mb);
            emit(s->act[r], &n, r, pp, vpp, c, mb, 1);
        }
        for (; b < total; b++) {
            kth(b, pp, vpp, 1, &c, &mb);
            emit(s->act[r], &n, r, pp, vpp, c, mb, 1);
        }
        push(s->act[r], &n, MT_ACT_OPT, 0, -1, -1);
        s->len[r] = n;
    }
    return 0;
}

/* The overlapped schedule: rank r runs one forward more ahead than mt_schedule_make (1F1B:
 * P - r; interleaved: 2 (P - r - 1) + (V - 1) P + 1), then pairs each forward with the oldest
 * backward not yet run, in the same compute order, then the remaining backwards. A pair's
 * receives come first and its sends after both passes: its forward's input was sent by the
 * previous rank's pair before (that rank runs one forward more ahead), and its backward's
 * gradient by the next rank's pair of the same backward, which needs nothing from this
 * pair, so no receive waits on a send that waits on it. One stage: F0, F1+B0, ..., B(M-1). */
int mt_schedule_overlap(mt_schedule *s) {
    const int P = s->pp, V = s->vpp, M = s->m, S = P * V, total = M * V;
    for (int r = 0; r < P; r++) {
        mt_action *l = s->act[r];
        int warm = (V == 1 ? P - r - 1 : (P - r - 1) * 2 + (V - 1) * P) + 1;
        if (warm > total) warm = total;
        int n = 0, f = 0, b = 0, fc, fm, bc, bm;
        for (; f < warm; f++) {
            kth(f, P, V, 0, &fc, &fm);
            emit(l, &n, r, P, V, fc, fm, 0);
        }
        for (; f < total; f++, b++) {
            kth(f, P, V, 0, &fc, &fm);
            kth(b, P, V, 1, &bc, &bm);
            const int sf = fc * P + r, sb = bc * P + r;
            if (sf > 0) push(l, &n, MT_ACT_RECV_ACT, fc, (r + P - 1) % P, fm);
            if (sb < S - 1) push(l, &n, MT_ACT_RECV_GRAD, bc, (r + 1) % P, bm);
            push(l, &n, MT_ACT_FWD, fc, -1, fm);
            l[n - 1].with_next = 1;
            push(l, &n, MT_ACT_BWD, bc, -1, bm);
            if (sf < S - 1) push(l, &n, MT_ACT_SEND_ACT, fc, (r + 1) % P, fm);
            if (sb > 0) push(l, &n, MT_ACT_SEND_GRAD, bc, (r + P - 1) % P, bm);
        }
        for (; b < total; b++) {
            kth(b, P, V, 1, &bc, &bm);
            emit(l, &n, r, P, V, bc, bm, 1);
        }
        push(l, &n, MT_ACT_OPT, 0, -1, -1);
        MT_ASSERT(n == s->len[r]);
    }
    return mt_schedule_check(s);
}

void mt_schedule_free(mt_schedule *s) {
    if (!s->act) return;
    for (int r = 0; r < s->pp; r++) free(s->act[r]);
    free(s->act);
    free(s->len);
    memset(s, 0, sizeof *s);
}

/* Message key: (kind, virtual stage of the receiver, micro-batch). */
static size_t msg_key(const mt_schedule *s, int grad, int stage, int mb) {
    return ((size_t)grad * (size_t)(s->pp * s->vpp) + (size_t)stage) * (size_t)s->m + (size_t)mb;
}

int mt_schedule_check(const mt_schedule *s) {
    const int P = s->pp, V = s->vpp, M = s->m, S = P * V;
    const size_t nstate = (size_t)V * M, nmsg = 2 * (size_t)S * M;
    /* per (chunk, mb) of a rank: bit 1 = forward done, 2 = backward done, 4 = input
     * received, 8 = output gradient received */
    unsigned char *st = mt_xcalloc(nstate, 1);
    int *sent = mt_xcalloc(nmsg, sizeof(int)), *recv = mt_xcalloc(nmsg, sizeof(int));
    int rc = 0;
    for (int r = 0; r < P && rc == 0; r++) {
        memset(st, 0, nstate);
        int opt = 0;
        for (int i = 0; i < s->len[r] && rc == 0; i++) {
            const mt_action *a = &s->act[r][i];
            if (opt) { rc = mt_error("schedule: rank %d: action %d after the optimizer step", r, i); break; }
            if (a->kind == MT_ACT_OPT) { opt = 1; continue; }
            if (a->chunk >= V || a->mb < 0 || a->mb >= M) {
                rc = mt_error("schedule: rank %d: action %d: chunk %d / micro-batch %d out of range", r, i, a->chunk, a->mb);
                break;
            }
            unsigned char *x = &st[(size_t)a->chunk * M + a->mb];
            const int stage = a->chunk * P + r;
            switch (a->kind) {
            case MT_ACT_FWD:
                if ((*x & 1) || (stage > 0 && !(*x & 4)))
                    rc = mt_error("schedule: rank %d: forward(mb %d, chunk %d) repeated or before its input", r, a->mb, a->chunk);
                *x |= 1;
                break;
            case MT_ACT_BWD:
                if (!(*x & 1) || (*x & 2) || (stage < S - 1 && !(*x & 8)))
                    rc = mt_error("schedule: rank %d: backward(mb %d, chunk %d) before its forward or its gradient, or repeated", r, a->mb, a->chunk);
                *x |= 2;
                break;
            case MT_ACT_RECV_ACT: *x |= 4; recv[msg_key(s, 0, stage, a->mb)]++; break;
            case MT_ACT_RECV_GRAD: *x |= 8; recv[msg_key(s, 1, stage, a->mb)]++; break;
            case MT_ACT_SEND_ACT:
                if (!(*x & 1)) rc = mt_error("schedule: rank %d: send before forward(mb %d, chunk %d)", r, a->mb, a->chunk);
                /* the receiver is the next virtual stage */
                if (a->peer != (r + 1) % P) rc = mt_error("schedule: rank %d: activation sent to rank %d", r, a->peer);
                sent[msg_key(s, 0, stage + 1, a->mb)]++;
                break;
            case MT_ACT_SEND_GRAD:
                if (!(*x & 2)) rc = mt_error("schedule: rank %d: send before backward(mb %d, chunk %d)", r, a->mb, a->chunk);
                if (a->peer != (r + P - 1) % P) rc = mt_error("schedule: rank %d: gradient sent to rank %d", r, a->peer);
                sent[msg_key(s, 1, stage - 1, a->mb)]++;
                break;
            default: rc = mt_error("schedule: rank %d: unknown action kind %d", r, a->kind);
            }
        }
        for (size_t k = 0; k < nstate && rc == 0; k++)
            if ((st[k] & 3) != 3)
                rc = mt_error("schedule: rank %d: (chunk %zu, mb %zu) not run forward and backward", r, k / M, k % M);
        if (rc == 0 && !opt) rc = mt_error("schedule: rank %d: no optimizer step", r);
    }
    for (size_t k = 0; k < nmsg && rc == 0; k++)
        if (sent[k] != recv[k] || sent[k] > 1)
            rc = mt_error("schedule: message %zu sent %d times, received %d times", k, sent[k], recv[k]);
    free(st);
    free(sent);
    free(recv);
    return rc;
}

int mt_schedule_peak_inflight(const mt_schedule *s, int r) {
    int cur = 0, peak = 0;
    for (int i = 0; i < s->len[r]; i++) {
        if (s->act[r][i].kind == MT_ACT_FWD && ++cur > peak) peak = cur;
        if (s->act[r][i].kind == MT_ACT_BWD) cur--;
    }
    return peak;
}

int mt_schedule_slots(const mt_schedule *s, int r, int *slots) {
    int *cur = mt_xcalloc((size_t)s->vpp, sizeof *cur), most = 1;
    for (int c = 0; c < s->vpp; c++) slots[c] = 1;
    for (int i = 0; i < s->len[r]; i++) {
        const mt_action *a = &s->act[r][i];
        if (a->kind == MT_ACT_FWD && ++cur[a->chunk] > slots[a->chunk]) slots[a->chunk] = cur[a->chunk];
        if (a->kind == MT_ACT_BWD) cur[a->chunk]--;
    }
    for (int c = 0; c < s->vpp; c++)
        if (slots[c] > most) most = slots[c];
    free(cur);
    return most;
}
