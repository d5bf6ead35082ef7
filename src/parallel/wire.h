/* parallel/wire.h — an emulated inter-node link (the "virtual wire").
 *
 * On one machine every exchange is a memory copy, so hiding communication behind compute
 * cannot be shown: there is nothing to hide. The wire gives the traffic between emulated
 * nodes (train --ranks-per-node) a cost: each rank has one outgoing link of `bw` bytes/s and
 * a latency `lat` seconds. A message of n bytes the rank sends at time t leaves when the link
 * is free (after the rank's earlier messages), takes n / bw on it and arrives lat later; a
 * small message (<= MT_WIRE_SMALL) goes ahead of that queue, leaving at t, and the link's
 * next bulk message starts n / bw later. The sender stamps that arrival time on the message (a double sent with the exchange) and the
 * receiver's request completes only once MPI has delivered it *and* its time has come. A rank
 * whose time has not come sleeps (clock_nanosleep) rather than spins, so the other ranks of
 * the machine keep its core. Times are CLOCK_MONOTONIC seconds, one clock for every process
 * of the machine, so a wire needs all its ranks on one machine (the trainer checks).
 *
 * The wire changes when data arrives, never what arrives: results are bit-identical with and
 * without it. Off by default. It carries the expert all-to-all (parallel/a2a.c) and the
 * gradient buckets and ZeRO-1's parameter all-gather of groups that span nodes (mt_coll in
 * dist.h) and the pipeline's messages between nodes (mt_group_isend_f32); TP traffic is not
 * delayed. */
#ifndef MT_PARALLEL_WIRE_H
#define MT_PARALLEL_WIRE_H

#include <stdint.h>

typedef struct {
    int on;
    double bw, lat;       /* bytes/s, seconds */
    double link_free;     /* when this rank's outgoing link is next free (foreground) */
    double bg_free;       /* when the last background transfer arrived */
    double *sent_t, *sent_d; /* foreground sends since bg_free: time, link seconds */
    int nsent, capsent;
    int bg_pending;       /* background transfers started and not yet timed: sends are logged */
    double slept;         /* seconds slept waiting for arrivals (reset by the caller) */
} mt_wire;

/* The process's wire (one per rank). */
mt_wire *mt_wire_get(void);
/* Parses "GBPS,US" (bandwidth in GB/s = 1e9 bytes/s per direction, latency in microseconds;
 * ",US" optional, default 0) into *bw, *lat. -1 with a message on a malformed or non-positive
 * bandwidth / negative latency. */
int mt_wire_parse(const char *spec, double *bw, double *lat);
/* Turns the wire on (bw > 0) or off (bw = 0). */
void mt_wire_set(double bw, double lat);
/* Messages of at most this many bytes (the dispatch's counts and metadata, the gate
 * gradients of a small batch) go ahead of the bulk rows queued on the link, as a NIC
 * interleaves its queues packet by packet: a control message waited in place does not wait
 * for another micro-batch's payload. Rows already stamped keep their times; the link's
 * busy time still counts the small message. */
#define MT_WIRE_SMALL 65536
/* Arrival times of messages of bytes[p] (p < n, 0 = none: arrive[p] = 0) that this rank sends
 * now, in the order p = first, first+1, ... (mod n) on its one link. */
void mt_wire_stamp(const int64_t *bytes, int n, int first, double *arrive);
/* A background transfer (a gradient or parameter bucket) of `bytes` started at time `start`:
 * when it has arrived. Background transfers go one after another, in the link time the
 * foreground messages (mt_wire_stamp: the expert exchanges, latency-bound and on the
 * critical path) leave them: a NIC's traffic classes, the bulk class yielding. The
 * foreground messages sent since the transfer could start count as taken link time; call
 * it when waiting for the transfer, in the order the transfers were started. */
void mt_wire_background_begin(void); /* a background transfer starts now */
double mt_wire_background(double start, double bytes);
/* Sleeps until CLOCK_MONOTONIC time t (returns at once when it has passed). */
void mt_wire_sleep_until(double t);

#endif
