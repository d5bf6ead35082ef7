/* rl/share.c — see share.h. */
#include "rl/share.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "model/config.h"
#include "rl/reward.h"
#include "train/checkpoint.h"

int64_t mt_prompt_order_at(mt_prompt_order *po, int64_t k) {
    const int64_t e = k / po->n;
    if (!po->perm || e != po->epoch) {
        if (!po->perm) po->perm = mt_xmalloc(sizeof(int64_t) * (size_t)po->n);
        for (int64_t i = 0; i < po->n; i++) po->perm[i] = i;
        for (int64_t i = po->n - 1; i > 0; i--) {
            int64_t j = (int64_t)(mt_hash4(po->seed, 0x70726d, (uint64_t)e, (uint64_t)i) % (uint64_t)(i + 1));
            int64_t x = po->perm[i];
            po->perm[i] = po->perm[j];
            po->perm[j] = x;
        }
        po->epoch = e;
    }
    return po->perm[k % po->n];
}

/* Greedy accuracy on the first n held-out prompts, split over all ranks, each sampling from
 * its whole copy m (collective). */
double mt_rl_heldout_accuracy(mt_model *m, const mt_prompt_set *ev, int n, int max_new, int slots, int bf16,
                               mt_dist *d) {
    if ((size_t)n > ev->n) n = (int)ev->n;
    /* a TP group decodes the same prompts: the share is the group's, counted once */
    const int tp = m->tp ? m->tp->size : 1, r = d->rank / tp, D = d->size / tp;
    const int lo = (int)((int64_t)n * r / D), hi = (int)((int64_t)n * (r + 1) / D);
    mt_rollout_req *req = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *req);
    int32_t **toks = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *toks);
    for (int i = lo; i < hi; i++) {
        const int len = (int)mt_prompt_copy(ev, (size_t)i, &toks[i - lo]);
        req[i - lo] = (mt_rollout_req){toks[i - lo], len, (uint64_t)i, 0};
    }
    mt_rollout_opts ro;
    mt_rollout_defaults(&ro);
    ro.temperature = 0, ro.max_new = max_new, ro.slots = slots, ro.bf16 = bf16, ro.eot = ev->tk->eot;
    ro.no_logp = 1; /* only the answers are scored */
    mt_completion *out = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *out);
    mt_rollout_stats st;
    int64_t c[2] = {0, hi - lo};
    if (mt_rollout(m, &ro, req, hi - lo, out, &st) != 0) mt_dist_abort(mt_last_error());
    if (tp > 1 && m->tp->rank != 0) c[1] = 0;
    for (int i = lo; i < hi; i++) {
        const mt_completion *co = &out[i - lo];
        if (tp == 1 || m->tp->rank == 0) c[0] += mt_math_verdict_tk(ev->tk, co->tokens, co->n, co->stopped_eot, ev->answer[i]) == MT_VERDICT_CORRECT;
        mt_completion_free(&out[i - lo]);
        free(toks[i - lo]);
    }
    mt_group_sum_i64(&d->all, c, 2);
    free(out), free(toks), free(req);
    return c[1] ? (double)c[0] / (double)c[1] : 0.0;
}

mt_rl_rec_shape mt_rl_rec_shape_of(const mt_config *cfg, const mt_rl_opts *o, size_t longest) {
    int nmoe = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++) nmoe += mt_config_is_moe(cfg, l);
    const int stride = o->routing_replay ? nmoe * cfg->num_experts_per_tok : 0;
    const size_t rec_n = 2 + 2 * (size_t)o->max_new + (size_t)stride * (longest + (size_t)o->max_new - 1);
    return (mt_rl_rec_shape){rec_n, o->max_new, stride};
}

void mt_rl_pack_records(const mt_rl_rec_shape *sh, mt_completion *co, const mt_rollout_req *req, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        int32_t *r = out + sh->rec_n * (size_t)i;
        memset(r, 0, sizeof(int32_t) * sh->rec_n);
        r[0] = co[i].n, r[1] = co[i].stopped_eot;
        memcpy(r + 2, co[i].tokens, sizeof(int32_t) * (size_t)co[i].n);
        memcpy(r + 2 + sh->max_new, co[i].logp, sizeof(float) * (size_t)co[i].n);
        if (co[i].routing)
            memcpy(r + 2 + 2 * sh->max_new, co[i].routing,
                   sizeof(int32_t) * (size_t)sh->replay_stride * (size_t)(req[i].len + co[i].n - 1));
        mt_completion_free(&co[i]);
    }
}

