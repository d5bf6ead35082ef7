/* parallel/watchdog.c — the communication watchdog (see dist.h, mt_dist_set_timeout).
 *
 * A rank that is alive but stuck (stopped, in an endless loop, swapping) leaves the others
 * inside a blocking MPI call forever: Open MPI has no timeout of its own. Every blocking
 * call this program makes goes through the wrappers below (MPI's profiling interface: this
 * file defines MPI_Allreduce & co. and calls PMPI_Allreduce & co.), so no call site can
 * forget it. A wrapper notes the call and its communicator's name; a thread wakes ten
 * times per timeout (at most once a second) and, when one call has lasted longer than the
 * timeout, prints which rank waits in which call over which group and ends the process.
 * mpirun then ends the job; checkpoints are written to a temporary folder and renamed, so
 * the last complete one is intact.
 *
 * The thread never calls MPI (the library is initialised MPI_THREAD_FUNNELED): it writes
 * its message and calls _exit. */
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel/watchdog.h"

static struct {
    _Atomic double timeout_s; /* 0: off */
    _Atomic int busy;         /* the main thread is inside a watched call */
    _Atomic unsigned long seq; /* watched calls begun so far */
    const char *op;           /* the call's MPI name; set before busy, read after it */
    char group[MPI_MAX_OBJECT_NAME];
    int group_size;
    int rank, size;
    int depth;                /* nested wrapped calls (an MPI call made by another) count once */
    int started;
} W;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The wait is measured by this thread's own ticks, each counted for at most two naps: a
 * process that was itself stopped (SIGSTOP) and continued must not blame the others for
 * the time it was away. */
static void *watch(void *arg) {
    (void)arg;
    unsigned long seen = 0;
    double waited = 0, last = mono();
    for (;;) {
        const double t = atomic_load(&W.timeout_s);
        const double nap = t > 0 ? (t / 10 < 0.05 ? 0.05 : t / 10 > 1 ? 1 : t / 10) : 1;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        const double now = mono(), dt = now - last < 2 * nap ? now - last : 2 * nap;
        last = now;
        const unsigned long seq = atomic_load(&W.seq);
        if (!atomic_load(&W.busy) || seq != seen) {
            seen = seq;
            waited = 0;
            continue;
        }
        waited += dt;
        if (!(t > 0) || waited <= t) continue;
        char msg[768], where[160] = "";
        if (W.group_size > 0) snprintf(where, sizeof where, " over the %s group (%d ranks)", W.group, W.group_size);
        int n = snprintf(msg, sizeof msg,
                         "moetrain: error: rank %d of %d: no progress for %.0f s in %s%s: another rank is stuck or "
                         "dead (the ranks that do not report this are the ones to look at); ending the job "
                         "(--comm-timeout %g, 0 = off)\n",
                         W.rank, W.size, waited, W.op, where, t);
        if (n > 0 && write(STDERR_FILENO, msg, (size_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1)) < 0) {
            /* nothing better to do: the exit code still says it */
        }
        /* a moment for mpirun to forward the line before it sees the exit */
        struct timespec grace = {1, 0};
        nanosleep(&grace, NULL);
        _exit(1);
    }
    return NULL;
}

int mt_watch_start(int rank, int size, double timeout_s) {
    W.rank = rank;
    W.size = size;
    atomic_store(&W.timeout_s, timeout_s);
    if (W.started) return 0;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, watch, NULL);
    pthread_attr_destroy(&at);
    if (rc != 0) return -1;
    W.started = 1;
    return 0;
}

void mt_watch_set_timeout(double timeout_s) { atomic_store(&W.timeout_s, timeout_s); }

void mt_watch_begin(const char *op, MPI_Comm comm) {
    if (W.depth++ > 0) return;
    W.op = op;
    int len = 0;
    W.group[0] = 0;
    if (comm != MPI_COMM_NULL) {
        PMPI_Comm_get_name(comm, W.group, &len);
        PMPI_Comm_size(comm, &W.group_size);
    } else {
        W.group_size = 0;
    }
    if (!W.group[0]) snprintf(W.group, sizeof W.group, "unnamed");
    atomic_fetch_add(&W.seq, 1);
    atomic_store(&W.busy, 1);
}

