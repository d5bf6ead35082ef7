/* parallel/dist.c — MPI layout and collectives (see dist.h). */
#include "parallel/dist.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/common.h"
#include "base/trace.h"
#include "parallel/watchdog.h"
#include "parallel/wire.h"

static mt_dist g_dist = {.rank = 0, .size = 1, .local_rank = 0, .local_size = 1, .pp_size = 1, .dp_size = 1,
                         .ep_size = 1, .edp_size = 1,
                         .all = {MPI_COMM_NULL, 0, 1}, .dp = {MPI_COMM_NULL, 0, 1}, .tp = {MPI_COMM_NULL, 0, 1},
                         .dpt = {MPI_COMM_NULL, 0, 1}, .tp_size = 1, .ep = {MPI_COMM_NULL, 0, 1},
                         .edp = {MPI_COMM_NULL, 0, 1}, .pp = {MPI_COMM_NULL, 0, 1}, .emb = {MPI_COMM_NULL, 0, 1},
                         .role = -1, .job = {MPI_COMM_NULL, 0, 1}};

/* name: what the watchdog and MPI's own messages call the group */
static void group_split(mt_group *g, int color, int key, const char *name) {
    mt_group_free(g); /* the old group's nodes too: set again on the new one */
    MPI_Comm_split(g_dist.world, color, key, &g->comm);
    if (g->comm != MPI_COMM_NULL) MPI_Comm_set_name(g->comm, name);
    if (g->comm == MPI_COMM_NULL) {
        g->rank = 0;
        g->size = 1;
        return;
    }
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
}

/* MPI counts and displacements are int: large buffers go in pieces of at most this many
 * elements. MT_MPI_MAX_COUNT lowers it (read at start-up), so that tests run the piecewise
 * paths on small models. */
static size_t max_count = (size_t)1 << 30;

/* Gradient sums and reduce-scatters when every rank shares one machine: Open MPI's
 * non-blocking ones (libnbc) ran 2.3-2.7x slower here than the blocking ones, and a copy
 * through shared memory is CPU work that polling between compute pieces cannot hide. So
 * they are deferred and run blocking at their end (mt_coll_end), unless MT_COMM_THREAD moves
 * them in the background or MT_COLL_NONBLOCKING=1 asks for the non-blocking ones. */
static int g_coll_defer;

/* MT_COMM_THREAD=US: a thread that enters MPI every US microseconds (an MPI_Iprobe on a
 * communicator of its own, which runs the library's progress engine), so that non-blocking
 * exchanges move while the main thread computes: Open MPI has no progress thread of its
 * own. Needs MPI_THREAD_MULTIPLE. The alternative, and the default, is polling at the
 * compute pieces' boundaries (docs/DESIGN.md has the measurement). */
static struct {
    pthread_t th;
    MPI_Comm comm;
    long period_ns;
    _Atomic int stop;
    int on;
} g_prog;

static void *progress_loop(void *arg) {
    (void)arg;
    struct timespec ts = {g_prog.period_ns / 1000000000L, g_prog.period_ns % 1000000000L};
    while (!atomic_load(&g_prog.stop)) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, 0, g_prog.comm, &flag, MPI_STATUS_IGNORE);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static long comm_thread_period_ns(void) {
    const char *s = getenv("MT_COMM_THREAD");
    if (!s || !*s) return 0;
    char *end;
    const double us = strtod(s, &end);
    if (*end || !(us >= 1 && us <= 1e6)) return -1;
    return (long)(us * 1000);
}

