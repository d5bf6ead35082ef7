/* data/tokenizer.c — the byte tokenizer, and a tokenizer of either kind behind one
 * interface (see tokenizer.h; the BPE itself is data/bpe.c). */
#include "data/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/json.h"
#include "data/bpe.h"

size_t mt_byte_encode(const char *s, size_t n, uint32_t *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) out[i] = u[i];
    return n;
}

size_t mt_byte_decode(const uint32_t *tok, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n && w < cap; i++) {
        if (tok[i] == MT_BYTE_EOT) continue;
        out[w++] = tok[i] < 256 ? (char)(unsigned char)tok[i] : '?';
    }
    if (w < cap) out[w] = 0;
    return w;
}

void mt_tokenizer_byte(mt_tokenizer *t) {
    MT_ASSERT(t);
    memset(t, 0, sizeof *t);
    t->eot = MT_BYTE_EOT;
    t->vocab = MT_BYTE_VOCAB;
}

void mt_tokenizer_free(mt_tokenizer *t) {
    if (!t) return;
    mt_bpe_free(t->bpe);
    free(t->eot_name);
    free(t->json);
    mt_tokenizer_byte(t);
}

/* the end-of-text spellings of GPT-2, Llama-3, DeepSeek and SentencePiece-born files */
static const char *const EOT_NAMES[] = {"<|endoftext|>", "<|end_of_text|>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                        "</s>", NULL};

int mt_tokenizer_load(mt_tokenizer *t, const char *path, const char *eot_name) {
    MT_ASSERT(t && path);
    mt_tokenizer_byte(t);
    char *json;
    size_t len;
    if (mt_read_file(path, &json, &len) != 0) return -1;
    mt_bpe *b = mt_bpe_load(path, json, len);
    if (!b) { free(json); return -1; }
    int32_t eot = -1;
    const char *name = eot_name;
    if (name) {
        eot = mt_bpe_find(b, name, strlen(name));
        if (eot < 0) {
            free(json), mt_bpe_free(b);
            return mt_error("%s: end-of-text token \"%s\" is neither in added_tokens nor in model.vocab", path, name);
        }
    } else {
        for (int i = 0; EOT_NAMES[i] && eot < 0; i++) {
            const int32_t id = mt_bpe_find(b, EOT_NAMES[i], strlen(EOT_NAMES[i]));
            if (id >= 0 && mt_bpe_is_special(b, id)) eot = id, name = EOT_NAMES[i];
        }
        if (eot < 0) {
            free(json), mt_bpe_free(b);
            return mt_error("%s: key added_tokens: no special end-of-text token (none of <|endoftext|>, <|end_of_text|>, "
                            "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>, </s>): name one "
                            "(data text --eot-token, or \"eos_token\" in tokenizer_config.json beside it)", path);
        }
    }
    t->bpe = b;
    t->eot = eot;
    t->vocab = mt_bpe_vocab(b);
    t->eot_name = mt_xstrdup(name);
    t->json = json;
    t->json_len = len;
    return 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The "eos_token" of a tokenizer_config.json: a string or {"content": string}; NULL when
 * absent (an error when present but neither). */
static int eos_of_config(const char *path, char **name) {
    *name = NULL;
    cJSON *r = mt_json_read(path);
    if (!r) return -1;
    int rc = 0;
    const cJSON *e = cJSON_IsObject(r) ? cJSON_GetObjectItemCaseSensitive(r, "eos_token") : NULL;
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (cJSON_IsString(e) && *e->valuestring) *name = mt_xstrdup(e->valuestring);
    else if (!cJSON_IsObject(r) || (e && !cJSON_IsNull(e)))
        rc = mt_error("%s: key eos_token: expected the end-of-text token's text (a string)", path);
    cJSON_Delete(r);
    return rc;
}

int mt_tokenizer_load_dir(mt_tokenizer *t, const char *dir) {
    MT_ASSERT(t && dir);
    mt_tokenizer_byte(t);
    char tj[4200], tc[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (!is_file(tj)) return 0;
    char *eos = NULL;
    if (is_file(tc) && eos_of_config(tc, &eos) != 0) return -1;
    const int rc = mt_tokenizer_load(t, tj, eos);
    free(eos);
    return rc;
}

int mt_tokenizer_load_path(mt_tokenizer *t, const char *path, const char *eot_name) {
    struct stat st;
    if (stat(path, &st) != 0) return mt_error("%s: cannot open tokenizer: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return mt_tokenizer_load(t, path, eot_name);
    char tj[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    if (!is_file(tj)) return mt_error("%s: folder has no tokenizer.json", path);
    if (!eot_name) return mt_tokenizer_load_dir(t, path);
    return mt_tokenizer_load(t, tj, eot_name);
}

int mt_tokenizer_save_dir(const mt_tokenizer *t, const char *dir) {
    MT_ASSERT(t && dir);
    char tj[4200], tc[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (!t->bpe) {
        if ((unlink(tj) != 0 && errno != ENOENT) || (unlink(tc) != 0 && errno != ENOENT))
            return mt_error("%s: cannot remove the tokenizer of an earlier run: %s", dir, strerror(errno));
        return 0;
    }
    if (mt_write_file_atomic(tj, t->json, t->json_len) != 0) return -1;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "eos_token", t->eot_name);
    char *txt = cJSON_Print(r);
    cJSON_Delete(r);
    const int rc = mt_write_file_atomic(tc, txt, strlen(txt));
    free(txt);
    return rc;
}

int mt_tokenizer_same(const mt_tokenizer *a, const mt_tokenizer *b) {
    if (!a->bpe || !b->bpe) return !a->bpe && !b->bpe;
    return a->eot == b->eot && a->json_len == b->json_len && memcmp(a->json, b->json, a->json_len) == 0;
}

void mt_tokenizer_describe(const mt_tokenizer *t, char *out, size_t cap) {
    if (!t->bpe) snprintf(out, cap, "the byte tokenizer");
    else snprintf(out, cap, "tokenizer.json (%d ids, end of text %s = %d)", (int)t->vocab, t->eot_name, (int)t->eot);
}

int mt_tokenizer_encode(const mt_tokenizer *t, const char *what, const char *s, size_t n, int32_t **out, size_t *len,
                        size_t *cap) {
    MT_ASSERT(t && out && len && cap && (s || n == 0));
    if (t->bpe) return mt_bpe_encode(t->bpe, what, s, n, out, len, cap);
    if (*len + n > *cap) {
        *cap = *len + n + 256;
        *out = mt_xrealloc(*out, sizeof **out * *cap);
    }
    for (size_t i = 0; i < n; i++) (*out)[(*len)++] = (unsigned char)s[i];
    return 0;
}

void mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *tok, size_t n, char **out, size_t *len, size_t *cap) {
    MT_ASSERT(t && out && len && cap && (tok || n == 0));
    if (t->bpe) { mt_bpe_decode(t->bpe, tok, n, out, len, cap); return; }
    for (size_t i = 0; i <= n; i++) {
        char s[24];
        size_t k = 0;
        if (i < n && tok[i] >= 0 && tok[i] < 256) s[k++] = (char)tok[i];
        else if (i < n) k = (size_t)snprintf(s, sizeof s, "<%d>", (int)tok[i]);
        if (*len + k + 1 > *cap) {
            *cap = 2 * (*len + k + 1) + 64;
            *out = mt_xrealloc(*out, *cap);
        }
        memcpy(*out + *len, s, k);
        *len += k;
        (*out)[*len] = 0;
    }
}

int mt_tokenizer_is_text(const mt_tokenizer *t, int32_t id) {
    if (!t->bpe) return id >= 0 && id < 256;
    return mt_bpe_has(t->bpe, id) && !mt_bpe_is_special(t->bpe, id);
}