void mt_watch_end(void) {
    if (--W.depth > 0) return;
    atomic_store(&W.busy, 0);
}

/* ---- the blocking calls, watched ---- */

#define WATCHED(name, comm, call)                                                                                     \
    do {                                                                                                              \
        mt_watch_begin(name, comm);                                                                                   \
        int rc_ = call;                                                                                               \
        mt_watch_end();                                                                                               \
        return rc_;                                                                                                   \
    } while (0)

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    WATCHED("MPI_Allreduce", c, PMPI_Allreduce(s, r, n, t, op, c));
}
int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
    WATCHED("MPI_Alltoall", c, PMPI_Alltoall(s, sn, st, r, rn, rt, c));
}
int MPI_Alltoallv(const void *s, const int sc[], const int sd[], MPI_Datatype st, void *r, const int rc[],
                  const int rd[], MPI_Datatype rt, MPI_Comm c) {
    WATCHED("MPI_Alltoallv", c, PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, c));
}
int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
    WATCHED("MPI_Allgather", c, PMPI_Allgather(s, sn, st, r, rn, rt, c));
}
int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int rc[], const int d[], MPI_Datatype rt,
                   MPI_Comm c) {
    WATCHED("MPI_Allgatherv", c, PMPI_Allgatherv(s, sn, st, r, rc, d, rt, c));
}
int MPI_Reduce_scatter(const void *s, void *r, const int rc[], MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    WATCHED("MPI_Reduce_scatter", c, PMPI_Reduce_scatter(s, r, rc, t, op, c));
}
int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    WATCHED("MPI_Reduce_scatter_block", c, PMPI_Reduce_scatter_block(s, r, n, t, op, c));
}
int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
    WATCHED("MPI_Gather", c, PMPI_Gather(s, sn, st, r, rn, rt, root, c));
}
int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int rc[], const int d[], MPI_Datatype rt,
                int root, MPI_Comm c) {
    WATCHED("MPI_Gatherv", c, PMPI_Gatherv(s, sn, st, r, rc, d, rt, root, c));
}
int MPI_Scatterv(const void *s, const int sc[], const int d[], MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                 int root, MPI_Comm c) {
    WATCHED("MPI_Scatterv", c, PMPI_Scatterv(s, sc, d, st, r, rn, rt, root, c));
}
int MPI_Bcast(void *x, int n, MPI_Datatype t, int root, MPI_Comm c) {
    WATCHED("MPI_Bcast", c, PMPI_Bcast(x, n, t, root, c));
}
int MPI_Barrier(MPI_Comm c) { WATCHED("MPI_Barrier", c, PMPI_Barrier(c)); }
int MPI_Recv(void *x, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st) {
    WATCHED("MPI_Recv", c, PMPI_Recv(x, n, t, src, tag, c, st));
}
int MPI_Send(const void *x, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c) {
    WATCHED("MPI_Send", c, PMPI_Send(x, n, t, dst, tag, c));
}
int MPI_Sendrecv(const void *s, int sn, MPI_Datatype st, int dst, int stag, void *r, int rn, MPI_Datatype rt, int src,
                 int rtag, MPI_Comm c, MPI_Status *status) {
    WATCHED("MPI_Sendrecv", c, PMPI_Sendrecv(s, sn, st, dst, stag, r, rn, rt, src, rtag, c, status));
}
int MPI_Wait(MPI_Request *q, MPI_Status *st) { WATCHED("MPI_Wait (a non-blocking request)", MPI_COMM_NULL, PMPI_Wait(q, st)); }
int MPI_Waitall(int n, MPI_Request q[], MPI_Status st[]) {
    WATCHED("MPI_Waitall (non-blocking requests)", MPI_COMM_NULL, PMPI_Waitall(n, q, st));
}
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
    WATCHED("MPI_Comm_split", c, PMPI_Comm_split(c, color, key, out));
}
int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out) {
    WATCHED("MPI_Comm_split_type", c, PMPI_Comm_split_type(c, type, key, info, out));
}
int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out) { WATCHED("MPI_Comm_dup", c, PMPI_Comm_dup(c, out)); }
int MPI_Finalize(void) { WATCHED("MPI_Finalize", MPI_COMM_WORLD, PMPI_Finalize()); }
