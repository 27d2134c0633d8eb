# Sourced by scripts/test.sh: makes a local PostgreSQL available and exports TEST_DATABASE_URL.
# Installs Debian's packages when PostgreSQL is missing, starts a stopped cluster (and stops it
# again on exit), and never stops a server it did not start.

as_postgres() {
  if [[ $EUID -eq 0 ]]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}

as_root() {
  if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# ensure_loupe_role PORT: the role the tests connect as (loupe/loupe, may create databases).
ensure_loupe_role() {
  as_postgres psql -p "$1" -qAt -v ON_ERROR_STOP=1 >/dev/null <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'loupe') THEN
    CREATE ROLE loupe LOGIN PASSWORD 'loupe' CREATEDB;
  END IF;
END \$\$;
SQL
}

ensure_postgres() {
  if ! command -v pg_lsclusters >/dev/null || [[ -z $(ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null) ]]; then
    echo "postgres.sh: installing PostgreSQL from Debian's packages" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local line version cluster port status
  # The drills' own clusters (scripts/replicas.sh) are never the suite's database.
  line=$(pg_lsclusters -h | awk '$2 !~ /^(drill|failover)_/' | head -n 1)
  if [[ -z $line ]]; then
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    as_root pg_createcluster "$version" main >/dev/null
    line=$(pg_lsclusters -h | awk '$2 == "main"')
  fi
  read -r version cluster port status _ <<<"$line"
  if [[ $status != online* ]]; then
    echo "postgres.sh: starting PostgreSQL $version/$cluster on port $port" >&2
    as_root pg_ctlcluster "$version" "$cluster" start
    LOUPE_STARTED_POSTGRES="$version $cluster"
    trap 'echo "postgres.sh: stopping the PostgreSQL it started" >&2; as_root pg_ctlcluster $LOUPE_STARTED_POSTGRES stop' EXIT
  fi
  for _ in $(seq 1 30); do
    as_postgres psql -p "$port" -qAtc "SELECT 1" >/dev/null 2>&1 && break
    sleep 1
  done
  ensure_loupe_role "$port"
  # Per-test databases left behind by failed tests of earlier runs.
  as_postgres psql -p "$port" -qAtc "SELECT datname FROM pg_database WHERE datname LIKE 'loupe\_test\_%'" |
    while read -r name; do as_postgres psql -p "$port" -qc "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" >/dev/null; done
  export TEST_DATABASE_URL="postgres://loupe:loupe@127.0.0.1:$port/postgres"
}
