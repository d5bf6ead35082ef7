/* data/prompts.c — RL prompt files (see prompts.h). */
#include "data/prompts.h"

#include "base/common.h"
#include "data/math.h"
#include "data/tokenizer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW 40 /* bytes of a bad field quoted in an error */

/* NULL if the n bytes of a field may stand in a prompt file, else what is wrong. */
static const char *field_problem(const char *s, size_t n) {
    if (n == 0) return "is empty";
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\t') return "holds a second TAB (expected PROMPT<TAB>ANSWER)";
        if (s[i] == '\r') return "holds a CR byte (line ends are LF only)";
        if (s[i] == '\n') return "holds a line feed";
        if (s[i] == 0) return "holds a NUL byte";
    }
    return NULL;
}

/* Math check of one line; 0 or an error naming where. */
static int check_math(const char *where, const char *prompt, size_t plen, const char *answer, size_t alen) {
    long long v;
    if (plen < 2 || prompt[plen - 1] != '=' || memchr(prompt, '=', plen - 1) || mt_math_eval(prompt, &v) != 0)
        return mt_error("%s: prompt '%.*s' is not an arithmetic expression followed by '='", where,
                        SHOW, prompt);
    if (!mt_math_canonical(answer, alen))
        return mt_error("%s: answer '%.*s' is not an integer in canonical form -?(0|[1-9][0-9]*)", where, SHOW,
                        answer);
    char want[32];
    int wl = snprintf(want, sizeof want, "%lld", v);
    if ((size_t)wl != alen || memcmp(want, answer, alen) != 0)
        return mt_error("%s: answer %.*s is wrong, %.*s is %s", where, SHOW, answer, SHOW, prompt, want);
    return 0;
}

int mt_prompts_load(const char *path, int flags, mt_prompt_set *s) {
    MT_ASSERT(path && s);
    memset(s, 0, sizeof *s);
    char *text;
    size_t len;
    if (mt_read_file(path, &text, &len) != 0) return -1;
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    if (len > 0 && text[len - 1] != '\n') lines++; /* a last line without its LF */
    if (lines == 0) { free(text); return mt_error("%s: no prompts (empty file)", path); }
    s->prompt = mt_xmalloc(lines * sizeof *s->prompt);
    s->answer = mt_xmalloc(lines * sizeof *s->answer);
    s->text = text;
    size_t at = 0;
    for (size_t ln = 1; ln <= lines; ln++) {
        char *line = text + at, *nl = memchr(line, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - line) : len - at;
        at += ll + 1;
        char where[1100];
        snprintf(where, sizeof where, "%s:%zu", path, ln);
        char *tab = memchr(line, '\t', ll);
        const char *bad = NULL;
        size_t plen = tab ? (size_t)(tab - line) : 0, alen = tab ? ll - plen - 1 : 0;
        if (ll == 0) bad = "empty line (expected PROMPT<TAB>ANSWER)";
        else if (!tab) bad = "no TAB (expected PROMPT<TAB>ANSWER)";
        int rc = 0;
        if (bad) rc = mt_error("%s: %s", where, bad);
        else if ((bad = field_problem(line, plen))) rc = mt_error("%s: prompt %s", where, bad);
        else if ((bad = field_problem(tab + 1, alen))) rc = mt_error("%s: answer %s", where, bad);
        else {
            line[plen] = 0;
            tab[1 + alen] = 0; /* the LF, or the terminating NUL mt_read_file adds */
            if (flags & MT_PROMPTS_MATH) rc = check_math(where, line, plen, tab + 1, alen);
        }
        if (rc != 0) { mt_prompts_free(s); return -1; }
        s->prompt[s->n] = line;
        s->answer[s->n] = tab + 1;
        s->n++;
    }
    return 0;
}

