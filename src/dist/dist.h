/* dist/dist.h — the process layout and the collectives the trainer uses, over MPI.
 *
 * This slice has data parallelism only: DP = world size and the DP communicator is a
 * duplicate of MPI_COMM_WORLD (later slices carve TP/PP/EP groups out of the world and the
 * DP group becomes one of them; callers already name the group they reduce over).
 *
 * A plain `moetrain train` without mpirun runs as an MPI singleton (world size 1); every
 * helper below returns at once when its group has one rank, so a single process does
 * exactly what it did before MPI existed (no copies, no reordered sums).
 *
 * Errors: a rank that fails reports its message and calls mt_dist_abort(), which takes the
 * whole job down (MPI_Abort) instead of leaving the other ranks waiting in a collective.
 * Every collective adds its wall time to mt_dist.comm_s (the trainer resets it per step):
 * nothing overlaps computation yet, so all of it is exposed time. */
#ifndef MT_DIST_DIST_H
#define MT_DIST_DIST_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int rank, size;          /* in MPI_COMM_WORLD */
    int dp_rank, dp_size;    /* in the data-parallel group */
    int local_rank, local_size; /* ranks on this node (MPI_COMM_TYPE_SHARED) */
    MPI_Comm world, dp;
    int initialized;         /* MPI_Init was called by mt_dist_init */
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
/* Prints "moetrain: error: rank R of N: <msg>" to stderr and ends the whole job with
 * MPI_Abort (exit code 1). With one rank it only prints and exits. */
void mt_dist_abort(const char *msg) __attribute__((noreturn));

/* In-place sums over the DP group. */
void mt_dist_allreduce_sum_f32(mt_dist *d, float *x, size_t n);
void mt_dist_allreduce_sum_f64(mt_dist *d, double *x, size_t n);
void mt_dist_allreduce_sum_i64(mt_dist *d, int64_t *x, size_t n);
/* In-place sum over every rank of the world (no time accounted; n < 2^31). */
void mt_dist_world_sum_i64(mt_dist *d, int64_t *x, size_t n);
/* Gradient reduction: in-place sum of g[n] over DP in buckets of bucket_bytes (one
 * MPI_Allreduce per bucket, in buffer order). Run after the backward today; the buckets are
 * the unit a later slice overlaps with the backward (reduce a bucket as soon as the layers
 * that write it are done). */
void mt_dist_grad_allreduce(mt_dist *d, float *g, size_t n, size_t bucket_bytes);

/* Distributed optimizer (ZeRO-1) over DP: the flat buffer of n floats is split into
 * dp_size contiguous shards, shard r = [n*r/D, n*(r+1)/D). */
void mt_dist_shard(const mt_dist *d, size_t n, int r, size_t *lo, size_t *hi);
/* shard[hi-lo] = this rank's shard of the sum over DP of g[n] (MPI_Reduce_scatter). */
void mt_dist_reduce_scatter(mt_dist *d, const float *g, size_t n, float *shard);
/* Every rank's shard of p[n] (each rank has updated its own) to every rank, in place
 * (MPI_Allgatherv). */
void mt_dist_allgather(mt_dist *d, float *p, size_t n);
/* full[n] on DP rank 0 (may be NULL elsewhere) = the concatenation of every rank's shard. */
void mt_dist_gather_shards(mt_dist *d, const float *shard, size_t n, float *full);
/* shard = this rank's part of full[n] held by DP rank 0 (NULL elsewhere). */
void mt_dist_scatter_shards(mt_dist *d, const float *full, size_t n, float *shard);
/* Broadcast of x[n] from DP rank 0. */
void mt_dist_bcast_f32(mt_dist *d, float *x, size_t n);
/* Barrier over the world (no time accounted). */
void mt_dist_barrier(mt_dist *d);

/* Consistency check (collective over the world): every rank passes its hash of `what`
 * (e.g. "binary"); rank 0 compares them. Returns 0 on every rank when all agree;
 * otherwise -1 on every rank, with mt_error() naming the first rank that differs. */
int mt_dist_check_same(mt_dist *d, const char *what, uint64_t h);
/* XXH64 of this process's executable (/proc/self/exe); 0 if it cannot be read. */
uint64_t mt_dist_hash_exe(void);

#endif
