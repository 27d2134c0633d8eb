#!/usr/bin/env bash
# Bounded load against a Loupe running on this machine (127.0.0.1 only).
#
# Usage: scripts/load.sh [PORT]        (default 8080; LOUPE_API_KEY is sent when set)
#   LOAD_DURATION   seconds per phase, at most 20 (default 10)
#   LOAD_CONNECTIONS concurrent connections (default 8), LOAD_THREADS wrk threads (default 2)
#   LOAD_BATCH      messages per append (default 1)
#   LOAD_REQUESTS   requests per phase of the curl fallback (default 300)
#   LOAD_CONTEXT_ROUNDS tool-use rounds (~8 entries each) in the context threads (default 40)
#
# Start Loupe with LOUPE_RATE_LIMIT_PER_SEC=0: the default per-tenant limit (50 requests/s) would
# answer most of the load with 429.
#
# Phases (appends and pages share one thread; context and outline have one each):
#   appends  POST …/messages, fresh uuids, all on one thread (so they queue on its lock);
#   pages    GET …/messages?after_seq=…&limit=100, the last full page of that thread;
#   context  GET …/context of a thread filled first with LOAD_CONTEXT_ROUNDS agent rounds (an
#            attachment every fifth round, the prompt, streamed assistant fragments with
#            thinking, text and tool_use, progress, tool results, a final text), so
#            normalization merges fragments and user turns and pairs tool calls;
#   outline  GET …/context?view=outline of the same history in a thread in outline mode
#            (PUT …/settings {"outline": {"enabled": true, "tail_tokens": 2000}} before filling
#            it), once the server's own workers have built its outline lines.
# Uses wrk when installed, else a sequential curl loop with a fixed request count.
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
rounds=${LOAD_CONTEXT_ROUNDS:-40}
(( rounds >= 1 && rounds <= 1000 )) || { echo "load.sh: LOAD_CONTEXT_ROUNDS must be 1–1000" >&2; exit 2; }
ctx="$run-context"
outl="$run-outline"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
auth=()
[[ -n ${LOUPE_API_KEY:-} ]] && auth=(-H "Authorization: Bearer $LOUPE_API_KEY")

curl -sf "${auth[@]}" "$base/readyz" >/dev/null || { echo "load.sh: no Loupe answering on $base" >&2; exit 1; }
status=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' \
  --data "{\"id\": \"$run\"}" "$base/v1/threads")
[[ $status == 201 ]] || { echo "load.sh: creating thread $run failed: HTTP $status" >&2; exit 1; }
messages="$base/v1/threads/$run/messages"
echo "load.sh: thread $run on $base; $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"

