/* train/trainer.c — the trainer object (see trainer.h): set-up, steps, evaluation,
 * checkpoints. The run driver is train/run.c. */
#include "train/trainer.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/common.h"
#include "base/trace.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "train/balance.h"
#include "train/checkpoint.h"
#include "parallel/reshard.h"
#include "parallel/wire.h"
#include "train/saveload.h"
#include "train/trainer_impl.h"

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
    mt_model_forward(e->m, e->a, in, tg, pos, nb, T, 0, NULL, NULL, st);
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
    mt_pipe_eval(e->p, e->m, &e->d->pp, in, tg, pos, nb, T, NULL, st);
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

static void pull_load(mt_trainer *t);

/* L x E: a placement's or a load table's length */
static size_t nle_of(const mt_config *c) { return (size_t)mt_config_layers(c) * c->n_routed_experts; }

/* a copy of the model's expert placement (mt_model_slots) */
static int32_t *placement(const mt_trainer *t) {
    int32_t *s = mt_xmalloc(sizeof(int32_t) * (nle_of(&t->cfg) + 1));
    mt_model_slots(&t->m, s);
    return s;
}

/* the parameters whole again (ZeRO-1's deferred all-gather done): for anything but the
 * next step's forward, which waits layer by layer */
static void sync_params(mt_trainer *t) { mt_optim_params_ready(&t->opt, INT_MAX); }

/* the model's hooks (hook_ctx: the trainer): a layer's gradients are final / its weights
 * are about to be read */
static void grad_ready(void *ctx, int layer) {
    mt_trainer *t = ctx;
    mt_optim_layer_done(&t->opt, &t->m, layer);
}

static void params_ready(void *ctx, int layer) {
    mt_trainer *t = ctx;
    mt_optim_params_ready(&t->opt, layer);
}

static void trainer_release(mt_trainer *t) {
    sync_params(t);
    mt_pipe_free(&t->pipe);
    mt_model_free(&t->m);
    if (t->have_ep) mt_ep_free(&t->ep);
    mt_tp_free(&t->tp);
    free(t->full_t);
    if (t->train) mt_loader_free(t->train);
    if (t->val) mt_loader_free(t->val);
    mt_optim_free(&t->opt);
    mt_tokenizer_free(&t->tok);
    free(t->bounds);
    free(t->red);
    free(t->rep_load);
    free(t->bal_load);
    free(t->resume_slots);
    free(t);
}

void mt_trainer_free(mt_trainer *t) {
    if (t) trainer_release(t);
}

/* Resumes without --out continue writing into the run folder: the resumed path itself when
 * it is a run folder (it has `latest`), else the folder that holds the checkpoint. */
static void resume_out_dir(const char *resume, char *out, size_t cap) {
    snprintf(out, cap, "%s", resume);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') out[--len] = 0;
    char latest[4200];
    snprintf(latest, sizeof latest, "%s/latest", out);
    struct stat st; /* stat, not fopen: a FIFO named latest must not block */
    if (stat(latest, &st) != 0) {
        char *slash = strrchr(out, '/');
        if (slash && slash != out) *slash = 0;
        else if (slash) slash[1] = 0;
        else snprintf(out, cap, ".");
    }
}

/* The options alone and against the config (every rank finds the same). */
static int check_opts(const mt_train_opts *o, const mt_config *cfg) {
    if (o->batch < 1 || o->seq < 1 || o->accum < 1 || o->steps < 1)
        return mt_error("train: --batch, --seq, --accum and --steps must be positive");
    if (!(o->lr > 0) || !isfinite(o->lr)) return mt_error("train: --lr must be a positive finite number");
    if (!(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1)) return mt_error("train: --min-lr-ratio must be in [0, 1]");
    if (!(o->wd >= 0) || !isfinite(o->wd)) return mt_error("train: --wd must be a finite number >= 0");
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return mt_error("train: --beta1 and --beta2 must be in [0, 1)");
    if (!(o->clip >= 0) || !isfinite(o->clip)) return mt_error("train: --clip must be a finite number >= 0 (0 = off)");
    if (!(o->init_std >= 0) || !isfinite(o->init_std))
        return mt_error("train: --init-std must be a finite number >= 0 (0 = default)");
    if (o->init_scheme && strcmp(o->init_scheme, "default") != 0 && strcmp(o->init_scheme, "tiny") != 0)
        return mt_error("train: --init-scheme '%s': default or tiny", o->init_scheme);
    if (o->init_scheme && strcmp(o->init_scheme, "tiny") == 0 && cfg->tie_word_embeddings && !o->resume && !o->init)
        return mt_error("train: --init-scheme tiny draws the embedding with std %g, meant for an untied one: with key "
                        "tie_word_embeddings: true it would also be the head", MT_TINYINIT_EMBED_STD);
    if (!(o->bucket_mb > 0) || !isfinite(o->bucket_mb)) return mt_error("train: --bucket-mb must be a positive number");
    if (o->max_bad < 1) return mt_error("train: --max-bad-steps must be at least 1");
    if (!(o->peak_gflops >= 0) || !isfinite(o->peak_gflops))
        return mt_error("train: --peak-gflops must be a finite number >= 0 (0 = measure)");
    if (o->doc_mode && (o->eot < 0 || o->eot >= cfg->vocab_size))
        return mt_error("train: --eot %d is not a token id of the model (vocab_size %d)", o->eot, cfg->vocab_size);
    if (o->log_every < 1) return mt_error("train: --log-every must be at least 1");
    if (mt_gemm_bf16_check(o->bf16) != 0) return -1; /* --bf16 on a CPU without AVX512-BF16 */
    if (o->save_every < 0 || o->eval_every < 0 || o->load_every < 0 || o->keep < 0 || o->expert_balance < 0)
        return mt_error("train: --save-every, --eval-every, --load-every, --expert-balance and --keep must be >= 0");
    if (o->expert_balance > 0 && o->ep <= 1)
        return mt_error("train: --expert-balance places experts on the EP ranks: it needs --ep > 1");
    if (o->seq > cfg->max_position_embeddings)
        return mt_error("train: --seq %d exceeds max_position_embeddings %d of the config", o->seq,
                        cfg->max_position_embeddings);
    return 0;
}

