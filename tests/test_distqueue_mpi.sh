#!/usr/bin/env bash
# DistQueue (parallel/distqueue.h; issue 23 item 1): tests/test_distqueue (built next to
# moetrain) on 1, 2, 4 and 6 ranks, then a producer stopped with SIGSTOP: the job must end
# with the watchdog's message naming the queue, not hang.
# Usage: bash tests/test_distqueue_mpi.sh path/to/moetrain   (skips with 77 without mpirun)
set -uo pipefail
BIN=$(dirname "$(realpath "$1")")/tests/test_distqueue
[ -x "$BIN" ] || { echo "FAIL: $BIN not built"; echo "0 passed, 1 failed"; exit 1; }
source "$(dirname "$0")/lib/mpirun.sh"
[ ${#MPI[@]} -gt 0 ] || { echo "SKIP: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
export OMP_NUM_THREADS=1
passed=0 failed=0
run() { # np groups_per_producer
    echo "== mpirun -np $1 test_distqueue $2"
    if timeout 300 "${MPI[@]}" -np "$1" "$BIN" "$2"; then
        passed=$((passed + 1))
    else
        echo "FAIL: -np $1"
        failed=$((failed + 1))
    fi
}
run 1 64
run 2 200
run 4 200
run 6 120
# a producer that stops: the consumers' wait ends the job with the watchdog's message
echo "== mpirun -np 3 test_distqueue stop"
log=$(mktemp)
start=$(date +%s)
timeout 120 "${MPI[@]}" -np 3 "$BIN" stop >"$log" 2>&1
rc=$? end=$(date +%s)
pkill -CONT -f "$BIN stop" 2>/dev/null; pkill -KILL -f "$BIN stop" 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "no progress for 3 s in DistQueue: waiting for" "$log"; then
    echo "ok: ended in $((end - start)) s: $(grep -m1 'no progress' "$log")"
    passed=$((passed + 1))
else
    echo "FAIL: a stopped producer (rc $rc):"; cat "$log"
    failed=$((failed + 1))
fi
rm -f "$log"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
