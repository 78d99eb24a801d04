#!/usr/bin/env bash
# Envoy's ShouldRateLimit (RLS v3) decided in the sidecar against the same call decided in
# Redis, envoyproxy/ratelimit's model, in one run (docs/benchmarks.md, "Envoy's RLS").
#   bench/rls/run.sh [ROUNDS] [RATE] [SECONDS]      (defaults 8, 2000, 4)
#   IN_FLIGHT=32 CONNECTIONS=4 SAT_SECONDS=2 WARMUP=1 VALUES=1000 LINK_DELAY_US=250 NO_BUILD=1
#   REPORT=FILE PROFILE=release (or dist: the whole-program optimised build, Cargo.toml)
#
# One `spillway proxy --rls-listen` (the binary of PROFILE) with three descriptor buckets, one per
# domain, every call carrying one descriptor (remote_address, 10.x.y.z) going round VALUES
# addresses:
#   local    token-bucket, store local, per address (limit far above the load)
#   control  drop-ratio (store control-plane), one count for the bucket, so its entry has an
#            exact value and its calls all carry that one address (a control-plane bucket holds
#            no count per value); the proxy is standalone
#            (no --aggregator), so no instruction ever comes and its drop ratio stays 0: the
#            decision is the in-process one a linked sidecar makes between instructions
#   redis    fixed-window, store redis, per address: one EVALSHA per call to a private
#            redis-server on a loopback port, as envoyproxy/ratelimit makes one call per request
# and a second proxy with one bucket:
#   redis_link  the same bucket, its Redis (the same server) behind bench/proxy/delay.rs, a relay
#            on loopback holding every byte LINK_DELAY_US (default 250) each way: a Redis across
#            a network link, as envoyproxy/ratelimit's is across a zone. The relay is the wire:
#            its CPU is not counted.
# Each round measures, interleaved: an open loop at RATE calls/s for SECONDS (after WARMUP s of
# the same load) for local, control and redis, then a closed loop of IN_FLIGHT calls for
# SAT_SECONDS for each (decisions/s at saturation); the load client is
# crates/rls/examples/rls_load.rs over CONNECTIONS HTTP/2 connections. CPU per decision is
# utime + stime of the proxy and of redis-server (/proc/PID/stat) over each measured phase,
# divided by its decisions; the load client's own CPU is reported apart and not counted.
# bench/rls/report.py writes the Markdown report to stdout (and REPORT when set); progress goes
# to stderr. It takes about ROUNDS x 3 x (WARMUP + SECONDS + WARMUP + SAT_SECONDS) seconds:
# about 4 minutes by default.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-8}
rate=${2:-2000}
seconds=${3:-4}
in_flight=${IN_FLIGHT:-32}
connections=${CONNECTIONS:-4}
sat_seconds=${SAT_SECONDS:-2}
warmup=${WARMUP:-1}
values=${VALUES:-1000}
link_delay_us=${LINK_DELAY_US:-250}
target_dir=${CARGO_TARGET_DIR:-target}
profile=${PROFILE:-release}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server from Debian" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
fi
if [ -z "${NO_BUILD:-}" ]; then
  cargo build --profile "$profile" -q -p spillway-cli
  cargo build --profile "$profile" -q -p spillway-rls --example rls_load
fi
spillway=$target_dir/$profile/spillway
load=$target_dir/$profile/examples/rls_load

WORK=$(mktemp -d)
PIDS=()
stop() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$WORK"
}
trap stop EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() {
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on 127.0.0.1:$1" >&2
  exit 1
}

redis_port=$(free_port)
rls_port=$(free_port)
http_port=$(free_port)

# Each server in a session of its own (setsid), as bench/proxy/common.sh explains: with
# autogroup scheduling a session is a scheduling group, and the load client stays in ours.
setsid redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$WORK" >"$WORK/redis.log" 2>&1 &
redis_pid=$!
PIDS+=("$redis_pid")
wait_port "$redis_port"

# The link: a relay in a session of its own, std only, built here.
rustc --edition 2021 -O bench/proxy/delay.rs -o "$WORK/delay"
relay_port=$(free_port)
setsid "$WORK/delay" "127.0.0.1:$relay_port" "127.0.0.1:$redis_port" "$link_delay_us" \
  >"$WORK/delay.log" 2>&1 &
PIDS+=("$!")
wait_port "$relay_port"

