/* data/math.c — the synthetic arithmetic corpus (see math.h).
 *
 * Validation is drawn first and its texts go into a set of XXH64 hashes; a training draw
 * whose hash is in the set is redrawn with the next attempt counter. Equal texts always
 * hash equal, so no validation text can reach train (a 64-bit collision between different
 * texts only costs a redraw). The problem space is counted up front so an impossible
 * request errors instead of looping, and attempts are capped as a last resort. */
#include "data/math.h"

#include "base/common.h"
#include "data/prompts.h"
#include "data/text.h"
#include "data/tokenizer.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SPLIT_VAL 0x76616cULL    /* "val" */
#define SPLIT_TRAIN 0x747261ULL  /* "tra" */
#define MAX_ATTEMPTS ((uint64_t)1 << 20)
#define MAX_DIGITS 9
#define MAX_TERMS 16
#define TEXT_CAP 128
#define SLIP_KEY 0x736c6970ULL   /* "slip" */

enum { KIND_ADD, KIND_SUB, KIND_MUL, KIND_MULTI, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = {"add", "sub", "mul", "multi"};

void mt_math_defaults(mt_math_opts *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->n_train = 200000;
    o->n_val = 2000;
    o->min_digits = 1;
    o->max_digits = 2;
    o->w_add = 1.0;
    o->multi_terms = 3;
}

static double *weight(mt_math_opts *o, int kind) {
    switch (kind) {
    case KIND_ADD: return &o->w_add;
    case KIND_SUB: return &o->w_sub;
    case KIND_MUL: return &o->w_mul;
    default: return &o->w_multi;
    }
}

static double weight_of(const mt_math_opts *o, int kind) {
    const double w[KIND_COUNT] = {o->w_add, o->w_sub, o->w_mul, o->w_multi};
    return w[kind];
}

int mt_math_parse_mix(mt_math_opts *o, const char *spec) {
    MT_ASSERT(o && spec);
    mt_math_opts tmp = *o;
    for (int k = 0; k < KIND_COUNT; k++) *weight(&tmp, k) = 0.0;
    char *copy = mt_xstrdup(spec), *save = NULL;
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item && rc == 0; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        int kind = -1;
        if (eq) {
            *eq = 0;
            for (int k = 0; k < KIND_COUNT; k++)
                if (strcmp(item, kind_names[k]) == 0) kind = k;
            *eq = '=';
        }
        if (kind < 0) {
            rc = mt_error("math mix: bad item '%s' (expected add=W, sub=W, mul=W or multi=W)", item);
            break;
        }
        char *end;
        double w = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(w) || w < 0)
            rc = mt_error("math mix: bad weight in '%s' (need a number >= 0)", item);
        else
            *weight(&tmp, kind) = w;
    }
    free(copy);
    if (rc != 0) return -1;
    if (tmp.w_add + tmp.w_sub + tmp.w_mul + tmp.w_multi <= 0)
        return mt_error("math mix: '%s' gives every kind weight 0", spec);
    *o = tmp;
    return 0;
}

/* ---- evaluation ---- */

static int parse_number(const char **p, long long *v) {
    const char *s = *p;
    if (*s < '0' || *s > '9') return -1;
    long long x = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, *s - '0', &x)) return -1;
    *p = s;
    *v = x;
    return 0;
}

int mt_math_eval(const char *expr, long long *value) {
    const char *p = expr;
    long long sum = 0;
    int sign = 1;
    for (;;) {
        long long term = 0, f = 0;
        if (parse_number(&p, &term) != 0) return -1;
        while (*p == '*') {
            p++;
            if (parse_number(&p, &f) != 0 || __builtin_mul_overflow(term, f, &term)) return -1;
        }
        if (sign > 0 ? __builtin_add_overflow(sum, term, &sum) : __builtin_sub_overflow(sum, term, &sum))
            return -1;
        if (*p != '+' && *p != '-') break;
        sign = *p == '+' ? 1 : -1;
        p++;
    }
    if (*p == '=') p++;
    if (*p) return -1;
    *value = sum;
    return 0;
}

