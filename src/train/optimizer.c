/* train/optimizer.c — gradient reduction, norm, clipping and AdamW (see optimizer.h). */
#include "train/optimizer.h"

#include <limits.h>
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
        free(op->rt_off[i]);
        free(op->rt_layer[i]);
    }
    MT_ASSERT(!op->ag_pending); /* the trainer waits before it frees */
    free(op->bk);
    free(op->issue);
    memset(op, 0, sizeof *op);
}

/* Cuts the regions into buckets of at most bucket_bytes from their ends, and lists each
 * region's tensors with the layer whose backward makes their gradients final. */
static void cut_buckets(mt_optim *op, const mt_model *m, size_t bucket_bytes) {
    size_t be = bucket_bytes / sizeof(float);
    if (be < 1) be = 1;
    if (be > mt_dist_max_count()) be = mt_dist_max_count();
    op->bucket_bytes = bucket_bytes;
    int n = 0;
    for (int r = 0; r < MT_OPT_REGIONS; r++) n += (int)((op->reg[r].n + be - 1) / be);
    op->bk = mt_xcalloc((size_t)n + 1, sizeof *op->bk);
    op->issue = mt_xmalloc(sizeof(int) * ((size_t)n + 1));
    op->nbk = 0;
    for (int r = 0; r < MT_OPT_REGIONS; r++) {
        const mt_opt_region *g = &op->reg[r];
        op->first_bk[r] = op->nbk;
        for (size_t b0 = 0; b0 < g->n; b0 += be)
            op->bk[op->nbk++] = (mt_grad_bucket){.reg = r, .b0 = b0, .b1 = g->n - b0 < be ? g->n : b0 + be};
        op->rt_off[r] = mt_xmalloc(sizeof(size_t) * ((size_t)m->ntensors + 1));
        op->rt_layer[r] = mt_xmalloc(sizeof(int) * ((size_t)m->ntensors + 1));
        op->nrt[r] = 0;
        for (int i = 0; i < m->ntensors; i++) {
            const mt_tensor *t = &m->tensors[i];
            if (t->offset < g->lo || t->offset >= g->lo + g->n) continue;
            /* the embedding (and its replica) gets its last gradient after every layer, the
             * final norm and the head in the forward, before any layer's backward */
            const int lay = t->layer >= 0 ? t->layer : (t->role == MT_R_EMBED || t->replica) ? -1 : -2;
            MT_ASSERT(t->layer < (int)sizeof op->layer_done);
            op->rt_off[r][op->nrt[r]] = t->offset - g->lo;
            op->rt_layer[r][op->nrt[r]++] = lay;
        }
        for (int i = 1; i < op->nrt[r]; i++) MT_ASSERT(op->rt_off[r][i] > op->rt_off[r][i - 1]);
    }
    op->first_bk[MT_OPT_REGIONS] = op->nbk;
}

static int bucket_active(const mt_optim *op, int r) {
    return op->dist_opt || (op->reg[r].g->size > 1 && op->reg[r].n > 0);
}

static size_t bucket_bytes(const mt_grad_bucket *k) { return (k->b1 - k->b0) * sizeof(float); }

static void start_bucket(mt_optim *op, mt_model *m, int b) {
    mt_grad_bucket *k = &op->bk[b];
    mt_opt_region *g = &op->reg[k->reg];
    if (op->dist_opt) mt_group_reduce_scatter_begin(g->g, m->grads + g->lo, g->n, k->b0, k->b1, g->grange, &k->c);
    else {
        /* bound the all-reduces' scratch (inflight_max); every rank completes the same
         * buckets at the same point */
        while (op->mpi_done < op->nissued && op->inflight + bucket_bytes(k) > op->inflight_max) {
            mt_grad_bucket *o = &op->bk[op->issue[op->mpi_done++]];
            mt_coll_wait_mpi(&o->c, op->reg[o->reg].g);
            op->inflight -= bucket_bytes(o);
        }
        mt_group_sum_begin(g->g, m->grads + g->lo + k->b0, k->b1 - k->b0, &k->c);
        op->inflight += bucket_bytes(k);
    }
    op->issue[op->nissued++] = b;
}

/* Starts, region by region, the buckets whose gradients are final (all = 1: every one left). */
static void start_ready(mt_optim *op, mt_model *m, int all) {
    for (int r = 0; r < MT_OPT_REGIONS; r++) {
        if (!bucket_active(op, r)) continue;
        int *i = &op->rt_next[r]; /* the highest tensor whose gradient may still change */
        while (*i >= 0) {
            const int lay = op->rt_layer[r][*i];
            if (!all && !(lay >= 0 ? op->layer_done[lay] : lay == -2 && op->any_layer)) break;
            (*i)--;
        }
        /* the region's tensors are packed, so the gradients in [front, n) are final */
        const size_t front = *i < 0 ? 0 : *i + 1 < op->nrt[r] ? op->rt_off[r][*i + 1] : op->reg[r].n;
        while (op->next_bk[r] >= op->first_bk[r] && op->bk[op->next_bk[r]].b0 >= front) start_bucket(op, m, op->next_bk[r]--);
    }
}

