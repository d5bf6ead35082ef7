/* train/trainer.c — the training loop (see trainer.h). */
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/common.h"
#include "base/trace.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "kernels/blas.h"
#include "kernels/tier.h"
#include "kernels/ops.h"
#include "dist/ep.h"
#include "dist/reshard.h"
#include "dist/tp.h"
#include "train/checkpoint.h"
#include "train/pipeline.h"

void mt_train_defaults(mt_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->steps = 100;
    o->batch = 8;
    o->seq = 256;
    o->accum = 1;
    o->threads = 0;
    o->seed = 1;
    o->lr = 3e-4;
    o->min_lr_ratio = 0.1;
    o->wd = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->clip = 1.0;
    o->init_std = 0.0; /* 0 = sqrt(1/(2*d*L)) */
    o->warmup = -1;    /* -1 = min(100, steps/10) */
    o->log_every = 1;
    o->eval_every = 0;
    o->eval_windows = 64;
    o->save_every = 0;
    o->keep = 2;
    o->max_bad = 5;
    o->load_every = 0;
    o->eot = 256;
    o->bucket_mb = 25;
    o->pp = o->vpp = o->ep = o->tp = 1;
}

double mt_lr_at(int s, int total, int warmup, double lr, double min_ratio) {
    if (warmup > 0 && s <= warmup) return lr * s / warmup;
    if (total <= warmup) return lr;
    double prog = (double)(s - warmup) / (double)(total - warmup);
    if (prog > 1) prog = 1;
    double minlr = lr * min_ratio;
    return minlr + 0.5 * (lr - minlr) * (1.0 + cos(M_PI * prog));
}

/* Forward only of one micro-batch of nb rows (evaluation), adding ce_sum / n_valid to *st. */
typedef void (*eval_fwd)(void *ctx, const int32_t *in, const int32_t *tg, const int32_t *pos, int nb, int T,
                         mt_step_stats *st);

/* CE sum and valid-target count over the first `windows` validation windows (all when
 * windows <= 0), in micro-batches of B, the micro-batches split round-robin over nranks
 * ranks. Every rank runs the same number of micro-batches (a rank past the end runs one row
 * whose targets are all ignored), because the expert exchange and the pipeline are
 * collective. sc[0] += CE sum, sc[1] += count. */
static void eval_windows(const mt_loader *val, int B, int T, int64_t windows, int32_t doc_eot, int rank,
                         int nranks, eval_fwd fwd, void *ctx, double *sc) {
    uint64_t W = mt_loader_windows(val);
    if (windows <= 0 || (uint64_t)windows > W) windows = (int64_t)W;
    int32_t *in = mt_xmalloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *pos = doc_eot >= 0 ? mt_xmalloc(sizeof(int32_t) * (size_t)B * T) : NULL;
    const int64_t iters = (windows + (int64_t)nranks * B - 1) / ((int64_t)nranks * B);
    for (int64_t it = 0; it < iters; it++) {
        const int64_t w0 = (it * nranks + rank) * B;
        int nb = w0 < windows ? (int)(windows - w0 < B ? windows - w0 : B) : 0;
        for (int b = 0; b < nb; b++) mt_loader_window(val, (uint64_t)(w0 + b), in + (size_t)b * T, tg + (size_t)b * T);
        if (nb == 0) { /* padding: a real row, no target counts */
            mt_loader_window(val, 0, in, tg);
            for (int t = 0; t < T; t++) tg[t] = -1;
        }
        int rows = nb ? nb : 1;
        if (pos) mt_doc_positions(in, rows, T, doc_eot, pos);
        mt_step_stats st;
        memset(&st, 0, sizeof st);
        fwd(ctx, in, tg, pos, rows, T, &st);
        sc[0] += st.ce_sum;
        sc[1] += (double)st.n_valid;
    }
    free(in);
    free(tg);
    free(pos);
}

typedef struct { mt_model *m; mt_acts *a; } eval_one;
static void eval_one_fwd(void *ctx, const int32_t *in, const int32_t *tg, const int32_t *pos, int nb, int T,
                         mt_step_stats *st) {
    eval_one *e = ctx;
    mt_model_forward(e->m, e->a, in, tg, pos, nb, T, 0, 0.0f, NULL, st);
}

double mt_eval_loss(mt_model *m, mt_acts *a, const mt_loader *val, int B, int T, int64_t windows,
                    int32_t doc_eot) {
    eval_one e = {m, a};
    double sc[2] = {0, 0};
    eval_windows(val, B, T, windows, doc_eot, 0, 1, eval_one_fwd, &e, sc);
    return sc[1] > 0 ? sc[0] / sc[1] : 0.0;
}

typedef struct { mt_dist *d; mt_pipe *p; mt_model *m; } eval_pipe;
static void eval_pipe_fwd(void *ctx, const int32_t *in, const int32_t *tg, const int32_t *pos, int nb, int T,
                          mt_step_stats *st) {
    eval_pipe *e = ctx;
    mt_pipe_eval(e->p, e->m, &e->d->pp, in, tg, pos, nb, T, st);
    if (!e->d->sp && e->d->tp_rank != 0) memset(st, 0, sizeof *st); /* without SP every TP rank has the same loss */
}

/* Validation loss under any layout: the windows split over the DP ranks, each micro-batch
 * through the pipeline; CE and counts come from the last stages (summed over every rank). */
static double eval_loss_pipe(mt_dist *d, mt_pipe *p, mt_model *m, const mt_loader *val, int B, int T,
                             int64_t windows, int32_t doc_eot) {
    eval_pipe e = {d, p, m};
    double sc[2] = {0, 0};
    eval_windows(val, B, T, windows, doc_eot, d->dp_rank, d->dp_size, eval_pipe_fwd, &e, sc);
    mt_group_sum_f64(&d->all, sc, 2);
    return sc[1] > 0 ? sc[0] / sc[1] : 0.0;
}

static void fmt_hms(char *buf, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* After saving checkpoint `saved` (a step_NNNNNNNN name, which `latest` now names): keeps it
 * and the newest keep - 1 checkpoints of earlier steps, removes the earlier others. Later
 * steps (a run resumed from an older checkpoint into its own folder leaves them) are never
 * removed: they are not this run's to drop. */
static void prune_checkpoints(const char *out, int keep, const char *saved) {
    DIR *dir = opendir(out);
    if (!dir) return;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "step_", 5) != 0 || strlen(e->d_name) != 13) continue;
        if (strcmp(e->d_name, saved) >= 0) continue; /* zero-padded: name order = step order */
        if (n == cap) names = mt_xrealloc(names, sizeof(char *) * (size_t)(cap = cap ? 2 * cap : 16));
        names[n++] = mt_xstrdup(e->d_name);
    }
    closedir(dir);
    if (n > 1) qsort(names, (size_t)n, sizeof(char *), cmp_names); /* (names is NULL when n is 0) */
    for (int i = 0; i < n; i++) {
        if (i < n - (keep - 1)) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", out, names[i]);
            if (mt_rm_tree(path) != 0) mt_warn("could not remove old checkpoint %s", path);
        }
        free(names[i]);
    }
    free(names);
}

static char *state_to_json(const mt_train_opts *o, int step, int opt_step, uint64_t samples, int bad, int dp) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "step", step);
    cJSON_AddNumberToObject(r, "opt_step", opt_step); /* updates applied (skipped steps excluded) */
    cJSON_AddNumberToObject(r, "samples", (double)samples);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    cJSON_AddStringToObject(r, "seed", seed);
    cJSON_AddNumberToObject(r, "steps", o->steps);
    cJSON_AddNumberToObject(r, "batch", o->batch);
    cJSON_AddNumberToObject(r, "seq", o->seq);
    cJSON_AddNumberToObject(r, "accum", o->accum);
    cJSON_AddNumberToObject(r, "dp", dp);
    /* sequences per optimizer step: what a resume under another DP keeps */
    cJSON_AddNumberToObject(r, "global_batch", (double)o->batch * o->accum * dp);
    cJSON_AddNumberToObject(r, "lr", o->lr);
    cJSON_AddNumberToObject(r, "min_lr_ratio", o->min_lr_ratio);
    cJSON_AddNumberToObject(r, "warmup", o->warmup);
    cJSON_AddNumberToObject(r, "weight_decay", o->wd);
    cJSON_AddNumberToObject(r, "beta1", o->beta1);
    cJSON_AddNumberToObject(r, "beta2", o->beta2);
    cJSON_AddNumberToObject(r, "eps", o->eps);
    cJSON_AddNumberToObject(r, "clip", o->clip);
    cJSON_AddNumberToObject(r, "bad_streak", bad);
    cJSON_AddBoolToObject(r, "doc_mode", o->doc_mode);
    cJSON_AddBoolToObject(r, "bf16", o->bf16);
    cJSON_AddNumberToObject(r, "eot", o->eot);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