int mt_dist_init(int *argc, char ***argv) {
    MT_ASSERT(!g_dist.initialized);
    int provided = 0;
    const long period = comm_thread_period_ns();
    if (period < 0) return mt_error("MT_COMM_THREAD=%s: the progress thread's period in microseconds, 1..1e6", getenv("MT_COMM_THREAD"));
    const int want = period > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    if (MPI_Init_thread(argc, argv, want, &provided) != MPI_SUCCESS)
        return mt_error("MPI_Init_thread failed");
    if (period > 0 && provided < MPI_THREAD_MULTIPLE)
        return mt_error("MT_COMM_THREAD: this MPI gives thread level %d, not MPI_THREAD_MULTIPLE", provided);
    if (provided < MPI_THREAD_FUNNELED) {
        /* only the main thread calls MPI, so SINGLE works in practice; say so once */
        mt_warn("MPI provides thread level %d < MPI_THREAD_FUNNELED; continuing", provided);
    }
    g_dist.initialized = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &g_dist.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_dist.size);
    /* each group has its own communicator, which keeps the traffic of groups apart */
    MPI_Comm_dup(MPI_COMM_WORLD, &g_dist.world);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_dist.all.comm);
    MPI_Comm_set_name(g_dist.world, "world");
    MPI_Comm_set_name(g_dist.all.comm, "world");
    MPI_Comm_dup(MPI_COMM_WORLD, &g_dist.job.comm);
    MPI_Comm_set_name(g_dist.job.comm, "job (all roles)");
    g_dist.job.rank = g_dist.rank;
    g_dist.job.size = g_dist.size;
    g_dist.all.rank = g_dist.rank;
    g_dist.all.size = g_dist.size;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_dist.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_dist.local_rank);
    MPI_Comm_size(node, &g_dist.local_size);
    MPI_Comm_free(&node);
    /* the runtime pins OpenMP thread i to the i-th allowed CPU: right for one process per
     * node, wrong for several sharing the same CPUs (all their thread 0s on one core) */
    if (g_dist.local_size > 1 && !getenv("MT_PIN")) setenv("MT_PIN", "0", 1);
    const char *nb = getenv("MT_COLL_NONBLOCKING");
    g_coll_defer = g_dist.local_size == g_dist.size && period == 0 && !(nb && *nb && strcmp(nb, "0") != 0);
    const char *mc = getenv("MT_MPI_MAX_COUNT");
    if (mc && *mc) {
        char *end;
        long long v = strtoll(mc, &end, 10);
        if (*end || v < 1 || v > (1LL << 30)) return mt_error("MT_MPI_MAX_COUNT=%s: not a count in 1..2^30", mc);
        max_count = (size_t)v;
    }
    if (period > 0 && g_dist.size > 1) {
        MPI_Comm_dup(MPI_COMM_WORLD, &g_prog.comm);
        g_prog.period_ns = period;
        atomic_store(&g_prog.stop, 0);
        if (pthread_create(&g_prog.th, NULL, progress_loop, NULL) != 0)
            return mt_error("MT_COMM_THREAD: could not start the progress thread");
        g_prog.on = 1;
    }
    if (g_dist.size > 1 && mt_watch_start(g_dist.rank, g_dist.size, MT_COMM_TIMEOUT_DEFAULT) != 0)
        mt_warn("could not start the communication watchdog: a stuck rank will not be detected");
    return mt_dist_set_layout(&g_dist, 1, 1, 0, 1);
}

/* Every rank must be given the same layout before any group is cut (a rank with its own
 * --ep would split the world differently and wait in a split the others never make). */
static int layout_agrees(mt_dist *d, int pp, int tp, int sp, int ep) {
    if (!d->initialized || d->size == 1) return 0;
    int mine[4] = {pp, tp, sp != 0, ep}, *all = mt_xmalloc(sizeof(int) * 4 * (size_t)d->size);
    MPI_Allgather(mine, 4, MPI_INT, all, 4, MPI_INT, d->world);
    int bad = -1;
    for (int r = 1; r < d->size && bad < 0; r++)
        if (memcmp(all + 4 * r, all, sizeof mine) != 0) bad = r;
    int rc = 0;
    if (bad >= 0) {
        const int *a = all, *b = all + 4 * bad;
        rc = mt_error("rank %d was given a different layout than rank 0 (--pp %d --tp %d%s --ep %d against --pp %d "
                      "--tp %d%s --ep %d): every rank needs the same layout flags", bad, b[0], b[1], b[2] ? " --sp" : "",
                      b[3], a[0], a[1], a[2] ? " --sp" : "", a[3]);
    }
    free(all);
    return rc;
}