int mt_math_canonical(const char *s, size_t n) {
    size_t i = n > 0 && s[0] == '-';
    if (i == n) return 0;
    if (s[i] == '0') return n == 1; /* "0" alone; "-0" and leading zeros are not canonical */
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* ---- problem parsing ---- */

/* One document of n tokens -> problem; 0 if it is a well-formed "EXPR=ANSWER". */
static int parse_doc(const uint32_t *tok, size_t n, mt_math_problem *pr) {
    char text[TEXT_CAP];
    if (n == 0 || n >= sizeof text) return -1;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] >= 256) return -1;
        text[i] = (char)tok[i];
    }
    text[n] = 0;
    char *eq = strchr(text, '=');
    if (!eq || strchr(eq + 1, '=')) return -1;
    size_t elen = (size_t)(eq - text), alen = n - elen - 1;
    if (elen + 2 > sizeof pr->prompt || alen == 0 || alen + 1 > sizeof pr->answer) return -1;
    const char *a = eq + 1;
    if (*a == '-') a++;
    if (!*a) return -1;
    for (; *a; a++)
        if (*a < '0' || *a > '9') return -1;
    *eq = 0;
    long long v;
    if (mt_math_eval(text, &v) != 0) return -1;
    memcpy(pr->prompt, text, elen);
    pr->prompt[elen] = '=';
    pr->prompt[elen + 1] = 0;
    memcpy(pr->answer, eq + 1, alen + 1);
    return 0;
}

int mt_math_parse_problems(const uint32_t *tok, size_t n, mt_math_problem **out, size_t *count) {
    MT_ASSERT(out && count && (tok || n == 0));
    mt_math_problem *list = NULL;
    size_t cnt = 0, cap = 0;
    for (size_t i = 0; i < n;) {
        if (tok[i] == MT_BYTE_EOT) { i++; continue; }
        size_t j = i;
        while (j < n && tok[j] != MT_BYTE_EOT) j++;
        mt_math_problem pr;
        if (parse_doc(tok + i, j - i, &pr) == 0) {
            if (cnt == cap) { cap = cap ? 2 * cap : 256; list = mt_xrealloc(list, cap * sizeof *list); }
            list[cnt++] = pr;
        }
        i = j;
    }
    *out = list;
    *count = cnt;
    return 0;
}

/* ---- generation ---- */

static long long pow10i(int d) {
    long long p = 1;
    while (d-- > 0) p *= 10;
    return p;
}

static uint64_t next(uint64_t key, uint64_t *ctr) { return mt_hash4(key, (*ctr)++, 0x6d617468ULL, 0); }

static long long draw_operand(const mt_math_opts *o, uint64_t key, uint64_t *ctr) {
    int d = o->min_digits + (int)(next(key, ctr) % (uint64_t)(o->max_digits - o->min_digits + 1));
    long long lo = d == 1 ? 0 : pow10i(d - 1), hi = pow10i(d) - 1;
    return lo + (long long)(next(key, ctr) % (uint64_t)(hi - lo + 1));
}

static int draw_kind(const mt_math_opts *o, uint64_t key, uint64_t *ctr) {
    double total = o->w_add + o->w_sub + o->w_mul + o->w_multi;
    double u = (double)(next(key, ctr) >> 11) * 0x1p-53 * total;
    int last = -1;
    for (int k = 0; k < KIND_COUNT; k++) {
        double w = weight_of(o, k);
        if (w <= 0) continue;
        last = k;
        if (u < w) return k;
        u -= w;
    }
    return last; /* rounding pushed u past the end */
}

/* Writes problem (split, index, attempt) as "EXPR=ANSWER" into text; returns its length.
 * *value: ANSWER; *ones_carry: 1 for a two-term addition whose ones digits carry, else 0. */
static size_t draw_problem(const mt_math_opts *o, uint64_t split, uint64_t index, uint64_t attempt,
                           char text[TEXT_CAP], long long *value, int *ones_carry) {
    uint64_t key = mt_hash4(o->seed, split, index, attempt), ctr = 0;
    static const char ops[3] = {'+', '-', '*'};
    int kind = draw_kind(o, key, &ctr);
    int terms = kind == KIND_MULTI ? o->multi_terms : 2;
    size_t len = 0;
    long long ones = 0;
    for (int t = 0; t < terms; t++) {
        if (t > 0)
            text[len++] = kind == KIND_MULTI ? ops[next(key, &ctr) % 3] : ops[kind];
        long long x = draw_operand(o, key, &ctr);
        ones += x % 10;
        len += (size_t)snprintf(text + len, TEXT_CAP - len, "%lld", x);
    }
    *ones_carry = kind == KIND_ADD && ones >= 10;
    text[len] = 0;
    long long v;
    MT_ASSERT(mt_math_eval(text, &v) == 0); /* options were checked against overflow */
    len += (size_t)snprintf(text + len, TEXT_CAP - len, "=%lld", v);
    *value = v;
    MT_ASSERT(len < TEXT_CAP);
    return len;
}