/* --aux-scope: the enum mt_aux_scope, or -1 with an error naming the value */
static int aux_scope_parse(const mt_train_opts *o) {
    if (!o->aux_scope || strcmp(o->aux_scope, "sequence") == 0) return MT_AUX_SEQUENCE;
    if (strcmp(o->aux_scope, "ep-group") != 0)
        return mt_error("train: --aux-scope '%s': sequence or ep-group", o->aux_scope);
    if (o->external_batches) /* rows of their own lengths (RL): a per-row balance */
        return mt_error("rl: the balance loss's ep-group scope is for token windows (train) only");
    return MT_AUX_EP_GROUP;
}

/* The layout's constraints on the model. */
static int check_layout(const mt_train_opts *o, const mt_config *cfg) {
    const int Lh = cfg->num_hidden_layers;
    if (o->ep > 1 && cfg->n_routed_experts == 0)
        return mt_error("train: --ep %d: the model has no routed experts", o->ep);
    if (o->ep > 1 && cfg->n_routed_experts % o->ep != 0)
        return mt_error("train: --ep %d does not divide the %d routed experts", o->ep, cfg->n_routed_experts);
    if (o->tp > 1) {
        const int dense_layers = cfg->n_routed_experts > 0 ? cfg->first_k_dense_replace : Lh;
        if (cfg->num_attention_heads % o->tp || cfg->num_key_value_heads % o->tp)
            return mt_error("train: --tp %d does not divide the attention heads (%d) and key/value heads (%d)", o->tp,
                            cfg->num_attention_heads, cfg->num_key_value_heads);
        if (dense_layers > 0 && cfg->intermediate_size % o->tp)
            return mt_error("train: --tp %d does not divide intermediate_size %d of the dense FFN", o->tp,
                            cfg->intermediate_size);
        if (o->sp && o->seq % o->tp)
            return mt_error("train: --sp splits the tokens of a sequence over TP: --seq %d is not a multiple of "
                            "--tp %d", o->seq, o->tp);
    }
    if (o->vpp > 1 && o->accum % o->pp != 0)
        return mt_error("train: the interleaved schedule (--vpp %d) needs --accum (micro-batches, %d) to be a multiple "
                        "of --pp %d", o->vpp, o->accum, o->pp);
    return 0;
}

/* The tokenizer of the run: the data folder's (tokenizer.json beside the shards; none: the
 * byte tokenizer), else the checkpoint's. Data and a checkpoint must agree, a BPE's ids must
 * fit vocab_size, and document mode's end of text defaults to its end-of-text id. */
static int init_tokenizer(mt_trainer *t) {
    mt_train_opts *o = &t->o;
    const int has_ck = t->ckdir[0] != 0, has_data = o->data && !o->external_batches;
    mt_tokenizer ck;
    mt_tokenizer_byte(&ck);
    if (has_ck && mt_tokenizer_load_dir(&ck, t->ckdir) != 0) return -1;
    if (!has_data) {
        t->tok = ck;
    } else {
        char dir[4096];
        struct stat st;
        snprintf(dir, sizeof dir, "%s", o->data);
        if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) { /* a single .bin: its folder */
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
        }
        if (mt_tokenizer_load_dir(&t->tok, dir) != 0) { mt_tokenizer_free(&ck); return -1; }
        const int same = mt_tokenizer_same(&t->tok, &ck);
        char a[512], b[512];
        mt_tokenizer_describe(&t->tok, a, sizeof a);
        mt_tokenizer_describe(&ck, b, sizeof b);
        mt_tokenizer_free(&ck);
        if (has_ck && !same)
            return mt_error("train: the data %s was made with %s, checkpoint %s with %s: they must be the same "
                            "(tokenizer.json and tokenizer_config.json)", dir, a, t->ckdir, b);
    }
    if (t->tok.bpe && t->tok.vocab > t->cfg.vocab_size) { /* bytes: the loader checks the ids the data holds */
        char a[512];
        mt_tokenizer_describe(&t->tok, a, sizeof a);
        return mt_error("train: %s does not fit %s: key vocab_size: %d", a, t->cfg_path, t->cfg.vocab_size);
    }
    if (t->tok.bpe && !o->set_eot) o->eot = t->tok.eot;
    return 0;
}

