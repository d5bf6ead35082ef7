/* tests/test_distqueue.c — DistQueue (parallel/distqueue.h) under MPI.
 *
 * Usage: mpirun -np N test_distqueue [groups_per_producer]   (tests/test_distqueue_mpi.sh)
 * Rank 0 is the controller and a consumer; the first half of the ranks consume, the other
 * half produce (one rank alone does both, in turn). Every producer puts field 0 of its own
 * groups and field 1 of the previous producer's, so a sample's fields live on two ranks, with
 * random pauses between puts and gets. Cases:
 *  - any: task 0 takes groups with both fields, task 1 with field 0 only, three groups at a
 *    time, until every producer closed: every sample reaches each task exactly once, with
 *    the bytes it was put with;
 *  - slow consumers and a store of 2 groups: no rank ever holds more than its capacity, and
 *    the producers' stores did fill (the back-pressure was exercised);
 *  - range: one consumer takes the groups in order, 2 at a time, and gets exactly those;
 *  - stale: groups carry versions, the consumer asks for versions >= a rising bound: no
 *    group older than the bound is delivered, and delivered + dropped = every sample.
 * Prints "distqueue: N checks passed, M failed"; exit 1 on failure. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "parallel/dist.h"
#include "parallel/distqueue.h"

#include "mpicheck.h"

enum { G = 4 };

/* field f of sample id: a length and bytes that are pure functions of (id, f) */
static size_t flen(int64_t id, int f) { return 1 + mt_hash4((uint64_t)id, (uint64_t)f, 1, 2) % (f ? 8 : 300); }
static uint8_t fbyte(int64_t id, int f, size_t k) { return (uint8_t)mt_hash4((uint64_t)id, (uint64_t)f, k, 3); }

