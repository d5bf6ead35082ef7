/* rl/dump.c — the rollout dump and the gradient dump of `moetrain rl` (see dump.h). */
#include "rl/dump.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/safetensors.h"

/* a JSON string: quotes, backslashes and control bytes escaped, other bytes as they are */
static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* a number that round-trips (%.17g for doubles, %.9g for fp32 values); null if not finite */
static void put_f64(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}
static void put_f32(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", (double)(float)x);
    else fputs("null", f);
}
static const char *jbool(int b) { return b ? "true" : "false"; }

int mt_rl_dump_write(const char *path, const mt_rl_dump_step *s, const double *rec, int n, int stride,
                     const mt_prompt_set *ps) {
    const size_t plen = strlen(path);
    char *tmp = mt_xmalloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int e = errno;
        free(tmp);
        return mt_error("rl: cannot write the rollout dump %s: %s", path, strerror(e));
    }
    fprintf(f, "{\"format\":\"moetrain-rl-rollouts\",\"format_version\":1,\"step\":%d,\"version\":%d,\"checkpoint\":",
            s->step, s->version);
    if (s->checkpoint) put_str(f, s->checkpoint);
    else fputs("null", f);
    fputs(",\"prompts_file\":", f);
    put_str(f, s->prompts ? s->prompts : "");
    fprintf(f, ",\"prompts\":%d,\"group\":%d,\"precision\":\"%s\",\n\"sampling\":{\"temperature\":", s->prompts_per_step,
            s->group, s->bf16 ? "bf16" : "fp32");
    put_f64(f, s->temperature);
    fprintf(f, ",\"top_k\":%d,\"top_p\":", s->top_k);
    put_f64(f, s->top_p);
    fprintf(f, ",\"max_new_tokens\":%d,\"seed\":\"%llu\",\"eot\":%d},\n\"loss_settings\":{\"eps_low\":", s->max_new,
            (unsigned long long)s->seed, s->eot);
    put_f64(f, s->eps_low);
    fputs(",\"eps_high\":", f);
    put_f64(f, s->eps_high);
    fputs(",\"beta\":", f);
    put_f64(f, s->beta);
    fputs(",\"is_cap\":", f);
    put_f64(f, s->is_cap);
    fputs(",\"aggregation\":", f);
    put_str(f, s->agg);
    fputs(",\"alpha\":", f);
    put_f64(f, s->alpha);
    fprintf(f, ",\"scale\":%s,\"drop_uniform_groups\":%s,\"format_penalty\":", jbool(s->scale), jbool(s->drop_uniform));
    put_f64(f, s->format_penalty);
    fprintf(f, ",\"epochs\":1,\"mini_batches\":1,\"routing_replay\":false},\n\"recorded\":{\"trained\":%s,\"finite\":%s,"
            "\"completions\":%lld,\"completion_tokens\":%lld,\"loss\":", jbool(s->trained), jbool(s->finite),
            (long long)s->completions, (long long)s->completion_tokens);
    const double v[] = {s->loss, s->pg, s->kl, s->clip_fraction, s->ratio_dev, s->old_behav_max, s->balance,
                        s->grad_norm};
    static const char *const names[] = {"loss", "pg", "kl", "clip_fraction", "ratio_dev", "logp_old_behav_max",
                                        "balance", "grad_norm"};
    for (int i = 0; i < 8; i++) {
        if (i) fprintf(f, ",\"%s\":", names[i]);
        put_f64(f, v[i]);
    }
    fputs("},\n\"completions\":[", f);
    const int max_new = (stride - MT_RLREC_HEAD) / 3;
    int32_t *pt = NULL;
    for (int i = 0; i < n; i++) {
        const double *r = rec + (size_t)i * stride;
        const size_t pidx = (size_t)r[MT_RLREC_PROMPT];
        const int len = (int)r[MT_RLREC_N];
        const double *tok = r + MT_RLREC_HEAD, *lb = tok + max_new, *lo = lb + max_new;
        fprintf(f, "%s\n{\"prompt_index\":%zu,\"sample_index\":%.0f,\"kept\":%s,\"stopped_eot\":%s,\"prompt_tokens\":[",
                i ? "," : "", pidx, r[MT_RLREC_SAMPLE], jbool(r[MT_RLREC_KEPT] != 0), jbool(r[MT_RLREC_EOT] != 0));
        if (pidx < ps->n) {
            const size_t np = mt_prompt_copy(ps, pidx, &pt);
            for (size_t k = 0; k < np; k++) fprintf(f, "%s%d", k ? "," : "", pt[k]);
        }
        fputs("],\"completion_tokens\":[", f);
        for (int k = 0; k < len; k++) fprintf(f, "%s%.0f", k ? "," : "", tok[k]);
        fputs("],\"answer\":", f);
        put_str(f, pidx < ps->n ? ps->answer[pidx] : "");
        fputs(",\"reward\":", f);
        put_f32(f, r[MT_RLREC_REWARD]);
        fputs(",\"advantage\":", f);
        put_f32(f, r[MT_RLREC_ADV]);
        fputs(",\"logp_behav\":[", f);
        for (int k = 0; k < len; k++) {
            if (k) fputc(',', f);
            put_f32(f, lb[k]);
        }
        fputs("],\"version\":[", f);
        for (int k = 0; k < len; k++) fprintf(f, "%s%.0f", k ? "," : "", r[MT_RLREC_VERSION]);
        fputs("],\"logp_old\":[", f);
        for (int k = 0; k < len; k++) {
            if (k) fputc(',', f);
            put_f32(f, lo[k]);
        }
        fputs("]}", f);
    }
    free(pt);
    fputs("\n]}\n", f);
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        free(tmp);
        return mt_error("rl: cannot write the rollout dump %s: %s", path, strerror(e));
    }
    free(tmp);
    return 0;
}

int mt_rl_dump_grads(const char *path, const mt_model *m) {
    if (m->part.ep_size > 1 || m->part.tp_size > 1 || m->slot_of)
        return mt_error("rl: --dump-grads needs the whole model in one process (contiguous experts)");
    mt_st_entry *e = mt_xcalloc((size_t)m->ntensors, sizeof *e);
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        e[i] = (mt_st_entry){t->name, m->grads + t->offset, t->ndim, {t->shape[0], t->shape[1]}};
    }
    static const char *const meta[] = {"content", "gradient of the first trained step (before clipping)"};
    const int rc = mt_st_write(path, e, m->ntensors, meta, 1);
    free(e);
    return rc;
}
