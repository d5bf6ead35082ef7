# tests/lib/mpi.sh — what the MPI shell tests share; source it after `set -euo pipefail`
# with NAME set (the scratch folder's prefix) and the moetrain path in $1:
#   MT (absolute path of moetrain), T (scratch folder, removed at exit), MPI (the mpirun
#   command: Open MPI gets --oversubscribe, and --allow-run-as-root as root), run N ARGS
#   (moetrain ARGS on N ranks), ok / fail (counted), OMP_NUM_THREADS=1 (ranks share cores).
# Exits 77 (CTest's skip) when mpirun is missing, unless MPI_OPTIONAL=1 (a test whose MPI
# part is optional): then MPI is empty and the test checks ${#MPI[@]}.
MT=$(realpath "$1")
source "$(dirname "${BASH_SOURCE[0]}")/mpirun.sh"
if [ ${#MPI[@]} -eq 0 ] && [ "${MPI_OPTIONAL:-0}" != 1 ]; then
    echo "SKIP: mpirun not found (apt-get install openmpi-bin): the MPI tests did not run"
    exit 77
fi
T=${MT_TEST_TMP:-/tmp}/$NAME.$$
rm -rf "$T"; mkdir -p "$T"
T=$(realpath "$T")
trap 'rm -rf "$T"' EXIT
passed=0
fail() { echo "FAIL: $*"; echo "$passed passed, 1 failed"; exit 1; }
ok() { echo "ok: $*"; passed=$((passed + 1)); }
export OMP_NUM_THREADS=1
run() { local n=$1; shift; "${MPI[@]}" -np "$n" "$MT" "$@"; }
# refused WHAT WANT ARGS...: `moetrain ARGS` must fail with one line that says WANT.
refused() {
    local what=$1 want=$2
    shift 2
    if "$MT" "$@" > "$T/err.log" 2>&1; then fail "$what: accepted"; fi
    [ "$(wc -l < "$T/err.log")" = 1 ] || { cat "$T/err.log"; fail "$what: not one line"; }
    grep -q -- "$want" "$T/err.log" || { cat "$T/err.log"; fail "$what: the message does not say '$want'"; }
    ok "$what refused: $(cat "$T/err.log")"
}
# rank_pid RUN_DIR RANK: the pid of that rank of the job writing RUN_DIR
rank_pid() {
    local p
    for p in $(pgrep -f -- "--out $1( |$)"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qE "^(OMPI_COMM_WORLD_RANK|PMI_RANK)=$2\$"; then
            echo "$p"; return 0; fi
    done
    return 1
}
