#!/usr/bin/env bash
# Two commits side by side, in one run: builds BASE and HEAD (release), then alternates them
# through scripts/hotpath.sh (appends, ctx-1k, ctx-10k) on each backend, each phase on a fresh
# server and database, and prints each commit's req/s and HEAD's ratio to BASE. Run it before
# resolving an issue that touches a request path, and put its table in the closing note. It is
# for people, not a timed test in CI: the figures move with the machine's load.
#
# Usage: scripts/perf-compare.sh BASE HEAD     (any commit names git knows; HEAD may be HEAD)
#   PERF_RUNS      alternations per backend (default 3)
#   PERF_BACKENDS  default "sqlite postgres"
#   PERF_PHASES    default "appends ctx-1k ctx-10k"
#   HOTPATH_DURATION seconds per wrk run (default 8), HOTPATH_PG_ADMIN as for hotpath.sh
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/perf-compare.sh BASE HEAD}
head=${2:?usage: scripts/perf-compare.sh BASE HEAD}
runs=${PERF_RUNS:-3}
backends=${PERF_BACKENDS:-sqlite postgres}
phases=${PERF_PHASES:-appends ctx-1k ctx-10k}
export HOTPATH_DURATION=${HOTPATH_DURATION:-8}
work=$(mktemp -d)
tree=${PERF_TARGET_DIR:-$PWD/target/perf-compare}/tree
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# build NAME COMMIT: the commit's release binary at $work/NAME. The worktrees share one target
# directory of their own (the checkout's binary stays as it is), seeded with hard links to the
# checkout's compiled dependencies, so they build once.
target_dir=${PERF_TARGET_DIR:-$PWD/target/perf-compare}
if [[ ! -d $target_dir/release && -d target/release/deps ]]; then
  mkdir -p "$target_dir/release"
  cp -al target/release/deps target/release/build target/release/.fingerprint "$target_dir/release/"
fi
build() {
  local name=$1 commit=$2
  # One path for every commit built: cargo then rebuilds only what changed between them.
  git worktree add --detach --force "$tree" "$commit" >/dev/null 2>&1
  CARGO_TARGET_DIR=$target_dir cargo build --release --locked --manifest-path "$tree/Cargo.toml" -q
  cp "$target_dir/release/loupe" "$work/$name"
  git worktree remove --force "$tree"
  echo "perf-compare.sh: built $name = $(git rev-parse --short "$commit")"
}
build base "$base"
build head "$head"

# Each line of hotpath.sh's output is "PHASE RPS req/s …": kept as "BACKEND PHASE NAME RPS".
for backend in $backends; do
  for (( r = 1; r <= runs; r++ )); do
    for name in base head; do
      HOTPATH_PHASES="$phases" scripts/hotpath.sh "$work/$name" "$backend" |
        awk -v b="$backend" -v n="$name" '$3 == "req/s" { print b, $1, n, $2 }' >>"$work/results"
    done
  done
done

echo
echo "| backend | phase | base ($(git rev-parse --short "$base")) req/s | head ($(git rev-parse --short "$head")) req/s | head / base (medians) |"
echo "|---|---|---|---|---|"
for backend in $backends; do
  for phase in $phases; do
    median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    list() { awk -v b="$backend" -v p="$phase" -v n="$1" '$1 == b && $2 == p && $3 == n { printf "%s%.0f", s, $4; s = " / " }' "$work/results"; }
    mb=$(awk -v b="$backend" -v p="$phase" '$1 == b && $2 == p && $3 == "base" { print $4 }' "$work/results" | median)
    mh=$(awk -v b="$backend" -v p="$phase" '$1 == b && $2 == p && $3 == "head" { print $4 }' "$work/results" | median)
    ratio=$(awk -v a="$mh" -v b="$mb" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "n/a" }')
    echo "| $backend | $phase | $(list base) | $(list head) | $ratio |"
  done
done
echo
echo "perf-compare.sh: $runs alternation(s), ${HOTPATH_DURATION}s per phase; load average $(cut -d' ' -f1-3 /proc/loadavg)"
