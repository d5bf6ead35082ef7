/* data/bpe.c — Hugging Face byte-level BPE tokenizer.json: load, encode, decode (see bpe.h).
 *
 * Encoding follows the tokenizers library step by step: added tokens are split off the
 * raw text (leftmost-longest, those with normalized=false first, then the others), each
 * Split pre-tokenizer cuts every current piece at its regex matches (a match is a piece of
 * its own), ByteLevel maps each byte to its printable stand-in character, and each piece's
 * characters are merged, always the adjacent pair of lowest merge rank (leftmost on a tie),
 * until no pair has a rank. The regexes run in PCRE2 with UTF and Unicode properties
 * (\p{L}, \p{N}, lookahead), on one piece at a time as the library does. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/common.h"
#include "base/json.h"

/* GPT-2's pre-tokenizer regex: what ByteLevel applies with use_regex true */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- string -> id and pair -> merge tables (open addressing) ---- */

typedef struct {
    uint32_t *slot; /* id + 1, 0 = empty */
    size_t mask;
} strmap;

typedef struct {
    uint64_t *key; /* (left << 32 | right) + 1, 0 = empty */
    int32_t *rank, *merged;
    size_t mask;
} pairmap;

typedef struct {
    char *s;  /* content (NUL-terminated) */
    size_t n;
    int32_t id;
    int special, normalized;
} added_tok;

