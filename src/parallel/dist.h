/* parallel/dist.h — the process layout and the collectives the trainer uses, over MPI. No
 * MPI call is made outside src/parallel/: other layers use these wrappers (and parallel/commbench.h
 * for the calibration's measurements), so a change of transport stays in one place.
 *
 * The world is cut into pipeline stages, each stage's ranks are data parallel, and the
 * experts of each stage are spread over expert-parallel (EP) groups carved out of its DP
 * ranks. Collectives name the group they run over (mt_group).
 *
 * A plain `moetrain train` without mpirun runs as an MPI singleton (world size 1); every
 * helper below returns at once when its group has one rank, so a single process does
 * exactly what it did before MPI existed (no copies, no reordered sums).
 *
 * Errors: a rank that fails reports its message and calls mt_dist_abort(), which takes the
 * whole job down (MPI_Abort) instead of leaving the other ranks waiting in a collective.
 * Every collective adds the time it waited to mt_dist.comm_s (the trainer resets it per
 * step): exposed time only (a split-phase exchange counts its begin and its wait, a fiber
 * of the overlapped schedule not the time the other fiber computed, parallel/a2a.c). */
#ifndef MT_DIST_DIST_H
#define MT_DIST_DIST_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

/* A communicator with this rank's place in it. */
typedef struct {
    MPI_Comm comm;           /* MPI_COMM_NULL when this rank is not in the group */
    int rank, size;
    int multi_node;          /* 1: it spans more than one emulated node (mt_group_set_nodes) */
    int *node_of;            /* [size] each member's emulated node (mt_group_set_nodes), or NULL */
    int has_wire;            /* 1: wire is a duplicate of comm for the arrival stamps of */
    MPI_Comm wire;           /* point-to-point messages (mt_group_set_nodes, on the wire) */
} mt_group;

typedef struct {
    int rank, size;          /* in MPI_COMM_WORLD */
    int local_rank, local_size; /* ranks on this node (MPI_COMM_TYPE_SHARED) */
    /* the layout (mt_dist_set_layout), Megatron's order with TP fastest:
     * world rank = (pp_rank * dp_size + dp_rank) * tp_size + tp_rank. The EP groups are
     * blocks of ep_size consecutive ranks of the stage's DP x TP ranks with sequence
     * parallelism (every TP rank routes its own tokens), of its DP ranks (same tp_rank)
     * without; the expert-DP group joins the ranks of a stage with the same ep_rank. */
    int pp_rank, pp_size, dp_rank, dp_size, tp_rank, tp_size, sp, ep_rank, ep_size, edp_rank, edp_size;
    mt_group all, dp, tp, dpt, ep, edp, pp; /* all: the world; dpt: the stage's DP x TP ranks */
    mt_group emb;            /* first and last pipeline stage of one DP index (tied embedding) */
    MPI_Comm world;          /* a duplicate of MPI_COMM_WORLD (the same ranks as `all`) */
    int initialized;         /* MPI_Init was called by mt_dist_init */
    /* Roles (mt_dist_set_role): the job's ranks split into groups that each run their own
     * layout, e.g. RL's trainer and rollout ranks. rank, size, world and every group above
     * then belong to this rank's role; job spans every rank of the job. */
    int role;                /* -1: no roles (the role is the whole job) */
    mt_group job;
    double comm_s;           /* seconds spent in collectives since the last reset */
} mt_dist;

/* Initialises MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI; OpenMP threads
 * never do) and the layout. Call once, early in main (after mt_blas_init, which may
 * re-execute the binary). With several ranks on one node and MT_PIN unset, it sets
 * MT_PIN=0 so that the ranks' OpenMP threads are not all pinned to the same cores. */
int mt_dist_init(int *argc, char ***argv);
/* MPI_Finalize (no-op if mt_dist_init was not called). */
void mt_dist_finalize(void);
/* The process layout; a world of one rank when MPI was not initialised. */
mt_dist *mt_dist_get(void);
/* The communication watchdog: a blocking MPI call that lasts longer than `seconds` ends the
 * job with "moetrain: error: rank R of N: no progress for S s in MPI_x over the G group ...",
 * (a rank that is alive but stuck would otherwise leave the others waiting forever). 0 turns
 * it off (debugging); mt_dist_init starts it with MT_COMM_TIMEOUT_DEFAULT on > 1 rank. */
#define MT_COMM_TIMEOUT_DEFAULT 600.0
void mt_dist_set_timeout(double seconds);
/* Prints "moetrain: error: rank R of N: <msg>" to stderr and ends the whole job with
 * MPI_Abort (exit code 1). With one rank it only prints and exits. */
