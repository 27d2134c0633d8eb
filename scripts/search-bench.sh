#!/usr/bin/env bash
# Search on a long thread, on a fresh SQLite database (or PostgreSQL: pass its URL): a thread of
# SEARCH_MESSAGES messages (100,000 by default; tool calls and results of a coding session, with
# a path, an error code and a number planted once each) is imported, the first search indexes
# it (timed apart), then each query runs 20 times and the median and worst are printed beside
# a raw page read of 100 messages, the baseline of a read the database serves from an index.
#
#   scripts/search-bench.sh target/release/loupe [DATABASE_URL]
set -euo pipefail
bin=${1:?usage: search-bench.sh LOUPE_BINARY [DATABASE_URL]}
work=$(mktemp -d "${TMPDIR:-/tmp}/loupe-search.XXXXXX")
url=${2:-sqlite://$work/loupe.db}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOUPE_RATE_LIMIT_PER_SEC=0 LOUPE_AUTO_COMPACT_TOKENS=0 RUST_LOG=warn \
  "$bin" serve --addr "127.0.0.1:$port" --database-url "$url" >>"$work/log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$port" "${SEARCH_MESSAGES:-100000}" <<'PY'
import json, statistics, sys, time, urllib.parse, urllib.request
port, count = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
for _ in range(100):
    try:
        urllib.request.urlopen(base + "/healthz").read(); break
    except Exception:
        time.sleep(0.1)
def call(method, path, body=None, kind="application/json"):
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method, headers={"content-type": kind})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())
thread = f"search-{int(time.time())}"
call("POST", "/v1/threads", {"id": thread})
plant = {count // 7 // 2 * 2: "src/store/jobs.rs", count // 3 // 2 * 2: "E0282", count // 2 // 2 * 2: "7-4-1-9"}
lines = []
for i in range(count):
    if i % 2 == 0:
        text = f"Step {i}: run the tests of module m{i % 97} and read the report"
        if i in plant: text += f" about {plant[i]}"
        entry = {"type": "user", "uuid": f"u{i}", "message": {"role": "user", "content": text}}
    else:
        text = f"The tests of module m{i % 97} pass; {i % 13} warnings remain in the handler"
        if i - 1 in plant: text += f" ({plant[i - 1]} too)"
        entry = {"type": "assistant", "uuid": f"a{i}", "message": {"role": "assistant", "id": f"msg_{i}",
                 "content": [{"type": "text", "text": text}]}}
    lines.append(json.dumps(entry))
t = time.time()
report = call("POST", f"/v1/threads/{thread}/import", ("\n".join(lines) + "\n").encode(), "application/x-ndjson")
print(f"imported {report['stored']} messages in {time.time() - t:.1f} s")
def timed(path):
    t = time.perf_counter(); body = call("GET", path); return (time.perf_counter() - t) * 1000, body
first = 0.0
while True:
    ms, body = timed(f"/v1/threads/{thread}/search?q=E0282")
    first += ms
    if body["index"]["pending"] == 0: break
print(f"first search (indexes the thread): {first / 1000:.1f} s")
queries = ["src/store/jobs.rs", "E0282", "7-4-1-9", "warnings handler", "zebra"]
rows = [("page of 100 (baseline)", f"/v1/threads/{thread}/messages?limit=100&after_seq={count // 2}")]
rows += [(q, f"/v1/threads/{thread}/search?q=" + urllib.parse.quote(q)) for q in queries]
for name, path in rows:
    times = []
    for _ in range(20):
        ms, body = timed(path)
        times.append(ms)
    hits = len(body.get("hits", body.get("messages", [])))
    print(f"{name:28s} median {statistics.median(times):7.2f} ms  worst {max(times):7.2f} ms  ({hits} results)")
PY