struct mt_bpe {
    char *arena;           /* every vocabulary string, NUL-separated */
    size_t *off, *len;     /* [vocab] per id; len SIZE_MAX = no vocabulary entry */
    int32_t vocab;         /* 1 + the highest id (vocabulary and added) */
    strmap vmap;
    pairmap merges;
    int32_t byte_id[256];  /* the token of each byte's stand-in character */
    int ignore_merges;
    added_tok *added;
    int nadded;
    unsigned char *is_added; /* [vocab]: 1 added, 2 added and special */
    pcre2_code **split;    /* Split pre-tokenizers in order, then ByteLevel's regex if any */
    int nsplit;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onwards in byte order. */
static void byte_map(uint32_t cp_of[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        const int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* Length of the valid UTF-8 prefix of s[0..n) as Rust's str accepts it (no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t lo = 0, cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f, lo = 0x80;
        else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f, lo = 0x800;
        else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07, lo = 0x10000;
        else return i;
        if (n - i <= k) return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return i;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if (cp < lo || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += k + 1;
    }
    return n;
}

static uint64_t hash_bytes(const char *s, size_t n) { return XXH64(s, n, 0); }

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static size_t table_size(size_t n) {
    size_t c = 16;
    while (c < 2 * n + 1) c *= 2;
    return c;
}

static int32_t vmap_get(const mt_bpe *b, const char *s, size_t n) {
    for (size_t h = hash_bytes(s, n) & b->vmap.mask;; h = (h + 1) & b->vmap.mask) {
        uint32_t v = b->vmap.slot[h];
        if (!v) return -1;
        const int32_t id = (int32_t)v - 1;
        if (b->len[id] == n && memcmp(b->arena + b->off[id], s, n) == 0) return id;
    }
}

static void vmap_put(mt_bpe *b, int32_t id) {
    const char *s = b->arena + b->off[id];
    size_t h = hash_bytes(s, b->len[id]) & b->vmap.mask;
    while (b->vmap.slot[h]) h = (h + 1) & b->vmap.mask;
    b->vmap.slot[h] = (uint32_t)id + 1;
}

/* Rank of merging (l, r) and the id it makes; -1 when the pair has no merge. */
static int32_t pair_get(const pairmap *m, int32_t l, int32_t r, int32_t *merged) {
    const uint64_t k = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (size_t h = hash_u64(k) & m->mask;; h = (h + 1) & m->mask) {
        if (!m->key[h]) return -1;
        if (m->key[h] == k) { *merged = m->merged[h]; return m->rank[h]; }
    }
}

/* 0, or 1 when (l, r) is already there. */
static int pair_put(pairmap *m, int32_t l, int32_t r, int32_t rank, int32_t merged) {
    const uint64_t k = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    size_t h = hash_u64(k) & m->mask;
    for (; m->key[h]; h = (h + 1) & m->mask)
        if (m->key[h] == k) return 1;
    m->key[h] = k, m->rank[h] = rank, m->merged[h] = merged;
    return 0;
}

void mt_bpe_free(mt_bpe *b) {
    if (!b) return;
    free(b->arena);
    free(b->off);
    free(b->len);
    free(b->vmap.slot);
    free(b->merges.key);
    free(b->merges.rank);
    free(b->merges.merged);
    for (int i = 0; i < b->nadded; i++) free(b->added[i].s);
    free(b->added);
    free(b->is_added);
    for (int i = 0; i < b->nsplit; i++) pcre2_code_free(b->split[i]);
    free(b->split);
    free(b);
}

/* ---- loading ---- */

/* 0 when every key of object o is in the NULL-terminated list known, else an error naming
 * the first other one under `where`. */
static int only_keys(const char *path, const char *where, const cJSON *o, const char *const *known) {
    for (const cJSON *c = o->child; c; c = c->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(c->string, known[i]) == 0;
        if (!ok) return mt_error("%s: key %s.%s: not supported (moetrain would tokenize differently)", path, where, c->string);
    }
    return 0;
}

/* 1 when key is absent, null or false; 0 when true; -1 (error) when not a boolean. */
static int is_false(const char *path, const char *where, const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 1;
    if (cJSON_IsTrue(v)) return 0;
    return mt_error("%s: key %s.%s: expected true or false", path, where, key);
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int add_regex(mt_bpe *b, const char *path, const char *where, const char *pat, size_t n, int literal) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err,
                                   &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mt_error("%s: key %s: pattern does not compile at offset %zu: %s", path, where, (size_t)at, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* faster when the library has a JIT; matches alike without */
    b->split = mt_xrealloc(b->split, sizeof *b->split * (size_t)(b->nsplit + 1));
    b->split[b->nsplit++] = re;
    return 0;
}

static int load_bytelevel(mt_bpe *b, const char *path, const char *where, const cJSON *p) {
    static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    if (only_keys(path, where, p, keys) != 0) return -1;
    int f = is_false(path, where, p, "add_prefix_space");
    if (f < 0) return -1;
    if (!f) return mt_error("%s: key %s.add_prefix_space: true is not supported (it inserts a space)", path, where);
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    if (ur && !cJSON_IsBool(ur)) return mt_error("%s: key %s.use_regex: expected true or false", path, where);
    if (!ur || cJSON_IsTrue(ur)) return add_regex(b, path, where, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0);
    return 0;
}

static int load_split(mt_bpe *b, const char *path, const char *where, const cJSON *p) {
    static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
    if (only_keys(path, where, p, keys) != 0) return -1;
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
        return mt_error("%s: key %s.behavior: only \"Isolated\" is supported", path, where);
    int f = is_false(path, where, p, "invert");
    if (f < 0) return -1;
    if (!f) return mt_error("%s: key %s.invert: true is not supported", path, where);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex"), *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    char w[160];
    snprintf(w, sizeof w, "%s.pattern", where);
    if (!cJSON_IsObject(pat) || cJSON_GetArraySize(pat) != 1 || (!cJSON_IsString(re) && !cJSON_IsString(lit)))
        return mt_error("%s: key %s: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}", path, w);
    const char *s = re ? re->valuestring : lit->valuestring;
    if (!*s) return mt_error("%s: key %s: empty pattern", path, w);
    return add_regex(b, path, w, s, strlen(s), !re);
}

static int load_pretok(mt_bpe *b, const char *path, const cJSON *p) {
    const char *t = cJSON_IsObject(p) ? type_of(p) : NULL;
    if (t && strcmp(t, "ByteLevel") == 0) return load_bytelevel(b, path, "pre_tokenizer", p);
    if (t && strcmp(t, "Sequence") == 0) {
        static const char *const keys[] = {"type", "pretokenizers", NULL};
        if (only_keys(path, "pre_tokenizer", p, keys) != 0) return -1;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const int n = cJSON_GetArraySize(list);
        if (!cJSON_IsArray(list) || n < 1) return mt_error("%s: key pre_tokenizer.pretokenizers: expected a non-empty list", path);
        int i = 0;
        for (const cJSON *e = list->child; e; e = e->next, i++) {
            char w[96];
            snprintf(w, sizeof w, "pre_tokenizer.pretokenizers[%d]", i);
            const char *et = cJSON_IsObject(e) ? type_of(e) : NULL;
            if (i == n - 1) { /* ByteLevel last: a Split after it would see the stand-in characters */
                if (!et || strcmp(et, "ByteLevel") != 0)
                    return mt_error("%s: key %s: the last pre-tokenizer must be ByteLevel (got %s)", path, w, et ? et : "?");
                if (load_bytelevel(b, path, w, e) != 0) return -1;
            } else {
                if (!et || strcmp(et, "Split") != 0)
                    return mt_error("%s: key %s: type %s not supported (Split, then ByteLevel last)", path, w, et ? et : "?");
                if (load_split(b, path, w, e) != 0) return -1;
            }
        }
        return 0;
    }
    return mt_error("%s: key pre_tokenizer: type %s not supported (ByteLevel, or a Sequence of Split ending in ByteLevel)",
                    path, t ? t : "null");
}

static int load_vocab(mt_bpe *b, const char *path, const cJSON *model) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(v) || !v->child) return mt_error("%s: key model.vocab: expected a non-empty object", path);
    size_t n = 0, bytes = 0;
    int32_t top = -1;
    for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777215 || e->valuedouble != (int32_t)e->valuedouble)
            return mt_error("%s: key model.vocab.%s: expected an id in 0..16777215", path, e->string);
        if ((int32_t)e->valuedouble > top) top = (int32_t)e->valuedouble;
        n++;
        bytes += strlen(e->string) + 1;
    }
    b->vocab = top + 1;
    b->arena = mt_xmalloc(bytes);
    b->off = mt_xmalloc(sizeof *b->off * (size_t)b->vocab);
    b->len = mt_xmalloc(sizeof *b->len * (size_t)b->vocab);
    for (int32_t i = 0; i < b->vocab; i++) b->len[i] = SIZE_MAX;
    b->vmap.mask = table_size(n) - 1;
    b->vmap.slot = mt_xcalloc(b->vmap.mask + 1, sizeof *b->vmap.slot);
    size_t used = 0;
    for (const cJSON *e = v->child; e; e = e->next) {
        const int32_t id = (int32_t)e->valuedouble;
        const size_t len = strlen(e->string);
        if (b->len[id] != SIZE_MAX)
            return mt_error("%s: key model.vocab.%s: id %d is also the id of \"%s\"", path, e->string, id,
                            b->arena + b->off[id]);
        if (len == 0) return mt_error("%s: key model.vocab: an empty token", path);
        memcpy(b->arena + used, e->string, len + 1);
        b->off[id] = used, b->len[id] = len;
        used += len + 1;
        vmap_put(b, id);
    }
    return 0;
}

