/* base/trace.h — a light, optional event trace written as Chrome trace JSON (Perfetto and
 * chrome://tracing open it). Complete events ("ph":"X") with microsecond timestamps; one
 * process id per MPI rank. When tracing is off, mt_trace_begin/end cost one branch. Not
 * thread-safe: call from the thread that drives the step (the OpenMP master). */
#ifndef MT_BASE_TRACE_H
#define MT_BASE_TRACE_H

#include <stddef.h>

/* Starts recording up to max_events events for process id `pid`; spans after the buffer
 * is full still count in mt_trace_total, only their events are not kept. */
void mt_trace_enable(int pid, size_t max_events);
int mt_trace_enabled(void);
/* Opens a span; name must outlive the trace (a string literal or a static buffer). */
void mt_trace_begin(const char *name);
/* Closes the innermost open span. */
void mt_trace_end(void);
/* Records a span of [t0, t1] (mt_now() seconds) on the process's second track (tid 1):
 * something in flight while the first track computes, e.g. a non-blocking exchange. */
void mt_trace_async(const char *name, double t0, double t1);
/* base/fiber.c's hook: the thread switches from fiber `from` to `to` (-1: the thread's own
 * context). Each fiber has its own span stack, drawn on tracks 2 and 3, and its spans' totals
 * count only the time it ran. */
void mt_trace_fiber_switch(int from, int to);
/* Seconds spent inside spans whose name starts with `prefix` since the last reset. */
double mt_trace_total(const char *prefix);
/* The part of mt_trace_total(prefix) in spans that ran on a fiber, i.e. inside a fiber pair
 * (the overlapped schedule's steady state). */
double mt_trace_total_fiber(const char *prefix);
void mt_trace_reset_totals(void);
/* Writes the events to path as Chrome trace JSON (atomically) and keeps recording. */
int mt_trace_write(const char *path);

#endif