int mt_prompts_encode(mt_prompt_set *s, const char *path, const mt_tokenizer *tk) {
    MT_ASSERT(s && tk);
    free(s->tok);
    free(s->tok_at);
    s->tk = tk;
    s->tok = NULL;
    s->tok_at = mt_xmalloc(sizeof *s->tok_at * (s->n + 1));
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < s->n; i++) {
        s->tok_at[i] = len;
        if (len == cap) s->tok = mt_xrealloc(s->tok, sizeof *s->tok * (cap = 2 * cap + 64));
        s->tok[len++] = tk->eot;
        char where[1100];
        snprintf(where, sizeof where, "%s:%zu: prompt", path, i + 1);
        if (mt_tokenizer_encode(tk, where, s->prompt[i], strlen(s->prompt[i]), &s->tok, &len, &cap) != 0) return -1;
    }
    s->tok_at[s->n] = len;
    return 0;
}

size_t mt_prompt_len(const mt_prompt_set *s, size_t i) {
    MT_ASSERT(s->tok_at && i < s->n);
    return s->tok_at[i + 1] - s->tok_at[i];
}

size_t mt_prompt_copy(const mt_prompt_set *s, size_t i, int32_t **buf) {
    const size_t n = mt_prompt_len(s, i);
    *buf = mt_xrealloc(*buf, sizeof **buf * (n + 1));
    memcpy(*buf, s->tok + s->tok_at[i], sizeof **buf * n);
    return n;
}

void mt_prompts_free(mt_prompt_set *s) {
    if (!s) return;
    free(s->tok);
    free(s->tok_at);
    free(s->prompt);
    free(s->answer);
    free(s->text);
    memset(s, 0, sizeof *s);
}

size_t mt_prompt_ntokens(const char *prompt) { return 1 + strlen(prompt); }

size_t mt_prompt_encode(const char *prompt, int32_t *out) {
    size_t n = strlen(prompt);
    out[0] = MT_BYTE_EOT;
    for (size_t i = 0; i < n; i++) out[1 + i] = (unsigned char)prompt[i];
    return n + 1;
}

/* ---- writing ---- */

int mt_prompt_writer_open(mt_prompt_writer *w, const char *path) {
    MT_ASSERT(w && path);
    memset(w, 0, sizeof *w);
    size_t n = strlen(path) + 8;
    w->path = mt_xstrdup(path);
    w->tmp = mt_xmalloc(n);
    snprintf(w->tmp, n, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        int rc = mt_error("%s: cannot create: %s", w->tmp, strerror(errno));
        mt_prompt_writer_abort(w);
        return rc;
    }
    return 0;
}

int mt_prompt_writer_add(mt_prompt_writer *w, const char *prompt, size_t plen, const char *answer, size_t alen) {
    MT_ASSERT(w && w->f);
    const char *bad = field_problem(prompt, plen);
    if (bad) return mt_error("%s: line %" PRIu64 ": prompt %s", w->path, w->lines + 1, bad);
    if ((bad = field_problem(answer, alen)))
        return mt_error("%s: line %" PRIu64 ": answer %s", w->path, w->lines + 1, bad);
    if (fwrite(prompt, 1, plen, w->f) != plen || fputc('\t', w->f) == EOF || fwrite(answer, 1, alen, w->f) != alen ||
        fputc('\n', w->f) == EOF)
        return mt_error("%s: write failed: %s", w->tmp, strerror(errno));
    w->lines++;
    return 0;
}

int mt_prompt_writer_finish(mt_prompt_writer *w) {
    MT_ASSERT(w && w->f);
    int rc = 0;
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) rc = mt_error("%s: write failed: %s", w->tmp, strerror(errno));
    if (fclose(w->f) != 0 && rc == 0) rc = mt_error("%s: close failed: %s", w->tmp, strerror(errno));
    w->f = NULL;
    if (rc == 0 && rename(w->tmp, w->path) != 0) rc = mt_error("%s: rename failed: %s", w->path, strerror(errno));
    if (rc == 0) mt_fsync_dir_of(w->path);
    mt_prompt_writer_abort(w); /* frees; the .tmp is gone after a rename */
    return rc;
}

void mt_prompt_writer_abort(mt_prompt_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}
