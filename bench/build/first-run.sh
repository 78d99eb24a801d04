#!/usr/bin/env bash
# How long a new user waits: a fresh clone of this repository, a cold target directory, and the
# quick start's command until the demo prints its first line. Each round clones again into a
# scratch directory; the crates.io download cache (~/.cargo/registry) is shared, as it is on a
# machine that has built any Rust before.
#
#   bench/build/first-run.sh [ROUNDS] [-- extra cargo flags]
#
# ROUNDS defaults to 3. Without extra flags it times the README's quick start (the lean build,
# `--no-default-features`); `bench/build/first-run.sh 1 --` times the full binary instead.
# Prints one line per round and the median. Everything it makes is removed at the end.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
rounds=${1:-3}
shift || true
if [[ ${1:-} == -- ]]; then
  shift
  flags=("$@")
else
  flags=(--no-default-features)
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

times=()
for round in $(seq 1 "$rounds"); do
  rm -rf "$scratch/clone"
  git clone --quiet "$repo" "$scratch/clone"
  cd "$scratch/clone"
  start=$(date +%s.%N)
  # Once the first line is read the demo is left to end (writing to the closed pipe ends it),
  # so only the reader's status counts; the build's output goes to a log.
  set +o pipefail
  cargo run --release --quiet -p spillway-cli "${flags[@]}" -- demo --seconds 30 \
    2>"$scratch/build.log" | {
    IFS= read -r first || { echo "round $round: the demo printed nothing; the log:" >&2; tail -20 "$scratch/build.log" >&2; exit 1; }
    end=$(date +%s.%N)
    echo "$first" >"$scratch/first"
    echo "$end" >"$scratch/end"
  }
  set -o pipefail
  end=$(cat "$scratch/end")
  seconds=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", e - s }')
  times+=("$seconds")
  echo "round $round: ${seconds} s to the demo's first line ($(cut -c1-60 "$scratch/first")...); binary $(du -h target/release/spillway | cut -f1)"
  cd "$repo"
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "median of ${rounds}: ${median} s (flags: ${flags[*]:-none}; $(nproc) cores)"