int mt_dist_set_layout(mt_dist *d, int pp, int tp, int sp, int ep) {
    if (layout_agrees(d, pp, tp, sp, ep) != 0) return -1;
    if (pp < 1 || ep < 1 || tp < 1) return mt_error("--pp, --tp and --ep must be at least 1");
    if (d->size % (pp * tp) != 0)
        return mt_error("--pp %d x --tp %d does not divide the %d ranks (world = PP x DP x TP)", pp, tp, d->size);
    const int D = d->size / (pp * tp);
    sp = sp && tp > 1;
    const int X = sp ? D * tp : D; /* the ranks the EP groups are carved from */
    if (X % ep != 0)
        return mt_error("--ep %d does not divide the %d %s of a stage (%d ranks / PP %d%s): the EP groups are "
                        "carved out of them", ep, X, sp ? "DP x TP ranks" : "data-parallel ranks", d->size, pp,
                        sp ? "" : tp > 1 ? " / TP; with --sp they span DP x TP" : "");
    d->pp_size = pp;
    d->dp_size = D;
    d->tp_size = tp;
    d->sp = sp;
    d->ep_size = ep;
    d->edp_size = X / ep;
    d->tp_rank = d->rank % tp;
    d->dp_rank = d->rank / tp % D;
    d->pp_rank = d->rank / (tp * D);
    const int x = sp ? d->dp_rank * tp + d->tp_rank : d->dp_rank;
    d->ep_rank = x % ep;
    d->edp_rank = x / ep;
    if (!d->initialized) return 0; /* a world of one: every group is this rank */
    const int sub = sp ? 0 : d->tp_rank, nsub = sp ? 1 : tp; /* without SP, EP stays inside one tp_rank */
    group_split(&d->tp, d->pp_rank * D + d->dp_rank, d->tp_rank, "tp");
    group_split(&d->dp, d->pp_rank * tp + d->tp_rank, d->dp_rank, "dp");
    group_split(&d->dpt, d->pp_rank, d->dp_rank * tp + d->tp_rank, "stage (dp x tp)");
    group_split(&d->pp, d->dp_rank * tp + d->tp_rank, d->pp_rank, "pp");
    group_split(&d->ep, (d->pp_rank * nsub + sub) * (X / ep) + d->edp_rank, d->ep_rank, "ep");
    group_split(&d->edp, (d->pp_rank * nsub + sub) * ep + d->ep_rank, d->edp_rank, "expert-dp");
    int in_emb = pp > 1 && (d->pp_rank == 0 || d->pp_rank == pp - 1);
    group_split(&d->emb, in_emb ? d->dp_rank * tp + d->tp_rank : MPI_UNDEFINED, d->pp_rank, "embedding (first and last stage)");
    MT_ASSERT(d->dp.size == D && d->ep.size == ep && d->edp.size == X / ep && d->pp.size == pp && d->tp.size == tp);
    MT_ASSERT(d->dp.rank == d->dp_rank && d->ep.rank == d->ep_rank && d->edp.rank == d->edp_rank);
    return 0;
}

int mt_dist_set_role(mt_dist *d, int role) {
    if (!d->initialized || d->job.size == 1) return mt_error("roles need more than one rank");
    MPI_Comm rc;
    MPI_Comm_split(d->job.comm, role, d->job.rank, &rc);
    int n;
    MPI_Comm_size(rc, &n);
    MPI_Comm_free(&d->world);
    MPI_Comm_free(&d->all.comm);
    d->world = rc;
    MPI_Comm_set_name(d->world, "role world");
    MPI_Comm_dup(rc, &d->all.comm);
    MPI_Comm_set_name(d->all.comm, "role world");
    MPI_Comm_rank(rc, &d->rank);
    d->size = n;
    d->all.rank = d->rank;
    d->all.size = n;
    d->role = role;
    return mt_dist_set_layout(d, 1, 1, 0, 1);
}

/* pieces of at most max_count bytes, so that any n fits MPI's int counts; one message even
 * when n is 0, so that a send always meets its receive */
