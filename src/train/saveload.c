/* train/saveload.c — checkpoints of a run under any layout (see saveload.h). */
#include "train/saveload.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "parallel/reshard.h"
#include "train/checkpoint.h"

/* a view of the whole model over a parameter buffer (the checkpoint code needs only the
 * config, the tensor table and the parameters; no gradient buffer) */
static mt_model whole_view(const mt_ckpt_layout *l, const mt_config *cfg, float *params) {
    mt_model v;
    memset(&v, 0, sizeof v);
    v.cfg = *cfg;
    v.tensors = l->full_t;
    v.ntensors = l->nfull_t;
    v.nparams = l->nfull;
    v.params = params;
    return v;
}

/* frees the whole-model buffers of a save or load that are not the run's own */
static void free_whole(const mt_ckpt_layout *l, float *fp, float *fm, float *fv) {
    if (fp != l->m->params) mt_free(fp);
    if (fm != l->opt->mom_m) {
        mt_free(fm);
        mt_free(fv);
    }
}

/* A rank holding the whole model writes from its own buffers (ZeRO-1 moments gathered to it
 * first); a sharded layout sends every owned tensor to rank 0 (TP slices: DP index 0 of
 * every TP rank; replicated tensors: also TP rank 0; experts: expert-DP index 0, and TP rank
 * 0 when they are replicated over TP, without SP), which alone holds whole-model buffers. */
int mt_ckpt_save_dist(const mt_ckpt_layout *l, mt_dist *d, const char *dir, const char *state_json) {
    mt_model *m = l->m;
    mt_optim *op = l->opt;
    const size_t P = m->nparams, NF = l->nfull;
    const int root = d->rank == 0;
    float *lm = op->mom_m, *lv = op->mom_v;  /* this rank's moments, laid out like its parameters */
    float *fp = NULL, *fm = NULL, *fv = NULL; /* whole-model buffers (rank 0) */
    if (l->whole) {
        fp = m->params;
        if (op->dist_opt) { /* every rank's shard of the one region to rank 0 */
            mt_opt_region *g = &op->reg[1];
            MT_ASSERT(g->lo == 0 && g->n == P && g->g->size == d->size);
            fm = root ? mt_alloc((NF + 1) * sizeof(float)) : NULL;
            fv = root ? mt_alloc((NF + 1) * sizeof(float)) : NULL;
            mt_group_gather_ranges(g->g, g->m, P, fm);
            mt_group_gather_ranges(g->g, g->v, P, fv);
        } else {
            fm = lm, fv = lv;
        }
    } else {
        if (op->dist_opt) {
            lm = mt_alloc((P + 1) * sizeof(float));
            lv = mt_alloc((P + 1) * sizeof(float));
            mt_optim_moments_full(op, lm, lv);
        }
        if (root) {
            fp = mt_alloc((NF + 1) * sizeof(float));
            fm = mt_alloc((NF + 1) * sizeof(float));
            fv = mt_alloc((NF + 1) * sizeof(float));
        }
        const int own_t = d->dp_rank == 0, own_d = own_t && d->tp_rank == 0;
        const int own_e = d->edp_rank == 0 && (d->sp || d->tp_rank == 0);
        mt_reshard_gather(&d->all, l->full_t, m, m->params, own_t, own_d, own_e, fp);
        mt_reshard_gather(&d->all, l->full_t, m, lm, own_t, own_d, own_e, fm);
        mt_reshard_gather(&d->all, l->full_t, m, lv, own_t, own_d, own_e, fv);
    }
    int rc = 0;
    if (root) {
        mt_model full = whole_view(l, &m->cfg, fp);
        rc = mt_ckpt_save(dir, &full, fm, fv, state_json);
    }
    if (lm != op->mom_m) {
        mt_free(lm);
        mt_free(lv);
    }
    free_whole(l, fp, fm, fv);
    return rc;
}

/* World rank 0 reads and checks the files against the whole model; a rank holding the whole
 * model then receives a broadcast (ZeRO-1: its shard of the moments), a sharded one its
 * tensors point to point. */
int mt_ckpt_load_dist(const mt_ckpt_layout *l, mt_dist *d, const char *dir, const mt_config *cfg, int resume,
                      int allow_nonfinite) {
    mt_model *m = l->m;
    mt_optim *op = l->opt;
    const int root = d->rank == 0, dist_opt = op->dist_opt;
    const size_t P = m->nparams, NF = l->nfull;
    int lrc = 0;
    float *fp = NULL, *fm = NULL, *fv = NULL;
    if (root) {
        fp = l->whole ? m->params : mt_alloc((NF + 1) * sizeof(float));
        mt_model full = whole_view(l, cfg, fp);
        lrc = mt_ckpt_load_weights(dir, &full, allow_nonfinite);
        if (lrc == 0 && resume) {
            fm = l->whole && !dist_opt ? op->mom_m : mt_alloc((NF + 1) * sizeof(float));
            fv = l->whole && !dist_opt ? op->mom_v : mt_alloc((NF + 1) * sizeof(float));
            lrc = mt_ckpt_load_optimizer(dir, &full, fm, fv, allow_nonfinite);
        }
    }
    int bad = lrc != 0;
    mt_group_bcast_i32(&d->all, &bad, 1);
    if (!bad) {
        if (l->whole) {
            mt_group_bcast_f32(&d->all, m->params, P);
            if (resume && !dist_opt) {
                mt_group_bcast_f32(&d->all, op->mom_m, P);
                mt_group_bcast_f32(&d->all, op->mom_v, P);
            } else if (resume) {
                mt_opt_region *g = &op->reg[1];
                mt_group_scatter_ranges(g->g, fm, P, g->m);
                mt_group_scatter_ranges(g->g, fv, P, g->v);
            }
        } else {
            mt_reshard_scatter(&d->all, l->full_t, fp, m, m->params);
            if (resume) {
                float *lm = dist_opt ? mt_alloc((P + 1) * sizeof(float)) : op->mom_m;
                float *lv = dist_opt ? mt_alloc((P + 1) * sizeof(float)) : op->mom_v;
                mt_reshard_scatter(&d->all, l->full_t, fm, m, lm);
                mt_reshard_scatter(&d->all, l->full_t, fv, m, lv);
                if (dist_opt) {
                    mt_optim_moments_take(op, lm, lv);
                    mt_free(lm);
                    mt_free(lv);
                }
            }
        }
    }
    free_whole(l, fp, fm, fv);
    if (bad) return root ? -1 : mt_error("train: rank 0 could not load the checkpoint %s", dir);
    return 0;
}

