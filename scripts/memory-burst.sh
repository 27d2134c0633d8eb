#!/usr/bin/env bash
# Resident memory of the server around a burst: a 20,000-message thread (~6 MB; BURST_MESSAGES
# sets another length) is written, read whole as context 5 times, then compacted, on a fresh
# SQLite database. Prints VmRSS (now) and VmHWM (peak so far) from /proc after each phase, and
# again after 10 s idle.
#
# Then each of the heavy operations alone, each on a freshly started server over the same
# database: one whole-context read and one compaction of a second, uncompacted copy of the
# thread. "rise" is the peak above the RSS the server had just before, so it is what that one
# operation held at most.
#
#   scripts/memory-burst.sh target/release/loupe [ENV=VALUE …]
#   BURST_MESSAGES=40000 scripts/memory-burst.sh target/release/loupe   # another thread length
#
# Extra arguments are environment settings for the server, to compare allocator tunings, e.g.
#   scripts/memory-burst.sh target/release/loupe MALLOC_ARENA_MAX=2 MALLOC_TRIM_THRESHOLD_=131072
set -euo pipefail
bin=${1:?usage: memory-burst.sh LOUPE_BINARY [ENV=VALUE…]}
shift
work=$(mktemp -d "${TMPDIR:-/tmp}/loupe-memory.XXXXXX")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server=
start_server() {
  env "$@" LOUPE_RATE_LIMIT_PER_SEC=0 LOUPE_AUTO_COMPACT_TOKENS=0 RUST_LOG=warn \
    "$bin" serve --addr "127.0.0.1:$port" --database-url "sqlite://$work/loupe.db" >>"$work/log" 2>&1 &
  server=$!
}
stop_server() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap 'stop_server; rm -rf "$work"' EXIT

cat >"$work/phases.py" <<'PY'
import json, sys, time, urllib.request
port, pid, mode, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
base_url = f"http://127.0.0.1:{port}"
text = "The parser reads the amount, checks the currency and rounds half to even. " * 4

def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"null")

def readings():
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))

def memory(phase, started_at=None):
    rss, peak = readings()
    rise = "" if started_at is None else f"   rise {peak - started_at:6.1f} MB"
    print(f"{phase:<28} RSS {rss:7.1f} MB   peak {peak:7.1f} MB{rise}", flush=True)

def reset_peak():
    # Writing 5 resets VmHWM to the current RSS: the next peak is the coming operation's own.
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return readings()[0]

def compact(thread):
    job_id = call("POST", f"/v1/threads/{thread}/compact", {})["id"]
    for _ in range(600):
        state = call("GET", f"/v1/jobs/{job_id}")["state"]
        if state in ("succeeded", "failed"):
            return state
        time.sleep(0.1)
    return "still running"

def append_thread(thread):
    call("POST", "/v1/threads", {"id": thread})
    for start in range(0, count, 500):
        batch = []
        for i in range(start, min(start + 500, count)):
            if i % 2 == 0:
                batch.append({"type": "user", "uuid": f"q{i}", "message": {"role": "user", "content": text}})
            else:
                batch.append({"type": "assistant", "uuid": f"a{i}", "message": {"id": f"msg_{i}",
                              "role": "assistant", "content": [{"type": "text", "text": text}]}})
        call("POST", f"/v1/threads/{thread}/messages", {"messages": batch})

for _ in range(100):
    try:
        call("GET", "/healthz"); break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit("the server did not answer /healthz within 10 s")

if mode == "burst":
    memory("started")
    append_thread("burst")
    memory(f"{count:,} messages appended")
    for _ in range(5):
        call("GET", "/v1/threads/burst/context")
    memory("5 whole-context reads")
    state = compact("burst")
    memory(f"compaction {state}")
    time.sleep(10)
    memory("10 s later")
    append_thread("alone")  # read and compacted alone below, each on a fresh server
elif mode == "context":
    before = reset_peak()
    call("GET", "/v1/threads/alone/context")
    memory("alone: 1 context read", before)
elif mode == "compaction":
    before = reset_peak()
    state = compact("alone")
    memory(f"alone: compaction {state}", before)
PY

start_server "$@"
count=${BURST_MESSAGES:-20000}
python3 "$work/phases.py" "$port" "$server" burst "$count"
for phase in context compaction; do
  stop_server
  start_server "$@"
  python3 "$work/phases.py" "$port" "$server" "$phase" "$count"
done
