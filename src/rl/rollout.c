/* rl/rollout.c — the rollout engine (see rollout.h). */
#include "rl/rollout.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "model/decode.h"

void mt_rollout_defaults(mt_rollout_opts *o) {
    memset(o, 0, sizeof *o);
    o->temperature = 1.0;
    o->top_p = 1.0;
    o->max_new = 64;
    o->eot = 256;
    o->seed = 1;
    o->slots = 64;
}

void mt_completion_free(mt_completion *c) {
    free(c->tokens);
    free(c->logp);
    free(c->routing);
    memset(c, 0, sizeof *c);
}

typedef struct { float l; int32_t id; } cand;

/* most probable first: the higher logit, ties to the lower id */
static int cand_cmp(const void *x, const void *y) {
    const cand *a = x, *b = y;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int mt_sample_token(const float *l, int V, double tau, int top_k, double top_p, double u, double *logp,
                    float *scratch) {
    const double t = tau > 0 ? tau : 1.0;
    int best = 0;
    for (int j = 1; j < V; j++) best = l[j] > l[best] ? j : best; /* the lowest id on ties */
    const float mx = l[best];
    if (!logp && tau <= 0) return best;
    /* every tempered weight once: the normaliser, the inverse CDF and the kept mass read them */
    float *e = scratch;
    const double sum = mt_tempered_sum(l, V, t, mx, e); /* the normaliser in double: logp keeps its precision */
    int tok = best;
    if (tau > 0) {
        const int k = top_k > 0 && top_k < V ? top_k : V;
        if (k == V && top_p >= 1.0) { /* untruncated: the inverse CDF in id order */
            const double target = u * sum;
            double acc = 0;
            tok = -1;
            for (int j = 0; j < V && tok < 0; j++)
                if (target < (acc += e[j])) tok = j;
            if (tok < 0) tok = best; /* u * sum rounded past the total */
        } else {
            cand *cd = (cand *)(scratch + V);
            for (int j = 0; j < V; j++) cd[j] = (cand){l[j], j};
            if (k < 64) { /* partial selection of the k best */
                for (int i = 0; i < k; i++) {
                    int b = i;
                    for (int j = i + 1; j < V; j++) if (cand_cmp(&cd[j], &cd[b]) < 0) b = j;
                    cand x = cd[i];
                    cd[i] = cd[b];
                    cd[b] = x;
                }
            } else {
                qsort(cd, (size_t)V, sizeof *cd, cand_cmp);
            }
            double mass_k = 0;
            for (int i = 0; i < k; i++) mass_k += e[cd[i].id];
            /* top-p over the renormalised top-k distribution */
            int kept = k;
            double mass = mass_k;
            if (top_p < 1.0) {
                double acc = 0;
                for (int i = 0; i < k; i++)
                    if ((acc += e[cd[i].id]) >= top_p * mass_k) { kept = i + 1, mass = acc; break; }
            }
            const double target = u * mass;
            double acc = 0;
            tok = cd[kept - 1].id;
            for (int i = 0; i < kept; i++)
                if (target < (acc += e[cd[i].id])) { tok = cd[i].id; break; }
        }
    }
    if (logp) *logp = mt_tempered_logp(l, t, mx, tok, sum);
    return tok;
}

int mt_rollout(mt_model *m, const mt_rollout_opts *o, const mt_rollout_req *req, int n, mt_completion *out,
               mt_rollout_stats *st) {
    const mt_config *c = &m->cfg;
    const int V = c->vocab_size, maxpos = c->max_position_embeddings;
    const mt_ep_ops *ep = m->ep; /* experts split over a group: every rank makes the same forwards */
    memset(st, 0, sizeof *st);
    if (n <= 0 && !ep) return 0;
    int bad = 0;
    if (o->max_new < 1 || o->slots < 1 || !(o->temperature >= 0) || !(o->top_p > 0 && o->top_p <= 1) ||
        o->top_k < 0)
        bad = mt_error("rollout: need max_new >= 1, slots >= 1, temperature >= 0, 0 < top_p <= 1, top_k >= 0");
    if (!bad && ep && m->tp)
        bad = mt_error("rollout: a rollout layout with both EP and TP is not supported");
    int tmax = 1, maxlen = 0;
    for (int i = 0; i < n && !bad; i++) {
        if (req[i].len < 1) {
            bad = mt_error("rollout: request %d has an empty prompt", i);
            break;
        }
        if ((int64_t)req[i].len + o->max_new > maxpos) {
            bad = mt_error("rollout: request %d: a prompt of %d tokens + max_new %d exceeds max_position_embeddings %d",
                           i, req[i].len, o->max_new, maxpos);
            break;
        }
        for (int j = 0; j < req[i].len && !bad; j++)
            if (req[i].prompt[j] < 0 || req[i].prompt[j] >= V)
                bad = mt_error("rollout: request %d: token %d is not in the vocabulary (%d)", i, req[i].prompt[j], V);
        if (req[i].len + o->max_new > tmax) tmax = req[i].len + o->max_new;
        if (req[i].len > maxlen) maxlen = req[i].len;
    }
    if (ep) { /* one rank's refusal is every rank's: the others would wait in its exchanges */
        double b = bad ? 1 : 0;
        ep->sum_f64(ep->ctx, &b, 1);
        if (b > 0 && !bad) bad = mt_error("rollout: another rank of the expert-parallel group refused its requests");
    }
    if (bad) return -1;
    const int S = o->slots < n ? o->slots : n > 0 ? n : 1, spec = o->speculative != 0;
    const int budget = o->prefill_tokens > 0 ? o->prefill_tokens : 4 * S;
    const int R = S * (1 + spec); /* rows sampled per forward: a running slot's token and its draft */
    const int cap = R + (budget > maxlen ? budget : maxlen);
    mt_decoder *d = spec ? mt_decoder_new_draft(m, S, tmax, cap, mt_get_threads(), o->bf16)
                         : mt_decoder_new(m, S, tmax, cap, mt_get_threads(), o->bf16);
    if (!d) return -1;
    int nmoe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) nmoe += mt_config_is_moe(c, l);
    const int K = c->num_experts_per_tok, rw = nmoe * K; /* routing ints per position */
    const double t0 = mt_now();
    int32_t *tok = mt_xmalloc(sizeof(int32_t) * (size_t)cap), *slot = mt_xmalloc(sizeof(int32_t) * (size_t)cap);
    int32_t *pos = mt_xmalloc(sizeof(int32_t) * (size_t)cap), *rows = mt_xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *next = mt_xmalloc(sizeof(int32_t) * (size_t)cap); /* speculative: the token after each fed one */
    int *row_slot = mt_xmalloc(sizeof(int) * (size_t)R), *row_draft = mt_xcalloc((size_t)R, sizeof(int));
    int *sreq = mt_xmalloc(sizeof(int) * (size_t)S), *sfed = mt_xcalloc((size_t)S, sizeof(int));
    int32_t *spend = mt_xmalloc(sizeof(int32_t) * (size_t)S); /* a running slot's token to feed next */
    int32_t *sdraft = mt_xmalloc(sizeof(int32_t) * (size_t)S); /* and its draft of the one after (-1: none) */
    int32_t *slast = mt_xmalloc(sizeof(int32_t) * (size_t)S); /* the fed token whose next is the last sampled */
    const int nthr = mt_get_threads();
    float *logits = mt_alloc(sizeof(float) * (size_t)R * V);
    float *scratch = mt_alloc(sizeof(float) * 3 * (size_t)V * (size_t)nthr); /* per thread */
    int32_t *row_tok = mt_xmalloc(sizeof(int32_t) * (size_t)R);
    double *row_lp = mt_xmalloc(sizeof(double) * (size_t)R);
    for (int s = 0; s < S; s++) sreq[s] = -1, sdraft[s] = -1;
    memset(out, 0, sizeof *out * (size_t)n);
    int next_req = 0, done = 0;
    for (;;) {
        if (ep) { /* the group's sequences still running or pending */
            double left = n - done;
            ep->sum_f64(ep->ctx, &left, 1);
            if (left == 0) break;
        } else if (done == n) {
            break;
        }
        int nt = 0, no = 0;
        for (int s = 0; s < S; s++) { /* running sequences: their last sampled token, and its draft */
            if (sreq[s] < 0) continue;
            tok[nt] = spend[s], slot[nt] = s, pos[nt] = sfed[s]++;
            row_draft[no] = 0, rows[no] = nt++, row_slot[no++] = s;
            if (sdraft[s] >= 0) {
                tok[nt] = sdraft[s], slot[nt] = s, pos[nt] = sfed[s];
                row_draft[no] = 1, rows[no] = nt++, row_slot[no++] = s;
                st->drafted++;
            }
        }
        int pre = 0;
        for (int s = 0; s < S && next_req < n; s++) { /* free slots take pending requests */
            if (sreq[s] >= 0) continue;
            const mt_rollout_req *q = &req[next_req];
            if (pre > 0 && (pre + q->len > budget || nt + q->len > cap)) break;
            mt_completion *co = &out[next_req];
            co->tokens = mt_xmalloc(sizeof(int32_t) * (size_t)o->max_new);
            co->logp = mt_xmalloc(sizeof(float) * (size_t)o->max_new);
            if (o->record_routing && rw > 0)
                co->routing = mt_xcalloc((size_t)(q->len + o->max_new) * rw, sizeof(int32_t));
            for (int j = 0; j < q->len; j++) tok[nt + j] = q->prompt[j], slot[nt + j] = s, pos[nt + j] = j;
            nt += q->len;
            pre += q->len;
            row_draft[no] = 0, rows[no] = nt - 1, row_slot[no++] = s;
            sreq[s] = next_req++;
            sfed[s] = q->len;
            sdraft[s] = -1;
            st->prompt_tokens += q->len;
        }
        const int idle = nt == 0; /* EP: this rank is done while others are not; its forwards join their
                                   * exchanges with one token in a free slot, whose results are dropped */
        if (idle) tok[0] = 0, slot[0] = 0, pos[0] = 0, nt = 1;
        mt_decoder_forward(d, m, tok, slot, pos, nt, rows, no, logits);
        st->forwards++;
        if (o->poll) o->poll(o->poll_ctx);
        if (o->record_routing && rw > 0 && !idle) /* a rejected draft's record is overwritten when its position is fed again */
            for (int i = 0; i < nt; i++) {
                int32_t *dst = out[sreq[slot[i]]].routing + (size_t)pos[i] * rw;
                for (int l = 0, q = 0; l < c->num_hidden_layers; l++)
                    if (mt_config_is_moe(c, l)) memcpy(dst + (size_t)(q++) * K, mt_decoder_routing(d, l) + (size_t)i * K,
                                                       sizeof(int32_t) * K);
            }
        /* within a slot the fed tokens are consecutive: each one's next is the one after it */
        for (int i = 0; spec && i < nt; i++)
            next[i] = i + 1 < nt && slot[i + 1] == slot[i] && pos[i + 1] == pos[i] + 1 ? tok[i + 1] : -1;
        /* every wanted row sampled at once (a pass over the vocabulary each), with the draw it gets
         * if the walk below reaches it: a draft row's is that of its slot's position after the
         * row before it. The walk keeps only the rows it reaches; the bits do not depend on the
         * threads. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (no > 1)
        for (int row = 0; row < no; row++) {
            int first = row;
            while (first > 0 && row_draft[first] && row_slot[first - 1] == row_slot[row]) first--;
            const int r = sreq[row_slot[row]];
            const uint64_t key = mt_hash4(o->seed, o->step, req[r].prompt_index, req[r].sample_index);
            const double u = mt_u01(mt_hash4(key, (uint64_t)(out[r].n + row - first), 0x726f6c6cu, 0));
            row_lp[row] = 0;
            row_tok[row] = mt_sample_token(logits + (size_t)row * V, V, o->temperature, o->top_k, o->top_p, u,
                                           o->no_logp ? NULL : &row_lp[row], scratch + (size_t)omp_get_thread_num() * 3 * V);
        }
        for (int j = 0; j < no; j++) {
            if (row_draft[j]) continue; /* verified with its slot's first row */
            const int s = row_slot[j], r = sreq[s];
            mt_completion *co = &out[r];
            /* one draw: the token the row's logits give; a draft that equals it was right, and the
             * draft's row (which saw it) gives the next token with the next draw */
            int row = j, t = -1, fin = 0;
            for (;;) {
                t = row_tok[row];
                co->tokens[co->n] = t;
                co->logp[co->n++] = (float)row_lp[row];
                fin = t == o->eot || co->n == o->max_new;
                if (spec) next[rows[row]] = t, slast[s] = rows[row];
                const int has_draft = row + 1 < no && row_draft[row + 1] && row_slot[row + 1] == s;
                if (!has_draft) break;
                if (fin || t != tok[rows[row + 1]]) { /* rejected (or not needed): its row is skipped */
                    next[rows[row + 1]] = -1;
                    break;
                }
                st->accepted++;
                sfed[s]++;
                row++;
            }
            sdraft[s] = -1;
            if (fin) {
                co->stopped_eot = t == o->eot;
                st->completion_tokens += co->n;
                sreq[s] = -1;
                done++;
            } else {
                spend[s] = t;
            }
        }
        if (m->tp) { /* the TP ranks sample from the same summed logits; were they ever to differ, the
                      * group's forwards would part ways and hang: compare the state, end together */
            uint64_t h = mt_hash4((uint64_t)done, (uint64_t)next_req, 0x7470u, 0);
            for (int s = 0; s < S; s++)
                h = mt_hash4(h, (uint64_t)(int64_t)sreq[s], sreq[s] >= 0 ? (uint64_t)spend[s] : 0, (uint64_t)sfed[s]);
            double v[2] = {(double)(h & 0xfffff), 0};
            v[1] = v[0] * v[0];
            m->tp->sum_f64(m->tp->ctx, v, 2);
            if (v[0] * v[0] != m->tp->size * v[1]) {
                mt_error("rollout: the tensor-parallel ranks sampled different tokens (their logits differ)");
                st->forwards = -1;
                break;
            }
        }
        if (spec) { /* the MTP block on every fed token whose next is known; drafts for the running slots */
            int nw = 0;
            for (int i = 0; i < nt; i++)
                if (sreq[slot[i]] < 0) next[i] = -1; /* a finished sequence's: no more drafts */
            for (int s = 0; s < S; s++)
                if (sreq[s] >= 0 && out[sreq[s]].n + 2 <= o->max_new) rows[nw] = slast[s], row_slot[nw++] = s;
            int32_t *dr = row_draft; /* free until the next forward */
            mt_decoder_draft(d, m, next, slot, pos, nt, rows, nw, dr, logits);
            for (int j = 0; j < nw; j++) sdraft[row_slot[j]] = dr[j];
        }
    }
    const int failed = st->forwards < 0;
    st->seconds = mt_now() - t0;
    st->bytes = mt_decoder_bytes(d);
    mt_decoder_free(d);
    free(tok), free(slot), free(pos), free(rows), free(row_slot), free(sreq), free(sfed), free(spend);
    free(next), free(row_draft), free(sdraft), free(slast);
    mt_free(logits);
    mt_free(scratch);
    free(row_tok), free(row_lp);
    if (failed) {
        for (int i = 0; i < n; i++) mt_completion_free(&out[i]);
        return -1;
    }
    return 0;
}
