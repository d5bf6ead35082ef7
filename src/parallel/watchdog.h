/* parallel/watchdog.h — the communication watchdog inside src/parallel (watchdog.c): the
 * blocking MPI calls are watched through MPI's profiling interface; a loop that polls a
 * request (MPI_Test) marks itself with mt_watch_begin / mt_watch_end. */
#ifndef MT_PARALLEL_WATCHDOG_H
#define MT_PARALLEL_WATCHDOG_H

#include <mpi.h>

/* Starts the watching thread (once; later calls only update the figures). -1 if it cannot. */
int mt_watch_start(int rank, int size, double timeout_s);
void mt_watch_set_timeout(double timeout_s);
/* op: a static string naming the call; comm: its communicator (its MPI name is reported) or
 * MPI_COMM_NULL. Nested begin/end pairs count as the outermost one. */
void mt_watch_begin(const char *op, MPI_Comm comm);
void mt_watch_end(void);

#endif