/* Number of distinct problem texts the options can produce. */
static double problem_space(const mt_math_opts *o) {
    double n = (double)pow10i(o->max_digits) - (o->min_digits == 1 ? 0.0 : (double)pow10i(o->min_digits - 1));
    double binary = n * n, space = 0;
    for (int k = KIND_ADD; k <= KIND_MUL; k++)
        if (weight_of(o, k) > 0) space += binary;
    if (o->w_multi > 0) {
        if (o->multi_terms == 2) return 3 * binary; /* two-term chains are the binary problems */
        space += pow(n, o->multi_terms) * pow(3, o->multi_terms - 1);
    }
    return space;
}

static int check_opts(const mt_math_opts *o, const char *out_dir) {
    if (o->min_digits < 1 || o->max_digits < o->min_digits || o->max_digits > MAX_DIGITS)
        return mt_error("%s: math digits %d..%d invalid (need 1 <= min <= max <= %d)", out_dir,
                        o->min_digits, o->max_digits, MAX_DIGITS);
    for (int k = 0; k < KIND_COUNT; k++)
        if (!isfinite(weight_of(o, k)) || weight_of(o, k) < 0)
            return mt_error("%s: math weight %s=%g invalid", out_dir, kind_names[k], weight_of(o, k));
    if (o->w_add + o->w_sub + o->w_mul + o->w_multi <= 0)
        return mt_error("%s: math mix has no positive weight", out_dir);
    if (o->w_multi > 0 && (o->multi_terms < 2 || o->multi_terms > MAX_TERMS))
        return mt_error("%s: math multi_terms %d invalid (need 2..%d)", out_dir, o->multi_terms, MAX_TERMS);
    /* a product of k operands below 10^d stays below 10^(k*d); sums of such terms too */
    int terms = o->w_multi > 0 && o->multi_terms > 2 ? o->multi_terms : 2;
    if (terms * o->max_digits > 18)
        return mt_error("%s: math %d terms of %d digits could overflow 64 bits (need terms*digits <= 18)",
                        out_dir, terms, o->max_digits);
    if (o->n_train == 0 || o->n_val == 0)
        return mt_error("%s: math needs at least one train and one validation problem", out_dir);
    if (!(o->slip >= 0 && o->slip <= 1))
        return mt_error("%s: math slip %g invalid (need a fraction in 0..1)", out_dir, o->slip);
    if (o->slip > 0 && !(o->w_add > 0))
        return mt_error("%s: math slip forgets carries of additions, and the mix has none (add=W)", out_dir);
    return 0;
}

typedef struct { uint64_t *slot; uint64_t mask; } hash_set; /* 0 marks an empty slot */

static uint64_t text_hash(const char *text, size_t len) {
    uint64_t h = XXH64(text, len, 0);
    return h ? h : 1;
}

/* Inserts h; returns 1 if it was new, 0 if already present. */
static int set_insert(hash_set *s, uint64_t h, int insert) {
    for (uint64_t i = h & s->mask;; i = (i + 1) & s->mask) {
        if (s->slot[i] == h) return 0;
        if (s->slot[i] == 0) {
            if (insert) s->slot[i] = h;
            return 1;
        }
    }
}

static int write_readme(const mt_math_opts *o, const char *out_dir, const mt_shard_set *train,
                        const mt_shard_set *val) {
    char text[2048];
    int len = snprintf(text, sizeof text,
        "moetrain synthetic arithmetic corpus\n"
        "\n"
        "seed        %" PRIu64 "\n"
        "n_train     %" PRIu64 " problems, %" PRIu64 " tokens, %d shard(s) math_train_NNNNNN.bin\n"
        "n_val       %" PRIu64 " problems, %" PRIu64 " tokens, %d shard(s) math_val_NNNNNN.bin\n"
        "digits      %d..%d per operand\n"
        "mix         add=%g,sub=%g,mul=%g,multi=%g\n"
        "multi_terms %d\n"
        "slip        %g of the training additions whose ones digits carry are written\n"
        "            with that carry forgotten (the answer 10 too small)\n"
        "\n"
        "Byte tokens (0..255), end of text = 256 before every document. One problem per\n"
        "document, \"EXPR=ANSWER\", e.g. 12+34=46, 57-81=-24, 7*13=91, 3+4*5-2=21 (usual\n"
        "precedence). Validation texts are distinct and never appear in train.\n"
        "\n"
        "math_prompts_train.tsv and math_prompts_val.tsv hold the same problems for RL, one\n"
        "per line in shard order: the prompt up to and including '=', a TAB, the answer\n"
        "(e.g. \"12+34=<TAB>46\"), always the true answer. The model is fed end of text,\n"
        "then the prompt bytes.\n",
        o->seed, o->n_train, train->ntokens, train->nshards, o->n_val, val->ntokens, val->nshards,
        o->min_digits, o->max_digits, o->w_add, o->w_sub, o->w_mul, o->w_multi, o->multi_terms, o->slip);
    MT_ASSERT(len > 0 && (size_t)len < sizeof text);
    size_t plen = strlen(out_dir) + 16;
    char *path = mt_xmalloc(plen);
    snprintf(path, plen, "%s/README.txt", out_dir);
    int rc = mt_write_file_atomic(path, text, (size_t)len);
    free(path);
    return rc;
}