/* Splits a merge entry ("a b" or ["a", "b"]) into its two parts. */
static int merge_parts(const char *path, int i, const cJSON *e, const char **l, size_t *ln, const char **r, size_t *rn) {
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return mt_error("%s: key model.merges[%d]: \"%s\" is not two tokens separated by one space", path, i, s);
        *l = s, *ln = (size_t)(sp - s), *r = sp + 1, *rn = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
        *l = e->child->valuestring, *ln = strlen(*l), *r = e->child->next->valuestring, *rn = strlen(*r);
        return 0;
    }
    return mt_error("%s: key model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", path, i);
}

static int load_merges(mt_bpe *b, const char *path, const cJSON *model) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(m)) return mt_error("%s: key model.merges: expected a list", path);
    const int n = cJSON_GetArraySize(m);
    b->merges.mask = table_size((size_t)n) - 1;
    b->merges.key = mt_xcalloc(b->merges.mask + 1, sizeof *b->merges.key);
    b->merges.rank = mt_xmalloc(sizeof *b->merges.rank * (b->merges.mask + 1));
    b->merges.merged = mt_xmalloc(sizeof *b->merges.merged * (b->merges.mask + 1));
    char *cat = NULL;
    size_t catcap = 0;
    int i = 0, rc = 0;
    for (const cJSON *e = m->child; e && rc == 0; e = e->next, i++) {
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        if ((rc = merge_parts(path, i, e, &l, &ln, &r, &rn)) != 0) break;
        if (ln + rn + 1 > catcap) cat = mt_xrealloc(cat, catcap = 2 * (ln + rn + 1));
        memcpy(cat, l, ln);
        memcpy(cat + ln, r, rn);
        const int32_t li = vmap_get(b, l, ln), ri = vmap_get(b, r, rn), mi = vmap_get(b, cat, ln + rn);
        if (li < 0 || ri < 0 || mi < 0)
            rc = mt_error("%s: key model.merges[%d]: \"%.*s\" is not in model.vocab", path, i,
                          (int)(li < 0 ? ln : ri < 0 ? rn : ln + rn), li < 0 ? l : ri < 0 ? r : cat);
        else if (pair_put(&b->merges, li, ri, i, mi))
            rc = mt_error("%s: key model.merges[%d]: \"%.*s\" \"%.*s\" repeats an earlier merge", path, i, (int)ln, l,
                          (int)rn, r);
    }
    free(cat);
    return rc;
}

