#!/usr/bin/env bash
# The proxy benchmark of issue 4: on loopback, in one run, with wrk against one small upstream
# (nginx answering 200 from memory):
#   direct            wrk -> upstream
#   nginx limit_req   wrk -> nginx (reverse proxy, limit_req far above the load) -> upstream
#   spillway          wrk -> spillway proxy (a local token bucket far above the load) -> upstream
#   spillway 1.5x     the same proxy with a limit of 2/3 of the load spillway carried above
# Requests/s and p50/p99/p99.5 latency are reported as ratios to direct, in a Markdown table on
# stdout (paste it into docs/benchmarks.md, section "Proxy").
#
# Usage: bench/proxy/run.sh [SECONDS] [CONNECTIONS]   (defaults 10 and 32)
# Installs wrk and nginx from Debian when missing; builds spillway in release mode.
set -euo pipefail

SECONDS_PER_RUN=${1:-10}
CONNECTIONS=${2:-32}
THREADS=2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

need() {
  command -v "$1" >/dev/null 2>&1 && return
  [ -x "/usr/sbin/$1" ] && return
  echo "installing $2 from Debian" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2
}
need wrk wrk
need nginx nginx-light
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
UPSTREAM=$(free_port); NGINX_PROXY=$(free_port); PROXY=$(free_port); ADMIN=$(free_port)

# One nginx: the upstream, and the limit_req reverse proxy in front of it.
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx; proxy_temp_path $WORK/nginx;
  fastcgi_temp_path $WORK/nginx; uwsgi_temp_path $WORK/nginx; scgi_temp_path $WORK/nginx;
  limit_req_zone \$binary_remote_addr zone=bench:1m rate=10000000r/s;
  upstream backend { server 127.0.0.1:$UPSTREAM; keepalive 64; }
  server { listen 127.0.0.1:$UPSTREAM; location / { return 200 "ok\n"; } }
  server {
    listen 127.0.0.1:$NGINX_PROXY;
    location / {
      limit_req zone=bench burst=1000000 nodelay;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://backend;
    }
  }
}
CONF
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK/nginx"

echo "building spillway (release)" >&2
(cd "$ROOT" && cargo build --release -q -p spillway-cli)
SPILLWAY=${CARGO_TARGET_DIR:-$ROOT/target}/release/spillway

start_spillway() { # $1: limit
  cat > "$WORK/spillway.yaml" <<YAML
version: 1
services:
  bench:
    buckets:
      - { name: all, limit: $1, algorithm: token-bucket, store: local }
YAML
  RUST_LOG=warn "$SPILLWAY" proxy -c "$WORK/spillway.yaml" --listen "127.0.0.1:$PROXY" \
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

echo "direct" >&2;          DIRECT=$(measure "$UPSTREAM")
echo "nginx limit_req" >&2; NGINX_R=$(measure "$NGINX_PROXY")
start_spillway "100000000/s"
echo "spillway" >&2;        SPILL=$(measure "$PROXY")
stop_spillway
# 1.5x: the load spillway carried unlimited, against a limit of two thirds of it.
LIMIT=$(echo "$SPILL" | awk '{ printf "%d/s", $1 / 1.5 }')
start_spillway "$LIMIT"
echo "spillway at 1.5x ($LIMIT)" >&2; OVER=$(measure "$PROXY")
stop_spillway

row() { # $1: name, $2: result line
  awk -v name="$1" -v d="$DIRECT" -v r="$2" 'BEGIN {
    split(d, D, " "); split(r, R, " ");
    dropped = R[6] > 0 ? 100 * R[5] / R[6] : 0;
    printf "| %s | %.0f | %.2fx | %.2f ms (%.2fx) | %.2f ms (%.2fx) | %.2f ms (%.2fx) | %.1f%% |\n",
      name, R[1], R[1] / D[1], R[2] / 1000, R[2] / D[2], R[3] / 1000, R[3] / D[3],
      R[4] / 1000, R[4] / D[4], dropped
  }'
}
echo "wrk -t$THREADS -c$CONNECTIONS -d${SECONDS_PER_RUN}s, one run, $(nproc) cores"
echo
echo "| path | requests/s | vs direct | p50 | p99 | p99.5 | 429s |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
row "direct (nginx upstream)" "$DIRECT"
row "nginx reverse proxy, limit_req not hit" "$NGINX_R"
row "spillway proxy, limit not hit" "$SPILL"
row "spillway proxy at 1.5x ($LIMIT)" "$OVER"
