#!/usr/bin/env bash
# The hot path side by side, in one run (BENCHMARKS.md, "Summary"): durable appends and context
# reads against baselines measured in the same run, each phase on a fresh server and database.
#
# Usage: scripts/hotpath.sh BINARY sqlite|postgres
#   HOTPATH_DURATION seconds per wrk run, at most 20 (default 10); HOTPATH_RUNS runs (default 1)
#   HOTPATH_PG_ADMIN  admin URL of a PostgreSQL server for `postgres` (default: the tests' server)
#   HOTPATH_METADATA  the metadata (a JSON object) every thread is created with (default {})
#   HOTPATH_PHASES    the phases to run, space-separated (default: all); the server inherits the
#                     environment, so e.g. LOUPE_SQLITE_SYNCHRONOUS=full applies to it
# Phases, wrk -t2 -c8 on 127.0.0.1 only:
#   ceiling   GET /healthz: the bare axum stack (middleware and all), no database;
#   appends   POST …/messages, 2 messages of ~300 B, round-robin over 100 threads;
#   pg-append (postgres only) the same transaction an append makes, sent by pgbench with 8
#             clients on 2 threads straight to the database, no HTTP and no Loupe
#             (scripts/load/pg_append.sql): what PostgreSQL itself commits on this machine;
#   raw-1k    GET …/messages?limit=1000 of a 1,000-message thread: the same rows, each body
#             parsed and written back, no normalization (the raw baseline);
#   ctx-1k    GET …/context of that thread (Anthropic, normalized);
#   ctx-10k   GET …/context of a 10,000-message thread (auto-compaction off).
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/hotpath.sh BINARY sqlite|postgres}
backend=${2:?usage: scripts/hotpath.sh BINARY sqlite|postgres}
duration=${HOTPATH_DURATION:-10}
(( duration >= 1 && duration <= 20 )) || { echo "hotpath.sh: HOTPATH_DURATION must be 1–20" >&2; exit 2; }
runs=${HOTPATH_RUNS:-1}
default_phases="ceiling appends raw-1k ctx-1k ctx-10k"
[[ $backend == postgres ]] && default_phases="ceiling appends pg-append raw-1k ctx-1k ctx-10k"
phases=" ${HOTPATH_PHASES:-$default_phases} "
wanted() { [[ $phases == *" $1 "* ]]; }
pg_admin=${HOTPATH_PG_ADMIN:-postgres://loupe:loupe@127.0.0.1:5432/postgres}
command -v wrk >/dev/null || { echo "hotpath.sh: wrk is required" >&2; exit 2; }
tmp=$(mktemp -d)
server=
db=
cleanup() {
  [[ -n $server ]] && { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
  [[ -n $db ]] && psql -q "$pg_admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# start: a fresh database and server; sets $base.
start() {
  cleanup_server
  local url port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if [[ $backend == postgres ]]; then
    db="hotpath_$$_$RANDOM"
    psql -q "$pg_admin" -c "CREATE DATABASE $db" >/dev/null
    url="${pg_admin%/*}/$db"
  else
    rm -rf "$tmp/db"; mkdir -p "$tmp/db"
    url="sqlite://$tmp/db/loupe.db"
  fi
  DATABASE_URL=$url LOUPE_ADDR=127.0.0.1:$port LOUPE_RATE_LIMIT_PER_SEC=0 \
    LOUPE_AUTO_COMPACT_TOKENS=0 LOUPE_LOG_FORMAT=json RUST_LOG=warn \
    "$binary" serve >"$tmp/server.log" 2>&1 &
  server=$!
  base="http://127.0.0.1:$port"
  for _ in $(seq 1 100); do curl -sf "$base/readyz" >/dev/null && return; sleep 0.2; done
  echo "hotpath.sh: server did not start: $(tail -5 "$tmp/server.log")" >&2; exit 1
}
cleanup_server() {
  [[ -n $server ]] && { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
  server=
  [[ -n $db ]] && psql -q "$pg_admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  db=
}
new_thread() {
  curl -sf -o /dev/null -H 'Content-Type: application/json' \
    --data "{\"id\": \"$1\", \"metadata\": ${HOTPATH_METADATA:-{\}}}" "$base/v1/threads"
}
# fill THREAD N: N messages of agent rounds (prompt, assistant tool_use, tool_result, answer).
fill() {
  local thread=$1 n=$2 from
  for (( from = 0; from < n; from += 1000 )); do
    jq -cn --arg t "$thread" --argjson from "$from" --argjson n 1000 '
      {messages: [range($from / 4; ($from + $n) / 4) as $i | "\($t)-\($i)" as $u |
        {uuid: "\($u)-q", type: "user", message: {role: "user", content: "Round \($i): check the index of the append handler, it returns a conflict when stale."}},
        {uuid: "\($u)-a", type: "assistant", message: {role: "assistant", id: "msg_\($i)", content: [
          {type: "text", text: "Let me read the file."},
          {type: "tool_use", id: "toolu_\($i)", name: "Read", input: {file_path: "/src/store/messages.rs"}}]}},
        {uuid: "\($u)-r", type: "user", message: {role: "user", content: [{type: "tool_result", tool_use_id: "toolu_\($i)",
          content: ("let value = append(&tx, index)?; // line \($i)\n" * 4)}]}},
        {uuid: "\($u)-c", type: "assistant", message: {role: "assistant", id: "msg_\($i)_c", content: [
          {type: "text", text: "The handler re-reads the index before it writes; that is the fix for round \($i)."}]}}
      ]}' > "$tmp/fill.json"
    curl -sf -o /dev/null -H 'Content-Type: application/json' --data-binary "@$tmp/fill.json" \
      "$base/v1/threads/$thread/messages" || { echo "hotpath.sh: filling $thread failed" >&2; exit 1; }
  done
}
# measure NAME wrk-args…: one wrk run, summarized on one line.
measure() {
  local name=$1; shift
  wrk -t2 -c8 -d"${duration}s" --latency "$@" >"$tmp/wrk.out" 2>&1
  awk -v name="$name" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
    /Requests\/sec/ { rps = $2 }
    /^ +50%/ { p50 = $2 } /^ +99%/ { p99 = $2 }
    /Non-2xx/ { bad = $NF }
    END { printf "%-8s %10s req/s  p50 %8s  p99 %8s  non-2xx %s  (load %s)\n", name, rps, p50, p99, bad + 0, load }
  ' "$tmp/wrk.out"
}

echo "hotpath.sh: $backend, $(basename "$binary"), ${duration}s per phase, $runs run(s); $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for (( r = 1; r <= runs; r++ )); do
  if wanted ceiling; then
    start
    measure ceiling "$base/healthz"
  fi
  if wanted appends; then
    start
    run="a$RANDOM"
    for (( i = 0; i < 100; i++ )); do new_thread "$run-t$i"; done
    LOAD_RUN=$run LOAD_BATCH=2 LOAD_THREAD_COUNT=100 measure appends -s scripts/load/append_spread.lua "$base"
    curl -sf "$base/metrics" | awk '/^loupe_append_groups_total / { g = $2 }
      /^loupe_append_group_appends_total / { a = $2 }
      END { if (g > 0) printf "         %.2f appends per group commit (%d groups)\n", a / g, g }'
  fi
  if wanted pg-append && [[ $backend == postgres ]]; then
    command -v pgbench >/dev/null || { echo "hotpath.sh: pgbench is required for pg-append" >&2; exit 2; }
    start
    run="p$RANDOM"
    for (( i = 0; i < 100; i++ )); do new_thread "$run-t$i"; done
    tenant=$(psql -qAt "${pg_admin%/*}/$db" -c "SELECT tenant_id FROM threads LIMIT 1")
    pgbench -n -M prepared -c 8 -j 2 -T "$duration" -f scripts/load/pg_append.sql \
      -D tenant="$tenant" -D prefix="$run-t" \
      -D body="$(printf '{"type":"user","message":{"role":"user","content":"%s"}}' \
        "$(printf 'the append handler checks the index first. %.0s' 1 2 3 4 5 6)")" \
      "${pg_admin%/*}/$db" >"$tmp/pgbench.out" 2>&1 ||
      { echo "hotpath.sh: pgbench failed: $(tail -3 "$tmp/pgbench.out")" >&2; exit 1; }
    awk -v load="$(cut -d' ' -f1 /proc/loadavg)" '
      /^tps = / { tps = $3 } /latency average/ { avg = $4 " ms" }
      END { printf "%-8s %10s tx/s   avg %8s  (load %s)\n", "pg-append", tps, avg, load }
    ' "$tmp/pgbench.out"
  fi
  if wanted raw-1k || wanted ctx-1k || wanted ctx-10k; then
    start
    new_thread k1; fill k1 1000
    wanted raw-1k && measure raw-1k "$base/v1/threads/k1/messages?limit=1000"
    wanted ctx-1k && measure ctx-1k "$base/v1/threads/k1/context"
    if wanted ctx-10k; then
      new_thread k10; fill k10 10000
      measure ctx-10k "$base/v1/threads/k10/context"
    fi
  fi
done
echo "hotpath.sh: done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
