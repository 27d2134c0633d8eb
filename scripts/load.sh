#!/usr/bin/env bash
# Bounded load against a Loupe running on this machine (127.0.0.1 only).
#
# Usage: scripts/load.sh [PORT]        (default 8080; LOUPE_API_KEY is sent when set)
#   LOAD_DURATION   seconds per phase, at most 20 (default 10)
#   LOAD_CONNECTIONS concurrent connections (default 8), LOAD_THREADS wrk threads (default 2)
#   LOAD_BATCH      messages per append (default 1)
#   LOAD_REQUESTS   requests per phase of the curl fallback (default 300)
#
# Creates a thread, then measures appends/s (POST …/messages, fresh uuids, all on that one
# thread, so they queue on its lock) and page reads/s (GET …/messages?after_seq=…&limit=100, the
# last full page of the thread). Uses wrk when installed, else a sequential curl loop with a
# fixed request count.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8080}
[[ $port =~ ^[0-9]+$ ]] || { echo "load.sh: PORT must be a number (the host is always 127.0.0.1)" >&2; exit 2; }
base="http://127.0.0.1:$port"
duration=${LOAD_DURATION:-10}
(( duration >= 1 && duration <= 20 )) || { echo "load.sh: LOAD_DURATION must be 1–20 seconds" >&2; exit 2; }
connections=${LOAD_CONNECTIONS:-8}
threads=${LOAD_THREADS:-2}
batch=${LOAD_BATCH:-1}
requests=${LOAD_REQUESTS:-300}
run="load-$(date +%s)-$$"
auth=()
[[ -n ${LOUPE_API_KEY:-} ]] && auth=(-H "Authorization: Bearer $LOUPE_API_KEY")

curl -sf "${auth[@]}" "$base/readyz" >/dev/null || { echo "load.sh: no Loupe answering on $base" >&2; exit 1; }
status=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' \
  --data "{\"id\": \"$run\"}" "$base/v1/threads")
[[ $status == 201 ]] || { echo "load.sh: creating thread $run failed: HTTP $status" >&2; exit 1; }
messages="$base/v1/threads/$run/messages"
echo "load.sh: thread $run on $base; $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"

next_seq() { curl -sf "${auth[@]}" "$base/v1/threads/$run" | jq -r .message_count; }

if command -v wrk >/dev/null; then
  header=()
  [[ -n ${LOUPE_API_KEY:-} ]] && header=(-H "Authorization: Bearer $LOUPE_API_KEY")
  echo "== appends: wrk -t$threads -c$connections -d${duration}s, $batch message(s) per POST"
  LOAD_BATCH=$batch LOAD_RUN=$run wrk -t"$threads" -c"$connections" -d"${duration}s" --latency \
    "${header[@]}" -s scripts/load/append.lua "$messages"
  stored=$(next_seq)
  echo "appends: thread now holds $stored messages ($(awk -v n="$stored" -v d="$duration" 'BEGIN { printf "%.0f", n / d }') messages/s)"
  after=$(( stored > 101 ? stored - 101 : -1 ))
  echo "== pages: wrk -t$threads -c$connections -d${duration}s, GET after_seq=$after&limit=100"
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency "${header[@]}" \
    "$messages?after_seq=$after&limit=100"
else
  text=$(printf 'let me look at the file and then run the build again. %.0s' 1 2 3 4 5 6 7 8)
  echo "== appends: wrk not installed; $requests sequential curl POSTs, $batch message(s) each"
  start=$(date +%s.%N)
  for i in $(seq 1 "$requests"); do
    body=$(jq -cn --arg run "$run" --arg text "$text" --argjson i "$i" --argjson n "$batch" \
      '{messages: [range($n) | {uuid: "\($run)-\($i)-\(.)", type: "user", message: {role: "user", content: $text}}]}')
    curl -sf -o /dev/null "${auth[@]}" -H 'Content-Type: application/json' --data "$body" "$messages"
  done
  end=$(date +%s.%N)
  awk -v n="$requests" -v b="$batch" -v s="$start" -v e="$end" \
    'BEGIN { printf "appends: %d requests in %.2f s: %.1f requests/s, %.1f messages/s\n", n, e - s, n / (e - s), n * b / (e - s) }'
  stored=$(next_seq)
  after=$(( stored > 101 ? stored - 101 : -1 ))
  echo "== pages: $requests sequential curl GETs after_seq=$after&limit=100"
  start=$(date +%s.%N)
  for _ in $(seq 1 "$requests"); do
    curl -sf -o /dev/null "${auth[@]}" "$messages?after_seq=$after&limit=100"
  done
  end=$(date +%s.%N)
  awk -v n="$requests" -v s="$start" -v e="$end" \
    'BEGIN { printf "pages: %d requests in %.2f s: %.1f requests/s\n", n, e - s, n / (e - s) }'
fi
echo "load.sh: done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
