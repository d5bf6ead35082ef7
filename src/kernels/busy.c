/* kernels/busy.c — how much of the threads' time is useful work (see blas.h, mt_busy_time).
 *
 * GCC compiles every `#pragma omp parallel` (ours and OpenBLAS's) to a call of libgomp's
 * GOMP_parallel(fn, data, threads, flags). This file defines GOMP_parallel itself: the
 * program's definition comes first in the dynamic linker's search (the executable exports
 * it, see CMakeLists.txt), so OpenBLAS's calls reach it too. It times each thread's run of
 * the region body and hands the call on to libgomp's own GOMP_parallel (dlvsym). Nested
 * regions pass straight through.
 *
 * Why not CPU time: a thread that spins while it waits (GOMP_SPINCOUNT, which saves the
 * ~25 us futex wake-up at each region's start and end) burns CPU time without doing work,
 * so 1 - cpu / (threads x wall) would call spinning "busy". Timing the bodies counts it as
 * waiting, whatever the wait policy. */
#include <dlfcn.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "kernels/blas.h"

#include <cblas.h>

#define BUSY_SLOTS 256

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

static struct { double s; char pad[56]; } g_busy[BUSY_SLOTS]; /* per-thread seconds in bodies */
static double g_region_wall;                                   /* master's seconds inside regions */
static atomic_long g_regions;
static _Thread_local int t_inside;

struct body { void (*fn)(void *); void *data; };

static void timed_body(void *p) {
    const struct body *b = p;
    t_inside = 1;
    double t0 = mt_now();
    b->fn(b->data);
    int t = omp_get_thread_num();
    if (t < BUSY_SLOTS) g_busy[t].s += mt_now() - t0; /* a larger team's extra threads count as waiting */
    t_inside = 0;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static gomp_parallel_fn real_fn; /* looked up once; threads racing here store the same value */
    gomp_parallel_fn real = __atomic_load_n(&real_fn, __ATOMIC_ACQUIRE);
    if (!real) {
        real = (gomp_parallel_fn)dlvsym(RTLD_NEXT, "GOMP_parallel", "GOMP_4.0");
        if (!real) real = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
        if (!real) {
            fprintf(stderr, "moetrain: GOMP_parallel: libgomp's definition not found (%s)\n", dlerror());
            abort();
        }
        __atomic_store_n(&real_fn, real, __ATOMIC_RELEASE);
    }
    if (t_inside) { /* nested: the outer region's body is already being timed */
        real(fn, data, num_threads, flags);
        return;
    }
    struct body b = {fn, data};
    double t0 = mt_now();
    real(timed_body, &b, num_threads, flags);
    g_region_wall += mt_now() - t0;
    atomic_fetch_add_explicit(&g_regions, 1, memory_order_relaxed);
}

/* 1 when both our regions and OpenBLAS's reach GOMP_parallel above, checked once. */
static int accounting_works(void) {
    static int works = -1;
    if (works >= 0) return works;
    long r0 = atomic_load(&g_regions);
    volatile int sink = 0;
#pragma omp parallel
    sink = 1;
    (void)sink;
    works = atomic_load(&g_regions) > r0;
    if (works && omp_get_max_threads() > 1) {
        /* OpenBLAS goes parallel on a GEMM of this size; with one thread it never does */
        enum { n = 256 };
        float *a = mt_alloc(sizeof(float) * 3 * n * n);
        long r1 = atomic_load(&g_regions);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, a + n * n, n, 0.0f,
                    a + 2 * n * n, n);
        works = atomic_load(&g_regions) > r1;
        mt_free(a);
    }
    return works;
}

double mt_busy_time(void) {
    if (!accounting_works()) return mt_cpu_time();
    double s = 0;
    for (int i = 0; i < BUSY_SLOTS; i++) s += g_busy[i].s;
    return s + mt_now() - g_region_wall;
}

long mt_parallel_regions(void) { return atomic_load(&g_regions); }
