/* cli/args.c — flag parsing (see args.h). */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"

void mt_args_help(const char *cmd, const char *usage, const mt_arg *specs) {
    printf("usage: moetrain %s %s\n\n", cmd, usage);
    if (specs && specs[0].name) printf("options:\n");
    for (const mt_arg *s = specs; s && s->name; s++) {
        char left[64];
        const char *meta = s->type == MT_ARG_STR ? " S" : s->type == MT_ARG_BOOL ? "" : s->type == MT_ARG_DBL ? " X" : " N";
        /* a boolean whose default comes from elsewhere (the resumed run) can be turned off */
        const int neg = s->type == MT_ARG_BOOL && s->given;
        snprintf(left, sizeof left, "--%s%s%s", neg ? "[no-]" : "", s->name, meta);
        printf("  %-22s %s\n", left, s->help);
    }
    printf("  %-22s %s\n", "--help", "show this help");
}

static int set_value(const char *cmd, const mt_arg *s, const char *v) {
    char *end;
    errno = 0;
    switch (s->type) {
    case MT_ARG_STR: *(const char **)s->dst = v; break;
    case MT_ARG_INT: { /* every integer flag is a count, size, id or period: none is negative */
        long x = strtol(v, &end, 10);
        if (*v == 0 || *end || errno || x < 0 || x > INT_MAX)
            return mt_error("moetrain %s: --%s expects a non-negative integer, got '%s'", cmd, s->name, v);
        *(int *)s->dst = (int)x;
        break;
    }
    case MT_ARG_U64: {
        unsigned long long x = strtoull(v, &end, 10); /* which takes " -1" as 2^64 - 1 */
        if (*v == 0 || *end || errno || strchr(v, '-'))
            return mt_error("moetrain %s: --%s expects a non-negative integer, got '%s'", cmd, s->name, v);
        *(uint64_t *)s->dst = x;
        break;
    }
    case MT_ARG_DBL: {
        double x = strtod(v, &end);
        if (*v == 0 || *end || errno || !isfinite(x))
            return mt_error("moetrain %s: --%s expects a finite number, got '%s'", cmd, s->name, v);
        *(double *)s->dst = x;
        break;
    }
    default: return mt_error("moetrain %s: --%s takes no value", cmd, s->name);
    }
    return 0;
}

int mt_args_parse(const char *cmd, const char *usage, const mt_arg *specs, int argc, char **argv,
                  int first, const char **pos, int max_pos, int *npos) {
    if (npos) *npos = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            mt_args_help(cmd, usage, specs);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (!npos || *npos >= max_pos)
                return mt_error("moetrain %s: unexpected argument '%s' (see moetrain %s --help)", cmd, a, cmd);
            pos[(*npos)++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const mt_arg *s = NULL;
        for (const mt_arg *t = specs; t && t->name; t++)
            if (strlen(t->name) == nlen && strncmp(t->name, name, nlen) == 0) { s = t; break; }
        int off = 0; /* --no-NAME of a boolean that has a `given` slot: explicitly off */
        if (!s && nlen > 3 && strncmp(name, "no-", 3) == 0)
            for (const mt_arg *t = specs; t && t->name; t++)
                if (t->type == MT_ARG_BOOL && t->given && strlen(t->name) == nlen - 3 &&
                    strncmp(t->name, name + 3, nlen - 3) == 0) {
                    s = t;
                    off = 1;
                    break;
                }
        if (!s) return mt_error("moetrain %s: unknown flag --%.*s (see moetrain %s --help)", cmd, (int)nlen, name, cmd);
        if (s->given) *s->given = 1;
        if (s->type == MT_ARG_BOOL) {
            if (eq) return mt_error("moetrain %s: --%.*s takes no value", cmd, (int)nlen, name);
            *(int *)s->dst = !off;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return mt_error("moetrain %s: --%s needs a value", cmd, s->name);
            v = argv[++i];
        }
        if (set_value(cmd, s, v) != 0) return -1;
    }
    return 0;
}

const char *mt_cli_config_path(const char *name) {
    static char buf[4096];
    struct stat st;
    if (stat(name, &st) == 0 || strchr(name, '/') || strstr(name, ".json")) return name;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        const char *rel[] = {"../configs", "configs", "../../configs", NULL};
        for (int i = 0; rel[i]; i++) {
            int len = snprintf(buf, sizeof buf, "%s/%s/%s.json", exe, rel[i], name);
            if (len > 0 && (size_t)len < sizeof buf && stat(buf, &st) == 0) return buf;
        }
    }
    snprintf(buf, sizeof buf, "configs/%s.json", name);
    if (stat(buf, &st) == 0) return buf;
#ifdef MT_SOURCE_CONFIGS
    int len = snprintf(buf, sizeof buf, "%s/%s.json", MT_SOURCE_CONFIGS, name);
    if (len > 0 && (size_t)len < sizeof buf && stat(buf, &st) == 0) return buf;
#endif
    return name; /* let the loader report "cannot open" naming it */
}
