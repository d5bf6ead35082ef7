/* train/trainer.c — the training loop (see trainer.h). */
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
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
#include "kernels/ops.h"
#include "train/checkpoint.h"

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
}

double mt_lr_at(int s, int total, int warmup, double lr, double min_ratio) {
    if (warmup > 0 && s <= warmup) return lr * s / warmup;
    if (total <= warmup) return lr;
    double prog = (double)(s - warmup) / (double)(total - warmup);
    if (prog > 1) prog = 1;
    double minlr = lr * min_ratio;
    return minlr + 0.5 * (lr - minlr) * (1.0 + cos(M_PI * prog));
}

/* CE sum and count over micro-batches part, part+nparts, ... of the first `windows` windows */
static void eval_part(mt_model *m, mt_acts *a, const mt_loader *val, int B, int T, int64_t windows,
                      int32_t doc_eot, int part, int nparts, double *sum_out, int64_t *cnt_out) {
    uint64_t W = mt_loader_windows(val);
    if (windows <= 0 || (uint64_t)windows > W) windows = (int64_t)W;
    int32_t *in = mt_xmalloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *pos = doc_eot >= 0 ? mt_xmalloc(sizeof(int32_t) * (size_t)B * T) : NULL;
    double sum = 0;
    int64_t cnt = 0;
    mt_step_stats st;
    for (int64_t w0 = (int64_t)part * B; w0 < windows; w0 += (int64_t)nparts * B) {
        int nb = (int)(windows - w0 < B ? windows - w0 : B);
        for (int b = 0; b < nb; b++) mt_loader_window(val, (uint64_t)(w0 + b), in + (size_t)b * T, tg + (size_t)b * T);
        if (pos) mt_doc_positions(in, nb, T, doc_eot, pos);
        mt_model_step_pos(m, a, in, tg, pos, nb, T, 0, 0.0f, 0.0f, NULL, &st);
        sum += st.ce_sum;
        cnt += st.n_valid;
    }
    free(in);
    free(tg);
    free(pos);
    *sum_out = sum;
    *cnt_out = cnt;
}

double mt_eval_loss(mt_model *m, mt_acts *a, const mt_loader *val, int B, int T, int64_t windows,
                    int32_t doc_eot) {
    double sum;
    int64_t cnt;
    eval_part(m, a, val, B, T, windows, doc_eot, 0, 1, &sum, &cnt);
    return cnt ? sum / (double)cnt : 0.0;
}

/* The same split over the DP ranks (every rank holds the same parameters). */
static double eval_loss_dp(mt_dist *d, mt_model *m, mt_acts *a, const mt_loader *val, int B, int T,
                           int64_t windows, int32_t doc_eot) {
    if (d->dp_size == 1) return mt_eval_loss(m, a, val, B, T, windows, doc_eot);
    double sc[2];
    int64_t cnt;
    eval_part(m, a, val, B, T, windows, doc_eot, d->dp_rank, d->dp_size, &sc[0], &cnt);
    sc[1] = (double)cnt;
    mt_dist_allreduce_sum_f64(d, sc, 2);
    return sc[1] > 0 ? sc[0] / sc[1] : 0.0;
}

static void fmt_hms(char *buf, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Keeps the newest `keep` step_NNNNNNNN checkpoints of a run folder, removes the older ones. */
static void prune_checkpoints(const char *out, int keep) {
    DIR *dir = opendir(out);
    if (!dir) return;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "step_", 5) != 0 || strlen(e->d_name) != 13) continue;
        if (n == cap) names = mt_xrealloc(names, sizeof(char *) * (size_t)(cap = cap ? 2 * cap : 16));
        names[n++] = mt_xstrdup(e->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof(char *), cmp_names); /* zero-padded: name order = step order */
    for (int i = 0; i < n; i++) {
        if (i < n - keep) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", out, names[i]);
            if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) mt_warn("could not remove old checkpoint %s", path);
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