/* co[n] = the records in[n] (their prompts' requests req[n] give the routing's length) */
void mt_rl_unpack_records(const mt_rl_rec_shape *sh, const int32_t *in, const mt_rollout_req *req, int n,
                           mt_completion *co) {
    for (int i = 0; i < n; i++) {
        const int32_t *r = in + sh->rec_n * (size_t)i;
        mt_completion *c = &co[i];
        c->n = r[0], c->stopped_eot = r[1];
        c->tokens = mt_xmalloc(sizeof(int32_t) * ((size_t)c->n + 1));
        c->logp = mt_xmalloc(sizeof(float) * ((size_t)c->n + 1));
        memcpy(c->tokens, r + 2, sizeof(int32_t) * (size_t)c->n);
        memcpy(c->logp, r + 2 + sh->max_new, sizeof(float) * (size_t)c->n);
        c->routing = NULL;
        if (sh->replay_stride) {
            const size_t nr = (size_t)sh->replay_stride * (size_t)(req[i].len + c->n - 1);
            c->routing = mt_xmalloc(sizeof(int32_t) * (nr + 1));
            memcpy(c->routing, r + 2 + 2 * sh->max_new, sizeof(int32_t) * nr);
        }
    }
}

/* The requests of rollout rank r of R at step (its P / R prompts, G samples each). */
void mt_rl_share_requests(mt_prompt_order *po, const mt_prompt_set *ps, const mt_rl_opts *o, int step, int r, int R,
                           int32_t **ptok, mt_rollout_req *req) {
    const int Pr = o->prompts_per_step / R, G = o->group;
    for (int j = 0; j < Pr; j++) {
        const int64_t k = (int64_t)(step - 1) * o->prompts_per_step + (int64_t)r * Pr + j;
        const int64_t pi = mt_prompt_order_at(po, k);
        const int len = (int)mt_prompt_copy(ps, (size_t)pi, &ptok[j]);
        for (int q = 0; q < G; q++) req[j * G + q] = (mt_rollout_req){ptok[j], len, (uint64_t)pi, (uint64_t)q};
    }
}

int mt_rl_eval_due(const mt_rl_opts *o, int step, int steps) {
    return step == steps || (o->eval_every > 0 && step % o->eval_every == 0);
}

/* ---- separate deployment ---- */

int mt_rl_versions_sent(int start, int steps, int eval_on) {
    return steps > start ? steps - start + (eval_on ? 1 : 0) : (eval_on ? 1 : 0);
}

int mt_rl_version_evaluated(const mt_rl_opts *o, int v, int start, int steps, int eval_on) {
    return eval_on && (v == start || mt_rl_eval_due(o, v, steps));
}

mt_dq *mt_rl_queue_init(mt_dist *d, const mt_rl_opts *o) {
    const int R = o->rollout_ranks, Pr = o->prompts_per_step / R;
    /* a rollout rank is at most max_staleness + 1 rounds ahead of the trainer: its store
     * holds those with one round to spare */
    const mt_dq_opts qo = {o->group, MT_RL_NFIELDS, 1, (o->max_staleness + 2) * Pr * o->group, R};
    return mt_dq_init(&d->job, &qo);
}

typedef struct {
    mt_dq *q;
    mt_dist *d;
    mt_model *roll;
    const mt_rl_opts *o;
    const mt_prompt_set *ev;
    int start, steps, eval_on, bf16;
    int cur, received, expected; /* the version in use; weight messages received and due */
} server;

static void serve_queue(void *ctx) { mt_dq_progress((mt_dq *)ctx); }

static int weights_waiting(void *ctx) { return mt_group_probe(&((mt_dist *)ctx)->job, 0, MT_RL_TAG_WHDR); }

/* The next version from the trainer (serving the queue while it has not come); held-out
 * accuracy when the trainer asked for it. */
static void server_recv(server *sv) {
    mt_dist *d = sv->d;
    mt_dq_wait(sv->q, weights_waiting, d, "rl: a rollout rank waiting for the trainer's weights");
    int64_t hdr[3];
    mt_group_recv_bytes(&d->job, hdr, sizeof hdr, 0, MT_RL_TAG_WHDR);
    if ((size_t)hdr[2] != sv->roll->nparams) mt_dist_abort("rl: the trainer's weights do not match the rollout model");
    mt_group_recv_bytes(&d->job, sv->roll->params, sv->roll->nparams * sizeof(float), 0, MT_RL_TAG_WEIGHTS);
    sv->cur = (int)hdr[0];
    sv->received++;
    if (hdr[1]) {
        double acc = mt_rl_heldout_accuracy(sv->roll, sv->ev, sv->o->eval_n, sv->o->max_new, sv->o->slots, sv->bf16, d);
        if (d->rank == 0) mt_group_send_bytes(&d->job, &acc, sizeof acc, 0, MT_RL_TAG_ACC);
    }
}