/* The layout, the config (resume > init > --config) and the options in force. */
static int init_config(mt_trainer *t) {
    mt_train_opts *o = &t->o;
    mt_dist *d = t->d;
    /* the layout first: the DP size decides how a resumed run's global batch is split */
    if (o->vpp < 1) return mt_error("train: --vpp must be >= 1 (model chunks per pipeline rank)");
    if (o->vpp > 1 && o->pp < 2) return mt_error("train: --vpp %d needs --pp >= 2 (chunks of a pipeline)", o->vpp);
    if (o->sp && o->tp < 2) return mt_error("train: --sp (sequence parallelism) needs --tp >= 2");
    if (mt_dist_set_layout(d, o->pp, o->tp, o->sp, o->ep) != 0) return -1;
    const int root = d->rank == 0;
    t->a2a_mode = MT_A2A_HIER;
    if (o->a2a && strcmp(o->a2a, "flat") == 0) t->a2a_mode = MT_A2A_FLAT;
    else if (o->a2a && strcmp(o->a2a, "hier") != 0)
        return mt_error("train: --a2a '%s': flat or hier", o->a2a);
    if (o->ranks_per_node < 0) return mt_error("train: --ranks-per-node must be >= 0 (0 = real nodes)");
    const int flash = o->flashcomm && strcmp(o->flashcomm, "int8") == 0;
    if (o->flashcomm && !flash && strcmp(o->flashcomm, "off") != 0)
        return mt_error("train: --flashcomm '%s': int8 or off", o->flashcomm);
    if (flash && (o->tp < 2 || o->sp))
        return mt_error("train: --flashcomm int8 compresses the tensor-parallel all-reduce: it needs --tp >= 2 "
                        "without --sp");
    t->flash_ep = o->flashcomm_ep && strcmp(o->flashcomm_ep, "int8") == 0;
    if (o->flashcomm_ep && !t->flash_ep && strcmp(o->flashcomm_ep, "off") != 0)
        return mt_error("train: --flashcomm-ep '%s': int8 or off", o->flashcomm_ep);
    if (t->flash_ep && o->ep < 2)
        return mt_error("train: --flashcomm-ep int8 compresses the expert dispatch: it needs --ep >= 2");
    if (o->ep < 2 && (o->a2a || (o->ranks_per_node && !o->wire)) && root)
        mt_warn("--a2a and --ranks-per-node shape the expert all-to-all; without --ep > 1 they have no effect");
    t->overlap = MT_OVERLAP_BLOCK;
    if (o->overlap && strcmp(o->overlap, "off") == 0) t->overlap = MT_OVERLAP_OFF;
    else if (o->overlap && strcmp(o->overlap, "pipe") == 0) t->overlap = MT_OVERLAP_PIPE;
    else if (o->overlap && strcmp(o->overlap, "block") != 0)
        return mt_error("train: --overlap '%s': pipe, block or off", o->overlap);
    if (t->overlap == MT_OVERLAP_PIPE) {
        if (o->accum < 2)
            return mt_error("train: --overlap pipe pairs the forward of one micro-batch with the backward of the "
                            "previous one: it needs --accum >= 2");
    }
    if (o->wire) {
        double bw, lat;
        if (mt_wire_parse(o->wire, &bw, &lat) != 0) return -1;
        if (o->ranks_per_node < 1)
            return mt_error("train: --wire delays the traffic between emulated nodes: it needs --ranks-per-node N");
        if (d->local_size != d->size)
            return mt_error("train: --wire emulates nodes on one machine (one clock for every rank): the %d ranks "
                            "run on several machines",
                            d->size);
        /* TP's blocking collectives do not go over the wire: a TP group stays inside a node,
         * as the planner lays them out */
        if (o->tp > 1 && o->ranks_per_node % o->tp != 0)
            return mt_error("train: --wire: TP groups of %d ranks would span the emulated nodes (--ranks-per-node "
                            "%d); TP stays inside a node: make --ranks-per-node a multiple of --tp",
                            o->tp, o->ranks_per_node);
        mt_wire_set(bw, lat);
        /* the gradient buckets of a group that spans emulated nodes go over the wire too, and
         * the pipeline's activations and gradients between stages on different nodes */
        mt_group *wired[] = {&d->dp, &d->dpt, &d->edp, &d->pp};
        for (int i = 0; i < 4; i++) mt_group_set_nodes(wired[i], o->ranks_per_node);
    }
    mt_set_threads(o->threads > 0 ? o->threads : mt_get_threads());
    t->nthr = mt_get_threads();

    char *ckdir = t->ckdir;
    const size_t ckcap = sizeof t->ckdir;
    if (o->resume && o->init)
        return mt_error("train: --resume continues a run, --init starts a new one from weights: give one of them");
    if ((o->resume || o->init) && (o->init_std > 0 || o->init_scheme) && root)
        mt_warn("--init-std and --init-scheme have no effect with --%s: the weights come from the checkpoint",
                o->resume ? "resume" : "init");
    char *st = NULL; /* a resumed run's trainer_state.json */
    size_t stlen = 0;
    if (o->resume) {
        if (mt_ckpt_resolve(o->resume, ckdir, ckcap) != 0) return -1;
        if (o->config && root)
            mt_warn("--resume given: --config is ignored, the model config comes from %s/config.json", ckdir);
        if (!o->out) {
            resume_out_dir(o->resume, t->out, sizeof t->out);
            o->out = t->out;
        }
        if (root && mt_ckpt_verify(ckdir, 1) != 0) return -1; /* rank 0 reads the big files */
        if (mt_ckpt_load_config(ckdir, &t->cfg) != 0) return -1;
        if (mt_ckpt_load_state(ckdir, &st, &stlen) != 0) return -1;
        if (mt_train_state_from_json(ckdir, st, stlen, o, &t->st, d->dp_size) != 0) {
            free(st);
            return -1;
        }
    } else if (o->init) {
        if (mt_ckpt_resolve(o->init, ckdir, ckcap) != 0) return -1;
        if (root && mt_ckpt_verify(ckdir, 0) != 0) return -1;
        if (mt_ckpt_load_config(ckdir, &t->cfg) != 0) return -1;
        if (o->config && root) mt_warn("--init given: the model config comes from %s/config.json", ckdir);
    } else {
        if (!o->config) return mt_error("train: --config FILE is required (or --resume / --init)");
        if (mt_config_load(&t->cfg, o->config) != 0) return -1;
    }
    t->start_step = t->st.step;
    if (o->resume || o->init) snprintf(t->cfg_path, sizeof t->cfg_path, "%s/config.json", ckdir);
    else snprintf(t->cfg_path, sizeof t->cfg_path, "%s", o->config);
    /* mt_model_check before anything is sized per layer */
    if (check_ranks_agree(d, o, &t->cfg, ckdir) != 0 || mt_model_check(&t->cfg, t->cfg_path) != 0) {
        free(st);
        return -1;
    }
    if (st) { /* --expert-balance's placement and window: the run goes on from them */
        const int E = t->cfg.n_routed_experts;
        const int rc = E > 0 ? mt_train_state_get_placement(ckdir, st, stlen, E, nle_of(&t->cfg), &t->resume_slots,
                                                            &t->bal_load)
                             : 0;
        free(st);
        if (rc != 0) return -1;
    }
    if (init_tokenizer(t) != 0) return -1;
    /* a resumed run's --expert-balance, under a layout without EP: nothing to place */
    if (o->resume && !o->set_expert_balance && o->expert_balance > 0 && o->ep <= 1) {
        if (root) mt_warn("--expert-balance %d of the resumed run is off: this layout has no --ep", o->expert_balance);
        o->expert_balance = 0;
    }
    if (check_opts(o, &t->cfg) != 0) return -1;
    if (o->warmup < 0) o->warmup = o->steps / 10 < 100 ? o->steps / 10 : 100;
    if (t->st.step >= o->steps)
        return mt_error("train: checkpoint %s is at step %d, nothing to do for --steps %d", ckdir, t->st.step,
                        o->steps);
    if (!o->out) return mt_error("train: --out DIR is required");
    if (root && mt_mkdir_p(o->out) != 0) return -1;
    return 0;
}

