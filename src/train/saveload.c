/* train/saveload.c — checkpoints of a run under any layout (see saveload.h). */
#include "train/saveload.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/json.h"
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

/* Which rank's copy of each element is the one moved: TP slices from DP index 0 of every TP
 * rank; replicated tensors also from TP rank 0; experts from expert-DP index 0, and TP rank 0
 * when they are replicated over TP (without SP). */
static void owners(const mt_dist *d, int *own_t, int *own_d, int *own_e) {
    *own_t = d->dp_rank == 0;
    *own_d = *own_t && d->tp_rank == 0;
    *own_e = d->edp_rank == 0 && (d->sp || d->tp_rank == 0);
}

void mt_ckpt_gather_whole(const mt_ckpt_layout *l, mt_dist *d, float *full) {
    if (l->whole) {
        if (d->rank == 0) memcpy(full, l->m->params, l->nfull * sizeof(float));
        return;
    }
    int own_t, own_d, own_e;
    owners(d, &own_t, &own_d, &own_e);
    mt_reshard_gather(&d->all, l->full_t, l->m, l->m->params, own_t, own_d, own_e, full);
}

void mt_ckpt_allgather_whole(const mt_ckpt_layout *l, mt_dist *d, float *full) {
    if (l->whole) {
        memcpy(full, l->m->params, l->nfull * sizeof(float));
        return;
    }
    int own_t, own_d, own_e;
    owners(d, &own_t, &own_d, &own_e);
    mt_reshard_allgather(&d->all, l->full_t, l->nfull_t, l->m, l->m->params, own_t, own_d, own_e, full);
}

void mt_ckpt_allgather_part(const mt_ckpt_layout *l, mt_dist *d, const mt_model *dst, float *dbuf) {
    if (l->whole) { /* every rank holds every tensor: local copies */
        mt_reshard_extract(l->full_t, l->m->params, dst, dbuf);
        return;
    }
    int own_t, own_d, own_e;
    owners(d, &own_t, &own_d, &own_e);
    mt_reshard_allgather_to(&d->all, l->full_t, l->nfull_t, l->m, l->m->params, own_t, own_d, own_e, dst->tensors,
                            dst->ntensors, dbuf);
}

/* A rank holding the whole model writes from its own buffers (ZeRO-1 moments gathered to it
 * first); a sharded layout sends every owned tensor to rank 0 (TP slices: DP index 0 of
 * every TP rank; replicated tensors: also TP rank 0; experts: expert-DP index 0, and TP rank
 * 0 when they are replicated over TP, without SP), which alone holds whole-model buffers. */
int mt_ckpt_save_dist(const mt_ckpt_layout *l, mt_dist *d, const char *dir, const char *state_json,
                      const mt_tokenizer *tk) {
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
        int own_t, own_d, own_e;
        owners(d, &own_t, &own_d, &own_e);
        mt_reshard_gather(&d->all, l->full_t, m, m->params, own_t, own_d, own_e, fp);
        mt_reshard_gather(&d->all, l->full_t, m, lm, own_t, own_d, own_e, fm);
        mt_reshard_gather(&d->all, l->full_t, m, lv, own_t, own_d, own_e, fv);
    }
    int rc = 0;
    if (root) {
        mt_model full = whole_view(l, &m->cfg, fp);
        rc = mt_ckpt_save(dir, &full, fm, fv, state_json, tk);
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

char *mt_train_state_to_json(const mt_train_opts *o, const mt_trainer_state *s, int dp, const int32_t *slots,
                             const int64_t *load, size_t n) {
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
    cJSON_AddNumberToObject(r, "expert_balance", o->expert_balance);
    cJSON_AddBoolToObject(r, "profile", o->profile);
    cJSON_AddBoolToObject(r, "plot", o->plot);
    if (o->metrics) cJSON_AddStringToObject(r, "metrics", o->metrics);
    if (o->recompute) cJSON_AddStringToObject(r, "recompute", o->recompute);
    if (o->expert_placement) cJSON_AddStringToObject(r, "expert_placement", o->expert_placement);
    if (o->aux_scope) cJSON_AddStringToObject(r, "aux_scope", o->aux_scope);
    if (o->init_scheme) cJSON_AddStringToObject(r, "init_scheme", o->init_scheme);
    if (slots) {
        cJSON *a = cJSON_AddArrayToObject(r, "expert_slots"), *b = cJSON_AddArrayToObject(r, "expert_load_window");
        for (size_t i = 0; i < n; i++) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(slots[i]));
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)load[i]));
        }
    }
    char *js = cJSON_Print(r);
    cJSON_Delete(r);
    return js;
}

