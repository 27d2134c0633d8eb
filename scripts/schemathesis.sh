#!/usr/bin/env bash
# Property-based contract test: schemathesis 4 (pinned in scripts/requirements.txt) generates
# requests from the checked-in openapi/openapi.json and checks every answer of a running Loupe
# against it: every check, every phase, a fixed seed, and 0 failures allowed. Accepted
# exclusions are in scripts/schemathesis.toml, each with its reason.
# Usage: LOUPE_API_KEY=<tenant key> scripts/schemathesis.sh BASE_URL
# Run the server in keyed mode with the rate limit off (LOUPE_RATE_LIMIT_PER_SEC=0), or 429s
# hide the rest of the answers.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/schemathesis.sh BASE_URL}
: "${LOUPE_API_KEY:?set LOUPE_API_KEY to a tenant key}"
python=$(scripts/pyenv.sh)
schemathesis="$(dirname "$python")/schemathesis"
# A bounded number of examples per operation keeps the run to a few minutes on two cores.
examples=${SCHEMATHESIS_MAX_EXAMPLES:-20}
# The import's JSON form (an array of entries) is what schemathesis sends it; it cannot serialize
# JSON Lines (application/x-ndjson), which tests/api/transcripts.rs covers instead (the HTTP import
# on both backends, byte-for-byte round trips).
# A thread's event stream (followThread, text/event-stream) does not end while the thread
# lives, and schemathesis reads an answer whole: tests/api/events.rs covers it instead (resume,
# ids, errors, on both backends).
exec "$schemathesis" --config-file scripts/schemathesis.toml run openapi/openapi.json \
  --url "$base" \
  --exclude-operation-id followThread \
  --header "Authorization: Bearer $LOUPE_API_KEY" \
  --checks all \
  --phases examples,coverage,fuzzing,stateful \
  --seed 20261201 \
  --max-examples "$examples" \
  --workers 1 \
  --no-color
