/* train/optimizer.c — gradient reduction, norm, clipping and AdamW (see optimizer.h). */
#include "train/optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/ops.h"

/* The optimizer's tensor table of a region: the parts of the model's tensors inside
 * [olo, olo+on), with offsets relative to olo (weight decay stays per tensor), and the runs
 * of it the gradient norm counts (all of it unless the region holds a replica). */
static void build_opt_table(const mt_model *m, mt_opt_region *g) {
    const size_t cap = (size_t)m->ntensors + 1;
    g->t_off = mt_xmalloc(sizeof(size_t) * cap);
    g->t_len = mt_xmalloc(sizeof(size_t) * cap);
    g->t_decay = mt_xmalloc(sizeof(int) * cap);
    g->n_off = mt_xmalloc(sizeof(size_t) * cap);
    g->n_len = mt_xmalloc(sizeof(size_t) * cap);
    g->nt = g->nn = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        size_t a = t->offset > g->olo ? t->offset : g->olo;
        size_t b = t->offset + t->numel < g->olo + g->on ? t->offset + t->numel : g->olo + g->on;
        if (a >= b) continue;
        g->t_off[g->nt] = a - g->olo;
        g->t_len[g->nt] = b - a;
        g->t_decay[g->nt] = t->decay;
        g->nt++;
        if (t->replica) continue;
        if (g->nn > 0 && g->n_off[g->nn - 1] + g->n_len[g->nn - 1] == a - g->olo) g->n_len[g->nn - 1] += b - a;
        else g->n_off[g->nn] = a - g->olo, g->n_len[g->nn++] = b - a;
    }
}

void mt_optim_init(mt_optim *op, const mt_model *m, mt_dist *d, int dist_opt) {
    memset(op, 0, sizeof *op);
    const size_t P = m->nparams;
    op->dist_opt = dist_opt;
    op->tp_rank = d->tp_rank;
    op->reg[0] = (mt_opt_region){.lo = 0, .n = m->n_tp, .g = &d->dp};
    op->reg[1] = (mt_opt_region){.lo = m->n_tp, .n = m->n_dense - m->n_tp, .g = d->sp ? &d->dpt : &d->dp};
    op->reg[2] = (mt_opt_region){.lo = m->n_dense, .n = P - m->n_dense, .g = &d->edp};
    /* without SP the replicated tensors and experts are the same on every TP rank */
    op->tp_dup[1] = op->tp_dup[2] = d->tp_size > 1 && !d->sp;
    if (!dist_opt) {
        op->mom_m = mt_alloc((P + 1) * sizeof(float));
        op->mom_v = mt_alloc((P + 1) * sizeof(float));
    }
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        g->olo = g->lo;
        g->on = g->n;
        if (dist_opt) {
            size_t lo, hi;
            mt_group_range(g->g, g->n, g->g->rank, &lo, &hi);
            g->olo = g->lo + lo;
            g->on = hi - lo;
            g->grange = mt_alloc((g->on + 1) * sizeof(float));
            g->m = mt_alloc((g->on + 1) * sizeof(float));
            g->v = mt_alloc((g->on + 1) * sizeof(float));
        } else {
            g->m = op->mom_m + g->lo;
            g->v = op->mom_v + g->lo;
        }
        op->bytes += 2 * g->on * sizeof(float);
        build_opt_table(m, g);
    }
}

void mt_optim_free(mt_optim *op) {
    mt_free(op->mom_m);
    mt_free(op->mom_v);
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        if (op->dist_opt) {
            mt_free(g->m);
            mt_free(g->v);
        }
        mt_free(g->grange);
        free(g->t_off);
        free(g->t_len);
        free(g->t_decay);
        free(g->n_off);
        free(g->n_len);
    }
    memset(op, 0, sizeof *op);
}

void mt_optim_reduce(mt_optim *op, mt_model *m, mt_dist *d, size_t bucket_bytes) {
    const mt_config *cfg = &m->cfg;
    const mt_part *sh = &m->part;
    mt_trace_begin("comm.gradients");
    /* the embedding's copies on the first and last stage (tied head, MTP blocks' input) */
    if ((cfg->tie_word_embeddings || cfg->num_nextn_predict_layers > 0) && d->pp_size > 1 && (sh->embed || sh->head))
        mt_group_sum_f32(&d->emb, m->d_embed, (size_t)cfg->vocab_size * cfg->hidden_size);
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        if (op->dist_opt) mt_group_reduce_scatter(g->g, m->grads + g->lo, g->n, g->grange);
        else mt_group_grad_allreduce(g->g, m->grads + g->lo, g->n, bucket_bytes);
    }
    mt_trace_end();
}

double mt_optim_grad_norm(const mt_optim *op, const mt_model *m, mt_dist *d) {
    mt_trace_begin("optimizer.grad_norm");
    /* every parameter counted once: its range (dist_opt), or the copy of DP index 0
     * (experts: expert-DP index 0); the tied embedding's replica never */
    double ss = 0;
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        const mt_opt_region *g = &op->reg[i];
        if ((op->tp_dup[i] && op->tp_rank != 0) || (!op->dist_opt && g->g->rank != 0)) continue;
        const float *gr = op->dist_opt ? g->grange : m->grads + g->olo;
        for (int k = 0; k < g->nn; k++) ss += mt_sumsq(gr + g->n_off[k], g->n_len[k]);
    }
    mt_group_sum_f64(&d->all, &ss, 1);
    double gnorm = sqrt(ss);
    mt_trace_end();
    return gnorm;
}

void mt_optim_update(mt_optim *op, mt_model *m, const mt_adamw_hp *hp, double lr, double grad_norm, int step) {
    float gscale = (hp->clip > 0 && grad_norm > hp->clip) ? (float)(hp->clip / (grad_norm + 1e-6)) : 1.0f;
    mt_trace_begin("optimizer");
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        const float *gr = op->dist_opt ? g->grange : m->grads + g->olo;
        mt_adamw_multi(m->params + g->olo, gr, g->m, g->v, g->nt, g->t_off, g->t_len, g->t_decay, (float)lr,
                       (float)hp->beta1, (float)hp->beta2, (float)hp->eps, (float)hp->wd, gscale, step);
    }
    mt_trace_end();
    if (op->dist_opt) {
        mt_trace_begin("comm.params");
        for (int i = 0; i < MT_OPT_REGIONS; i++) {
            mt_opt_region *g = &op->reg[i];
            mt_group_allgather(g->g, m->params + g->lo, g->n);
        }
        mt_trace_end();
    }
}

void mt_optim_moments_full(mt_optim *op, float *fm, float *fv) {
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        if (g->n == 0) continue;
        memcpy(fm + g->olo, g->m, g->on * sizeof(float));
        memcpy(fv + g->olo, g->v, g->on * sizeof(float));
        mt_group_allgather(g->g, fm + g->lo, g->n);
        mt_group_allgather(g->g, fv + g->lo, g->n);
    }
}

void mt_optim_moments_take(mt_optim *op, const float *fm, const float *fv) {
    for (int i = 0; i < MT_OPT_REGIONS; i++) {
        mt_opt_region *g = &op->reg[i];
        memcpy(g->m, fm + g->olo, g->on * sizeof(float));
        memcpy(g->v, fv + g->olo, g->on * sizeof(float));
    }
}
