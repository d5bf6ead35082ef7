/* cli/cmd_eval.c — `moetrain eval` (validation loss, math exact-match accuracy) and
 * `moetrain generate` (sampling). Both decode through mt_model_step's logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "data/loader.h"
#include "data/math.h"
#include "data/tokenizer.h"
#include "kernels/blas.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

static int argmax(const float *l, int V) {
    int b = 0;
    for (int j = 1; j < V; j++) if (l[j] > l[b]) b = j;
    return b;
}

/* Greedy-decodes the answers of probs[0..n) in batches; returns the number correct. */
static size_t math_accuracy(mt_model *m, const mt_math_problem *probs, size_t n, int max_new, int show) {
    const int V = m->cfg.vocab_size, Bg = 64;
    int Tmax = 0;
    for (size_t i = 0; i < n; i++) {
        int len = (int)strlen(probs[i].prompt) + 1;
        if (len > Tmax) Tmax = len;
    }
    Tmax += max_new;
    if (Tmax > m->cfg.max_position_embeddings) Tmax = m->cfg.max_position_embeddings;
    mt_acts *a = mt_acts_new(&m->cfg, Bg, Tmax, mt_get_threads());
    int32_t *tok = mt_xcalloc((size_t)Bg * Tmax, sizeof(int32_t));
    int32_t *tgt = mt_xmalloc(sizeof(int32_t) * (size_t)Bg * Tmax);
    for (size_t i = 0; i < (size_t)Bg * Tmax; i++) tgt[i] = -1;
    float *logits = mt_alloc(sizeof(float) * (size_t)Bg * Tmax * V);
    int len[64], plen[64], done[64];
    size_t correct = 0, too_long = 0;
    mt_step_stats st;
    for (size_t p0 = 0; p0 < n; p0 += Bg) {
        int nb = (int)(n - p0 < (size_t)Bg ? n - p0 : (size_t)Bg);
        memset(tok, 0, sizeof(int32_t) * (size_t)Bg * Tmax);
        for (int b = 0; b < nb; b++) {
            const char *pr = probs[p0 + b].prompt;
            int32_t *row = tok + (size_t)b * Tmax;
            int need = 1 + (int)strlen(pr);
            done[b] = need >= Tmax; /* no room for an answer: counted as wrong */
            if (done[b]) {
                plen[b] = len[b] = 0;
                too_long++;
                continue;
            }
            row[0] = MT_BYTE_EOT;
            plen[b] = len[b] = need;
            for (int j = 1; j < len[b]; j++) row[j] = (unsigned char)pr[j - 1];
        }
        for (;;) {
            int T = 0, active = 0;
            for (int b = 0; b < nb; b++) if (!done[b]) { active = 1; if (len[b] > T) T = len[b]; }
            if (!active) break;
            /* rows are left-aligned: tokens after a row's end do not affect its last position */
            int32_t *packed = mt_xmalloc(sizeof(int32_t) * (size_t)nb * T);
            for (int b = 0; b < nb; b++) memcpy(packed + (size_t)b * T, tok + (size_t)b * Tmax, sizeof(int32_t) * T);
            mt_model_step(m, a, packed, tgt, nb, T, 0, 0, 0, logits, &st);
            free(packed);
            for (int b = 0; b < nb; b++) {
                if (done[b]) continue;
                int next = argmax(logits + ((size_t)b * T + len[b] - 1) * V, V);
                if (next == MT_BYTE_EOT || next > 255 || len[b] >= Tmax || len[b] - plen[b] >= max_new) { done[b] = 1; continue; }
                tok[(size_t)b * Tmax + len[b]++] = next;
                if (len[b] >= Tmax) done[b] = 1;
            }
        }
        for (int b = 0; b < nb; b++) {
            char out[256];
            int k = 0;
            for (int j = plen[b]; j < len[b] && k < 255; j++) out[k++] = (char)tok[(size_t)b * Tmax + j];
            out[k] = 0;
            int ok = strcmp(out, probs[p0 + b].answer) == 0;
            correct += ok;
            if (show > 0 && p0 + b < (size_t)show)
                printf("  %-16s -> %-10s %s%s%s\n", probs[p0 + b].prompt, out, ok ? "ok" : "WRONG (want ",
                       ok ? "" : probs[p0 + b].answer, ok ? "" : ")");
        }
    }
    if (too_long)
        mt_warn("%zu problems are longer than max_position_embeddings allows for an answer; counted as wrong",
                too_long);
    mt_free(logits);
    free(tok);
    free(tgt);
    mt_acts_free(a);
    return correct;
}

