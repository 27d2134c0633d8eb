#!/usr/bin/env bash
# Prints a Markdown table of the last criterion run of every benchmark under
# ${CARGO_TARGET_DIR:-target}/criterion: median, its 95% confidence interval, the median absolute
# deviation and the min–max of the per-iteration sample means, plus elements/s when a throughput
# in elements was set. Usage: scripts/bench-summary.sh [GROUP_PREFIX]
set -euo pipefail
root=${CARGO_TARGET_DIR:-target}/criterion
prefix=${1:-}
echo "| benchmark | median | 95% CI of median | MAD | sample min–max | elements/s (median) |"
echo "|---|---|---|---|---|---|"
find "$root" -path '*/new/estimates.json' | sort | while read -r est; do
  dir=$(dirname "$est")
  [[ -f $dir/benchmark.json && -f $dir/sample.json ]] || continue
  id=$(jq -r '.full_id' "$dir/benchmark.json")
  [[ $id == "$prefix"* ]] || continue
  jq -r --slurpfile s "$dir/sample.json" --slurpfile b "$dir/benchmark.json" --arg id "$id" '
    def t: if . >= 1e9 then "\(. / 1e9 * 100 | round / 100) s"
           elif . >= 1e6 then "\(. / 1e6 * 100 | round / 100) ms"
           elif . >= 1e3 then "\(. / 1e3 * 10 | round / 10) µs"
           else "\(. | round) ns" end;
    ($s[0] | [range(0; .iters | length) as $i | .times[$i] / .iters[$i]]) as $per
    | ($b[0].throughput.Elements // null) as $el
    | "| \($id) | \(.median.point_estimate | t) | \(.median.confidence_interval.lower_bound | t) – \(.median.confidence_interval.upper_bound | t) | \(.median_abs_dev.point_estimate | t) | \($per | min | t) – \($per | max | t) | \(if $el then ($el / .median.point_estimate * 1e9 | round | tostring) else "" end) |"
  ' "$est"
done