typedef struct {
    mt_model m;
    mt_acts *acts;
    mt_loader *train, *val;
    float *adam_m, *adam_v;       /* [opt_n]: all parameters, or this rank's shard with dist_opt */
    float *gshard;                /* dist_opt: this rank's shard of the summed gradient */
    size_t opt_lo, opt_n;         /* the optimizer's range of the flat parameter buffer */
    int opt_step;                 /* AdamW updates applied: the bias-correction step */
    int32_t *in, *tg, *pos;
    int nt;                       /* tensor table for the optimizer, clipped to its range and */
    size_t *t_off, *t_len;        /* relative to opt_lo */
    int *t_decay;
    FILE *metrics, *tsv;
} run_state;

static void run_free(run_state *r) {
    mt_acts_free(r->acts);
    mt_model_free(&r->m);
    if (r->train) mt_loader_free(r->train);
    if (r->val) mt_loader_free(r->val);
    mt_free(r->adam_m);
    mt_free(r->adam_v);
    mt_free(r->gshard);
    free(r->in);
    free(r->tg);
    free(r->pos);
    free(r->t_off);
    free(r->t_len);
    free(r->t_decay);
    if (r->metrics) fclose(r->metrics);
    if (r->tsv) fclose(r->tsv);
}

/* The optimizer's tensor table: the parts of the model's tensors inside [lo, lo+n), with
 * offsets relative to lo (weight decay stays per tensor). */