void mt_group_send_bytes(mt_group *g, const void *x, size_t n, int peer, int tag) {
    double t0 = MPI_Wtime();
    size_t i = 0;
    do {
        const size_t c = n - i < max_count ? n - i : max_count;
        MPI_Send((const char *)x + i, (int)c, MPI_BYTE, peer, tag, g->comm);
        i += c;
    } while (i < n);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_recv_bytes(mt_group *g, void *x, size_t n, int peer, int tag) {
    double t0 = MPI_Wtime();
    size_t i = 0;
    do {
        const size_t c = n - i < max_count ? n - i : max_count;
        MPI_Recv((char *)x + i, (int)c, MPI_BYTE, peer, tag, g->comm, MPI_STATUS_IGNORE);
        i += c;
    } while (i < n);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_send_f32(mt_group *g, const float *x, size_t n, int peer, int tag) {
    mt_group_send_bytes(g, x, n * sizeof *x, peer, tag);
}

void mt_group_isend_bytes(mt_group *g, const void *x, size_t n, int peer, int tag, mt_request *req) {
    MT_ASSERT(n <= (size_t)INT_MAX);
    MPI_Isend(x, (int)n, MPI_BYTE, peer, tag, g->comm, req);
}

int mt_request_test(mt_request *req) {
    int done = 1;
    if (*req != MPI_REQUEST_NULL) MPI_Test(req, &done, MPI_STATUS_IGNORE);
    return done;
}

int mt_group_probe(mt_group *g, int peer, int tag) {
    int flag = 0;
    MPI_Iprobe(peer, tag, g->comm, &flag, MPI_STATUS_IGNORE);
    return flag;
}

void mt_dist_finalize(void) {
    if (!g_dist.initialized) return;
    if (g_prog.on) {
        atomic_store(&g_prog.stop, 1);
        pthread_join(g_prog.th, NULL);
        MPI_Comm_free(&g_prog.comm);
        g_prog.on = 0;
    }
    mt_group *gs[] = {&g_dist.job, &g_dist.all, &g_dist.tp, &g_dist.dpt, &g_dist.dp, &g_dist.ep, &g_dist.edp, &g_dist.pp, &g_dist.emb};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) mt_group_free(gs[i]);
    MPI_Comm_free(&g_dist.world);
    MPI_Finalize();
    g_dist.initialized = 0;
}

mt_dist *mt_dist_get(void) { return &g_dist; }

void mt_dist_set_timeout(double seconds) {
    if (g_dist.job.size > 1) mt_watch_set_timeout(seconds);
}

void mt_dist_abort(const char *msg) {
    if (g_dist.job.size > 1) {
        /* most errors (flags, layout, config) are found alike on every rank: let rank 0 say
         * it and end the job; another rank speaks only if the job is still up a moment later */
        if (g_dist.job.rank != 0) {
            struct timespec ts = {0, 500 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        fprintf(stderr, "moetrain: error: rank %d of %d: %s\n", g_dist.job.rank, g_dist.job.size, msg);
        fprintf(stderr, "moetrain: rank %d is ending the job (MPI_Abort)\n", g_dist.job.rank);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    } else {
        fprintf(stderr, "moetrain: error: %s\n", msg);
    }
    exit(1);
}

static int active(const mt_group *g) { return g->size > 1 && g->comm != MPI_COMM_NULL; }

static void allreduce(mt_group *g, void *x, size_t n, size_t esize, MPI_Datatype t) {
    if (!active(g) || n == 0) return;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < n; i += max_count) {
        size_t c = n - i < max_count ? n - i : max_count;
        MPI_Allreduce(MPI_IN_PLACE, (char *)x + i * esize, (int)c, t, MPI_SUM, g->comm);
    }
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_sum_f32(mt_group *g, float *x, size_t n) { allreduce(g, x, n, sizeof *x, MPI_FLOAT); }
void mt_group_sum_f64(mt_group *g, double *x, size_t n) { allreduce(g, x, n, sizeof *x, MPI_DOUBLE); }
void mt_group_sum_i64(mt_group *g, int64_t *x, size_t n) { allreduce(g, x, n, sizeof *x, MPI_INT64_T); }

size_t mt_dist_max_count(void) { return max_count; }

/* A collective just started at t0 (MPI_Wtime): its trace name and, on the wire, this rank's
 * share of it as a ring moves it, `bytes` on its link in `steps` steps, timed at the end (the
 * expert traffic sent meanwhile goes first). */
static void coll_started(mt_group *g, mt_coll *c, const char *what, double bytes, int steps, double t0) {
    c->started = 1;
    c->t_begin = mt_now();
    c->what = what;
    if (mt_wire_get()->on && g->multi_node) {
        mt_wire_background_begin();
        c->wired = 1;
        c->start = c->t_begin;
        c->bytes = bytes;
        c->steps = steps;
    }
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_sum_begin(mt_group *g, float *x, size_t n, mt_coll *c) {
    memset(c, 0, sizeof *c);
    if (!active(g) || n == 0) return;
    MT_ASSERT(n <= max_count);
    double t0 = MPI_Wtime();
    if (g_coll_defer) c->defer = 1, c->x = x, c->n = n;
    else MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, g->comm, &c->req);
    const int S = g->size;
    coll_started(g, c, "gradient bucket in flight", 2.0 * (S - 1) / S * (double)n * sizeof(float), 2 * (S - 1), t0);
}

/* The shard collectives run over windows [w0, w1) of the whole buffer, at most max_count
 * long so that counts and displacements fit an int whatever n is (the gradient buckets are
 * windows too). In a window, rank r's part is the window's intersection with its shard; the
 * shards are contiguous and in rank order, so the parts are too, as MPI's v-collectives want
 * them. Fills cnt[size] and dis[size] (offsets in the window) and returns where this rank's
 * part starts in its shard. */
static size_t window_parts(const mt_group *g, size_t n, size_t w0, size_t w1, int *cnt, int *dis) {
    size_t mine = 0;
    for (int r = 0; r < g->size; r++) {
        size_t lo, hi;
        mt_group_range(g, n, r, &lo, &hi);
        const size_t a = lo > w0 ? lo : w0, b = hi < w1 ? hi : w1;
        const int part = a < b; /* the shard overlaps the window */
        cnt[r] = part ? (int)(b - a) : 0;
        dis[r] = part ? (int)(a - w0) : 0;
        if (r == g->rank && part) mine = a - lo;
    }
    return mine;
}

/* the window from w0 of a buffer of n: max_count elements or what is left */
static size_t window_end(size_t n, size_t w0) { return n - w0 < max_count ? n : w0 + max_count; }

void mt_group_reduce_scatter_begin(mt_group *g, const float *x, size_t n, size_t b0, size_t b1, float *shard,
                                   mt_coll *c) {
    memset(c, 0, sizeof *c);
    MT_ASSERT(b0 <= b1 && b1 <= n && b1 - b0 <= max_count);
    if (!active(g)) { /* one rank: its shard is the whole buffer */
        memcpy(shard + b0, x + b0, (b1 - b0) * sizeof *x);
        return;
    }
    if (b1 == b0) return;
    double t0 = MPI_Wtime();
    c->cnt = mt_xmalloc(sizeof(int) * (size_t)g->size * 2);
    const size_t mine = window_parts(g, n, b0, b1, c->cnt, c->cnt + g->size);
    if (g_coll_defer) c->defer = 2, c->x = (float *)(x + b0), c->shard = shard + mine;
    else MPI_Ireduce_scatter(x + b0, shard + mine, c->cnt, MPI_FLOAT, MPI_SUM, g->comm, &c->req);
    const int S = g->size;
    coll_started(g, c, "gradient bucket in flight", (double)(S - 1) / S * (double)(b1 - b0) * sizeof(float), S - 1, t0);
}

void mt_group_allgather_begin(mt_group *g, float *p, size_t n, size_t b0, size_t b1, mt_coll *c) {
    memset(c, 0, sizeof *c);
    MT_ASSERT(b0 <= b1 && b1 <= n && b1 - b0 <= max_count);
    if (!active(g) || b1 == b0) return;
    double t0 = MPI_Wtime();
    c->cnt = mt_xmalloc(sizeof(int) * (size_t)g->size * 2);
    window_parts(g, n, b0, b1, c->cnt, c->cnt + g->size);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p + b0, c->cnt, c->cnt + g->size, MPI_FLOAT, g->comm, &c->req);
    const int S = g->size;
    coll_started(g, c, "parameter bucket in flight", (double)(S - 1) / S * (double)(b1 - b0) * sizeof(float), S - 1, t0);
}

void mt_coll_progress(mt_coll *c) {
    int done;
    if (c->started && !c->defer) MPI_Test(&c->req, &done, MPI_STATUS_IGNORE);
}

void mt_coll_wait_mpi(mt_coll *c, mt_group *g) {
    if (!c->started || c->defer) return; /* a deferred one holds nothing of MPI's yet */
    double t0 = MPI_Wtime();
    mt_watch_begin("MPI_Wait", g->comm);
    MPI_Wait(&c->req, MPI_STATUS_IGNORE); /* the request becomes MPI_REQUEST_NULL: mt_coll_end's wait returns */
    mt_watch_end();
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_coll_end(mt_coll *c, mt_group *g) {
    if (c->started) {
        if (c->defer) { /* the ends come in the same order on every rank, as blocking calls must */
            double t0 = MPI_Wtime();
            mt_watch_begin(c->defer == 1 ? "MPI_Allreduce" : "MPI_Reduce_scatter", g->comm);
            if (c->defer == 1) MPI_Allreduce(MPI_IN_PLACE, c->x, (int)c->n, MPI_FLOAT, MPI_SUM, g->comm);
            else MPI_Reduce_scatter(c->x, c->shard, c->cnt, MPI_FLOAT, MPI_SUM, g->comm);
            mt_watch_end();
            g_dist.comm_s += MPI_Wtime() - t0;
        }
        mt_coll_wait_mpi(c, g);
        if (c->wired) { /* every rank's share arrived: the latest of the group's */
            double t0 = MPI_Wtime();
            double arrive = mt_wire_background(c->start, c->bytes) + (c->steps - 1) * mt_wire_get()->lat;
            mt_watch_begin("MPI_Allreduce (wire arrival)", g->comm);
            MPI_Allreduce(MPI_IN_PLACE, &arrive, 1, MPI_DOUBLE, MPI_MAX, g->comm);
            mt_watch_end();
            mt_wire_sleep_until(arrive);
            g_dist.comm_s += MPI_Wtime() - t0;
        }
        if (!c->defer || c->wired) /* on the wire it travels from the start; deferred, it did not */
            mt_trace_async(c->what, c->t_begin, mt_now());
    }
    free(c->cnt);
    memset(c, 0, sizeof *c);
}

void mt_group_set_nodes(mt_group *g, int ranks_per_node) {
    g->multi_node = 0;
    if (!active(g) || ranks_per_node <= 0) return;
    int wr;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr); /* emulated nodes are of world ranks, as in a2a.c */
    int me = wr / ranks_per_node;
    free(g->node_of);
    g->node_of = mt_xmalloc(sizeof(int) * (size_t)g->size);
    MPI_Allgather(&me, 1, MPI_INT, g->node_of, 1, MPI_INT, g->comm);
    for (int r = 0; r < g->size; r++) g->multi_node |= g->node_of[r] != me;
    if (g->multi_node && mt_wire_get()->on && !g->has_wire) {
        MPI_Comm_dup(g->comm, &g->wire);
        g->has_wire = 1;
    }
}

/* a point-to-point message to / from peer crosses the wire */
static int p2p_wired(const mt_group *g, int peer) {
    return mt_wire_get()->on && g->has_wire && g->node_of[peer] != g->node_of[g->rank];
}

void mt_group_range(const mt_group *g, size_t n, int r, size_t *lo, size_t *hi) {
    MT_ASSERT(r >= 0 && r < g->size);
    /* floor(n*r/S) without the overflow of n*r: n = q*S + m gives q*r + floor(m*r/S) */
    const size_t S = (size_t)g->size, q = n / S, m = n % S;
    *lo = q * (size_t)r + m * (size_t)r / S;
    *hi = q * (size_t)(r + 1) + m * (size_t)(r + 1) / S;
}

void mt_group_allgather(mt_group *g, float *p, size_t n) {
    if (!active(g)) return;
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)g->size * 2), *dis = cnt + g->size;
    double t0 = MPI_Wtime();
    for (size_t w0 = 0; w0 < n; w0 += max_count) {
        window_parts(g, n, w0, window_end(n, w0), cnt, dis);
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p + w0, cnt, dis, MPI_FLOAT, g->comm);
    }
    g_dist.comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_group_gather_ranges(mt_group *g, const float *shard, size_t n, float *full) {
    if (!active(g)) {
        memcpy(full, shard, n * sizeof *full);
        return;
    }
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)g->size * 2), *dis = cnt + g->size;
    double t0 = MPI_Wtime();
    for (size_t w0 = 0; w0 < n; w0 += max_count) {
        const size_t mine = window_parts(g, n, w0, window_end(n, w0), cnt, dis);
        MPI_Gatherv(shard + mine, cnt[g->rank], MPI_FLOAT, g->rank == 0 ? full + w0 : NULL, cnt, dis, MPI_FLOAT, 0,
                    g->comm);
    }
    g_dist.comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_group_scatter_ranges(mt_group *g, const float *full, size_t n, float *shard) {
    if (!active(g)) {
        memcpy(shard, full, n * sizeof *full);
        return;
    }
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)g->size * 2), *dis = cnt + g->size;
    double t0 = MPI_Wtime();
    for (size_t w0 = 0; w0 < n; w0 += max_count) {
        const size_t mine = window_parts(g, n, w0, window_end(n, w0), cnt, dis);
        MPI_Scatterv(g->rank == 0 ? full + w0 : NULL, cnt, dis, MPI_FLOAT, shard + mine, cnt[g->rank], MPI_FLOAT, 0,
                     g->comm);
    }
    g_dist.comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_group_bcast_f32(mt_group *g, float *x, size_t n) {
    if (!active(g)) return;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < n; i += max_count) {
        size_t c = n - i < max_count ? n - i : max_count;
        MPI_Bcast(x + i, (int)c, MPI_FLOAT, 0, g->comm);
    }
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_dist_barrier(mt_dist *d) {
    if (d->size > 1) MPI_Barrier(d->world);
}

