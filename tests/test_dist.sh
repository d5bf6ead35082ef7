#!/usr/bin/env bash
# Data parallelism over MPI (issue 3, first slice). On the demo config and `data math` data:
#  1. DP2 reproduces the single process with --accum 2 (losses of 10 steps within 1e-5 rel.)
#  2. DP2 with the distributed optimizer (--dist-opt, ZeRO-1) likewise
#  3. DP4 --dist-opt reproduces the single process with --accum 4
#  4. resume across a layout change: DP2 --dist-opt saves at step 3, a single process
#     resumes it to step 6 (and DP2 --dist-opt resumes a single-process checkpoint)
#  5. optimizer state per rank halves at DP2 with --dist-opt
#  6. a rank with different flags is refused at start-up, naming the rank
#  7. a rank that fails (error on one rank; a rank killed with SIGKILL) ends the job with a
#     non-zero exit within seconds instead of hanging
#  8. the shard collectives in windows (MT_MPI_MAX_COUNT=1000, as buffers of 2^30 elements or
#     more go): DP2 --dist-opt writes the same checkpoint bits and resumes to the same bits
# Usage: bash tests/test_dist.sh path/to/moetrain   (skips with 77 when mpirun is missing)
set -euo pipefail
NAME=test_dist
source "$(dirname "$0")/lib/mpi.sh"

"$MT" data math --out "$T/data" --train 5000 --val 200 >/dev/null
common=(--config demo --data "$T/data" --batch 4 --seq 64 --lr 1e-3 --warmup 2 --threads 1 --peak-gflops 100)

losses() { grep '"event":"step"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
# same steps, every loss within 1e-5 relative
same_losses() {
    local a b
    a=$(losses "$1"); b=$(losses "$2")
    [ -n "$a" ] && [ "$(echo "$a" | wc -l)" = "$(echo "$b" | wc -l)" ] || return 1
    paste <(echo "$a") <(echo "$b") | awk '{ if ($1 != $3) exit 1; d = $2 - $4; if (d < 0) d = -d;
        m = $2 < 0 ? -$2 : $2; if (d > 1e-5 * m) exit 1 }'
}
table() { # step, then one loss column per metrics file
    local i=0
    losses "$1" | awk '{print $1}' > "$T/col0"
    for f in "$@"; do i=$((i + 1)); losses "$f" | awk '{print $2}' > "$T/col$i"; done
    paste "$T"/col[0-9]*
    rm -f "$T"/col[0-9]*
}

# 1-3: layouts vs the single process with the same global batch
"$MT" train "${common[@]}" --steps 10 --accum 2 --quiet --out "$T/s2" > "$T/s2.out"
"$MT" train "${common[@]}" --steps 10 --accum 4 --quiet --out "$T/s4"
run 2 train "${common[@]}" --steps 10 --quiet --out "$T/dp2"
run 2 train "${common[@]}" --steps 10 --dist-opt --out "$T/dp2o" > "$T/dp2o.out"
run 4 train "${common[@]}" --steps 10 --dist-opt --out "$T/dp4o" > "$T/dp4o.out"
echo "step  single(accum2)  DP2  DP2+dist-opt | single(accum4)  DP4+dist-opt"
table "$T/s2/metrics.jsonl" "$T/dp2/metrics.jsonl" "$T/dp2o/metrics.jsonl" > "$T/tab1"
table "$T/s4/metrics.jsonl" "$T/dp4o/metrics.jsonl" | cut -f2- > "$T/tab2"
paste "$T/tab1" "$T/tab2"
same_losses "$T/s2/metrics.jsonl" "$T/dp2/metrics.jsonl" || fail "DP2 losses differ from the single process with --accum 2"
ok "DP2 = single process --accum 2"
same_losses "$T/s2/metrics.jsonl" "$T/dp2o/metrics.jsonl" || fail "DP2 --dist-opt losses differ from the single process"
ok "DP2 --dist-opt = single process --accum 2"
same_losses "$T/s4/metrics.jsonl" "$T/dp4o/metrics.jsonl" || fail "DP4 --dist-opt losses differ from the single process --accum 4"
ok "DP4 --dist-opt = single process --accum 4"
grep '"event":"step"' "$T/dp2/metrics.jsonl" | grep -q '"comm_s":' || fail "no comm_s in the DP2 metrics"
run 2 train "${common[@]}" --steps 1 --out "$T/dp2c" > "$T/dp2c.out"
grep -q "| comm " "$T/dp2c.out" || { cat "$T/dp2c.out"; fail "no comm time on the progress line"; }
ok "communication time reported"