/* Every token id of the data is a row of the embedding; the error names the shard and the key. */
static int check_vocab(const mt_loader *L, const mt_config *cfg, const char *cfg_path) {
    const uint32_t maxtok = mt_loader_max_token(L);
    if ((int64_t)maxtok < cfg->vocab_size) return 0;
    return mt_error("%s: token id %u does not fit %s: key vocab_size: %d", mt_loader_max_token_file(L), maxtok,
                    cfg_path, cfg->vocab_size);
}

/* The data (every rank reads the shards; the run driver samples each rank's micro-batches). */
static int init_data(mt_trainer *t) {
    const mt_train_opts *o = &t->o;
    const mt_config *cfg = &t->cfg;
    if (o->external_batches) return 0;
    if (!o->data) return mt_error("train: --data DIR is required");
    if (mt_loader_open(&t->train, o->data, "train", o->seq, o->seed) != 0) return -1;
    if (check_vocab(t->train, cfg, t->cfg_path) != 0) return -1;
    /* the val split is optional and only matters with --eval-every; when used it must be
     * readable (every rank decides alike: their data agree, check_ranks_agree) */
    if (o->eval_every > 0 && !mt_loader_has_split(o->data, "val")) {
        if (t->d->rank == 0)
            mt_warn("--eval-every %d: %s has no validation shards (files named *val*.bin): no validation loss "
                    "is computed", o->eval_every, o->data);
        return 0;
    }
    if (o->eval_every > 0 && mt_loader_open(&t->val, o->data, "val", o->seq, o->seed) != 0) return -1;
    return t->val ? check_vocab(t->val, cfg, t->cfg_path) : 0;
}

/* A chunk's activation arena (model/acts.c's size function). Past 2^31 tokens a micro-batch
 * is refused anyway, and the exact sum could overflow: then the arena of one sequence plus
 * what each further one adds (the arena grows linearly with the rows). */
static double chunk_acts_bytes(const mt_config *c, int lo, int hi, int first, int last, int B, int T, int nthr,
                               int policy, int tp, int sp, int bf16) {
    const int kv16 = mt_attention_bf16(bf16, c->head_dim);
    if ((int64_t)B * T <= INT_MAX)
        return (double)mt_acts_bytes_chunk(c, lo, hi, first, last, B, T, nthr, policy, tp, sp, kv16);
    const double a1 = (double)mt_acts_bytes_chunk(c, lo, hi, first, last, 1, T, nthr, policy, tp, sp, kv16);
    const double a2 = (double)mt_acts_bytes_chunk(c, lo, hi, first, last, 2, T, nthr, policy, tp, sp, kv16);
    return a1 + (B - 1.0) * (a2 - a1);
}

/* Refuses, before anything is allocated, a run whose buffers cannot fit: a lower bound of
 * this rank's need (weights, gradients and moments of its part; one arena per chunk, which
 * 1F1B may hold several times; the step's micro-batch tokens and the pipeline schedule)
 * against the memory the machine has now. Lower bound: what it refuses would fail anyway,
 * with an abort in the allocator instead of this line. */
static int check_memory(const mt_trainer *t, const mt_part *sh, int policy) {
    const mt_train_opts *o = &t->o;
    const mt_config *cfg = &t->cfg;
    const mt_dist *d = t->d;
    const int S = o->pp * o->vpp, K = cfg->num_experts_per_tok > 1 ? cfg->num_experts_per_tok : 1;
    size_t np = 0, ntp = 0, ndense = 0;
    mt_model_layout_part(cfg, sh, NULL, &np, &ntp, &ndense);
    const double P = (double)np, model = 8 * P + (o->dist_opt ? 8 * P / d->dp_size : 8 * P);
    double acts = 0;
    for (int ch = 0; ch < o->vpp; ch++) {
        const int s = ch * o->pp + d->pp_rank;
        acts += chunk_acts_bytes(cfg, t->bounds[s], t->bounds[s + 1], s == 0, s == S - 1, o->batch, o->seq, t->nthr,
                                 policy, o->tp, d->sp, o->bf16);
    }
    const double tokens = (double)o->accum * o->batch * o->seq, step = tokens * 4 * (o->doc_mode ? 3 : 2) +
                          (double)o->pp * ((double)o->accum * o->vpp * 6 + 1) * sizeof(mt_action);
    const double need = model + acts + step, have = mt_mem_available(), gib = 1073741824.0;
    const char *cmd = o->external_batches ? "rl" : "train";
    if (have > 0 && need > have) {
        char what[256];
        if (acts >= step && acts >= model)
            snprintf(what, sizeof what, "--batch %d x --seq %d needs ~%.1f GiB of activations", o->batch, o->seq,
                     acts / gib);
        else if (step >= model)
            snprintf(what, sizeof what, "--accum %d x --batch %d x --seq %d needs ~%.1f GiB for the step's tokens and "
                     "schedule", o->accum, o->batch, o->seq, step / gib);
        else
            snprintf(what, sizeof what, "the model's %zu parameters on this rank need ~%.1f GiB (weights, gradients, "
                     "AdamW moments)", np, model / gib);
        if (o->external_batches) /* rl: the trainer's shape comes from its own flags */
            return mt_error("rl: the trainer's %d micro-batches of %d rows x %d positions need ~%.1f GiB, this machine "
                            "has %.1f GiB available (fewer --prompts-per-step or --group, a shorter --max-new)",
                            o->accum, o->batch, o->seq, need / gib, have / gib);
        return mt_error("%s: %s (%.1f GiB in all), this machine has %.1f GiB available", cmd, what, need / gib,
                        have / gib);
    }
    /* the trainer indexes a micro-batch's tokens (x experts) and the schedule with int */
    if ((double)o->batch * o->seq * K > INT_MAX || (double)o->accum * o->vpp * 6 > INT_MAX)
        return mt_error("%s: --batch %d x --seq %d (x %d experts per token) or --accum %d x --vpp %d is too large "
                        "(over 2^31 entries)", cmd, o->batch, o->seq, K, o->accum, o->vpp);
    return 0;
}

