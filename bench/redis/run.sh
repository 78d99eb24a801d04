#!/usr/bin/env bash
# Spillway's Redis decisions per second for every algorithm Redis decides, against the ceiling
# of the same server: redis-benchmark running EVALSHA of a trivial script (`return 1`) with as
# many clients, plain and pipelined (-P 16).
#   bench/redis/run.sh [CLIENTS] [SECONDS]
# Starts a private redis-server on a free port and prints a Markdown table: one row per
# algorithm (limits far above the load, so every decision is an admission), plus the sliding
# log at a limit that denies about half, since its denials take another path (retry-after).
# Ratios are to both ceilings (the goal: at least 70% of the plain one).
set -euo pipefail
cd "$(dirname "$0")/../.."
clients=${1:-50}
seconds=${2:-5}

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  --dir "$dir" >"$dir/redis.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

cargo build --release -q -p spillway-redis --example decide_bench
bin=${CARGO_TARGET_DIR:-target}/release/examples/decide_bench

sha=$(redis-cli -p "$port" SCRIPT LOAD 'return 1')
# redis-benchmark counts requests, not time: size the run to about $seconds at ~50k/s.
ceiling=$(redis-benchmark -p "$port" -c "$clients" -n $((seconds * 50000)) -q \
  EVALSHA "$sha" 0 | grep -oE '[0-9.]+ requests per second' | cut -d' ' -f1)
# Our multiplexed connection pipelines the loops' calls, which redis-benchmark does only with
# -P; the pipelined run is the stricter ceiling.
pipelined=$(redis-benchmark -p "$port" -c "$clients" -P 16 -n $((seconds * 200000)) -q \
  EVALSHA "$sha" 0 | grep -oE '[0-9.]+ requests per second' | cut -d' ' -f1)

# One run of decide_bench: ALGO LIMIT -> "rate denied_share usec_per_call" on stdout. Each run
# starts from an empty Redis and fresh command statistics, so usec_per_call (Redis's own time
# in EVALSHA) is this algorithm's alone.
measure() {
  redis-cli -p "$port" FLUSHALL >/dev/null
  redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
  local out rate denied usec
  out=$("$bin" "redis://127.0.0.1:$port" "$clients" "$seconds" "$1" "$2")
  rate=$(sed -n 's/^decisions_per_sec=//p' <<<"$out")
  denied=$(sed -n 's/^denied_share=//p' <<<"$out")
  usec=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  echo "$rate $denied ${usec:-0}"
}

rows=()
for algo in token-bucket leaky-bucket fixed-window sliding-window-counter gcra sliding-window-log; do
  rows+=("$algo|1000000|$(measure "$algo" 1000000)")
done
# A limit that denies about half. Each loop admits LIMIT a second, at the admission rate A it
# just showed, and denies in the time left, at D a second: half are denials when
# LIMIT = D (1 - LIMIT / A), that is LIMIT = A D / (A + D). A denial costs the log about half
# of an admission (D = 2A, measured), so LIMIT = 2A / 3; A / 2 denied two thirds.
log_rate=$(cut -d' ' -f1 <<<"${rows[-1]#*|*|}")
half=$(python3 -c "print(max(1, round($log_rate / $clients * 2 / 3)))")
rows+=("sliding-window-log|$half|$(measure sliding-window-log "$half")")

python3 - "$ceiling" "$pipelined" "$clients" "$seconds" "${rows[@]}" <<'PY'
import sys
ceiling, pipelined = float(sys.argv[1]), float(sys.argv[2])
clients, seconds = sys.argv[3], sys.argv[4]
print(f"{clients} clients, {seconds} s per row; limits in units per second per bucket, "
      f"one bucket per client\n")
print("| | decisions/s | of the plain ceiling | of the pipelined ceiling | us in Redis per call | denied |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
print(f"| ceiling: redis-benchmark `EVALSHA` `return 1` | {ceiling:,.0f} | 100% | {ceiling / pipelined:.0%} | | |")
print(f"| ceiling: the same, pipelined `-P 16` | {pipelined:,.0f} | {pipelined / ceiling:.0%} | 100% | | |")
for row in sys.argv[5:]:
    algo, limit, rest = row.split("|")
    rate, denied, usec = map(float, rest.split())
    name = f"{algo}, limit {int(limit):,}/s"
    if denied >= 0.01:
        name += f", denying about half ({denied:.0%})"
    print(f"| {name} | {rate:,.0f} | {rate / ceiling:.0%} | {rate / pipelined:.0%} | {usec:.2f} | {denied:.1%} |")
PY
