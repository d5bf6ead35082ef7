/* tests/test_fiber.c — base/fiber: two fibers hand the thread to each other at their yields
 * (in that order, each fiber's state kept), OpenMP regions run inside a fiber, a yield
 * outside a pair or with the other fiber finished returns at once, a pair can be run again, and the trace keeps one span stack per fiber whose totals
 * count only the time the fiber ran (the overlapped schedule's exposed communication). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/fiber.h"
#include "base/trace.h"

static int failures = 0;
#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static char order[64];
static int norder;
static void mark(char c) { order[norder++] = c; }

static void spin(double s) {
    double t0 = mt_now();
    while (mt_now() - t0 < s) {}
}

/* a: three pieces with two yields; its locals live on its own stack across them */
static void fa(void *arg) {
    int *id = arg;
    volatile int local = 41;
    *id = mt_fiber_id();
    mark('a');
    mt_fiber_yield();
    local++;
    mark('a');
    mt_fiber_yield();
    mark(local == 42 ? 'a' : 'X');
}

static void fb(void *arg) {
    int *id = arg;
    *id = mt_fiber_id();
    mark('b');
    /* an OpenMP region inside a fiber (never across a yield) */
    long sum = 0;
#pragma omp parallel for reduction(+ : sum) num_threads(2)
    for (int i = 0; i < 1000; i++) sum += i;
    mark(sum == 499500 ? 'b' : 'Y');
    mt_fiber_yield();
    mark('b');
}

/* the trace: a waits (yields) inside its span while b computes for 30 ms */
static void ta(void *arg) {
    (void)arg;
    mt_trace_begin("comm.wait");
    spin(0.002);
    mt_fiber_yield();
    mt_trace_end();
}

static void tb(void *arg) {
    (void)arg;
    mt_trace_begin("compute");
    spin(0.03);
    mt_trace_end();
}

/* a yield with the other fiber finished returns at once, having run nothing */
static void quick(void *arg) { (void)arg; }
static void lone(void *arg) { *(double *)arg = mt_fiber_yield(); }

int main(void) {
    CHECK(mt_fiber_id() == -1);
    CHECK(mt_fiber_yield() == 0); /* outside a pair: at once */

    for (int rep = 0; rep < 2; rep++) { /* the stacks are reused */
        int ida = -2, idb = -2;
        norder = 0;
        memset(order, 0, sizeof order);
        mt_fiber_pair(fa, &ida, fb, &idb);
        CHECK(strcmp(order, "abbaba") == 0);
        if (strcmp(order, "abbaba") != 0) fprintf(stderr, "order %s\n", order);
        CHECK(ida == 0 && idb == 1);
        CHECK(mt_fiber_id() == -1);
    }

    double away = -1;
    mt_fiber_pair(quick, NULL, lone, &away);
    CHECK(away == 0);

    mt_trace_enable(0, 64);
    mt_trace_begin("step");
    mt_fiber_pair(ta, NULL, tb, NULL);
    mt_trace_end();
    double w = mt_trace_total("comm."), c = mt_trace_total("compute"), st = mt_trace_total("step");
    CHECK(c >= 0.03);
    CHECK(w >= 0.002 && w < 0.02); /* b's 30 ms are not a's waiting */
    CHECK(st >= 0.032);           /* the thread's own span counts the whole pair */
    char path[] = "/tmp/test_fiber_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(mt_trace_write(path) == 0);
    char *d;
    size_t n;
    CHECK(mt_read_file(path, &d, &n) == 0);
    CHECK(strstr(d, "\"name\":\"comm.wait\",\"ph\":\"X\",\"pid\":0,\"tid\":2") != NULL);
    CHECK(strstr(d, "\"name\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":3") != NULL);
    CHECK(strstr(d, "\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":0") != NULL);
    free(d);
    remove(path);

    if (failures) {
        printf("test_fiber: %d failures\n", failures);
        return 1;
    }
    printf("test_fiber: all checks passed\n");
    return 0;
}