static int load_model(mt_bpe *b, const char *path, const cJSON *model) {
    static const char *const keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                       "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges", NULL};
    const char *t = cJSON_IsObject(model) ? type_of(model) : NULL;
    if (!t || strcmp(t, "BPE") != 0)
        return mt_error("%s: key model.type: %s not supported (only BPE)", path, t ? t : "missing");
    if (only_keys(path, "model", model, keys) != 0) return -1;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (d && !cJSON_IsNull(d) && !(cJSON_IsNumber(d) && d->valuedouble == 0))
        return mt_error("%s: key model.dropout: BPE dropout is not supported (must be null)", path);
    static const char *const empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(model, empty[i]);
        if (s && !cJSON_IsNull(s) && !(cJSON_IsString(s) && !*s->valuestring))
            return mt_error("%s: key model.%s: not supported (must be null or \"\")", path, empty[i]);
    }
    int f = is_false(path, "model", model, "byte_fallback");
    if (f < 0) return -1;
    if (!f) return mt_error("%s: key model.byte_fallback: true is not supported", path);
    if ((f = is_false(path, "model", model, "ignore_merges")) < 0) return -1;
    b->ignore_merges = !f;
    if (load_vocab(b, path, model) != 0 || load_merges(b, path, model) != 0) return -1;
    uint32_t cp[256];
    byte_map(cp);
    for (int c = 0; c < 256; c++) {
        char u[4];
        const size_t k = put_utf8(u, cp[c]);
        if ((b->byte_id[c] = vmap_get(b, u, k)) < 0)
            return mt_error("%s: key model.vocab: no token for byte 0x%02x (\"%.*s\"): not a byte-level vocabulary", path, c,
                            (int)k, u);
    }
    return 0;
}

