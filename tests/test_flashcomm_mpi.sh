#!/usr/bin/env bash
# FlashComm's all-reduce (parallel/tp.h; issue 24 item 4): tests/test_flashcomm (built next
# to moetrain) on 2, 3 and 4 ranks; then TP2 training with --flashcomm int8 against fp32:
# 0.63x the TP bytes, the loss within 2% after 40 steps, and the refusals (no --tp, --sp);
# then EP2 over two emulated nodes with --flashcomm-ep int8 (the dispatch's rows as INT8):
# fewer inter-node bytes, the loss within 3% (the rounding moves the trajectory), flat and
# hierarchical exchanges (4 ranks) the same bits, and its refusals.
# Usage: bash tests/test_flashcomm_mpi.sh path/to/moetrain   (skips with 77 without mpirun)
set -euo pipefail
NAME=test_flashcomm
source "$(dirname "$0")/lib/mpi.sh"
BIN=$(dirname "$MT")/tests/test_flashcomm
[ -x "$BIN" ] || fail "$BIN not built"
for np in 2 3 4; do
    timeout 120 "${MPI[@]}" -np $np "$BIN" > "$T/u$np.log" 2>&1 || { cat "$T/u$np.log"; fail "test_flashcomm on $np ranks"; }
    ok "the INT8 all-reduce on $np ranks: $(tail -1 "$T/u$np.log"); $(grep -m1 bytes "$T/u$np.log" | sed 's/^ *//')"
done
"$MT" data math --out "$T/D" --train 5000 --val 100 >/dev/null
common=(train --config demo --data "$T/D" --batch 8 --seq 64 --steps 40 --lr 3e-3 --warmup 5 --threads 1 --quiet --tp 2
        --peak-gflops 100)
run 2 "${common[@]}" --out "$T/off" || fail "TP2 fp32"
run 2 "${common[@]}" --flashcomm int8 --out "$T/int8" || fail "TP2 --flashcomm int8"
python3 - "$T/off/metrics.jsonl" "$T/int8/metrics.jsonl" <<'PY' || fail "FlashComm: bytes or loss out of bounds"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"event":"step"' in l] for f in sys.argv[1:3])
x, y = a[-1], b[-1]
ratio = sum(e["tp_bytes"] for e in b) / sum(e["tp_bytes"] for e in a)
print(f"    step 40: loss {x['loss']:.4f} / {y['loss']:.4f}, TP bytes {ratio:.3f}x, rounding error {y['flashcomm_rel_err']:.2e} (RMS, relative)")
ok = ratio <= 0.65 and abs(x["loss"] - y["loss"]) <= 0.02 * x["loss"] and 0 < y["flashcomm_rel_err"] < 0.02
ok &= all(e["flashcomm_rel_err"] == 0 and e["tp_bytes"] == e["tp_bytes_fp32"] for e in a)
sys.exit(0 if ok else 1)
PY
ok "TP2 --flashcomm int8: 0.63x the TP bytes, the loss within 2% of fp32's after 40 steps"
refused "--flashcomm without --tp" "needs --tp" train --config demo --data "$T/D" --steps 1 --flashcomm int8 --out "$T/e"
if run 2 "${common[@]}" --sp --flashcomm int8 --out "$T/e2" > "$T/e2.log" 2>&1; then fail "--flashcomm with --sp accepted"; fi
grep -q "without --sp" "$T/e2.log" || { cat "$T/e2.log"; fail "--flashcomm --sp: no clear error"; }
ok "--flashcomm with --sp refused: $(grep -m1 -o 'train: --flashcomm.*' "$T/e2.log")"
refused "--flashcomm bogus" "int8 or off" train --config demo --data "$T/D" --steps 1 --tp 1 --flashcomm bogus --out "$T/e"

ep=(train --config demo --data "$T/D" --batch 8 --seq 64 --steps 40 --lr 3e-3 --warmup 5 --threads 1 --quiet --ep 2
    --ranks-per-node 1)
run 2 "${ep[@]}" --out "$T/ep" || fail "EP2 fp32"
run 2 "${ep[@]}" --flashcomm-ep int8 --out "$T/ep8" || fail "EP2 --flashcomm-ep int8"
python3 - "$T/ep/metrics.jsonl" "$T/ep8/metrics.jsonl" <<'PY' || fail "FlashComm on the dispatch: bytes or loss out of bounds"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"event":"step"' in l] for f in sys.argv[1:3])
x, y = a[-1], b[-1]
ratio = sum(e["a2a_inter_bytes"] for e in b) / sum(e["a2a_inter_bytes"] for e in a)
err = max(e["flashcomm_ep_rel_err"] for e in b)
print(f"    step 40: loss {x['loss']:.4f} / {y['loss']:.4f}, inter-node bytes {ratio:.3f}x, rounding error {err:.2e} (RMS, relative; worst step)")
ok = ratio < 0.9 and abs(x["loss"] - y["loss"]) <= 0.03 * x["loss"] and 0 < err < 0.02 and x["loss"] != y["loss"]
ok &= all("flashcomm_ep_rel_err" not in e for e in a)
sys.exit(0 if ok else 1)
PY
ok "EP2 --flashcomm-ep int8: fewer inter-node bytes, the loss within 3% of fp32's after 40 steps"
ep4=(train --config demo --data "$T/D" --batch 4 --seq 64 --steps 6 --threads 1 --quiet --ep 4 --ranks-per-node 2
     --flashcomm-ep int8)
run 4 "${ep4[@]}" --a2a hier --out "$T/h8" || fail "EP4 hier --flashcomm-ep int8"
run 4 "${ep4[@]}" --a2a flat --out "$T/f8" || fail "EP4 flat --flashcomm-ep int8"
cmp -s "$T/h8/step_00000006/model.safetensors" "$T/f8/step_00000006/model.safetensors" \
    || fail "--flashcomm-ep int8: flat and hierarchical exchanges gave different weights"
ok "EP4 --flashcomm-ep int8: flat and hierarchical exchanges give the same weights (every row rounded once, at its source)"
refused "--flashcomm-ep without --ep" "needs --ep >= 2" train --config demo --data "$T/D" --steps 1 --flashcomm-ep int8 --out "$T/e"
refused "--flashcomm-ep bogus" "int8 or off" train --config demo --data "$T/D" --steps 1 --flashcomm-ep bogus --out "$T/e"
echo "$passed passed, 0 failed"
