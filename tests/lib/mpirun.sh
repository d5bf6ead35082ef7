# tests/lib/mpirun.sh — the MPI launcher, for tests whose MPI part may be missing: MPI is
# the mpirun command (Open MPI gets --oversubscribe, and --allow-run-as-root as root), or
# empty when there is no mpirun. Source it; tests/lib/mpi.sh builds on it.
MPI=()
if command -v mpirun >/dev/null 2>&1; then
    MPI=(mpirun)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then
        MPI+=(--oversubscribe)
        [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
    fi
fi
