#!/usr/bin/env bash
# A short tour of the trainer's main paths, so that the sanitizer pass of `make check`
# (build-asan: ASan + UBSan, which abort on the first error) covers the trainer and not only
# the kernels: training with evaluation, checkpoints pruned by --keep, document mode, bf16
# (on a CPU with AVX512-BF16), a dense FFN that runs in row chunks (1024 tokens), resume,
# the sandwich norm with TinyInit and the ep-group balance scope,
# and under mpirun (when there is one) TP2 + SP, EP2 with --dist-opt in windows of 1000
# elements (MT_MPI_MAX_COUNT) and a checkpoint, PP2 x VPP2, and EP2 with ZeRO-1 under --overlap
# pipe over the wire (fibers, gradient buckets, the all-gather in flight, --flashcomm-ep).
# Each run must finish and say so; the
# numbers are other tests' business (test_oracle, test_bf16, test_parallel, test_resume).
# Labelled "sanitize" (tests/CMakeLists.txt): it runs in both passes of make check.
set -euo pipefail
NAME=test_train_smoke
MPI_OPTIONAL=1 # the single-process runs need no MPI launcher
source "$(dirname "$0")/lib/mpi.sh"
export OMP_NUM_THREADS=2

"$MT" data math --out "$T/data" --train 4000 --val 400 >/dev/null
bf16=
# bf16 where the kernel tier in use has it (a CPU with AVX512-BF16, no lower MT_CPU_TIER)
if grep -qw avx512_bf16 /proc/cpuinfo && [ "${MT_CPU_TIER:-avx512bf16}" = avx512bf16 ]; then bf16=--bf16; fi
common=(--config demo --data "$T/data" --lr 1e-3 --warmup 1 --quiet --threads 2)

"$MT" train "${common[@]}" --batch 8 --seq 128 --steps 3 --eval-every 2 --save-every 1 --keep 2 \
    --doc-mode $bf16 --out "$T/a" > "$T/a.log" 2>&1 || { tail -20 "$T/a.log"; fail "train (eval, keep, doc-mode $bf16)"; }
grep -q '"event":"summary"' "$T/a/metrics.jsonl" || fail "train wrote no summary"
n=$(ls -d "$T"/a/step_* | wc -l)
[ "$n" = 2 ] || fail "--keep 2 left $n checkpoints"
ok "train with eval, --keep, --doc-mode $bf16"

"$MT" train --resume "$T/a/step_00000003" --data "$T/data" --steps 4 --quiet --threads 2 --out "$T/a" \
    > "$T/r.log" 2>&1 || { tail -20 "$T/r.log"; fail "resume"; }
[ -d "$T/a/step_00000004" ] || fail "resume saved no step 4"
ok "resume"

"$MT" train "${common[@]}" --batch 2 --seq 128 --steps 2 --recompute selective --out "$T/s" > "$T/s.log" 2>&1 \
    || { tail -20 "$T/s.log"; fail "train --recompute selective"; }
ok "train --recompute selective"

# Pangu's recipe: the sandwich norm (its post-sublayer gains start at c/sqrt(L)), TinyInit
# (the embedding's std 0.5) and the ep-group balance scope, recorded for a resume
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": false, "sandwich_norm": true/' \
    "$(dirname "$0")/../configs/demo.json" > "$T/sw.json"
"$MT" train "${common[@]}" --config "$T/sw.json" --batch 2 --seq 64 --steps 1 --lr 1e-9 --init-scheme tiny \
    --aux-scope ep-group $bf16 --out "$T/w" > "$T/w.log" 2>&1 || { tail -20 "$T/w.log"; fail "train sandwich, tiny, ep-group"; }
