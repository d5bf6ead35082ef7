/* parallel/wire.c — the emulated inter-node link (see wire.h). */
#include "parallel/wire.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "base/common.h"

static mt_wire g_wire;

mt_wire *mt_wire_get(void) { return &g_wire; }

int mt_wire_parse(const char *spec, double *bw, double *lat) {
    char *end;
    errno = 0;
    double g = strtod(spec, &end), us = 0;
    if (end == spec || errno || !(g > 0) || !isfinite(g)) goto bad;
    if (*end == ',') {
        const char *s = end + 1;
        us = strtod(s, &end);
        if (end == s || errno || !(us >= 0) || !isfinite(us)) goto bad;
    }
    if (*end) goto bad;
    *bw = g * 1e9;
    *lat = us * 1e-6;
    return 0;
bad:
    return mt_error("--wire '%s': expected GBPS[,US] (bandwidth in GB/s > 0, latency in microseconds >= 0), "
                    "e.g. --wire 0.5,20",
                    spec);
}

void mt_wire_set(double bw, double lat) {
    g_wire.on = bw > 0;
    g_wire.bw = bw;
    g_wire.lat = lat;
    g_wire.link_free = 0;
    g_wire.bg_free = 0;
    g_wire.nsent = 0;
}

static void log_send(double t, double d) {
    mt_wire *w = &g_wire;
    if (w->nsent == w->capsent) {
        w->capsent = w->capsent ? 2 * w->capsent : 256;
        w->sent_t = mt_xrealloc(w->sent_t, sizeof(double) * (size_t)w->capsent);
        w->sent_d = mt_xrealloc(w->sent_d, sizeof(double) * (size_t)w->capsent);
    }
    w->sent_t[w->nsent] = t;
    w->sent_d[w->nsent++] = d;
}

void mt_wire_background_begin(void) { g_wire.bg_pending++; }

double mt_wire_background(double start, double bytes) {
    mt_wire *w = &g_wire;
    MT_ASSERT(w->bg_pending > 0);
    w->bg_pending--;
    const double s0 = start > w->bg_free ? start : w->bg_free, need = bytes / w->bw;
    /* end = s0 + need + the foreground link time sent in [s0, end): a step function of end,
     * so the fixed point is reached in at most nsent rounds */
    double end = s0 + need;
    for (;;) {
        double busy = 0;
        for (int i = 0; i < w->nsent; i++)
            if (w->sent_t[i] >= s0 && w->sent_t[i] < end) busy += w->sent_d[i];
        if (s0 + need + busy <= end) break;
        end = s0 + need + busy;
    }
    w->bg_free = end;
    int k = 0; /* later transfers start at bg_free or after: older sends no longer matter */
    for (int i = 0; i < w->nsent; i++)
        if (w->sent_t[i] >= end) w->sent_t[k] = w->sent_t[i], w->sent_d[k++] = w->sent_d[i];
    w->nsent = w->bg_pending ? k : 0;
    return end + w->lat;
}

void mt_wire_stamp(const int64_t *bytes, int n, int first, double *arrive) {
    mt_wire *w = &g_wire;
    double t = mt_now();
    if (w->link_free < t) w->link_free = t;
    for (int i = 0; i < n; i++) {
        int p = (first + i) % n;
        arrive[p] = 0;
        if (bytes[p] <= 0) continue;
        const double d = (double)bytes[p] / w->bw;
        if (w->bg_pending) log_send(t, d);
        if (bytes[p] <= MT_WIRE_SMALL) { /* ahead of the queued bulk, which slips by its time */
            arrive[p] = t + d + w->lat;
            w->link_free += d;
            t += d;
            continue;
        }
        w->link_free += d;
        arrive[p] = w->link_free + w->lat;
    }
}

void mt_wire_sleep_until(double t) {
    double now = mt_now();
    if (t <= now) return;
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    g_wire.slept += mt_now() - now;
}
