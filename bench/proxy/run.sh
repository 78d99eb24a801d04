#!/usr/bin/env bash
# The proxy benchmark: on loopback, in one run, against one small upstream (nginx
# answering 200 from memory).
#
# Closed loop (wrk: as fast as answers come back), for throughput:
#   direct             wrk -> upstream
#   nginx limit_req    wrk -> nginx (reverse proxy, limit_req far above the load) -> upstream
#   spillway           wrk -> spillway proxy (a local token bucket far above the load) -> upstream
#   redis per request  the same proxy with a store: redis token bucket far above the load: one
#                      EVALSHA round trip per request, the Redis-per-request limiter
# Open loop (the `paced` example of spillway-proxy: a fixed offered rate R, bounded count), for
# latency at a load every path carries, R being half the Redis baseline's closed-loop rate:
#   the same paths, plus spillway with no buckets at all (the proxy hop alone, so what each
#   limiter adds to the same proxy reads apart from the hop), and spillway with a local bucket of
#   R / 1.5 (offered 1.5x).
# Redis across a network: on loopback a Redis round trip is as cheap as it ever gets, and Uber's
# global rate limiter (GRL) was compared against a Redis across the network. So the
# Redis-per-request rows are measured again against a second redis-server in a network namespace
# of its own, behind a veth pair whose link holds every packet LINK_DELAY_US (default 250 us)
# each way: a 0.5 ms round trip, typical within one zone of a cloud region (0.1 to 0.5 ms).
# With `sch_netem` in the kernel the delay is
# `tc qdisc ... netem delay` on both ends of the veth and the proxy dials the namespace's address
# (10.254.x.2, private to this machine); without it (some VM and container kernels) the delay is
# `delay.rs` beside this script, a relay on 127.0.0.1 that holds each chunk for the delay in
# each direction before sending it on over the veth. The open-loop rows (all but the 1.5x one)
# are measured again at the same offered rate, next to each other.
# Redis shared by a fleet: GRL's Redis served a whole fleet and queued under its load, which an
# idle Redis behind a constant-delay link does not model. So the same open-loop rows are
# measured once more while `fleet.rs` beside this script (std-only, built with rustc -O) sends
# the networked Redis EVALSHA calls of the same token bucket script from four other connections
# at FLEET_SHARE (default 0.5) of the capacity it measured just before (its calls per second with
# 256 pipelined calls in flight per connection), during every row of that table alike, so the
# CPU the fleet takes from the two cores is the same for all three rows.
# Requests/s and p50/p99/p99.5 latency are reported as ratios to direct (of the same loop), in
# Markdown on stdout (kept under bench/proxy/runs/, summed up in docs/benchmarks.md, "Proxy"),
# with the goal for the tail ("Added tail": spillway's added p99.5 over direct at most 10% of the
# Redis-per-request limiter's) and how much lower spillway's own p99.5 and p50 are than the
# Redis path's ("End to end").
#
# Usage: bench/proxy/run.sh [SECONDS] [CONNECTIONS]   (defaults 10 and 32)
# ROUNDS sets how many times each comparison is measured (default 3; the tables show medians).
# SPILLWAY_WORKERS sets the proxy's serving threads (default 2, one per core here), NGINX_WORKERS
# the nginx reverse proxy's worker processes (default 2, the same).
# FLEET_SHARE sets the fleet's share of the networked Redis's capacity (default 0.5).
# LINK_DELAY_US sets the one-way delay to the networked Redis (default 250).
# CHART=FILE.svg draws the open-loop tables into FILE.svg (bench/proxy/chart.rs, which also
# draws a saved report: rustc -O bench/proxy/chart.rs -o chart && ./chart REPORT.md > FILE.svg).
# Runs as root (network namespaces). Installs wrk, nginx, redis-server, redis-tools and iproute2
# from Debian when missing; builds spillway in release mode.
set -euo pipefail