static double jnum(const cJSON *r, const char *k, double def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

/* restores step, samples and the hyper-parameters not overridden on the command line; the
 * global batch (batch x accum x DP) is kept under any DP unless --accum is given */
static int state_from_json(const char *dir, const char *txt, mt_train_opts *o, int *step, int *opt_step, uint64_t *samples,
                           int dp) {
    cJSON *r = cJSON_Parse(txt);
    if (!r) return mt_error("%s/trainer_state.json: malformed JSON", dir);
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(r, "seed");
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "step")) || !cJSON_IsString(sd)) {
        cJSON_Delete(r);
        return mt_error("%s/trainer_state.json: missing step or seed", dir);
    }
    *step = (int)jnum(r, "step", 0);
    *opt_step = (int)jnum(r, "opt_step", *step);
    *samples = (uint64_t)jnum(r, "samples", 0);
    if (!o->set_seed) o->seed = strtoull(sd->valuestring, NULL, 10);
    if (!o->set_steps) o->steps = (int)jnum(r, "steps", o->steps);
    const int ck_batch = (int)jnum(r, "batch", o->batch), ck_accum = (int)jnum(r, "accum", o->accum);
    const int64_t global = (int64_t)jnum(r, "global_batch", (double)ck_batch * ck_accum);
    if (!o->set_batch) o->batch = ck_batch;
    if (!o->set_seq) o->seq = (int)jnum(r, "seq", o->seq);
    if (!o->set_accum && o->batch >= 1) {
        if (global % ((int64_t)o->batch * dp) != 0) {
            cJSON_Delete(r);
            return mt_error("train: --resume %s: its global batch of %lld sequences is not divisible by "
                            "batch %d x %d data-parallel ranks; give --batch or --accum (the latter changes "
                            "the global batch)", dir, (long long)global, o->batch, dp);
        }
        o->accum = (int)(global / ((int64_t)o->batch * dp));
    }
    if (!o->set_lr) o->lr = jnum(r, "lr", o->lr);
    if (!o->set_warmup) o->warmup = (int)jnum(r, "warmup", o->warmup);
    if (!o->set_wd) o->wd = jnum(r, "weight_decay", o->wd);
    if (!o->set_clip) o->clip = jnum(r, "clip", o->clip);
    if (!o->set_min_lr) o->min_lr_ratio = jnum(r, "min_lr_ratio", o->min_lr_ratio);
    if (!o->set_beta1) o->beta1 = jnum(r, "beta1", o->beta1);
    if (!o->set_beta2) o->beta2 = jnum(r, "beta2", o->beta2);
    o->eps = jnum(r, "eps", o->eps);
    if (!o->set_doc_mode) o->doc_mode = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "doc_mode"));
    if (!o->set_bf16) o->bf16 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "bf16"));
    if (!o->set_eot) o->eot = (int)jnum(r, "eot", o->eot);
    cJSON_Delete(r);
    return 0;
}

/* Draws OUT/loss.png from OUT/loss.tsv with gnuplot; returns 0 if the file was made. */
static int draw_plot(const char *out) {
    char cmd[8192], png[4200];
    snprintf(png, sizeof png, "%s/loss.png", out);
    remove(png);
    snprintf(cmd, sizeof cmd,
             "command -v gnuplot >/dev/null 2>&1 && gnuplot -e \"set terminal png size 900,500; "
             "set output '%s'; set xlabel 'step'; set ylabel 'loss'; set grid; "
             "set title 'moetrain training loss'; set datafile missing 'NaN'; "
             "plot '%s/loss.tsv' using 1:2 with lines title 'train loss', "
             "'' using 1:3 with points pt 7 title 'validation loss'\" 2>&1",
             png, out);
    FILE *f = NULL;
    if (system(cmd) != 0 || !(f = fopen(png, "rb"))) {
        mt_warn("gnuplot is missing or failed (apt-get install gnuplot-nox): no %s", png);
        return -1;
    }
    fclose(f);
    return 0;
}

/* One part of the flat parameter buffer with the group its gradients are reduced over:
 * region 0 = everything but the routed experts (over DP), region 1 = the routed experts held
 * here (over the expert-DP group; empty without EP). */
typedef struct {
    size_t lo, n;                 /* range of the flat buffer */
    size_t olo, on;               /* the optimizer's range: all of it, or this rank's shard (dist_opt) */
    mt_group *g;
    float *m, *v;                 /* AdamW moments [on] */
    float *gshard;                /* dist_opt: this rank's shard of the summed gradient */
    int nt;                       /* tensor table for the optimizer, clipped to [olo, olo+on) and */
    size_t *t_off, *t_len;        /* relative to olo */
    int *t_decay;
    int nn;                       /* what the gradient norm counts: contiguous runs of the table */
    size_t *n_off, *n_len;        /* without replicas (the tied embedding's copy), relative to olo */
} opt_region;

typedef struct {
    mt_model m;
    mt_pipe pipe;
    mt_ep ep;
    int have_ep;
    mt_tp tp;
    mt_tensor *full_t;            /* the whole model's tensor table (checkpoints, resharding) */
    size_t nfull;
    int nfull_t;
    mt_loader *train, *val;
    opt_region reg[3];
    float *mom_m, *mom_v;         /* without dist_opt: every region's moments, one buffer each */
    int whole;                    /* this rank holds the whole model (no TP, PP or EP) */
    int opt_step;                 /* AdamW updates applied: the bias-correction step */
    int32_t *in, *tg, *pos;
    FILE *metrics, *tsv;
} run_state;

static void run_free(run_state *r) {
    mt_pipe_free(&r->pipe);
    mt_model_free(&r->m);
    if (r->have_ep) mt_ep_free(&r->ep);
    free(r->full_t);
    if (r->train) mt_loader_free(r->train);
    if (r->val) mt_loader_free(r->val);
    mt_free(r->mom_m);
    mt_free(r->mom_v);
    for (int i = 0; i < 3; i++) {
        opt_region *g = &r->reg[i];
        if (!r->mom_m) {
            mt_free(g->m);
            mt_free(g->v);
        }
        mt_free(g->gshard);
        free(g->t_off);
        free(g->t_len);
        free(g->t_decay);
        free(g->n_off);
        free(g->n_len);
    }
    free(r->in);
    free(r->tg);
    free(r->pos);
    if (r->metrics) fclose(r->metrics);
    if (r->tsv) fclose(r->tsv);
}

/* The optimizer's tensor table of a region: the parts of the model's tensors inside
 * [olo, olo+on), with offsets relative to olo (weight decay stays per tensor), and the runs
 * of it the gradient norm counts (all of it unless the region holds a replica). */
