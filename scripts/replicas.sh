#!/usr/bin/env bash
# Primaries and streaming standbys on this machine, each pair clusters of its own so that the
# drills (tests/api/replicas.rs) may stop, kill and promote them. Sourced after
# scripts/postgres.sh (ensure_replicas), or run as `scripts/replicas.sh FUNCTION ARGS...` by the
# drills themselves.

# replica_pair NAME PRIMARY_PORT STANDBY_PORT [async|sync] [APPLY_DELAY]: clusters NAME_primary
# and NAME_standby, made once and started. The standby is a pg_basebackup -R of the primary;
# `sync` makes the primary wait for it at each commit (synchronous_standby_names), and
# APPLY_DELAY (like 200ms) holds its replay back so that lag always exists.
replica_pair() {
  local name=$1 primary_port=$2 standby_port=$3 mode=${4:-async} delay=${5:-0}
  local version
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  if ! pg_lsclusters -h | grep -q "^$version ${name}_primary "; then
    as_root pg_createcluster "$version" "${name}_primary" -p "$primary_port" >/dev/null
    as_root pg_conftool "$version" "${name}_primary" set wal_level replica
    as_root pg_conftool "$version" "${name}_primary" set max_wal_senders 8
  fi
  as_root pg_ctlcluster "$version" "${name}_primary" start 2>/dev/null || true
  wait_for_port "$primary_port"
  ensure_loupe_role "$primary_port"
  if ! pg_lsclusters -h | grep -q "^$version ${name}_standby "; then
    local standby_dir=/var/lib/postgresql/$version/${name}_standby
    as_root pg_createcluster "$version" "${name}_standby" -p "$standby_port" >/dev/null
    as_root rm -rf "$standby_dir"
    # A replication slot: the primary keeps the WAL the standby has not received, however long
    # the standby is stopped (a drill stops it).
    as_postgres psql -p "$primary_port" -qAtc \
      "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '${name}_standby'" >/dev/null
    as_postgres pg_basebackup -p "$primary_port" -D "$standby_dir" -R -X stream -c fast -C -S "${name}_standby"
    as_root pg_conftool "$version" "${name}_standby" set recovery_min_apply_delay "$delay"
    as_root pg_conftool "$version" "${name}_standby" set hot_standby_feedback on
  fi
  as_root pg_ctlcluster "$version" "${name}_standby" start 2>/dev/null || true
  wait_for_port "$standby_port"
  # Only now: with no standby yet, every commit on the primary would wait for ever.
  if [[ $mode == sync ]]; then
    as_root pg_conftool "$version" "${name}_primary" set synchronous_standby_names '*'
    as_root pg_conftool "$version" "${name}_primary" set synchronous_commit on
    as_root pg_ctlcluster "$version" "${name}_primary" reload
  fi
}

# fresh_pair NAME ...: replica_pair on new clusters (a drill that promoted a standby left the
# old ones forked).
fresh_pair() {
  local version
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  for role in primary standby; do
    if pg_lsclusters -h | grep -q "^$version ${1}_$role "; then
      as_root pg_dropcluster --stop "$version" "${1}_$role"
    fi
  done
  replica_pair "$@"
}

# pair_ctl NAME ROLE ACTION [ARGS...]: pg_ctlcluster on one cluster of a pair (stop -m immediate,
# promote, start).
pair_ctl() {
  local version
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  as_root pg_ctlcluster "$version" "${1}_$2" "$3" "${@:4}"
}

# pair_sql NAME ROLE SQL: runs SQL as the superuser on one cluster of a pair (a drill pauses the
# standby's replay with pg_wal_replay_pause(), which needs it).
pair_sql() {
  local version port
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  port=$(pg_lsclusters -h | awk -v v="$version" -v c="${1}_$2" '$1 == v && $2 == c { print $3 }')
  as_postgres psql -p "$port" -qAt -v ON_ERROR_STOP=1 -c "$3"
}

wait_for_port() {
  for _ in $(seq 1 60); do
    as_postgres psql -p "$1" -qAtc "SELECT 1" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "replicas.sh: nothing answers on port $1" >&2
  return 1
}

# The read drills' pair: a standby replaying 200 ms late. Exports TEST_PRIMARY_URL and
# TEST_STANDBY_URL.
ensure_replicas() {
  local primary_port=${LOUPE_DRILL_PRIMARY_PORT:-5442} standby_port=${LOUPE_DRILL_STANDBY_PORT:-5443}
  replica_pair drill "$primary_port" "$standby_port" async 200ms
  # Databases left behind by drills that failed in earlier runs.
  as_postgres psql -p "$primary_port" -qAtc "SELECT datname FROM pg_database WHERE datname LIKE 'loupe\_test\_%'" |
    while read -r name; do as_postgres psql -p "$primary_port" -qc "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" >/dev/null; done
  export TEST_PRIMARY_URL="postgres://loupe:loupe@127.0.0.1:$primary_port/postgres"
  export TEST_STANDBY_URL="postgres://loupe:loupe@127.0.0.1:$standby_port/postgres"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  source "$(dirname "$0")/postgres.sh"
  "$@"
fi