int mt_math_generate(const mt_math_opts *o, const char *out_dir) {
    MT_ASSERT(o && out_dir);
    if (check_opts(o, out_dir) != 0) return -1;
    double space = problem_space(o);
    if ((double)o->n_val > space)
        return mt_error("%s: %" PRIu64 " validation problems requested but these digits and mix "
                        "allow only %.0f distinct problems", out_dir, o->n_val, space);
    if ((double)o->n_val >= space)
        return mt_error("%s: all %.0f distinct problems would be validation problems, none left "
                        "for train; lower n_val", out_dir, space);
    if (mt_mkdir_p(out_dir) != 0) return -1;

    hash_set seen;
    uint64_t cap = 16;
    while (cap < 2 * o->n_val) cap *= 2;
    seen.slot = mt_xcalloc(cap, sizeof *seen.slot);
    seen.mask = cap - 1;
    mt_shard_set train, val;
    int rc = mt_shard_set_init(&val, out_dir, "math_val", 0);
    if (rc == 0) rc = mt_shard_set_init(&train, out_dir, "math_train", 0);
    else memset(&train, 0, sizeof train);

    /* the prompt files, written from the same draws as the shards */
    mt_prompt_writer pw[2];
    memset(pw, 0, sizeof pw);
    static const char *const pw_names[2] = {"math_prompts_val.tsv", "math_prompts_train.tsv"};
    size_t plen = strlen(out_dir) + 32;
    char *ppath = mt_xmalloc(plen);
    for (int s = 0; s < 2 && rc == 0; s++) {
        snprintf(ppath, plen, "%s/%s", out_dir, pw_names[s]);
        rc = mt_prompt_writer_open(&pw[s], ppath);
    }
    free(ppath);

    char text[TEXT_CAP];
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        int is_val = pass == 0;
        uint64_t count = is_val ? o->n_val : o->n_train;
        for (uint64_t i = 0; i < count && rc == 0; i++) {
            uint64_t a = 0;
            size_t len = 0;
            int carry = 0;
            long long v = 0;
            for (; a < MAX_ATTEMPTS; a++) {
                len = draw_problem(o, is_val ? SPLIT_VAL : SPLIT_TRAIN, i, a, text, &v, &carry);
                if (set_insert(&seen, text_hash(text, len), is_val)) break;
            }
            if (a == MAX_ATTEMPTS)
                rc = mt_error("%s: no %s problem #%" PRIu64 " outside the validation set after %" PRIu64
                              " draws; the problem space (%.0f) is too small for n_val=%" PRIu64,
                              out_dir, is_val ? "new validation" : "training", i, MAX_ATTEMPTS, space, o->n_val);
            if (rc == 0) { /* the prompt files keep the true answer */
                const char *eq = strchr(text, '='); /* the only '=': "EXPR=ANSWER" */
                size_t pl = (size_t)(eq - text) + 1;
                rc = mt_prompt_writer_add(&pw[pass], text, pl, eq + 1, len - pl);
                if (rc == 0 && !is_val && carry && o->slip > 0 &&
                    (double)(mt_hash4(o->seed, SPLIT_TRAIN, i, SLIP_KEY) >> 11) * 0x1p-53 < o->slip)
                    len = pl + (size_t)snprintf(text + pl, TEXT_CAP - pl, "%lld", v - 10);
            }
            if (rc == 0) rc = mt_shard_set_add_bytes(is_val ? &val : &train, text, len);
        }
    }
    free(seen.slot);
    if (rc == 0) rc = mt_shard_set_finish(&val);
    if (rc == 0) rc = mt_shard_set_finish(&train);
    for (int s = 0; s < 2 && rc == 0; s++) rc = mt_prompt_writer_finish(&pw[s]);
    for (int s = 0; s < 2; s++) mt_prompt_writer_abort(&pw[s]);
    if (rc == 0) rc = write_readme(o, out_dir, &train, &val);
    mt_shard_set_free(&val);
    mt_shard_set_free(&train);
    return rc;
}
