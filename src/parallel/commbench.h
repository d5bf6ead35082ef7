/* parallel/commbench.h — communication measurements for `moetrain bench --calibrate`
 * (plan/calibrate.c): point-to-point links, the all-to-all, the trainer's gradient
 * collectives and its expert exchange, each as the slowest rank sees it. Every function is
 * collective over the group or world it names; the figures are the same on every rank
 * unless said otherwise. */
#ifndef MT_DIST_COMMBENCH_H
#define MT_DIST_COMMBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/dist.h"

typedef struct {
    double lat_s, bw;      /* one-way latency (s) and bandwidth (bytes/s) of a ping-pong */
} mt_bench_link;

/* Ping-pong between world ranks 0 and `peer` (every rank calls; only the two take part). */
mt_bench_link mt_bench_pingpong(mt_dist *d, int peer, int quick);
/* An all-to-all over the world with `block` bytes per pair: seconds of the slowest rank,
 * best of reps after a warm-up. */
double mt_bench_alltoall(mt_dist *d, size_t block, int reps);
/* A barrier over the world at which the ranks wait without spinning (a blocking MPI call
 * polls and would take a core from the rank that measures alone). */
void mt_bench_quiet_barrier(mt_dist *d);
/* all[size] = a hash of every world rank's host name (ranks with equal hashes share a node). */
void mt_bench_host_hashes(mt_dist *d, uint64_t *all);

/* One collective as the trainer calls it, over g on a message of `bytes`: time of the
 * slowest rank (best of reps after a warm-up) and its temporary memory per byte of message
 * (VmHWM over VmRSS before the call, max over ranks). Each call takes the next of `slices`
 * consecutive messages, so that with enough of them none is in the caches, as the trainer's
 * gradient buckets are not. */
enum { MT_COLL_ALLREDUCE = 0, MT_COLL_REDUCE_SCATTER, MT_COLL_ALLGATHER, MT_COLL_N };
void mt_bench_collective(mt_group *g, int which, size_t bytes, int slices, int reps, double *secs, double *scratch);

/* The trainer's expert exchange of one MoE layer (parallel/ep.c: dispatch and combine forward;
 * gather, dispatch backward and the routing weights' return backward) over g, the slowest
 * rank's best time, at two token counts per rank (C = 512, top-2 of 8 experts per rank,
 * uniform random routing, so no rank waits for a busier one): fitted as
 * layer_s + byte_s x bytes of the rows a rank sends (n x k x C x 4). Both 0 when it fails. */
void mt_bench_ep_exchange(mt_group *g, int quick, double *layer_s, double *byte_s);

#endif
