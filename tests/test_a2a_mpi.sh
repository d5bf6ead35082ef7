#!/usr/bin/env bash
# Expert-parallel dispatch / combine, flat vs hierarchical (parallel/a2a.h; issue 3 items 3-4).
# Runs tests/test_a2a (built next to moetrain) under mpirun on several layouts:
#   4 ranks in 2 emulated nodes, 8 ranks in 4 and in 2 emulated nodes, 4 ranks grouped by
#   shared memory (one real node), and a single rank.
# (Named test_a2a_mpi: tests/test_a2a.c already registers the CTest name test_a2a,
# which runs the same program as a single MPI rank.)
# Usage: bash tests/test_a2a_mpi.sh path/to/moetrain   (skips with 77 when mpirun is missing)
set -uo pipefail
BIN=$(dirname "$(realpath "$1")")/tests/test_a2a
[ -x "$BIN" ] || { echo "FAIL: $BIN not built"; echo "0 passed, 1 failed"; exit 1; }
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not found (apt-get install openmpi-bin): the MPI tests did not run"
    exit 77
fi
export OMP_NUM_THREADS=1
MPI=(mpirun)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
    MPI+=(--oversubscribe)
    [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
fi
passed=0 failed=0
run() { # np ranks_per_node
    echo "== mpirun -np $1 test_a2a $2"
    if timeout 300 "${MPI[@]}" -np "$1" "$BIN" "$2"; then
        passed=$((passed + 1))
    else
        echo "FAIL: -np $1 ranks_per_node $2"
        failed=$((failed + 1))
    fi
}
run 4 2
run 8 2
run 8 4
run 4 0
run 1 0
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