static int load_added(mt_bpe *b, const char *path, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return mt_error("%s: key added_tokens: expected a list", path);
    static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special", NULL};
    int n = cJSON_GetArraySize(list), i = 0;
    b->added = mt_xcalloc((size_t)n + 1, sizeof *b->added);
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char w[64];
        snprintf(w, sizeof w, "added_tokens[%d]", i);
        if (!cJSON_IsObject(e)) return mt_error("%s: key %s: expected an object", path, w);
        if (only_keys(path, w, e, keys) != 0) return -1;
        double id;
        int r = mt_json_number(path, e, "id", 1, 0, 16777215, "0 .. 16777215", &id);
        if (r < 0) return -1;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (r == 0 || !cJSON_IsString(c) || !*c->valuestring)
            return mt_error("%s: key %s: needs an integer id and a non-empty content", path, w);
        static const char *const off[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++) {
            int f = is_false(path, w, e, off[k]);
            if (f < 0) return -1;
            if (!f) return mt_error("%s: key %s.%s: true is not supported", path, w, off[k]);
        }
        const int sp_f = is_false(path, w, e, "special");
        if (sp_f < 0) return -1;
        /* an entry without "normalized" is normalized unless special, as the library reads it */
        const cJSON *nzv = cJSON_GetObjectItemCaseSensitive(e, "normalized");
        const int nz_f = nzv ? is_false(path, w, e, "normalized") : !sp_f;
        if (nz_f < 0) return -1;
        const int sp = !sp_f, nz = !nz_f;
        const int32_t in_vocab = vmap_get(b, c->valuestring, strlen(c->valuestring));
        if (in_vocab >= 0 && in_vocab != (int32_t)id)
            return mt_error("%s: key %s: \"%s\" is id %d in model.vocab, not %d", path, w, c->valuestring, in_vocab, (int)id);
        if ((int32_t)id < b->vocab && b->len[(int32_t)id] != SIZE_MAX && in_vocab != (int32_t)id)
            return mt_error("%s: key %s: id %d is \"%s\" in model.vocab", path, w, (int)id, b->arena + b->off[(int32_t)id]);
        for (int k = 0; k < b->nadded; k++)
            if (b->added[k].id == (int32_t)id || strcmp(b->added[k].s, c->valuestring) == 0)
                return mt_error("%s: key %s: repeats the id or content of added_tokens[%d]", path, w, k);
        b->added[b->nadded++] = (added_tok){mt_xstrdup(c->valuestring), strlen(c->valuestring), (int32_t)id, sp, nz};
    }
    int32_t top = b->vocab;
    for (int k = 0; k < b->nadded; k++) top = b->added[k].id + 1 > top ? b->added[k].id + 1 : top;
    if (top > b->vocab) {
        b->off = mt_xrealloc(b->off, sizeof *b->off * (size_t)top);
        b->len = mt_xrealloc(b->len, sizeof *b->len * (size_t)top);
        for (int32_t k = b->vocab; k < top; k++) b->len[k] = SIZE_MAX;
        b->vocab = top;
    }
    b->is_added = mt_xcalloc((size_t)b->vocab, 1);
    for (int k = 0; k < b->nadded; k++) b->is_added[b->added[k].id] = b->added[k].special ? 2 : 1;
    return 0;
}