SECONDS_PER_RUN=${1:-10}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${2:-32}
THREADS=2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
LINK_DELAY_US=${LINK_DELAY_US:-250}
# The networked Redis: a namespace and a veth pair named after this run, on a /30 of 10.254/16
# that exists only between them.
NS="spw-bench-$$"
VETH_HOST="spw$$h"; VETH_NS="spw$$n"
HOST_ADDR="10.254.$(( $$ % 250 )).1"; NS_ADDR="10.254.$(( $$ % 250 )).2"
# shellcheck source=bench/proxy/common.sh
. "$ROOT/bench/proxy/common.sh"
cleanup() {
  stop_started
  ip link del "$VETH_HOST" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT

need wrk wrk
need nginx nginx-light
need redis-server redis-server
need redis-benchmark redis-tools
need ip iproute2
UPSTREAM=$(free_port); NGINX_PROXY=$(free_port); PROXY=$(free_port); ADMIN=$(free_port)
REDIS=$(free_port)

setsid redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --logfile "$WORK/redis.log" --dir "$WORK" &
PIDS+=("$!")
wait_port 127.0.0.1 "$REDIS"
REDIS_URL="redis://127.0.0.1:$REDIS"

start_nginx

if [ -z "${NO_BUILD:-}" ]; then # NO_BUILD=1 measures the binaries already built
  echo "building spillway and the paced load generator (release)" >&2
  (cd "$ROOT" && cargo build --release -q -p spillway-cli \
    && cargo build --release -q -p spillway-proxy --example paced)
fi
SPILLWAY=${CARGO_TARGET_DIR:-$ROOT/target}/release/spillway
PACED=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/paced

start_spillway() { # $1: limit (or "none": no buckets), $2: store (local or redis), $3: burst (default: the limit's count)
  if [ "$1" = none ]; then
    printf 'version: 1\nservices: {}\n' > "$WORK/spillway.yaml"
  else
    cat > "$WORK/spillway.yaml" <<YAML
version: 1
redis: { url: "$REDIS_URL", timeout: 1s }
services:
  bench:
    buckets:
      - { name: all, limit: $1, algorithm: token-bucket, store: $2${3:+, burst: $3} }
YAML
  fi
  RUST_LOG=warn TOKIO_WORKER_THREADS=${SPILLWAY_WORKERS:-2} setsid "$SPILLWAY" proxy -c "$WORK/spillway.yaml" --listen "127.0.0.1:$PROXY" \
    --upstream "http://127.0.0.1:$UPSTREAM" --admin "127.0.0.1:$ADMIN" &
  SPILLWAY_PID=$!
  PIDS+=("$SPILLWAY_PID")
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && return
    sleep 0.1
  done
  echo "spillway did not start" >&2; exit 1
}
stop_spillway() { kill -TERM "$SPILLWAY_PID"; wait "$SPILLWAY_PID" 2>/dev/null || true; }

# wrk prints one line: requests/s, p50, p99, p99.5 (microseconds), non-2xx responses.
cat > "$WORK/report.lua" <<'LUA'
done = function(summary, latency, requests)
  local non2xx = summary.errors.status
  io.write(string.format("RESULT %.1f %d %d %d %d %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency:percentile(99.5),
    non2xx, summary.requests))
end
LUA
measure() { # $1: port
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" -s "$WORK/report.lua" \
    "http://127.0.0.1:$1/" | awk '/^RESULT/ { $1=""; print }'
}

paced() { # $1: port, $2: rate
  "$PACED" "http://127.0.0.1:$1/" "$2" "$SECONDS_PER_RUN" "$CONNECTIONS" | awk '/^RESULT/ { $1=""; print }'
}

# Every comparison is measured ROUNDS times, its rows interleaved within each round, and each
# table shows the field-wise median over the rounds (each figure the middle one of its rounds):
# the two cores are shared, so one stall moves one row of one round by milliseconds. Each
# round's own verdict is printed after the tables.
median() { # $@: result lines -> one line of field-wise medians
  local n=$# f out=""
  for f in 1 2 3 4 5 6; do
    out="$out $(printf '%s\n' "$@" | awk -v f="$f" '{ print $f }' | sort -g | awk -v m=$(( (n + 1) / 2 )) 'NR == m')"
  done
  echo $out
}
NOTES=()
D_R=(); N_R=(); S_R=()
for r in $(seq "$ROUNDS"); do
  echo "closed loop, round $r: direct" >&2;          D_R+=("$(measure "$UPSTREAM")")
  echo "closed loop, round $r: nginx limit_req" >&2; N_R+=("$(measure "$NGINX_PROXY")")
  start_spillway "100000000/s" local
  echo "closed loop, round $r: spillway" >&2;        S_R+=("$(measure "$PROXY")")
  stop_spillway
  NOTES+=("closed loop, round $r: $(awk -v d="${D_R[-1]}" -v n="${N_R[-1]}" -v s="${S_R[-1]}" 'BEGIN {
    split(d, D, " "); split(n, N, " "); split(s, S, " ");
    printf "direct %.0f/s; nginx %.2fx, spillway %.2fx of direct: spillway at %.2fx of nginx", D[1], N[1] / D[1], S[1] / D[1], S[1] / N[1] }')")
done
DIRECT=$(median "${D_R[@]}"); NGINX_R=$(median "${N_R[@]}"); SPILL=$(median "${S_R[@]}")
start_spillway "100000000/s" redis
echo "closed loop: redis per request" >&2; REDIS_R=$(measure "$PROXY")
stop_spillway

# The open loop's rate: half of what the Redis baseline carried, so every path keeps up.
RATE=$(echo "$REDIS_R" | awk '{ printf "%d", int($1 / 2 / 1000) * 1000 }')
LIMIT=$(awk -v r="$RATE" 'BEGIN { printf "%d/s", r / 1.5 }')
# A tenth of a second of tokens, so the full bucket at the start hardly dents the 33% to drop.
BURST=$(awk -v r="$RATE" 'BEGIN { printf "%d", r / 15 }')
open_rounds() { # $1: rate, $2: which table, $3: a wrapper for paced (with_fleet) or ""
  local r d n p s x
  OD=(); ON=(); OP=(); OS=(); OR=()
  for r in $(seq "$ROUNDS"); do
    echo "open loop at $1/s ($2), round $r: direct" >&2; d=$(${3:-} paced "$UPSTREAM" "$1")
    echo "open loop ($2), round $r: nginx limit_req" >&2; n=$(${3:-} paced "$NGINX_PROXY" "$1")
    start_spillway none local
    echo "open loop ($2), round $r: spillway, no buckets" >&2; p=$(${3:-} paced "$PROXY" "$1")
    stop_spillway
    start_spillway "100000000/s" local
    echo "open loop ($2), round $r: spillway" >&2; s=$(${3:-} paced "$PROXY" "$1")
    stop_spillway
    start_spillway "100000000/s" redis
    echo "open loop ($2), round $r: redis per request" >&2; x=$(${3:-} paced "$PROXY" "$1")
    stop_spillway
    OD+=("$d"); ON+=("$n"); OP+=("$p"); OS+=("$s"); OR+=("$x")
    NOTES+=("open loop ($2), round $r: $(goal "$d" "$s" "$x"); $(fell "$s" "$x"); $(hop "$d" "$n" "$s"); $(limiter "$p" "$s" "$x")")
  done
}
goal() { # $1: direct, $2: spillway, $3: redis per request
  awk -v d="$1" -v s="$2" -v r="$3" 'BEGIN {
    split(d, D, " "); split(s, S, " "); split(r, R, " ");
    sa = (S[4] - D[4]) / 1000; ra = (R[4] - D[4]) / 1000;
    share = (ra > 0) ? 100 * sa / ra : 0;
    verdict = (ra <= 0) ? "no verdict, the Redis row came out below direct" \
      : (sa < 0) ? "met, but only as noise: spillway came out below direct" \
      : (sa <= 0.1 * ra) ? "met" : "not met";
    printf "added p99.5: spillway %.2f ms, Redis per request %.2f ms: %.0f%% (goal at most 10%%: %s)\n",
      sa, ra, share, verdict
  }'
}
hop() { # $1: direct, $2: nginx, $3: spillway -> the two proxies' added p99.5
  awk -v d="$1" -v n="$2" -v s="$3" 'BEGIN {
    split(d, D, " "); split(n, N, " "); split(s, S, " ");
    printf "the hop, added p99.5: nginx %.2f ms, spillway %.2f ms", (N[4] - D[4]) / 1000, (S[4] - D[4]) / 1000
  }'
}
fell() { # $1: spillway, $2: redis per request -> how much lower spillway's own latency is
  # than the Redis-per-request limiter's, end to end (GRL: p99.5 down by up to 90%, p50 about 1 ms)
  awk -v s="$1" -v r="$2" 'BEGIN {
    split(s, S, " "); split(r, R, " ");
    printf "p99.5: spillway %.2f ms, Redis per request %.2f ms: %.0f%% lower; p50 %.2f ms lower",
      S[4] / 1000, R[4] / 1000, (R[4] > 0) ? 100 * (R[4] - S[4]) / R[4] : 0, (R[2] - S[2]) / 1000
  }'
}
limiter() { # $1: spillway with no buckets, $2: spillway, $3: redis per request -> what each limiter adds to the proxy
  awk -v p="$1" -v s="$2" -v r="$3" 'BEGIN {
    split(p, P, " "); split(s, S, " "); split(r, R, " ");
    printf "the limiter alone, added p99.5 over the same proxy without buckets: spillway %.2f ms, Redis per request %.2f ms",
      (S[4] - P[4]) / 1000, (R[4] - P[4]) / 1000
  }'
}
medians() { # the open-loop medians of the last open_rounds, into $1_DIRECT, $1_NGINX, $1_BARE, $1_SPILL, $1_REDIS
  printf -v "$1_DIRECT" '%s' "$(median "${OD[@]}")"; printf -v "$1_NGINX" '%s' "$(median "${ON[@]}")"
  printf -v "$1_BARE" '%s' "$(median "${OP[@]}")"; printf -v "$1_SPILL" '%s' "$(median "${OS[@]}")"
  printf -v "$1_REDIS" '%s' "$(median "${OR[@]}")"
}
open_rounds "$RATE" "Redis on loopback" ""
medians P
start_spillway "$LIMIT" local "$BURST"
echo "open loop: spillway at 1.5x ($LIMIT)" >&2; P_OVER=$(paced "$PROXY" "$RATE")
stop_spillway

