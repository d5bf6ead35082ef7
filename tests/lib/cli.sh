# tests/lib/cli.sh — the harness of the CLI error tests (test_cli_errors, test_write_errors,
# test_bad_inputs): every bad input must give ONE "moetrain: error: ..." line, a non-zero
# exit that is not a signal, and never a hang or a silent success. Source it after
# `set -u` with NAME set (the scratch folder's prefix) and the moetrain path in $1; it sets
# MOETRAIN and M (absolute), SRC, PY, TMP (the scratch folder, the working directory),
# ok / fail (counted), run_cmd, expect_fail, expect_ok; cli_summary ends the test.
MOETRAIN=${1:?usage: bash tests/$NAME.sh /path/to/moetrain}
case "$MOETRAIN" in /*) ;; *) MOETRAIN="$PWD/$MOETRAIN" ;; esac
[ -x "$MOETRAIN" ] || { echo "FAIL: $MOETRAIN is not an executable"; exit 1; }
SRC=${MT_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "FAIL: python3 is needed to build the test inputs"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

mkdir -p "${MT_TEST_TMP:-/tmp}"
TMP=$(mktemp -d "${MT_TEST_TMP:-/tmp}/$NAME.XXXXXX") || exit 1
cd "$TMP" || exit 1
M="$MOETRAIN"

PASS=0
FAILS=()
ok()   { echo "ok $1"; PASS=$((PASS + 1)); }
fail() { echo "FAIL $1: $2"; FAILS+=("$1"); }
have_timeout=0; command -v timeout >/dev/null 2>&1 && have_timeout=1

# run_cmd SECONDS OUT ERR cmd...  -> sets RC (124 = timed out when `timeout` exists)
run_cmd() {
  local secs=$1 out=$2 err=$3; shift 3
  if [ $have_timeout = 1 ]; then
    timeout -k 5 "$secs" "$@" >"$out" 2>"$err" </dev/null; RC=$?
  else
    "$@" >"$out" 2>"$err" </dev/null; RC=$?
  fi
}

# expect_fail NAME PATTERN [--lines N] [--timeout S] -- cmd...
#   exit code in 1..127 (not a signal, not a timeout); exactly one stderr line starting
#   with "moetrain: error:", at most 400 characters, matching PATTERN (grep -E); stderr at
#   most N lines in total (default 3: room for a warning such as "no checksums.json").
expect_fail() {
  local name=$1 pat=$2; shift 2
  local maxlines=3 secs=30
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --lines) maxlines=$2; shift 2 ;;
      --timeout) secs=$2; shift 2 ;;
      *) echo "expect_fail: bad option $1" >&2; exit 2 ;;
    esac
  done
  shift  # --
  local out="$TMP/$name.out" err="$TMP/$name.err"
  run_cmd "$secs" "$out" "$err" "$@"
  local nerr nlines line
  nerr=$(grep -c '^moetrain: error:' "$err")
  nlines=$(wc -l <"$err")
  line=$(grep -m1 '^moetrain: error:' "$err")
  if [ $have_timeout = 1 ] && [ $RC = 124 ]; then
    fail "$name" "timed out after ${secs}s (hang) [$*]"
  elif [ $RC = 0 ]; then
    fail "$name" "exit 0, expected an error [$*]; stderr: $(head -c 300 "$err" | tr '\n' '|')"
  elif [ $RC -ge 128 ]; then
    fail "$name" "killed by signal $((RC - 128)) (exit $RC) [$*]; stderr: $(head -c 300 "$err" | tr '\n' '|')"
  elif [ "$nerr" != 1 ]; then
    fail "$name" "expected exactly one 'moetrain: error:' line, got $nerr; stderr: $(head -c 300 "$err" | tr '\n' '|')"
  elif [ "$nlines" -gt "$maxlines" ]; then
    fail "$name" "stderr has $nlines lines (max $maxlines): $(head -c 300 "$err" | tr '\n' '|')"
  elif [ ${#line} -gt 400 ]; then
    fail "$name" "error line is ${#line} characters long: ${line:0:200}..."
  elif ! printf '%s\n' "$line" | grep -qE -- "$pat"; then
    fail "$name" "error line does not match /$pat/: $line"
  else
    ok "$name"
  fi
}

# expect_ok NAME [STDERR_PATTERN] -- cmd...   (positive controls: exit 0, and stderr
# matching the pattern when one is given)
expect_ok() {
  local name=$1 pat=""
  shift
  if [ "$1" != "--" ]; then pat=$1; shift; fi
  shift
  run_cmd 120 "$TMP/$name.out" "$TMP/$name.err" "$@"
  if [ $RC != 0 ]; then fail "$name" "exit $RC [$*]; stderr: $(head -c 300 "$TMP/$name.err" | tr '\n' '|')"
  elif [ -n "$pat" ] && ! grep -qE -- "$pat" "$TMP/$name.err"; then
    fail "$name" "stderr does not match /$pat/: $(head -c 300 "$TMP/$name.err" | tr '\n' '|')"
  else ok "$name"; fi
}

# c.json: demo.json with d 32, 2 layers (layer 1 MoE, 4 experts), 64 positions
cli_tiny_config() {
  "$PY" - "$SRC/configs/demo.json" <<'EOF' || { echo "FAIL: cannot write c.json"; exit 1; }
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
         head_dim=16, intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=32, max_position_embeddings=64)
json.dump(c, open("c.json", "w"), indent=1)
EOF
}

# the summary line; the scratch folder is removed when everything passed
cli_summary() {
  echo "${PASS} passed, ${#FAILS[@]} failed"
  if [ ${#FAILS[@]} -gt 0 ]; then
    echo "failed: ${FAILS[*]}"
    echo "(scratch kept in $TMP)"
    exit 1
  fi
  cd / && rm -rf "$TMP"
  exit 0
}
