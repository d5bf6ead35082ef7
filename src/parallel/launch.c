/* parallel/launch.c — the launcher's environment (see launch.h). */
#include "parallel/launch.h"

#include <stdlib.h>

int mt_launch_under_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

long mt_launch_local_size(void) {
    const char *ranks_env[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL};
    for (int i = 0; ranks_env[i]; i++)
        if (getenv(ranks_env[i]) && atol(getenv(ranks_env[i])) > 0) return atol(getenv(ranks_env[i]));
    return 1;
}