# Redis across a network: its own namespace behind a veth pair with a delayed link.
ip netns add "$NS"
ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
ip link set "$VETH_NS" netns "$NS"
ip addr add "$HOST_ADDR/30" dev "$VETH_HOST"; ip link set "$VETH_HOST" up
ip -n "$NS" addr add "$NS_ADDR/30" dev "$VETH_NS"; ip -n "$NS" link set "$VETH_NS" up
ip -n "$NS" link set lo up
ip netns exec "$NS" setsid redis-server --port 6379 --bind "$NS_ADDR" --protected-mode no --save "" \
  --appendonly no --daemonize no --logfile "$WORK/redis-net.log" --dir "$WORK" &
PIDS+=("$!")
wait_port "$NS_ADDR" 6379
if tc qdisc add dev "$VETH_HOST" root netem delay "${LINK_DELAY_US}us" 2>/dev/null \
  && ip netns exec "$NS" tc qdisc add dev "$VETH_NS" root netem delay "${LINK_DELAY_US}us"; then
  LINK="tc netem delay ${LINK_DELAY_US}us on both ends of a veth pair"
  NET_HOST=$NS_ADDR; NET_PORT=6379
else
  echo "no sch_netem in this kernel: delaying in a relay (bench/proxy/delay.rs)" >&2
  tc qdisc del dev "$VETH_HOST" root 2>/dev/null || true
  rustc --edition 2021 -O "$ROOT/bench/proxy/delay.rs" -o "$WORK/delay"
  NET_HOST=127.0.0.1; NET_PORT=$(free_port)
  "$WORK/delay" "127.0.0.1:$NET_PORT" "$NS_ADDR:6379" "$LINK_DELAY_US" &
  PIDS+=("$!")
  wait_port 127.0.0.1 "$NET_PORT"
  LINK="a veth pair, ${LINK_DELAY_US}us each way held by the relay bench/proxy/delay.rs on 127.0.0.1 (no sch_netem in this kernel)"
