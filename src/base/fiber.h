/* base/fiber.h — two cooperative fibers on one thread: the overlapped schedule's engine.
 *
 * mt_fiber_pair(a, b) runs a and b (e.g. the forward of one micro-batch and the backward of
 * another) on the calling thread, each on its own stack, until both return. A fiber runs
 * until it calls mt_fiber_yield (where it waits for communication), and the other fiber
 * computes meanwhile: one thread, no locks, and everything a fiber writes between two
 * yields is written in one piece. Outside a pair mt_fiber_yield returns at once, so code
 * that yields while it waits works unchanged when it is not in a pair.
 *
 * Rules: yield only from the thread that called mt_fiber_pair and never inside an OpenMP
 * parallel region (the workers' team belongs to the thread, not to the fiber). The trace
 * (base/trace.h) keeps one span stack per fiber. */
#ifndef MT_BASE_FIBER_H
#define MT_BASE_FIBER_H

typedef void (*mt_fiber_fn)(void *arg);

/* Runs a(aa) and b(ba) as fibers 0 and 1, a first, until both have returned. */
void mt_fiber_pair(mt_fiber_fn a, void *aa, mt_fiber_fn b, void *ba);
/* The running fiber (0 or 1), -1 outside a pair. */
int mt_fiber_id(void);
/* Gives the thread to the other fiber if it has not finished; returns when this fiber runs
 * again, with the seconds the other fiber ran (0 at once outside a pair or when the other
 * has finished). */
double mt_fiber_yield(void);

#endif