double mt_dist_wtime(void) { return MPI_Wtime(); }

/* small collectives (counts fit an int): timed like the others */
static void bcast(mt_group *g, void *x, size_t n, MPI_Datatype t) {
    if (!active(g) || n == 0) return;
    double t0 = MPI_Wtime();
    MPI_Bcast(x, (int)n, t, 0, g->comm);
    g_dist.comm_s += MPI_Wtime() - t0;
}

static void reduce_op(mt_group *g, void *x, size_t n, MPI_Datatype t, MPI_Op op) {
    if (!active(g) || n == 0) return;
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, t, op, g->comm);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_bcast_i32(mt_group *g, int *x, size_t n) { bcast(g, x, n, MPI_INT); }
void mt_group_bcast_f64(mt_group *g, double *x, size_t n) { bcast(g, x, n, MPI_DOUBLE); }
void mt_group_min_i32(mt_group *g, int *x, size_t n) { reduce_op(g, x, n, MPI_INT, MPI_MIN); }
void mt_group_min_f64(mt_group *g, double *x, size_t n) { reduce_op(g, x, n, MPI_DOUBLE, MPI_MIN); }
void mt_group_max_f64(mt_group *g, double *x, size_t n) { reduce_op(g, x, n, MPI_DOUBLE, MPI_MAX); }
void mt_group_max_u64(mt_group *g, uint64_t *x, size_t n) { reduce_op(g, x, n, MPI_UINT64_T, MPI_MAX); }

