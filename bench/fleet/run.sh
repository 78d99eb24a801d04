#!/usr/bin/env bash
# What a fleet costs the control plane, measured on real processes: a controller and one
# aggregator (`spillway controller`, `spillway aggregator`, each in a session of its own) and
# `spillway emulate` running HOSTS hosts in one process, each a real host core on its own link
# stream, reporting 10 buckets every second at 1.5 times their limits.
#
# For each round, transport (plaintext, mutual TLS with a certificate per host) and fleet size:
#   - the aggregator's and the controller's CPU over a steady window (utime + stime of every
#     thread, from /proc/PID/stat, in cores: CPU-seconds per second) and their RSS at its end
#     (VmRSS from /proc/PID/status), and the emulator's CPU beside them;
#   - how long the fleet took to link at the start (every host dialling at once);
#   - at the largest size, a reconnect storm: the aggregator is killed (SIGKILL) and started
#     again on the same port, and every host dials it again with its jittered backoff: the time
#     until the aggregator counts every host as its client, and the CPU it spent meanwhile.
# Then, plaintext at the largest size, a 15x step of the load (half the limit, then 7.5 times
# it, 20 s in): the emulator's enforcement delay.
#
# Usage: bench/fleet/run.sh [WINDOW_SECONDS] [ROUNDS]   (defaults 20 and 3)
# Environment: SIZES (default "1000 5000 10000"), MODES (default "plain tls"), NO_BUILD=1 uses
# the binary already built (`cargo build --release -p spillway-cli --no-default-features`).
# Needs a hard RLIMIT_NOFILE above the largest size plus a few hundred (the emulator and the
# aggregator raise their soft limits to it, and say so when it is short).
set -euo pipefail

WINDOW=${1:-20}
ROUNDS=${2:-3}
SIZES=${SIZES:-"1000 5000 10000"}
MODES=${MODES:-"plain tls"}
BUCKETS=10
LIMIT=100000
WARMUP=5
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
PIDS=()
stop_started() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap 'stop_started; rm -rf "$WORK"' EXIT

if [ -z "${NO_BUILD:-}" ]; then
  echo "building spillway (release, lean)" >&2
  (cd "$ROOT" && cargo build --release -q -p spillway-cli --no-default-features)
