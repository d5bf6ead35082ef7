#!/usr/bin/env bash
# Reliability of loads and writes (issue items 4, 6 and 7): a checkpoint holding NaN or Inf
# weights is refused by every command that loads it unless --allow-nonfinite (then a
# warning names the tensor); a failed write (a full device, a file over `ulimit -f`) ends
# the run with one "moetrain: error:" line naming the file, exit 1, and a failed checkpoint
# leaves no DIR.tmp folder and the previous checkpoint resumable; a batch shape that cannot
# fit in memory is refused before anything is allocated, naming the memory it needs.
# Positive controls keep the test from passing vacuously.
#
# Usage: bash tests/test_write_errors.sh /path/to/moetrain
# Env:   MT_TEST_TMP (scratch dir; a unique subdir is made and removed on success)
# Exit:  0 all passed, 1 some failed.
set -u
NAME=test_write_errors
source "$(dirname "$0")/lib/cli.sh"
# the MPI singleton's PMIx keeps its store in shared-memory files, which a small `ulimit -f`
# forbids: its hash store instead (the checkpoint is what must hit the limit)
export PMIX_MCA_gds=hash

# ---- inputs ----------------------------------------------------------------------------
cli_tiny_config # c.json
# poison.py SRC DST TENSOR VALUE INDEX: a copy of checkpoint SRC with one float of TENSOR set to
# VALUE (nan, inf), its checksums.json recomputed (XXH64, as train/checkpoint.c verifies) so
# that only the value is wrong
cat > poison.py <<'EOF'
import json, os, struct, sys
M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(acc, lane): return (rotl((acc + lane * P2) & M, 31) * P1) & M
def xxh64(b, seed=0):
    n, i = len(b), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for k, lane in enumerate(struct.unpack_from("<4Q", b, i)): v[k] = rnd(v[k], lane)
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = (((h ^ rnd(0, x)) * P1) + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = ((rotl(h ^ rnd(0, struct.unpack_from("<Q", b, i)[0]), 27) * P1) + P4) & M; i += 8
    if i + 4 <= n:
        h = ((rotl(h ^ ((struct.unpack_from("<I", b, i)[0] * P1) & M), 23) * P2) + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ ((b[i] * P5) & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M; h ^= h >> 32
    return h
src, dst, name, val, idx = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
cs = json.load(open(os.path.join(src, "checksums.json")))
for f in cs["files"]:  # the saved files first: this hash must agree with moetrain's
    b = open(os.path.join(src, f), "rb").read()
    assert "%016x" % xxh64(b) == cs["files"][f], "xxh64 disagrees with checksums.json on " + f
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src): open(os.path.join(dst, f), "wb").write(open(os.path.join(src, f), "rb").read())
p = os.path.join(dst, "model.safetensors")
d = bytearray(open(p, "rb").read())
hl = struct.unpack_from("<Q", d, 0)[0]
t = json.loads(d[8:8 + hl])[name]
assert t["dtype"] == "F32"
struct.pack_into("<f", d, 8 + hl + t["data_offsets"][0] + 4 * idx, val)
open(p, "wb").write(d)
for f in cs["files"]: cs["files"][f] = "%016x" % xxh64(open(os.path.join(dst, f), "rb").read())
json.dump(cs, open(os.path.join(dst, "checksums.json"), "w"), indent=1)
EOF

run_cmd 60 data.out data.err "$M" data math --out D --train 2000 --val 100
[ $RC = 0 ] && [ -f D/math_train_000000.bin ] || { echo "FAIL setup: moetrain data math (exit $RC): $(cat data.err)"; exit 1; }
TRAIN_SHARD=$(ls D/*train*.bin | head -1)
TR="--steps 2 --batch 2 --seq 32"
expect_ok control_train -- "$M" train --config c.json --data D $TR --out RUN --quiet
CK=RUN/step_00000002
[ -f "$CK/checksums.json" ] || { echo "FAIL setup: no $CK/checksums.json"; exit 1; }
EXP=model.layers.1.mlp.experts.2.down_proj.weight
"$PY" poison.py "$CK" NAN "$EXP" nan 5 && "$PY" poison.py "$CK" INF model.norm.weight inf 3 ||
  { echo "FAIL setup: cannot write the poisoned checkpoints"; exit 1; }
expect_ok control_eval -- "$M" eval --ckpt RUN --data D --problems 2 --windows 2
expect_ok control_eval_flag_clean -- "$M" eval --ckpt RUN --data D --problems 2 --windows 2 --allow-nonfinite

# ---- 4. non-finite weights -------------------------------------------------------------
NANPAT="NAN: tensor $EXP holds 1 NaN/Inf value.*--allow-nonfinite"
INFPAT='INF: tensor model\.norm\.weight holds 1 NaN/Inf value.*--allow-nonfinite'
expect_fail nan_eval "$NANPAT" -- "$M" eval --ckpt NAN --data D --problems 2 --windows 2
expect_fail inf_eval "$INFPAT" -- "$M" eval --ckpt INF --data D --problems 2 --windows 2
expect_fail nan_generate "$NANPAT" -- "$M" generate --ckpt NAN --prompt 1+1= --max-new 4
expect_fail inf_generate "$INFPAT" -- "$M" generate --ckpt INF --prompt 1+1= --max-new 4
expect_fail nan_train_init "$NANPAT" -- "$M" train --init NAN --data D $TR --out R_INIT --quiet
expect_fail inf_train_resume "$INFPAT" -- "$M" train --resume INF --data D --steps 3 --out R_RES --quiet
expect_fail nan_train_resume "$NANPAT" -- "$M" train --resume NAN --data D --steps 3 --out R_RES2 --quiet
expect_fail inf_rl_init "$INFPAT" -- "$M" rl --init INF --data D --out R_RL --steps 1 --prompts-per-step 2 --group 2 --quiet
expect_fail nan_dump "$NANPAT" -- "$M" dump --ckpt NAN --tokens "$TRAIN_SHARD" --out d.safetensors
# the override loads it as it is, with one warning naming the tensor and the count
override() {  # override NAME STDOUT_PATTERN -- cmd...
  local name=$1 pat=$2; shift 3
  run_cmd 60 "$TMP/$name.out" "$TMP/$name.err" "$@"
  if [ $RC != 0 ]; then fail "$name" "exit $RC [$*]; stderr: $(head -c 300 "$TMP/$name.err" | tr '\n' '|')"
  elif ! grep -q "^moetrain: warning: .*tensor .* holds 1 NaN/Inf value(s), 1 in 1 tensor(s) in all; loaded" "$TMP/$name.err"; then
    fail "$name" "no warning naming the tensor: $(head -c 300 "$TMP/$name.err" | tr '\n' '|')"
  elif [ -n "$pat" ] && ! grep -qE -- "$pat" "$TMP/$name.out"; then fail "$name" "stdout does not match /$pat/: $(head -c 200 "$TMP/$name.out")"
  else ok "$name"; fi
}
override nan_eval_allowed '^val_loss=-?nan' -- "$M" eval --ckpt NAN --data D --problems 2 --windows 2 --allow-nonfinite
override inf_generate_allowed '^1\+1=' -- "$M" generate --ckpt INF --prompt 1+1= --max-new 4 --allow-nonfinite
override nan_dump_allowed '^wrote d\.safetensors' -- "$M" dump --ckpt NAN --tokens "$TRAIN_SHARD" --out d.safetensors --allow-nonfinite
override inf_train_resume_allowed '' -- "$M" train --resume INF --data D --steps 3 --out R_RES3 --quiet --allow-nonfinite

# ---- 6. write errors -------------------------------------------------------------------
expect_fail metrics_dev_full '--metrics /dev/full: write failed: No space left on device' -- "$M" train --config c.json --data D $TR --out R_FULL --metrics /dev/full --quiet
expect_fail stdout_dev_full_train 'stdout: write failed: No space left on device' -- sh -c 'exec "$@" >/dev/full' sh "$M" train --config c.json --data D $TR --out R_FULL2
expect_fail stdout_dev_full_eval 'stdout: write failed: No space left on device' -- sh -c 'exec "$@" >/dev/full' sh "$M" eval --ckpt RUN --data D --problems 2 --windows 2
expect_ok control_metrics_file -- "$M" train --config c.json --data D $TR --out R_MET --metrics met.jsonl --quiet
# a checkpoint over `ulimit -f` (model.safetensors is ~180 KiB, the limit 100 KiB): EFBIG, not
# SIGXFSZ; no step_N.tmp left; the previous checkpoint still `latest` and resumable
cp -r RUN RU
if ! bash -c 'ulimit -f 100 && exec "$@"' bash "$M" train --help >/dev/null 2>&1; then
  echo "note: moetrain does not start under ulimit -f 100 here: the file-size case did not run"
else
  expect_fail ulimit_checkpoint 'RU/step_00000003: checkpoint not saved: .*write failed: File too large' -- bash -c 'ulimit -f 100 && exec "$@"' bash "$M" train --resume RU --data D --steps 4 --save-every 1 --quiet
  left=$(find RU -name '*.tmp')
  if [ -n "$left" ]; then fail ulimit_no_tmp_left "left behind: $left"; else ok ulimit_no_tmp_left; fi
  if [ "$(cat RU/latest)" = step_00000002 ] && [ ! -e RU/step_00000003 ]; then ok ulimit_latest_kept
  else fail ulimit_latest_kept "latest is '$(cat RU/latest)'; $(ls RU | tr '\n' ' ')"; fi
  expect_ok ulimit_resume_after -- "$M" train --resume RU --data D --steps 4 --quiet
  if [ -f RU/step_00000004/checksums.json ]; then ok ulimit_resumed_checkpoint
  else fail ulimit_resumed_checkpoint "no RU/step_00000004"; fi
fi

# ---- 7. sizes that cannot fit: refused up front (seconds, not an allocation) ----------------
expect_fail batch_too_large '--batch 100000000 x --seq 32 needs ~[0-9.]+ GiB of activations \([0-9.]+ GiB in all\), this machine has [0-9.]+ GiB available' --timeout 15 -- "$M" train --config c.json --data D --steps 2 --batch 100000000 --seq 32 --out R_BIG --quiet
expect_fail accum_too_large "--accum 100000000 x --batch 8 x --seq 64 needs ~[0-9.]+ GiB for the step's tokens.*this machine has [0-9.]+ GiB available" --timeout 15 -- "$M" train --config c.json --data D --steps 2 --accum 100000000 --batch 8 --seq 64 --out R_ACC --quiet
expect_fail rl_too_large 'rl: the trainer.s [0-9]+ micro-batches .* need ~[0-9.]+ GiB, this machine has' --timeout 15 -- "$M" rl --init RUN --data D --out R_RLBIG --steps 1 --prompts-per-step 30000000 --group 64 --quiet
expect_fail rl_rows_overflow 'rl: --prompts-per-step 16 x --group 300000000' --timeout 15 -- "$M" rl --init RUN --data D --out R_RLOV --steps 1 --prompts-per-step 16 --group 300000000 --quiet

# ---- MPI: rank 0 refuses the NaN checkpoint, the job ends cleanly -----------------------
source "$SRC/tests/lib/mpirun.sh"
if [ ${#MPI[@]} -eq 0 ]; then
  echo "note: mpirun not found: the 2-rank case did not run"
else
  OMP_NUM_THREADS=1 run_cmd 120 mpi.out mpi.err "${MPI[@]}" -np 2 "$M" train --resume NAN --data D --steps 3 --batch 1 --out R_MPI --quiet
  if [ $RC = 124 ]; then fail mpi_nan_resume "timed out (hang)"
  elif [ $RC = 0 ]; then fail mpi_nan_resume "exit 0"
  elif ! grep -qE "^moetrain: error: rank 0 of 2: $NANPAT" mpi.err; then
    fail mpi_nan_resume "no error from rank 0 naming the tensor: $(head -c 400 mpi.err | tr '\n' '|')"
  else ok mpi_nan_resume; fi
fi

cli_summary