static int load_root(mt_bpe *b, const char *path, const cJSON *root) {
    static const char *const keys[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if (!cJSON_IsObject(root)) return mt_error("%s: not a tokenizer.json (expected a JSON object)", path);
    if (only_keys(path, "(top level)", root, keys) != 0) return -1;
    static const char *const nulls[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, nulls[i]);
        if (v && !cJSON_IsNull(v)) return mt_error("%s: key %s: must be null (it changes the encoding)", path, nulls[i]);
    }
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (nz && !cJSON_IsNull(nz)) {
        const char *t = cJSON_IsObject(nz) ? type_of(nz) : NULL;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(nz, "normalizers");
        if (!t || strcmp(t, "Sequence") != 0 || !cJSON_IsArray(list) || cJSON_GetArraySize(list) != 0)
            return mt_error("%s: key normalizer: type %s changes the text before tokenization: not supported (null only)",
                            path, t ? t : "?");
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dt = cJSON_IsObject(dec) ? type_of(dec) : NULL;
    if (!dt || strcmp(dt, "ByteLevel") != 0)
        return mt_error("%s: key decoder: type %s not supported (only ByteLevel)", path, dt ? dt : "null");
    if (load_model(b, path, cJSON_GetObjectItemCaseSensitive(root, "model")) != 0) return -1;
    if (load_added(b, path, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) != 0) return -1;
    return load_pretok(b, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
}

mt_bpe *mt_bpe_load(const char *path, const char *json, size_t len) {
    MT_ASSERT(path && json);
    cJSON *root = mt_json_parse(path, json, len);
    if (!root) return NULL;
    mt_bpe *b = mt_xcalloc(1, sizeof *b);
    const int rc = load_root(b, path, root);
    cJSON_Delete(root);
    if (rc != 0) { mt_bpe_free(b); return NULL; }
    return b;
}

int32_t mt_bpe_vocab(const mt_bpe *b) { return b->vocab; }

int32_t mt_bpe_find(const mt_bpe *b, const char *s, size_t n) {
    for (int k = 0; k < b->nadded; k++)
        if (b->added[k].n == n && memcmp(b->added[k].s, s, n) == 0) return b->added[k].id;
    return vmap_get(b, s, n);
}

int mt_bpe_is_special(const mt_bpe *b, int32_t id) { return id >= 0 && id < b->vocab && b->is_added[id] == 2; }

int mt_bpe_has(const mt_bpe *b, int32_t id) {
    return id >= 0 && id < b->vocab && (b->len[id] != SIZE_MAX || b->is_added[id]);
}

/* ---- encoding ---- */

typedef struct {
    int32_t **out;
    size_t *len, *cap;
} sink;

static void emit(sink *k, int32_t id) {
    if (*k->len == *k->cap) {
        *k->cap = *k->cap ? 2 * *k->cap : 256;
        *k->out = mt_xrealloc(*k->out, sizeof **k->out * *k->cap);
    }
    (*k->out)[(*k->len)++] = id;
}

typedef struct {
    int32_t *sym;    /* the piece's symbols while merging */
    size_t cap;
    char *mapped;    /* the piece in stand-in characters (ignore_merges) */
    size_t mcap;
} scratch;

/* Merges the bytes of one pre-token s[0..n) and emits its tokens. */
static void bpe_piece(const mt_bpe *b, const unsigned char *s, size_t n, scratch *w, sink *k) {
    if (b->ignore_merges) { /* a pre-token that is a whole vocabulary entry is that token */
        if (3 * n > w->mcap) w->mapped = mt_xrealloc(w->mapped, w->mcap = 3 * n + 16);
        uint32_t cp[256];
        byte_map(cp);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += put_utf8(w->mapped + m, cp[s[i]]);
        const int32_t id = vmap_get(b, w->mapped, m);
        if (id >= 0) { emit(k, id); return; }
    }
    if (n > w->cap) w->sym = mt_xrealloc(w->sym, sizeof *w->sym * (w->cap = n + 16));
    int32_t *sym = w->sym;
    size_t m = n;
    for (size_t i = 0; i < n; i++) sym[i] = b->byte_id[s[i]];
    while (m > 1) {
        int32_t best = -1, best_id = -1, merged;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            const int32_t r = pair_get(&b->merges, sym[i], sym[i + 1], &merged);
            if (r >= 0 && (best < 0 || r < best)) best = r, best_id = merged, at = i;
        }
        if (best < 0) break;
        sym[at] = best_id;
        memmove(sym + at + 1, sym + at + 2, sizeof *sym * (m - at - 2));
        m--;
    }
    for (size_t i = 0; i < m; i++) emit(k, sym[i]);
}

/* Cuts s[0..n) with split regex r onwards: each match and each gap between matches is a
 * piece for the next regex; after the last regex each piece is merged. */
static int pretok(const mt_bpe *b, int r, const char *s, size_t n, pcre2_match_data *md, scratch *w, sink *k) {
    if (n == 0) return 0;
    if (r == b->nsplit) { bpe_piece(b, (const unsigned char *)s, n, w, k); return 0; }
    size_t at = 0, from = 0;
    while (from < n) {
        const int rc = pcre2_match(b->split[r], (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mt_error("pre-tokenizer regex failed: %s", (char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const size_t m0 = ov[0], m1 = ov[1]; /* the deeper regexes reuse md */
        if (m1 == m0) { /* an empty match cuts nothing: step over one character */
            from = m0 + 1;
            while (from < n && ((unsigned char)s[from] & 0xc0) == 0x80) from++;
            continue;
        }
        if (pretok(b, r + 1, s + at, m0 - at, md, w, k) != 0) return -1;
        if (pretok(b, r + 1, s + m0, m1 - m0, md, w, k) != 0) return -1;
        at = from = m1;
    }
    return pretok(b, r + 1, s + at, n - at, md, w, k);
}

/* Splits off the added tokens of the given kind (normalized or not) leftmost-longest;
 * pass 0 then continues with pass 1 on the text between them, pass 1 with pretok. */
static int split_added(const mt_bpe *b, int pass, const char *s, size_t n, pcre2_match_data *md, scratch *w, sink *k) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int best = -1;
        for (int a = 0; a < b->nadded; a++) {
            const added_tok *t = &b->added[a];
            if (t->normalized != pass || t->n > n - i || t->s[0] != s[i] || memcmp(t->s, s + i, t->n) != 0) continue;
            if (best < 0 || t->n > b->added[best].n) best = a;
        }
        if (best < 0) continue;
        const int rc = pass == 0 ? split_added(b, 1, s + at, i - at, md, w, k) : pretok(b, 0, s + at, i - at, md, w, k);
        if (rc != 0) return -1;
        emit(k, b->added[best].id);
        i += b->added[best].n - 1;
        at = i + 1;
    }
    return pass == 0 ? split_added(b, 1, s + at, n - at, md, w, k) : pretok(b, 0, s + at, n - at, md, w, k);
}

int mt_bpe_encode(const mt_bpe *b, const char *what, const char *s, size_t n, int32_t **out, size_t *len, size_t *cap) {
    MT_ASSERT(b && (s || n == 0) && out && len && cap);
    const size_t ok = utf8_valid((const unsigned char *)s, n);
    if (ok < n) return mt_error("%s: not UTF-8 at byte %zu (0x%02x): a tokenizer.json takes UTF-8 text only", what, ok,
                                (unsigned char)s[ok]);
    sink k = {out, len, cap};
    scratch w = {0};
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    const int rc = split_added(b, 0, s, n, md, &w, &k);
    pcre2_match_data_free(md);
    free(w.sym);
    free(w.mapped);
    return rc;
}

/* ---- decoding ---- */

static void put_bytes(char **out, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1) + 64;
        *out = mt_xrealloc(*out, *cap);
    }
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = 0;
}

void mt_bpe_decode(const mt_bpe *b, const int32_t *tok, size_t n, char **out, size_t *len, size_t *cap) {
    uint32_t cp[256];
    byte_map(cp);
    int16_t byte_of[324]; /* stand-in character -> byte */
    for (int i = 0; i < 324; i++) byte_of[i] = -1;
    for (int c = 0; c < 256; c++) byte_of[cp[c]] = (int16_t)c;
    put_bytes(out, len, cap, "", 0);
    for (size_t i = 0; i < n; i++) {
        const int32_t id = tok[i];
        if (id >= 0 && id < b->vocab && b->is_added[id]) {
            for (int a = 0; a < b->nadded; a++)
                if (b->added[a].id == id) put_bytes(out, len, cap, b->added[a].s, b->added[a].n);
            continue;
        }
        if (id < 0 || id >= b->vocab || b->len[id] == SIZE_MAX) {
            char t[24];
            put_bytes(out, len, cap, t, (size_t)snprintf(t, sizeof t, "<%d>", (int)id));
            continue;
        }
        /* each character back to its byte; a token with any other character is its own
         * UTF-8 text, as the ByteLevel decoder does */
        const unsigned char *s = (const unsigned char *)b->arena + b->off[id];
        const size_t m = b->len[id];
        char buf[64], *dst = m <= sizeof buf ? buf : mt_xmalloc(m);
        size_t k = 0, j = 0;
        while (j < m) {
            uint32_t c = s[j];
            size_t step = 1;
            if (c >= 0xc0 && c < 0xe0 && j + 1 < m) c = (c & 0x1f) << 6 | (s[j + 1] & 0x3f), step = 2;
            else if (c >= 0x80) break;
            if (c >= 324 || byte_of[c] < 0) break;
            dst[k++] = (char)byte_of[c];
            j += step;
        }
        if (j == m) put_bytes(out, len, cap, dst, k);
        else put_bytes(out, len, cap, (const char *)s, m);
        if (dst != buf) free(dst);
    }
}
