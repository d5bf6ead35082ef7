/* tests/kstats.h — what the kernel tests share (test_kernels.c, test_moe_kernels.c): a
 * failure counter, the description of the current case, CHECK, exact array comparisons and
 * one statistics line per kernel (cases, worst normalised error, tolerance).
 * A test defines its `stat stats[S_COUNT]` after including this header; RECORD(s, ...) uses it. */
#ifndef MT_TESTS_KSTATS_H
#define MT_TESTS_KSTATS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
static char where[256]; /* the current case, for failure messages */

#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s [%s]\n", __FILE__, __LINE__, #c, where); \
    failures++; } } while (0)
/* Two int32 (float) arrays with the same bits; prints the first difference. */
#define CHECK_SAME_I(a, b, n) check_same((a), (b), (n), 1, #a, #b, __FILE__, __LINE__)
#define CHECK_SAME_F(a, b, n) check_same((a), (b), (n), 0, #a, #b, __FILE__, __LINE__)

typedef struct {
    const char *name;
    double tol;
    double maxerr;
    int cases;
} stat;

/* Records err for stats[s]; a failure (err > tol, or NaN) prints file:line and the case. */
#define RECORD(s, what, err) record_err(&stats[(s)], (what), (err), __FILE__, __LINE__)
static inline void record_err(stat *st, const char *what, double err, const char *file, int line) {
    st->cases++;
    if (err > st->maxerr || isnan(err)) st->maxerr = isnan(st->maxerr) ? st->maxerr : err;
    if (!(err <= st->tol)) {
        fprintf(stderr, "%s:%d: %s %s [%s]: error %.3e > tol %.1e\n", file, line, st->name, what,
                where, err, st->tol);
        failures++;
    }
}

/* Exact comparison of n 4-byte elements (int32 when is_int, else float); returns 0 when
 * equal, 1 after printing the first difference and counting a failure. */
static inline int check_same(const void *a, const void *b, size_t n, int is_int, const char *ea,
                             const char *eb, const char *file, int line) {
    if (n == 0 || memcmp(a, b, n * 4) == 0) return 0;
    size_t i = 0;
    while (i < n && memcmp((const char *)a + i * 4, (const char *)b + i * 4, 4) == 0) i++;
    if (is_int)
        fprintf(stderr, "%s:%d: CHECK failed: %s == %s exactly: [%zu] %d vs %d [%s]\n", file, line, ea,
                eb, i, ((const int32_t *)a)[i], ((const int32_t *)b)[i], where);
    else
        fprintf(stderr, "%s:%d: CHECK failed: %s == %s bit-for-bit: [%zu] %.9g vs %.9g [%s]\n", file,
                line, ea, eb, i, (double)((const float *)a)[i], (double)((const float *)b)[i], where);
    failures++;
    return 1;
}

/* The table of every kernel's line; returns the exit code (1 if anything failed). */
static inline int print_stats(const char *test, const stat *st, int n, double seconds, int threads,
                              const char *blas) {
    printf("%-28s %6s %12s %9s\n", "kernel", "cases", "max err", "tol");
    for (int s = 0; s < n; s++)
        printf("%-28s %6d %12.3e %9.1e%s\n", st[s].name, st[s].cases, st[s].maxerr, st[s].tol,
               st[s].maxerr <= st[s].tol ? "" : "  FAIL");
    printf("%s: %d failure(s), %.1f s, %d threads, BLAS core %s\n", test, failures, seconds, threads, blas);
    return failures ? 1 : 0;
}

#endif
