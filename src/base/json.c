/* base/json.c — a strict RFC 8259 syntax check in front of cJSON (see json.h). */
#include "base/json.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/common.h"

/* deeper nesting is no config's: refused before the recursion could exhaust the stack */
#define JSON_MAX_DEPTH 512

typedef struct {
    const char *what, *s;
    size_t n, i;
    const char *key; /* raw text of the innermost object key, for messages (NULL at top level) */
    size_t keylen;
    int depth;
} jscan;

static int line_of(const jscan *j, size_t at) {
    int line = 1;
    for (size_t p = 0; p < at && p < j->n; p++) line += j->s[p] == '\n';
    return line;
}

static int is_delim(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || strchr(",:[]{}\"", c); }

/* The token at `at` as printable text (a delimiter alone if it starts there), shortened. */
static void token(const jscan *j, size_t at, char *buf, size_t cap) {
    size_t k = 0, p = at;
    for (; p < j->n && k + 4 < cap; p++) {
        if (p > at && is_delim(j->s[p])) break;
        buf[k++] = isprint((unsigned char)j->s[p]) ? j->s[p] : '?';
        if (is_delim(j->s[p])) { p++; break; }
    }
    if (p < j->n && k + 4 >= cap && !is_delim(j->s[p])) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = 0;
}

