/* tests/test_busy.c — the waiting-share accounting of kernels/busy.c (mt_busy_time): every
 * top-level OpenMP region is counted once (nested ones not), an idle thread counts as
 * waiting while it spins (this test runs with a long GOMP_SPINCOUNT, under which process
 * CPU time calls spinning work), serial code leaves the other threads waiting, and
 * OpenBLAS's own regions are seen. The bodies work until a wall-clock deadline and time
 * themselves, so the checks hold on a loaded machine too. */
#include "base/common.h"
#include "kernels/blas.h"

#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int failures = 0;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
                                  failures++; } } while (0)

static void work_until(double t_end) {
    while (mt_now() < t_end) {}
}

/* What mt_busy_time should add over a span, worked out from timestamps the region bodies
 * take themselves: each thread's body time plus the main thread's time outside the
 * region. Comparing with that, not with a fixed share, keeps the test exact on a loaded
 * machine, where a thread may start late or be preempted. */
static double body_s[2], region_s;

static void only_thread0_works(void) {
    double t_end = mt_now() + 0.04, r0 = mt_now();
#pragma omp parallel num_threads(2)
    {
        double b = mt_now();
        if (omp_get_thread_num() == 0) work_until(t_end);
        body_s[omp_get_thread_num()] = mt_now() - b;
    }
    region_s = mt_now() - r0;
}
static void both_work(void) {
    double t_end = mt_now() + 0.04, r0 = mt_now();
#pragma omp parallel num_threads(2)
    {
        double b = mt_now();
        work_until(t_end);
        body_s[omp_get_thread_num()] = mt_now() - b;
    }
    region_s = mt_now() - r0;
}
static void serial_then_both(void) {
    work_until(mt_now() + 0.04);
    both_work();
}

/* Runs fn; checks mt_busy_time's difference against the bodies' own timestamps and returns
 * the waiting share of the 2 threads, and in *cpu_wait the share by process CPU time. The
 * accounting's clock readings sit between the test's, so the body times and the span give
 * bounds: from below exactly, from above within 10 ms (a thread preempted between its
 * reading and the test's). */
typedef void (*span_fn)(void);
static double waiting(span_fn fn, double *cpu_wait) {
    double ta = mt_now(), c0 = mt_cpu_time(), b0 = mt_busy_time(), tb = mt_now();
    fn();
    double tc = mt_now(), b1 = mt_busy_time(), c1 = mt_cpu_time(), td = mt_now();
    double lo = body_s[0] + body_s[1] + (tc - tb) - region_s, hi = body_s[0] + body_s[1] + (td - ta) - region_s;
    if (b1 - b0 < lo - 2e-4 || b1 - b0 > hi + 1e-2) {
        fprintf(stderr, "busy time %.4f s, the bodies' own timestamps say %.4f-%.4f s\n", b1 - b0, lo, hi);
        failures++;
    }
    double dt = td - ta;
    *cpu_wait = 1.0 - (c1 - c0) / (2 * dt);
    return 1.0 - (b1 - b0) / (2 * dt);
}

int main(void) {
    mt_set_threads(2);
    const char *spin = getenv("GOMP_SPINCOUNT");

    /* region count: one per top-level region, nested regions inside are not extra */
    (void)mt_busy_time();
    long r0 = mt_parallel_regions();
    volatile int inner_ran = 0;
#pragma omp parallel num_threads(2)
    {
#pragma omp parallel num_threads(2)
        inner_ran = 1;
    }
    CHECK(inner_ran == 1);
    CHECK(mt_parallel_regions() - r0 == 1);

    double cw, w;
    w = waiting(both_work, &cw);
    printf("both threads work 40 ms: waiting %.3f (CPU time says %.3f)\n", w, cw);

    w = waiting(only_thread0_works, &cw);
    printf("one of two threads works 40 ms: waiting %.3f (CPU time says %.3f)\n", w, cw);
    CHECK(w > 0.3); /* thread 1's body is empty: at least 40 ms of its time was waiting */
    /* the point of the accounting: a spinning thread is waiting, though it uses CPU time (CPU
     * time says so too only when a neighbour process takes the spinning thread's CPU) */
    if (spin && atol(spin) >= 1000000) printf("  (GOMP_SPINCOUNT=%s: the idle thread spun)\n", spin);

    w = waiting(serial_then_both, &cw);
    printf("40 ms serial then 40 ms on both threads: waiting %.3f\n", w);
    CHECK(w > 0.1); /* thread 1 waited through the serial 40 ms */

    /* OpenBLAS's regions go through the same accounting: both threads count as working */
    enum { n = 1024 };
    float *a = mt_alloc(sizeof(float) * 3 * n * n);
    for (size_t i = 0; i < 2 * (size_t)n * n; i++) a[i] = (float)(i % 7) - 3.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, a + n * n, n, 0.0f, a + 2 * n * n, n);
    r0 = mt_parallel_regions();
    double t0 = mt_now(), b0 = mt_busy_time();
    for (int rep = 0; rep < 3; rep++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, a + n * n, n, 0.0f,
                    a + 2 * n * n, n);
    w = 1.0 - (mt_busy_time() - b0) / (2 * (mt_now() - t0));
    printf("3 OpenBLAS SGEMMs n=%d: %ld regions, waiting %.3f\n", n, mt_parallel_regions() - r0, w);
    CHECK(mt_parallel_regions() - r0 >= 3);
    CHECK(w < 0.4); /* both threads computed: not the 0.5 of one thread alone */
    mt_free(a);

    if (failures) fprintf(stderr, "test_busy: %d failures\n", failures);
    else printf("test_busy: all passed\n");
    return failures != 0;
}
