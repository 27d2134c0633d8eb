#!/usr/bin/env bash
# Peak memory of `loupe import` as the file grows: generates Claude Code-shaped JSON Lines files of
# the given sizes (copies of the session fixture, every uuid made unique per copy) and imports each
# into a fresh SQLite database, printing size, entries, peak RSS and wall time.
#
#   scripts/import-memory.sh target/release/loupe 100 1000      # sizes in MB
#
# Flat memory means the peak RSS does not grow with the file. Needs GNU time (/usr/bin/time).
set -euo pipefail
bin=${1:?usage: import-memory.sh LOUPE_BINARY SIZE_MB...}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/loupe-import-memory.XXXXXX")
trap 'rm -rf "$work"' EXIT

printf '%8s %10s %12s %10s\n' "file MB" entries "peak RSS MB" "seconds"
for mb in "$@"; do
  file="$work/session-$mb.jsonl"
  python3 - "$root/tests/fixtures/claude-code/session.jsonl" "$file" "$mb" <<'PY'
import re, sys
source, target, megabytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(source, encoding="utf-8").read()
uuid = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-)([0-9a-f]{12})")
limit, copy = megabytes * 1_000_000, 0
with open(target, "w", encoding="utf-8") as out:
    while out.tell() < limit:
        # Each copy renames every uuid (and so every parent link) consistently.
        out.write(uuid.sub(lambda m: f"{m.group(1)}{copy:06x}{m.group(2)[6:]}", text))
        copy += 1
PY
  entries=$(wc -l <"$file")
  db="$work/loupe-$mb.db"
  start=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$work/rss" "$bin" import "$file" --thread "import-$mb" \
    --database-url "sqlite://$db" >/dev/null 2>"$work/stderr" || { cat "$work/stderr" >&2; exit 1; }
  end=$(date +%s.%N)
  rss_kb=$(tail -n 1 "$work/rss")
  printf '%8d %10d %12.1f %10.1f\n' "$mb" "$entries" "$(echo "$rss_kb / 1024" | bc -l)" \
    "$(echo "$end - $start" | bc -l)"
  rm -f "$file" "$db" "$db-wal" "$db-shm"
done