static void build_opt_table(run_state *r, opt_region *g) {
    const size_t cap = (size_t)r->m.ntensors + 1;
    g->t_off = mt_xmalloc(sizeof(size_t) * cap);
    g->t_len = mt_xmalloc(sizeof(size_t) * cap);
    g->t_decay = mt_xmalloc(sizeof(int) * cap);
    g->n_off = mt_xmalloc(sizeof(size_t) * cap);
    g->n_len = mt_xmalloc(sizeof(size_t) * cap);
    g->nt = g->nn = 0;
    for (int i = 0; i < r->m.ntensors; i++) {
        const mt_tensor *t = &r->m.tensors[i];
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

/* full-size (this rank's part) moments from the regions' shards, gathered over their groups
 * (dist_opt only; without it the moments are already one buffer) */
static void moments_local(run_state *r, float *fm, float *fv) {
    for (int i = 0; i < 3; i++) {
        opt_region *g = &r->reg[i];
        if (g->n == 0) continue;
        memcpy(fm + g->olo, g->m, g->on * sizeof(float));
        memcpy(fv + g->olo, g->v, g->on * sizeof(float));
        mt_group_allgather(g->g, fm + g->lo, g->n);
        mt_group_allgather(g->g, fv + g->lo, g->n);
    }
}

/* this rank's optimizer shards from full-size (this rank's part) moments */
static void moments_take(run_state *r, const float *fm, const float *fv) {
    for (int i = 0; i < 3; i++) {
        opt_region *g = &r->reg[i];
        memcpy(g->m, fm + g->olo, g->on * sizeof(float));
        memcpy(g->v, fv + g->olo, g->on * sizeof(float));
    }
}

/* a view of the whole model over a parameter buffer (the checkpoint code needs only the
 * config, the tensor table and the parameters; no gradient buffer) */
static mt_model whole_view(const run_state *r, const mt_config *cfg, float *params) {
    mt_model v;
    memset(&v, 0, sizeof v);
    v.cfg = *cfg;
    v.tensors = r->full_t;
    v.ntensors = r->nfull_t;
    v.nparams = r->nfull;
    v.params = params;
    return v;
}

/* frees the whole-model buffers of a save or load that are not the run's own */
static void free_whole(run_state *r, float *fp, float *fm, float *fv) {
    if (fp != r->m.params) mt_free(fp);
    if (fm != r->mom_m) {
        mt_free(fm);
        mt_free(fv);
    }
}

/* Writes the checkpoint of the whole model from world rank 0 (collective). A rank holding
 * the whole model writes from its own buffers (ZeRO-1 moments gathered to it first); a
 * sharded layout sends every owned tensor to rank 0 (TP slices: DP index 0 of every TP rank;
 * replicated tensors: also TP rank 0; experts: expert-DP index 0, and TP rank 0 when they are
 * replicated over TP, without SP), which alone holds whole-model buffers. */
static int save_checkpoint(const mt_train_opts *o, run_state *r, mt_dist *d, int step, uint64_t samples, int bad,
                           char *last_good, size_t cap) {
    char name[64], dir[4096];
    snprintf(name, sizeof name, "step_%08d", step);
    snprintf(dir, sizeof dir, "%s/%s", o->out, name);
    const size_t P = r->m.nparams, NF = r->nfull;
    const int root = d->rank == 0;
    float *lm = r->mom_m, *lv = r->mom_v;  /* this rank's moments, laid out like its parameters */
    float *fp = NULL, *fm = NULL, *fv = NULL; /* whole-model buffers (rank 0) */
    if (r->whole) {
        fp = r->m.params;
        if (o->dist_opt) { /* every rank's shard of the one region to rank 0 */
            opt_region *g = &r->reg[1];
            MT_ASSERT(g->lo == 0 && g->n == P && g->g->size == d->size);
            fm = root ? mt_alloc((NF + 1) * sizeof(float)) : NULL;
            fv = root ? mt_alloc((NF + 1) * sizeof(float)) : NULL;
            mt_group_gather_shards(g->g, g->m, P, fm);
            mt_group_gather_shards(g->g, g->v, P, fv);
        } else {
            fm = lm, fv = lv;
        }
    } else {
        if (o->dist_opt) {
            lm = mt_alloc((P + 1) * sizeof(float));
            lv = mt_alloc((P + 1) * sizeof(float));
            moments_local(r, lm, lv);
        }
        if (root) {
            fp = mt_alloc((NF + 1) * sizeof(float));
            fm = mt_alloc((NF + 1) * sizeof(float));
            fv = mt_alloc((NF + 1) * sizeof(float));
        }
        const int own_t = d->dp_rank == 0, own_d = own_t && d->tp_rank == 0;
        const int own_e = d->edp_rank == 0 && (d->sp || d->tp_rank == 0);
        mt_reshard_gather(&d->all, r->full_t, &r->m, r->m.params, own_t, own_d, own_e, fp);
        mt_reshard_gather(&d->all, r->full_t, &r->m, lm, own_t, own_d, own_e, fm);
        mt_reshard_gather(&d->all, r->full_t, &r->m, lv, own_t, own_d, own_e, fv);
    }
    int rc = 0;
    if (root) {
        mt_model full = whole_view(r, &r->m.cfg, fp);
        char *st = state_to_json(o, step, r->opt_step, samples, bad, d->dp_size);
        rc = mt_ckpt_save(dir, &full, fm, fv, st);
        free(st);
        if (rc == 0) rc = mt_ckpt_set_latest(o->out, name);
    }
    if (lm != r->mom_m) {
        mt_free(lm);
        mt_free(lv);
    }
    free_whole(r, fp, fm, fv);
    if (rc != 0) return -1;
    snprintf(last_good, cap, "%s", dir);
    if (root && o->keep > 0) prune_checkpoints(o->out, o->keep, name);
    return 0;
}

/* Loads weights (and, for a resume, the AdamW moments) of the checkpoint ckdir into this
 * rank's part (collective). World rank 0 reads and checks the files against the whole
 * model; a rank holding the whole model then receives a broadcast (ZeRO-1: its shard of the
 * moments), a sharded one its tensors point to point. */
static int load_checkpoint(const char *ckdir, int resume, run_state *r, const mt_config *cfg, mt_dist *d,
                           int dist_opt) {
    const int root = d->rank == 0;
    const size_t P = r->m.nparams, NF = r->nfull;
    int lrc = 0;
    float *fp = NULL, *fm = NULL, *fv = NULL;
    if (root) {
        fp = r->whole ? r->m.params : mt_alloc((NF + 1) * sizeof(float));
        mt_model full = whole_view(r, cfg, fp);
        lrc = mt_ckpt_load_weights(ckdir, &full);
        if (lrc == 0 && resume) {
            fm = r->whole && !dist_opt ? r->mom_m : mt_alloc((NF + 1) * sizeof(float));
            fv = r->whole && !dist_opt ? r->mom_v : mt_alloc((NF + 1) * sizeof(float));
            lrc = mt_ckpt_load_optimizer(ckdir, &full, fm, fv);
        }
    }
    int bad = lrc != 0;
    if (d->size > 1) MPI_Bcast(&bad, 1, MPI_INT, 0, d->world);
    if (!bad) {
        if (r->whole) {
            mt_group_bcast_f32(&d->all, r->m.params, P);
            if (resume && !dist_opt) {
                mt_group_bcast_f32(&d->all, r->mom_m, P);
                mt_group_bcast_f32(&d->all, r->mom_v, P);
            } else if (resume) {
                opt_region *g = &r->reg[1];
                mt_group_scatter_shards(g->g, fm, P, g->m);
                mt_group_scatter_shards(g->g, fv, P, g->v);
            }
        } else {
            mt_reshard_scatter(&d->all, r->full_t, fp, &r->m, r->m.params);
            if (resume) {
                float *lm = dist_opt ? mt_alloc((P + 1) * sizeof(float)) : r->mom_m;
                float *lv = dist_opt ? mt_alloc((P + 1) * sizeof(float)) : r->mom_v;
                mt_reshard_scatter(&d->all, r->full_t, fm, &r->m, lm);
                mt_reshard_scatter(&d->all, r->full_t, fv, &r->m, lv);
                if (dist_opt) {
                    moments_take(r, lm, lv);
                    mt_free(lm);
                    mt_free(lv);
                }
            }
        }
    }
    free_whole(r, fp, fm, fv);
    if (bad) return root ? -1 : mt_error("train: rank 0 could not load the checkpoint %s", ckdir);
    (void)NF;
    return 0;
}

/* Peak RSS of the whole run and of training alone (the peak before each checkpoint; the
 * kernel's high-water mark is reset after each one). */
typedef struct { size_t all, train; } rss_peaks;
static void rss_mark(rss_peaks *p) {
    size_t x = mt_peak_rss();
    if (x > p->all) p->all = x;
    if (x > p->train) p->train = x;
}
static void rss_after_save(rss_peaks *p) {
    size_t x = mt_peak_rss();
    if (x > p->all) p->all = x;
    mt_reset_peak_rss();
}

/* Layers of each of the S virtual stages: --split "a,b,..." or an even split. */
static int stage_bounds(const char *split, int L, int S, int *bounds) {
    bounds[0] = 0;
    if (!split) {
        if (L % S != 0)
            return mt_error("train: %d layers do not divide into PP x VPP = %d virtual stages; give --split "
                            "with the layers of each stage (e.g. an uneven split)", L, S);
        for (int s = 0; s < S; s++) bounds[s + 1] = bounds[s] + L / S;
        return 0;
    }
    const char *c = split;
    for (int s = 0; s < S; s++) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < 0 || (s < S - 1 && *end != ',') || (s == S - 1 && *end != 0))
            return mt_error("train: --split '%s' must be %d non-negative layer counts separated by commas "
                            "(one per virtual stage, PP x VPP)", split, S);
        bounds[s + 1] = bounds[s] + (int)v;
        c = end + 1;
    }
    if (bounds[S] != L)
        return mt_error("train: --split '%s' sums to %d layers, the model has %d", split, bounds[S], L);
    return 0;
}

