#!/usr/bin/env bash
# The whole test suite, on SQLite and PostgreSQL. Uses TEST_DATABASE_URL when set; otherwise
# starts the machine's PostgreSQL (installing it with apt when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${TEST_DATABASE_URL:-} ]]; then
  source scripts/postgres.sh
  ensure_postgres
fi
cargo test --locked --workspace "$@"
