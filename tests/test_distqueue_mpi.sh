#!/usr/bin/env bash
# DistQueue (parallel/distqueue.h; issue 23 item 1): tests/test_distqueue (built next to
# moetrain) on 1, 2, 4 and 6 ranks, then a producer stopped with SIGSTOP: the job must end
# with the watchdog's message naming the queue, not hang.
# Usage: bash tests/test_distqueue_mpi.sh path/to/moetrain   (skips with 77 without mpirun)
set -euo pipefail
NAME=test_distqueue
source "$(dirname "$0")/lib/mpi.sh"
BIN=$(dirname "$MT")/tests/test_distqueue
[ -x "$BIN" ] || fail "$BIN not built"
for c in "1 64" "2 200" "4 200" "6 120"; do
    set -- $c
    timeout 300 "${MPI[@]}" -np "$1" "$BIN" "$2" > "$T/q$1.log" 2>&1 || { cat "$T/q$1.log"; fail "test_distqueue on $1 ranks"; }
    ok "$1 ranks: $(tail -1 "$T/q$1.log")"
    grep '^  ' "$T/q$1.log" || true
done
# a producer that stops: the consumers' wait ends the job with the watchdog's message
set +e
start=$(date +%s)
timeout 120 "${MPI[@]}" -np 3 "$BIN" stop > "$T/stop.log" 2>&1
rc=$? end=$(date +%s)
set -e
pkill -CONT -f "$BIN stop" 2>/dev/null || true; pkill -KILL -f "$BIN stop" 2>/dev/null || true
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "no progress for 3 s in DistQueue: waiting for" "$T/stop.log" \
    || { cat "$T/stop.log"; fail "a stopped producer (rc $rc)"; }
ok "a stopped producer ends the job in $((end - start)) s: $(grep -m1 -o 'no progress.*group' "$T/stop.log")"
echo "$passed passed, 0 failed"
