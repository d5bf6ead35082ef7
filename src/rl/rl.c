/* rl/rl.c — the GRPO loop (see rl.h). */
#include "rl/rl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/trace.h"
#include "base/json.h"
#include "data/prompts.h"
#include "parallel/dist.h"
#include "parallel/ep.h"
#include "parallel/tp.h"
#include "kernels/blas.h"
#include "rl/advantage.h"
#include "rl/dump.h"
#include "train/checkpoint.h"
#include "rl/grpo.h"
#include "rl/reward.h"
#include "rl/rollout.h"
#include "rl/share.h"

void mt_rl_defaults(mt_rl_opts *o) {
    memset(o, 0, sizeof *o);
    mt_train_defaults(&o->train);
    o->train.steps = 50;
    o->train.lr = 1e-4;
    o->train.min_lr_ratio = 1.0; /* a constant rate after the warmup */
    o->train.warmup = 0;
    o->train.wd = 0.0;
    o->task = "math";
    o->group = 8;
    o->prompts_per_step = 16;
    o->max_new = 16;
    o->slots = 64;
    o->temperature = 1.0;
    o->top_p = 1.0;
    o->eps_low = o->eps_high = 0.2;
    o->is_cap = 5.0;
    o->agg = "token-mean";
    o->eval_n = 200;
}

/* The run's RL settings, written at its start to OUT/rl_settings.json so that --resume
 * continues with the same ones (the trainer's own are in each checkpoint). */
static char *settings_json(const mt_rl_opts *o) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "init", o->train.init ? o->train.init : "");
    cJSON_AddStringToObject(r, "prompts", o->prompts);
    if (o->eval_prompts) cJSON_AddStringToObject(r, "eval_prompts", o->eval_prompts);
    cJSON_AddStringToObject(r, "task", o->task);
    cJSON_AddStringToObject(r, "agg", o->agg);
    const struct { const char *k; double v; } nums[] = {
        {"group", o->group}, {"prompts_per_step", o->prompts_per_step}, {"micro_batch", o->micro_batch},
        {"max_new", o->max_new}, {"top_k", o->top_k}, {"slots", o->slots}, {"temperature", o->temperature},
        {"top_p", o->top_p}, {"eps_low", o->eps_low}, {"eps_high", o->eps_high}, {"is_cap", o->is_cap},
        {"format_penalty", o->format_penalty}, {"no_scale", o->no_scale}, {"drop_uniform", o->drop_uniform},
        {"eval_every", o->eval_every}, {"eval_n", o->eval_n}, {"beta", o->beta}, {"routing_replay", o->routing_replay},
        {"max_staleness", o->max_staleness}, {"stale_free", o->stale_free}, {"no_is_weight", o->no_is_weight}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) cJSON_AddNumberToObject(r, nums[i].k, nums[i].v);
    char *txt = cJSON_Print(r);
    cJSON_Delete(r);
    return txt;
}

/* The fields of rl_settings.json into o, each checked as the flag it came from would be
 * (type, integer-ness, range), the error naming the file and the key. */
static int settings_read(const char *p, const cJSON *r, mt_rl_opts *o) {
    if (!cJSON_IsObject(r)) return mt_error("%s: top level is not a JSON object", p);
    const char *const strs[] = {"prompts", "task", "agg"};
    for (size_t i = 0; i < 3; i++)
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, strs[i])))
            return mt_error("%s: key %s: missing or not a string", p, strs[i]);
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(r, "eval_prompts");
    if (ep && !cJSON_IsString(ep)) return mt_error("%s: key eval_prompts: not a string", p);
    o->prompts = cJSON_GetObjectItemCaseSensitive(r, "prompts")->valuestring;
    o->task = cJSON_GetObjectItemCaseSensitive(r, "task")->valuestring;
    o->agg = cJSON_GetObjectItemCaseSensitive(r, "agg")->valuestring;
    o->eval_prompts = ep ? ep->valuestring : NULL;
    const double IM = INT_MAX, FM = FLT_MAX, E1 = nextafter(1.0, 0.0);
    const struct { const char *k; int *i; double *d; double lo, hi; const char *range; int optional; } nums[] = {
        {"group", &o->group, NULL, 2, IM, "2 .. 2147483647", 0},
        {"prompts_per_step", &o->prompts_per_step, NULL, 1, IM, "1 .. 2147483647", 0},
        {"micro_batch", &o->micro_batch, NULL, 0, IM, "0 .. 2147483647", 0},
        {"max_new", &o->max_new, NULL, 1, IM, "1 .. 2147483647", 0},
        {"top_k", &o->top_k, NULL, 0, IM, "0 .. 2147483647", 0},
        {"slots", &o->slots, NULL, 1, IM, "1 .. 2147483647", 0},
        {"temperature", NULL, &o->temperature, 0, FM, "0 .. 3.4e38", 0},
        {"top_p", NULL, &o->top_p, DBL_MIN, 1, "0 < top_p <= 1", 0},
        {"eps_low", NULL, &o->eps_low, 0, E1, "0 <= eps_low < 1", 0},
        {"eps_high", NULL, &o->eps_high, 0, FM, "0 .. 3.4e38", 0},
        {"is_cap", NULL, &o->is_cap, 1, FM, "1 .. 3.4e38", 0},
        {"format_penalty", NULL, &o->format_penalty, -FM, FM, "a float", 0},
        {"no_scale", &o->no_scale, NULL, 0, 1, "0 or 1", 0},
        {"drop_uniform", &o->drop_uniform, NULL, 0, 1, "0 or 1", 0},
        {"eval_every", &o->eval_every, NULL, 0, IM, "0 .. 2147483647", 0},
        {"eval_n", &o->eval_n, NULL, 0, IM, "0 .. 2147483647", 0},
        {"beta", NULL, &o->beta, 0, FM, "0 .. 3.4e38", 0},
        {"routing_replay", &o->routing_replay, NULL, 0, 1, "0 or 1", 0},
        /* optional: runs written before StaleSync have none */
        {"max_staleness", &o->max_staleness, NULL, 0, IM, "0 .. 2147483647", 1},
        {"stale_free", &o->stale_free, NULL, 0, 1, "0 or 1", 1},
        {"no_is_weight", &o->no_is_weight, NULL, 0, 1, "0 or 1", 1}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        double v;
        const int got = mt_json_number(p, r, nums[i].k, nums[i].i != NULL, nums[i].lo, nums[i].hi, nums[i].range, &v);
        if (got < 0) return -1;
        if (got == 0 && !nums[i].optional) return mt_error("%s: key %s: required key is missing", p, nums[i].k);
        if (got == 0) continue;
        if (nums[i].i) *nums[i].i = (int)v;
        else *nums[i].d = v;
    }
    return 0;
}

/* Reads the settings of the run that holds checkpoint ck (its folder or the one above it)
 * into o; the strings stay in *keep (free it). */