/* ---- reading trainer_state.json: every field checked as config.json's are ---- */

/* The value as compact JSON for messages, shortened. */
static void show(const cJSON *v, char *buf, size_t cap) {
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, cap, "%.40s%s", t ? t : "?", t && strlen(t) > 40 ? "..." : "");
    cJSON_free(t);
}

enum { F_INT, F_REAL, F_BOOL };

/* A field: kind, whether a checkpoint always has it, the accepted range (inclusive, as
 * `range` says it), the flag that overrides it (NULL: none) and where it goes. */
typedef struct {
    const char *key;
    int kind, required;
    double lo, hi;
    const char *range;
    const int *given;
    int *i;
    double *d;
} state_field;

/* 1 when read into *v, 0 when absent and optional, -1 after an error naming the key. */
static int state_value(const char *path, const cJSON *r, const state_field *f, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, f->key);
    if (!x) return f->required ? mt_error("%s: key %s: required key is missing", path, f->key) : 0;
    if (f->kind != F_BOOL) {
        if (cJSON_IsNull(x)) return mt_error("%s: key %s: expected a number, got null", path, f->key);
        return mt_json_number(path, r, f->key, f->kind == F_INT, f->lo, f->hi, f->range, v);
    }
    if (!cJSON_IsBool(x)) {
        char t[64];
        show(x, t, sizeof t);
        return mt_error("%s: key %s: expected a boolean (true or false), got %s", path, f->key, t);
    }
    *v = cJSON_IsTrue(x);
    return 1;
}

/* A decimal uint64 (the seed is a string so that no double rounds it): digits only. */
static int state_seed(const char *path, const cJSON *r, uint64_t *seed) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, "seed");
    if (!x) return mt_error("%s: key seed: required key is missing", path);
    char t[64];
    show(x, t, sizeof t);
    const char *p = cJSON_IsString(x) ? x->valuestring : "";
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (!isdigit((unsigned char)p[0]) || *end || errno == ERANGE)
        return mt_error("%s: key seed: expected a decimal integer 0 .. 18446744073709551615 in a string, got %s", path, t);
    *seed = v;
    return 0;
}

/* The optional string settings, kept in o's buffers (the cJSON tree is freed). */
static int state_strings(const char *path, const cJSON *r, mt_train_opts *o) {
    const struct { const char *k; const char **dst; char *buf; size_t cap; } strs[] = {
        {"metrics", &o->metrics, o->resumed_metrics, sizeof o->resumed_metrics},
        {"recompute", &o->recompute, o->resumed_recompute, sizeof o->resumed_recompute},
        {"expert_placement", &o->expert_placement, o->resumed_placement, sizeof o->resumed_placement},
        {"aux_scope", &o->aux_scope, o->resumed_aux_scope, sizeof o->resumed_aux_scope},
        {"init_scheme", &o->init_scheme, o->resumed_init_scheme, sizeof o->resumed_init_scheme}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(r, strs[i].k);
        if (!x) continue; /* not recorded */
        if (!cJSON_IsString(x)) {
            char t[64];
            show(x, t, sizeof t);
            return mt_error("%s: key %s: expected a string, got %s", path, strs[i].k, t);
        }
        if (strlen(x->valuestring) >= strs[i].cap)
            return mt_error("%s: key %s: longer than %zu characters", path, strs[i].k, strs[i].cap - 1);
        if (*strs[i].dst) continue; /* given on the command line */
        snprintf(strs[i].buf, strs[i].cap, "%s", x->valuestring);
        *strs[i].dst = strs[i].buf;
    }
    return 0;
}