fi
ping_rtt() { # $1: host, $2: port -> p50 and p99 of PING over one connection, in ms
  redis-benchmark -h "$1" -p "$2" -c 1 -n 2000 -t ping --csv --precision 3 2>/dev/null \
    | awk -F'"' '/PING_MBULK/ { printf "p50 %s ms, p99 %s ms", $10, $14 }'
}
RTT_LOOPBACK=$(ping_rtt 127.0.0.1 "$REDIS")
RTT_NET=$(ping_rtt "$NET_HOST" "$NET_PORT")
REDIS_URL="redis://$NET_HOST:$NET_PORT"
start_spillway "100000000/s" redis
echo "closed loop: redis per request across the link" >&2; NET_REDIS_R=$(measure "$PROXY")
stop_spillway
# The same offered rate as on loopback, unless the networked baseline carries less than twice it.
NET_RATE=$(echo "$NET_REDIS_R" | awk -v r="$RATE" '{ h = int($1 / 2 / 1000) * 1000; printf "%d", h < r ? h : r }')
open_rounds "$NET_RATE" "Redis across the link" ""
medians N

# The rest of the fleet on the networked Redis: its capacity first, then the same open-loop rows
# with the fleet sending FLEET_SHARE of it during each one.
FLEET_SHARE=${FLEET_SHARE:-0.5}
rustc --edition 2021 -O "$ROOT/bench/proxy/fleet.rs" -o "$WORK/fleet"
SHA=$(redis-cli -h "$NS_ADDR" -p 6379 -x SCRIPT LOAD < "$ROOT/crates/redis/src/lua/token_bucket.lua")
FLEET_CAPACITY=$("$WORK/fleet" "$NS_ADDR:6379" "$SHA" 10000000 3 | awk '/^FLEET/ { print $2 }')
FLEET_RATE=$(awk -v c="$FLEET_CAPACITY" -v s="$FLEET_SHARE" 'BEGIN { printf "%d", c * s }')
with_fleet() { # $@: the command to measure while the fleet runs; the fleet's rate goes to stderr
  "$WORK/fleet" "$NS_ADDR:6379" "$SHA" "$FLEET_RATE" "$(( SECONDS_PER_RUN + 2 ))" > "$WORK/fleet.out" &
  local fleet=$!
  sleep 1
  "$@"
  wait "$fleet"
  echo "fleet during that row: $(awk '/^FLEET/ { print $2 }' "$WORK/fleet.out") calls/s" >&2
}
echo "the fleet: $FLEET_RATE/s ($FLEET_SHARE of $FLEET_CAPACITY/s)" >&2
open_rounds "$NET_RATE" "Redis across the link, shared with the fleet" with_fleet
medians F

