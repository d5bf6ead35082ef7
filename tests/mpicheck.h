/* tests/mpicheck.h — the pass/fail counter of the MPI C tests: CHECK(cond, fmt, ...) counts
 * a check and prints a failure with the rank, file and line; main sums g_pass / g_fail over
 * the ranks. */
#ifndef MT_TESTS_MPICHECK_H
#define MT_TESTS_MPICHECK_H

#include <stdio.h>

#include "base/common.h"
#include "parallel/dist.h"

static int g_pass, g_fail, g_rank;
#define CHECK(c, ...)                                                                          \
    do {                                                                                       \
        if (c) g_pass++;                                                                       \
        else {                                                                                 \
            g_fail++;                                                                          \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", g_rank, __FILE__, __LINE__, #c);       \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

/* mt_dist_init for a test's main: the process's mt_dist with g_rank set, or NULL after
 * printing the error. */
static inline mt_dist *mpicheck_init(int *argc, char ***argv) {
    if (mt_dist_init(argc, argv) != 0) {
        fprintf(stderr, "%s\n", mt_last_error());
        return NULL;
    }
    mt_dist *d = mt_dist_get();
    g_rank = d->rank;
    return d;
}

#endif
