#!/usr/bin/env bash
# Smoke test of a running Loupe: create, append, page, idempotent re-append, a 4xx error.
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

call POST "/v1/threads/$thread/messages" '{"messages": [{"type": "robot"}]}'
expect 422 "invalid message"
[[ $(jq -r .type <<<"$body") == "urn:loupe:problem:validation" ]] || fail "validation type: $body"

call GET "/v1/threads/does-not-exist-$$"
expect 404 "unknown thread"

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

call DELETE "/v1/threads/$thread"
expect 204 "delete"
echo "smoke: ok ($base)"