/* This rank's part of the model, its optimizer state (with dist_opt the moments exist only
 * for this rank's shards), its weights and the pipeline. */
static int init_model(mt_trainer *t) {
    const mt_train_opts *o = &t->o;
    const mt_config *cfg = &t->cfg;
    mt_dist *d = t->d;
    const int S = o->pp * o->vpp;
    if (check_layout(o, cfg) != 0) return -1;
    t->bounds = mt_xmalloc(sizeof(int) * ((size_t)S + 1));
    if (stage_bounds(o->split, cfg->num_hidden_layers, S, t->bounds) != 0) return -1;
    mt_part sh;
    memset(&sh, 0, sizeof sh);
    sh.ep_rank = d->ep_rank;
    sh.ep_size = o->ep;
    for (int c = 0; c < o->vpp; c++) {
        int st = c * o->pp + d->pp_rank;
        for (int l = t->bounds[st]; l < t->bounds[st + 1]; l++) sh.layer[l] = 1;
    }
    sh.embed = d->pp_rank == 0;
    sh.head = d->pp_rank == o->pp - 1;
    /* the MTP blocks run after the head, on its stage */
    for (int k = 0; sh.head && k < cfg->num_nextn_predict_layers; k++) sh.layer[cfg->num_hidden_layers + k] = 1;
    sh.tp_rank = d->tp_rank;
    sh.tp_size = o->tp;
    sh.sp = d->sp;
    /* the experts' placement on the EP ranks; checkpoints stay logical, so any placement
     * resumes any other */
    mt_expert_map map;
    memset(&map, 0, sizeof map);
    if (t->resume_slots && o->ep <= 1) { /* one rank holds every expert: nothing to keep */
        free(t->resume_slots);
        t->resume_slots = NULL;
    }
    if (t->resume_slots && cfg->n_routed_experts > 0) { /* where --expert-balance left them */
        sh.slot_of = t->resume_slots;
    } else if (o->expert_placement && cfg->n_routed_experts > 0) {
        if (mt_expert_map_parse(&map, cfg, o->expert_placement) != 0) return -1;
        if (strcmp(o->expert_placement, "contiguous") != 0) sh.slot_of = map.slot_of;
    }
    const int policy = mt_recompute_parse(o->recompute ? o->recompute : "none");
    const int aux_scope = aux_scope_parse(o);
    if (policy < 0 || aux_scope < 0 || check_memory(t, &sh, policy) != 0) return -1;
    if (o->tp > 1) mt_tp_init(&t->tp, &d->tp, d->sp, o->flashcomm && strcmp(o->flashcomm, "int8") == 0);
    if (o->ep > 1) {
        if (mt_ep_init(&t->ep, d->ep.comm, o->ranks_per_node, t->a2a_mode,
                        t->overlap != MT_OVERLAP_OFF) != 0) return -1;
        t->have_ep = 1;
        t->ep.a2a.q8 = t->flash_ep;
    }
    const int rc = mt_model_init_part(&t->m, cfg, &sh, t->have_ep ? &t->ep.ops : NULL, o->tp > 1 ? &t->tp.ops : NULL);
    mt_expert_map_free(&map); /* the model keeps its own copy */
    if (rc != 0) return -1;
    t->m.aux_scope = aux_scope;
    t->nfull_t = mt_model_layout(cfg, NULL, NULL);
    t->full_t = mt_xcalloc((size_t)t->nfull_t, sizeof(mt_tensor));
    mt_model_layout(cfg, t->full_t, &t->nfull);
    /* a shuffled placement orders the experts unlike the checkpoint: then the tensors move
     * one by one (the sharded path) even in one process */
    t->whole = t->m.nparams == t->nfull && o->tp == 1 && o->pp == 1 && o->ep == 1 && !t->m.slot_of;
    mt_optim_init(&t->opt, &t->m, d, o->dist_opt);
    const char *inflight = getenv("MT_BUCKET_INFLIGHT_MB"); /* train/optimizer.h */
    if (inflight) {
        char *end;
        const double mb = strtod(inflight, &end);
        if (end == inflight || *end || !(mb > 0 && mb <= 1048576))
            return mt_error("MT_BUCKET_INFLIGHT_MB=%s: the MiB of gradient all-reduces in flight, > 0", inflight);
        t->opt.inflight_max = (size_t)(mb * 1048576.0);
    }
    if (o->resume || o->init) {
        const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
        if (mt_ckpt_load_dist(&l, d, t->ckdir, cfg, o->resume != NULL, o->allow_nonfinite) != 0) return -1;
    } else {
        float std = o->init_std > 0 ? (float)o->init_std
                                    : sqrtf(1.0f / (2.0f * cfg->hidden_size * cfg->num_hidden_layers));
        /* TinyInit (Pangu Ultra): the matrices' std as by default, the embedding's a constant */
        const int tiny = o->init_scheme && strcmp(o->init_scheme, "tiny") == 0;
        /* keyed by the whole model's tensor index: any layout */
        mt_model_init_weights_embed(&t->m, o->seed, std, tiny ? (float)MT_TINYINIT_EMBED_STD : std);
    }
    if (mt_pipe_init(&t->pipe, cfg, o->pp, o->vpp, o->accum, d->pp_rank, t->bounds, o->batch, o->seq, t->nthr, policy,
                     o->tp, d->sp, o->bf16, t->overlap == MT_OVERLAP_PIPE) != 0)
        return -1;
    if (o->rows_fwd)
        for (int i = 0; i < t->pipe.V * t->pipe.maxslot; i++)
            if (t->pipe.slot[i]) mt_acts_fwd_rows(t->pipe.slot[i], 1);
    if (t->overlap != MT_OVERLAP_OFF) { /* buckets start as the last micro-batch's backward finishes their layers */
        t->pipe.grad_ready = grad_ready;
        t->m.hook_ctx = t;
        if (o->dist_opt) t->m.params_ready = params_ready;
        t->opt.defer_params = o->dist_opt;
    }
    /* the fullest rank's optimizer state, for the report */
    uint64_t ob = t->opt.bytes;
    mt_group_max_u64(&d->all, &ob, 1);
    t->opt_bytes = (size_t)ob;
    t->bucket_bytes = (size_t)(o->bucket_mb * 1048576.0);
    t->red = mt_xmalloc(sizeof(double) * (size_t)(1 + mt_config_layers(cfg) + cfg->num_nextn_predict_layers));
    const size_t nle = nle_of(cfg);
    t->rep_load = mt_xcalloc(nle + 1, sizeof(int64_t));
    if (o->expert_balance > 0 && !t->bal_load) t->bal_load = mt_xcalloc(nle + 1, sizeof(int64_t));
    if (o->expert_balance == 0) { /* turned off on resume: no window */
        free(t->bal_load);
        t->bal_load = NULL;
    }
    return 0;
}

