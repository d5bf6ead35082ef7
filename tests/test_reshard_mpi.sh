#!/usr/bin/env bash
# Moving weights between layouts (parallel/reshard.h): tests/test_reshard (built next to
# moetrain) on 2 and 4 ranks: EP parts into whole copies and into other EP groupings, TP2
# slices into EP parts, EP parts and TP2 slices into TP2 parts, every element bit for bit.
# (Named test_reshard_mpi: tests/test_reshard.c registers test_reshard, one rank.)
# Usage: bash tests/test_reshard_mpi.sh path/to/moetrain   (skips with 77 without mpirun)
set -euo pipefail
NAME=test_reshard
source "$(dirname "$0")/lib/mpi.sh"
BIN=$(dirname "$MT")/tests/test_reshard
[ -x "$BIN" ] || fail "$BIN not built"
for np in 2 4; do
    timeout 120 "${MPI[@]}" -np $np "$BIN" > "$T/r$np.log" 2>&1 || { cat "$T/r$np.log"; fail "test_reshard on $np ranks"; }
    ok "$np ranks: $(tail -1 "$T/r$np.log")"
done
echo "$passed passed, 0 failed"
