/* rl/share.c — see share.h. */
#include "rl/share.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"
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
    const int r = d->rank, D = d->size, lo = (int)((int64_t)n * r / D), hi = (int)((int64_t)n * (r + 1) / D);
    mt_rollout_req *req = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *req);
    int32_t **toks = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *toks);
    for (int i = lo; i < hi; i++) {
        toks[i - lo] = mt_xmalloc(sizeof(int32_t) * mt_prompt_ntokens(ev->prompt[i]));
        int len = (int)mt_prompt_encode(ev->prompt[i], toks[i - lo]);
        req[i - lo] = (mt_rollout_req){toks[i - lo], len, (uint64_t)i, 0};
    }
    mt_rollout_opts ro;
    mt_rollout_defaults(&ro);
    ro.temperature = 0, ro.max_new = max_new, ro.slots = slots, ro.bf16 = bf16;
    mt_completion *out = mt_xcalloc((size_t)(hi - lo) + 1, sizeof *out);
    mt_rollout_stats st;
    int64_t c[2] = {0, hi - lo};
    if (mt_rollout(m, &ro, req, hi - lo, out, &st) != 0) mt_dist_abort(mt_last_error());
    for (int i = lo; i < hi; i++) {
        const mt_completion *co = &out[i - lo];
        c[0] += mt_math_verdict(co->tokens, co->n, co->stopped_eot, ev->answer[i]) == MT_VERDICT_CORRECT;
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
        ptok[j] = mt_xrealloc(ptok[j], sizeof(int32_t) * mt_prompt_ntokens(ps->prompt[pi]));
        const int len = (int)mt_prompt_encode(ps->prompt[pi], ptok[j]);
        for (int q = 0; q < G; q++) req[j * G + q] = (mt_rollout_req){ptok[j], len, (uint64_t)pi, (uint64_t)q};
    }
}

int mt_rl_eval_due(const mt_rl_opts *o, int step, int steps) {
    return step == steps || (o->eval_every > 0 && step % o->eval_every == 0);
}

/* The rollout ranks' side of a separate deployment: per step the weights arrive, every
 * rank samples its share, the records go back; held-out evaluations when the trainer's
 * schedule has them. */
int mt_rl_rollout_server(const mt_rl_opts *o, mt_dist *d, const mt_prompt_set *ps, const mt_prompt_set *ev,
                          size_t longest) {
    const int T0 = 0, lead = d->rank == 0;
    uint64_t plan[4] = {0, 0, 0, 0}; /* start step, steps, seed, bf16 */
    if (lead) mt_group_recv_bytes(&d->job, plan, sizeof plan, T0, MT_RL_TAG_PLAN);
    mt_group_bcast_i32(&d->all, (int *)plan, (sizeof plan) / (sizeof(int))); /* 64-bit words as int pairs */
    const int start = (int)plan[0], steps = (int)plan[1];
    char ck[4200];
    mt_config cfg;
    if (mt_ckpt_resolve(o->train.resume ? o->train.resume : o->train.init, ck, sizeof ck) != 0 ||
        mt_ckpt_load_config(ck, &cfg) != 0)
        return -1;
    mt_model roll;
    if (mt_model_init_infer(&roll, &cfg) != 0) return -1;
    const mt_rl_rec_shape shp = mt_rl_rec_shape_of(&cfg, o, longest);
    const int R = d->size, Pr = o->prompts_per_step / R, rrows = Pr * o->group;
    mt_rollout_req *req = mt_xcalloc((size_t)rrows, sizeof *req);
    mt_completion *co = mt_xcalloc((size_t)rrows, sizeof *co);
    int32_t **ptok = mt_xcalloc((size_t)Pr, sizeof *ptok);
    int32_t *mine = mt_xmalloc(sizeof(int32_t) * shp.rec_n * (size_t)rrows);
    int32_t *every = mt_xmalloc(sizeof(int32_t) * shp.rec_n * (size_t)rrows * (size_t)R);
    mt_prompt_order po = {(int64_t)ps->n, -1, plan[2], NULL};
    const int eval_on = ev->n > 0 && o->eval_n > 0;
    int rc = 0;
    for (int step = start; step <= steps && rc == 0; step++) {
        if (step > start) { /* step's rollout: the weights of version step - 1 */
            if (lead) mt_group_recv_bytes(&d->job, roll.params, roll.nparams * sizeof(float), T0, MT_RL_TAG_WEIGHTS);
            mt_group_bcast_f32(&d->all, roll.params, roll.nparams);
            mt_rollout_opts ro;
            mt_rollout_defaults(&ro);
            ro.temperature = o->temperature, ro.top_k = o->top_k, ro.top_p = o->top_p, ro.max_new = o->max_new;
            ro.seed = plan[2], ro.step = (uint64_t)step, ro.slots = o->slots, ro.record_routing = o->routing_replay;
            ro.bf16 = (int)plan[3]; /* the trainer's precision, as co-located */
            mt_rl_share_requests(&po, ps, o, step, d->rank, R, ptok, req);
            mt_rollout_stats rs;
            if (mt_rollout(&roll, &ro, req, rrows, co, &rs) != 0) mt_dist_abort(mt_last_error());
            double sec = rs.seconds;
            mt_group_max_f64(&d->all, &sec, 1);
            mt_rl_pack_records(&shp, co, req, rrows, mine);
            mt_group_allgather_i32(&d->all, mine, shp.rec_n * (size_t)rrows, every);
            if (lead) {
                mt_group_send_bytes(&d->job, every, sizeof(int32_t) * shp.rec_n * (size_t)rrows * (size_t)R, T0,
                                    MT_RL_TAG_RECORDS);
                mt_group_send_bytes(&d->job, &sec, sizeof sec, T0, MT_RL_TAG_RECORDS);
            }
        }
        if (eval_on && (step == start || mt_rl_eval_due(o, step, steps))) {
            if (lead) mt_group_recv_bytes(&d->job, roll.params, roll.nparams * sizeof(float), T0, MT_RL_TAG_WEIGHTS);
            mt_group_bcast_f32(&d->all, roll.params, roll.nparams);
            double acc = mt_rl_heldout_accuracy(&roll, ev, o->eval_n, o->max_new, o->slots, (int)plan[3], d);
            if (lead) mt_group_send_bytes(&d->job, &acc, sizeof acc, T0, MT_RL_TAG_ACC);
        }
    }
    for (int j = 0; j < Pr; j++) free(ptok[j]);
    free(ptok), free(req), free(co), free(mine), free(every), free(po.perm);
    mt_model_free(&roll);
    return rc;
}

/* The trainer's side of a separate deployment: the current weights to the rollout ranks
 * (gathered on the trainer's rank 0, sent point to point, broadcast there). */
void mt_rl_send_weights(mt_trainer *t, mt_dist *d, float *whole, int rollout_lead) {
    mt_trainer_gather_whole_root(t, whole);
    if (d->rank == 0)
        mt_group_send_f32(&d->job, whole, mt_trainer_whole_floats(t), rollout_lead, MT_RL_TAG_WEIGHTS);
}

double mt_rl_remote_accuracy(mt_trainer *t, mt_dist *d, float *whole, int rollout_lead) {
    mt_rl_send_weights(t, d, whole, rollout_lead);
    double acc = 0;
    if (d->rank == 0) mt_group_recv_bytes(&d->job, &acc, sizeof acc, rollout_lead, MT_RL_TAG_ACC);
    mt_group_bcast_f64(&d->all, &acc, 1);
    return acc;
}