void mt_rl_send_sum_order(mt_dist *d, const mt_model *m, int rollout_lead) {
    mt_sum_order o = {0};
    if (m->ep) mt_sum_order_init(&o, m);
    const int n = mt_config_layers(&m->cfg) * m->cfg.n_routed_experts;
    const int hdr[2] = {o.ranks, n};
    mt_group_send_bytes(&d->job, hdr, sizeof hdr, rollout_lead, MT_RL_TAG_PLAN);
    if (o.ranks > 0) {
        mt_group_send_bytes(&d->job, o.node_of, sizeof(int) * (size_t)o.ranks, rollout_lead, MT_RL_TAG_PLAN);
        mt_group_send_bytes(&d->job, o.owner, sizeof(int32_t) * (size_t)n, rollout_lead, MT_RL_TAG_PLAN);
    }
    mt_sum_order_free(&o);
}

/* the rollout ranks' side of mt_rl_send_sum_order, into the copy m */
static void recv_sum_order(mt_dist *d, mt_model *m) {
    int hdr[2] = {0, 0};
    if (d->rank == 0) mt_group_recv_bytes(&d->job, hdr, sizeof hdr, 0, MT_RL_TAG_PLAN);
    mt_group_bcast_i32(&d->all, hdr, 2);
    if (hdr[0] == 0) return;
    if (hdr[1] != mt_config_layers(&m->cfg) * m->cfg.n_routed_experts)
        mt_dist_abort("rl: the trainer's expert layout does not match the rollout model");
    mt_sum_order *o = &m->sum_order;
    o->ranks = hdr[0];
    o->node_of = mt_xmalloc(sizeof(int) * (size_t)o->ranks);
    o->owner = mt_xmalloc(sizeof(int32_t) * ((size_t)hdr[1] + 1));
    if (d->rank == 0) {
        mt_group_recv_bytes(&d->job, o->node_of, sizeof(int) * (size_t)o->ranks, 0, MT_RL_TAG_PLAN);
        mt_group_recv_bytes(&d->job, o->owner, sizeof(int32_t) * (size_t)hdr[1], 0, MT_RL_TAG_PLAN);
    }
    mt_group_bcast_i32(&d->all, o->node_of, (size_t)o->ranks);
    mt_group_bcast_i32(&d->all, (int *)o->owner, (size_t)hdr[1]);
}

/* The rollout ranks' side: round n (the prompts of training step n) is sampled with version
 * max(start, n - 1 - s), or in free mode with the newest version that has arrived (never an
 * older one); each completion goes into the queue as its record and its score, the ranks
 * independent of one another. */
