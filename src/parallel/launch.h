/* parallel/launch.h — what the launcher (mpirun, srun) tells a process through its environment.
 * Readable before MPI starts (no MPI call): the CLI decides from it whether to start MPI, and
 * the BLAS set-up how many ranks share this node's cores. */
#ifndef MT_DIST_LAUNCH_H
#define MT_DIST_LAUNCH_H

/* 1 when this process was started by mpirun/srun (Open MPI, MPICH/PMI, PMIx env). */
int mt_launch_under_mpi(void);
/* Ranks on this node as the launcher says (Open MPI, MPICH); 1 when it does not say. */
long mt_launch_local_size(void);

#endif