static void build_opt_table(run_state *r, size_t lo, size_t n) {
    r->t_off = mt_xmalloc(sizeof(size_t) * r->m.ntensors);
    r->t_len = mt_xmalloc(sizeof(size_t) * r->m.ntensors);
    r->t_decay = mt_xmalloc(sizeof(int) * r->m.ntensors);
    r->nt = 0;
    for (int i = 0; i < r->m.ntensors; i++) {
        const mt_tensor *t = &r->m.tensors[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < lo + n ? t->offset + t->numel : lo + n;
        if (a >= b) continue;
        r->t_off[r->nt] = a - lo;
        r->t_len[r->nt] = b - a;
        r->t_decay[r->nt] = t->decay;
        r->nt++;
    }
}

/* Rank 0 writes the checkpoint; with dist_opt every rank first sends its moments' shard
 * (collective: every rank calls this). */
static int save_checkpoint(const mt_train_opts *o, run_state *r, mt_dist *d, int step, uint64_t samples, int bad,
                           char *last_good, size_t cap) {
    char name[64], dir[4096];
    snprintf(name, sizeof name, "step_%08d", step);
    snprintf(dir, sizeof dir, "%s/%s", o->out, name);
    float *fm = r->adam_m, *fv = r->adam_v;
    if (o->dist_opt && d->dp_size > 1) {
        fm = d->dp_rank == 0 ? mt_alloc(r->m.nparams * sizeof(float)) : NULL;
        fv = d->dp_rank == 0 ? mt_alloc(r->m.nparams * sizeof(float)) : NULL;
        mt_dist_gather_shards(d, r->adam_m, r->m.nparams, fm);
        mt_dist_gather_shards(d, r->adam_v, r->m.nparams, fv);
    }
    int rc = 0;
    if (d->rank == 0) {
        char *st = state_to_json(o, step, r->opt_step, samples, bad, d->dp_size);
        rc = mt_ckpt_save(dir, &r->m, fm, fv, st);
        free(st);
        if (rc == 0) rc = mt_ckpt_set_latest(o->out, name);
    }
    if (fm != r->adam_m) {
        mt_free(fm);
        mt_free(fv);
    }
    if (rc != 0) return -1;
    snprintf(last_good, cap, "%s", dir);
    if (d->rank == 0 && o->keep > 0) prune_checkpoints(o->out, o->keep);
    return 0;
}

/* The start-up check of issue 3: same binary, flags and model config on every rank. */
static int check_ranks_agree(mt_dist *d, const mt_train_opts *o, const mt_config *cfg) {
    if (d->size == 1) return 0;
    char *cj = mt_config_to_json(cfg);
    uint64_t hc = XXH64(cj, strlen(cj), 0);
    free(cj);
    const struct { const char *what; uint64_t h; } items[] = {
        {"binary (/proc/self/exe)", mt_dist_hash_exe()}, {"command line", o->args_hash}, {"model config", hc}};
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
    const int D = d->dp_size, root = d->rank == 0;
    mt_set_threads(o.threads > 0 ? o.threads : mt_get_threads());
    const int nthr = mt_get_threads();

    /* configuration: resume > init > --config */
    char resume_out[4096];
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
    if (check_ranks_agree(d, &o, &cfg) != 0) return -1;
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
    /* the val split is optional; when it exists it must be readable */
    if (mt_loader_has_split(o.data, "val") && mt_loader_open(&r.val, o.data, "val", o.seq, o.seed) != 0) {
        run_free(&r);
        return -1;
    } else if (r.val && (int64_t)mt_loader_max_token(r.val) >= cfg.vocab_size) {
        run_free(&r);
        return mt_error("%s: validation token id does not fit vocab_size %d", o.data, cfg.vocab_size);
    }

    /* model and state; with dist_opt the moments exist only for this rank's shard */
    if (mt_model_init(&r.m, &cfg) != 0) { run_free(&r); return -1; }
    const size_t P = r.m.nparams;
    r.opt_lo = 0;
    r.opt_n = P;
    if (o.dist_opt) {
        size_t hi;
        mt_dist_shard(d, P, d->dp_rank, &r.opt_lo, &hi);
        r.opt_n = hi - r.opt_lo;
        r.gshard = mt_alloc((r.opt_n ? r.opt_n : 1) * sizeof(float));
    }
    r.adam_m = mt_alloc((r.opt_n ? r.opt_n : 1) * sizeof(float));
    r.adam_v = mt_alloc((r.opt_n ? r.opt_n : 1) * sizeof(float));
    const size_t opt_bytes = 2 * r.opt_n * sizeof(float);
    if (o.resume || o.init) {
        /* rank 0 reads the files, the others receive what they hold */
        if (root && mt_ckpt_load_weights(ckdir, &r.m) != 0) { run_free(&r); return -1; }
        mt_dist_bcast_f32(d, r.m.params, P);
    } else {
        float std = o.init_std > 0 ? (float)o.init_std
                                   : sqrtf(1.0f / (2.0f * cfg.hidden_size * cfg.num_hidden_layers));
        mt_model_init_weights(&r.m, o.seed, std); /* a pure function of the seed: same on every rank */
    }
    if (o.resume) {
        int sharded = o.dist_opt && D > 1;
        float *fm = r.adam_m, *fv = r.adam_v;
        if (sharded) {
            fm = root ? mt_alloc(P * sizeof(float)) : NULL;
            fv = root ? mt_alloc(P * sizeof(float)) : NULL;
        }
        int rc = root ? mt_ckpt_load_optimizer(ckdir, &r.m, fm, fv) : 0;
        if (rc == 0 && sharded) {
            mt_dist_scatter_shards(d, fm, P, r.adam_m);
            mt_dist_scatter_shards(d, fv, P, r.adam_v);
        } else if (rc == 0) {
            mt_dist_bcast_f32(d, r.adam_m, P);
            mt_dist_bcast_f32(d, r.adam_v, P);
        }
        if (sharded) {
            mt_free(fm);
            mt_free(fv);
        }
        if (rc != 0) { run_free(&r); return -1; }
    }
    const int policy = mt_recompute_parse(o.recompute ? o.recompute : "none");
    if (policy < 0) { run_free(&r); return -1; }
    r.acts = mt_acts_new_policy(&cfg, o.batch, o.seq, nthr, policy);
    build_opt_table(&r, r.opt_lo, r.opt_n);
    const size_t BT = (size_t)o.batch * o.seq;
    r.in = mt_xmalloc(sizeof(int32_t) * BT * o.accum);
    r.tg = mt_xmalloc(sizeof(int32_t) * BT * o.accum);
    if (o.doc_mode) r.pos = mt_xmalloc(sizeof(int32_t) * BT * o.accum);

    char path[4096];
    if (root) {
        if (o.metrics) snprintf(path, sizeof path, "%s", o.metrics);
        else snprintf(path, sizeof path, "%s/metrics.jsonl", o.out);
        r.metrics = fopen(path, start_step ? "a" : "w");
        if (!r.metrics) { run_free(&r); return mt_error("%s: cannot open metrics file", path); }
        snprintf(path, sizeof path, "%s/loss.tsv", o.out);
        r.tsv = fopen(path, start_step ? "a" : "w");
        if (!r.tsv) { run_free(&r); return mt_error("%s: cannot open", path); }
    }

    /* the GEMM peak of one rank (MFU denominator: DP x this) */
    /* the start-up measurement is low on a busy machine; --peak-gflops pins the denominator */
    if (o.profile) mt_trace_enable(d->rank, (size_t)(o.steps - start_step + 1) * (size_t)(cfg.num_hidden_layers * 4 + 16) * o.accum);
    const double peak = o.peak_gflops > 0 ? o.peak_gflops : root ? mt_gemm_gflops(1024, 0.3) : 0.0;
    const double flops_tok = mt_model_flops_per_token(&cfg, o.seq);
    const double act_params = mt_model_active_params(&cfg);
    const int n_moe = cfg.num_hidden_layers - (cfg.n_routed_experts > 0 ? cfg.first_k_dense_replace : cfg.num_hidden_layers);
    const size_t step_tokens = BT * o.accum * D;
    const size_t bucket_bytes = (size_t)(o.bucket_mb * 1048576.0);
    if (root && !o.quiet) {
        printf("moetrain train: %zu parameters (%.1fM active per token), %d layers (%d MoE), "
               "%d threads, BLAS kernel %s (%.0f GFLOP/s peak %s)\n",
               r.m.nparams, act_params / 1e6, cfg.num_hidden_layers, n_moe, nthr, mt_blas_corename(), peak,
               o.peak_gflops > 0 ? "given" : "measured");
        char dp[64] = "";
        if (D > 1) snprintf(dp, sizeof dp, " x DP %d", D);
        printf("  batch %d x seq %d x accum %d%s = %zu tokens/step, %d steps, lr %.2e warmup %d, "
               "activations %.1f MiB, data %llu train tokens%s\n",
               o.batch, o.seq, o.accum, dp, step_tokens, o.steps, o.lr, o.warmup,
               (double)mt_acts_bytes_policy(&cfg, o.batch, o.seq, nthr, policy) / 1048576.0,
               (unsigned long long)mt_loader_tokens(r.train), r.val ? "" : " (no val split)");
        if (D > 1)
            printf("  data parallel over %d ranks: %s\n", D,
                   o.dist_opt ? "distributed optimizer (gradients reduce-scattered, AdamW sharded, parameters all-gathered)"
                              : "gradients all-reduced");
        if (start_step) printf("  resumed from %s at step %d\n", ckdir, start_step);
    }
    /* rank 0's shard is the largest (shards differ by at most one element) */
    if (root && !o.quiet) {
        printf("  optimizer state per rank: %.2f MiB (AdamW moments%s)\n", (double)opt_bytes / 1048576.0,
               o.dist_opt && D > 1 ? ", sharded over DP" : "");
        fflush(stdout);
    }

    char last_good[4096] = "(none)";
    if (o.resume) snprintf(last_good, sizeof last_good, "%s", ckdir);
    int bad = 0, rc = 0;
    const double t_begin = mt_now();
    double t_timed = 0, tok_timed = 0, cpu_timed = 0, comm_timed = 0; /* excludes the first step (warm-up) */
    int steps_timed = 0;
    double ema_tps = 0;
    int64_t *load = n_moe > 0 ? mt_xmalloc(sizeof(int64_t) * (size_t)cfg.num_hidden_layers * cfg.n_routed_experts) : NULL;
    double *red = mt_xmalloc(sizeof(double) * (size_t)(cfg.num_hidden_layers + 1));
    for (int step = start_step + 1; step <= o.steps; step++) {
        double t0 = mt_now(), c0 = mt_cpu_time();
        d->comm_s = 0;
        mt_trace_reset_totals();
        mt_trace_begin("step");
        mt_trace_begin("data");
        /* micro-batch mb of rank r is micro-batch r*accum + mb of the global batch */
        for (int mb = 0; mb < o.accum; mb++)
            mt_loader_batch(r.train, samples + ((uint64_t)d->dp_rank * o.accum + mb) * o.batch, o.batch,
                            r.in + mb * BT, r.tg + mb * BT);
        int64_t nvalid = 0;
        for (size_t i = 0; i < BT * o.accum; i++) nvalid += r.tg[i] >= 0;
        mt_dist_allreduce_sum_i64(d, &nvalid, 1); /* the CE normaliser is that of the global batch */
        mt_trace_end();
        mt_trace_begin("compute.zero_grads");
        mt_model_zero_grads(&r.m);
        mt_trace_end();
        double ce_sum = 0, bal[256] = {0};
        mt_step_stats st;
        const float ce_scale = nvalid ? 1.0f / (float)nvalid : 0.0f;
        const float bal_scale = 1.0f / (float)(o.batch * o.accum * D);
        for (int mb = 0; mb < o.accum; mb++) {
            int32_t *pos = NULL;
            if (o.doc_mode) {
                pos = r.pos + mb * BT;
                mt_doc_positions(r.in + mb * BT, o.batch, o.seq, o.eot, pos);
            }
            mt_model_step_pos(&r.m, r.acts, r.in + mb * BT, r.tg + mb * BT, pos, o.batch, o.seq, 1, ce_scale,
                              bal_scale, NULL, &st);
            ce_sum += st.ce_sum;
            for (int l = 0; l < cfg.num_hidden_layers; l++) bal[l] += st.bal_sum[l];
        }
        if (D > 1) { /* loss terms of the global batch */
            red[0] = ce_sum;
            for (int l = 0; l < cfg.num_hidden_layers; l++) red[1 + l] = bal[l];
            mt_dist_allreduce_sum_f64(d, red, (size_t)cfg.num_hidden_layers + 1);
            ce_sum = red[0];
            for (int l = 0; l < cfg.num_hidden_layers; l++) bal[l] = red[1 + l];
        }
        /* gradients: summed over DP after the whole backward (overlapping the buckets with
         * the backward is a later optimisation); ZeRO-1 keeps only this rank's shard */
        double gnorm;
        mt_trace_begin("comm.gradients");
        if (o.dist_opt) mt_dist_reduce_scatter(d, r.m.grads, P, r.gshard);
        else mt_dist_grad_allreduce(d, r.m.grads, P, bucket_bytes);
        mt_trace_end();
        mt_trace_begin("optimizer.grad_norm");
        if (o.dist_opt) {
            double ss = mt_sumsq(r.gshard, r.opt_n);
            mt_dist_allreduce_sum_f64(d, &ss, 1);
            gnorm = sqrt(ss);
        } else {
            gnorm = sqrt(mt_sumsq(r.m.grads, P));
        }
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
            const float *g = o.dist_opt ? r.gshard : r.m.grads;
            mt_trace_begin("optimizer");
            mt_adamw_multi(r.m.params + r.opt_lo, g, r.adam_m, r.adam_v, r.nt, r.t_off, r.t_len, r.t_decay,
                           (float)lr, (float)o.beta1, (float)o.beta2, (float)o.eps, (float)o.wd, gscale,
                           ++r.opt_step);
            mt_trace_end();
            if (o.dist_opt) {
                mt_trace_begin("comm.params");
                mt_dist_allgather(d, r.m.params, P);
                mt_trace_end();
            }
        }
        mt_trace_end(); /* step */
        double dt = mt_now() - t0, comm = d->comm_s;
        if (o.profile && !o.quiet) {
            double cf = mt_trace_total("fwd."), cb = mt_trace_total("bwd."), cm = mt_trace_total("comm.");
            double op = mt_trace_total("optimizer"), da = mt_trace_total("data");
            printf("  profile rank %d step %d: forward %.3f s, backward %.3f s, communication %.3f s, "
                   "optimizer %.3f s, data %.3f s, other %.3f s\n", d->rank, step, cf, cb, cm, op, da,
                   dt - cf - cb - cm - op - da);
        }
        double wait = 1.0 - (mt_cpu_time() - c0) / (nthr * dt);
        if (wait < 0) wait = 0;
        double tps = (double)step_tokens / dt;
        if (step > start_step + 1) { cpu_timed += dt * (1.0 - wait); }
        if (step > start_step + 1) { t_timed += dt; tok_timed += (double)step_tokens; comm_timed += comm; steps_timed++; }
        ema_tps = ema_tps == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
        double mfu = root ? flops_tok * tps / (peak * D * 1e9) : 0.0;
        double elapsed = mt_now() - t_begin;
        double eta = (o.steps - step) * (elapsed / (step - start_step));
        double vloss = NAN;
        if (r.val && o.eval_every > 0 && (step % o.eval_every == 0 || step == o.steps))
            vloss = eval_loss_dp(d, &r.m, r.acts, r.val, o.batch, o.seq, o.eval_windows, o.doc_mode ? o.eot : -1);
        if (finite && root) {
            fprintf(r.metrics,
                    "{\"event\":\"step\",\"step\":%d,\"loss\":%.6f,\"ce\":%.6f,\"balance\":%.6f,\"lr\":%.6e,"
                    "\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,\"comm_s\":%.4f,\"elapsed\":%.2f",
                    step, loss, ce, bal_total, lr, gnorm, tps, mfu, wait, comm, elapsed);
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
            if (D > 1) printf("comm %.3fs | ", comm);
            printf("%s elapsed | ETA %s", el, et);
            if (!isnan(vloss)) printf(" | val %.4f", vloss);
            printf("\n");
            fflush(stdout);
        }
        if (o.load_every > 0 && n_moe > 0 && (step % o.load_every == 0 || step == o.steps)) {
            const int E = cfg.n_routed_experts;
            memcpy(load, mt_acts_load(r.acts), sizeof(int64_t) * (size_t)cfg.num_hidden_layers * E);
            mt_dist_allreduce_sum_i64(d, load, (size_t)cfg.num_hidden_layers * E); /* the global batch's load */
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
            mt_acts_reset_load(r.acts);
        }
        /* a checkpoint is written only after a finite step: it must be one to go back to */
        if (o.save_every > 0 && step % o.save_every == 0 && step != o.steps && bad == 0) {
            if (save_checkpoint(&o, &r, d, step, samples, bad, last_good, sizeof last_good) != 0) { rc = -1; break; }
        }
    }
    free(load);
    free(red);
    if (rc == 0 && bad > 0) {
        if (root) mt_warn("the last step was non-finite: no final checkpoint; last good checkpoint: %s", last_good);
    } else if (rc == 0) {
        int final_step = o.steps;
        if (save_checkpoint(&o, &r, d, final_step, samples, bad, last_good, sizeof last_good) != 0) rc = -1;
    }
    /* peak RSS of every rank, for the summary (the planner's memory model is per rank) */
    int64_t *rss_all = mt_xcalloc((size_t)d->size, sizeof(int64_t));
    if (rc == 0) {
        rss_all[d->rank] = (int64_t)mt_peak_rss();
        mt_dist_world_sum_i64(d, rss_all, (size_t)d->size);
    }
    if (rc == 0 && root) {
        double tps = t_timed > 0 ? tok_timed / t_timed : 0;
        double mfu = flops_tok * tps / (peak * D * 1e9);
        double wait = t_timed > 0 ? 1.0 - cpu_timed / t_timed : 0;
        double comm_share = t_timed > 0 ? comm_timed / t_timed : 0;
        size_t rss = mt_peak_rss();
        fprintf(r.metrics,
                "{\"event\":\"summary\",\"steps\":%d,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,\"peak_gflops\":%.1f,"
                "\"peak_rss_bytes\":%zu,\"dp\":%d,\"dist_opt\":%s,\"optimizer_bytes_per_rank\":%zu,\"comm_share\":%.4f,"
                "\"step_time_s\":%.6f,\"checkpoint\":\"%s\",\"peak_rss_bytes_per_rank\":[",
                o.steps, tps, mfu, wait, peak, rss, D, o.dist_opt ? "true" : "false", opt_bytes, comm_share,
                steps_timed > 0 ? t_timed / steps_timed : 0.0, last_good);
        for (int i = 0; i < d->size; i++) fprintf(r.metrics, "%s%lld", i ? "," : "", (long long)rss_all[i]);
        fprintf(r.metrics, "]}\n");
        if (!o.quiet) {
            char peaks[64];
            if (D > 1) snprintf(peaks, sizeof peaks, "%d x %.0f", D, peak);
            else snprintf(peaks, sizeof peaks, "%.0f", peak);
            printf("done: %.0f tok/s (steady state), MFU %.1f%% of %s GFLOP/s, threads waiting %.1f%%, peak RSS %.0f MiB",
                   tps, 100 * mfu, peaks, 100 * wait, (double)rss / 1048576.0);
            if (D > 1) printf(", communication %.1f%% of the step", 100 * comm_share);
            printf("\n  checkpoint %s\n  metrics    %s/metrics.jsonl\n", last_good, o.out);
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
