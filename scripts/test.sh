#!/usr/bin/env bash
# The whole test suite, on SQLite and PostgreSQL. Uses TEST_DATABASE_URL when set; otherwise
# starts the machine's PostgreSQL (installing it with apt when missing). The replication drills
# get clusters of their own (scripts/replicas.sh) unless TEST_PRIMARY_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${TEST_DATABASE_URL:-} ]]; then
  source scripts/postgres.sh
  ensure_postgres
fi
# The replication drills (tests/api/replicas.rs): a primary and a standby of their own.
if [[ -z ${TEST_PRIMARY_URL:-} ]]; then
  source scripts/postgres.sh
  source scripts/replicas.sh
  ensure_replicas
fi
cargo test --locked --workspace "$@"
