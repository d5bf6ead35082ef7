/* tests/test_trace.c — base/trace: spans nest, their totals count by name prefix, a full
 * event buffer keeps the totals (train --profile's per-step breakdown) and drops only the
 * events, the written file holds the recorded events and nothing else, and inside a fiber
 * pair a fiber's spans count only its own time, apart as the pair's (fiber) totals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/fiber.h"
#include "base/trace.h"

static int failures = 0;
#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static void spin(double s) { /* busy for s seconds */
    double t0 = mt_now();
    while (mt_now() - t0 < s) {}
}

/* occurrences of needle in the file at path */
static int count_in_file(const char *path, const char *needle) {
    char *d;
    size_t n;
    if (mt_read_file(path, &d, &n) != 0) return -1;
    int c = 0;
    for (const char *p = d; (p = strstr(p, needle)) != NULL; p += strlen(needle)) c++;
    free(d);
    return c;
}

/* a fiber: a span of 2 ms of its own, with the other fiber's turn (3 ms) inside it */
static void fiber_a(void *v) {
    (void)v;
    mt_trace_begin("comm.x");
    spin(0.001);
    mt_fiber_yield();
    spin(0.001);
    mt_trace_end();
}
static void fiber_b(void *v) {
    (void)v;
    mt_trace_begin("compute.y");
    spin(0.003);
    mt_trace_end();
}

int main(void) {
    /* off: spans cost nothing and count nothing */
    mt_trace_begin("fwd.a");
    mt_trace_end();
    CHECK(mt_trace_total("fwd.") == 0.0);

    /* room for 3 events; 5 spans: the last two (one nested) are dropped from the file only */
    mt_trace_enable(0, 3);
    mt_trace_begin("step");
    mt_trace_begin("fwd.a");
    spin(0.002);
    mt_trace_end();
    mt_trace_begin("bwd.a");
    spin(0.002);
    mt_trace_end();
    mt_trace_begin("fwd.b"); /* buffer full from here */
    mt_trace_begin("fwd.c");
    spin(0.003);
    mt_trace_end();
    spin(0.001);
    mt_trace_end();
    mt_trace_end(); /* step */
    double f = mt_trace_total("fwd."), b = mt_trace_total("bwd."), st = mt_trace_total("step");
    /* fwd.a >= 2 ms, fwd.b >= 4 ms and fwd.c >= 3 ms (nested spans both count) */
    CHECK(f >= 0.009);
    CHECK(b >= 0.002 && b < f);
    CHECK(st >= 0.008);
    CHECK(mt_trace_total("fwd.c") >= 0.003);
    CHECK(mt_trace_total("opt") == 0.0);

    const char *dir = getenv("MT_TEST_TMP");
    char path[4096];
    snprintf(path, sizeof path, "%s/trace_test.json", dir && *dir ? dir : "/tmp");
    if (dir && *dir) mt_mkdir_p(dir);
    CHECK(mt_trace_write(path) == 0);
    CHECK(count_in_file(path, "\"ph\":\"X\"") == 3);
    CHECK(count_in_file(path, "\"name\":\"step\"") == 1);
    CHECK(count_in_file(path, "\"name\":\"bwd.a\"") == 1);
    CHECK(count_in_file(path, "\"name\":\"fwd.b\"") == 0);

    mt_trace_reset_totals();
    CHECK(mt_trace_total("") == 0.0);

    /* a pair: comm.x counts its own 2 ms, not the 3 ms of the other fiber's turn, and all of
     * it as the fibers'; a span on the thread outside a pair is not the fibers' */
    mt_trace_begin("comm.x");
    spin(0.002);
    mt_trace_end();
    const double outside = mt_trace_total("comm.x");
    mt_trace_begin("overlap.pair");
    mt_fiber_pair(fiber_a, NULL, fiber_b, NULL);
    mt_trace_end();
    const double inside = mt_trace_total("comm.x") - outside, fib = mt_trace_total_fiber("comm.x");
    CHECK(outside >= 0.002 && mt_trace_total_fiber("overlap.pair") == 0.0);
    const double y = mt_trace_total_fiber("compute.y"), pair = mt_trace_total("overlap.pair");
    CHECK(inside >= 0.002 && y >= 0.003);
    CHECK(inside + y <= pair + 1e-6); /* the turn inside comm.x is not counted twice */
    CHECK(fabs(fib - inside) < 1e-9); /* inside is a difference of two sums: rounding only */
    mt_trace_reset_totals();
    CHECK(mt_trace_total_fiber("") == 0.0);
    remove(path);
    printf("test_trace: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