int mt_trainer_init(mt_trainer **out, const mt_train_opts *o) {
    mt_trainer *t = mt_xcalloc(1, sizeof *t);
    *out = NULL;
    t->o = *o;
    t->d = mt_dist_get();
    if (init_config(t) != 0 || init_data(t) != 0 || init_model(t) != 0) {
        trainer_release(t);
        return -1;
    }
    *out = t;
    return 0;
}

const mt_train_opts *mt_trainer_opts(const mt_trainer *t) { return &t->o; }
const mt_config *mt_trainer_config(const mt_trainer *t) { return &t->cfg; }
const mt_trainer_state *mt_trainer_get_state(const mt_trainer *t) { return &t->st; }
mt_model *mt_trainer_model(mt_trainer *t) {
    sync_params(t);
    return &t->m;
}
int mt_trainer_holds_whole(const mt_trainer *t) { return t->whole; }

void mt_trainer_gather_whole(mt_trainer *t, float *full) {
    sync_params(t);
    const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
    mt_ckpt_allgather_whole(&l, t->d, full);
}

void mt_trainer_gather_whole_root(mt_trainer *t, float *full) {
    sync_params(t);
    const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
    mt_ckpt_gather_whole(&l, t->d, full);
}

size_t mt_trainer_whole_floats(const mt_trainer *t) { return t->nfull; }

void mt_trainer_to_rollout(mt_trainer *t, float *full) {
    sync_params(t);
    /* parked before the copy is filled, so that the two never add up */
    mt_pipe_park(&t->pipe);
    mt_release_pages(t->m.grads, t->m.nparams * sizeof(float)); /* the next step zeroes them anyway */
    mt_trainer_gather_whole(t, full);
    if (!t->whole) mt_release_pages(t->m.params, t->m.nparams * sizeof(float));
}

void mt_trainer_to_rollout_part(mt_trainer *t, mt_model *roll) {
    sync_params(t);
    mt_pipe_park(&t->pipe);
    mt_release_pages(t->m.grads, t->m.nparams * sizeof(float));
    const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
    mt_ckpt_allgather_part(&l, t->d, roll, roll->params);
}

int mt_trainer_load_params(mt_trainer *t, const char *ckpt, float *buf) {
    sync_params(t);
    char dir[4200];
    mt_config c;
    if (mt_ckpt_resolve(ckpt, dir, sizeof dir) != 0 || mt_ckpt_load_config(dir, &c) != 0) return -1;
    char *a = mt_config_to_json(&c), *b = mt_config_to_json(&t->cfg);
    const int same = strcmp(a, b) == 0;
    free(a), free(b);
    if (!same) return mt_error("%s: its config is not the model's: its weights cannot be loaded into this run", dir);
    float *own = mt_model_use_params(&t->m, buf); /* the load writes through the model's views */
    const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
    const int rc = mt_ckpt_load_dist(&l, t->d, dir, &t->cfg, 0, t->o.allow_nonfinite);
    mt_model_use_params(&t->m, own);
    return rc;
}

void mt_trainer_from_rollout(mt_trainer *t, const float *full) {
    sync_params(t);
    if (t->whole) return;
    mt_reshard_extract(t->full_t, full, &t->m, t->m.params);
}

