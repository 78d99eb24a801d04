#!/usr/bin/env bash
# The concurrency-limit benchmark (docs/benchmarks.md), on loopback: a real upstream of WORKERS
# workers that take SERVICE_MS each (upstream.rs beside this script: capacity WORKERS / SERVICE,
# and past its workers latency grows with what is in flight), behind the proxy (the `serve`
# example of spillway-proxy, release build), offered OVERLOAD (default 2) times its capacity at a
# fixed open-loop rate (the `open_loop` example: a request every 1/RATE s whatever came back,
# each giving up after TIMEOUT_MS) for SECONDS, of which the first WARMUP are not counted:
#   unloaded   a quarter of the capacity, no limit: the unloaded p99
#   none       no concurrency section
#   fixed N    `concurrency: {algorithm: fixed, limit: N}` for each N of SWEEP
#   gradient   `concurrency: {}` (gradient with its defaults: no tuning)
#   vegas      `concurrency: {algorithm: vegas}`
# Each row gets a fresh upstream and proxy (a queue left by the row before would carry over).
# Goodput is 2xx answers within the deadline per second; p99 is over the admitted requests (not
# refused with 503), a timed-out one counting at the deadline. ROUNDS (default 2) repeats every
# row; the report gives the range over rounds. Goal: gradient's goodput within 10% of the best
# fixed limit's, with its p99 at most 2x the unloaded p99.
#
# Usage: bench/concurrency/run.sh [REPORT.md] [CHART.svg]
# (defaults: target/bench-concurrency/report.md and .svg). About 11 s a row: with the defaults,
# 13 rows x 2 rounds, under five minutes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/target/bench-concurrency/report.md}
CHART=${2:-${OUT%.md}.svg}
WORKERS=${WORKERS:-16}
SERVICE_MS=${SERVICE_MS:-20}
OVERLOAD=${OVERLOAD:-2}
SECONDS_PER_ROW=${SECONDS_PER_ROW:-11}
WARMUP=${WARMUP:-4}
TIMEOUT_MS=${TIMEOUT_MS:-1000}
ROUNDS=${ROUNDS:-2}
SWEEP=${SWEEP:-"8 12 16 20 24 32 48 64"}
PROXY_WORKERS=${PROXY_WORKERS:-1}
WORK=$(mktemp -d)
mkdir -p "$(dirname "$OUT")"
ulimit -n 65536 2>/dev/null || true

CAPACITY=$(( WORKERS * 1000 / SERVICE_MS ))
RATE=$(( CAPACITY * OVERLOAD ))
UNLOADED_RATE=$(( CAPACITY / 4 ))

echo "building the proxy and the load generator (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p spillway-proxy --example serve --example open_loop)
rustc -O --edition 2021 "$ROOT/bench/concurrency/upstream.rs" -o "$WORK/upstream"
SERVE="$ROOT/target/release/examples/serve"
LOAD="$ROOT/target/release/examples/open_loop"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# row NAME RATE CONFIG_YAML -> appends "NAME round goodput p50 p99 ok refused timeouts errors"
row() {
  local name=$1 rate=$2 yaml=$3 round=$4
  local up_port proxy_port
  up_port=$(free_port); proxy_port=$(free_port)
  printf '%s' "$yaml" > "$WORK/config.yaml"
  "$WORK/upstream" "$up_port" "$WORKERS" "$SERVICE_MS" > /dev/null & local up=$!
  "$SERVE" "$WORK/config.yaml" "127.0.0.1:$proxy_port" "http://127.0.0.1:$up_port" "$PROXY_WORKERS" > /dev/null 2>"$WORK/proxy.log" & local px=$!
  pids=("$up" "$px")
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$proxy_port") 2>/dev/null && break
    sleep 0.05
  done
  local result
  result=$("$LOAD" "http://127.0.0.1:$proxy_port" "$rate" "$SECONDS_PER_ROW" "$TIMEOUT_MS" "$WARMUP" | awk '/^RESULT/ {print $2, $3, $4, $5, $6, $7, $8}')
  kill "$px" "$up" 2>/dev/null || true
  wait "$px" "$up" 2>/dev/null || true
  pids=()
  echo "$name $round $result" | tee -a "$WORK/rows" >&2
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
  row unloaded "$UNLOADED_RATE" "version: 1" "$round"
  row none "$RATE" "version: 1" "$round"
  for n in $SWEEP; do
    row "fixed-$n" "$RATE" "version: 1
concurrency: { algorithm: fixed, limit: $n }" "$round"
  done
  row gradient "$RATE" "version: 1
concurrency: {}" "$round"
  row vegas "$RATE" "version: 1
concurrency: { algorithm: vegas }" "$round"
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

python3 "$ROOT/bench/concurrency/report.py" "$WORK/rows" "$OUT" "$CHART" \
  "$WORKERS" "$SERVICE_MS" "$RATE" "$CAPACITY" "$TIMEOUT_MS" "$SECONDS_PER_ROW" "$WARMUP" \
  "$ROUNDS" "$(nproc)" "$LOAD_BEFORE" "$LOAD_AFTER"
cat "$OUT"
