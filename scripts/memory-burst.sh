#!/usr/bin/env bash
# Resident memory of the server around a burst: a 20,000-message thread (~6 MB) is written, read
# whole as context 5 times, then compacted, on a fresh SQLite database. Prints VmRSS (now) and VmHWM
# (peak so far) from /proc after each phase, and again after 10 s idle.
#
#   scripts/memory-burst.sh target/release/loupe [ENV=VALUE …]
#
# Extra arguments are environment settings for the server, to compare allocator tunings, e.g.
#   scripts/memory-burst.sh target/release/loupe MALLOC_ARENA_MAX=2 MALLOC_TRIM_THRESHOLD_=131072
set -euo pipefail
bin=${1:?usage: memory-burst.sh LOUPE_BINARY [ENV=VALUE…]}
shift
work=$(mktemp -d "${TMPDIR:-/tmp}/loupe-memory.XXXXXX")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env "$@" LOUPE_RATE_LIMIT_PER_SEC=0 LOUPE_AUTO_COMPACT_TOKENS=0 RUST_LOG=warn \
  "$bin" serve --addr "127.0.0.1:$port" --database-url "sqlite://$work/loupe.db" >"$work/log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$port" "$server" <<'PY'
import json, sys, time, urllib.request
port, pid = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"

def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"null")

def memory(phase):
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    rss, peak = (int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    print(f"{phase:<28} RSS {rss:7.1f} MB   peak {peak:7.1f} MB", flush=True)

for _ in range(100):
    try:
        call("GET", "/healthz"); break
    except Exception:
        time.sleep(0.1)
memory("started")
call("POST", "/v1/threads", {"id": "burst"})
text = "The parser reads the amount, checks the currency and rounds half to even. " * 4
for start in range(0, 20_000, 500):
    batch = []
    for i in range(start, start + 500):
        if i % 2 == 0:
            batch.append({"type": "user", "uuid": f"q{i}", "message": {"role": "user", "content": text}})
        else:
            batch.append({"type": "assistant", "uuid": f"a{i}", "message": {"id": f"msg_{i}",
                          "role": "assistant", "content": [{"type": "text", "text": text}]}})
    call("POST", "/v1/threads/burst/messages", {"messages": batch})
memory("20,000 messages appended")
for _ in range(5):
    call("GET", "/v1/threads/burst/context")
memory("5 whole-context reads")
job = call("POST", "/v1/threads/burst/compact", {})
job_id = job.get("job", job).get("id") if isinstance(job.get("job", job), dict) else job["id"]
for _ in range(600):
    state = call("GET", f"/v1/jobs/{job_id}")["state"]
    if state in ("succeeded", "failed"):
        break
    time.sleep(0.1)
memory(f"compaction {state}")
time.sleep(10)
memory("10 s later")
PY