int mt_rl_rollout_server(const mt_rl_opts *o, mt_dist *d, const mt_prompt_set *ps, const mt_prompt_set *ev,
                          size_t longest) {
    const int lead = d->rank == 0;
    uint64_t plan[4] = {0, 0, 0, 0}; /* start step, steps, seed, bf16 */
    if (lead) mt_group_recv_bytes(&d->job, plan, sizeof plan, 0, MT_RL_TAG_PLAN);
    mt_group_bcast_i32(&d->all, (int *)plan, (sizeof plan) / (sizeof(int))); /* 64-bit words as int pairs */
    const int start = (int)plan[0], steps = (int)plan[1], s = o->max_staleness;
    char ck[4200];
    mt_config cfg;
    if (mt_ckpt_resolve(o->train.resume ? o->train.resume : o->train.init, ck, sizeof ck) != 0 ||
        mt_ckpt_load_config(ck, &cfg) != 0)
        return -1;
    mt_model roll;
    if (mt_model_init_infer(&roll, &cfg) != 0) return -1;
    recv_sum_order(d, &roll);
    mt_reward reward;
    if (mt_reward_init(&reward, o->task, (float)o->format_penalty, ps->tk) != 0) return -1;
    const mt_rl_rec_shape shp = mt_rl_rec_shape_of(&cfg, o, longest);
    const int R = d->size, Pr = o->prompts_per_step / R, rrows = Pr * o->group, G = o->group;
    mt_rollout_req *req = mt_xcalloc((size_t)rrows, sizeof *req);
    mt_completion *co = mt_xcalloc((size_t)rrows, sizeof *co);
    int32_t **ptok = mt_xcalloc((size_t)Pr, sizeof *ptok);
    int32_t *rec = mt_xmalloc(sizeof(int32_t) * shp.rec_n);
    mt_prompt_order po = {(int64_t)ps->n, -1, plan[2], NULL};
    const int eval_on = ev->n > 0 && o->eval_n > 0;
    server sv = {mt_rl_queue_init(d, o), d, &roll, o, ev, start, steps, eval_on, (int)plan[3], -1, 0,
                 mt_rl_versions_sent(start, steps, eval_on)};
    double room0 = 0;
    for (int n = start + 1; n <= steps; n++) {
        const int need = n - 1 - s > start ? n - 1 - s : start;
        mt_trace_begin("rl.wait_weights");
        const double t0 = mt_now();
        while (sv.cur < need) server_recv(&sv);
        if (o->stale_free)
            while (sv.received < sv.expected && mt_group_probe(&d->job, 0, MT_RL_TAG_WHDR)) server_recv(&sv);
        const double wait_w = mt_now() - t0;
        mt_trace_end();
        mt_rollout_opts ro;
        mt_rollout_defaults(&ro);
        ro.temperature = o->temperature, ro.top_k = o->top_k, ro.top_p = o->top_p, ro.max_new = o->max_new;
        ro.seed = plan[2], ro.step = (uint64_t)n, ro.slots = o->slots, ro.record_routing = o->routing_replay;
        ro.speculative = o->speculative;
        ro.bf16 = (int)plan[3]; /* the trainer's precision, as co-located */
        ro.poll = serve_queue, ro.poll_ctx = sv.q;
        ro.eot = ps->tk->eot;
        mt_rl_share_requests(&po, ps, o, n, d->rank, R, ptok, req);
        mt_rollout_stats rs;
        mt_trace_begin("rl.rollout");
        if (mt_rollout(&roll, &ro, req, rrows, co, &rs) != 0) mt_dist_abort(mt_last_error());
        mt_trace_end();
        mt_trace_begin("rl.put");
        for (int i = 0; i < rrows; i++) {
            const int64_t id = ((int64_t)(n - 1) * o->prompts_per_step + (int64_t)d->rank * Pr) * G + i;
            const double room = mt_dq_get_stats(sv.q).wait_put_s;
            const double score[MT_RL_NSCORE] = {
                mt_reward_score(&reward, co[i].tokens, co[i].n, co[i].stopped_eot, ps->answer[req[i].prompt_index]),
                rs.seconds, wait_w, room - room0};
            room0 = room;
            mt_rl_pack_records(&shp, &co[i], &req[i], 1, rec);
            mt_dq_put(sv.q, id, MT_RL_FIELD_RECORD, rec, sizeof(int32_t) * shp.rec_n, sv.cur);
            mt_dq_put(sv.q, id, MT_RL_FIELD_SCORE, score, sizeof score, -1);
        }
        mt_trace_end();
    }
    while (sv.received < sv.expected) server_recv(&sv); /* the versions left: the evaluations */
    mt_dq_close(sv.q);
    mt_dq_free(sv.q);
    for (int j = 0; j < Pr; j++) free(ptok[j]);
    free(ptok), free(req), free(co), free(rec), free(po.perm);
    mt_reward_free(&reward);
    mt_model_free(&roll);
    return 0;
}

/* ---- the trainer's side ---- */

mt_rl_link *mt_rl_link_init(mt_trainer *t, mt_dist *d, const mt_rl_opts *o, int rollout_lead) {
    mt_rl_link *k = mt_xcalloc(1, sizeof *k);
    k->q = mt_rl_queue_init(d, o);
    k->R = o->rollout_ranks, k->lead = rollout_lead, k->nslot = o->max_staleness + 2;
    k->n = mt_trainer_whole_floats(t);
    if (d->rank == 0) {
        k->slot = mt_xcalloc((size_t)k->nslot, sizeof *k->slot);
        for (int i = 0; i < k->nslot; i++) {
            k->slot[i].w = mt_alloc((k->n + 1) * sizeof(float));
            k->slot[i].req = mt_xcalloc(2 * (size_t)k->R, sizeof(mt_request));
            for (int r = 0; r < 2 * k->R; r++) k->slot[i].req[r] = MT_REQUEST_NULL;
        }
    }
    return k;
}

typedef struct {
    mt_rl_link *k;
    mt_rl_slot *sl;
} slot_ctx;

static int slot_sent(void *ctx) {
    const slot_ctx *c = ctx;
    int done = 1;
    for (int r = 0; r < 2 * c->k->R; r++) done &= mt_request_test(&c->sl->req[r]);
    return done;
}