static int jfail(const jscan *j, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jfail(const jscan *j, size_t at, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (j->key)
        return mt_error("%s: key %.*s: %s (line %d)", j->what, (int)(j->keylen > 64 ? 64 : j->keylen), j->key, msg,
                        line_of(j, at));
    return mt_error("%s: %s (line %d)", j->what, msg, line_of(j, at));
}

static void skip_ws(jscan *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static int bad_number(const jscan *j, size_t at, const char *why) {
    char t[40];
    token(j, at, t, sizeof t);
    return jfail(j, at, "%s is not a JSON number%s%s%s", t, why[0] ? " (" : "", why, why[0] ? ")" : "");
}

static size_t digits(const jscan *j, size_t p) {
    while (p < j->n && isdigit((unsigned char)j->s[p])) p++;
    return p;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and finite as a double */
static int scan_number(jscan *j) {
    const char *s = j->s;
    const size_t a = j->i, n = j->n;
    size_t p = a + (s[a] == '-');
    if (p >= n || !isdigit((unsigned char)s[p])) return bad_number(j, a, "no digit after the minus sign");
    if (s[p] == '0' && p + 1 < n && isdigit((unsigned char)s[p + 1])) return bad_number(j, a, "leading zero");
    p = digits(j, p);
    if (p < n && s[p] == '.') {
        if (p + 1 >= n || !isdigit((unsigned char)s[p + 1])) return bad_number(j, a, "no digit after the decimal point");
        p = digits(j, p + 1);
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= n || !isdigit((unsigned char)s[p])) return bad_number(j, a, "no digit in the exponent");
        p = digits(j, p);
    }
    if (p < n && (isalnum((unsigned char)s[p]) || s[p] == '.' || s[p] == '+' || s[p] == '-'))
        return bad_number(j, a, "");
    char *copy = mt_xmalloc(p - a + 1); /* strtod needs a terminated copy: the text may go on */
    memcpy(copy, s + a, p - a);
    copy[p - a] = 0;
    const double v = strtod(copy, NULL);
    free(copy);
    if (isinf(v)) {
        char t[40];
        token(j, a, t, sizeof t);
        return jfail(j, a, "%s is out of range (beyond the largest double, about 1.8e308)", t);
    }
    j->i = p;
    return 0;
}

/* true, false, null; anything else made of letters is not JSON (NaN and Infinity included) */
static int scan_literal(jscan *j) {
    const size_t a = j->i;
    size_t p = a + (j->s[a] == '-');
    while (p < j->n && (isalnum((unsigned char)j->s[p]) || j->s[p] == '_')) p++;
    const size_t len = p - a;
    static const char *const lit[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++)
        if (len == strlen(lit[k]) && memcmp(j->s + a, lit[k], len) == 0) {
            j->i = p;
            return 0;
        }
    char t[40];
    token(j, a, t, sizeof t);
    const char *w = t + (t[0] == '-');
    if (strncasecmp(w, "nan", 3) == 0 || strncasecmp(w, "inf", 3) == 0)
        return jfail(j, a, "%s is not a JSON value (JSON has no NaN or Infinity)", t);
    return jfail(j, a, "%s is not a JSON value (true, false, null, a number, a \"string\", [...] or {...})", t);
}

static int scan_string(jscan *j) {
    const char *s = j->s;
    const size_t a = j->i;
    for (size_t p = a + 1; p < j->n;) {
        const unsigned char c = (unsigned char)s[p];
        if (c == '"') {
            j->i = p + 1;
            return 0;
        }
        if (c < 0x20) return jfail(j, p, "control character 0x%02x in a string (JSON needs it escaped)", c);
        if (c != '\\') {
            p++;
            continue;
        }
        if (p + 1 >= j->n) break;
        const char e = s[p + 1];
        if (strchr("\"\\/bfnrt", e)) {
            p += 2;
        } else if (e == 'u') {
            int zero = 1;
            for (int k = 2; k < 6; k++) {
                if (p + k >= j->n || !isxdigit((unsigned char)s[p + k]))
                    return jfail(j, p, "\\u in a string needs four hex digits (JSON escape)");
                zero &= s[p + k] == '0';
            }
            if (zero) return jfail(j, p, "\\u0000 in a string (valid JSON, but moetrain's strings cannot hold a NUL)");
            p += 6;
        } else if (isprint((unsigned char)e)) {
            return jfail(j, p, "\\%c is not a JSON escape", e);
        } else {
            return jfail(j, p, "\\ followed by byte 0x%02x is not a JSON escape", (unsigned char)e);
        }
    }
    return jfail(j, a, "unterminated string (the JSON text ends inside it)");
}

static int scan_value(jscan *j);

static int unexpected(const jscan *j, const char *expected) {
    if (j->i >= j->n) return jfail(j, j->i, "the JSON text ends where %s was expected", expected);
    char t[40];
    token(j, j->i, t, sizeof t);
    return jfail(j, j->i, "'%s' where %s was expected (not JSON)", t, expected);
}

/* Members keep their key in j->key until the next one starts, so a missing or trailing
 * comma is reported at the key before it. */
static int scan_object(jscan *j) {
    const char *outer = j->key;
    const size_t outer_len = j->keylen;
    j->i++;
    skip_ws(j);
    if (j->i < j->n && j->s[j->i] == '}') {
        j->i++;
        return 0;
    }
    for (;;) {
        skip_ws(j);
        if (j->i < j->n && j->s[j->i] == '}') return jfail(j, j->i, "trailing comma before '}' (not JSON)");
        if (j->i >= j->n || j->s[j->i] != '"') return unexpected(j, "a \"key\"");
        const size_t ks = j->i + 1;
        if (scan_string(j) != 0) return -1;
        const size_t ke = j->i - 1;
        skip_ws(j);
        if (j->i >= j->n || j->s[j->i] != ':') return unexpected(j, "':' after the key");
        j->i++;
        j->key = j->s + ks;
        j->keylen = ke - ks;
        if (scan_value(j) != 0) return -1;
        skip_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->i < j->n && j->s[j->i] == '}') break;
        return unexpected(j, "',' or '}' after the value");
    }
    j->i++;
    j->key = outer;
    j->keylen = outer_len;
    return 0;
}

static int scan_array(jscan *j) {
    j->i++;
    skip_ws(j);
    if (j->i < j->n && j->s[j->i] == ']') {
        j->i++;
        return 0;
    }
    for (;;) {
        skip_ws(j);
        if (j->i < j->n && j->s[j->i] == ']') return jfail(j, j->i, "trailing comma before ']' (not JSON)");
        if (scan_value(j) != 0) return -1;
        skip_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->i < j->n && j->s[j->i] == ']') break;
        return unexpected(j, "',' or ']' after the value");
    }
    j->i++;
    return 0;
}