# 4: resume across a layout change (both directions)
run 2 train "${common[@]}" --steps 6 --save-every 3 --keep 5 --dist-opt --quiet --out "$T/ra"
[ -f "$T/ra/step_00000003/checksums.json" ] || fail "DP2 --dist-opt wrote no step-3 checkpoint"
"$MT" train --resume "$T/ra/step_00000003" --data "$T/data" --steps 6 --accum 2 --threads 1 --quiet --out "$T/rb"
la=$(losses "$T/ra/metrics.jsonl" | awk '$1>3'); lb=$(losses "$T/rb/metrics.jsonl")
echo "steps 4-6: DP2 --dist-opt uninterrupted | resumed as 1 process"; paste <(echo "$la") <(echo "$lb" | cut -d' ' -f2)
grep -v '"step":[123],' "$T/ra/metrics.jsonl" > "$T/ra_tail.jsonl"
same_losses "$T/ra_tail.jsonl" "$T/rb/metrics.jsonl" || fail "resuming DP2 --dist-opt as one process changed the losses"
ok "DP2 --dist-opt checkpoint resumed by a single process (--accum 2)"
"$MT" train "${common[@]}" --steps 6 --save-every 3 --keep 5 --accum 2 --quiet --out "$T/sa"
# no --accum: the global batch of the checkpoint (8 sequences) gives accum 1 at DP2
run 2 train --resume "$T/sa/step_00000003" --data "$T/data" --steps 6 --threads 1 --dist-opt --quiet --out "$T/sb"
grep -v '"step":[123],' "$T/sa/metrics.jsonl" > "$T/sa_tail.jsonl"
same_losses "$T/sa_tail.jsonl" "$T/sb/metrics.jsonl" || fail "resuming a single-process checkpoint under DP2 --dist-opt changed the losses"
ok "single-process checkpoint resumed under DP2 --dist-opt (global batch kept)"
if run 2 train --resume "$T/sa/step_00000003" --data "$T/data" --steps 6 --batch 3 --threads 1 --quiet \
       --out "$T/sc" > "$T/sc.out" 2>&1; then fail "an indivisible global batch was accepted"; fi
grep -q "not divisible" "$T/sc.out" || { cat "$T/sc.out"; fail "no clear message for an indivisible global batch"; }
ok "indivisible global batch refused"

# 5: optimizer state per rank
mib() { sed -nE 's/.*optimizer state per rank: ([0-9.]+) MiB.*/\1/p' "$1"; }
"$MT" train "${common[@]}" --steps 1 --out "$T/o1" > "$T/o1.out"
m1=$(mib "$T/o1.out"); m2=$(mib "$T/dp2o.out"); m4=$(mib "$T/dp4o.out")
echo "optimizer state per rank: DP1 $m1 MiB, DP2 --dist-opt $m2 MiB, DP4 --dist-opt $m4 MiB"
awk -v a="$m1" -v b="$m2" 'BEGIN { r = b / a; exit !(r > 0.49 && r < 0.51) }' || fail "DP2 --dist-opt optimizer state is not half of DP1"
awk -v a="$m1" -v b="$m4" 'BEGIN { r = b / a; exit !(r > 0.24 && r < 0.26) }' || fail "DP4 --dist-opt optimizer state is not a quarter of DP1"
ok "optimizer state per rank falls as 1/DP with --dist-opt"

# 6: a rank with other flags is refused (MPMD launch: rank 1 has another --lr)
set +e
timeout 60 "${MPI[@]}" -np 1 "$MT" train "${common[@]}" --steps 2 --out "$T/mm" : \
    -np 1 "$MT" train --config demo --data "$T/data" --batch 4 --seq 64 --lr 2e-3 --warmup 2 --threads 1 \
    --steps 2 --out "$T/mm" > "$T/mm.out" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/mm.out"; fail "mismatched ranks: exit $rc (expected an error)"; }