void mt_group_gather_f64(mt_group *g, const double *x, size_t n, double *all) {
    if (!active(g)) {
        memcpy(all, x, n * sizeof *x);
        return;
    }
    double t0 = MPI_Wtime();
    MPI_Gather(x, (int)n, MPI_DOUBLE, all, (int)n, MPI_DOUBLE, 0, g->comm);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_allgather_u64(mt_group *g, uint64_t x, uint64_t *all) {
    if (!active(g)) {
        all[0] = x;
        return;
    }
    double t0 = MPI_Wtime();
    MPI_Allgather(&x, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, g->comm);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_allgather_i32(mt_group *g, const int32_t *x, size_t n, int32_t *all) {
    if (!active(g)) {
        memcpy(all, x, n * sizeof *x);
        return;
    }
    MT_ASSERT(n <= max_count && n * (size_t)g->size <= (size_t)1 << 31);
    double t0 = MPI_Wtime();
    MPI_Allgather(x, (int)n, MPI_INT32_T, all, (int)n, MPI_INT32_T, g->comm);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_group_barrier(mt_group *g) {
    if (active(g)) MPI_Barrier(g->comm);
}

void mt_group_split(const mt_group *g, int color, int key, mt_group *sub) {
    MPI_Comm_split(g->comm, color, key, &sub->comm);
    sub->rank = 0;
    sub->multi_node = 0;
    sub->node_of = NULL;
    sub->has_wire = 0;
    sub->size = 1;
    if (sub->comm == MPI_COMM_NULL) return;
    MPI_Comm_rank(sub->comm, &sub->rank);
    MPI_Comm_size(sub->comm, &sub->size);
}

void mt_group_free(mt_group *g) {
    if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
    if (g->has_wire) MPI_Comm_free(&g->wire);
    g->has_wire = 0;
    g->multi_node = 0;
    free(g->node_of);
    g->node_of = NULL;
}

void mt_group_isend_f32(mt_group *g, const float *x, size_t n, int peer, int tag, mt_request *req) {
    if (p2p_wired(g, peer)) { /* the stamp first: a double goes eagerly, the send does not block */
        const int64_t b = (int64_t)(n * sizeof *x);
        double arrive;
        mt_wire_stamp(&b, 1, 0, &arrive);
        MPI_Send(&arrive, 1, MPI_DOUBLE, peer, tag, g->wire);
    }
    MPI_Isend(x, (int)n, MPI_FLOAT, peer, tag, g->comm, req);
}

void mt_group_recv_f32(mt_group *g, float *x, size_t n, int peer, int tag) {
    double t0 = MPI_Wtime(), arrive = 0;
    const int wired = p2p_wired(g, peer);
    if (wired) MPI_Recv(&arrive, 1, MPI_DOUBLE, peer, tag, g->wire, MPI_STATUS_IGNORE);
    MPI_Recv(x, (int)n, MPI_FLOAT, peer, tag, g->comm, MPI_STATUS_IGNORE);
    if (wired) mt_wire_sleep_until(arrive);
    g_dist.comm_s += MPI_Wtime() - t0;
}

void mt_request_waitall(mt_request *req, int n, mt_group *g) {
    mt_watch_begin("MPI_Waitall", g ? g->comm : MPI_COMM_NULL);
    MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    mt_watch_end();
}

long mt_dist_tag_ub(void) {
    int *ub = NULL, flag = 0, init = 0;
    MPI_Initialized(&init);
    if (init && MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag) return *ub;
    return 32767;
}

int mt_dist_check_same(mt_dist *d, const char *what, uint64_t h) {
    if (d->size == 1) return 0;
    uint64_t *all = d->rank == 0 ? mt_xmalloc(sizeof(uint64_t) * (size_t)d->size) : NULL;
    MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, d->world);
    int bad = -1;
    if (d->rank == 0)
        for (int r = 1; r < d->size && bad < 0; r++)
            if (all[r] != all[0]) bad = r;
    free(all);
    MPI_Bcast(&bad, 1, MPI_INT, 0, d->world);
    if (bad < 0) return 0;
    if (d->rank == 0)
        return mt_error("rank %d has a different %s than rank 0 (hash mismatch)", bad, what);
    return mt_error("rank 0 found that rank %d has a different %s than rank 0", bad, what);
}

uint64_t mt_dist_hash_exe(void) {
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return 0;
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    char *buf = mt_xmalloc(1 << 20);
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) XXH64_update(st, buf, n);
    fclose(f);
    free(buf);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}