void mt_optim_reduce_start(mt_optim *op, const mt_model *m, size_t bucket_bytes) {
    if (!op->bk) cut_buckets(op, m, bucket_bytes);
    if (!op->inflight_max) op->inflight_max = MT_OPT_INFLIGHT_BYTES;
    MT_ASSERT(op->bucket_bytes == bucket_bytes);
    op->nissued = op->mpi_done = 0;
    op->inflight = 0;
    op->any_layer = 0;
    memset(op->layer_done, 0, sizeof op->layer_done);
    for (int r = 0; r < MT_OPT_REGIONS; r++) {
        op->next_bk[r] = op->first_bk[r + 1] - 1;
        op->rt_next[r] = op->nrt[r] - 1;
    }
}

void mt_optim_layer_done(mt_optim *op, mt_model *m, int layer) {
    MT_ASSERT(layer >= 0 && layer < (int)sizeof op->layer_done);
    op->layer_done[layer] = 1;
    op->any_layer = 1;
    start_ready(op, m, 0);
    for (int i = 0; i < op->nissued; i++) mt_coll_progress(&op->bk[op->issue[i]].c);
}

void mt_optim_reduce(mt_optim *op, mt_model *m, mt_dist *d) {
    const mt_config *cfg = &m->cfg;
    const mt_part *sh = &m->part;
    MT_ASSERT(op->bk); /* mt_optim_reduce_start began the step */
    mt_trace_begin("comm.gradients");
    /* the embedding's copies on the first and last stage (tied head, MTP blocks' input) */
    if ((cfg->tie_word_embeddings || cfg->num_nextn_predict_layers > 0) && d->pp_size > 1 && (sh->embed || sh->head))
        mt_group_sum_f32(&d->emb, m->d_embed, (size_t)cfg->vocab_size * cfg->hidden_size);
    start_ready(op, m, 1);
    for (int i = 0; i < op->nissued; i++) mt_coll_end(&op->bk[op->issue[i]].c, op->reg[op->bk[op->issue[i]].reg].g);
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
    if (op->dist_opt) { /* the buckets of the reduction, so the wire sees the same traffic */
        MT_ASSERT(op->bk);
        for (int r = 0; r < MT_OPT_REGIONS; r++) { /* in forward order: each region from its start */
            mt_opt_region *g = &op->reg[r];
            op->ag_next[r] = op->first_bk[r];
            for (int b = op->first_bk[r]; b < op->first_bk[r + 1]; b++)
                mt_group_allgather_begin(g->g, m->params + g->lo, g->n, op->bk[b].b0, op->bk[b].b1, &op->bk[b].ag);
        }
        op->ag_pending = 1;
        if (!op->defer_params) mt_optim_params_ready(op, INT_MAX);
    }
}

void mt_optim_params_ready(mt_optim *op, int layer) {
    if (!op->ag_pending) return;
    mt_trace_begin("comm.params");
    int left = 0;
    for (int r = 0; r < MT_OPT_REGIONS; r++) {
        /* the end of the last tensor this layer needs: its own, the earlier layers' and the
         * embedding's (the forward's order is the buffer's) */
        size_t need = op->reg[r].n;
        if (layer != INT_MAX) {
            need = 0;
            for (int i = 0; i < op->nrt[r]; i++) {
                const int lay = op->rt_layer[r][i];
                if (lay == -1 || (lay >= 0 && lay <= layer))
                    need = i + 1 < op->nrt[r] ? op->rt_off[r][i + 1] : op->reg[r].n;
            }
        }
        int *b = &op->ag_next[r];
        while (*b < op->first_bk[r + 1] && op->bk[*b].b0 < need) {
            mt_coll_end(&op->bk[*b].ag, op->reg[r].g);
            (*b)++;
        }
        left |= *b < op->first_bk[r + 1];
    }
    op->ag_pending = left;
    mt_trace_end();
}

void mt_optim_region_full(mt_optim *op, int r, float *fm, float *fv) {
    mt_opt_region *g = &op->reg[r];
    if (g->n == 0) return;
    memcpy(fm + (g->olo - g->lo), g->m, g->on * sizeof(float));
    memcpy(fv + (g->olo - g->lo), g->v, g->on * sizeof(float));
    mt_group_allgather(g->g, fm, g->n);
    mt_group_allgather(g->g, fv, g->n);
}

void mt_optim_region_take(mt_optim *op, int r, const float *fm, const float *fv) {
    mt_opt_region *g = &op->reg[r];
    memcpy(g->m, fm + (g->olo - g->lo), g->on * sizeof(float));
    memcpy(g->v, fv + (g->olo - g->lo), g->on * sizeof(float));
}

void mt_optim_moments_full(mt_optim *op, float *fm, float *fv) {
    for (int r = 0; r < MT_OPT_REGIONS; r++) mt_optim_region_full(op, r, fm + op->reg[r].lo, fv + op->reg[r].lo);
}

void mt_optim_moments_take(mt_optim *op, const float *fm, const float *fv) {
    for (int r = 0; r < MT_OPT_REGIONS; r++) mt_optim_region_take(op, r, fm + op->reg[r].lo, fv + op->reg[r].lo);
}