/* The global batch kept under a new DP size: accum = global / (batch x dp). */
static int state_accum(const char *dir, mt_train_opts *o, int ck_batch, int ck_accum, int ck_dp, double global, int dp,
                       const char *path) {
    if (ck_dp > 0 && global != (double)ck_batch * ck_accum * ck_dp)
        return mt_error("%s: key global_batch: %.0f is not batch %d x accum %d x dp %d", path, global, ck_batch,
                        ck_accum, ck_dp);
    if (!o->set_batch) o->batch = ck_batch;
    if (o->set_accum || o->batch < 1) return 0;
    const int64_t g = (int64_t)global;
    if (g % ((int64_t)o->batch * dp) != 0)
        return mt_error("train: --resume %s: its global batch of %lld sequences is not divisible by "
                        "batch %d x %d data-parallel ranks; give --batch or --accum (the latter changes "
                        "the global batch)", dir, (long long)g, o->batch, dp);
    if (g / ((int64_t)o->batch * dp) > INT_MAX)
        return mt_error("%s: key global_batch: %lld sequences need more than %d micro-batches of %d", path,
                        (long long)g, INT_MAX, o->batch);
    o->accum = (int)(g / ((int64_t)o->batch * dp));
    return 0;
}

static int read_state(const char *dir, const char *path, const cJSON *r, mt_train_opts *o, mt_trainer_state *s,
                      int dp) {
    const double IMAX = INT_MAX, EXACT = 9007199254740992.0; /* 2^53: every integer below is a double */
    const double B1 = nextafter(1.0, 0.0);                   /* [0, 1) */
    int opt_step = -1, ck_batch = 0, ck_accum = 0, ck_dp = 0, bad = 0;
    double samples = 0, global = -1;
    const state_field f[] = {
        {"step", F_INT, 1, 0, IMAX, "0 .. 2147483647", NULL, &s->step, NULL},
        {"opt_step", F_INT, 0, 0, IMAX, "0 .. 2147483647", NULL, &opt_step, NULL},
        {"samples", F_INT, 1, 0, EXACT, "0 .. 2^53", NULL, NULL, &samples},
        {"steps", F_INT, 1, 1, IMAX, "1 .. 2147483647", &o->set_steps, &o->steps, NULL},
        {"batch", F_INT, 1, 1, IMAX, "1 .. 2147483647", NULL, &ck_batch, NULL},
        {"seq", F_INT, 1, 1, IMAX, "1 .. 2147483647", &o->set_seq, &o->seq, NULL},
        {"accum", F_INT, 1, 1, IMAX, "1 .. 2147483647", NULL, &ck_accum, NULL},
        {"dp", F_INT, 0, 1, IMAX, "1 .. 2147483647", NULL, &ck_dp, NULL},
        {"global_batch", F_INT, 0, 1, EXACT, "1 .. 2^53", NULL, NULL, &global},
        {"lr", F_REAL, 1, FLT_MIN, FLT_MAX, "a positive float, 1.2e-38 .. 3.4e38", &o->set_lr, NULL, &o->lr},
        {"min_lr_ratio", F_REAL, 1, 0, 1, "0 .. 1", &o->set_min_lr, NULL, &o->min_lr_ratio},
        {"warmup", F_INT, 1, 0, IMAX, "0 .. 2147483647", &o->set_warmup, &o->warmup, NULL},
        {"weight_decay", F_REAL, 1, 0, FLT_MAX, "0 .. 3.4e38", &o->set_wd, NULL, &o->wd},
        {"beta1", F_REAL, 1, 0, B1, "0 <= beta1 < 1", &o->set_beta1, NULL, &o->beta1},
        {"beta2", F_REAL, 1, 0, B1, "0 <= beta2 < 1", &o->set_beta2, NULL, &o->beta2},
        /* AdamW divides by sqrt(v) + eps in float: 0 (or a float's 0) makes NaN weights */
        {"eps", F_REAL, 1, FLT_MIN, FLT_MAX, "a positive float, 1.2e-38 .. 3.4e38", NULL, NULL, &o->eps},
        {"clip", F_REAL, 1, 0, FLT_MAX, "0 .. 3.4e38, 0 = off", &o->set_clip, NULL, &o->clip},
        {"bad_streak", F_INT, 0, 0, IMAX, "0 .. 2147483647", NULL, &bad, NULL},
        {"doc_mode", F_BOOL, 1, 0, 1, "", &o->set_doc_mode, &o->doc_mode, NULL},
        {"bf16", F_BOOL, 1, 0, 1, "", &o->set_bf16, &o->bf16, NULL},
        {"eot", F_INT, 1, 0, IMAX, "0 .. 2147483647", &o->set_eot, &o->eot, NULL},
        {"log_every", F_INT, 0, 1, IMAX, "1 .. 2147483647", &o->set_log_every, &o->log_every, NULL},
        {"eval_every", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_eval_every, &o->eval_every, NULL},
        {"eval_windows", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_eval_windows, &o->eval_windows, NULL},
        {"save_every", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_save_every, &o->save_every, NULL},
        {"keep", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_keep, &o->keep, NULL},
        {"max_bad_steps", F_INT, 0, 1, IMAX, "1 .. 2147483647", &o->set_max_bad, &o->max_bad, NULL},
        {"load_every", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_load_every, &o->load_every, NULL},
        {"expert_balance", F_INT, 0, 0, IMAX, "0 .. 2147483647", &o->set_expert_balance, &o->expert_balance, NULL},
        {"profile", F_BOOL, 0, 0, 1, "", &o->set_profile, &o->profile, NULL},
        {"plot", F_BOOL, 0, 0, 1, "", &o->set_plot, &o->plot, NULL},
    };
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        double v;
        const int got = state_value(path, r, &f[k], &v);
        if (got < 0) return -1;
        if (!got || (f[k].given && *f[k].given)) continue; /* absent, or the flag given again wins */
        if (f[k].i) *f[k].i = (int)v;
        else *f[k].d = v;
    }
    uint64_t seed = 0;
    if (state_seed(path, r, &seed) != 0) return -1;
    if (!o->set_seed) o->seed = seed;
    if (opt_step > s->step) return mt_error("%s: key opt_step: %d exceeds step %d", path, opt_step, s->step);
    s->opt_step = opt_step >= 0 ? opt_step : s->step;
    s->samples = (uint64_t)samples;
    if (global < 0) global = (double)ck_batch * ck_accum;
    if (state_accum(dir, o, ck_batch, ck_accum, ck_dp, global, dp, path) != 0) return -1;
    return state_strings(path, r, o);
}

