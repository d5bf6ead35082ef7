#!/usr/bin/env bash
# `moetrain train --bf16` (mixed precision: GEMM operands rounded to bf16, fp32 sums, weights
# and optimizer): on the demo config
#   - the losses of 8 steps follow the fp32 run's within 0.2% (and are not the same numbers:
#     the bf16 kernel ran), the summary says "precision":"bf16"; the same with the sandwich norm;
#   - a bf16 run resumed from its step-4 checkpoint without the flag continues in bf16 and
#     gives the uninterrupted run's losses exactly; with --no-bf16 it continues in fp32;
#   - results do not depend on the thread count (1 vs 2 threads: identical weights);
#   - under mpirun, DP2, EP2, TP2 + SP and PP2 in bf16 follow one bf16 process with the same global batch
#     within 5e-4 (sums in another order can flip a bf16 rounding; fp32 layouts match to 1e-5);
#   - an MLA model: bf16 follows fp32 within 0.2%, 1 and 2 threads agree, TP2 + SP follows one process.
# Exits 77 (skipped) on a CPU without AVX512-BF16, or without mpirun (tests/lib/mpi.sh).
set -euo pipefail
NAME=test_bf16
source "$(dirname "$0")/lib/mpi.sh" # MT, T, fail/ok, run N ARGS (exits 77 without mpirun)
PY=/usr/bin/python3

"$MT" data math --out "$T/data" --train 5000 --val 200 >/dev/null
common=(--config demo --data "$T/data" --batch 4 --seq 64 --lr 1e-3 --warmup 2 --quiet)
if ! "$MT" train "${common[@]}" --steps 1 --out "$T/probe" --bf16 2> "$T/probe.err"; then
    if grep -q 'AVX512-BF16' "$T/probe.err"; then
        echo "SKIP: $(cat "$T/probe.err")"; exit 77
    fi
    cat "$T/probe.err"; fail "--bf16 run failed"
fi

losses() { grep '"event":"step"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
# compare A B TOL [differ]: every step's loss within TOL relative; with "differ", not all equal
compare() {
    "$PY" - "$1" "$2" "$3" "${4:-}" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1]) if l.strip()]
b = [l.split() for l in open(sys.argv[2]) if l.strip()]
tol, differ = float(sys.argv[3]), sys.argv[4] == "differ"
assert len(a) == len(b) and a, (len(a), len(b))
worst = max(abs(float(x[1]) - float(y[1])) / abs(float(x[1])) for x, y in zip(a, b))
print(f"  {len(a)} steps, worst relative difference {worst:.2e} (tolerance {tol:g})")
assert worst <= tol, "losses differ too much"
if differ:
    assert any(x[1] != y[1] for x, y in zip(a, b)), "identical losses: the bf16 kernel did not run"
EOF
}

"$MT" train "${common[@]}" --steps 8 --threads 2 --out "$T/fp32"
"$MT" train "${common[@]}" --steps 8 --threads 2 --out "$T/bf16" --bf16 --save-every 4 --keep 4
losses "$T/fp32/metrics.jsonl" > "$T/l_fp32"; losses "$T/bf16/metrics.jsonl" > "$T/l_bf16"
paste "$T/l_fp32" "$T/l_bf16" | awk '{printf "  step %s fp32 %s bf16 %s\n", $1, $2, $4}'
compare "$T/l_fp32" "$T/l_bf16" 2e-3 differ || fail "bf16 losses do not follow fp32"
grep -q '"precision":"bf16"' "$T/bf16/metrics.jsonl" || fail "summary does not say bf16"
grep -q '"precision":"fp32"' "$T/fp32/metrics.jsonl" || fail "summary does not say fp32"
ok "bf16 follows fp32 within 0.2%"
# moetrain info --bf16 sizes the activations as train --bf16 allocates them (K, V as bf16)
for prec in fp32 bf16; do
  flag=; [ $prec = bf16 ] && flag=--bf16
  want=$(grep -o '"activation_bytes_per_rank":[0-9]*' "$T/$prec/metrics.jsonl" | cut -d: -f2)
  got=$("$MT" info --config demo --batch 4 --seq 64 --threads 2 $flag | awk '/^  activations/ {print $2}')
  "$PY" -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - int(sys.argv[2]) / 1048576) < 0.05 else 1)" "$got" "$want" \
    || fail "info $flag: activations $got MiB, train $prec allocated $want B"
done
ok "info and info --bf16 give the activations train allocates"

# the sandwich norm: its norms of the sublayer outputs in fp32 between the bf16 products
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": false, "sandwich_norm": true/' \
    "$(dirname "$0")/../configs/demo.json" > "$T/sw.json"
for prec in fp32 bf16; do
  flag=; [ $prec = bf16 ] && flag=--bf16
  "$MT" train "${common[@]}" --config "$T/sw.json" --steps 8 --threads 2 --out "$T/sw_$prec" $flag
  losses "$T/sw_$prec/metrics.jsonl" > "$T/l_sw_$prec"
  want=$(grep -o '"activation_bytes_per_rank":[0-9]*' "$T/sw_$prec/metrics.jsonl" | cut -d: -f2)
  got=$("$MT" info --config "$T/sw.json" --batch 4 --seq 64 --threads 2 $flag | awk '/^  activations/ {print $2}')
  "$PY" -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - int(sys.argv[2]) / 1048576) < 0.05 else 1)" "$got" "$want" \
    || fail "sandwich norm, info $flag: activations $got MiB, train $prec allocated $want B"
done
compare "$T/l_sw_fp32" "$T/l_sw_bf16" 2e-3 differ || fail "sandwich norm: bf16 losses do not follow fp32"
ok "sandwich norm: bf16 follows fp32 within 0.2%, info gives the activations train allocates"

