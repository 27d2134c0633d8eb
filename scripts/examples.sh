#!/usr/bin/env bash
# Runs every example of examples/ end to end against a Loupe server (LOUPE_BINARY, on a fresh
# SQLite file, open mode) and the local fake provider (examples/fake_provider.py), and checks what
# each must show (scripts/examples_check.py): a multi-turn tool loop, a crash between a tool call
# and its result that the next run survives, zoom and search calls the example answers from
# Loupe, and every request valid for its provider. Exits nonzero on any failure.
# Usage: scripts/examples.sh LOUPE_BINARY
# Needs python3, node and npm; the pinned SDKs come from scripts/requirements.txt (scripts/pyenv.sh)
# and examples/typescript/package-lock.json (npm ci, under target/examples/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
binary=$(realpath "${1:?usage: scripts/examples.sh LOUPE_BINARY}")
python=$("$root/scripts/pyenv.sh")
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
show_logs() {
  echo "--- loupe log: warnings and errors" >&2; grep -v '"level":"INFO"' "$work/loupe.log" | tail -n 40 >&2 || true
  echo "--- fake provider" >&2; cat "$work/provider.out" >&2 || true
}

# The TypeScript example: pinned packages, the Loupe client generated from the checked-in
# document, compiled with `tsc --strict` (no emit on error).
ts="$root/target/examples/typescript"
rm -rf "$ts/out" && mkdir -p "$ts"
cp "$root"/examples/typescript/{package.json,package-lock.json,tsconfig.json,chat_loop.ts} "$ts/"
(cd "$ts" && npm ci --no-audit --no-fund --loglevel=error >"$work/npm.log" 2>&1) || { cat "$work/npm.log" >&2; exit 1; }
(cd "$ts" && npx --no-install openapi-typescript "$root/openapi/openapi.json" -o loupe.d.ts >"$work/generate.log" 2>&1) \
  || { cat "$work/generate.log" >&2; exit 1; }
(cd "$ts" && npx --no-install tsc -p tsconfig.json)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
DATABASE_URL="sqlite://$work/loupe.db" LOUPE_ADDR="127.0.0.1:$port" LOUPE_LOG_FORMAT=json \
  "$binary" serve >"$work/loupe.log" 2>&1 &
pids+=($!)
loupe="http://127.0.0.1:$port"
for _ in $(seq 1 100); do curl -sf "$loupe/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "$loupe/healthz" >/dev/null || { show_logs; echo "examples: loupe did not start" >&2; exit 1; }

"$python" "$root/examples/fake_provider.py" "$work/provider.jsonl" >"$work/provider.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q '^listening on' "$work/provider.out" 2>/dev/null && break; sleep 0.1; done
fake_port=$(sed -n 's/^listening on //p' "$work/provider.out")
[[ -n $fake_port ]] || { show_logs; echo "examples: the fake provider did not start" >&2; exit 1; }

"$python" "$root/scripts/examples_check.py" workspace "$work/workspace"
export LOUPE_URL="$loupe" WORKSPACE="$work/workspace"
export ANTHROPIC_BASE_URL="http://127.0.0.1:$fake_port" ANTHROPIC_API_KEY=fake-key
export OPENAI_BASE_URL="http://127.0.0.1:$fake_port/v1" OPENAI_API_KEY=fake-key
unset LOUPE_API_KEY ANTHROPIC_AUTH_TOKEN OPENAI_ORG_ID OPENAI_PROJECT_ID 2>/dev/null || true
prompt="Read a.log, b.log and c.log, then tell me which request was the slowest."

# One example: a run that dies between a tool call and its result (exit 75), a run that resumes
# the same thread, then the checks on what both left.
failed=0
run() {
  local name=$1 api=$2
  shift 2
  local thread="example-$name" rc=0
  EXAMPLE_CRASH_AFTER_TOOL_CALL=1 "$@" "$thread" "$prompt" >"$work/$name-crash.out" 2>&1 || rc=$?
  if [[ $rc -ne 75 ]]; then
    cat "$work/$name-crash.out" >&2
    echo "examples: $name: the crash run exited $rc, not 75 (after appending its tool call)" >&2
    failed=1
    return
  fi
  if ! "$@" "$thread" >"$work/$name.out" 2>&1; then
    cat "$work/$name.out" >&2
    echo "examples: $name: the resumed run failed" >&2
    failed=1
  fi
  echo "examples: $name answered: $(tail -n 1 "$work/$name.out")"
  "$python" "$root/scripts/examples_check.py" check "$loupe" "$thread" "$api" "$work/provider.jsonl" "$work/workspace" \
    || failed=1
}
run anthropic_loop anthropic "$python" "$root/examples/python/anthropic_loop.py"
run openai_responses_loop responses "$python" "$root/examples/python/openai_responses_loop.py"
run chat_loop chat node "$ts/out/chat_loop.js"

if [[ $failed -ne 0 ]]; then
  show_logs
  echo "examples: FAILED" >&2
  exit 1
fi
echo "examples: ok"
