#!/usr/bin/env bash
# Spillway's Redis token-bucket decisions per second against the ceiling of the same server:
# redis-benchmark running EVALSHA of a trivial script (`return 1`) with as many clients.
#   bench/redis/run.sh [CLIENTS] [SECONDS]
# Starts a private redis-server on a free port, prints both rates and their ratio (the issue
# asks for at least 70%).
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
# Our multiplexed connection pipelines the 50 loops' calls, which redis-benchmark does only
# with -P; the pipelined run is the stricter ceiling.
pipelined=$(redis-benchmark -p "$port" -c "$clients" -P 16 -n $((seconds * 200000)) -q \
  EVALSHA "$sha" 0 | grep -oE '[0-9.]+ requests per second' | cut -d' ' -f1)
ours=$("$bin" "redis://127.0.0.1:$port" "$clients" "$seconds" | sed -n 's/^decisions_per_sec=//p')

python3 - "$ceiling" "$pipelined" "$ours" "$clients" <<'PY'
import sys
ceiling, pipelined, ours = map(float, sys.argv[1:4])
print(f"clients: {sys.argv[4]}")
print(f"ceiling, redis-benchmark EVALSHA 'return 1':        {ceiling:,.0f}/s")
print(f"ceiling, the same pipelined (-P 16):                {pipelined:,.0f}/s")
print(f"spillway token-bucket decisions (one connection):   {ours:,.0f}/s")
print(f"ratio: {ours / ceiling:.0%} of the plain ceiling, {ours / pipelined:.0%} of the pipelined one (target >= 70%)")
PY