char *mt_train_state_to_json(const mt_train_opts *o, const mt_trainer_state *s, int dp) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "step", s->step);
    cJSON_AddNumberToObject(r, "opt_step", s->opt_step); /* updates applied (skipped steps excluded) */
    cJSON_AddNumberToObject(r, "samples", (double)s->samples);
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
    cJSON_AddNumberToObject(r, "bad_streak", s->bad);
    cJSON_AddBoolToObject(r, "doc_mode", o->doc_mode);
    cJSON_AddBoolToObject(r, "bf16", o->bf16);
    cJSON_AddNumberToObject(r, "eot", o->eot);
    /* the run's cadence and bookkeeping, which a resume keeps unless given again */
    cJSON_AddNumberToObject(r, "log_every", o->log_every);
    cJSON_AddNumberToObject(r, "eval_every", o->eval_every);
    cJSON_AddNumberToObject(r, "eval_windows", o->eval_windows);
    cJSON_AddNumberToObject(r, "save_every", o->save_every);
    cJSON_AddNumberToObject(r, "keep", o->keep);
    cJSON_AddNumberToObject(r, "max_bad_steps", o->max_bad);
    cJSON_AddNumberToObject(r, "load_every", o->load_every);
    cJSON_AddBoolToObject(r, "profile", o->profile);
    cJSON_AddBoolToObject(r, "plot", o->plot);
    if (o->metrics) cJSON_AddStringToObject(r, "metrics", o->metrics);
    if (o->recompute) cJSON_AddStringToObject(r, "recompute", o->recompute);
    if (o->expert_placement) cJSON_AddStringToObject(r, "expert_placement", o->expert_placement);
    char *js = cJSON_Print(r);
    cJSON_Delete(r);
    return js;
}

static double jnum(const cJSON *r, const char *k, double def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

int mt_train_state_from_json(const char *dir, const char *txt, mt_train_opts *o, mt_trainer_state *s, int dp) {
    cJSON *r = cJSON_Parse(txt);
    if (!r) return mt_error("%s/trainer_state.json: malformed JSON", dir);
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(r, "seed");
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "step")) || !cJSON_IsString(sd)) {
        cJSON_Delete(r);
        return mt_error("%s/trainer_state.json: missing step or seed", dir);
    }
    s->step = (int)jnum(r, "step", 0);
    s->opt_step = (int)jnum(r, "opt_step", s->step);
    s->samples = (uint64_t)jnum(r, "samples", 0);
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
    if (!o->set_log_every) o->log_every = (int)jnum(r, "log_every", o->log_every);
    if (!o->set_eval_every) o->eval_every = (int)jnum(r, "eval_every", o->eval_every);
    if (!o->set_eval_windows) o->eval_windows = (int)jnum(r, "eval_windows", o->eval_windows);
    if (!o->set_save_every) o->save_every = (int)jnum(r, "save_every", o->save_every);
    if (!o->set_keep) o->keep = (int)jnum(r, "keep", o->keep);
    if (!o->set_max_bad) o->max_bad = (int)jnum(r, "max_bad_steps", o->max_bad);
    if (!o->set_load_every) o->load_every = (int)jnum(r, "load_every", o->load_every);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(r, "profile");
    if (!o->set_profile && cJSON_IsBool(b)) o->profile = cJSON_IsTrue(b);
    b = cJSON_GetObjectItemCaseSensitive(r, "plot");
    if (!o->set_plot && cJSON_IsBool(b)) o->plot = cJSON_IsTrue(b);
    const struct { const char *k; const char **dst; char *buf; size_t cap; } strs[] = {
        {"metrics", &o->metrics, o->resumed_metrics, sizeof o->resumed_metrics},
        {"recompute", &o->recompute, o->resumed_recompute, sizeof o->resumed_recompute},
        {"expert_placement", &o->expert_placement, o->resumed_placement, sizeof o->resumed_placement}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, strs[i].k);
        if (*strs[i].dst || !cJSON_IsString(x)) continue; /* given on the command line, or not recorded */
        if (strlen(x->valuestring) >= strs[i].cap) {
            cJSON_Delete(r);
            return mt_error("%s/trainer_state.json: %s is too long", dir, strs[i].k);
        }
        snprintf(strs[i].buf, strs[i].cap, "%s", x->valuestring);
        *strs[i].dst = strs[i].buf;
    }
    cJSON_Delete(r);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Later steps (a run resumed from an older checkpoint into its own folder leaves them) are
 * never removed: they are not this run's to drop. */
void mt_ckpt_prune(const char *out, int keep, const char *saved) {
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
