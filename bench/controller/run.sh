#!/usr/bin/env bash
# One controller under many emulated aggregators: ZONES zones (each its own LinkZone stream, as
# an aggregator's) x BUCKETS region-scope buckets at 1 s reports, for SECONDS. Prints the
# controller's CPU (cores: CPU-seconds per second over the run's steady part) and peak RSS,
# the emulator's CPU over the same part (it shares the machine: when the two together fill its
# cores, the emulator may be what limits the run), and the emulator's JSON line.
#
#   bench/controller/run.sh [ZONES] [BUCKETS] [SECONDS]     # default 100 10000 30
#
# ZONES_ARGS passes more arguments to the emulator (`--names`: every bucket by name, every
# interval, as an aggregator older than the bucket numbers sends them).
#
# Builds with the dist profile (PROFILE=release for the quick one); NO_BUILD=1 reuses the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
zones=${1:-100} buckets=${2:-10000} seconds=${3:-30}
profile=${PROFILE:-dist}
target=${CARGO_TARGET_DIR:-target}
if [[ -z ${NO_BUILD:-} ]]; then
  cargo build -q --profile "$profile" -p spillway-cli
  cargo build -q --profile "$profile" -p spillway-emulate --example zones
fi
bin=$target/$profile
work=$(mktemp -d)
trap 'kill "${controller:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
{
  printf 'version: 1\ncontrol:\n  report_interval: 1s\nservices:\n  api:\n    buckets:\n'
  for ((i = 0; i < buckets; i++)); do
    printf '      - { name: b%d, match: { procedure: /b%d }, limit: 1000/s, scope: region }\n' "$i" "$i"
  done
} >"$work/controller.yaml"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
${PERF:+perf record -F 499 -g -o "$PERF" --} "$bin/spillway" controller --listen "127.0.0.1:$port" --region r1 -c "$work/controller.yaml" \
  2>"$work/controller.log" &
controller=$!
for _ in $(seq 100); do
  (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
kill -0 "$controller" 2>/dev/null || { echo "the controller did not start:" >&2; cat "$work/controller.log" >&2; exit 1; }
# Under PERF, $controller is perf's process: the figures are read from the controller it runs.
measured=$controller
if [[ -n ${PERF:-} ]]; then
  measured=$(pgrep -P "$controller" | head -1)
fi
ticks() { awk '{print $14 + $15}' "/proc/${1:-$measured}/stat"; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$measured/status"; }
"$bin/examples/zones" -c "$work/controller.yaml" --controller "http://127.0.0.1:$port" \
  --zones "$zones" --seconds "$seconds" ${ZONES_ARGS:-} >"$work/zones.json" &
emulator=$!
# The steady part: from 5 s in (every stream open, the first intervals closed) to 2 s before
# the end.
sleep 5
t0=$(ticks) e0=$(ticks "$emulator") s0=$(date +%s.%N) peak=0
for ((i = 0; i < seconds - 7; i++)); do
  r=$(rss_kb)
  ((r > peak)) && peak=$r
  sleep 1
done
t1=$(ticks) e1=$(ticks "$emulator") s1=$(date +%s.%N)
wait "$emulator"
hz=$(getconf CLK_TCK)
cores=$(python3 -c "print(round(($t1 - $t0) / $hz / ($s1 - $s0), 3))")
emulator_cores=$(python3 -c "print(round(($e1 - $e0) / $hz / ($s1 - $s0), 3))")
if grep -q '"errors": [1-9]' "$work/zones.json"; then
  echo "the controller's last log lines:" >&2
  tail -5 "$work/controller.log" >&2
fi
echo "zones=$zones buckets=$buckets controller_cores=$cores controller_peak_rss_mb=$((peak / 1024)) emulator_cores=$emulator_cores $(cat "$work/zones.json")"
