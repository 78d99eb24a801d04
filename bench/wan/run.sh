#!/usr/bin/env bash
# The WAN figures of docs/benchmarks.md: bench/wan/wan.py's scenarios, ROUNDS runs each, as
# JSON lines in OUT, then a table of their ranges (min-max over the runs).
#   steady     25, 50 and 75 ms one-way between regions: admitted against the limit
#   partition  25 and 75 ms, one region cut off for 30 s
#   loss       25 ms, 1% of the packets between regions lost
# Usage (as root): bench/wan/run.sh [ROUNDS] [OUT]   (defaults 3 and a temporary file)
# Environment: SPILLWAY (default $CARGO_TARGET_DIR/debug/spillway, built by
# `cargo build -p spillway-cli`).
set -euo pipefail
ROUNDS=${1:-3}
OUT=${2:-$(mktemp)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SPILLWAY=${SPILLWAY:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/spillway}
wan() { python3 "$ROOT/bench/wan/wan.py" "$@" --spillway "$SPILLWAY" --json | tee -a "$OUT"; }
for _ in $(seq "$ROUNDS"); do
  for delay in 25 50 75; do wan steady --delay-ms "$delay"; done
  for delay in 25 75; do wan partition --delay-ms "$delay"; done
  wan loss --delay-ms 25
done
python3 "$ROOT/bench/wan/summary.py" "$OUT"
