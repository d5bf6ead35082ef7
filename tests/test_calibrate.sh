#!/usr/bin/env bash
# `moetrain bench --calibrate` (issue 4 item 4, docs/PLAN.md "Calibration"): the measured
# cluster file parses, holds positive numbers, loads in `moetrain plan`, and (under
# mpirun, when present) records 2 devices on one node with measured links and collectives
# (the cpu and mpi sections: docs/PLAN.md "Calibration"); on a CPU with AVX512-BF16 the bf16
# GEMM and attention of train --bf16 too (peak, curve and attention efficiency, top level and
# per thread count), which
# `plan --bf16` uses (refused without it). Prints a
# predicted-vs-measured step time of the "small" config on one process (not asserted).
#
# Usage: bash tests/test_calibrate.sh /path/to/moetrain
# Env:   MT_TEST_TMP (scratch dir; a unique subdir is made and removed on success)
# Exit:  0 all passed, 1 some failed.
set -u
MOETRAIN=${1:?usage: bash tests/test_calibrate.sh /path/to/moetrain}
case "$MOETRAIN" in /*) ;; *) MOETRAIN="$PWD/$MOETRAIN" ;; esac
[ -x "$MOETRAIN" ] || { echo "FAIL: $MOETRAIN is not an executable"; exit 1; }
SRC=${MT_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
PY=$(command -v python3 || true)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mkdir -p "${MT_TEST_TMP:-/tmp}"
TMP=$(mktemp -d "${MT_TEST_TMP:-/tmp}/calibrate.XXXXXX") || exit 1
M="$MOETRAIN"
PASS=0
FAIL=0
ok()   { echo "ok $1"; PASS=$((PASS + 1)); }
fail() { echo "FAIL $1: $2"; FAIL=$((FAIL + 1)); }

# check_json FILE DEVICES PER_NODE: JSON, the planner's keys positive, curve ascending
check_json() {
    if [ -z "$PY" ]; then
        command -v jq >/dev/null && jq -e '.devices > 0 and .peak_tflops.fp32 > 0' "$1" >/dev/null
        return
    fi
    "$PY" - "$@" "$BF16" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
want_dev, want_pn, bf16 = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
def curve_ok(c):
    return 1 <= len(c) <= 16 and all(0 < e <= 1 for _, e in c) and all(a[0] < b[0] for a, b in zip(c, c[1:]))
assert d["devices"] == want_dev and d["devices_per_node"] == want_pn, (d["devices"], d["devices_per_node"])
assert d["source"].startswith("measured by moetrain bench --calibrate on "), d["source"]
assert isinstance(d["assumed"], list)
nums = [d["peak_tflops"]["bf16"], d["peak_tflops"]["fp32"], d["memory_gb"], d["memory_bw_gbs"],
        d["intra_node"]["bw_gbs"], d["intra_node"]["latency_us"], d["inter_node"]["bw_gbs"],
        d["inter_node"]["latency_us"], d["efficiency"]["attention"], d["efficiency"]["memory"]]
assert all(isinstance(x, (int, float)) and x > 0 for x in nums), nums
assert d["efficiency"]["attention"] <= 1 and d["efficiency"]["memory"] <= 1
c = d["efficiency"]["gemm_curve"]
assert 2 <= len(c) <= 16, c
assert all(0 < e <= 1 for _, e in c) and all(a[0] < b[0] for a, b in zip(c, c[1:])), c
assert max(r[3] for r in d["measured"]["sgemm_gflops"]) <= 1000 * d["peak_tflops"]["fp32"] * 1.001
cpu = d["cpu"]
assert cpu["cores_per_node"] >= 1 and len(cpu["by_threads"]) >= 1, cpu
assert all(e["threads"] >= 1 and e["peak_tflops"] > 0 and e["memory_bw_gbs"] > 0 and e["reserve_mb"] >= 0
           and 0 < e["attention"] <= 1 and len(e["gemm_curve"]) >= 1 for e in cpu["by_threads"]), cpu
# the bf16 GEMM of train --bf16: measured on a CPU with AVX512-BF16 (top level and every
# thread count), absent otherwise (peak_tflops.bf16 = fp32, listed under assumed)
if bf16:
    assert curve_ok(d["efficiency"]["gemm_curve_bf16"]), d["efficiency"]
    assert max(r[3] for r in d["measured"]["bf16_gemm_gflops"]) <= 1000 * d["peak_tflops"]["bf16"] * 1.001
    assert len(d["measured"]["bf16_gemm_gflops"]) == len(d["measured"]["sgemm_gflops"])
    assert all(e["peak_tflops_bf16"] > 0 and curve_ok(e["gemm_curve_bf16"]) for e in cpu["by_threads"]), cpu
    # attention in bf16 mode (its products on bf16 pairs), a fraction of the bf16 peak
    assert 0 < d["efficiency"]["attention_bf16"] <= 1, d["efficiency"]
    assert all(0 < e["attention_bf16"] <= 1 for e in cpu["by_threads"]), cpu
    assert not any("bf16" in a for a in d["assumed"]), d["assumed"]
else:
    assert "gemm_curve_bf16" not in d["efficiency"] and d["peak_tflops"]["bf16"] == d["peak_tflops"]["fp32"]
    assert not any("peak_tflops_bf16" in e or "gemm_curve_bf16" in e or "attention_bf16" in e
                   for e in cpu["by_threads"]), cpu
if want_dev > 1:
    assert d["measured"]["alltoall"]["per_rank_gbs"] > 0 and d["measured"]["pingpong_intra"]["bw_gbs"] > 0
    m = d["mpi"]
    assert m["ranks"] == want_dev and m["per_peer_mb"] >= 0, m
    assert all(m[k + "_bw_gbs"] > 0 for k in ("allreduce", "reduce_scatter", "allgather")), m
    assert all(m[k + "_scratch"] >= 0 for k in ("allreduce", "reduce_scatter", "allgather")), m
else:
    assert "mpi" not in d
EOF
}

# the bf16 GEMM (train --bf16) is measured when the CPU has AVX512-BF16
BF16=0
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && [ "${MT_CPU_TIER:-avx512bf16}" = avx512bf16 ] && BF16=1
echo "AVX512-BF16: $([ "$BF16" = 1 ] && echo yes || echo no)"

# 1. single process, --quick
OUT="$TMP/cal.json"
t0=$(date +%s.%N)
if "$M" bench --calibrate "$OUT" --quick > "$TMP/cal.log" 2>&1 && [ -s "$OUT" ]; then
    ok "bench --calibrate --quick ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
else
    fail "bench --calibrate --quick" "$(cat "$TMP/cal.log")"
fi
cat "$TMP/cal.log"
if check_json "$OUT" 1 1 2> "$TMP/chk.err"; then ok "JSON parses, positive numbers"; else fail "JSON" "$(cat "$TMP/chk.err")"; fi

# 2. the planner reads it and prints a layout
if "$M" plan --model "$SRC/configs/demo.json" --cluster "$OUT" --devices 1 --seq 128 --global-batch 8 --quiet \
        > "$TMP/plan.log" 2>&1 && grep -q "^layout .*tp=1,pp=1" "$TMP/plan.log"; then
    ok "plan --cluster calibrated file"
else
    fail "plan --cluster calibrated file" "$(cat "$TMP/plan.log")"
fi

# 2b. plan --bf16 (the trainer's train --bf16): runs with the bf16 GEMM in the file and puts
# --bf16 in the train flags; refused (an error naming the bf16 GEMM) without it
"$M" plan --model small --cluster "$OUT" --devices 1 --seq 256 --global-batch 4 --bf16 \
    --layout mb=4,rc=none > "$TMP/planb.log" 2>&1
rcb=$?
if [ "$BF16" = 1 ]; then
    if [ "$rcb" = 0 ] && grep -q "^train flags .* --bf16" "$TMP/planb.log"; then ok "plan --bf16: train flags --bf16"
    else fail "plan --bf16" "$(cat "$TMP/planb.log")"; fi
else
    if [ "$rcb" != 0 ] && grep -q "bf16 GEMM" "$TMP/planb.log"; then ok "plan --bf16 refused without AVX512-BF16"
    else fail "plan --bf16 without AVX512-BF16" "$(cat "$TMP/planb.log")"; fi
fi

# 3. bad output path: one error line, non-zero exit
if "$M" bench --calibrate "$TMP/no/such/dir/x.json" --quick > /dev/null 2> "$TMP/err.log"; then
    fail "unwritable path" "exit 0"
elif grep -q "error" "$TMP/err.log"; then ok "unwritable path is an error"; else fail "unwritable path" "$(cat "$TMP/err.log")"; fi

# 4. two ranks under mpirun: devices 2 on one node, measured links
if command -v mpirun >/dev/null 2>&1; then
    MPI=(mpirun)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then
        MPI+=(--oversubscribe --bind-to none)  # both ranks may use both cores, as the trainer runs
        [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
    fi
    OUT2="$TMP/cal2.json"
    if "${MPI[@]}" -np 2 "$M" bench --calibrate "$OUT2" --quick --threads 1 > "$TMP/cal2.log" 2>&1 \
            && check_json "$OUT2" 2 2 2> "$TMP/chk2.err"; then
        ok "mpirun -np 2 bench --calibrate: 2 devices, measured links"
        grep "^calibrate: sgemm" "$TMP/cal2.log"
    else
        fail "mpirun -np 2 bench --calibrate" "$(cat "$TMP/cal2.log" "$TMP/chk2.err" 2>/dev/null)"
    fi
else
    echo "skip mpirun case (mpirun not found)"
fi

# 5. predicted vs measured (informational): small config, B=8 T=512, one process
if [ -s "$OUT" ]; then
    pred=$("$M" plan --model small --cluster "$OUT" --devices 1 --seq 512 --global-batch 8 --dtype fp32 \
        --layout tp=1,pp=1,vpp=1,ep=1,mb=8,rc=none 2>/dev/null | awk '$1 == "step" {print $2}')
    meas=$("$M" bench --config small --batch 8 --seq 512 --steps 1 2>/dev/null |
        awk '/^train / {for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s,") print 4096 / $i}')
    if [ -n "$pred" ] && [ -n "$meas" ]; then
        awk -v p="$pred" -v m="$meas" 'BEGIN{printf "predicted vs measured, small B=8 T=512, 1 process: predicted %.3f s, measured %.3f s (%+.0f%%)\n", p, m, 100*(p-m)/m}'
    else
        echo "predicted vs measured: not available (pred '$pred', meas '$meas')"
    fi
    if [ "$BF16" = 1 ]; then  # the same with --bf16 on both sides
        pred=$("$M" plan --model small --cluster "$OUT" --devices 1 --seq 512 --global-batch 8 --bf16 \
            --layout tp=1,pp=1,vpp=1,ep=1,mb=8,rc=none 2>/dev/null | awk '$1 == "step" {print $2}')
        meas=$("$M" bench --bf16 --config small --batch 8 --seq 512 --steps 1 2>/dev/null |
            awk '/^train / {for (i = 1; i <= NF; i++) if ($(i+1) == "tok/s,") print 4096 / $i}')
        if [ -n "$pred" ] && [ -n "$meas" ]; then
            awk -v p="$pred" -v m="$meas" 'BEGIN{printf "predicted vs measured, small B=8 T=512, 1 process, --bf16: predicted %.3f s, measured %.3f s (%+.0f%%)\n", p, m, 100*(p-m)/m}'
        else
            echo "predicted vs measured --bf16: not available (pred '$pred', meas '$meas')"
        fi
    fi
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ] && rm -rf "$TMP"
[ "$FAIL" = 0 ]