int mt_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL;
    int T = 0, windows = 256, batch = 8, nprob = 500, max_new = 16, show = 0, threads = 0, doc = 0, eot = 256;
    mt_arg specs[] = {
        {"ckpt", MT_ARG_STR, &ckpt, "checkpoint or run folder (required)", NULL},
        {"data", MT_ARG_STR, &data, "folder with *val*.bin shards (required)", NULL},
        {"seq", MT_ARG_INT, &T, "window length for the validation loss (default min(256, max positions))", NULL},
        {"windows", MT_ARG_INT, &windows, "validation windows in file order, 0 = all (default 256)", NULL},
        {"batch", MT_ARG_INT, &batch, "windows per forward pass (default 8)", NULL},
        {"problems", MT_ARG_INT, &nprob, "math problems to decode, 0 = skip (default 500)", NULL},
        {"max-new", MT_ARG_INT, &max_new, "most answer tokens to decode (default 16)", NULL},
        {"show", MT_ARG_INT, &show, "print the first N problems with the model's answer", NULL},
        {"threads", MT_ARG_INT, &threads, "threads (default all cores)", NULL},
        {"doc-mode", MT_ARG_BOOL, &doc, "validation loss in document mode (restart after each --eot)", NULL},
        {"eot", MT_ARG_INT, &eot, "end-of-text token id for --doc-mode (default 256)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("eval", "--ckpt DIR --data DIR [flags]", specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!ckpt || !data) { mt_error("moetrain eval: --ckpt DIR and --data DIR are required"); return mt_cli_fail(); }
    if (batch < 1 || max_new < 1) { /* integers are never negative (the parser) */
        mt_error("moetrain eval: --batch and --max-new must be positive");
        return mt_cli_fail();
    }
    if (threads > 0) mt_set_threads(threads);
    mt_model m;
    char dir[4096];
    if (mt_ckpt_open_model(ckpt, &m, dir, sizeof dir) != 0) return mt_cli_fail();
    if (T <= 0) T = m.cfg.max_position_embeddings < 256 ? m.cfg.max_position_embeddings : 256;
    if (doc && eot >= m.cfg.vocab_size) {
        mt_error("moetrain eval: --eot %d is not a token id of the model (vocab_size %d)", eot, m.cfg.vocab_size);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    if (T > m.cfg.max_position_embeddings) {
        mt_error("moetrain eval: --seq %d exceeds max_position_embeddings %d", T, m.cfg.max_position_embeddings);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    mt_loader *val;
    if (mt_loader_open(&val, data, "val", T, 1) != 0) { mt_model_free(&m); return mt_cli_fail(); }
    if ((int64_t)mt_loader_max_token(val) >= m.cfg.vocab_size) {
        mt_error("%s: token id %u does not fit vocab_size %d of %s", data, mt_loader_max_token(val), m.cfg.vocab_size, dir);
        mt_loader_free(val);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    mt_acts *a = mt_acts_new(&m.cfg, batch, T, mt_get_threads());
    double vl = mt_eval_loss(&m, a, val, batch, T, windows, doc ? eot : -1);
    uint64_t nw = mt_loader_windows(val);
    printf("val_loss=%.6f (%llu windows of %d tokens, %s)\n", vl,
           (unsigned long long)(windows <= 0 || (uint64_t)windows > nw ? nw : (uint64_t)windows), T, dir);
    mt_acts_free(a);
    if (nprob > 0) {
        uint64_t ntok;
        const uint32_t *all = mt_loader_all_tokens(val, &ntok);
        mt_math_problem *probs;
        size_t count;
        if (mt_math_parse_problems(all, ntok, &probs, &count) != 0) {
            mt_loader_free(val);
            mt_model_free(&m);
            return mt_cli_fail();
        }
        if (count == 0) {
            printf("accuracy: no math problems in the validation split (not a math corpus)\n");
        } else if (m.cfg.vocab_size <= MT_BYTE_EOT) {
            printf("accuracy: skipped, the prompts start with end-of-text %d, beyond vocab_size %d\n", MT_BYTE_EOT,
                   m.cfg.vocab_size);
        } else {
            if ((size_t)nprob < count) count = (size_t)nprob;
            size_t ok = math_accuracy(&m, probs, count, max_new, show);
            printf("accuracy=%.4f (%zu/%zu held-out problems exactly right, greedy decoding)\n",
                   (double)ok / (double)count, ok, count);
        }
        free(probs);
    }
    mt_loader_free(val);
    mt_model_free(&m);
    return 0;
}

/* Samples from softmax(l / temp) restricted to the top_k most likely tokens (0 = all) and to
 * the smallest set of them whose mass reaches top_p; u is a uniform draw in [0,1). Plain
 * sampling needs no ordering; otherwise a partial selection sort stops at k tokens or mass p. */
static int sample_token(const float *l, int V, double temp, int top_k, double top_p, double u, float *prob,
                        int *idx) {
    float mx = l[argmax(l, V)];
    double sum = 0;
    for (int j = 0; j < V; j++) { prob[j] = expf((float)((l[j] - mx) / temp)); sum += prob[j]; idx[j] = j; }
    for (int j = 0; j < V; j++) prob[j] /= (float)sum;
    int keep = top_k > 0 && top_k < V ? top_k : V;
    double mass = 0, acc = 0;
    int kept = 0;
    if (keep == V && top_p >= 1.0) {
        kept = V;
        mass = 1.0;
    } else {
        for (int i = 0; i < keep; i++) {
            int b = i;
            for (int j = i + 1; j < V; j++) if (prob[idx[j]] > prob[idx[b]]) b = j;
            int t = idx[i]; idx[i] = idx[b]; idx[b] = t;
            mass += prob[idx[i]];
            kept = i + 1;
            if (mass >= top_p) break;
        }
    }
    u *= mass;
    for (int i = 0; i < kept; i++) { acc += prob[idx[i]]; if (u < acc) return idx[i]; }
    return idx[kept - 1];
}

int mt_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "";
    int max_new = 64, top_k = 0, stop_eot = 1, no_stop = 0, threads = 0;
    double temp = 1.0, top_p = 1.0;
    uint64_t seed = 1;
    mt_arg specs[] = {
        {"ckpt", MT_ARG_STR, &ckpt, "checkpoint or run folder (required)", NULL},
        {"prompt", MT_ARG_STR, &prompt, "text to continue (a document start is implied)", NULL},
        {"max-new", MT_ARG_INT, &max_new, "tokens to generate (default 64)", NULL},
        {"temperature", MT_ARG_DBL, &temp, "sampling temperature, 0 = greedy (default 1.0)", NULL},
        {"top-k", MT_ARG_INT, &top_k, "sample from the k most likely tokens, 0 = all (default 0)", NULL},
        {"top-p", MT_ARG_DBL, &top_p, "nucleus sampling mass (default 1.0)", NULL},
        {"seed", MT_ARG_U64, &seed, "sampling seed (default 1)", NULL},
        {"no-stop", MT_ARG_BOOL, &no_stop, "do not stop at the end-of-text token", NULL},
        {"threads", MT_ARG_INT, &threads, "threads (default all cores)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("generate", "--ckpt DIR --prompt TEXT [flags]", specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!ckpt) { mt_error("moetrain generate: --ckpt DIR is required"); return mt_cli_fail(); }
    if (temp < 0 || top_p <= 0 || top_p > 1) {
        mt_error("moetrain generate: need --temperature >= 0 and 0 < --top-p <= 1");
        return mt_cli_fail();
    }
    stop_eot = !no_stop;
    if (threads > 0) mt_set_threads(threads);
    mt_model m;
    if (mt_ckpt_open_model(ckpt, &m, NULL, 0) != 0) return mt_cli_fail();
    const int V = m.cfg.vocab_size;
    if (V <= MT_BYTE_EOT) { /* prompts are bytes after an end-of-text token */
        mt_error("moetrain generate: the prompt is byte tokens after end-of-text %d: vocab_size %d is too small",
                 MT_BYTE_EOT, V);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    int plen = 1 + (int)strlen(prompt);
    int Tmax = max_new < m.cfg.max_position_embeddings - plen ? plen + max_new : m.cfg.max_position_embeddings;
    if (plen > Tmax) {
        mt_error("moetrain generate: prompt of %d tokens exceeds max_position_embeddings %d", plen, m.cfg.max_position_embeddings);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    int32_t *tok = mt_xcalloc((size_t)Tmax, sizeof(int32_t)), *tgt = mt_xmalloc(sizeof(int32_t) * Tmax);
    for (int i = 0; i < Tmax; i++) tgt[i] = -1;
    tok[0] = MT_BYTE_EOT;
    for (int i = 1; i < plen; i++) tok[i] = (unsigned char)prompt[i - 1];
    float *logits = mt_alloc(sizeof(float) * (size_t)Tmax * V);
    float *prob = mt_alloc(sizeof(float) * V);
    int *idx = mt_xmalloc(sizeof(int) * V);
    mt_acts *a = mt_acts_new(&m.cfg, 1, Tmax, mt_get_threads());
    mt_step_stats st;
    fputs(prompt, stdout);
    int len = plen;
    for (int s = 0; s < max_new && len < Tmax; s++) {
        mt_model_step(&m, a, tok, tgt, 1, len, 0, 0, 0, logits, &st);
        const float *l = logits + (size_t)(len - 1) * V;
        double u = mt_u01(mt_hash4(seed, 0x67656e, (uint64_t)s, 0));
        int next = temp == 0 ? argmax(l, V) : sample_token(l, V, temp, top_k, top_p, u, prob, idx);
        if (stop_eot && next == MT_BYTE_EOT) break;
        tok[len++] = next;
        if (next < 256) putchar(next);
        else printf("<%d>", next);
        fflush(stdout);
    }
    putchar('\n');
    mt_acts_free(a);
    free(idx);
    mt_free(prob);
    mt_free(logits);
    free(tok);
    free(tgt);
    mt_model_free(&m);
    return 0;
}