/usr/bin/python3 - "$T/w/step_00000001" <<'PY' || fail "sandwich / TinyInit initial values"
import json, math, struct, sys
d = sys.argv[1]
st = json.load(open(d + "/trainer_state.json"))
assert st.get("init_scheme") == "tiny" and st.get("aux_scope") == "ep-group", "settings not recorded"
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
def t(name):
    a, b = hdr[name]["data_offsets"]
    return struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
rms = lambda v: math.sqrt(sum(x * x for x in v) / len(v))
L = 4  # configs/demo.json; one step at lr 1e-9 leaves the initial values to within 1e-6
for name, want in (("model.embed_tokens.weight", 0.5), ("model.layers.0.self_attn.q_proj.weight", math.sqrt(1 / (2 * 128 * L))),
                   ("model.layers.1.post_attention_layernorm.weight", 0.283 / math.sqrt(L)),
                   ("model.layers.1.post_mlp_layernorm.weight", 0.432 / math.sqrt(L)),
                   ("model.layers.1.pre_mlp_layernorm.weight", 1.0), ("model.layers.1.input_layernorm.weight", 1.0)):
    got = rms(t(name))
    assert abs(got - want) < 0.02 * want, "%s: rms %.5f, want %.5f" % (name, got, want)
    print("  %s: rms %.5f (want %.5f)" % (name, got, want))
PY
ok "train with the sandwich norm, --init-scheme tiny, --aux-scope ep-group $bf16: initial gains and stds as documented"

if [ ${#MPI[@]} -gt 0 ]; then
    OMP_NUM_THREADS=1 run 2 train "${common[@]}" --threads 1 --batch 4 --seq 64 --steps 2 --tp 2 --sp \
        $bf16 --out "$T/tp" > "$T/tp.log" 2>&1 || { tail -20 "$T/tp.log"; fail "TP2 + SP $bf16"; }
    ok "TP2 + SP $bf16 under mpirun"
    # EP2 with ZeRO-1 whose shard collectives run in windows of 1000 elements, and a checkpoint
    MT_MPI_MAX_COUNT=1000 OMP_NUM_THREADS=1 run 2 train "${common[@]}" --threads 1 --batch 4 --seq 64 --steps 2 \
        --ep 2 --dist-opt --save-every 2 $bf16 --out "$T/ep" > "$T/ep.log" 2>&1 \
        || { tail -20 "$T/ep.log"; fail "EP2 + --dist-opt (windows) $bf16"; }
    [ -d "$T/ep/step_00000002" ] || fail "EP2 + --dist-opt saved no checkpoint"
    ok "EP2 + --dist-opt in windows $bf16 under mpirun"
    OMP_NUM_THREADS=1 run 2 train "${common[@]}" --threads 1 --batch 4 --seq 64 --steps 2 --pp 2 --vpp 2 \
        --accum 2 --out "$T/pp" > "$T/pp.log" 2>&1 || { tail -20 "$T/pp.log"; fail "PP2 x VPP2"; }
    ok "PP2 x VPP2 under mpirun"
    # the overlapped schedule's fibers, gradient buckets during the backward, ZeRO-1's all-gather
    # left in flight (an evaluation and a checkpoint wait for it), INT8 dispatch rows, the wire
    OMP_NUM_THREADS=1 run 2 train "${common[@]}" --threads 1 --batch 4 --seq 64 --steps 3 --accum 2 --ep 2 \
        --dist-opt --overlap pipe --ranks-per-node 1 --wire 0.5,20 --bucket-mb 0.05 --flashcomm-ep int8 \
        --eval-every 2 --save-every 2 --out "$T/ov" > "$T/ov.log" 2>&1 \
        || { tail -20 "$T/ov.log"; fail "EP2 + ZeRO-1 --overlap pipe over the wire"; }
    ok "EP2 + ZeRO-1 --overlap pipe over the wire, 0.05 MiB buckets, --flashcomm-ep int8 under mpirun"
else
    echo "note: mpirun not found (apt-get install openmpi-bin): the MPI runs were left out"
fi
echo "$passed passed, 0 failed"
