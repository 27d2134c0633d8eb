#!/usr/bin/env bash
# Smoke test of a running Loupe, one pass over every operation group: threads, appends, pages,
# errors, the context for each provider the served document names, rounds, normalize, snip,
# compaction and its job, cursors (pending, claim, advance), outline mode and zoom.
# Usage: scripts/smoke.sh [BASE_URL]   (default http://127.0.0.1:8080; LOUPE_API_KEY is sent when set)
set -euo pipefail
base=${1:-http://127.0.0.1:8080}
thread="smoke-$(date +%s)-$$"
auth=()
[[ -n ${LOUPE_API_KEY:-} ]] && auth=(-H "Authorization: Bearer $LOUPE_API_KEY")

fail() { echo "smoke: FAIL: $*" >&2; exit 1; }
# call METHOD PATH [BODY] -> prints the body; the status goes to $status
call() {
  local out
  out=$(curl -sS -X "$1" "${auth[@]}" -H 'Content-Type: application/json' -w '\n%{http_code}' \
    ${3:+--data "$3"} "$base$2") || fail "$1 $2: curl failed"
  status=${out##*$'\n'}
  body=${out%$'\n'*}
}
expect() { [[ $status == "$1" ]] || fail "$2: expected HTTP $1, got $status: $body"; }

call GET /readyz
expect 200 "readyz"

call POST /v1/threads "{\"id\": \"$thread\", \"metadata\": {\"source\": \"smoke\"}}"
expect 201 "create thread"
[[ $(jq -r .id <<<"$body") == "$thread" ]] || fail "create thread: wrong id in $body"

batch='{"messages": [
  {"uuid": "smoke-0", "type": "user", "message": {"role": "user", "content": "What is 50 * 50?"}},
  {"uuid": "smoke-1", "type": "assistant", "message": {"role": "assistant", "id": "msg_smoke_1",
   "content": [{"type": "text", "text": "2500"}]}}], "expected_next_seq": 0}'
call POST "/v1/threads/$thread/messages" "$batch"
expect 201 "append"
[[ $(jq -c '[.messages[].seq]' <<<"$body") == "[0,1]" ]] || fail "append: seqs in $body"

call POST "/v1/threads/$thread/messages" "$batch"
expect 200 "idempotent re-append"
[[ $(jq -r .replayed <<<"$body") == "true" ]] || fail "re-append: not a replay: $body"

call GET "/v1/threads/$thread/messages?limit=1"
expect 200 "page"
[[ $(jq -r '.messages[0].message.content' <<<"$body") == "What is 50 * 50?" ]] || fail "page 1: $body"
[[ $(jq -r .next_after_seq <<<"$body") == "0" ]] || fail "page 1 cursor: $body"
call GET "/v1/threads/$thread/messages?after_seq=0"
expect 200 "page 2"
[[ $(jq -r '.messages[0].seq' <<<"$body") == "1" ]] || fail "page 2: $body"

call POST "/v1/threads/$thread/messages" '{"messages": [{"uuid": "smoke-0", "type": "user", "message": {"role": "user", "content": "changed"}}]}'
expect 409 "uuid conflict"
[[ $(jq -r .type <<<"$body") == "urn:loupe:problem:uuid-conflict" ]] || fail "uuid conflict type: $body"

# Any entry type is stored (unknown ones verbatim), but a user entry must hold a user message.
call POST "/v1/threads/$thread/messages" '{"messages": [{"type": "user", "message": {"role": "assistant", "content": "hi"}}]}'
expect 422 "invalid message"
[[ $(jq -r .type <<<"$body") == "urn:loupe:problem:validation" ]] || fail "validation type: $body"

call GET "/v1/threads/does-not-exist-$$"
expect 404 "unknown thread"

# An entry of a type Loupe does not model, sent to a thread that does not exist: a problem, over
# the real server's whole stack (tests/api/problems.rs walks every route in process).
answer=$(curl -sS -o /dev/null -w '%{http_code} %{content_type}' -X POST "${auth[@]}" \
  -H 'Content-Type: application/json' --data '{"messages": [{"type": "robot"}]}' \
  "$base/v1/threads/does-not-exist-$$/messages") || fail "unknown type: curl failed"
[[ $answer == "404 application/problem+json" ]] || fail "unknown type on a missing thread: $answer"