/* Every rank must start from the same binary, flags, config, data and (resuming) trainer
 * state: a rank that differs would leave the others waiting in a collective it skips. */
static int check_ranks_agree(mt_dist *d, const mt_train_opts *o, const mt_config *cfg, const char *ckdir) {
    if (d->size == 1) return 0;
    uint64_t hd = 0; /* --data missing: reported later, alike on every rank */
    if (o->data && mt_loader_fingerprint(o->data, &hd) != 0) return -1; /* this rank's own, before any collective */
    char *cj = mt_config_to_json(cfg);
    uint64_t hc = XXH64(cj, strlen(cj), 0);
    free(cj);
    uint64_t hs = 0;
    if (o->resume) {
        char p[4200], *st;
        size_t len;
        snprintf(p, sizeof p, "%s/trainer_state.json", ckdir);
        if (mt_read_file(p, &st, &len) == 0) {
            hs = XXH64(st, len, 1);
            free(st);
        }
    }
    const struct { const char *what; uint64_t h; } items[] = {
        {"binary (/proc/self/exe)", mt_dist_hash_exe()}, {"command line", o->args_hash}, {"model config", hc},
        {"token shards of --data (names and sizes)", hd},
        {"resumed trainer state", hs}};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        if (mt_dist_check_same(d, items[i].what, items[i].h) != 0) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mt_last_error());
            return mt_error("train: %s: refusing to start", msg);
        }
    }
    return 0;
}

