/* parallel/distqueue.h — DistQueue: a sample store spread over the ranks of a group, between
 * the tasks of RL (rollout, reward, training) so that none waits for another's whole step.
 *
 * A sample (int64 id; group = id / G, G samples per group, as GRPO's groups) has up to 16
 * fields, byte blobs that tasks put as they finish them. A field stays on the rank that put
 * it (its owner) until every consumer task has taken the sample. Group rank 0 is the
 * controller: owners tell it what is ready (id, field, size, policy version); a consumer
 * asks it for whole groups (every sample with the fields it needs), it assigns them (each
 * sample to each task exactly once) and orders the owners to send the fields to the
 * consumer; once every task has taken a sample it tells the owners to drop it.
 *
 * Back-pressure: a rank holds at most `capacity` samples; a put of a new sample waits while
 * it holds that many. Nothing moves while no rank is inside the queue: Open MPI's ranks do
 * not progress in the background, so every call here serves the requests that arrived
 * (mt_dq_progress alone too; a producer calls it between pieces of work). Waits poll with
 * short sleeps, not spins, and are watched by the communication watchdog: a rank that stops
 * answering ends the job with a message naming the queue. Not thread-safe (one thread per
 * rank calls it). */
#ifndef MT_PARALLEL_DISTQUEUE_H
#define MT_PARALLEL_DISTQUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/dist.h"

#define MT_DQ_MAX_FIELDS 16

typedef struct mt_dq mt_dq;

typedef struct {
    int group;          /* samples per group (G >= 1) */
    int nfields;        /* 1 .. MT_DQ_MAX_FIELDS */
    int ntasks;         /* consumer tasks (>= 1): a sample is dropped once each task took it */
    int capacity;       /* samples a rank may hold (>= group) */
    int nproducers;     /* ranks that call mt_dq_close once they will put no more */
} mt_dq_opts;

/* Collective over g (which it duplicates: the queue's messages never meet other traffic).
 * Every rank passes the same options. */
mt_dq *mt_dq_init(const mt_group *g, const mt_dq_opts *o);
/* Collective: waits until every rank called it (serving the others meanwhile), then frees. */
void mt_dq_free(mt_dq *q);

/* Stores field `field` of sample `id` here (copies data[bytes]) and tells the controller.
 * version >= 0 is the policy version that produced it (a sample's version is the lowest of
 * its fields'); -1: none. Putting the same field of a sample twice is an error (aborts). */
void mt_dq_put(mt_dq *q, int64_t id, int field, const void *data, size_t bytes, int version);
/* This rank will put nothing more (producers only; once). */
void mt_dq_close(mt_dq *q);
/* Serves what has arrived (owner and controller duties) without waiting. */
void mt_dq_progress(mt_dq *q);
/* Serves the queue until done(ctx) holds: a rank that waits for something else (a message,
 * a request) keeps its queue duties; watched like the queue's own waits, `what` (a static
 * string) naming the wait in the watchdog's message. */
void mt_dq_wait(mt_dq *q, int (*done)(void *ctx), void *ctx, const char *what);

/* What a consumer takes: n samples in id order, each with the fields it asked for. */
typedef struct {
    int n;
    int64_t *id;
    int *version;                       /* [n] the sample's version (-1: none) */
    uint8_t **data[MT_DQ_MAX_FIELDS];   /* data[f][i]: field f of sample i (NULL if not asked) */
    size_t *bytes[MT_DQ_MAX_FIELDS];
} mt_dq_batch;
void mt_dq_batch_free(mt_dq_batch *b);

/* For task `task`, the groups lo .. hi-1 whole, with the fields of the mask `need`: waits
 * until they are all ready. */
void mt_dq_get_range(mt_dq *q, int task, uint32_t need, int64_t lo, int64_t hi, mt_dq_batch *out);
/* For task `task`, up to n whole groups with the fields of `need` and version >= min_version,
 * lowest group id first; ready groups older than min_version are dropped (for every task:
 * counted in dropped_samples). Waits for n groups, or until every producer has closed and
 * fewer remain (returns the groups it got). n x group must fit the producers' stores
 * (capacity x nproducers), else the job ends with that message. */
int mt_dq_get_any(mt_dq *q, int task, uint32_t need, int ngroups, int min_version, mt_dq_batch *out);

typedef struct {
    int64_t held_peak;            /* the most samples this rank held at once */
    int64_t live;                 /* controller: samples put and not yet dropped */
    int64_t live_peak;            /* controller: the most at once */
    int64_t dropped_samples;      /* controller: dropped as too old by mt_dq_get_any */
    double wait_put_s, wait_get_s; /* this rank's time waiting for room and for groups */
} mt_dq_stats;
/* This rank's figures (the controller's fields are 0 elsewhere). */
mt_dq_stats mt_dq_get_stats(const mt_dq *q);

#endif