fi
SPILLWAY=${SPILLWAY:-${CARGO_TARGET_DIR:-$ROOT/target}/release/spillway}
TCK=$(getconf CLK_TCK)
LARGEST=$(echo "$SIZES" | tr ' ' '\n' | sort -n | tail -1)

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# utime + stime of every thread of pid $1, in clock ticks (0 once it is gone).
ticks() {
  local task total=0
  for task in /proc/"$1"/task/*; do
    read -r -a stat < <(sed 's/^.*) //' "$task/stat" 2>/dev/null) || continue
    total=$((total + stat[11] + stat[12]))
  done
  echo "$total"
}

# stime alone: the kernel's part.
sys_ticks() {
  local task total=0
  for task in /proc/"$1"/task/*; do
    read -r -a stat < <(sed 's/^.*) //' "$task/stat" 2>/dev/null) || continue
    total=$((total + stat[12]))
  done
  echo "$total"
}

rss_mb() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# Ten global drop-ratio buckets of LIMIT/s, one per procedure, reports every second.
{
  printf 'version: 1\ncontrol:\n  report_interval: 1s\nservices:\n  api:\n    buckets:\n'
  for i in $(seq 0 $((BUCKETS - 1))); do
    printf '      - { name: b%d, match: { procedure: /b%d }, limit: %d/s, scope: global }\n' "$i" "$i" "$LIMIT"
  done
} > "$WORK/rules.yaml"

# The PKI of the TLS runs: a CA, the controller's and aggregator's leaves, one per host.
"$SPILLWAY" certs init --out "$WORK/ca" >/dev/null
"$SPILLWAY" certs issue --ca "$WORK/ca" --role controller --region r1 --out "$WORK/controller" >/dev/null
"$SPILLWAY" certs issue --ca "$WORK/ca" --role aggregator --region r1 --zone z1 --out "$WORK/aggregator" >/dev/null
echo "issuing $LARGEST host certificates" >&2
"$SPILLWAY" certs issue --ca "$WORK/ca" --role proxy --region r1 --zone z1 --hosts "$LARGEST" --out "$WORK/hosts" >/dev/null

tls_flags() { # $1: the leaf's folder
  echo "--tls-cert $WORK/$1/cert.pem --tls-key $WORK/$1/key.pem --tls-ca $WORK/ca/ca.pem"
}

# Starts the controller and the aggregator for transport $1; sets CTL_PID, AGG_PID, AGG_PORT,
# AGG_ADMIN, SCHEME and the aggregator's command line AGG_CMD.
start_control() {
  local ctl_port ctl_flags="" agg_flags=""
  ctl_port=$(free_port); AGG_PORT=$(free_port); AGG_ADMIN=$(free_port); SCHEME=http
  if [ "$1" = tls ]; then
    SCHEME=https; ctl_flags=$(tls_flags controller); agg_flags=$(tls_flags aggregator)
  fi
  # shellcheck disable=SC2086
  RUST_LOG=warn setsid "$SPILLWAY" controller --listen "127.0.0.1:$ctl_port" --region r1 \
    -c "$WORK/rules.yaml" $ctl_flags 2>>"$WORK/controller.log" &
  CTL_PID=$!; PIDS+=("$CTL_PID")
  AGG_CMD="$SPILLWAY aggregator --listen 127.0.0.1:$AGG_PORT --region r1 --zone z1 --controller $SCHEME://127.0.0.1:$ctl_port --admin 127.0.0.1:$AGG_ADMIN --grpc-max-connections 30000 $agg_flags"
  start_aggregator
}

start_aggregator() {
  # shellcheck disable=SC2086
  RUST_LOG=warn setsid $AGG_CMD 2>>"$WORK/aggregator.log" &
  AGG_PID=$!; PIDS+=("$AGG_PID")
}

# The aggregator's count of linked hosts (-1 while its admin port does not answer).
clients() {
  local url=http://127.0.0.1:$AGG_ADMIN/metrics tls=()
  [ "$SCHEME" = https ] && url=https://127.0.0.1:$AGG_ADMIN/metrics && tls=(--cacert "$WORK/ca/ca.pem")
  curl -s -m 1 "${tls[@]}" "$url" | awk '/^spillway_aggregator_clients / { print $2; found=1 } END { if (!found) print -1 }'
}

# Polls (every 100 ms, at most $2 s) until the aggregator counts $1 clients; prints the seconds.
wait_clients() {
  local start now
  start=$(date +%s.%N)
  for _ in $(seq $(($2 * 10))); do
    [ "$(clients)" = "$1" ] && break
    sleep 0.1
  done
  now=$(date +%s.%N)
  echo "$now - $start" | bc
}

emulate() { # $1: transport, $2: hosts, $3: seconds, then extra flags; sets EMU_PID
  local mode=$1 hosts=$2 seconds=$3 tls=()
  shift 3
  [ "$mode" = tls ] && tls=(--tls-dir "$WORK/hosts")
  RUST_LOG=error setsid "$SPILLWAY" emulate -c "$WORK/rules.yaml" --hosts "$hosts" \
    --aggregator "$SCHEME://127.0.0.1:$AGG_PORT" --region r1 --zone z1 --seconds "$seconds" \
    "${tls[@]}" "$@" > "$WORK/summary.json" 2>>"$WORK/emulate.log" &
  EMU_PID=$!; PIDS+=("$EMU_PID")
}

field() { python3 -c "import json,sys; d=json.load(open('$WORK/summary.json')); print(eval(sys.argv[1]))" "$1"; }

cores() { echo "scale=3; ($2 - $1) / $TCK / $3" | bc; }

# The aggregator's count of late reports (arrived after their interval was forwarded).
late() {
  local url=http://127.0.0.1:$AGG_ADMIN/metrics tls=()
  [ "$SCHEME" = https ] && url=https://127.0.0.1:$AGG_ADMIN/metrics && tls=(--cacert "$WORK/ca/ca.pem")
  curl -s -m 1 "${tls[@]}" "$url" | awk '/^spillway_aggregator_late_reports_total / { print $2 }'
}

# Over the emulator's seconds from $1 to $2 (seconds since it started): reports sent and the
# median of admitted / limit.
window_figures() {
  python3 - "$WORK/summary.json" "$1" "$2" <<'PY'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
lo, hi = float(sys.argv[2]), float(sys.argv[3])
w = [s for s in d["per_second"] if lo < s["t"] <= hi]
print(sum(s["reports"] for s in w), round(statistics.median(s["admitted_to_limit"] for s in w), 3) if w else 0)
PY
}

now() { date +%s.%N; }

printf '%-5s %-6s %6s %9s %9s %8s %10s %9s %8s %9s %6s %9s %8s %9s\n' round mode hosts linked_s agg_cores agg_sys% agg_rss_mb ctl_cores ctl_rss emu_cores late% adm/limit storm_s storm_cpu
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    for hosts in $SIZES; do
      start_control "$mode"
      wait_clients 0 20 >/dev/null
      # Runs until stopped (SIGTERM), when it prints its summary.
      emulate "$mode" "$hosts" 3600
      t0=$(now)
      linked=$(wait_clients "$hosts" 120)
      sleep "$WARMUP"
      as0=$(sys_ticks "$AGG_PID"); a0=$(ticks "$AGG_PID"); c0=$(ticks "$CTL_PID"); e0=$(ticks "$EMU_PID"); l0=$(late); w0=$(now)
      sleep "$WINDOW"
      as1=$(sys_ticks "$AGG_PID"); a1=$(ticks "$AGG_PID"); c1=$(ticks "$CTL_PID"); e1=$(ticks "$EMU_PID"); l1=$(late); w1=$(now)
      agg_rss=$(rss_mb "$AGG_PID"); ctl_rss=$(rss_mb "$CTL_PID")
      storm_s=-; storm_cpu=-
      if [ "$hosts" = "$LARGEST" ]; then
        # The storm: every host loses its stream at once and dials the restarted aggregator.
        kill -9 "$AGG_PID"; wait "$AGG_PID" 2>/dev/null || true
        start_aggregator
        storm_s=$(printf '%.1f' "$(wait_clients "$hosts" 60)")
        storm_cpu=$(echo "scale=2; $(ticks "$AGG_PID") / $TCK" | bc)
      fi
      kill -TERM "$EMU_PID"; wait "$EMU_PID" || true
      read -r reports ratio < <(window_figures "$(echo "$w0 - $t0" | bc)" "$(echo "$w1 - $t0" | bc)")
      late_pct=$(echo "scale=1; 100 * ($l1 - $l0) / ($reports + 1)" | bc)
      printf '%-5s %-6s %6s %9.1f %9s %8s %10s %9s %8s %9s %6s %9s %8s %9s\n' "$round" "$mode" "$hosts" "$linked" \
        "$(cores "$a0" "$a1" "$WINDOW")" "$(echo "100 * ($as1 - $as0) / ($a1 - $a0 + 1)" | bc)" "$agg_rss" "$(cores "$c0" "$c1" "$WINDOW")" "$ctl_rss" \
        "$(cores "$e0" "$e1" "$WINDOW")" "$late_pct" "$ratio" "$storm_s" "$storm_cpu"
      stop_started
    done
  done
done

# The 15x step at the largest size: half the limit, then 7.5 times it from 20 s in.
echo
printf '%-5s %6s %10s %20s %12s\n' round hosts step enforcement_delay_s adm/limit
for round in $(seq "$ROUNDS"); do
  start_control plain
  emulate plain "$LARGEST" 35 --rate $((LIMIT / 2)) --step 15@20s
  wait "$EMU_PID" || true
  printf '%-5s %6s %10s %20s %12.3f\n' "$round" "$LARGEST" 15@20s \
    "$(field 'd["step"]["enforcement_delay_s"]')" "$(field 'd["admitted_to_limit"]')"
  stop_started
done
