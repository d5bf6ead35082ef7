#!/usr/bin/env bash
# Resume is bit-exact: a run of 6 steps and a run resumed from its step-3 checkpoint give the
# same losses at steps 4..6 and byte-identical final weights and optimizer state.
# Also: --init starts a new run from a checkpoint's weights (step 1 loss equals the source's
# final eval), resuming a run folder (`latest`) works, and a resume keeps the run's cadence.
set -euo pipefail
MT=$1
T=${MT_TEST_TMP:-/tmp}/test_resume.$$
rm -rf "$T"; mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

"$MT" data math --out "$T/data" --train 5000 --val 200 >/dev/null
common=(--config demo --data "$T/data" --batch 4 --seq 64 --lr 1e-3 --warmup 2 --quiet --threads 2 --peak-gflops 100)
"$MT" train "${common[@]}" --steps 6 --save-every 3 --keep 5 --out "$T/a"
[ -f "$T/a/step_00000003/checksums.json" ] || fail "no step-3 checkpoint"
"$MT" train --resume "$T/a/step_00000003" --data "$T/data" --steps 6 --quiet --threads 2 --out "$T/b"

losses() { grep '"event":"step"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
la=$(losses "$T/a/metrics.jsonl" | awk '$1>3')
lb=$(losses "$T/b/metrics.jsonl")
echo "uninterrupted steps 4-6:"; echo "$la"
echo "resumed       steps 4-6:"; echo "$lb"
[ -n "$la" ] && [ "$la" = "$lb" ] || fail "losses differ after resume"
cmp "$T/a/step_00000006/model.safetensors" "$T/b/step_00000006/model.safetensors" || fail "final weights differ"
cmp "$T/a/step_00000006/optimizer.safetensors" "$T/b/step_00000006/optimizer.safetensors" || fail "optimizer state differs"

# resume from a run folder (uses `latest`) to continue to step 8
"$MT" train --resume "$T/a" --data "$T/data" --steps 8 --quiet --threads 2 --out "$T/c"
[ -f "$T/c/step_00000008/checksums.json" ] || fail "resume from run folder did not reach step 8"

# resuming an older checkpoint into its own run folder with --keep 1: the checkpoint just
# saved (named by `latest`) and the later ones left by the first run stay; the older go.
# Saving a step that exists again replaces its folder whole (no .tmp / .old left behind).
"$MT" train "${common[@]}" --steps 4 --save-every 2 --keep 0 --out "$T/k"
"$MT" train --resume "$T/k/step_00000002" --data "$T/data" --steps 3 --keep 1 --quiet --threads 2 --out "$T/k"
[ "$(cat "$T/k/latest")" = step_00000003 ] || fail "--keep: latest is $(cat "$T/k/latest"), not step_00000003"
[ -f "$T/k/step_00000003/checksums.json" ] || fail "--keep removed the checkpoint it had just saved"
[ -d "$T/k/step_00000004" ] || fail "--keep removed a later checkpoint of the first run"
[ ! -d "$T/k/step_00000002" ] || fail "--keep 1 left the older step_00000002"
"$MT" train --resume "$T/k" --data "$T/data" --steps 4 --quiet --threads 2 || fail "resume after --keep"
[ -f "$T/k/step_00000004/checksums.json" ] && [ "$(cat "$T/k/latest")" = step_00000004 ] || fail "step 4 saved again"
[ -z "$(ls -d "$T"/k/*.tmp "$T"/k/*.old 2>/dev/null)" ] || fail "a .tmp or .old folder was left: $(ls "$T/k")"
# a `latest` naming a missing folder: an error that says so
echo step_00000099 > "$T/k/latest"
if "$MT" eval --ckpt "$T/k" --data "$T/data" --problems 0 2> "$T/lerr"; then fail "eval of a dangling latest succeeded"; fi
grep -q 'not there' "$T/lerr" || fail "dangling latest: $(cat "$T/lerr")"

# a resume keeps the run's cadence (save/eval/log, keep, ...) unless given again: run a saved
# every 3 steps, so the resumed run saves step 6 on its own; --save-every 0 overrides it
"$MT" train --resume "$T/a/step_00000003" --data "$T/data" --steps 9 --quiet --threads 2 --out "$T/e"
[ -f "$T/e/step_00000006/checksums.json" ] && [ -f "$T/e/step_00000009/checksums.json" ] \
    || fail "the resumed run forgot --save-every 3: $(ls "$T/e")"
"$MT" train --resume "$T/a/step_00000003" --data "$T/data" --steps 9 --save-every 0 --quiet --threads 2 --out "$T/f"
[ ! -d "$T/f/step_00000006" ] && [ -f "$T/f/step_00000009/checksums.json" ] || fail "--save-every 0 on resume: $(ls "$T/f")"
grep -qE '"save_every":[[:space:]]*3' "$T/a/step_00000003/trainer_state.json" || fail "trainer_state.json has no save_every"

# --init: new run from weights (step counter restarts at 1)
"$MT" train "${common[@]}" --init "$T/a" --steps 2 --out "$T/d"
[ "$(grep -c '"event":"step"' "$T/d/metrics.jsonl")" = 2 ] || fail "--init run did not do 2 steps"
# results do not depend on the thread count
"$MT" train "${common[@]}" --steps 2 --out "$T/t1" --threads 1
"$MT" train "${common[@]}" --steps 2 --out "$T/t2" --threads 2
cmp "$T/t1/step_00000002/model.safetensors" "$T/t2/step_00000002/model.safetensors" \
  || fail "1 and 2 threads give different weights"
# --profile: per-step breakdown and a Chrome trace with forward/backward spans
"$MT" train "${common[@]}" --steps 2 --out "$T/p" --profile --quiet
/usr/bin/python3 - "$T/p/trace_rank0.json" <<'PY' || fail "trace JSON"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in ev}
need = {"step", "fwd.attention", "fwd.moe", "bwd.attention", "bwd.moe", "optimizer",
        "moe.route", "moe.experts", "moe.shared", "moe.combine"}
assert need <= names, need - names
assert all(e["ph"] == "X" and e["dur"] >= 0 for e in ev)
# the MoE block's parts are spans inside its fwd.moe / bwd.moe span
blocks = [e for e in ev if e["name"] in ("fwd.moe", "bwd.moe")]
for e in ev:
    if e["name"].startswith("moe."):
        assert any(b["ts"] <= e["ts"] and e["ts"] + e["dur"] <= b["ts"] + b["dur"] for b in blocks), e
steps = [e for e in ev if e["name"] == "step"]
assert len(steps) == 2, len(steps)
PY
echo "1 passed, 0 failed"
