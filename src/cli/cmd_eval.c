/* cli/cmd_eval.c — `moetrain eval` (validation loss, math exact-match accuracy) and
 * `moetrain generate` (sampling). Both decode with the rollout engine (rl/rollout.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "data/loader.h"
#include "data/math.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "kernels/blas.h"
#include "rl/reward.h"
#include "rl/rollout.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

/* Greedy-decodes the answers of probs[0..n) with the rollout engine into *correct (the
 * math reward's verdict, rl/reward.h); -1 with an error. */
static int math_accuracy(mt_model *m, const mt_math_problem *probs, size_t n, int max_new, int show, size_t *correct_out) {
    const int maxpos = m->cfg.max_position_embeddings;
    mt_rollout_req *req = mt_xcalloc(n + 1, sizeof *req);
    int32_t *toks = mt_xmalloc(sizeof(int32_t) * (n * 66 + 1));
    size_t *which = mt_xmalloc(sizeof(size_t) * (n + 1)), nr = 0, too_long = 0, correct = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *t = toks + i * 66;
        const int len = (int)mt_prompt_ntokens(probs[i].prompt);
        if (len > 66 || len + max_new > maxpos) { /* no room for an answer: counted as wrong */
            too_long++;
            continue;
        }
        mt_prompt_encode(probs[i].prompt, t);
        req[nr] = (mt_rollout_req){t, len, i, 0};
        which[nr++] = i;
    }
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.temperature = 0;
    o.max_new = max_new;
    o.no_logp = 1; /* only the answers are scored */
    mt_completion *out = mt_xcalloc(nr + 1, sizeof *out);
    mt_rollout_stats st;
    if (mt_rollout(m, &o, req, (int)nr, out, &st) != 0) {
        free(out), free(which), free(toks), free(req);
        return -1;
    }
    for (size_t r = 0; r < nr; r++) {
        const mt_completion *co = &out[r];
        const mt_math_problem *p = &probs[which[r]];
        const int ok = mt_math_verdict(co->tokens, co->n, co->stopped_eot, p->answer) == MT_VERDICT_CORRECT;
        char ans[256]; /* what it said, for --show */
        int k = 0;
        for (int j = 0; j < co->n - co->stopped_eot && k < 255; j++) ans[k++] = (char)co->tokens[j];
        ans[k] = 0;
        correct += ok;
        if (show > 0 && which[r] < (size_t)show)
            printf("  %-16s -> %-10s %s%s%s\n", p->prompt, ans, ok ? "ok" : "WRONG (want ", ok ? "" : p->answer,
                   ok ? "" : ")");
        mt_completion_free(&out[r]);
    }
    if (too_long)
        mt_warn("%zu problems are longer than max_position_embeddings allows for an answer; counted as wrong",
                too_long);
    free(out);
    free(which);
    free(toks);
    free(req);
    *correct_out = correct;
    return 0;
}

int mt_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL;
    int T = 0, windows = 256, batch = 8, nprob = 500, max_new = 16, show = 0, threads = 0, doc = 0, eot = 256;
    int allow_nonfinite = 0, eot_given = 0;
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
        {"eot", MT_ARG_INT, &eot, "end-of-text token id for --doc-mode (default: the checkpoint tokenizer's, 256 for bytes)", &eot_given},
        {"allow-nonfinite", MT_ARG_BOOL, &allow_nonfinite, "load a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
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
    if (mt_ckpt_open_model(ckpt, &m, dir, sizeof dir, allow_nonfinite) != 0) return mt_cli_fail();
    if (T <= 0) T = m.cfg.max_position_embeddings < 256 ? m.cfg.max_position_embeddings : 256;
    mt_tokenizer tk, dtk; /* the checkpoint's and the data folder's must be one */
    mt_tokenizer_byte(&dtk);
    struct stat dst;
    const int data_dir = stat(data, &dst) == 0 && S_ISDIR(dst.st_mode);
    if (mt_tokenizer_load_dir(&tk, dir) != 0 || (data_dir && mt_tokenizer_load_dir(&dtk, data) != 0)) {
        mt_tokenizer_free(&tk);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    const int bpe = tk.bpe != NULL, same = !data_dir || mt_tokenizer_same(&tk, &dtk);
    if (bpe && !eot_given) eot = tk.eot;
    char da[512], db[512];
    mt_tokenizer_describe(&dtk, da, sizeof da);
    mt_tokenizer_describe(&tk, db, sizeof db);
    mt_tokenizer_free(&tk);
    mt_tokenizer_free(&dtk);
    if (!same) {
        mt_error("moetrain eval: the data %s was made with %s, checkpoint %s with %s: they must be the same", data, da,
                 dir, db);
        mt_model_free(&m);
        return mt_cli_fail();
    }
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
        mt_error("%s: token id %u does not fit %s/config.json: key vocab_size: %d", mt_loader_max_token_file(val),
                 mt_loader_max_token(val), dir, m.cfg.vocab_size);
        mt_loader_free(val);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    mt_acts *a = mt_acts_new(&m.cfg, batch, T, mt_get_threads(), 0);
    double vl = mt_eval_loss(&m, a, val, batch, T, windows, doc ? eot : -1);
    uint64_t nw = mt_loader_windows(val);
    printf("val_loss=%.6f (%llu windows of %d tokens, %s)\n", vl,
           (unsigned long long)(windows <= 0 || (uint64_t)windows > nw ? nw : (uint64_t)windows), T, dir);
    mt_acts_free(a);
    if (nprob > 0 && bpe) {
        printf("accuracy: skipped, the checkpoint has a tokenizer.json and math problems are byte-tokenizer documents\n");
    } else if (nprob > 0) {
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
            size_t ok = 0;
            if (math_accuracy(&m, probs, count, max_new, show, &ok) != 0) {
                free(probs);
                mt_loader_free(val);
                mt_model_free(&m);
                return mt_cli_fail();
            }
            printf("accuracy=%.4f (%zu/%zu held-out problems exactly right, greedy decoding)\n",
                   (double)ok / (double)count, ok, count);
        }
        free(probs);
    }
    mt_loader_free(val);
    mt_model_free(&m);
    return 0;
}