int mt_trainer_step(mt_trainer *t, const mt_batch *b, mt_step_result *r) {
    const mt_train_opts *o = &t->o;
    const mt_config *cfg = &t->cfg;
    mt_dist *d = t->d;
    const int D = d->dp_size, W = d->size, L = mt_config_layers(cfg), nm = cfg->num_nextn_predict_layers;
    if (b->n_micro != o->accum || b->B != o->batch || b->T != o->seq || (o->doc_mode && !b->pos))
        return mt_error("train: a step takes %d micro-batches of %d x %d tokens%s (the pipeline's shape), not %d of "
                        "%d x %d", o->accum, o->batch, o->seq, o->doc_mode ? " with positions" : "", b->n_micro, b->B,
                        b->T);
    const size_t BT = (size_t)b->B * b->T;
    const int step = t->st.step + 1;
    int64_t nvalid = 0;
    for (size_t i = 0; i < BT * b->n_micro; i++) nvalid += b->tg[i] >= 0;
    mt_group_sum_i64(&d->dp, &nvalid, 1); /* the CE normaliser is that of the global batch */
    /* the MTP blocks' own normalisers, for token windows (an RL objective trains the main head only) */
    const int mtp = nm > 0 && !b->obj;
    int64_t mnv[MT_MAX_MTP] = {0};
    float mscale[MT_MAX_MTP] = {0};
    if (mtp) {
        for (int k = 1; k <= nm; k++) mnv[k - 1] = mt_mtp_valid(b->tg, b->B * b->n_micro, b->T, k);
        mt_group_sum_i64(&d->dp, mnv, (size_t)nm);
        mt_mtp_scales(cfg, mnv, mscale);
    }
    mt_trace_begin("compute.zero_grads");
    mt_model_zero_grads(&t->m);
    mt_trace_end();
    mt_optim_reduce_start(&t->opt, &t->m, t->bucket_bytes);
    mt_step_stats st;
    memset(&st, 0, sizeof st);
    const float ce_scale = nvalid ? 1.0f / (float)nvalid : 0.0f;
    int64_t rows = (int64_t)b->B * b->n_micro * D;
    if (b->fed) { /* the rows that hold a sequence, over the global batch */
        rows = 0;
        for (int i = 0; i < b->B * b->n_micro; i++) rows += b->fed[i] > 0;
        mt_group_sum_i64(&d->dp, &rows, 1);
    }
    const float bal_scale = rows > 0 ? 1.0f / (float)rows : 0.0f;
    const mt_loss spec = {ce_scale, b->obj, b->fed, b->replay, b->replay_stride, mtp ? mscale : NULL, NULL};
    mt_pipe_train(&t->pipe, &t->m, &d->pp, b->in, b->tg, b->pos, b->B, b->T, &spec, bal_scale, &st);
    /* counted once: the balance terms are the same on every TP rank, and without SP so is CE;
     * with SP the ep-group scope's terms are each rank's share of its tokens' sequences */
    const int bal_all = d->sp && t->m.aux_scope == MT_AUX_EP_GROUP;
    const int ce_once = d->sp || d->tp_rank == 0;
    double ce_sum = ce_once ? st.ce_sum : 0.0, bal[256], mce[MT_MAX_MTP];
    for (int l = 0; l < L; l++) bal[l] = bal_all || d->tp_rank == 0 ? st.bal_sum[l] : 0.0;
    for (int k = 0; k < nm; k++) mce[k] = ce_once ? st.mtp_ce_sum[k] : 0.0;
    if (W > 1) { /* loss terms of the global batch: CE on the last stages, balance where each layer is */
        t->red[0] = ce_sum;
        for (int l = 0; l < L; l++) t->red[1 + l] = bal[l];
        for (int k = 0; k < nm; k++) t->red[1 + L + k] = mce[k];
        /* the first collective over every rank after the schedule: a stage that finished
         * early waits here for the pipeline to drain (part of the bubble) */
        mt_trace_begin("comm.pipeline.flush");
        mt_group_sum_f64(&d->all, t->red, (size_t)(1 + L + nm));
        mt_trace_end();
        ce_sum = t->red[0];
        for (int l = 0; l < L; l++) bal[l] = t->red[1 + l];
        for (int k = 0; k < nm; k++) mce[k] = t->red[1 + L + k];
    }
    /* every rank is past its last expert exchange: the sends left pending are done, and
     * their buffers go now rather than at the next step's first exchange */
    if (t->have_ep) mt_a2a_flush(&t->ep.a2a);
    mt_optim_reduce(&t->opt, &t->m, d);
    const double gnorm = mt_optim_grad_norm(&t->opt, &t->m, d);
    double ce = nvalid ? ce_sum / (double)nvalid : 0.0, bal_total = 0;
    for (int l = 0; l < L; l++) bal_total += bal[l] * bal_scale;
    double mtp_ce = 0;
    for (int k = 0; mtp && k < nm; k++) mtp_ce += (mnv[k] ? mce[k] / (double)mnv[k] : 0.0) / nm;
    const double loss = ce + cfg->mtp_loss_weight * mtp_ce + cfg->aux_loss_alpha * bal_total;
    const double lr = mt_lr_at(step, o->steps, o->warmup, o->lr, o->min_lr_ratio);
    t->st.step = step;
    t->st.samples += (uint64_t)b->B * b->n_micro * D;
    /* loss and norm are global, so every rank takes the same decision */
    const int finite = isfinite(loss) && isfinite(gnorm);
    if (!finite) {
        t->st.bad++;
    } else {
        t->st.bad = 0;
        const mt_adamw_hp hp = {o->beta1, o->beta2, o->eps, o->wd, o->clip};
        mt_optim_update(&t->opt, &t->m, &hp, lr, gnorm, ++t->st.opt_step);
    }
    *r = (mt_step_result){.step = step, .loss = loss, .ce = ce, .balance = bal_total, .mtp = mtp_ce, .grad_norm = gnorm, .lr = lr,
                          .finite = finite, .n_valid = nvalid, .tokens = BT * b->n_micro * D};
    return 0;
}

int mt_trainer_logprobs(mt_trainer *t, const mt_batch *b) {
    const mt_train_opts *o = &t->o;
    if (!b->obj || b->n_micro != o->accum || b->B != o->batch || b->T != o->seq)
        return mt_error("train: log-probs take an objective and %d micro-batches of %d x %d tokens", o->accum, o->batch,
                        o->seq);
    const size_t BT = (size_t)b->B * b->T;
    const mt_loss all = {0.0f, b->obj, b->fed, b->replay, b->replay_stride, NULL, NULL};
    for (int mb = 0; mb < b->n_micro; mb++) {
        mt_head_obj obj;
        const mt_loss loss = mt_loss_micro(&all, mb, b->B, b->T, &obj);
        mt_step_stats st;
        memset(&st, 0, sizeof st);
        mt_pipe_eval(&t->pipe, &t->m, &t->d->pp, b->in + mb * BT, b->tg + mb * BT, b->pos ? b->pos + mb * BT : NULL,
                     b->B, b->T, &loss, &st);
    }
    return 0;
}

double mt_trainer_eval(mt_trainer *t, const mt_loader *val, int64_t windows) {
    return eval_loss_pipe(t->d, &t->pipe, &t->m, val, t->o.batch, t->o.seq, windows, t->o.doc_mode ? t->o.eot : -1);
}