void mt_dist_abort(const char *msg) __attribute__((noreturn));

/* Splits the job into roles (collective over the job; before mt_dist_set_layout): the ranks
 * with the same role form this rank's world from then on, in job rank order. */
int mt_dist_set_role(mt_dist *d, int role);
/* Blocking point to point of n floats or bytes inside a group (any n: sent in pieces). */
void mt_group_send_f32(mt_group *g, const float *x, size_t n, int peer, int tag);
void mt_group_send_bytes(mt_group *g, const void *x, size_t n, int peer, int tag);
void mt_group_recv_bytes(mt_group *g, void *x, size_t n, int peer, int tag);

/* The parallel layout: PP stages x DP x TP, EP carved out of DP (x TP with sp). Errors
 * (-1, message naming the failed constraint) when pp x tp does not divide the world or ep
 * does not divide the ranks it is carved from. Collective over the world. */
int mt_dist_set_layout(mt_dist *d, int pp, int tp, int sp, int ep);

/* In-place sums over a group (no-ops on a group of one rank or when the rank is not in it). */
void mt_group_sum_f32(mt_group *g, float *x, size_t n);
void mt_group_sum_f64(mt_group *g, double *x, size_t n);
void mt_group_sum_i64(mt_group *g, int64_t *x, size_t n);
/* A gradient bucket's reduction in flight (train/optimizer.c): started by _begin, moved by
 * the MPI calls made meanwhile (mt_coll_progress polls), finished by mt_coll_end. When every
 * rank shares one machine (and neither MT_COMM_THREAD nor MT_COLL_NONBLOCKING=1 is set) the
 * sum and the reduce-scatter are deferred instead: _begin notes them and mt_coll_end runs the
 * blocking collective (Open MPI's non-blocking ones were 2.3-2.7x slower here). When the wire
 * is on (parallel/wire.h) and the group spans emulated nodes, the bucket also goes over each
 * rank's link as a ring would move it (2(S-1)/S of its bytes per rank for the sum, (S-1)/S
 * for the reduce-scatter and the all-gather, one latency per ring step) as background
 * traffic (mt_wire_background: in the link time the expert exchanges leave), and it is done
 * when the last rank's share has arrived: at the end, a MAX all-reduce of the ranks' arrival
 * times, so the ends must come in the same order on every rank of the group, as the starts
 * do. */
typedef struct {
    MPI_Request req;
    int started, wired;
    double start;            /* on the wire: when it started, this rank's share on its link, */
    double bytes;            /* and its ring steps */
    int steps;
    double t_begin;          /* mt_now() at the start (the trace's span in flight) */
    const char *what;        /* the trace span's name */
    int *cnt;                /* counts and displacements (alive until the end, as MPI wants) */
    int defer;               /* 1 sum, 2 reduce-scatter noted, to run blocking at the end (below); */
    float *x, *shard;        /* x[n] (and shard) are its arguments */
    size_t n;
} mt_coll;
/* In-place sum of x[n] (n <= 2^30) over g. */
void mt_group_sum_begin(mt_group *g, float *x, size_t n, mt_coll *c);
/* The part [b0, b1) (b1 - b0 <= 2^30) of a buffer x[n] cut in g's ranges (mt_group_range):
 * summed over g, this rank's share of it written at its place in shard (shard[0] = x[lo]). */
void mt_group_reduce_scatter_begin(mt_group *g, const float *x, size_t n, size_t b0, size_t b1, float *shard,
                                   mt_coll *c);
/* ZeRO-1's all-gather of the part [b0, b1) of p[n] cut in g's ranges: every rank's share of
 * it, in place (the ring's (S-1)/S of the bytes on the wire). */
void mt_group_allgather_begin(mt_group *g, float *p, size_t n, size_t b0, size_t b1, mt_coll *c);
/* Lets MPI move it (a test); mt_coll_end waits (its wait added to comm_s). */
void mt_coll_progress(mt_coll *c);
/* Waits until MPI has completed it (which frees MPI's scratch), in place; on the wire its
 * arrival is still waited for by mt_coll_end. */
void mt_coll_wait_mpi(mt_coll *c, mt_group *g);
void mt_coll_end(mt_coll *c, mt_group *g);
/* Notes each member's emulated node (ranks_per_node consecutive world ranks each) and whether
 * g spans more than one (g->multi_node) (collective over g; 1 when ranks_per_node is 0: real
 * nodes are never wired). With the wire on, point-to-point messages between members on
 * different nodes then go over it (mt_group_isend_f32 / mt_group_recv_f32: the sender's
 * arrival stamp travels ahead as a double on g->wire). */