static int scan_value(jscan *j) {
    skip_ws(j);
    if (j->i >= j->n) return unexpected(j, "a JSON value");
    const char c = j->s[j->i];
    if (c == '{' || c == '[') {
        if (++j->depth > JSON_MAX_DEPTH) return jfail(j, j->i, "nested deeper than %d levels", JSON_MAX_DEPTH);
        int rc = c == '{' ? scan_object(j) : scan_array(j);
        j->depth--;
        return rc;
    }
    if (c == '"') return scan_string(j);
    if (c == '-' && j->i + 1 < j->n && isalpha((unsigned char)j->s[j->i + 1])) return scan_literal(j); /* -Infinity */
    if (c == '-' || isdigit((unsigned char)c)) return scan_number(j);
    if (c == '+') return bad_number(j, j->i, "no leading '+' in JSON");
    if (c == '.') return bad_number(j, j->i, "no digit before the decimal point");
    if (isalpha((unsigned char)c)) return scan_literal(j);
    return unexpected(j, "a JSON value");
}

int mt_json_check(const char *what, const char *text, size_t len) {
    const char *nul = memchr(text, 0, len);
    jscan j = {what, text, len, 0, NULL, 0, 0};
    if (nul) return jfail(&j, (size_t)(nul - text), "NUL byte at byte %zu (JSON text has none)", (size_t)(nul - text));
    skip_ws(&j);
    if (j.i >= len) return mt_error("%s: no JSON value (the text is empty)", what);
    if (scan_value(&j) != 0) return -1;
    skip_ws(&j);
    if (j.i < len) {
        char t[40];
        token(&j, j.i, t, sizeof t);
        return jfail(&j, j.i, "'%s' after the end of the JSON value (trailing text)", t);
    }
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every object's keys at most once (sorted, so a safetensors index of 10^5 names is quick). */
static int check_keys(const char *what, const cJSON *v) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return 0;
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (check_keys(what, c) != 0) return -1;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return 0;
    const char **names = mt_xmalloc(sizeof(char *) * (size_t)n);
    int k = 0, rc = 0;
    for (const cJSON *c = v->child; c; c = c->next) names[k++] = c->string;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = mt_error("%s: key %s: appears more than once (JSON readers disagree on which one wins)", what,
                          names[i]);
    free(names);
    return rc;
}

cJSON *mt_json_parse(const char *what, const char *text, size_t len) {
    if (mt_json_check(what, text, len) != 0) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) { /* what the check lets through and cJSON does not: a lone UTF-16 surrogate escape */
        mt_error("%s: JSON refused by the parser near byte %zu (an invalid \\u escape?)", what,
                 end ? (size_t)(end - text) : (size_t)0);
        return NULL;
    }
    if (check_keys(what, root) != 0) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

int mt_json_number(const char *what, const cJSON *obj, const char *key, int integer, double lo, double hi,
                   const char *range, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!x || cJSON_IsNull(x)) return 0;
    char *t = cJSON_PrintUnformatted(x);
    char shown[64];
    snprintf(shown, sizeof shown, "%.40s%s", t ? t : "?", t && strlen(t) > 40 ? "..." : "");
    cJSON_free(t);
    const double d = x->valuedouble;
    if (!cJSON_IsNumber(x) || (integer && floor(d) != d))
        return mt_error("%s: key %s: expected %s, got %s", what, key, integer ? "an integer" : "a number", shown);
    if (!(d >= lo && d <= hi)) return mt_error("%s: key %s: %s is out of range (%s)", what, key, shown, range);
    *v = d;
    return 1;
}

cJSON *mt_json_read(const char *path) {
    char *txt;
    size_t len;
    if (mt_read_file(path, &txt, &len) != 0) return NULL;
    cJSON *root = mt_json_parse(path, txt, len);
    free(txt);
    return root;
}