int mt_trainer_save(mt_trainer *t, char *saved, size_t cap) {
    sync_params(t);
    const mt_train_opts *o = &t->o;
    mt_dist *d = t->d;
    const int root = d->rank == 0;
    char name[64], dir[4096];
    snprintf(name, sizeof name, "step_%08d", t->st.step);
    snprintf(dir, sizeof dir, "%s/%s", o->out, name);
    const mt_ckpt_layout l = {&t->m, &t->opt, t->full_t, t->nfull_t, t->nfull, t->whole};
    /* --expert-balance: the placement and the window so far (all of it: pulled) */
    int32_t *slots = t->bal_load ? placement(t) : NULL;
    if (t->bal_load) pull_load(t);
    char *state = root ? mt_train_state_to_json(o, &t->st, d->dp_size, slots, t->bal_load, nle_of(&t->cfg)) : NULL;
    free(slots);
    int rc = mt_ckpt_save_dist(&l, d, dir, state, &t->tok);
    free(state);
    if (root && rc == 0) rc = mt_ckpt_set_latest(o->out, name);
    if (rc != 0) return -1;
    snprintf(saved, cap, "%s", dir);
    if (root && o->keep > 0) mt_ckpt_prune(o->out, o->keep, name);
    return 0;
}

/* the expert load counted since the last pull, over the global batch, added to the report's
 * and the balance's counts (collective over all ranks) */
static void pull_load(mt_trainer *t) {
    const mt_config *cfg = &t->cfg;
    const size_t n = nle_of(cfg);
    int64_t *load = mt_xcalloc(n + 1, sizeof(int64_t));
    /* without SP the TP ranks route the same tokens */
    if (t->d->sp || t->d->tp_rank == 0) mt_pipe_load(&t->pipe, cfg, load);
    /* the global batch's load: each layer counted by the stage that holds it, over DP */
    mt_group_sum_i64(&t->d->all, load, n);
    mt_pipe_reset_load(&t->pipe);
    for (size_t i = 0; i < n; i++) {
        t->rep_load[i] += load[i];
        if (t->bal_load) t->bal_load[i] += load[i];
    }
    free(load);
}

void mt_trainer_expert_load(mt_trainer *t, int64_t *load) {
    const size_t n = nle_of(&t->cfg);
    pull_load(t);
    memcpy(load, t->rep_load, sizeof(int64_t) * n);
    memset(t->rep_load, 0, sizeof(int64_t) * n);
}

void mt_trainer_balance(mt_trainer *t, mt_balance_stats *bs) {
    const mt_config *cfg = &t->cfg;
    const int E = cfg->n_routed_experts, L = mt_config_layers(cfg), P = t->o.ep;
    const size_t n = (size_t)L * E;
    MT_ASSERT(t->bal_load && P > 1);
    pull_load(t);
    int32_t *cur = placement(t), *nxt = placement(t);
    double b0 = 0, b1 = 0, mean = 0;
    memset(bs, 0, sizeof *bs);
    unsigned char changed[256] = {0};
    for (int l = 0; l < L; l++) {
        if (!mt_config_is_moe(cfg, l)) continue;
        double x0, x1, mn;
        const size_t o = (size_t)l * E;
        const int mv = mt_balance_layer(t->bal_load + o, cur + o, E, P, nxt + o, &x0, &x1, &mn);
        bs->moved += mv;
        changed[l] = mv > 0;
        b0 += x0, b1 += x1, mean += mn;
    }
    bs->busy_before = mean > 0 ? b0 / mean : 1.0;
    bs->busy_after = mean > 0 ? b1 / mean : 1.0;
    if (bs->moved > 0) {
        /* the gradients are zeroed before the next step: the weights and moments move. ZeRO-1
         * shards the moments by position, across the experts' slots: the routed experts'
         * region is made whole for the move (all-gathered: the region's moments once more,
         * unsharded, meanwhile) and sharded again */
        const double t0 = mt_now(), c0 = t->d->comm_s;
        mt_trace_begin("comm.expert_balance");
        sync_params(t);
        const int xr = MT_OPT_REGIONS - 1; /* the routed experts' region: [n_dense, nparams) */
        MT_ASSERT(t->opt.reg[xr].lo == t->m.n_dense && t->opt.reg[xr].n == t->m.nparams - t->m.n_dense);
        float *fm = NULL, *fv = NULL;
        if (t->o.dist_opt) {
            fm = mt_alloc(sizeof(float) * (t->opt.reg[xr].n + 1));
            fv = mt_alloc(sizeof(float) * (t->opt.reg[xr].n + 1));
            mt_optim_region_full(&t->opt, xr, fm, fv);
        }
        float *const arr[3] = {t->m.params, fm ? fm : t->opt.mom_m, fv ? fv : t->opt.mom_v};
        const size_t lo[3] = {0, fm ? t->m.n_dense : 0, fm ? t->m.n_dense : 0};
        for (int l = 0; l < L; l++)
            if (changed[l] && t->m.part.layer[l])
                mt_balance_move(&t->m, arr, lo, 3, t->d->ep.comm, t->d->ep_rank, P, t->ep.a2a.node_of, l,
                                cur + (size_t)l * E, nxt + (size_t)l * E);
        if (fm) {
            mt_optim_region_take(&t->opt, xr, fm, fv);
            mt_free(fm);
            mt_free(fv);
        }
        mt_trace_end();
        mt_model_set_placement(&t->m, nxt);
        t->d->comm_s = c0 + (mt_now() - t0); /* all of it, once (the all-gathers count themselves) */
    }
    memset(t->bal_load, 0, sizeof(int64_t) * n);
    free(cur);
    free(nxt);
}

double mt_trainer_ep_imbalance(mt_trainer *t) {
    if (!t->have_ep) return 1.0;
    double x = mt_ep_imbalance(&t->ep);
    mt_group_max_f64(&t->d->all, &x, 1);
    return x;
}