void mt_group_set_nodes(mt_group *g, int ranks_per_node);
/* The most elements one MPI call moves (2^30; MT_MPI_MAX_COUNT lowers it for tests). */
size_t mt_dist_max_count(void);

/* Distributed optimizer (ZeRO-1) over a group: the flat buffer of n floats is split into
 * g->size contiguous ranges, range r = [n*r/S, n*(r+1)/S). */
void mt_group_range(const mt_group *g, size_t n, int r, size_t *lo, size_t *hi);
/* Every rank's range of p[n] (each rank has updated its own) to every rank, in place. */
void mt_group_allgather(mt_group *g, float *p, size_t n);
/* full[n] on the group's rank 0 (unused elsewhere) = the concatenation of every rank's range. */
void mt_group_gather_ranges(mt_group *g, const float *range, size_t n, float *full);
/* range = this rank's part of full[n] held by the group's rank 0 (unused elsewhere). */
void mt_group_scatter_ranges(mt_group *g, const float *full, size_t n, float *range);
/* Broadcast of x[n] from the group's rank 0. */
void mt_group_bcast_f32(mt_group *g, float *x, size_t n);
/* Broadcast of x[n] from the group's rank 0. */
void mt_group_bcast_i32(mt_group *g, int *x, size_t n);
void mt_group_bcast_f64(mt_group *g, double *x, size_t n);
/* In-place minimum / maximum over a group (the slowest or the fullest rank's figure). */
void mt_group_min_i32(mt_group *g, int *x, size_t n);
void mt_group_min_f64(mt_group *g, double *x, size_t n);
void mt_group_max_f64(mt_group *g, double *x, size_t n);
void mt_group_max_u64(mt_group *g, uint64_t *x, size_t n);
/* all[size*n] on the group's rank 0 (unused elsewhere) = every rank's x[n] in rank order. */
void mt_group_gather_f64(mt_group *g, const double *x, size_t n, double *all);
/* all[size] on every rank = every rank's x, in rank order. */
void mt_group_allgather_u64(mt_group *g, uint64_t x, uint64_t *all);
/* all[size*n] on every rank = every rank's x[n] in rank order (n the same on every rank). */
void mt_group_allgather_i32(mt_group *g, const int32_t *x, size_t n, int32_t *all);
/* Barrier over a group (no time accounted). */
void mt_group_barrier(mt_group *g);
/* The ranks of g with the same color form *sub, ordered by key (collective over g; like
 * MPI_Comm_split). mt_group_free releases it. */
void mt_group_split(const mt_group *g, int color, int key, mt_group *sub);
void mt_group_free(mt_group *g);
/* Barrier over the world (no time accounted). */
void mt_dist_barrier(mt_dist *d);
/* Wall-clock seconds (MPI_Wtime). */
double mt_dist_wtime(void);

/* Point to point inside a group (the pipeline's activations and gradients): a non-blocking
 * send, completed by mt_request_waitall, and a blocking receive (its wait added to comm_s). */
typedef MPI_Request mt_request;
#define MT_REQUEST_NULL MPI_REQUEST_NULL
void mt_group_isend_f32(mt_group *g, const float *x, size_t n, int peer, int tag, mt_request *req);
void mt_group_recv_f32(mt_group *g, float *x, size_t n, int peer, int tag);
void mt_request_waitall(mt_request *req, int n, mt_group *g); /* g: the requests' group (NULL: unknown) */
/* The same for bytes (n < 2^31); 1 when a request is done (an empty one is); 1 when a message
 * with this tag from peer is waiting to be received. */
void mt_group_isend_bytes(mt_group *g, const void *x, size_t n, int peer, int tag, mt_request *req);
int mt_request_test(mt_request *req);
int mt_group_probe(mt_group *g, int peer, int tag);
/* The largest message tag (MPI_TAG_UB; 32767, the least MPI guarantees, without MPI). */
long mt_dist_tag_ub(void);

/* Consistency check (collective over the world): every rank passes its hash of `what`
 * (e.g. "binary"); rank 0 compares them. Returns 0 on every rank when all agree;
 * otherwise -1 on every rank, with mt_error() naming the first rank that differs. */
int mt_dist_check_same(mt_dist *d, const char *what, uint64_t h);
/* XXH64 of this process's executable (/proc/self/exe); 0 if it cannot be read. */
uint64_t mt_dist_hash_exe(void);

#endif