static void pause_us(uint64_t key, int max_us) {
    if (max_us <= 0) return;
    const long us = (long)(mt_hash4(key, 5, 6, 7) % (uint64_t)max_us);
    const struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void put_field(mt_dq *q, int64_t id, int f, int version) {
    const size_t n = flen(id, f);
    uint8_t *b = mt_xmalloc(n);
    for (size_t k = 0; k < n; k++) b[k] = fbyte(id, f, k);
    mt_dq_put(q, id, f, b, n, version);
    free(b);
}

/* Producer p of P: field 0 of groups p*ng .. (p+1)*ng-1, and field 1 of the previous producer's. */
static void produce(mt_dq *q, int p, int P, int ng, int max_us, int versioned) {
    const int prev = (p + P - 1) % P;
    for (int g = 0; g < ng; g++) {
        for (int k = 0; k < G; k++) {
            const int64_t id = ((int64_t)p * ng + g) * G + k;
            put_field(q, id, 0, versioned ? g / 2 : 0);
            pause_us((uint64_t)id * 31 + 1, max_us);
        }
        for (int k = 0; k < G; k++) { /* field 1 of the previous producer's group g: its rank put field 0 */
            const int64_t id = ((int64_t)prev * ng + g) * G + k;
            put_field(q, id, 1, -1);
        }
        mt_dq_progress(q);
    }
    mt_dq_close(q);
}

static int check_batch(const mt_dq_batch *b, uint32_t need, int64_t *seen, int64_t total) {
    int bad = 0;
    for (int i = 0; i < b->n; i++) {
        const int64_t id = b->id[i];
        if (id < 0 || id >= total) { bad++; continue; }
        seen[id]++;
        for (int f = 0; f < 2; f++) {
            if (!(need & (1u << f))) { bad += b->data[f] != NULL; continue; }
            const size_t n = flen(id, f);
            if (b->bytes[f][i] != n) { bad++; continue; }
            for (size_t k = 0; k < n; k++) bad += b->data[f][i][k] != fbyte(id, f, k);
        }
    }
    return bad;
}

typedef struct {
    int ntasks, capacity, get_groups, producer_us, consumer_us;
} any_case;

static void run_any(mt_dist *d, int ng, const any_case *c, const char *name) {
    const int N = d->size, C = N > 1 ? N / 2 : 1, P = N > 1 ? N - C : 1;
    const int consumer = d->rank < C, producer = N > 1 ? !consumer : 1;
    const int64_t total = (int64_t)P * ng * G;
    /* every task needs a consumer; one rank alone produces everything before it consumes */
    const int ntasks = c->ntasks < C ? c->ntasks : C, cap = N > 1 ? c->capacity : (int)total;
    mt_dq_opts o = {G, 2, ntasks, cap, P};
    mt_dq *q = mt_dq_init(&d->all, &o);
    int64_t *seen = mt_xcalloc((size_t)(total * 2), sizeof *seen);
    int bad = 0;
    if (producer) produce(q, N > 1 ? d->rank - C : 0, P, ng, c->producer_us, 0);
    if (consumer) {
        /* task: consumers alternate between the tasks; task 1 takes field 0 only */
        const int task = ntasks > 1 ? d->rank % 2 : 0;
        const uint32_t need = task == 0 ? 3u : 1u;
        int calls = 0;
        for (;;) {
            mt_dq_batch b;
            const int got = mt_dq_get_any(q, task, need, c->get_groups, 0, &b);
            bad += check_batch(&b, need, seen + total * task, total);
            bad += b.n != got * G;
            mt_dq_batch_free(&b);
            if (got == 0) break;
            pause_us((uint64_t)d->rank * 1000 + (uint64_t)calls++, c->consumer_us);
        }
    }
    const mt_dq_stats st = mt_dq_get_stats(q);
    mt_dq_free(q);
    mt_group_sum_i64(&d->all, seen, (size_t)(total * 2));
    int64_t wrong = 0;
    for (int t = 0; t < ntasks; t++)
        for (int64_t i = 0; i < total; i++) wrong += seen[t * total + i] != 1;
    CHECK(wrong == 0, "%s: %lld samples not seen exactly once per task", name, (long long)wrong);
    CHECK(bad == 0, "%s: %d wrong fields or counts", name, bad);
    CHECK(st.held_peak <= cap, "%s: held %lld samples, capacity %d", name, (long long)st.held_peak, cap);
    uint64_t peak[1] = {(uint64_t)st.held_peak};
    mt_group_max_u64(&d->all, peak, 1);
    if (c->consumer_us > 0 && N > 1)
        CHECK(peak[0] == (uint64_t)c->capacity, "%s: the stores never filled (peak %llu of %d): back-pressure untested",
              name, (unsigned long long)peak[0], c->capacity);
    if (d->rank == 0)
        printf("  %s: %lld samples x %d task(s), peak held %llu of %d, live peak %lld, waits put %.3f s get %.3f s (rank 0)\n",
               name, (long long)total, ntasks, (unsigned long long)peak[0], cap, (long long)st.live_peak,
               st.wait_put_s, st.wait_get_s);
    free(seen);
}

/* One consumer (rank 0) takes the groups in order; with one rank it produces everything first. */
static void run_range(mt_dist *d, int ng) {
    const int N = d->size, P = N > 1 ? N - 1 : 1;
    const int64_t ngroups = (int64_t)P * ng, total = ngroups * G;
    mt_dq_opts o = {G, 2, 1, (int)total, P}; /* in-order takes need every group held */
    mt_dq *q = mt_dq_init(&d->all, &o);
    if (N == 1 || d->rank > 0) produce(q, N > 1 ? d->rank - 1 : 0, P, ng, 200, 0);
    int bad = 0;
    if (d->rank == 0) {
        int64_t *seen = mt_xcalloc((size_t)total, sizeof *seen);
        for (int64_t g = 0; g < ngroups; g += 2) {
            const int64_t hi = g + 2 < ngroups ? g + 2 : ngroups;
            mt_dq_batch b;
            mt_dq_get_range(q, 0, 3u, g, hi, &b);
            bad += b.n != (int)((hi - g) * G);
            for (int i = 0; i < b.n; i++) bad += b.id[i] != g * G + i;
            bad += check_batch(&b, 3u, seen, total);
            mt_dq_batch_free(&b);
        }
        for (int64_t i = 0; i < total; i++) bad += seen[i] != 1;
        free(seen);
    }
    mt_dq_free(q);
    CHECK(bad == 0, "range: %d wrong samples", bad);
}

/* Versions rise with the group (g / 2 of each producer); the consumer's bound rises with its calls. */
static void run_stale(mt_dist *d, int ng) {
    const int N = d->size, P = N > 1 ? N - 1 : 1;
    const int64_t total = (int64_t)P * ng * G;
    mt_dq_opts o = {G, 2, 1, (int)total, P};
    mt_dq *q = mt_dq_init(&d->all, &o);
    if (N == 1 || d->rank > 0) produce(q, N > 1 ? d->rank - 1 : 0, P, ng, 100, 1);
    int bad = 0;
    int64_t got_samples = 0, dropped = 0;
    if (d->rank == 0) {
        int64_t *seen = mt_xcalloc((size_t)total, sizeof *seen);
        for (int call = 0;; call++) {
            mt_dq_batch b;
            const int bound = call / 3;
            const int got = mt_dq_get_any(q, 0, 3u, 2, bound, &b);
            for (int i = 0; i < b.n; i++) bad += b.version[i] < bound;
            bad += check_batch(&b, 3u, seen, total);
            got_samples += b.n;
            mt_dq_batch_free(&b);
            if (got == 0) break;
            pause_us((uint64_t)call, 3000);
        }
        for (int64_t i = 0; i < total; i++) bad += seen[i] > 1;
        dropped = mt_dq_get_stats(q).dropped_samples;
        free(seen);
        CHECK(got_samples + dropped == total, "stale: delivered %lld + dropped %lld != %lld", (long long)got_samples,
              (long long)dropped, (long long)total);
        printf("  stale: %lld delivered, %lld dropped as too old\n", (long long)got_samples, (long long)dropped);
    }
    mt_dq_free(q);
    CHECK(bad == 0, "stale: %d samples older than the bound or wrong", bad);
}

int main(int argc, char **argv) {
    mt_dist *d = mpicheck_init(&argc, &argv);
    if (!d) return 1;
    if (argc > 1 && strcmp(argv[1], "stop") == 0) { /* the last rank stops after 5 groups */
        mt_dist_set_timeout(3);
        mt_dq_opts o = {G, 1, 1, 1000, d->size - 1};
        mt_dq *q = mt_dq_init(&d->all, &o);
        if (d->rank > 0)
            for (int g = 0; g < 50; g++) {
                if (d->rank == d->size - 1 && g == 5) raise(SIGSTOP);
                for (int k = 0; k < G; k++) put_field(q, ((int64_t)d->rank * 50 + g) * G + k, 0, 0);
            }
        if (d->rank > 0) mt_dq_close(q);
        if (d->rank == 0)
            for (;;) {
                mt_dq_batch b;
                const int got = mt_dq_get_any(q, 0, 1u, 1, 0, &b);
                mt_dq_batch_free(&b);
                if (got == 0) break;
            }
        mt_dq_free(q);
        mt_dist_finalize();
        return 1; /* the watchdog should have ended the job */
    }
    const int ng = argc > 1 ? atoi(argv[1]) : 64;
    const any_case fast = {2, 64, 3, 300, 0}, slow = {1, 2 * G, 1, 0, 4000};
    run_any(d, ng, &fast, "any, 2 tasks");
    run_any(d, ng / 4 > 0 ? ng / 4 : 1, &slow, "any, slow consumers");
    run_range(d, ng);
    run_stale(d, ng / 2 > 0 ? ng / 2 : 1);
    int f[2] = {g_pass, g_fail};
    int64_t s[2] = {f[0], f[1]};
    mt_group_sum_i64(&d->all, s, 2);
    if (d->rank == 0) printf("distqueue: %lld checks passed, %lld failed\n", (long long)s[0], (long long)s[1]);
    mt_dist_finalize();
    return s[1] ? 1 : 0;
}