/* Serves the queue until every request of a weight slot is done. */
static void wait_slot(mt_rl_link *k, mt_rl_slot *sl) {
    slot_ctx c = {k, sl};
    mt_dq_wait(k->q, slot_sent, &c, "rl: the trainer waiting for a rollout rank to take its weights");
}

typedef struct {
    mt_dist *d;
    int lead;
} acc_ctx;

static int acc_waiting(void *ctx) {
    const acc_ctx *c = ctx;
    return mt_group_probe(&c->d->job, c->lead, MT_RL_TAG_ACC);
}

void mt_rl_link_send(mt_rl_link *k, mt_trainer *t, mt_dist *d, int version, int eval) {
    mt_rl_slot *sl = d->rank == 0 ? &k->slot[k->next] : NULL;
    if (sl) wait_slot(k, sl); /* the rollout ranks took this slot's older version */
    mt_trainer_gather_whole_root(t, sl ? sl->w : NULL);
    if (!sl) return;
    sl->hdr[0] = version, sl->hdr[1] = eval, sl->hdr[2] = (int64_t)k->n;
    for (int r = 0; r < k->R; r++) {
        mt_group_isend_bytes(&d->job, sl->hdr, sizeof sl->hdr, k->lead + r, MT_RL_TAG_WHDR, &sl->req[2 * r]);
        mt_group_isend_f32(&d->job, sl->w, k->n, k->lead + r, MT_RL_TAG_WEIGHTS, &sl->req[2 * r + 1]);
    }
    k->next = (k->next + 1) % k->nslot;
}

double mt_rl_link_accuracy(mt_rl_link *k, mt_dist *d) {
    double acc = 0;
    if (d->rank == 0) {
        acc_ctx c = {d, k->lead};
        mt_dq_wait(k->q, acc_waiting, &c, "rl: the trainer waiting for the rollout ranks' held-out accuracy");
        mt_group_recv_bytes(&d->job, &acc, sizeof acc, k->lead, MT_RL_TAG_ACC);
    }
    mt_group_bcast_f64(&d->all, &acc, 1);
    return acc;
}

void mt_rl_link_take(mt_rl_link *k, mt_dist *d, const mt_rl_opts *o, const mt_rl_rec_shape *sh, int step,
                     int32_t *rec, double *score, int *version, double *depth) {
    const size_t n = (size_t)o->prompts_per_step * (size_t)o->group;
    if (d->rank == 0) {
        mt_dq_batch b;
        mt_trace_begin("rl.wait_samples");
        const double t0 = mt_now();
        mt_dq_get_range(k->q, 0, (1u << MT_RL_FIELD_RECORD) | (1u << MT_RL_FIELD_SCORE),
                        (int64_t)(step - 1) * o->prompts_per_step, (int64_t)step * o->prompts_per_step, &b);
        k->wait_s = mt_now() - t0;
        mt_trace_end();
        MT_ASSERT((size_t)b.n == n);
        for (size_t i = 0; i < n; i++) {
            MT_ASSERT(b.bytes[MT_RL_FIELD_RECORD][i] == sizeof(int32_t) * sh->rec_n &&
                      b.bytes[MT_RL_FIELD_SCORE][i] == sizeof(double) * MT_RL_NSCORE);
            memcpy(rec + sh->rec_n * i, b.data[MT_RL_FIELD_RECORD][i], sizeof(int32_t) * sh->rec_n);
            memcpy(score + MT_RL_NSCORE * i, b.data[MT_RL_FIELD_SCORE][i], sizeof(double) * MT_RL_NSCORE);
            version[i] = b.version[i];
        }
        mt_dq_batch_free(&b);
        *depth = (double)mt_dq_get_stats(k->q).live;
    }
    mt_group_bcast_i32(&d->all, rec, sh->rec_n * n);
    mt_group_bcast_f64(&d->all, score, MT_RL_NSCORE * n);
    mt_group_bcast_i32(&d->all, version, n);
    mt_group_bcast_f64(&d->all, depth, 1);
    mt_group_bcast_f64(&d->all, &k->wait_s, 1);
}

void mt_rl_link_free(mt_rl_link *k, mt_dist *d) {
    if (!k) return;
    if (d->rank == 0)
        for (int i = 0; i < k->nslot; i++) {
            wait_slot(k, &k->slot[i]);
            mt_free(k->slot[i].w);
            free(k->slot[i].req);
        }
    mt_dq_free(k->q);
    free(k->slot);
    free(k);
}