# Outline mode through the server's own workers: a tiny tail budget moves old rounds into lines.
call PUT "/v1/threads/$thread/settings" '{"outline": {"enabled": true, "line_bytes": 64, "budget_bytes": 4000, "tail_tokens": 20}}'
expect 200 "outline on"
for i in 2 3 4 5; do
  call POST "/v1/threads/$thread/messages" "{\"messages\": [
    {\"uuid\": \"smoke-q$i\", \"type\": \"user\", \"message\": {\"role\": \"user\", \"content\": \"Question $i about the launch plan and its price\"}},
    {\"uuid\": \"smoke-a$i\", \"type\": \"assistant\", \"message\": {\"role\": \"assistant\", \"id\": \"msg_smoke_$i\",
     \"content\": [{\"type\": \"text\", \"text\": \"Answer $i: the plan holds at 49\"}]}}]}"
  expect 201 "append $i"
done
for _ in $(seq 1 50); do
  call GET "/v1/threads/$thread/outline"
  expect 200 "outline"
  [[ $(jq '.lines | length' <<<"$body") -gt 0 ]] && break
  sleep 0.2
done
[[ $(jq '.lines | length' <<<"$body") -gt 0 ]] || fail "the workers wrote no outline: $body"
call GET "/v1/threads/$thread/context?view=outline"
expect 200 "outlined context"
[[ $(jq -r '.tools[0].name' <<<"$body") == "zoom" ]] || fail "no zoom tool: $body"
call POST "/v1/threads/$thread/zoom" '{"id": 0, "n": 1}'
expect 200 "zoom"
[[ $(jq -r .content <<<"$body") == "0+1|user: What is 50 * 50?" ]] || fail "zoom(0, 1): $body"

# The context for every provider of the served document, rounds, normalize and snip, on a thread
# whose assistant asked for a tool and crashed (no tool_result).
ops="$thread-ops"
call POST /v1/threads "{\"id\": \"$ops\"}"
expect 201 "create ops thread"
call POST "/v1/threads/$ops/messages" '{"messages": [
  {"uuid": "ops-0", "type": "user", "message": {"role": "user", "content": "Weather in Oslo?"}},
  {"uuid": "ops-1", "type": "assistant", "message": {"role": "assistant", "id": "msg_ops_1",
   "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]}},
  {"uuid": "ops-2", "type": "user", "message": {"role": "user", "content": "And in Bergen?"}},
  {"uuid": "ops-3", "type": "assistant", "message": {"role": "assistant", "id": "msg_ops_3",
   "content": [{"type": "text", "text": "Rain, as always."}]}}]}'
expect 201 "append ops"
call GET /openapi.json
expect 200 "openapi.json"
providers=$(jq -r '.components.schemas.Provider.enum[]' <<<"$body")
[[ -n $providers ]] || fail "no providers in the served document"
for provider in $providers; do
  call GET "/v1/threads/$ops/context?provider=$provider"
  expect 200 "context $provider"
  [[ $(jq '.messages | length' <<<"$body") -gt 0 ]] || fail "context $provider: no messages: $body"
  [[ $(jq '[.repairs[] | select(.kind == "synthetic_tool_result")] | length' <<<"$body") == 1 ]] \
    || fail "context $provider: the missing tool_result is not repaired: $body"
done
call GET "/v1/threads/$ops/rounds"
expect 200 "rounds"
[[ $(jq '.rounds | length' <<<"$body") -ge 2 ]] || fail "rounds: $body"
call POST /v1/normalize '{"provider": "openai", "messages": [{"type": "user", "message": {"role": "user", "content": "hi"}}]}'
expect 200 "normalize"
[[ $(jq -r '.messages[0].role' <<<"$body") == "user" ]] || fail "normalize: $body"
call POST "/v1/threads/$ops/snip" '{"seqs": [2], "uuid": "ops-snip"}'
expect 201 "snip"
[[ $(jq -c '.snip.snip_metadata.removed_uuids' <<<"$body") == '["ops-2"]' ]] || fail "snip: $body"
call GET "/v1/threads/$ops/context"
expect 200 "context after snip"
jq -e '[.messages[] | tostring | contains("Bergen")] | any | not' <<<"$body" >/dev/null \
  || fail "the snipped message is still in the context: $body"

# Cursors: the count, the pending batch, a claim and the advance under its lease.
call GET "/v1/threads/$ops/cursors/smoke"
expect 200 "cursor"
[[ $(jq -r .new_count <<<"$body") -ge 4 ]] || fail "cursor new_count: $body"
call GET "/v1/threads/$ops/cursors/smoke/pending?limit=2"
expect 200 "pending"
[[ $(jq -r '.entry_count, .has_more' <<<"$body" | tr '\n' ' ') == "2 true " ]] || fail "pending: $body"
call POST "/v1/threads/$ops/cursors/smoke/claim" '{"limit": 2}'
expect 200 "claim"
to=$(jq -r .advance_to <<<"$body")
lease=$(jq -r .lease.token <<<"$body")
[[ $to == "ops-1" && $lease != null ]] || fail "claim: $body"
call POST "/v1/threads/$ops/cursors/smoke/advance" "{\"to\": \"$to\", \"lease\": \"$lease\"}"
expect 200 "advance"
[[ $(jq -r '.moved, .cursor.bookmark.uuid' <<<"$body" | tr '\n' ' ') == "true ops-1 " ]] || fail "advance: $body"

# Compaction through the server's own workers, polled to its end.
call POST "/v1/threads/$ops/compact" '{"keep_recent_rounds": 1}'
[[ $status == 202 || $status == 200 ]] || fail "compact: HTTP $status: $body"
job=$(jq -r .id <<<"$body")
for _ in $(seq 1 100); do
  call GET "/v1/jobs/$job"
  expect 200 "job"
  [[ $(jq -r .state <<<"$body") == succeeded || $(jq -r .state <<<"$body") == failed ]] && break
  sleep 0.2
done
[[ $(jq -r .state <<<"$body") == succeeded ]] || fail "compaction job: $body"

call DELETE "/v1/threads/$ops"
expect 204 "delete ops"
call DELETE "/v1/threads/$thread"
expect 204 "delete"
echo "smoke: ok ($base)"
