-- Tenants and their API keys. Keys are stored as the hex SHA-256 of the whole key, never in
-- plain text; `prefix` is the public part that names a key in listings and finds it at login.
CREATE TABLE tenants (
    tenant_id   TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE api_keys (
    key_id      TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (tenant_id),
    name        TEXT NOT NULL,
    prefix      TEXT NOT NULL UNIQUE,
    key_hash    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);
