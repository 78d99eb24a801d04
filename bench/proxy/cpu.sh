#!/usr/bin/env bash
# What each reverse proxy spends per request: nginx (limit_req, a process of its own with
# NGINX_WORKERS workers) and `spillway proxy` (a local token bucket that is not hit,
# SPILLWAY_WORKERS serving threads) in front of the same upstream (nginx, one worker, answering
# 200 from memory), driven closed loop by `wrk -t2 -c32` in turns.
#
# For each turn: requests/s, and per request the proxy's CPU time in user space and in the
# kernel (utime and stime of every thread of its processes, from /proc) and its context switches
# (voluntary: it slept; involuntary: it was preempted). The kernel's share is the sockets, the
# wakeups and the switches; the user space share is the proxy's own code.
#
# Usage: bench/proxy/cpu.sh [SECONDS] [ROUNDS]   (defaults 5 and 3)
# Installs wrk and nginx-light from Debian when missing; NO_BUILD=1 uses the spillway binary
# already built in release mode.
set -euo pipefail

SECONDS_PER_RUN=${1:-5}
ROUNDS=${2:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
# shellcheck source=bench/proxy/common.sh
. "$ROOT/bench/proxy/common.sh"
trap stop_started EXIT
need wrk wrk
need nginx nginx-light
UPSTREAM=$(free_port); NGINX_PROXY=$(free_port); PROXY=$(free_port)

start_nginx

if [ -z "${NO_BUILD:-}" ]; then
  echo "building spillway (release)" >&2
  (cd "$ROOT" && cargo build --release -q -p spillway-cli)
fi
SPILLWAY=${CARGO_TARGET_DIR:-$ROOT/target}/release/spillway
cat > "$WORK/spillway.yaml" <<YAML
version: 1
services:
  bench:
    buckets:
      - { name: all, limit: 100000000/s, algorithm: token-bucket, store: local }
YAML
RUST_LOG=warn TOKIO_WORKER_THREADS=${SPILLWAY_WORKERS:-2} setsid "$SPILLWAY" proxy -c "$WORK/spillway.yaml" \
  --listen "127.0.0.1:$PROXY" --upstream "http://127.0.0.1:$UPSTREAM" &
SPILLWAY_PID=$!
PIDS+=("$SPILLWAY_PID")
wait_port 127.0.0.1 "$PROXY"
# The nginx proxy's CPU is its workers'; the master only waits.
for _ in $(seq 50); do [ -n "$(pgrep -P "$(cat "$WORK/proxy.pid")")" ] && break; sleep 0.1; done
NGINX_WORKER_PIDS=$(pgrep -P "$(cat "$WORK/proxy.pid")" | tr '\n' ' ')

# user ticks, system ticks, voluntary and involuntary switches, summed over the threads of $@
snapshot() {
  local pid task user=0 sys=0 vol=0 invol=0
  for pid in "$@"; do
    for task in /proc/"$pid"/task/*; do
      read -r -a stat < <(sed 's/^.*) //' "$task/stat")
      user=$((user + stat[11])); sys=$((sys + stat[12]))
      vol=$((vol + $(awk '/^voluntary_ctxt_switches/ { print $2 }' "$task/status")))
      invol=$((invol + $(awk '/^nonvoluntary_ctxt_switches/ { print $2 }' "$task/status")))
    done
  done
  echo "$user $sys $vol $invol"
}
measure() { # $1: name, $2: port, $3...: the proxy's pids
  local name=$1 port=$2 before after out
  shift 2
  before=$(snapshot "$@")
  out=$(wrk -t2 -c32 -d"${SECONDS_PER_RUN}s" "http://127.0.0.1:$port/")
  after=$(snapshot "$@")
  awk -v name="$name" -v a="$before" -v b="$after" -v hz="$(getconf CLK_TCK)" \
    -v n="$(echo "$out" | awk '/requests in/ { print $1 }')" \
    -v rps="$(echo "$out" | awk '/Requests\/sec/ { print $2 }')" 'BEGIN {
      split(a, A, " "); split(b, B, " ");
      user = (B[1] - A[1]) / hz * 1e6 / n; sys = (B[2] - A[2]) / hz * 1e6 / n;
      printf "| %s | %.0f | %.1f us | %.1f us | %.1f us | %.2f | %.2f |\n",
        name, rps, user + sys, user, sys, (B[3] - A[3]) / n, (B[4] - A[4]) / n
    }'
}

echo "wrk -t2 -c32 -d${SECONDS_PER_RUN}s, $ROUNDS rounds, turns interleaved; per request:"
echo
echo "| proxy | requests/s | CPU | user space | kernel | voluntary switches | involuntary switches |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for _ in $(seq "$ROUNDS"); do
  # shellcheck disable=SC2086
  measure "nginx, ${NGINX_WORKERS:-2} workers" "$NGINX_PROXY" $NGINX_WORKER_PIDS
  measure "spillway, ${SPILLWAY_WORKERS:-2} threads" "$PROXY" "$SPILLWAY_PID"
done
echo
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
