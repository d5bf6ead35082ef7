/* base/trace.c — Chrome trace JSON events (see trace.h). */
#include "base/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

typedef struct {
    const char *name;
    double t0, dur;
    int tid;
} trace_event;

enum { MAX_DEPTH = 32, MAX_TOTALS = 64 };

/* an open span: its name and start, and its event (or (size_t)-1 once the buffer is full:
 * the span still counts in the totals, only its event is dropped) */
typedef struct {
    const char *name;
    double t0, away0;
    size_t ev;
} open_span;

/* One stack of open spans per context: the thread (0) and the two fibers (1, 2,
 * base/fiber.h). A fiber's spans count only the time it ran: `away` sums the time it was
 * switched out. */
typedef struct {
    int depth;
    open_span open[MAX_DEPTH];
    double away, out_at;
} span_stack;

static struct {
    int on, pid;
    size_t n, cap;
    trace_event *ev;
    span_stack st[3];
    int cur;                 /* index into st */
    double origin;
    int ntot;
    const char *tot_name[MAX_TOTALS];
    double tot[MAX_TOTALS];
    double tot_fiber[MAX_TOTALS]; /* the part of tot in spans that ran on a fiber (in a pair) */
} tr;

void mt_trace_enable(int pid, size_t max_events) {
    free(tr.ev);
    memset(&tr, 0, sizeof tr);
    tr.on = 1;
    tr.pid = pid;
    tr.cap = max_events;
    tr.ev = mt_xcalloc(max_events, sizeof(trace_event));
    tr.origin = mt_now();
}

int mt_trace_enabled(void) { return tr.on; }

void mt_trace_begin(const char *name) {
    if (!tr.on) return;
    span_stack *k = &tr.st[tr.cur];
    MT_ASSERT(k->depth < MAX_DEPTH);
    double t0 = mt_now();
    size_t i = (size_t)-1;
    if (tr.n < tr.cap) {
        i = tr.n++;
        tr.ev[i] = (trace_event){name, t0, -1, tr.cur ? tr.cur + 1 : 0}; /* fibers on tracks 2 and 3 */
    }
    k->open[k->depth++] = (open_span){name, t0, k->away, i};
}

void mt_trace_fiber_switch(int from, int to) {
    if (!tr.on) return;
    double t = mt_now();
    if (from >= 0) tr.st[from + 1].out_at = t;
    if (to >= 0) {
        span_stack *k = &tr.st[to + 1];
        if (k->out_at > 0) k->away += t - k->out_at;
        k->out_at = 0;
    }
    tr.cur = to + 1;
}

static void add_total(const char *name, double dt) {
    const double df = tr.cur ? dt : 0;
    for (int i = 0; i < tr.ntot; i++)
        if (tr.tot_name[i] == name || strcmp(tr.tot_name[i], name) == 0) {
            tr.tot[i] += dt;
            tr.tot_fiber[i] += df;
            return;
        }
    if (tr.ntot < MAX_TOTALS) {
        tr.tot_name[tr.ntot] = name;
        tr.tot_fiber[tr.ntot] = df;
        tr.tot[tr.ntot++] = dt;
    }
}

void mt_trace_end(void) {
    if (!tr.on) return;
    span_stack *k = &tr.st[tr.cur];
    MT_ASSERT(k->depth > 0);
    open_span sp = k->open[--k->depth];
    double dur = mt_now() - sp.t0;
    if (sp.ev != (size_t)-1) tr.ev[sp.ev].dur = dur;
    add_total(sp.name, dur - (k->away - sp.away0));
}

void mt_trace_async(const char *name, double t0, double t1) {
    if (!tr.on) return;
    if (tr.n < tr.cap) tr.ev[tr.n++] = (trace_event){name, t0, t1 - t0, 1};
    add_total(name, t1 - t0);
}

static double total_of(const char *prefix, const double *tot) {
    double s = 0;
    for (int i = 0; i < tr.ntot; i++)
        if (strncmp(tr.tot_name[i], prefix, strlen(prefix)) == 0) s += tot[i];
    return s;
}

double mt_trace_total(const char *prefix) { return total_of(prefix, tr.tot); }

double mt_trace_total_fiber(const char *prefix) { return total_of(prefix, tr.tot_fiber); }

void mt_trace_reset_totals(void) { tr.ntot = 0; }

int mt_trace_write(const char *path) {
    if (!tr.on) return 0;
    size_t cap = 64 + tr.n * 128, len = 0;
    char *buf = mt_xmalloc(cap);
    len += (size_t)snprintf(buf + len, cap - len, "{\"traceEvents\":[\n");
    int first = 1;
    for (size_t i = 0; i < tr.n; i++) {
        if (tr.ev[i].dur < 0) continue; /* still open */
        len += (size_t)snprintf(buf + len, cap - len,
                                "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.1f,\"dur\":%.1f}",
                                first ? "" : ",\n", tr.ev[i].name, tr.pid, tr.ev[i].tid, (tr.ev[i].t0 - tr.origin) * 1e6,
                                tr.ev[i].dur * 1e6);
        first = 0;
        MT_ASSERT(len < cap);
    }
    /* the clock's origin (CLOCK_MONOTONIC seconds, one clock for the machine's processes): the
     * ranks' traces of one run line up by it */
    len += (size_t)snprintf(buf + len, cap - len, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock_origin_s\":%.6f}}\n",
                            tr.origin);
    int rc = mt_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}