int mt_train(const mt_train_opts *opts) {
    mt_train_opts o = *opts;
    run_state r;
    memset(&r, 0, sizeof r);
    mt_config cfg;
    char ckdir[4096] = "";
    int start_step = 0;
    uint64_t samples = 0;
    mt_dist *d = mt_dist_get();
    /* the layout first: the DP size decides how a resumed run's global batch is split */
    if (o.vpp < 1) return mt_error("train: --vpp must be >= 1 (model chunks per pipeline rank)");
    if (o.vpp > 1 && o.pp < 2) return mt_error("train: --vpp %d needs --pp >= 2 (chunks of a pipeline)", o.vpp);
    if (o.sp && o.tp < 2) return mt_error("train: --sp (sequence parallelism) needs --tp >= 2");
    if (mt_dist_set_layout(d, o.pp, o.tp, o.sp, o.ep) != 0) return -1;
    const int D = d->dp_size, root = d->rank == 0;
    mt_a2a_mode a2a_mode = MT_A2A_HIER;
    if (o.a2a && strcmp(o.a2a, "flat") == 0) a2a_mode = MT_A2A_FLAT;
    else if (o.a2a && strcmp(o.a2a, "hier") != 0)
        return mt_error("train: --a2a '%s': flat or hier", o.a2a);
    if (o.ranks_per_node < 0) return mt_error("train: --ranks-per-node must be >= 0 (0 = real nodes)");
    if (o.ep < 2 && (o.a2a || o.ranks_per_node) && root)
        mt_warn("--a2a and --ranks-per-node shape the expert all-to-all; without --ep > 1 they have no effect");
    mt_set_threads(o.threads > 0 ? o.threads : mt_get_threads());
    const int nthr = mt_get_threads();

    /* configuration: resume > init > --config */
    char resume_out[4096];
    if (o.resume && o.init)
        return mt_error("train: --resume continues a run, --init starts a new one from weights: give one of them");
    if ((o.resume || o.init) && o.init_std > 0 && root)
        mt_warn("--init-std has no effect with --%s: the weights come from the checkpoint", o.resume ? "resume" : "init");
    if (o.resume) {
        if (mt_ckpt_resolve(o.resume, ckdir, sizeof ckdir) != 0) return -1;
        if (o.config && root) mt_warn("--resume given: --config is ignored, the model config comes from %s/config.json", ckdir);
        if (!o.out) {
            /* continue writing into the run folder: the resumed path itself when it is a run
             * folder (it has `latest`), else the folder that holds the checkpoint */
            snprintf(resume_out, sizeof resume_out, "%s", o.resume);
            size_t len = strlen(resume_out);
            while (len > 1 && resume_out[len - 1] == '/') resume_out[--len] = 0;
            char latest[4200];
            snprintf(latest, sizeof latest, "%s/latest", resume_out);
            FILE *lf = fopen(latest, "r");
            if (lf) {
                fclose(lf);
            } else {
                char *slash = strrchr(resume_out, '/');
                if (slash && slash != resume_out) *slash = 0;
                else if (slash) slash[1] = 0;
                else snprintf(resume_out, sizeof resume_out, ".");
            }
            o.out = resume_out;
        }
        if (root && mt_ckpt_verify(ckdir, 1) != 0) return -1; /* rank 0 reads the big files */
        if (mt_ckpt_load_config(ckdir, &cfg) != 0) return -1;
        char *st;
        if (mt_ckpt_load_state(ckdir, &st) != 0) return -1;
        int rc = state_from_json(ckdir, st, &o, &start_step, &r.opt_step, &samples, D);
        free(st);
        if (rc != 0) return -1;
    } else if (o.init) {
        if (mt_ckpt_resolve(o.init, ckdir, sizeof ckdir) != 0) return -1;
        if (root && mt_ckpt_verify(ckdir, 0) != 0) return -1;
        if (mt_ckpt_load_config(ckdir, &cfg) != 0) return -1;
        if (o.config && root) mt_warn("--init given: the model config comes from %s/config.json", ckdir);
    } else {
        if (!o.config) return mt_error("train: --config FILE is required (or --resume / --init)");
        if (mt_config_load(&cfg, o.config) != 0) return -1;
    }
    if (check_ranks_agree(d, &o, &cfg, ckdir) != 0) return -1;
    if (mt_model_check(&cfg) != 0) return -1; /* before anything is sized per layer */
    if (o.batch < 1 || o.seq < 1 || o.accum < 1 || o.steps < 1)
        return mt_error("train: --batch, --seq, --accum and --steps must be positive");
    if (!(o.lr > 0) || !isfinite(o.lr)) return mt_error("train: --lr must be a positive finite number");
    if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) return mt_error("train: --min-lr-ratio must be in [0, 1]");
    if (!(o.wd >= 0) || !isfinite(o.wd)) return mt_error("train: --wd must be a finite number >= 0");
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
        return mt_error("train: --beta1 and --beta2 must be in [0, 1)");
    if (!(o.clip >= 0) || !isfinite(o.clip)) return mt_error("train: --clip must be a finite number >= 0 (0 = off)");
    if (!(o.init_std >= 0) || !isfinite(o.init_std)) return mt_error("train: --init-std must be a finite number >= 0 (0 = default)");
    if (!(o.bucket_mb > 0) || !isfinite(o.bucket_mb)) return mt_error("train: --bucket-mb must be a positive number");
    if (o.max_bad < 1) return mt_error("train: --max-bad-steps must be at least 1");
    if (!(o.peak_gflops >= 0) || !isfinite(o.peak_gflops))
        return mt_error("train: --peak-gflops must be a finite number >= 0 (0 = measure)");
    if (o.doc_mode && (o.eot < 0 || o.eot >= cfg.vocab_size))
        return mt_error("train: --eot %d is not a token id of the model (vocab_size %d)", o.eot, cfg.vocab_size);
    if (o.log_every < 1) return mt_error("train: --log-every must be at least 1");
    if (mt_set_gemm_bf16(o.bf16) != 0) return -1;
    if (o.save_every < 0 || o.eval_every < 0 || o.load_every < 0 || o.keep < 0)
        return mt_error("train: --save-every, --eval-every, --load-every and --keep must be >= 0");
    if (o.seq > cfg.max_position_embeddings)
        return mt_error("train: --seq %d exceeds max_position_embeddings %d of the config", o.seq,
                        cfg.max_position_embeddings);
    if (o.warmup < 0) o.warmup = o.steps / 10 < 100 ? o.steps / 10 : 100;
    if (start_step >= o.steps)
        return mt_error("train: checkpoint %s is at step %d, nothing to do for --steps %d", ckdir,
                        start_step, o.steps);
    if (!o.out) return mt_error("train: --out DIR is required");
    if (root && mt_mkdir_p(o.out) != 0) return -1;

    /* data (every rank reads the shards; each samples its own micro-batches) */
    if (!o.data) return mt_error("train: --data DIR is required");
    if (mt_loader_open(&r.train, o.data, "train", o.seq, o.seed) != 0) { run_free(&r); return -1; }
    uint32_t maxtok = mt_loader_max_token(r.train);
    if ((int64_t)maxtok >= cfg.vocab_size) {
        run_free(&r);
        return mt_error("%s: token id %u does not fit vocab_size %d of the model config", o.data, maxtok,
                        cfg.vocab_size);
    }
    /* the val split is optional and only matters with --eval-every; when used it must be
     * readable (every rank decides alike: their data agree, check_ranks_agree) */
    if (o.eval_every > 0 && mt_loader_has_split(o.data, "val") &&
        mt_loader_open(&r.val, o.data, "val", o.seq, o.seed) != 0) {
        run_free(&r);
        return -1;
    } else if (r.val && (int64_t)mt_loader_max_token(r.val) >= cfg.vocab_size) {
        run_free(&r);
        return mt_error("%s: validation token id does not fit vocab_size %d", o.data, cfg.vocab_size);
    }

    /* the layout's constraints on the model */
    const int S = o.pp * o.vpp, Lh = cfg.num_hidden_layers;
    if (o.ep > 1 && cfg.n_routed_experts == 0) return mt_error("train: --ep %d: the model has no routed experts", o.ep);
    if (o.ep > 1 && cfg.n_routed_experts % o.ep != 0)
        return mt_error("train: --ep %d does not divide the %d routed experts", o.ep, cfg.n_routed_experts);
    if (o.tp > 1) {
        const int dense_layers = cfg.n_routed_experts > 0 ? cfg.first_k_dense_replace : Lh;
        if (cfg.num_attention_heads % o.tp || cfg.num_key_value_heads % o.tp)
            return mt_error("train: --tp %d does not divide the attention heads (%d) and key/value heads (%d)", o.tp,
                            cfg.num_attention_heads, cfg.num_key_value_heads);
        if (dense_layers > 0 && cfg.intermediate_size % o.tp)
            return mt_error("train: --tp %d does not divide intermediate_size %d of the dense FFN", o.tp,
                            cfg.intermediate_size);
        if (o.sp && o.seq % o.tp)
            return mt_error("train: --sp splits the tokens of a sequence over TP: --seq %d is not a multiple of --tp %d",
                            o.seq, o.tp);
    }
    if (o.vpp > 1 && o.accum % o.pp != 0)
        return mt_error("train: the interleaved schedule (--vpp %d) needs --accum (micro-batches, %d) to be a multiple "
                        "of --pp %d", o.vpp, o.accum, o.pp);
    int *bounds = mt_xmalloc(sizeof(int) * ((size_t)S + 1));
    if (stage_bounds(o.split, Lh, S, bounds) != 0) { free(bounds); run_free(&r); return -1; }
    mt_shard sh;
    memset(&sh, 0, sizeof sh);
    sh.ep_rank = d->ep_rank;
    sh.ep_size = o.ep;
    for (int c = 0; c < o.vpp; c++) {
        int st = c * o.pp + d->pp_rank;
        for (int l = bounds[st]; l < bounds[st + 1]; l++) sh.layer[l] = 1;
    }
    sh.embed = d->pp_rank == 0;
    sh.head = d->pp_rank == o.pp - 1;
    sh.tp_rank = d->tp_rank;
    sh.tp_size = o.tp;
    sh.sp = d->sp;
    if (o.tp > 1) mt_tp_init(&r.tp, &d->tp, d->sp);
    if (o.ep > 1) {
        if (mt_ep_init(&r.ep, d->ep.comm, o.ranks_per_node, a2a_mode) != 0) { free(bounds); run_free(&r); return -1; }
        r.have_ep = 1;
    }

    /* model and state; with dist_opt the moments exist only for this rank's shards */
    if (mt_model_init_shard(&r.m, &cfg, &sh, r.have_ep ? &r.ep.ops : NULL, o.tp > 1 ? &r.tp.ops : NULL) != 0) {
        free(bounds);
        run_free(&r);
        return -1;
    }
    r.nfull_t = mt_model_layout(&cfg, NULL, NULL);
    r.full_t = mt_xcalloc((size_t)r.nfull_t, sizeof(mt_tensor));
    mt_model_layout(&cfg, r.full_t, &r.nfull);
    const size_t P = r.m.nparams;
    /* TP slices over DP; replicated tensors over DP (x TP with SP, where every TP rank saw
     * other tokens); routed experts over the expert-DP group */
    r.reg[0] = (opt_region){.lo = 0, .n = r.m.n_tp, .g = &d->dp};
    r.reg[1] = (opt_region){.lo = r.m.n_tp, .n = r.m.n_dense - r.m.n_tp, .g = d->sp ? &d->dpt : &d->dp};
    r.reg[2] = (opt_region){.lo = r.m.n_dense, .n = P - r.m.n_dense, .g = &d->edp};
    /* without SP the replicated tensors and experts are the same on every TP rank */
    const int tp_dup[3] = {0, o.tp > 1 && !d->sp, o.tp > 1 && !d->sp};
    size_t opt_bytes = 0;
    r.whole = r.m.nparams == r.nfull && o.tp == 1 && o.pp == 1 && o.ep == 1;
    if (!o.dist_opt) {
        r.mom_m = mt_alloc((P + 1) * sizeof(float));
        r.mom_v = mt_alloc((P + 1) * sizeof(float));
    }
    for (int i = 0; i < 3; i++) {
        opt_region *g = &r.reg[i];
        g->olo = g->lo;
        g->on = g->n;
        if (o.dist_opt) {
            size_t lo, hi;
            mt_group_shard(g->g, g->n, g->g->rank, &lo, &hi);
            g->olo = g->lo + lo;
            g->on = hi - lo;
            g->gshard = mt_alloc((g->on + 1) * sizeof(float));
            g->m = mt_alloc((g->on + 1) * sizeof(float));
            g->v = mt_alloc((g->on + 1) * sizeof(float));
        } else {
            g->m = r.mom_m + g->lo;
            g->v = r.mom_v + g->lo;
        }
        opt_bytes += 2 * g->on * sizeof(float);
        build_opt_table(&r, g);
    }
    if (o.resume || o.init) {
        if (load_checkpoint(ckdir, o.resume != NULL, &r, &cfg, d, o.dist_opt) != 0) {
            free(bounds);
            run_free(&r);
            return -1;
        }
    } else {
        float std = o.init_std > 0 ? (float)o.init_std
                                   : sqrtf(1.0f / (2.0f * cfg.hidden_size * cfg.num_hidden_layers));
        mt_model_init_weights(&r.m, o.seed, std); /* keyed by the whole model's tensor index: any layout */
    }
    const int policy = mt_recompute_parse(o.recompute ? o.recompute : "none");
    if (policy < 0) { free(bounds); run_free(&r); return -1; }
    if (mt_pipe_init(&r.pipe, &cfg, o.pp, o.vpp, o.accum, d->pp_rank, bounds, o.batch, o.seq, nthr, policy, o.tp,
                     d->sp) != 0) {
        free(bounds);
        run_free(&r);
        return -1;
    }
    const size_t BT = (size_t)o.batch * o.seq;
    r.in = mt_xmalloc(sizeof(int32_t) * BT * o.accum);
    r.tg = mt_xmalloc(sizeof(int32_t) * BT * o.accum);
    if (o.doc_mode) r.pos = mt_xmalloc(sizeof(int32_t) * BT * o.accum);

    char path[4096];
    if (root) {
        if (o.metrics) snprintf(path, sizeof path, "%s", o.metrics);
        else snprintf(path, sizeof path, "%s/metrics.jsonl", o.out);
        r.metrics = fopen(path, start_step ? "a" : "w");
        if (!r.metrics) { free(bounds); run_free(&r); return mt_error("%s: cannot open metrics file", path); }
        snprintf(path, sizeof path, "%s/loss.tsv", o.out);
        r.tsv = fopen(path, start_step ? "a" : "w");
        if (!r.tsv) { free(bounds); run_free(&r); return mt_error("%s: cannot open", path); }
    }

    /* the GEMM peak of one rank (MFU denominator: ranks x this) */
    /* the start-up measurement is low on a busy machine; --peak-gflops pins the denominator */
    if (o.profile) { /* the events of the whole run, up to 2^20 (24 MiB): the rest only count in the breakdown */
        size_t ev = (size_t)(o.steps - start_step + 1) * (size_t)(cfg.num_hidden_layers * 24 + 32) * (size_t)o.accum;
        mt_trace_enable(d->rank, ev < ((size_t)1 << 20) ? ev : (size_t)1 << 20);
    }
    /* measured: taken again (and the higher kept) when a step runs above it, and at the end */
    double peak = o.peak_gflops > 0 ? o.peak_gflops : root ? mt_gemm_gflops(1024, 0.3) : 0.0;
    int remeasured = 0;
    const double flops_tok = mt_model_flops_per_token(&cfg, o.seq);
    const double act_params = mt_model_active_params(&cfg);
    const int n_moe = cfg.num_hidden_layers - (cfg.n_routed_experts > 0 ? cfg.first_k_dense_replace : cfg.num_hidden_layers);
    const size_t step_tokens = BT * o.accum * D;
    const size_t bucket_bytes = (size_t)(o.bucket_mb * 1048576.0);
    const int W = d->size;
    if (root && !o.quiet) {
        char gemm[64];
        if (o.bf16) snprintf(gemm, sizeof gemm, "kernels %s, GEMM bf16 x bf16 -> fp32", mt_cpu_tier_name(mt_cpu_tier()));
        else snprintf(gemm, sizeof gemm, "kernels %s, BLAS kernel %s", mt_cpu_tier_name(mt_cpu_tier()), mt_blas_corename());
        printf("moetrain train: %zu parameters (%.1fM active per token), %d layers (%d MoE), "
               "%d threads, %s (%.0f GFLOP/s peak %s)\n",
               r.nfull, act_params / 1e6, cfg.num_hidden_layers, n_moe, nthr, gemm, peak,
               o.peak_gflops > 0 ? "given" : "measured");
        char dp[64] = "";
        if (D > 1) snprintf(dp, sizeof dp, " x DP %d", D);
        printf("  batch %d x seq %d x accum %d%s = %zu tokens/step, %d steps, lr %.2e warmup %d, "
               "activations %.1f MiB, data %llu train tokens%s\n",
               o.batch, o.seq, o.accum, dp, step_tokens, o.steps, o.lr, o.warmup,
               (double)r.pipe.acts_bytes / 1048576.0,
               (unsigned long long)mt_loader_tokens(r.train), r.val || o.eval_every == 0 ? "" : " (no val split)");
        if (W > 1) {
            printf("  layout: %d ranks = PP %d x DP %d x TP %d%s", W, o.pp, D, o.tp, d->sp ? " (sequence parallel)" : "");
            if (o.vpp > 1) printf(", %d chunks per stage (interleaved schedule)", o.vpp);
            else if (o.pp > 1) printf(" (1F1B schedule)");
            if (o.ep > 1)
                printf(", EP %d (%d experts per rank, %s all-to-all over %d node%s)", o.ep, cfg.n_routed_experts / o.ep,
                       a2a_mode == MT_A2A_HIER ? "hierarchical" : "flat", r.ep.a2a.nnodes, r.ep.a2a.nnodes > 1 ? "s" : "");
            printf("\n");
            if (o.pp > 1) {
                printf("  layers per virtual stage:");
                for (int st = 0; st < S; st++) printf(" %d", bounds[st + 1] - bounds[st]);
                printf("\n");
            }
        }
        if (D > 1)
            printf("  data parallel over %d ranks: %s\n", D,
                   o.dist_opt ? "distributed optimizer (gradients reduce-scattered, AdamW sharded, parameters all-gathered)"
                              : "gradients all-reduced");
        if (start_step) printf("  resumed from %s at step %d\n", ckdir, start_step);
    }
    free(bounds);
    if (W > 1) { /* the fullest rank's */
        unsigned long long ob = opt_bytes;
        MPI_Allreduce(MPI_IN_PLACE, &ob, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, d->world);
        opt_bytes = (size_t)ob;
    }
    if (root && !o.quiet) {
        printf("  optimizer state per rank: %.2f MiB (AdamW moments%s; the fullest rank)\n", (double)opt_bytes / 1048576.0,
               o.dist_opt && W > 1 ? ", sharded" : "");
        fflush(stdout);
    }

    char last_good[4096] = "(none)";
    if (o.resume) snprintf(last_good, sizeof last_good, "%s", ckdir);
    int bad = 0, rc = 0;
    const double t_begin = mt_now();
    double t_timed = 0, tok_timed = 0, busy_timed = 0, comm_timed = 0; /* excludes the first step (warm-up) */
    int steps_timed = 0;
    double ema_tps = 0;
    int64_t *load = n_moe > 0 ? mt_xmalloc(sizeof(int64_t) * (size_t)cfg.num_hidden_layers * cfg.n_routed_experts) : NULL;
    double *red = mt_xmalloc(sizeof(double) * (size_t)(cfg.num_hidden_layers + 1));
    mt_a2a_bytes a2a_prev = {0};
    double prof_sum[9] = {0}; /* --profile: the breakdown summed over the steady-state steps */
    rss_peaks rss = {0, 0};
    for (int step = start_step + 1; step <= o.steps; step++) {
        double t0 = mt_now(), c0 = mt_busy_time();
        d->comm_s = 0;
        mt_trace_reset_totals();
        mt_trace_begin("step");
        mt_trace_begin("data");
        /* micro-batch mb of DP rank r is micro-batch r*accum + mb of the global batch; every
         * pipeline stage reads it (the first needs the tokens, the last the targets, all the
         * document positions) */
        for (int mb = 0; mb < o.accum; mb++)
            mt_loader_batch(r.train, samples + ((uint64_t)d->dp_rank * o.accum + mb) * o.batch, o.batch,
                            r.in + mb * BT, r.tg + mb * BT);
        int64_t nvalid = 0;
        for (size_t i = 0; i < BT * o.accum; i++) nvalid += r.tg[i] >= 0;
        mt_group_sum_i64(&d->dp, &nvalid, 1); /* the CE normaliser is that of the global batch */
        if (o.doc_mode)
            for (int mb = 0; mb < o.accum; mb++) mt_doc_positions(r.in + mb * BT, o.batch, o.seq, o.eot, r.pos + mb * BT);
        mt_trace_end();
        mt_trace_begin("compute.zero_grads");
        mt_model_zero_grads(&r.m);
        mt_trace_end();
        mt_step_stats st;
        memset(&st, 0, sizeof st);
        const float ce_scale = nvalid ? 1.0f / (float)nvalid : 0.0f;
        const float bal_scale = 1.0f / (float)(o.batch * o.accum * D);
        mt_pipe_train(&r.pipe, &r.m, &d->pp, r.in, r.tg, r.pos, o.batch, o.seq, ce_scale, bal_scale, &st);
        /* counted once: the balance terms are the same on every TP rank, and without SP so is CE */
        double ce_sum = d->sp || d->tp_rank == 0 ? st.ce_sum : 0.0, bal[256];
        for (int l = 0; l < cfg.num_hidden_layers; l++) bal[l] = d->tp_rank == 0 ? st.bal_sum[l] : 0.0;
        if (W > 1) { /* loss terms of the global batch: CE on the last stages, balance where each layer is */
            red[0] = ce_sum;
            for (int l = 0; l < cfg.num_hidden_layers; l++) red[1 + l] = bal[l];
            /* the first collective over every rank after the schedule: a stage that finished
             * early waits here for the pipeline to drain (part of the bubble) */
            mt_trace_begin("comm.pipeline.flush");
            mt_group_sum_f64(&d->all, red, (size_t)cfg.num_hidden_layers + 1);
            mt_trace_end();
            ce_sum = red[0];
            for (int l = 0; l < cfg.num_hidden_layers; l++) bal[l] = red[1 + l];
        }
        /* gradients: the tied embedding's two copies (first and last stage) summed, then each
         * region summed over its group after the whole backward; ZeRO-1 keeps only this
         * rank's shard */
        mt_trace_begin("comm.gradients");
        if (cfg.tie_word_embeddings && o.pp > 1 && (sh.embed || sh.head))
            mt_group_sum_f32(&d->emb, sh.embed ? r.m.d_embed : r.m.d_head, (size_t)cfg.vocab_size * cfg.hidden_size);
        for (int i = 0; i < 3; i++) {
            opt_region *g = &r.reg[i];
            if (o.dist_opt) mt_group_reduce_scatter(g->g, r.m.grads + g->lo, g->n, g->gshard);
            else mt_group_grad_allreduce(g->g, r.m.grads + g->lo, g->n, bucket_bytes);
        }
        mt_trace_end();
        mt_trace_begin("optimizer.grad_norm");
        /* every parameter counted once: its shard (dist_opt), or the copy of DP index 0
         * (experts: expert-DP index 0); the tied embedding's replica never */
        double ss = 0;
        for (int i = 0; i < 3; i++) {
            opt_region *g = &r.reg[i];
            if ((tp_dup[i] && d->tp_rank != 0) || (!o.dist_opt && g->g->rank != 0)) continue;
            const float *gr = o.dist_opt ? g->gshard : r.m.grads + g->olo;
            for (int k = 0; k < g->nn; k++) ss += mt_sumsq(gr + g->n_off[k], g->n_len[k]);
        }
        mt_group_sum_f64(&d->all, &ss, 1);
        double gnorm = sqrt(ss);
        mt_trace_end();
        double ce = nvalid ? ce_sum / (double)nvalid : 0.0, bal_total = 0;
        for (int l = 0; l < cfg.num_hidden_layers; l++) bal_total += bal[l] * bal_scale;
        double loss = ce + cfg.aux_loss_alpha * bal_total;
        double lr = mt_lr_at(step, o.steps, o.warmup, o.lr, o.min_lr_ratio);
        samples += (uint64_t)o.batch * o.accum * D;
        /* loss and norm are global, so every rank takes the same decision */
        int finite = isfinite(loss) && isfinite(gnorm);
        if (!finite) {
            bad++;
            if (root) {
                mt_warn("step %d: non-finite %s (loss %g, grad norm %g); update skipped (%d in a row)", step,
                        isfinite(loss) ? "gradient" : "loss", loss, gnorm, bad);
                fprintf(r.metrics, "{\"event\":\"skip\",\"step\":%d,\"loss\":\"%g\",\"grad_norm\":\"%g\"}\n", step, loss, gnorm);
                fflush(r.metrics);
            }
            if (bad >= o.max_bad) {
                rc = mt_error("train: stopping after %d non-finite steps in a row (step %d); last good checkpoint: %s",
                              bad, step, last_good);
                break;
            }
        } else {
            bad = 0;
            float gscale = (o.clip > 0 && gnorm > o.clip) ? (float)(o.clip / (gnorm + 1e-6)) : 1.0f;
            ++r.opt_step;
            mt_trace_begin("optimizer");
            for (int i = 0; i < 3; i++) {
                opt_region *g = &r.reg[i];
                const float *gr = o.dist_opt ? g->gshard : r.m.grads + g->olo;
                mt_adamw_multi(r.m.params + g->olo, gr, g->m, g->v, g->nt, g->t_off, g->t_len, g->t_decay,
                               (float)lr, (float)o.beta1, (float)o.beta2, (float)o.eps, (float)o.wd, gscale,
                               r.opt_step);
            }
            mt_trace_end();
            if (o.dist_opt) {
                mt_trace_begin("comm.params");
                for (int i = 0; i < 3; i++) mt_group_allgather(r.reg[i].g, r.m.params + r.reg[i].lo, r.reg[i].n);
                mt_trace_end();
            }
        }
        mt_trace_end(); /* step */
        double dt = mt_now() - t0, comm = d->comm_s;
        if (o.profile) {
            /* the TP collectives and all-to-alls run inside the forward and backward spans;
             * nothing overlaps them yet, so all communication time is exposed */
            double cf = mt_trace_total("fwd."), cb = mt_trace_total("bwd.");
            double ctp = mt_trace_total("comm.tp"), ca2a = mt_trace_total("comm.a2a");
            double cpp = mt_trace_total("comm.pipeline"), cg = mt_trace_total("comm.gradients");
            double cpar = mt_trace_total("comm.params");
            double op = mt_trace_total("optimizer"), da = mt_trace_total("data");
            double comp = cf + cb - ctp - ca2a;
            double prof[9] = {comp, ctp, ca2a, cpp, cg, cpar, op, da, dt - comp - ctp - ca2a - cpp - cg - cpar - op - da};
            if (step > start_step + 1)
                for (int i = 0; i < 9; i++) prof_sum[i] += prof[i];
            if (!o.quiet)
                printf("  profile rank %d step %d: compute %.3f s | exposed comm: TP %.3f, all-to-all %.3f, pipeline "
                       "wait (bubble + p2p) %.3f, gradients %.3f, params %.3f s | optimizer %.3f | data %.3f | other %.3f\n",
                       d->rank, step, prof[0], prof[1], prof[2], prof[3], prof[4], prof[5], prof[6], prof[7], prof[8]);
        }
        double wait = 1.0 - (mt_busy_time() - c0) / (nthr * dt);
        if (wait < 0) wait = 0;
        double tps = (double)step_tokens / dt;
        if (step > start_step + 1) { busy_timed += dt * (1.0 - wait); }
        if (step > start_step + 1) { t_timed += dt; tok_timed += (double)step_tokens; comm_timed += comm; steps_timed++; }
        ema_tps = ema_tps == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
        double mfu = root ? flops_tok * tps / (peak * W * 1e9) : 0.0;
        if (mfu > 1.0 && o.peak_gflops <= 0 && remeasured < 3) { /* the start-up one ran on a busy machine */
            remeasured++; /* a few times at most: a model whose GEMMs beat the 1024^3 one stays above */
            double p2 = mt_gemm_gflops(1024, 0.3);
            if (!o.quiet)
                printf("  step %d ran above the measured GEMM peak of %.0f GFLOP/s: measured again, %.0f GFLOP/s\n", step,
                       peak, p2);
            if (p2 > peak) peak = p2;
            mfu = flops_tok * tps / (peak * W * 1e9);
        }
        double elapsed = mt_now() - t_begin;
        double eta = (o.steps - step) * (elapsed / (step - start_step));
        double vloss = NAN;
        if (r.val && o.eval_every > 0 && (step % o.eval_every == 0 || step == o.steps))
            vloss = eval_loss_pipe(d, &r.pipe, &r.m, r.val, o.batch, o.seq, o.eval_windows, o.doc_mode ? o.eot : -1);
        /* expert all-to-all bytes of this step, summed over the ranks */
        int64_t ab[4] = {0, 0, 0, 0};
        if (r.have_ep) {
            ab[0] = r.ep.a2a.bytes.inter - a2a_prev.inter;
            ab[1] = r.ep.a2a.bytes.intra - a2a_prev.intra;
            ab[2] = r.ep.count.inter_rows[0], ab[3] = r.ep.count.inter_rows[1];
            a2a_prev = r.ep.a2a.bytes;
            memset(&r.ep.count, 0, sizeof r.ep.count);
        }
        if (o.ep > 1) mt_group_sum_i64(&d->all, ab, 4);
        if (finite && root) {
            fprintf(r.metrics,
                    "{\"event\":\"step\",\"step\":%d,\"loss\":%.6f,\"ce\":%.6f,\"balance\":%.6f,\"lr\":%.6e,"
                    "\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,\"comm_s\":%.4f,\"elapsed\":%.2f",
                    step, loss, ce, bal_total, lr, gnorm, tps, mfu, wait, comm, elapsed);
            if (o.ep > 1)
                fprintf(r.metrics, ",\"a2a_inter_bytes\":%lld,\"a2a_intra_bytes\":%lld,\"a2a_inter_rows_flat\":%lld,"
                        "\"a2a_inter_rows_hier\":%lld", (long long)ab[0], (long long)ab[1], (long long)ab[2], (long long)ab[3]);
            if (!isnan(vloss)) fprintf(r.metrics, ",\"val_loss\":%.6f", vloss);
            fprintf(r.metrics, "}\n");
            fflush(r.metrics);
            if (isnan(vloss)) fprintf(r.tsv, "%d\t%.6f\tNaN\n", step, loss);
            else fprintf(r.tsv, "%d\t%.6f\t%.6f\n", step, loss, vloss);
            fflush(r.tsv);
        }
        if (root && !o.quiet && (step % o.log_every == 0 || step == o.steps || step == start_step + 1)) {
            char el[32], et[32];
            fmt_hms(el, sizeof el, elapsed);
            fmt_hms(et, sizeof et, eta);
            printf("step %*d/%d | loss %.4f | bal %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | MFU %.1f%% | wait %.1f%% | ",
                   (int)(log10(o.steps) + 1), step, o.steps, loss, bal_total, lr, gnorm, ema_tps, 100 * mfu, 100 * wait);
            if (W > 1) printf("comm %.3fs | ", comm);
            if (o.ep > 1)
                printf("a2a inter-node %.2f MiB (flat would send %.2f MiB of rows, hier %.2f) | ", ab[0] / 1048576.0,
                       ab[2] * (double)cfg.hidden_size * 4 / 1048576.0, ab[3] * (double)cfg.hidden_size * 4 / 1048576.0);
            printf("%s elapsed | ETA %s", el, et);
            if (!isnan(vloss)) printf(" | val %.4f", vloss);
            printf("\n");
            fflush(stdout);
        }
        if (o.load_every > 0 && n_moe > 0 && (step % o.load_every == 0 || step == o.steps)) {
            const int E = cfg.n_routed_experts;
            memset(load, 0, sizeof(int64_t) * (size_t)cfg.num_hidden_layers * E);
            if (d->sp || d->tp_rank == 0) mt_pipe_load(&r.pipe, &cfg, load); /* without SP: TP ranks route the same tokens */
            /* the global batch's load: each layer counted by the stage that holds it, over DP */
            mt_group_sum_i64(&d->all, load, (size_t)cfg.num_hidden_layers * E);
            if (root) {
                if (!o.quiet) printf("  expert load (max/mean tokens per expert):");
                fprintf(r.metrics, "{\"event\":\"expert_load\",\"step\":%d,\"layers\":{", step);
                int first = 1;
                for (int l = 0; l < cfg.num_hidden_layers; l++) {
                    if (!mt_config_is_moe(&cfg, l)) continue;
                    const int64_t *ld = load + (size_t)l * E;
                    int64_t mx = 0, tot = 0;
                    for (int e = 0; e < E; e++) { tot += ld[e]; mx = ld[e] > mx ? ld[e] : mx; }
                    double ratio = tot ? (double)mx / ((double)tot / E) : 0;
                    if (!o.quiet) printf(" L%d %.2f", l, ratio);
                    fprintf(r.metrics, "%s\"%d\":{\"max\":%lld,\"mean\":%.2f}", first ? "" : ",", l, (long long)mx, (double)tot / E);
                    first = 0;
                }
                fprintf(r.metrics, "}}\n");
                if (!o.quiet) printf("\n");
            }
            mt_pipe_reset_load(&r.pipe);
        }
        /* a checkpoint is written only after a finite step: it must be one to go back to */
        if (o.save_every > 0 && step % o.save_every == 0 && step != o.steps && bad == 0) {
            rss_mark(&rss);
            if (save_checkpoint(&o, &r, d, step, samples, bad, last_good, sizeof last_good) != 0) { rc = -1; break; }
            rss_after_save(&rss);
        }
    }
    free(load);
    free(red);
    rss_mark(&rss); /* training's peak, before the final checkpoint */
    if (rc == 0 && bad > 0) {
        if (root) mt_warn("the last step was non-finite: no final checkpoint; last good checkpoint: %s", last_good);
    } else if (rc == 0) {
        int final_step = o.steps;
        if (save_checkpoint(&o, &r, d, final_step, samples, bad, last_good, sizeof last_good) != 0) rc = -1;
    }
    rss_after_save(&rss);
    /* --profile: every rank's mean breakdown per step, into the metrics (rank 0 writes) */
    if (rc == 0 && o.profile) {
        double *all = root ? mt_xmalloc(sizeof(double) * 9 * (size_t)d->size) : NULL;
        for (int i = 0; i < 9; i++) prof_sum[i] /= steps_timed > 0 ? steps_timed : 1;
        if (d->size > 1) MPI_Gather(prof_sum, 9, MPI_DOUBLE, all, 9, MPI_DOUBLE, 0, d->world);
        else memcpy(all, prof_sum, sizeof prof_sum);
        if (root) {
            static const char *const nm[9] = {"compute", "tp", "a2a", "pipeline_wait", "gradients", "params",
                                              "optimizer", "data", "other"};
            for (int rk = 0; rk < d->size; rk++) {
                fprintf(r.metrics, "{\"event\":\"profile\",\"rank\":%d,\"pp_rank\":%d", rk, rk / (o.tp * D));
                for (int i = 0; i < 9; i++) fprintf(r.metrics, ",\"%s_s\":%.6f", nm[i], all[(size_t)rk * 9 + i]);
                fprintf(r.metrics, "}\n");
            }
        }
        free(all);
    }
    /* the experts' load imbalance over the EP ranks (the planner's --imbalance) */
    double ep_imb = 1.0;
    if (rc == 0 && r.have_ep) {
        ep_imb = mt_ep_imbalance(&r.ep);
        double x = ep_imb;
        if (d->size > 1) MPI_Allreduce(&x, &ep_imb, 1, MPI_DOUBLE, MPI_MAX, d->world);
    }
    /* peak RSS of every rank, for the summary (the planner's memory model is per rank) */
    int64_t *rss_all = mt_xcalloc((size_t)d->size * 2, sizeof(int64_t));
    if (rc == 0) {
        rss_all[d->rank] = (int64_t)rss.all;
        rss_all[d->size + d->rank] = (int64_t)rss.train;
        mt_group_sum_i64(&d->all, rss_all, (size_t)d->size * 2);
    }
    if (rc == 0 && root) {
        double tps = t_timed > 0 ? tok_timed / t_timed : 0;
        if (o.peak_gflops <= 0 && steps_timed > 0) { /* the higher of two measurements */
            double p2 = mt_gemm_gflops(1024, 0.3);
            if (p2 > peak) peak = p2;
        }
        double mfu = flops_tok * tps / (peak * W * 1e9);
        double wait = t_timed > 0 ? 1.0 - busy_timed / t_timed : 0;
        double comm_share = t_timed > 0 ? comm_timed / t_timed : 0;
        size_t rss_peak = (size_t)rss_all[0];
        fprintf(r.metrics,
                "{\"event\":\"summary\",\"steps\":%d,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,\"peak_gflops\":%.1f,"
                "\"peak_rss_bytes\":%zu,\"dp\":%d,\"tp\":%d,\"sp\":%s,\"pp\":%d,\"vpp\":%d,\"ep\":%d,\"dist_opt\":%s,\"optimizer_bytes_per_rank\":%zu,"
                "\"activation_bytes_per_rank\":%zu,\"comm_share\":%.4f,"
                "\"step_time_s\":%.6f,\"ep_imbalance\":%.4f,\"precision\":\"%s\",\"checkpoint\":\"%s\",\"peak_rss_bytes_per_rank\":[",
                o.steps, tps, mfu, wait, peak, rss_peak, D, o.tp, d->sp ? "true" : "false", o.pp, o.vpp, o.ep, o.dist_opt ? "true" : "false", opt_bytes,
                r.pipe.acts_bytes, comm_share, steps_timed > 0 ? t_timed / steps_timed : 0.0, ep_imb,
                o.bf16 ? "bf16" : "fp32", last_good);
        for (int i = 0; i < d->size; i++) fprintf(r.metrics, "%s%lld", i ? "," : "", (long long)rss_all[i]);
        /* the peak of training alone: before each checkpoint was written */
        fprintf(r.metrics, "],\"peak_rss_train_bytes_per_rank\":[");
        for (int i = 0; i < d->size; i++) fprintf(r.metrics, "%s%lld", i ? "," : "", (long long)rss_all[d->size + i]);
        fprintf(r.metrics, "]}\n");
        if (!o.quiet) {
            char peaks[64];
            if (W > 1) snprintf(peaks, sizeof peaks, "%d x %.0f", W, peak);
            else snprintf(peaks, sizeof peaks, "%.0f", peak);
            printf("done: %.0f tok/s (steady state), MFU %.1f%% of %s GFLOP/s, threads waiting %.1f%%, peak RSS %.0f MiB",
                   tps, 100 * mfu, peaks, 100 * wait, (double)rss_peak / 1048576.0);
            if (W > 1) printf(", communication %.1f%% of the step", 100 * comm_share);
            if (o.metrics) printf("\n  checkpoint %s\n  metrics    %s\n", last_good, o.metrics);
            else printf("\n  checkpoint %s\n  metrics    %s/metrics.jsonl\n", last_good, o.out);
        }
        fflush(r.metrics);
        fflush(r.tsv);
        if (o.plot && draw_plot(o.out) == 0 && !o.quiet) printf("  plot       %s/loss.png\n", o.out);
    }
    if (o.profile) {
        char tp[4200];
        snprintf(tp, sizeof tp, "%s/trace_rank%d.json", o.out, d->rank);
        if (mt_trace_write(tp) != 0) mt_warn("%s", mt_last_error());
        else if (!o.quiet) printf("  trace      %s (open in Perfetto / chrome://tracing)\n", tp);
    }
    free(rss_all);
    run_free(&r);
    return rc;
}