static int settings_load(const char *ck, mt_rl_opts *o, cJSON **keep) {
    char p[4300], *txt = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/rl_settings.json", ck);
    if (mt_read_file(p, &txt, &len) != 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", ck);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0;
        else snprintf(dir, sizeof dir, ".");
        snprintf(p, sizeof p, "%s/rl_settings.json", dir);
        if (mt_read_file(p, &txt, &len) != 0)
            return mt_error("rl: --resume %s: no rl_settings.json next to it or in its run folder (not an rl run?)", ck);
    }
    cJSON *r = mt_json_parse(p, txt, len);
    free(txt);
    if (!r) return -1;
    if (settings_read(p, r, o) != 0) {
        cJSON_Delete(r);
        return -1;
    }
    *keep = r;
    return 0;
}

/* all[W][n] (world rank order) -> out[DP][n]: world rank w = (pp x DP + dp) x TP + tp holds
 * DP index dp's records; a value missing on one rank (NaN: a log-prob whose head ran
 * elsewhere) is taken from another. */
static void merge_records(const double *all, double *out, size_t n, int W, int TP, int DP) {
    for (size_t i = 0; i < n * (size_t)DP; i++) out[i] = NAN;
    for (int w = 0; w < W; w++) {
        double *o = out + n * (size_t)((w / TP) % DP);
        const double *a = all + n * (size_t)w;
        for (size_t i = 0; i < n; i++)
            if (isnan(o[i]) && !isnan(a[i])) o[i] = a[i];
    }
}

/* The switch back: the trainer's part from the rollout copy, whose pages are then given
 * back until the next switch. */
static void back_to_training(mt_trainer *t, mt_model *roll) {
    if (!roll->ep && !roll->tp) mt_trainer_from_rollout(t, roll->params); /* a part: the trainer kept its own */
    mt_release_pages(roll->params, roll->nparams * sizeof(float));
}

/* The switch to the rollout copy: a whole one, or (--rollout-ep, --rollout-tp) this rank's part. */
static void to_rollout(mt_trainer *t, mt_model *roll) {
    if (roll->ep || roll->tp) mt_trainer_to_rollout_part(t, roll);
    else mt_trainer_to_rollout(t, roll->params);
}

/* --profile: this rank's trace as OUT/trace_rank<job rank>.json. */
static void write_trace(const mt_rl_opts *o) {
    if (!o->profile) return;
    const mt_dist *d = mt_dist_get();
    char tp[4200];
    snprintf(tp, sizeof tp, "%s/trace_rank%d.json", o->train.out, d->job.size > 1 ? d->job.rank : d->rank);
    if (mt_trace_write(tp) != 0) mt_warn("%s", mt_last_error());
    else if (d->job.size > 1 ? d->job.rank == 0 : d->rank == 0) {
        if (!o->train.quiet) printf("  trace      %s (one per rank)\n", tp);
    }
}