row() { # $1: name, $2: result line, $3: the direct line it is compared with
  awk -v name="$1" -v d="$3" -v r="$2" 'BEGIN {
    split(d, D, " "); split(r, R, " ");
    dropped = R[6] > 0 ? 100 * R[5] / R[6] : 0;
    printf "| %s | %.0f | %.2fx | %.2f ms (%.2fx) | %.2f ms (%.2fx) | %.2f ms (%.2fx) | %.1f%% |\n",
      name, R[1], R[1] / D[1], R[2] / 1000, R[2] / D[2], R[3] / 1000, R[3] / D[3],
      R[4] / 1000, R[4] / D[4], dropped
  }'
}
header() {
  echo "| path | requests/s | vs direct | p50 | p99 | p99.5 | 429s |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
}
# One open-loop table from the medians `medians` stored under $1 (P, N or F): its rows, named
# after the Redis row $2, an extra row named $4 with result $5 when given, and its verdicts,
# labelled $3.
open_table() {
  local d="$1_DIRECT" n="$1_NGINX" b="$1_BARE" s="$1_SPILL" x="$1_REDIS"
  header
  row "direct (nginx upstream)" "${!d}" "${!d}"
  row "nginx reverse proxy, limit_req not hit" "${!n}" "${!d}"
  row "spillway proxy, no buckets" "${!b}" "${!d}"
  row "spillway proxy, limit not hit" "${!s}" "${!d}"
  row "$2" "${!x}" "${!d}"
  [ -n "${4:-}" ] && row "$4" "$5" "${!d}"
  echo
  echo "Added tail, $3: $(goal "${!d}" "${!s}" "${!x}")"
  echo "End to end, $3: $(fell "${!s}" "${!x}")"
  echo "$(hop "${!d}" "${!n}" "${!s}"); $(limiter "${!b}" "${!s}" "${!x}")"
}
{
echo "Closed loop: wrk -t$THREADS -c$CONNECTIONS -d${SECONDS_PER_RUN}s, $(nproc) cores; direct, nginx and spillway: medians of $ROUNDS interleaved rounds"
echo
header
row "direct (nginx upstream)" "$DIRECT" "$DIRECT"
row "nginx reverse proxy, limit_req not hit" "$NGINX_R" "$DIRECT"
row "spillway proxy, limit not hit" "$SPILL" "$DIRECT"
row "spillway proxy, Redis per request (store: redis, not hit)" "$REDIS_R" "$DIRECT"
echo
echo "Added tail, closed loop: $(goal "$DIRECT" "$SPILL" "$REDIS_R")"
echo
echo "Open loop: paced at $RATE requests/s for ${SECONDS_PER_RUN}s over $CONNECTIONS connections; the first five rows: medians of $ROUNDS interleaved rounds"
echo
open_table P "spillway proxy, Redis per request (store: redis, not hit)" "open loop" \
  "spillway proxy at 1.5x (limit $LIMIT, burst $BURST)" "$P_OVER"
echo
echo "Redis across a network: $LINK."
echo "Redis PING round trip over one connection (redis-benchmark): loopback $RTT_LOOPBACK; across the link $RTT_NET."
echo
echo "Closed loop, Redis across the link: wrk -t$THREADS -c$CONNECTIONS -d${SECONDS_PER_RUN}s (direct: the loopback table's)"
echo
header
row "spillway proxy, Redis per request across the link (not hit)" "$NET_REDIS_R" "$DIRECT"
echo
echo "Open loop, Redis across the link: paced at $NET_RATE requests/s for ${SECONDS_PER_RUN}s over $CONNECTIONS connections; medians of $ROUNDS interleaved rounds"
echo
open_table N "spillway proxy, Redis per request across the link (not hit)" \
  "open loop, Redis across the link"
echo
echo "Open loop, Redis across the link and serving the rest of a fleet: the fleet sends $FLEET_RATE EVALSHA/s ($FLEET_SHARE of the $FLEET_CAPACITY/s it measured) during every row; paced at $NET_RATE requests/s for ${SECONDS_PER_RUN}s over $CONNECTIONS connections; medians of $ROUNDS interleaved rounds"
echo
open_table F "spillway proxy, Redis per request across the link, Redis shared with the fleet (not hit)" \
  "open loop, Redis across the link and shared with the fleet"
echo
echo "Each round (load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)):"
echo
for note in "${NOTES[@]}"; do echo "- $note"; done
} | tee "$WORK/report.md"

# CHART=FILE.svg also draws the open-loop tables (bench/proxy/chart.rs).
if [ -n "${CHART:-}" ]; then
  rustc --edition 2021 -O "$ROOT/bench/proxy/chart.rs" -o "$WORK/chart"
  "$WORK/chart" "$WORK/report.md" > "$CHART"
  echo "chart: $CHART" >&2
fi