grep -q "rank 1 has a different command line" "$T/mm.out" || { cat "$T/mm.out"; fail "the refusal does not name rank 1"; }
[ ! -e "$T/mm/step_00000002" ] || fail "mismatched ranks trained anyway"
ok "a rank with different flags is refused: $(grep -m1 'rank 1 has' "$T/mm.out")"

# 7a: an error on one rank only (its working directory lacks the relative data path)
mkdir -p "$T/elsewhere"
cfg=$(realpath "$(dirname "$0")/../configs/demo.json")
set +e
t0=$(date +%s)
timeout 60 "${MPI[@]}" -np 1 -wdir "$T" "$MT" train --config "$cfg" --data data --batch 4 --seq 64 --steps 50 \
    --threads 1 --out "$T/e1" : -np 1 -wdir "$T/elsewhere" "$MT" train --config "$cfg" --data data --batch 4 \
    --seq 64 --steps 50 --threads 1 --out "$T/e1" > "$T/e1.out" 2>&1
rc=$?
set -e
dt=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/e1.out"; fail "an error on rank 1: exit $rc after ${dt}s (expected a quick error)"; }
grep -q "rank 1 of 2: data: cannot open" "$T/e1.out" || { cat "$T/e1.out"; fail "the error does not name rank 1"; }
ok "an error on rank 1 ends the job in ${dt}s: $(grep -m1 'rank 1 of 2' "$T/e1.out")"

# 7b: a rank killed with SIGKILL in the middle of training
set +e
t0=$(date +%s)
timeout 120 "${MPI[@]}" -np 2 "$MT" train "${common[@]}" --steps 100000 --log-every 1000 --out "$T/k" > "$T/k.out" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 600); do # wait until training runs, then find rank 1's process
    if [ -s "$T/k/metrics.jsonl" ]; then
        for p in $(pgrep -f -- "--out $T/k"); do
            if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qE '^(OMPI_COMM_WORLD_RANK|PMI_RANK)=1$'; then victim=$p; fi
        done
    fi
    [ -n "$victim" ] && break
    sleep 0.1
done
[ -n "$victim" ] && kill -9 "$victim"
tk=$(date +%s)
wait $job
rc=$?
set -e
grep -E "rank 1" "$T/k.out" | head -2
dt=$(( $(date +%s) - tk ))
[ -n "$victim" ] || { cat "$T/k.out"; fail "could not find rank 1's process"; }
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $dt -le 20 ] || { cat "$T/k.out"; fail "killed rank: exit $rc after ${dt}s (expected an error within seconds)"; }
ok "rank 1 killed: job ended with exit $rc ${dt}s later"

# 8: reduce-scatter, all-gather, gather and scatter of shards in windows of 1000 elements
export MT_MPI_MAX_COUNT=1000
run 2 train "${common[@]}" --steps 6 --save-every 3 --keep 5 --dist-opt --quiet --out "$T/wa"
run 2 train --resume "$T/wa/step_00000003" --data "$T/data" --steps 6 --threads 1 --dist-opt --quiet --out "$T/wb"
unset MT_MPI_MAX_COUNT
for f in model.safetensors optimizer.safetensors; do
    cmp "$T/ra/step_00000006/$f" "$T/wa/step_00000006/$f" || fail "windowed collectives changed the step-6 $f"
    cmp "$T/ra/step_00000006/$f" "$T/wb/step_00000006/$f" || fail "resuming with windowed collectives changed $f"
done
ok "shard collectives in windows of 1000 elements: the same checkpoint bits, saved and resumed"
if MT_MPI_MAX_COUNT=0 run 2 train "${common[@]}" --steps 1 --dist-opt --out "$T/w0" > "$T/w0.out" 2>&1; then
    fail "MT_MPI_MAX_COUNT=0 was accepted"; fi
grep -q "MT_MPI_MAX_COUNT=0: not a count" "$T/w0.out" || { cat "$T/w0.out"; fail "no clear message for MT_MPI_MAX_COUNT=0"; }
ok "a bad MT_MPI_MAX_COUNT is refused"

echo "$passed passed, 0 failed"