cat >"$WORK/bench.yaml" <<YAML
version: 1
# A timeout well above any queueing here: a call that timed out would be answered OVER_LIMIT
# (on_store_failure: closed) by the breaker, quicker than Redis, and flatter this path.
redis: { url: "redis://127.0.0.1:$redis_port", timeout: 1s }
services:
  envoy:
    buckets:
      - name: local
        match: { descriptor: { domain: bench_local, entries: [ {key: remote_address} ] } }
        limit: 1000000/s
        algorithm: token-bucket
        store: local
      - name: control
        match: { descriptor: { domain: bench_control, entries: [ {key: remote_address, value: 10.0.0.0} ] } }
        limit: 1000000/s
        algorithm: drop-ratio
      - name: redis
        match: { descriptor: { domain: bench_redis, entries: [ {key: remote_address} ] } }
        limit: 1000000/s
        algorithm: fixed-window
        store: redis
YAML

cat >"$WORK/bench-link.yaml" <<YAML
version: 1
redis: { url: "redis://127.0.0.1:$relay_port", timeout: 1s }
services:
  envoy:
    buckets:
      - name: redis_link
        match: { descriptor: { domain: bench_redis_link, entries: [ {key: remote_address} ] } }
        limit: 1000000/s
        algorithm: fixed-window
        store: redis
YAML

setsid "$spillway" proxy -c "$WORK/bench.yaml" --listen "127.0.0.1:$http_port" \
  --upstream http://127.0.0.1:9 --rls-listen "127.0.0.1:$rls_port" >"$WORK/proxy.log" 2>&1 &
proxy_pid=$!
PIDS+=("$proxy_pid")
wait_port "$rls_port"
link_rls_port=$(free_port)
setsid "$spillway" proxy -c "$WORK/bench-link.yaml" --listen "127.0.0.1:$(free_port)" \
  --upstream http://127.0.0.1:9 --rls-listen "127.0.0.1:$link_rls_port" >"$WORK/proxy-link.log" 2>&1 &
link_proxy_pid=$!
PIDS+=("$link_proxy_pid")
wait_port "$link_rls_port"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(loadavg)
if [ -n "${NO_BUILD:-}" ]; then
  commit="binaries built beforehand (NO_BUILD=1, profile $profile)"
else
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo "an unknown commit")
  git diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null ||
    commit="$commit (with uncommitted changes)"
  commit="$commit, profile $profile"
fi

results=$WORK/results
: >"$results"
# One measured phase: ROUND CONFIG MODE ARGS...; appends "ROUND CONFIG RESULT ..." to results.
phase() {
  local round=$1 config=$2
  shift 2
  local line port=$rls_port pid=$proxy_pid n=$values
  if [ "$config" = redis_link ]; then port=$link_rls_port pid=$link_proxy_pid; fi
  # The control bucket's one address, 10.0.0.0 (the load client's first).
  if [ "$config" = control ]; then n=1; fi
  line=$(timeout 120 "$load" --target "http://127.0.0.1:$port" --domain "bench_$config" \
    --values "$n" --connections "$connections" --warmup "$warmup" \
    --pid "proxy=$pid" --pid "redis=$redis_pid" "$@" | grep '^RESULT ')
  echo "$round $config $line" >>"$results"
  echo "round $round $config: ${line#RESULT }" >&2
}

redis-cli -p "$redis_port" CONFIG RESETSTAT >/dev/null
for round in $(seq "$rounds"); do
  for config in local control redis redis_link; do
    phase "$round" "$config" --rate "$rate" --seconds "$seconds"
  done
  for config in local control redis redis_link; do
    phase "$round" "$config" --in-flight "$in_flight" --seconds "$sat_seconds"
  done
done
load_end=$(loadavg)
evalsha=$(redis-cli -p "$redis_port" INFO commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*usec_per_call=\([0-9.]*\).*/\1 \2/p')
keys=$(redis-cli -p "$redis_port" DBSIZE)
kill -0 "$proxy_pid" 2>/dev/null || { echo "the proxy exited: $(cat "$WORK/proxy.log")" >&2; exit 1; }
kill -0 "$link_proxy_pid" 2>/dev/null ||
  { echo "the linked proxy exited: $(cat "$WORK/proxy-link.log")" >&2; exit 1; }

export ROUNDS="$rounds" RATE="$rate" SECONDS_="$seconds" IN_FLIGHT="$in_flight" \
  CONNECTIONS="$connections" SAT_SECONDS="$sat_seconds" WARMUP="$warmup" VALUES="$values" \
  LINK_DELAY_US="$link_delay_us" \
  COMMIT="$commit" LOAD_START="$load_start" LOAD_END="$load_end" EVALSHA="$evalsha" KEYS="$keys"
export MACHINE="$(nproc) vCPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r), redis-server $(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p')"
report=$(python3 bench/rls/report.py "$results")
echo "$report"
if [ -n "${REPORT:-}" ]; then echo "$report" >"$REPORT"; fi