loadavg() { echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"; }
next_seq() { curl -sf "${auth[@]}" "$base/v1/threads/$run" | jq -r .message_count; }

# fill THREAD: appends LOAD_CONTEXT_ROUNDS agent rounds to THREAD, ten rounds per POST.
fill() {
  local thread=$1 from status
  for (( from = 0; from < rounds; from += 10 )); do
    jq -cn --arg t "$thread" --argjson from "$from" --argjson to "$(( from + 10 < rounds ? from + 10 : rounds ))" '
      def words($n): [range(0; $n) | ["the", "append", "handler", "returns", "a", "conflict",
        "when", "the", "index", "is", "stale", "so", "we", "check", "the", "migration"][. % 16]]
        | join(" ");
      def listing($i; $n): [range(0; $n) | "src/store/messages.rs:\(100 + $i + .):    let value = append(&tx, \"\(words(6 + . % 5))\")?;"]
        | join("\n");
      def asst($id; $block; $stop): {type: "assistant", message: ({role: "assistant", id: $id,
        model: "claude-sonnet-4-5", content: [$block]} + if $stop then {stop_reason: $stop,
        usage: {input_tokens: 4, cache_read_input_tokens: 30000, output_tokens: 120}} else {} end)};
      {messages: [range($from; $to) as $i | ("\($t)-\($i)") as $u | (
        (if $i % 5 == 0 then {uuid: "\($u)-m", type: "attachment", is_meta: true, message: {role: "user",
          content: [{type: "text", text: "Contents of src/store/messages.rs:\n\(listing($i; 8))"}]}}
         else empty end),
        {uuid: "\($u)-q", type: "user", message: {role: "user",
          content: "Round \($i): \(words(20 + $i % 30))."}},
        (if $i % 3 == 0 then asst("msg_\($u)_a"; {type: "thinking", thinking: words(40),
          signature: ("EqQBCkYIBxgCKkDx" * 12)}; null) | .uuid = "\($u)-a0" else empty end),
        (asst("msg_\($u)_a"; {type: "text", text: "Let me look at the store first."}; null)
          | .uuid = "\($u)-a1"),
        (asst("msg_\($u)_a"; {type: "tool_use", id: "toolu_\($i)_read", name: "Read",
          input: {file_path: "/work/loupe/src/store/messages.rs"}}; "tool_use") | .uuid = "\($u)-a2"),
        {uuid: "\($u)-p", type: "progress", data: {type: "bash_progress",
          output: "   Compiling loupe v0.1.0\n", elapsed_ms: 1200}},
        {uuid: "\($u)-r1", type: "user", message: {role: "user", content: [{type: "tool_result",
          tool_use_id: "toolu_\($i)_read", content: listing($i; 5 + ($i * 7) % 26)}]}},
        (asst("msg_\($u)_b"; {type: "tool_use", id: "toolu_\($i)_bash", name: "Bash",
          input: {command: "cargo test append -- --nocapture", timeout: 120000}}; "tool_use")
          | .uuid = "\($u)-b"),
        {uuid: "\($u)-r2", type: "user", message: {role: "user", content: [{type: "tool_result",
          tool_use_id: "toolu_\($i)_bash", content: listing($i; 3), is_error: ($i % 7 == 3)}]}},
        (asst("msg_\($u)_c"; {type: "text", text: "Done: \(words(30 + $i % 20))."}; "end_turn")
          | .uuid = "\($u)-c")
      )]}' > "$tmp/fill.json"
    status=$(curl -s -o "$tmp/fill.out" -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' \
      --data-binary "@$tmp/fill.json" "$base/v1/threads/$thread/messages")
    [[ $status == 201 ]] || { echo "load.sh: filling $thread failed: HTTP $status: $(head -c 500 "$tmp/fill.out")" >&2; exit 1; }
  done
}

# new_thread ID: creates the thread ID.
new_thread() {
  local status
  status=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' \
    --data "{\"id\": \"$1\"}" "$base/v1/threads")
  [[ $status == 201 ]] || { echo "load.sh: creating thread $1 failed: HTTP $status" >&2; exit 1; }
}

# prepare_context: fills $ctx, and $outl in outline mode; waits for the outline's lines.
prepare_context() {
  local status out i
  new_thread "$ctx"
  fill "$ctx"
  new_thread "$outl"
  status=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -X PUT -H 'Content-Type: application/json' \
    --data '{"outline": {"enabled": true, "tail_tokens": 2000}}' "$base/v1/threads/$outl/settings")
  [[ $status == 200 ]] || { echo "load.sh: outline settings of $outl failed: HTTP $status" >&2; exit 1; }
  fill "$outl"
  echo "context threads: $ctx and $outl (outline mode) hold $(curl -sf "${auth[@]}" "$base/v1/threads/$ctx" | jq -r .message_count) messages each"
  for (( i = 0; i < 240; i++ )); do
    out=$(curl -sf "${auth[@]}" "$base/v1/threads/$outl/outline")
    case $(jq -r '.build.last_job_state // "none"' <<<"$out") in
      succeeded) (( $(jq '.lines | length' <<<"$out") > 0 )) && break ;;
      failed) echo "load.sh: the outline build of $outl failed: $(jq -c .build <<<"$out")" >&2; exit 1 ;;
    esac
    sleep 0.5
  done
  (( $(jq '.lines | length' <<<"$out") > 0 )) || { echo "load.sh: no outline lines for $outl after 120 s: $(jq -c .build <<<"$out")" >&2; exit 1; }
  echo "outline of $outl: $(jq -r '"\(.lines | length) lines (\(.line_bytes) bytes), boundary \(.boundary) of \(.next_seq) messages, \(.build.nodes) nodes"' <<<"$out") after $(awk -v i="$i" 'BEGIN { printf "%.1f", i / 2 }') s of polling"
  curl -sf -o "$tmp/context.json" "${auth[@]}" "$base/v1/threads/$ctx/context"
  echo "context of $ctx: $(jq -r '"\(.messages | length) provider messages, \(.repairs | length) repairs (\([.repairs[].kind] | group_by(.) | map("\(length) \(.[0])") | join(", "))), ~\(.estimated_tokens) tokens"' "$tmp/context.json"), $(wc -c <"$tmp/context.json") bytes"
  curl -sf -o "$tmp/outline.json" "${auth[@]}" "$base/v1/threads/$outl/context?view=outline"
  echo "context?view=outline of $outl: $(jq -r '"\(.messages | length) provider messages, ~\(.estimated_tokens) tokens, outline \(.outline | tojson), tools \([.tools[].name] | join(","))"' "$tmp/outline.json"), $(wc -c <"$tmp/outline.json") bytes"
}

if command -v wrk >/dev/null; then
  header=()
  [[ -n ${LOUPE_API_KEY:-} ]] && header=(-H "Authorization: Bearer $LOUPE_API_KEY")
  echo "== appends: wrk -t$threads -c$connections -d${duration}s, $batch message(s) per POST"
  LOAD_BATCH=$batch LOAD_RUN=$run wrk -t"$threads" -c"$connections" -d"${duration}s" --latency \
    "${header[@]}" -s scripts/load/append.lua "$messages"
  loadavg
  stored=$(next_seq)
  echo "appends: thread now holds $stored messages ($(awk -v n="$stored" -v d="$duration" 'BEGIN { printf "%.0f", n / d }') messages/s)"
  after=$(( stored > 101 ? stored - 101 : -1 ))
  echo "== pages: wrk -t$threads -c$connections -d${duration}s, GET after_seq=$after&limit=100"
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency "${header[@]}" \
    "$messages?after_seq=$after&limit=100"
  loadavg
  prepare_context
  echo "== context: wrk -t$threads -c$connections -d${duration}s, GET /v1/threads/$ctx/context"
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency "${header[@]}" \
    "$base/v1/threads/$ctx/context"
  loadavg
  echo "== outline: wrk -t$threads -c$connections -d${duration}s, GET /v1/threads/$outl/context?view=outline"
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency "${header[@]}" \
    "$base/v1/threads/$outl/context?view=outline"
  loadavg
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
  prepare_context
  for phase in "context:$ctx/context" "outline:$outl/context?view=outline"; do
    echo "== ${phase%%:*}: $requests sequential curl GETs /v1/threads/${phase#*:}"
    start=$(date +%s.%N)
    for _ in $(seq 1 "$requests"); do
      curl -sf -o /dev/null "${auth[@]}" "$base/v1/threads/${phase#*:}"
    done
    end=$(date +%s.%N)
    awk -v p="${phase%%:*}" -v n="$requests" -v s="$start" -v e="$end" \
      'BEGIN { printf "%s: %d requests in %.2f s: %.1f requests/s\n", p, n, e - s, n / (e - s) }'
  done
fi
echo "load.sh: done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