int mt_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "", *prompts = NULL;
    int max_new = 64, top_k = 0, stop_eot = 1, no_stop = 0, threads = 0, batch = 64, allow_nonfinite = 0, spec = 0;
    double temp = 1.0, top_p = 1.0;
    uint64_t seed = 1;
    mt_arg specs[] = {
        {"ckpt", MT_ARG_STR, &ckpt, "checkpoint or run folder (required)", NULL},
        {"prompt", MT_ARG_STR, &prompt, "text to continue (a document start is implied)", NULL},
        {"prompts", MT_ARG_STR, &prompts, "file of prompts, one per line: prints prompt<TAB>completion per line and the decode speed", NULL},
        {"batch", MT_ARG_INT, &batch, "sequences decoded together (KV cache slots, default 64)", NULL},
        {"max-new", MT_ARG_INT, &max_new, "tokens to generate (default 64)", NULL},
        {"temperature", MT_ARG_DBL, &temp, "sampling temperature, 0 = greedy (default 1.0)", NULL},
        {"top-k", MT_ARG_INT, &top_k, "sample from the k most likely tokens, 0 = all (default 0)", NULL},
        {"top-p", MT_ARG_DBL, &top_p, "nucleus sampling mass (default 1.0)", NULL},
        {"seed", MT_ARG_U64, &seed, "sampling seed (default 1)", NULL},
        {"no-stop", MT_ARG_BOOL, &no_stop, "do not stop at the end-of-text token", NULL},
        {"speculative", MT_ARG_BOOL, &spec, "speculative decoding: the model's MTP block drafts the token after next, the next forward verifies it (the same tokens, fewer forwards; needs num_nextn_predict_layers >= 1)", NULL},
        {"threads", MT_ARG_INT, &threads, "threads (default all cores)", NULL},
        {"allow-nonfinite", MT_ARG_BOOL, &allow_nonfinite, "load a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
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
    if (batch < 1) { mt_error("moetrain generate: --batch must be >= 1"); return mt_cli_fail(); }
    /* the prompts: --prompt, or one per line of --prompts */
    char *text = NULL;
    size_t tlen = 0;
    if (prompts) {
        if (mt_read_file(prompts, &text, &tlen) != 0) return mt_cli_fail();
    } else {
        text = mt_xstrdup(prompt);
        tlen = strlen(text);
    }
    int np = 0, capp = 16;
    char **lines = mt_xmalloc(sizeof(char *) * (size_t)capp);
    for (char *p = text, *e; p < text + tlen || (!prompts && np == 0); p = e + 1) {
        e = memchr(p, '\n', (size_t)(text + tlen - p));
        if (!e) e = text + tlen;
        *e = 0;
        if (prompts && e > p && e[-1] == '\r') e[-1] = 0;
        if (np == capp) lines = mt_xrealloc(lines, sizeof(char *) * (size_t)(capp *= 2));
        lines[np++] = p;
        if (e >= text + tlen) break;
    }
    if (prompts && np > 0 && lines[np - 1][0] == 0) np--; /* a final newline */
    if (np == 0) {
        mt_error("moetrain generate: %s holds no prompts", prompts);
        free(lines);
        free(text);
        return mt_cli_fail();
    }
    mt_model m;
    char dir[4096];
    if (mt_ckpt_open_model(ckpt, &m, dir, sizeof dir, allow_nonfinite) != 0) { free(lines); free(text); return mt_cli_fail(); }
    const int V = m.cfg.vocab_size;
    mt_tokenizer tk; /* the checkpoint's: tokenizer.json beside config.json, else bytes */
    if (mt_tokenizer_load_dir(&tk, dir) != 0) rc = -1;
    else if (!tk.bpe && V <= MT_BYTE_EOT) /* prompts are bytes after an end-of-text token */
        rc = mt_error("moetrain generate: the prompt is byte tokens after end-of-text %d: vocab_size %d is too small",
                      MT_BYTE_EOT, V);
    else if (tk.bpe && tk.vocab > V)
        rc = mt_error("%s/tokenizer.json: %d ids do not fit %s/config.json: key vocab_size: %d", dir, (int)tk.vocab, dir, V);
    if (rc != 0) {
        mt_tokenizer_free(&tk);
        mt_model_free(&m);
        free(lines);
        free(text);
        return mt_cli_fail();
    }
    /* every prompt is a document start: end-of-text, then the prompt's tokens */
    int32_t *toks = NULL;
    size_t ntok = 0, tcap = 0, *start = mt_xmalloc(sizeof(size_t) * (size_t)(np + 1));
    for (int i = 0; i < np && rc == 0; i++) {
        start[i] = ntok;
        if (ntok == tcap) toks = mt_xrealloc(toks, sizeof *toks * (tcap = 2 * tcap + 16));
        toks[ntok++] = tk.eot;
        if (mt_tokenizer_encode(&tk, prompts ? prompts : "--prompt", lines[i], strlen(lines[i]), &toks, &ntok, &tcap) != 0)
            rc = -1;
    }
    start[np] = ntok;
    mt_rollout_req *req = mt_xcalloc((size_t)np, sizeof *req);
    for (int i = 0; i < np && rc == 0; i++)
        req[i] = (mt_rollout_req){toks + start[i], (int)(start[i + 1] - start[i]), (uint64_t)i, 0};
    free(start);
    mt_rollout_opts o;
    mt_rollout_defaults(&o);
    o.temperature = temp, o.top_k = top_k, o.top_p = top_p, o.seed = seed, o.slots = batch, o.speculative = spec;
    o.eot = stop_eot ? tk.eot : -1;
    o.no_logp = 1; /* generate prints the text only */
    /* without --max-new given, a long prompt still gets what fits */
    int longest = 0;
    for (int i = 0; i < np; i++) longest = req[i].len > longest ? req[i].len : longest;
    o.max_new = max_new;
    if (longest + o.max_new > m.cfg.max_position_embeddings) o.max_new = m.cfg.max_position_embeddings - longest;
    if (rc == 0 && o.max_new < 1) {
        mt_error("moetrain generate: a prompt of %d tokens leaves no room under max_position_embeddings %d", longest,
                 m.cfg.max_position_embeddings);
        rc = -1;
    }
    mt_completion *out = mt_xcalloc((size_t)np, sizeof *out);
    mt_rollout_stats st;
    if (rc == 0 && mt_rollout(&m, &o, req, np, out, &st) != 0) rc = -1;
    char *dec = NULL;
    size_t dlen = 0, dcap = 0;
    for (int i = 0; rc == 0 && i < np; i++) {
        if (prompts) printf("%s\t", lines[i]);
        else fputs(lines[i], stdout);
        const mt_completion *co = &out[i];
        mt_tokenizer_decode(&tk, co->tokens, (size_t)(co->n - co->stopped_eot), &dec, &dlen, &dcap);
        fwrite(dec, 1, dlen, stdout);
        dlen = 0;
        putchar('\n');
    }
    if (rc == 0 && prompts)
        printf("decode: %lld tokens in %.3f s = %.1f tokens/s (batch %d, %d forwards, %.1f MiB KV cache and scratch)\n",
               (long long)st.completion_tokens, st.seconds, st.seconds > 0 ? st.completion_tokens / st.seconds : 0.0,
               o.slots < np ? o.slots : np, st.forwards, (double)st.bytes / 1048576.0);
    if (rc == 0 && spec)
        printf("speculative: %lld drafts, %lld accepted (acceptance %.1f%%)\n", (long long)st.drafted,
               (long long)st.accepted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0);
    for (int i = 0; i < np; i++) mt_completion_free(&out[i]);
    free(dec);
    mt_tokenizer_free(&tk);
    free(out);
    free(req);
    free(toks);
    free(lines);
    free(text);
    mt_model_free(&m);
    return rc == 0 ? 0 : mt_cli_fail();
}
