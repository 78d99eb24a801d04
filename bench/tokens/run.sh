#!/usr/bin/env bash
# A global token budget in Redis, measured (docs/token-budgets.md, "Accuracy measured"): four
# sidecars in front of a fake LLM API (`spillway demo --scenario tokens`), one budget of BUDGET
# tokens a second in `store: redis`, offered OFFERED times over, answers of 100 to 2,000 tokens,
# half of them streamed (SSE with a final usage event), for SECONDS, RUNS times. Each run starts
# on an empty Redis (a private redis-server on a free loopback port, flushed between runs) and
# prints the demo's summary: tokens admitted against what the budget allows (rate x seconds +
# burst), requests refused, and the wrongful refusals (refused while the budget, replayed from
# the answers' tokens as they were debited, had room).
#   bench/tokens/run.sh [RUNS] [SECONDS]      (defaults 3, 60)
#   BUDGET=10000 OFFERED=4 SIDECARS=4 STREAMED=0.5 SPILLWAY=target/debug/spillway
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
seconds=${2:-60}
budget=${BUDGET:-10000}
offered=${OFFERED:-4}
sidecars=${SIDECARS:-4}
streamed=${STREAMED:-0.5}
spillway=${SPILLWAY:-${CARGO_TARGET_DIR:-target}/debug/spillway}
if [[ -z ${SPILLWAY:-} ]]; then
  cargo build -q -p spillway-cli --bin spillway
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
redis=$!
trap 'kill "$redis" 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
for run in $(seq "$runs"); do
  redis-cli -p "$port" flushall >/dev/null
  echo "run $run of $runs: $sidecars sidecars, $budget tokens/s in redis, ${offered}x offered, $seconds s" >&2
  "$spillway" demo --scenario tokens --seconds "$seconds" --sidecars "$sidecars" --keys 1 \
    --budget "$budget" --offered "$offered" --streamed "$streamed" \
    --redis-url "redis://127.0.0.1:$port"
done