int mt_train_state_from_json(const char *dir, const char *txt, size_t len, mt_train_opts *o, mt_trainer_state *s,
                             int dp) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    cJSON *r = mt_json_parse(path, txt, len);
    if (!r) return -1;
    const int rc = cJSON_IsObject(r) ? read_state(dir, path, r, o, s, dp)
                                     : mt_error("%s: top level is not a JSON object", path);
    cJSON_Delete(r);
    return rc;
}

/* a[n] of non-negative integers (the counts below 2^53, exact in a double) into i32 or i64 */
static int int_array(const char *path, const cJSON *r, const char *key, size_t n, int32_t *i32, int64_t *i64) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, key);
    if (!cJSON_IsArray(a) || (size_t)cJSON_GetArraySize(a) != n)
        return mt_error("%s: key %s: not an array of %zu numbers (the model's layers x routed experts)", path, key, n);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        const double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(x >= 0 && x == floor(x) && x <= (i32 ? (double)INT32_MAX : 9007199254740992.0)))
            return mt_error("%s: key %s: element %zu is not a non-negative integer", path, key, i);
        if (i32) i32[i] = (int32_t)x;
        else i64[i] = (int64_t)x;
        i++;
    }
    return 0;
}

int mt_train_state_get_placement(const char *dir, const char *txt, size_t len, int E, size_t n, int32_t **slots,
                                 int64_t **load) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    *slots = NULL, *load = NULL;
    cJSON *r = mt_json_parse(path, txt, len);
    if (!r) return -1;
    int rc = 0;
    if (cJSON_GetObjectItemCaseSensitive(r, "expert_slots")) {
        *slots = mt_xmalloc(sizeof(int32_t) * (n + 1));
        *load = mt_xcalloc(n + 1, sizeof(int64_t));
        rc = int_array(path, r, "expert_slots", n, *slots, NULL);
        if (rc == 0) rc = int_array(path, r, "expert_load_window", n, NULL, *load);
        for (size_t l = 0; rc == 0 && l < n / (size_t)E; l++) { /* each layer a permutation */
            unsigned char *seen = mt_xcalloc((size_t)E, 1);
            for (int e = 0; e < E && rc == 0; e++) {
                const int32_t s = (*slots)[l * (size_t)E + e];
                if (s >= E || seen[s]++)
                    rc = mt_error("%s: key expert_slots: layer %zu's slots are not a permutation of 0 .. %d", path, l,
                                  E - 1);
            }
            free(seen);
        }
        if (rc != 0) {
            free(*slots), free(*load);
            *slots = NULL, *load = NULL;
        }
    }
    cJSON_Delete(r);
    return rc;
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