int mt_rl(const mt_rl_opts *opt) {
    mt_rl_opts o = *opt;
    mt_dist *d = mt_dist_get();
    const int root = d->rank == 0;
    cJSON *kept = NULL;
    const char *ref_init = o.train.init; /* the frozen reference of --beta: the run's start weights */
    const int resumed = o.train.resume != NULL;
    if (resumed) {
        if (o.train.init) return mt_error("rl: --resume continues an rl run, --init starts one: give one of them");
        char ck[4200];
        if (mt_ckpt_resolve(o.train.resume, ck, sizeof ck) != 0) return -1;
        if (settings_load(ck, &o, &kept) != 0) return -1;
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(kept, "init");
        ref_init = cJSON_IsString(in) ? in->valuestring : "";
        if (o.beta > 0 && !*ref_init) {
            cJSON_Delete(kept);
            return mt_error("rl: --resume with --beta %g: rl_settings.json names no init checkpoint (the frozen "
                            "reference)", o.beta);
        }
    } else if (!o.train.init) {
        return mt_error("rl: --init CKPT is required (the policy to start from)");
    }
    if (!o.prompts) return mt_error("rl: --prompts FILE (or --data DIR with math_prompts_train.tsv) is required");
    if (o.group < 2) return mt_error("rl: --group %d: GRPO needs at least 2 completions per prompt", o.group);
    if (o.prompts_per_step < 1 || o.max_new < 1 || o.slots < 1 || o.micro_batch < 0 || o.eval_n < 0 ||
        o.eval_every < 0)
        return mt_error("rl: --prompts-per-step, --max-new and --slots must be >= 1, --micro-batch, --eval-n and "
                        "--eval-every >= 0");
    if (!(o.temperature >= 0) || !(o.top_p > 0 && o.top_p <= 1) || o.top_k < 0)
        return mt_error("rl: need --temperature >= 0, 0 < --top-p <= 1, --top-k >= 0");
    if (!(o.eps_low >= 0 && o.eps_low < 1) || !(o.eps_high >= 0) || !(o.is_cap >= 1) || !isfinite(o.eps_high) ||
        !isfinite(o.is_cap))
        return mt_error("rl: need 0 <= --eps-low < 1, --eps-high >= 0 and --is-cap >= 1 (finite)");
    if (strcmp(o.task, "math") != 0) return mt_error("rl: --task '%s': only math is built in", o.task);
    if (!(o.beta >= 0) || !isfinite(o.beta)) return mt_error("rl: --beta must be a finite number >= 0");
    if (o.routing_replay && o.dump_rollouts)
        return mt_error("rl: --dump-rollouts does not record the routing yet: it cannot be combined with "
                        "--routing-replay");
    if (o.max_staleness < 0) return mt_error("rl: --max-staleness must be >= 0 (0 = synchronous)");
    if (o.stale_free && o.rollout_ranks <= 0)
        return mt_error("rl: --stale-free needs --rollout-ranks (co-located, the newest version is always the one "
                        "the rollout has)");
    if (o.no_is_weight && o.dump_rollouts)
        return mt_error("rl: --dump-rollouts records the loss of RL.md's importance weight: it cannot be combined with "
                        "--no-is-weight");
    const int agg = mt_grpo_agg_parse(o.agg);
    if (agg < 0) return -1;
    const int sep = o.rollout_ranks > 0, R = o.rollout_ranks;
    if (o.rollout_ranks < 0) return mt_error("rl: --rollout-ranks must be >= 0 (0 = rollout on every rank)");
    if (sep && (d->job.size < 2 || R >= d->job.size))
        return mt_error("rl: --rollout-ranks %d leaves no rank to train (the job has %d)", R, d->job.size);
    if (sep && o.prompts_per_step % R != 0)
        return mt_error("rl: --prompts-per-step %d is not a multiple of --rollout-ranks %d", o.prompts_per_step, R);
    /* separate deployment: the last R ranks roll out, the others (job rank 0 first) train */
    const int rollout_lead = d->job.size - R, rollout_role = sep && d->job.rank >= rollout_lead;
    if (sep && mt_dist_set_role(d, rollout_role) != 0) return -1;
    if (o.profile) mt_trace_enable(d->job.size > 1 ? d->job.rank : d->rank, (size_t)1 << 20);
    const int Nr = o.rollout_ep > 0 ? o.rollout_ep : 1; /* the rollout's EP group */
    if (o.rollout_ep < 0) return mt_error("rl: --rollout-ep must be >= 1");
    if (Nr > 1 && sep)
        return mt_error("rl: --rollout-ep is the co-located rollout's layout: it cannot be given with --rollout-ranks");
    if (Nr > 1 && d->size % Nr != 0)
        return mt_error("rl: --rollout-ep %d does not divide the %d ranks", Nr, d->size);
    const int Nt = o.rollout_tp > 0 ? o.rollout_tp : 1; /* the rollout's TP group */
    if (o.rollout_tp < 0) return mt_error("rl: --rollout-tp must be >= 1");
    if (Nt > 1 && sep)
        return mt_error("rl: --rollout-tp is the co-located rollout's layout: it cannot be given with --rollout-ranks");
    if (Nt > 1 && Nr > 1) return mt_error("rl: --rollout-tp and --rollout-ep cannot be combined yet: give one of them");
    if (Nt > 1 && d->size % Nt != 0) return mt_error("rl: --rollout-tp %d does not divide the %d ranks", Nt, d->size);
    if (Nt > 1 && o.train.ranks_per_node > 0 && o.train.ranks_per_node % Nt != 0)
        return mt_error("rl: --rollout-tp %d: TP groups would span the emulated nodes (--ranks-per-node %d); make "
                        "--ranks-per-node a multiple of --rollout-tp", Nt, o.train.ranks_per_node);
    const int split = !sep && (o.train.pp > 1 || o.train.tp > 1 || o.train.ep > 1 || Nr > 1 || Nt > 1);
    /* co-located: every rank samples its share (from a whole copy when training splits the
     * model); separate: the trainer's ranks sample nothing */
    const int D = d->size;
    if (o.dump_grads && D > 1)
        return mt_error("rl: --dump-grads writes one process's gradient buffer: run it without mpirun (the rollout "
                        "dump works under any number of ranks)");
    if (o.dump_rollouts && root && mt_mkdir_p(o.dump_rollouts) != 0) mt_dist_abort(mt_last_error());
    if (!sep && o.prompts_per_step % D != 0)
        return mt_error("rl: --prompts-per-step %d is not a multiple of the %d ranks (each rolls out an equal share)",
                        o.prompts_per_step, D);
    mt_prompt_set ps, ev;
    memset(&ev, 0, sizeof ev);
    if (mt_prompts_load(o.prompts, MT_PROMPTS_MATH, &ps) != 0) return -1;
    if (o.eval_prompts && mt_prompts_load(o.eval_prompts, MT_PROMPTS_MATH, &ev) != 0) {
        mt_prompts_free(&ps);
        return -1;
    }
    /* the policy's tokenizer (its checkpoint's tokenizer.json, else bytes) encodes the
     * prompts and judges the completions */
    mt_tokenizer tk;
    mt_tokenizer_byte(&tk);
    char tkdir[4200];
    if (mt_ckpt_resolve(resumed ? o.train.resume : o.train.init, tkdir, sizeof tkdir) != 0 ||
        mt_tokenizer_load_dir(&tk, tkdir) != 0 || mt_prompts_encode(&ps, o.prompts, &tk) != 0 ||
        (ev.n > 0 && mt_prompts_encode(&ev, o.eval_prompts, &tk) != 0)) {
        mt_tokenizer_free(&tk), mt_prompts_free(&ps), mt_prompts_free(&ev);
        return -1;
    }
    if (o.speculative) { /* refused before the ranks take their roles */
        mt_config cc;
        int bad = mt_ckpt_load_config(tkdir, &cc) != 0;
        if (!bad && cc.num_nextn_predict_layers < 1)
            bad = mt_error("rl: --speculative drafts with the model's MTP block: %s/config.json has none "
                           "(num_nextn_predict_layers 0)", tkdir) != 0;
        if (bad) {
            mt_tokenizer_free(&tk), mt_prompts_free(&ps), mt_prompts_free(&ev);
            return -1;
        }
    }
    mt_reward reward;
    if (mt_reward_init(&reward, o.task, (float)o.format_penalty, &tk) != 0) {
        mt_tokenizer_free(&tk), mt_prompts_free(&ps), mt_prompts_free(&ev);
        return -1;
    }
    /* the trainer's shape: rows = the completions of this rank's DP index (world = PP x DP x
     * TP; a layout that does not divide is refused by mt_trainer_init), positions = the
     * longest row */
    const int Dt = D % (o.train.pp * o.train.tp) == 0 ? D / (o.train.pp * o.train.tp) : 1;
    if ((int64_t)(o.prompts_per_step / Dt) * o.group > INT_MAX) { /* the rank's completions are counted in int */
        mt_reward_free(&reward), mt_prompts_free(&ps), mt_prompts_free(&ev), mt_tokenizer_free(&tk);
        return mt_error("rl: --prompts-per-step %d x --group %d completions per rank is too large", o.prompts_per_step,
                        o.group);
    }
    const int Pl = o.prompts_per_step / Dt, rows = Pl * o.group, Pr = o.prompts_per_step / D;
    size_t longest = 0;
    for (size_t i = 0; i < ps.n; i++) longest = mt_prompt_len(&ps, i) > longest ? mt_prompt_len(&ps, i) : longest;
    if (rollout_role) {
        const int src = mt_rl_rollout_server(&o, d, &ps, &ev, longest);
        if (src == 0) write_trace(&o);
        mt_reward_free(&reward), mt_prompts_free(&ps), mt_prompts_free(&ev), mt_tokenizer_free(&tk);
        cJSON_Delete(kept);
        return src;
    }
    if (sep && o.prompts_per_step % Dt != 0)
        return mt_error("rl: --prompts-per-step %d is not a multiple of the trainer's %d data-parallel ranks",
                        o.prompts_per_step, Dt);
    const int B = o.micro_batch > 0 ? (o.micro_batch < rows ? o.micro_batch : rows) : (rows < 64 ? rows : 64);
    mt_train_opts *to = &o.train;
    to->external_batches = 1;
    to->batch = B;
    to->accum = (rows + B - 1) / B;
    to->seq = (int)longest + o.max_new - 1;
    to->eval_every = 0;
    to->rows_fwd = 1; /* the trainer's log-probs with the decoder's products: logp_old = logp_behav on-policy */
    mt_trainer *t = NULL;
    if (mt_trainer_init(&t, to) != 0) {
        mt_reward_free(&reward), mt_prompts_free(&ps), mt_prompts_free(&ev);
        return -1;
    }
    const mt_train_opts *ti = mt_trainer_opts(t);
    mt_model *m = mt_trainer_model(t);
    /* RL Fusion: when training splits the model, each rank rolls out from a whole copy that
     * the switch fills from the parts and that gives its pages back while the trainer runs */
    mt_model roll;
    memset(&roll, 0, sizeof roll);
    mt_ep rep; /* --rollout-ep: the rollout copy's expert exchange, over groups of Nr consecutive ranks */
    MPI_Comm rep_comm = MPI_COMM_NULL;
    mt_tp rtp; /* --rollout-tp: the rollout copy's TP collectives, over groups of Nt consecutive ranks */
    mt_group rtg = {.comm = MPI_COMM_NULL};
    if (split && Nr > 1) {
        const mt_config *rc = mt_trainer_config(t);
        if (rc->n_routed_experts == 0 || rc->n_routed_experts % Nr != 0)
            mt_dist_abort(rc->n_routed_experts == 0 ? "rl: --rollout-ep splits the routed experts: this model has none"
                                                    : "rl: --rollout-ep must divide the routed experts (n_routed_experts)");
        MPI_Comm_split(d->all.comm, d->rank / Nr, d->rank, &rep_comm);
        const mt_a2a_mode mode = ti->a2a && strcmp(ti->a2a, "flat") == 0 ? MT_A2A_FLAT : MT_A2A_HIER;
        if (mt_ep_init(&rep, rep_comm, ti->ranks_per_node, mode, 0) != 0) mt_dist_abort(mt_last_error());
        mt_part sh;
        mt_part_whole(&sh, rc);
        sh.ep_rank = d->rank % Nr, sh.ep_size = Nr;
        if (mt_model_init_infer_part(&roll, rc, &sh, &rep.ops, NULL) != 0) mt_dist_abort(mt_last_error());
    } else if (split && Nt > 1) {
        const mt_config *rc = mt_trainer_config(t);
        const int dense = rc->n_routed_experts > 0 ? rc->first_k_dense_replace : rc->num_hidden_layers;
        if (rc->num_attention_heads % Nt || rc->num_key_value_heads % Nt || (dense > 0 && rc->intermediate_size % Nt)) {
            mt_error("rl: --rollout-tp %d does not divide the attention heads (%d), key/value heads (%d) and the dense "
                     "FFN's intermediate_size (%d)", Nt, rc->num_attention_heads, rc->num_key_value_heads,
                     rc->intermediate_size);
            mt_dist_abort(mt_last_error());
        }
        MPI_Comm_split(d->all.comm, d->rank / Nt, d->rank, &rtg.comm);
        MPI_Comm_rank(rtg.comm, &rtg.rank);
        MPI_Comm_size(rtg.comm, &rtg.size);
        mt_tp_init(&rtp, &rtg, 0, 0);
        mt_part sh;
        mt_part_whole(&sh, rc);
        sh.tp_rank = rtg.rank, sh.tp_size = Nt;
        if (mt_model_init_infer_part(&roll, rc, &sh, NULL, &rtp.ops) != 0) mt_dist_abort(mt_last_error());
    } else if (split && mt_model_init_infer(&roll, mt_trainer_config(t)) != 0) {
        mt_dist_abort(mt_last_error());
    }
    mt_model *rm = split ? &roll : m;
    /* the copy whose experts are all local sums a token's expert rows as the other layout's
     * exchange does: the rollout's log-probs then have the trainer's bits */
    if (split && m->ep && !rm->ep) mt_model_sum_like(rm, m);
    else if (split && rm->ep && !m->ep) mt_model_sum_like(m, rm);
    /* separate: the trainer's rank 0 tells the rollout ranks where the run starts, then the
     * weights and the completions flow through the link (rl/share.h) */
    const int start = mt_trainer_get_state(t)->step;
    if (sep && d->rank == 0) {
        const uint64_t plan[4] = {(uint64_t)start, (uint64_t)ti->steps, ti->seed, (uint64_t)ti->bf16};
        mt_group_send_bytes(&d->job, plan, sizeof plan, rollout_lead, MT_RL_TAG_PLAN);
        mt_rl_send_sum_order(d, m, rollout_lead);
    }
    mt_rl_link *link = sep ? mt_rl_link_init(t, d, &o, rollout_lead) : NULL;
    mt_grpo_loss L;
    mt_grpo_loss_defaults(&L);
    L.eps_low = o.eps_low, L.eps_high = o.eps_high, L.is_cap = o.is_cap, L.temperature = o.temperature;
    L.agg = agg, L.max_new = o.max_new, L.beta = o.beta, L.no_is_weight = o.no_is_weight;
    /* the frozen reference: the weights the run starts from */
    float *ref = NULL;
    if (o.beta > 0) {
        ref = mt_try_alloc(sizeof(float) * (m->nparams + 1));
        if (!ref) mt_dist_abort("rl: no memory for the reference copy of the weights (--beta)");
        if (!resumed) memcpy(ref, m->params, sizeof(float) * m->nparams);
        else if (mt_trainer_load_params(t, ref_init, ref) != 0) /* the --init checkpoint, as at the start */
            mt_dist_abort(mt_last_error());
    }
    /* completions travel as records of this shape (rl/share.h) */
    const mt_rl_rec_shape shp = mt_rl_rec_shape_of(&m->cfg, &o, longest);
    const int replay_stride = shp.replay_stride;
    mt_adv_opts ao;
    mt_adv_defaults(&ao);
    ao.scale = !o.no_scale, ao.drop_uniform_groups = o.drop_uniform;
    char path[4200];
    FILE *mf = NULL;
    if (root) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", ti->out);
        if (!(mf = fopen(path, resumed ? "a" : "w"))) {
            mt_error("%s: cannot open: %s", path, strerror(errno));
            mt_dist_abort(mt_last_error());
        }
        if (!resumed) {
            char *js = settings_json(&o), sp[4300];
            snprintf(sp, sizeof sp, "%s/rl_settings.json", ti->out);
            if (mt_write_file_atomic(sp, js, strlen(js)) != 0) mt_dist_abort(mt_last_error());
            free(js);
        }
        if (!ti->quiet)
            printf("moetrain rl: GRPO from %s, %zu prompts (%s), %d prompts x %d completions per step over %d rank%s, "
               "max_new %d, temperature %g, %s, lr %.2e\n", resumed ? ti->resume : ti->init, ps.n, o.prompts, o.prompts_per_step, o.group, D,
               D > 1 ? "s" : "", o.max_new, o.temperature, mt_grpo_agg_name(agg), ti->lr);
        if (!ti->quiet)
            printf("  trainer: %d micro-batches of %d rows x %d positions per rank\n", ti->accum, ti->batch, ti->seq);
        if (!ti->quiet && sep)
            printf("  separate deployment: %d rollout rank%s, %d training; completions through a DistQueue, weights sent "
                   "after each step without waiting\n", R, R > 1 ? "s" : "", D);
        if (!ti->quiet && o.max_staleness > 0)
            printf("  StaleSync: step n trains on rollouts of version n-1-%d%s, corrected by the truncated importance "
                   "weight%s\n", o.max_staleness, o.stale_free ? " or newer (the newest the rollout ranks have)" : "",
                   o.no_is_weight ? " -- turned off (--no-is-weight)" : "");
        if (!ti->quiet && split && Nr == 1 && Nt == 1)
            printf("  RL Fusion: training layout PP %d x DP %d x TP %d%s, EP %d; every rank rolls out %d prompts from a "
                   "whole copy of the weights (%.1f MiB: the only copy during the rollout, filled point to point each "
                   "step; the trainer's parameters, gradients and activations parked meanwhile)\n",
                   d->pp_size, d->dp_size, d->tp_size, d->sp ? " (SP)" : "", d->ep_size, Pr,
                   (double)roll.nparams * sizeof(float) / 1048576.0);
        if (!ti->quiet && split && Nt > 1)
            printf("  RL Fusion: training layout PP %d x DP %d x TP %d%s, EP %d; rollout layout TP %d x DP %d: every TP "
                   "group rolls out %d prompts from its slices (%.1f MiB a rank: the attention heads and dense FFN split "
                   "over %d ranks, filled point to point each step; the trainer's gradients and activations parked "
                   "meanwhile)\n",
                   d->pp_size, d->dp_size, d->tp_size, d->sp ? " (SP)" : "", d->ep_size, Nt, D / Nt, Pr * Nt,
                   (double)roll.nparams * sizeof(float) / 1048576.0, Nt);
        if (!ti->quiet && split && Nr > 1)
            printf("  RL Fusion: training layout PP %d x DP %d x TP %d%s, EP %d; rollout layout EP %d x DP %d: every rank "
                   "rolls out %d prompts from its part (%.1f MiB: the experts split over %d ranks, filled point to point "
                   "each step; the trainer's gradients and activations parked meanwhile)\n",
                   d->pp_size, d->dp_size, d->tp_size, d->sp ? " (SP)" : "", d->ep_size, Nr, D / Nr, Pr,
                   (double)roll.nparams * sizeof(float) / 1048576.0, Nr);
        fflush(stdout);
    }
    const int eval_on = ev.n > 0 && o.eval_n > 0;
    double acc0 = -1, acc = -1;
    if (eval_on) {
        if (sep) {
            mt_rl_link_send(link, t, d, start, 1);
            acc0 = acc = mt_rl_link_accuracy(link, d);
        } else {
            if (split) to_rollout(t, &roll);
            acc0 = acc = mt_rl_heldout_accuracy(rm, &ev, o.eval_n, o.max_new, o.slots, ti->bf16, d);
            if (split) back_to_training(t, &roll);
        }
        if (root) {
            if (!ti->quiet)
                printf("step 0: held-out greedy accuracy %.4f (%d prompts)\n", acc, (int)(ev.n < (size_t)o.eval_n ? ev.n : (size_t)o.eval_n));
            fprintf(mf, "{\"event\":\"eval\",\"step\":0,\"heldout_accuracy\":%.6f}\n", acc);
            if (mt_file_check(mf, path) != 0 || mt_file_check(stdout, "stdout") != 0) mt_dist_abort(mt_last_error());
        }
    }
    mt_prompt_order po = {(int64_t)ps.n, -1, ti->seed, NULL};
    const int G = o.group;
    /* split layouts: this rank's rollout share (Pr prompts) and the completions of every
     * rank, exchanged as records of rec_n int32: n, eot, tokens, log-prob bits, routing */
    const int rrows = Pr * G;
    const size_t rec_n = shp.rec_n;
    /* --rollout-tp: a TP group samples its ranks' shares together, each rank keeping its own */
    mt_rollout_req *rreq = split ? mt_xcalloc((size_t)rrows * Nt, sizeof *rreq) : NULL;
    mt_completion *rco = split ? mt_xcalloc((size_t)rrows * Nt, sizeof *rco) : NULL;
    int32_t **rptok = split ? mt_xcalloc((size_t)Pr * Nt, sizeof *rptok) : NULL;
    /* unsplit co-located: the requests of the round being sampled (another step's prompts
     * than the trainer's with --max-staleness) */
    mt_rollout_req *rreq2 = mt_xcalloc((size_t)rows, sizeof *rreq2);
    int32_t **rptok2 = mt_xcalloc((size_t)Pl, sizeof *rptok2);
    int32_t *mine = split ? mt_xmalloc(sizeof(int32_t) * rec_n * (size_t)rrows) : NULL;
    int32_t *every = split || sep ? mt_xmalloc(sizeof(int32_t) * rec_n * (size_t)o.prompts_per_step * (size_t)G) : NULL;
    mt_rollout_req *req = mt_xcalloc((size_t)rows, sizeof *req);
    int32_t **ptok = mt_xcalloc((size_t)Pl, sizeof *ptok);
    int64_t *pidx = mt_xmalloc(sizeof(int64_t) * (size_t)Pl);
    mt_completion *co = mt_xcalloc((size_t)rows, sizeof *co);
    float *rew = mt_xmalloc(sizeof(float) * (size_t)rows), *adv = mt_xmalloc(sizeof(float) * (size_t)rows);
    uint8_t *uni = mt_xmalloc((size_t)Pl), *drop = mt_xmalloc((size_t)Pl);
    mt_grpo_seq *seq = mt_xcalloc((size_t)rows, sizeof *seq);
    int *seq_of = mt_xmalloc(sizeof(int) * (size_t)rows); /* kept completion k -> its index */
    /* the rollout dump: one record per completion (rl/dump.h), gathered on rank 0 */
    const int stride = mt_rlrec_stride(o.max_new);
    double *rec = o.dump_rollouts ? mt_xmalloc(sizeof(double) * (size_t)rows * stride) : NULL;
    /* rank 0: every rank's records (split layouts: the ranks of one DP index hold the same
     * completions, and the trainer's log-prob of a token where its head ran), merged into
     * rec_all in the trainer's order: DP index, then prompt, then sample */
    double *rec_all = o.dump_rollouts && root ? mt_xmalloc(sizeof(double) * (size_t)rows * stride * D) : NULL;
    double *rec_world = o.dump_rollouts && root && split ? mt_xmalloc(sizeof(double) * (size_t)rows * stride * D) : NULL;
    int grads_done = !o.dump_grads;
    const double t_begin = mt_now();
    int rc = 0;
    /* co-located StaleSync: the records of the rounds sampled ahead, s + 1 of them, round n
     * in ring[n % (s + 1)] (sampled with the weights of the step before the one that made it) */
    const int S = o.max_staleness, nring = S + 1;
    int32_t *ring = !sep ? mt_xmalloc(sizeof(int32_t) * rec_n * (size_t)rows * (size_t)nring) : NULL;
    double *ring_s = mt_xcalloc((size_t)nring, sizeof *ring_s); /* rollout seconds of each round */
    int *ring_v = mt_xcalloc((size_t)nring, sizeof *ring_v);    /* the version that sampled it */
    int *ver = mt_xmalloc(sizeof(int) * (size_t)rows);            /* each completion's version */
    double *score = sep ? mt_xmalloc(sizeof(double) * MT_RL_NSCORE * (size_t)o.prompts_per_step * (size_t)G) : NULL;
    int *vall = sep ? mt_xmalloc(sizeof(int) * (size_t)o.prompts_per_step * (size_t)G) : NULL;
    if (sep && !eval_on && ti->steps > start) mt_rl_link_send(link, t, d, start, 0);
    int made = start; /* co-located: rounds sampled so far */
    for (int step = start + 1; step <= ti->steps && rc == 0; step++) {
        /* this DP index's prompts of the step, G samples each */
        mt_rl_share_requests(&po, &ps, &o, step, d->dp_rank, Dt, ptok, req);
        for (int j = 0; j < Pl; j++) pidx[j] = (int64_t)req[j * G].prompt_index;
        mt_rollout_opts ro;
        mt_rollout_defaults(&ro);
        ro.temperature = o.temperature, ro.top_k = o.top_k, ro.top_p = o.top_p, ro.max_new = o.max_new;
        ro.seed = ti->seed, ro.slots = o.slots, ro.record_routing = o.routing_replay, ro.speculative = o.speculative;
        int64_t spec[2] = {0, 0}; /* co-located, speculative: drafts fed and accepted this step, over the ranks */
        ro.bf16 = ti->bf16; /* the rollout runs in the trainer's precision */
        ro.eot = tk.eot;
        mt_rollout_stats rs;
        memset(&rs, 0, sizeof rs);
        double switch_s = 0, rss[2] = {0, 0}; /* peak MiB during the rollout and the training step */
        double waits[4] = {0, 0, 0, 0};       /* trainer for samples, rollout for weights, for room; queue depth */
        mt_reset_peak_rss();
        if (sep) {
            mt_rl_link_take(link, d, &o, &shp, step, every, score, vall, &waits[3]);
            waits[0] = link->wait_s;
            /* the rollout time of the round: its slowest rank's */
            const size_t nall = (size_t)o.prompts_per_step * (size_t)G, off = (size_t)d->dp_rank * (size_t)rows;
            for (size_t i = 0; i < nall; i++) {
                const double *sc = score + MT_RL_NSCORE * i;
                rs.seconds = sc[MT_RL_SCORE_ROLLOUT_S] > rs.seconds ? sc[MT_RL_SCORE_ROLLOUT_S] : rs.seconds;
                waits[1] = sc[MT_RL_SCORE_WAIT_WEIGHTS] > waits[1] ? sc[MT_RL_SCORE_WAIT_WEIGHTS] : waits[1];
                waits[2] += sc[MT_RL_SCORE_WAIT_ROOM] / R;
            }
            mt_rl_unpack_records(&shp, every + shp.rec_n * off, req, rows, co);
            for (int i = 0; i < rows; i++) ver[i] = vall[off + (size_t)i];
        } else {
            /* the rounds due now: at the first step s + 1 of them, then the one s steps ahead,
             * all with the current weights */
            const int upto = step + S < ti->steps ? step + S : ti->steps;
            for (; made < upto; made++) {
                const int n = made + 1;
                int32_t *slot = ring + rec_n * (size_t)rows * (size_t)(n % nring);
                ro.step = (uint64_t)n;
                mt_rollout_stats rn;
                if (!split) {
                    mt_rl_share_requests(&po, &ps, &o, n, d->dp_rank, Dt, rptok2, rreq2); /* round n's prompts */
                    mt_trace_begin("rl.rollout");
                    if (mt_rollout(m, &ro, rreq2, rows, co, &rn) != 0) { rc = -1; mt_trace_end(); break; }
                    mt_trace_end();
                    mt_rl_pack_records(&shp, co, rreq2, rows, slot);
                } else {
                    mt_trace_begin("rl.switch");
                    const double t0 = mt_now();
                    to_rollout(t, &roll);
                    switch_s += mt_now() - t0;
                    mt_trace_end();
                    mt_rl_share_requests(&po, &ps, &o, n, d->rank / Nt, D / Nt, rptok, rreq);
                    mt_trace_begin("rl.rollout");
                    if (mt_rollout(&roll, &ro, rreq, rrows * Nt, rco, &rn) != 0) { rc = -1; mt_trace_end(); break; }
                    mt_trace_end();
                    const int own = (d->rank % Nt) * rrows; /* this rank's share of its TP group's */
                    for (int i = 0; i < rrows * Nt; i++)
                        if (i < own || i >= own + rrows) mt_completion_free(&rco[i]);
                    const double r0 = (double)mt_peak_rss() / 1048576.0;
                    rss[0] = r0 > rss[0] ? r0 : rss[0];
                    mt_trace_begin("rl.switch");
                    const double t1 = mt_now();
                    back_to_training(t, &roll);
                    mt_rl_pack_records(&shp, rco + own, rreq + own, rrows, mine);
                    mt_group_allgather_i32(&d->all, mine, rec_n * (size_t)rrows, every);
                    /* this DP index's completions, in the order of its prompts */
                    memcpy(slot, every + rec_n * (size_t)d->dp_rank * (size_t)rows, sizeof(int32_t) * rec_n * (size_t)rows);
                    switch_s += mt_now() - t1;
                    mt_trace_end();
                }
                if (d->rank % Nt == 0) spec[0] += rn.drafted, spec[1] += rn.accepted; /* a TP group's, once */
                ring_s[n % nring] = rn.seconds;
                ring_v[n % nring] = step - 1;
            }
            if (rc) break;
            rs.seconds = ring_s[step % nring];
            mt_rl_unpack_records(&shp, ring + rec_n * (size_t)rows * (size_t)(step % nring), req, rows, co);
            for (int i = 0; i < rows; i++) ver[i] = ring_v[step % nring];
            waits[3] = (double)(made - step) * o.prompts_per_step * G;
        }
        if (!split) rss[0] = (double)mt_peak_rss() / 1048576.0;
        /* rewards and advantages per group */
        double sums[8] = {0}; /* reward, correct, length, completions, uniform groups, kept, kept tokens, rollout s */
        for (int i = 0; i < rows; i++) {
            /* separate: the reward the rollout rank's reward task put into the queue */
            rew[i] = sep ? (float)score[MT_RL_NSCORE * ((size_t)d->dp_rank * (size_t)rows + (size_t)i) + MT_RL_SCORE_REWARD]
                         : mt_reward_score(&reward, co[i].tokens, co[i].n, co[i].stopped_eot, ps.answer[pidx[i / G]]);
            sums[0] += rew[i];
            sums[1] += mt_math_verdict_tk(&tk, co[i].tokens, co[i].n, co[i].stopped_eot, ps.answer[pidx[i / G]]) ==
                       MT_VERDICT_CORRECT;
            sums[2] += co[i].n;
            sums[3] += 1;
        }
        if (mt_advantages(&ao, rew, Pl, G, adv, uni, drop) != 0) { rc = -1; break; }
        int nseq = 0;
        int64_t cnt[2] = {0, 0}; /* kept completions and their tokens, over the ranks */
        for (int j = 0; j < Pl; j++) {
            sums[4] += uni[j];
            if (drop[j]) continue;
            for (int s = 0; s < G; s++) {
                const int i = j * G + s;
                seq_of[nseq] = i;
                seq[nseq++] = (mt_grpo_seq){ptok[j], req[i].len, co[i].tokens, co[i].logp, co[i].n, adv[i], co[i].routing};
                cnt[0]++, cnt[1] += co[i].n;
            }
        }
        mt_group_sum_i64(&d->dp, cnt, 2);
        if (o.speculative && !sep) mt_group_sum_i64(&d->all, spec, 2);
        sums[7] = rs.seconds;
        for (int i = 0; rec && i < rows; i++) {
            double *r = rec + (size_t)i * stride;
            for (int k = 0; k < stride; k++) r[k] = NAN;
            r[MT_RLREC_PROMPT] = (double)pidx[i / G], r[MT_RLREC_SAMPLE] = i % G, r[MT_RLREC_N] = co[i].n;
            r[MT_RLREC_EOT] = co[i].stopped_eot, r[MT_RLREC_REWARD] = rew[i], r[MT_RLREC_ADV] = adv[i];
            r[MT_RLREC_KEPT] = !drop[i / G], r[MT_RLREC_VERSION] = ver[i];
            for (int k = 0; k < co[i].n; k++) {
                r[MT_RLREC_HEAD + k] = co[i].tokens[k];
                r[MT_RLREC_HEAD + o.max_new + k] = co[i].logp[k];
            }
        }
        double gstat[MT_GRPO_NSTAT] = {0};
        mt_step_result sr;
        memset(&sr, 0, sizeof sr);
        double t_train = 0;
        mt_reset_peak_rss();
        if (cnt[0] > 0) {
            mt_grpo_batch gb;
            if (mt_grpo_batch_init(&gb, &L, seq, nseq, ti->accum, ti->batch, ti->seq, cnt[1], cnt[0], replay_stride) !=
                0) {
                rc = -1;
                break;
            }
            const double t0 = mt_now();
            const mt_batch b = {ti->accum, ti->batch, ti->seq, gb.in, gb.tg, NULL, &gb.obj, gb.fed, gb.replay, gb.replay_stride};
            gb.phase = 0;
            if (mt_trainer_logprobs(t, &b) != 0) rc = -1;
            if (rc == 0 && ref) { /* logp_ref: the same forward with the reference weights */
                float *cur = mt_model_use_params(m, ref);
                gb.phase = 2;
                if (mt_trainer_logprobs(t, &b) != 0) rc = -1;
                mt_model_use_params(m, cur);
            }
            gb.phase = 1;
            if (rc == 0 && mt_trainer_step(t, &b, &sr) != 0) rc = -1;
            t_train = mt_now() - t0;
            mt_grpo_stats(&gb, gstat);
            for (int k = 0; rec && rc == 0 && k < nseq; k++) { /* row k: position plen-1+j predicts token j */
                double *r = rec + (size_t)seq_of[k] * stride + MT_RLREC_HEAD + 2 * o.max_new;
                for (int j = 0; j < seq[k].n; j++) {
                    const size_t at = (size_t)k * ti->seq + seq[k].plen - 1 + j;
                    if (!split || gb.ratio[at] != 0) r[j] = gb.old[at]; /* split: only where the head ran here */
                }
            }
            if (rc == 0 && !grads_done) {
                if (mt_rl_dump_grads(o.dump_grads, m) != 0) rc = -1;
                else if (root && !ti->quiet) printf("  gradient of step %d written to %s\n", step, o.dump_grads);
                grads_done = 1;
            }
            mt_grpo_batch_free(&gb);
            if (rc) break;
            /* a token counts where its head ran: the last stage, and without SP only TP rank 0
             * (the TP ranks compute the same head) */
            if (!d->sp && d->tp_rank != 0) memset(gstat, 0, sizeof gstat);
            double mx = gstat[5];
            mt_group_sum_f64(&d->all, gstat + 6, 1); /* the kl part; [5] is a maximum */
            mt_group_sum_f64(&d->all, gstat, 5);
            mt_group_max_f64(&d->all, &mx, 1);
            gstat[5] = mx;
        }
        rss[1] = (double)mt_peak_rss() / 1048576.0;
        /* staleness: the trainer's version (step - 1) minus the one that sampled, per completion */
        int64_t *hist = mt_xcalloc((size_t)S + 2, sizeof *hist); /* [S + 1]: older than S (never) */
        for (int i = 0; i < rows; i++) {
            const int st = step - 1 - ver[i];
            hist[st >= 0 && st <= S ? st : S + 1]++;
        }
        mt_group_sum_i64(&d->dp, hist, (size_t)S + 2);
        int stale_max = 0;
        double stale_mean = 0;
        for (int k = 0; k <= S + 1; k++) {
            if (hist[k]) stale_max = k;
            stale_mean += (double)k * (double)hist[k];
        }
        if (hist[S + 1]) mt_dist_abort("rl: a completion older than --max-staleness reached the trainer");
        mt_group_sum_f64(&d->dp, sums, 7);
        mt_group_max_f64(&d->all, &sums[7], 1);
        mt_group_max_f64(&d->all, rss, 2);
        mt_group_max_f64(&d->all, &switch_s, 1);
        if (rec) {
            if (!split) {
                mt_group_gather_f64(&d->dp, rec, (size_t)rows * stride, rec_all);
            } else {
                mt_group_gather_f64(&d->all, rec, (size_t)rows * stride, rec_world);
                if (root) merge_records(rec_world, rec_all, (size_t)rows * stride, D, d->tp_size, d->dp_size);
            }
            if (root) {
                const double ntok = gstat[4];
                char ck[4200], dp[4200];
                const char *ckpt = NULL;
                if (step == 1) ckpt = ti->init;
                else if (ti->save_every > 0 && (step - 1) % ti->save_every == 0) {
                    snprintf(ck, sizeof ck, "%s/step_%08d", ti->out, step - 1);
                    ckpt = ck;
                }
                const mt_rl_dump_step ds = {
                    .step = step, .version = step - 1, .checkpoint = ckpt, .prompts = o.prompts,
                    .prompts_per_step = o.prompts_per_step, .group = G, .bf16 = ti->bf16, .temperature = o.temperature,
                    .top_p = o.top_p, .top_k = o.top_k, .max_new = o.max_new, .eot = ro.eot, .seed = ti->seed,
                    .eps_low = o.eps_low, .eps_high = o.eps_high, .beta = o.beta, .is_cap = o.is_cap,
                    .alpha = mt_trainer_config(t)->aux_loss_alpha, .format_penalty = o.format_penalty,
                    .agg = mt_grpo_agg_name(agg), .scale = !o.no_scale, .drop_uniform = o.drop_uniform,
                    .trained = cnt[0] > 0, .finite = cnt[0] > 0 && sr.finite, .completions = cnt[0],
                    .completion_tokens = cnt[1], .loss = gstat[0], .pg = gstat[1], .kl = gstat[6],
                    .clip_fraction = ntok > 0 ? gstat[2] / ntok : 0, .ratio_dev = ntok > 0 ? gstat[3] / ntok : 0,
                    .old_behav_max = gstat[5], .balance = sr.balance, .grad_norm = sr.grad_norm};
                snprintf(dp, sizeof dp, "%s/step_%08d.json", o.dump_rollouts, step);
                if (mt_rl_dump_write(dp, &ds, rec_all, rows * d->dp_size, stride, &ps) != 0) mt_dist_abort(mt_last_error());
            }
        }
        for (int i = 0; i < rows; i++) mt_completion_free(&co[i]);
        const int eval_now = eval_on && (step == ti->steps || (o.eval_every > 0 && step % o.eval_every == 0));
        if (sep && (step < ti->steps || eval_now)) { /* the new version to the rollout ranks, not waiting */
            mt_trace_begin("rl.send_weights");
            const double t0 = mt_now();
            mt_rl_link_send(link, t, d, step, eval_now);
            switch_s = mt_now() - t0; /* separate: the trainer's time to hand the weights over */
            mt_trace_end();
        }
        if (eval_now) {
            if (sep) {
                acc = mt_rl_link_accuracy(link, d);
            } else {
                if (split) to_rollout(t, &roll);
                acc = mt_rl_heldout_accuracy(rm, &ev, o.eval_n, o.max_new, o.slots, ti->bf16, d);
                if (split) back_to_training(t, &roll);
            }
        }
        if (root) {
            const double el = mt_now() - t_begin;
            const double n = sums[3], ntok = gstat[4];
            const double rtps = sums[7] > 0 ? sums[2] / sums[7] : 0, ttps = t_train > 0 ? (double)cnt[1] / t_train : 0;
            if (!ti->quiet) {
                printf("step %d/%d | reward %.3f | acc %.3f | len %.1f | uniform %.2f | loss %+.4f | clip %.3f | "
                       "|r-1| %.2e | old-behav %.1e | gnorm %.3f | rollout %.0f tok/s | train %.0f tok/s",
                       step, ti->steps, sums[0] / n, sums[1] / n, sums[2] / n, sums[4] / (n / G), gstat[0],
                       ntok > 0 ? gstat[2] / ntok : 0, ntok > 0 ? gstat[3] / ntok : 0, gstat[5], sr.grad_norm, rtps, ttps);
                if (split) printf(" | switch %.3fs", switch_s);
                if (S > 0) printf(" | stale %.2f", stale_mean / n);
                if (sep) printf(" | wait train %.2fs rollout %.2fs", waits[0], waits[1] + waits[2]);
                if (o.speculative && !sep) printf(" | accept %.1f%%", spec[0] ? 100.0 * spec[1] / spec[0] : 0.0);
                if (eval_now) printf(" | held-out %.3f", acc);
                printf("\n");
            }
            fprintf(mf,
                    "{\"event\":\"step\",\"step\":%d,\"version\":%d,\"prompts\":%d,\"completions\":%.0f,"
                    "\"completion_tokens\":%.0f,\"reward\":%.6f,\"accuracy\":%.6f,\"uniform_groups\":%.6f,"
                    "\"length\":%.3f,\"loss\":%.8f,\"pg\":%.8f,\"kl\":%.8f,\"clip_fraction\":%.6f,\"ratio_dev\":%.3e,"
                    "\"max_staleness\":%d,\"staleness_mean\":%.4f,\"queue_depth\":%.0f,\"wait_trainer_s\":%.4f,"
                    "\"wait_rollout_weights_s\":%.4f,\"wait_rollout_room_s\":%.4f,\"logp_old_behav_max\":%.3e,\"grad_norm\":%.6f,\"rollout_tokens_per_s\":%.1f,"
                    "\"train_tokens_per_s\":%.1f,\"switch_s\":%.4f,\"rss_rollout_mib\":%.1f,\"rss_train_mib\":%.1f,"
                    "\"elapsed\":%.2f",
                    step, step - 1, o.prompts_per_step, n, sums[2], sums[0] / n, sums[1] / n, sums[4] / (n / G),
                    sums[2] / n, gstat[0], gstat[1], gstat[6], ntok > 0 ? gstat[2] / ntok : 0,
                    ntok > 0 ? gstat[3] / ntok : 0, stale_max, stale_mean / n, waits[3], waits[0], waits[1], waits[2],
                    gstat[5], sr.grad_norm, rtps, ttps, switch_s, rss[0], rss[1], el);
            fprintf(mf, ",\"staleness_hist\":[");
            for (int k = 0; k <= S; k++) fprintf(mf, "%s%lld", k ? "," : "", (long long)hist[k]);
            fprintf(mf, "]");
            if (eval_now) fprintf(mf, ",\"heldout_accuracy\":%.6f", acc);
            if (o.speculative && !sep)
                fprintf(mf, ",\"spec_drafted\":%lld,\"spec_accepted\":%lld", (long long)spec[0], (long long)spec[1]);
            fprintf(mf, "}\n");
            if (mt_file_check(mf, path) != 0 || mt_file_check(stdout, "stdout") != 0) mt_dist_abort(mt_last_error());
        }
        free(hist);
        if (ti->save_every > 0 && step % ti->save_every == 0 && step != ti->steps) {
            char dir[4200];
            if (mt_trainer_save(t, dir, sizeof dir) != 0) rc = -1;
        }
    }
    if (rc == 0) {
        char dir[4200];
        if (mt_trainer_save(t, dir, sizeof dir) != 0) rc = -1;
        if (rc == 0 && root) {
            if (eval_on && !ti->quiet) printf("done: held-out greedy accuracy %.4f -> %.4f\n", acc0, acc);
            if (!ti->quiet) printf("  checkpoint %s\n  metrics    %s/metrics.jsonl\n", dir, ti->out);
            if (eval_on) fprintf(mf, "{\"event\":\"summary\",\"heldout_accuracy_start\":%.6f,\"heldout_accuracy\":%.6f}\n", acc0, acc);
        }
    }
    if (mf && rc != 0) fclose(mf);
    else if (mf) rc = mt_file_close(mf, path); /* the summary event */
    for (int j = 0; j < Pl; j++) free(ptok[j]);
    free(ptok), free(pidx), free(req), free(co), free(rew), free(adv), free(uni), free(drop), free(seq), free(po.perm);
    for (int j = 0; split && j < Pr * Nt; j++) free(rptok[j]);
    free(rptok), free(rreq), free(rco), free(mine), free(every);
    for (int j = 0; j < Pl; j++) free(rptok2[j]);
    free(rptok2), free(rreq2), free(ring), free(ring_s), free(ring_v), free(ver), free(score), free(vall);
    mt_rl_link_free(link, d);
    if (rc == 0) write_trace(&o);
    mt_model_free(&roll);
    if (rep_comm != MPI_COMM_NULL) {
        mt_ep_free(&rep);
        MPI_Comm_free(&rep_comm);
    }
    if (rtg.comm != MPI_COMM_NULL) {
        mt_tp_free(&rtp);
        MPI_Comm_free(&rtg.comm);
    }
    mt_free(ref);
    free(seq_of), free(rec), free(rec_all), free(rec_world);
    mt_trainer_free(t);
    cJSON_Delete(kept);
    mt_reward_free(&reward);
    mt_prompts_free(&ps);
    mt_prompts_free(&ev);
    mt_tokenizer_free(&tk);
    return rc;
}