"$MT" train --resume "$T/bf16/step_00000004" --data "$T/data" --steps 8 --quiet --threads 2 --out "$T/res"
losses "$T/res/metrics.jsonl" > "$T/l_res"
awk '$1 > 4' "$T/l_bf16" > "$T/l_bf16_tail"
cmp -s "$T/l_bf16_tail" "$T/l_res" || { cat "$T/l_bf16_tail" "$T/l_res"; fail "bf16 resume is not exact"; }
grep -q '"precision":"bf16"' "$T/res/metrics.jsonl" || fail "resume did not keep bf16"
ok "bf16 resume without the flag continues in bf16, exactly"
"$MT" train --resume "$T/bf16/step_00000004" --data "$T/data" --steps 8 --quiet --threads 2 --out "$T/res32" --no-bf16
losses "$T/res32/metrics.jsonl" > "$T/l_res32"
grep -q '"precision":"fp32"' "$T/res32/metrics.jsonl" || fail "resume with --no-bf16 did not run in fp32"
compare "$T/l_bf16_tail" "$T/l_res32" 2e-3 differ || fail "resume with --no-bf16: losses"
ok "bf16 resume with --no-bf16 continues in fp32"

"$MT" train "${common[@]}" --steps 2 --threads 1 --out "$T/t1" --bf16
"$MT" train "${common[@]}" --steps 2 --threads 2 --out "$T/t2" --bf16
cmp "$T/t1/step_00000002/model.safetensors" "$T/t2/step_00000002/model.safetensors" \
  || fail "bf16: 1 and 2 threads give different weights"
ok "bf16: 1 and 2 threads give identical weights"

"$MT" train "${common[@]}" --steps 6 --threads 1 --accum 2 --out "$T/one" --bf16
losses "$T/one/metrics.jsonl" > "$T/l_one"
run 2 train "${common[@]}" --steps 6 --out "$T/dp2" --bf16
losses "$T/dp2/metrics.jsonl" > "$T/l_dp2"
compare "$T/l_one" "$T/l_dp2" 5e-4 || fail "bf16 DP2 differs from one process"
run 2 train "${common[@]}" --steps 6 --out "$T/ep2" --ep 2 --bf16
losses "$T/ep2/metrics.jsonl" > "$T/l_ep2"
compare "$T/l_one" "$T/l_ep2" 5e-4 || fail "bf16 EP2 differs from one process"
ok "bf16 DP2 and EP2 follow one process"
# tensor and pipeline parallelism (the global batch of one micro-batch of 4 sequences x accum)
"$MT" train "${common[@]}" --steps 6 --threads 1 --out "$T/one1" --bf16
losses "$T/one1/metrics.jsonl" > "$T/l_one1"
run 2 train "${common[@]}" --steps 6 --out "$T/tp2" --tp 2 --sp --bf16
losses "$T/tp2/metrics.jsonl" > "$T/l_tp2"
compare "$T/l_one1" "$T/l_tp2" 5e-4 || fail "bf16 TP2 + SP differs from one process"
run 2 train "${common[@]}" --steps 6 --out "$T/pp2" --pp 2 --accum 2 --bf16
losses "$T/pp2/metrics.jsonl" > "$T/l_pp2"
compare "$T/l_one" "$T/l_pp2" 5e-4 || fail "bf16 PP2 differs from one process"
ok "bf16 TP2 + SP and PP2 follow one process"

# MLA (demo's layers with multi-head latent attention; q/k width 32, v 32: bf16 attention pairs)
"$PY" - "$(dirname "$0")/../configs/demo.json" "$T/mla.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
for k in ("num_key_value_heads", "head_dim"):
    c.pop(k)
c.update({"attention_type": "mla", "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 16, "v_head_dim": 32})
json.dump(c, open(sys.argv[2], "w"))
EOF
mla=(--config "$T/mla.json" --data "$T/data" --batch 4 --seq 64 --lr 1e-3 --warmup 2 --quiet)
"$MT" train "${mla[@]}" --steps 8 --threads 2 --out "$T/mla32"
"$MT" train "${mla[@]}" --steps 8 --threads 2 --out "$T/mla16" --bf16
losses "$T/mla32/metrics.jsonl" > "$T/l_mla32"; losses "$T/mla16/metrics.jsonl" > "$T/l_mla16"
compare "$T/l_mla32" "$T/l_mla16" 2e-3 differ || fail "MLA: bf16 losses do not follow fp32"
ok "MLA: bf16 follows fp32 within 0.2%"
"$MT" train "${mla[@]}" --steps 2 --threads 1 --out "$T/mt1" --bf16
"$MT" train "${mla[@]}" --steps 2 --threads 2 --out "$T/mt2" --bf16
cmp "$T/mt1/step_00000002/model.safetensors" "$T/mt2/step_00000002/model.safetensors" \
  || fail "MLA bf16: 1 and 2 threads give different weights"
ok "MLA bf16: 1 and 2 threads give identical weights"
"$MT" train "${mla[@]}" --steps 6 --threads 1 --out "$T/mla_one" --bf16
losses "$T/mla_one/metrics.jsonl" > "$T/l_mla_one"
run 2 train "${mla[@]}" --steps 6 --out "$T/mla_tp2" --tp 2 --sp --bf16
losses "$T/mla_tp2/metrics.jsonl" > "$T/l_mla_tp2"
compare "$T/l_mla_one" "$T/l_mla_tp2" 5e-4 || fail "MLA bf16 TP2 + SP differs from one process"
ok "MLA bf16 TP2 + SP follows one process"
echo "$passed passed, 0 failed"
