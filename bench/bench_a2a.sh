#!/usr/bin/env bash
# Inter-node bytes per step of the EP token exchange, flat vs hierarchical all-to-all
# (parallel/a2a.h): EP8 = 8 ranks on this machine, emulating 2 and 4 nodes (ranks_per_node 4
# and 2), top-2 and top-8 uniform random routing over E=16 experts. One step = one
# dispatch + one combine (forward only; the backward repeats the same traffic).
# Bytes are summed over all ranks and include routing metadata and the counts exchange;
# "rows" is the token / output row payload only. Time: best of 3, slowest rank, on
# oversubscribed CPUs (shared memory), so it shows the cost of the extra hop, not network.
# Usage: bash bench/bench_a2a.sh [build dir (default build)] [tokens per rank] [hidden]
set -euo pipefail
B=${1:-build}
N=${2:-4096}
C=${3:-512}
BIN=$B/tests/test_a2a
[ -x "$BIN" ] || { echo "build first: cmake --build $B (needs $BIN)"; exit 1; }
export OMP_NUM_THREADS=1
MPI=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
echo "EP8, tokens $N x hidden $C per rank, E=16, uniform random top-K"
printf "%-6s %-4s %-5s %14s %14s %14s %12s %9s\n" nodes K mode "inter MiB" "inter rows MiB" "intra MiB" "hier/flat" "time s"
for rpn in 4 2; do
    for K in 2 8; do
        out=$("${MPI[@]}" -np 8 "$BIN" bench "$rpn" "$N" "$C" "$K")
        flat=$(echo "$out" | awk '$4 == "flat" {print $5}')
        echo "$out" | awk -v flat="$flat" '{
            printf "%-6s %-4s %-5s %14.2f %14.2f %14.2f %12.3f %9.3f\n", $2, $3, $4, $5 / 1048576,
                   $6 / 1048576, $7 / 1048576, $5 / flat, $9 }'
    done
done
