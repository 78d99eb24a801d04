#!/usr/bin/env bash
# Two builds of `spillway proxy` side by side: the latency each adds over direct (open loop) and
# the rate each carries (closed loop), in interleaved rounds. For a change to the request path,
# measure the build before it against the build with it; on a shared machine one run of each
# says little, rounds that alternate do.
#
# Both proxies (no buckets: the hop alone, SPILLWAY_WORKERS serving threads each, default 2) run
# in front of the same upstream (nginx, one worker, answering 200 from memory) for the whole run,
# with nginx as a reverse proxy (NGINX_WORKERS workers, default 2) beside them for reference.
# Each round measures direct, A, B and nginx with the `paced` load generator (RATE requests/s
# for SECONDS over 32 connections); odd rounds measure A, B, nginx in that order, even rounds
# the reverse, so none always runs right after direct; then `wrk -t2 -c32` for SECONDS against
# A and B in the same order, and nginx. Prints every round, then for each build (and nginx) the
# median over the rounds of what it added to direct's p50, p99 and p99.5 in the same round, of
# its closed-loop requests/s and of its rate against nginx's in the same round; and in how many
# rounds B carried more than A. HOG=N runs N busy loops for the whole run, for the proxies'
# behaviour on a host whose cores are taken by something else (a sidecar's application).
#
# Usage: bench/proxy/ab.sh BINARY_A BINARY_B [RATE] [SECONDS] [ROUNDS]   (defaults 19000 8 6)
# Installs wrk and nginx-light from Debian when missing; builds the `paced` example in release
# mode.
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
A_BIN=$1
B_BIN=$2
RATE=${3:-19000}
SECONDS_PER_RUN=${4:-8}
ROUNDS=${5:-6}
for bin in "$A_BIN" "$B_BIN"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
# shellcheck source=bench/proxy/common.sh
. "$ROOT/bench/proxy/common.sh"
trap stop_started EXIT
need wrk wrk
need nginx nginx-light
UPSTREAM=$(free_port); NGINX_PROXY=$(free_port); PORT_A=$(free_port); PORT_B=$(free_port)
start_nginx

(cd "$ROOT" && cargo build --release -q -p spillway-proxy --example paced)
PACED=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/paced
printf 'version: 1\nservices: {}\n' > "$WORK/spillway.yaml"
for side in A:"$A_BIN":"$PORT_A" B:"$B_BIN":"$PORT_B"; do
  IFS=: read -r _ bin port <<<"$side"
  RUST_LOG=warn TOKIO_WORKER_THREADS=${SPILLWAY_WORKERS:-2} setsid "$bin" proxy -c "$WORK/spillway.yaml" \
    --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UPSTREAM" &
  PIDS+=("$!")
  wait_port 127.0.0.1 "$port"
done

for _ in $(seq "${HOG:-0}"); do
  # Bounded: never longer than the run could take.
  timeout $((ROUNDS * SECONDS_PER_RUN * 10 + 60)) sh -c 'while :; do :; done' &
  PIDS+=("$!")
done

# paced prints `RESULT rps p50 p99 p99.5 non2xx total`, latencies in microseconds.
measure() { "$PACED" "http://127.0.0.1:$1/" "$RATE" "$SECONDS_PER_RUN" 32 | awk '/^RESULT/ { print $3, $4, $5 }'; }

echo "A: $A_BIN"
echo "B: $B_BIN"
echo "open loop, $RATE requests/s for $SECONDS_PER_RUN s over 32 connections; microseconds"
echo "closed loop: wrk -t2 -c32 -d${SECONDS_PER_RUN}s; requests/s"
[ "${HOG:-0}" -gt 0 ] && echo "with $HOG busy loops running"
echo "round path p50 p99 p99.5 | requests/s"
: > "$WORK/added"
: > "$WORK/rates"
for round in $(seq "$ROUNDS"); do
  read -r d50 d99 d995 <<<"$(measure "$UPSTREAM")"
  echo "$round direct $d50 $d99 $d995"
  order="A:$PORT_A B:$PORT_B"
  [ $((round % 2)) -eq 0 ] && order="B:$PORT_B A:$PORT_A"
  paced_order="$order N:$NGINX_PROXY"
  [ $((round % 2)) -eq 0 ] && paced_order="N:$NGINX_PROXY $order"
  for side in $paced_order; do
    read -r p50 p99 p995 <<<"$(measure "${side#*:}")"
    echo "$round ${side%%:*} $p50 $p99 $p995"
    echo "${side%%:*} $((p50 - d50)) $((p99 - d99)) $((p995 - d995))" >> "$WORK/added"
  done
  declare -A rate
  for side in $order N:$NGINX_PROXY; do
    rate[${side%%:*}]=$(wrk -t2 -c32 -d"${SECONDS_PER_RUN}s" "http://127.0.0.1:${side#*:}/" \
      | awk '/^Requests\/sec/ { print int($2) }')
    echo "$round ${side%%:*} closed loop | ${rate[${side%%:*}]}"
  done
  echo "${rate[A]} ${rate[B]} ${rate[N]}" >> "$WORK/rates"
done
echo
echo "added over direct in the same round, median of $ROUNDS rounds; microseconds"
echo "build p50 p99 p99.5 | closed loop requests/s, and against nginx's in the same round"
median() { sort -n | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf " %d", m }'; }
for side in A B; do
  printf '%s' "$side"
  for field in 2 3 4; do
    awk -v s="$side" -v f="$field" '$1 == s { print $f }' "$WORK/added" | median
  done
  printf ' |'
  field=$([ "$side" = A ] && echo 1 || echo 2)
  awk -v f="$field" '{ print $f }' "$WORK/rates" | median
  # Ratios in thousandths, so that `median` can sort them as integers.
  awk -v f="$field" '{ print int(1000 * $f / $3) }' "$WORK/rates" | median | awk '{ printf " (%.2fx)", $1 / 1000 }'
  echo
done
printf 'nginx'
for field in 2 3 4; do
  awk -v f="$field" '$1 == "N" { print $f }' "$WORK/added" | median
done
printf ' |'
awk '{ print $3 }' "$WORK/rates" | median
echo
awk '$2 > $1 { b++ } END { printf "B carried more than A in %d of %d rounds\n", b, NR }' "$WORK/rates"
