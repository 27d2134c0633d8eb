//! Tenants and API keys: create, list, revoke, authenticate.

use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{millis_to_datetime, now_millis, Store, StoreError, TenantId};
use crate::auth::{generate_key, hash_key, hashes_match, parse_key};

/// A stored tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRecord {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// A stored API key, without its secret.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub tenant: String,
    pub name: String,
    /// The public part of the key (`lp_<prefix>_…`).
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A key just created: the record and the plaintext key, which is never stored.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    pub record: ApiKeyRecord,
    pub plaintext: String,
}

/// Who an accepted key acts for.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyIdentity {
    pub key_id: String,
    pub tenant: TenantId,
}

const KEY_COLUMNS: &str = "key_id, tenant_id, name, prefix, created_at, revoked_at";

fn key_from_row(row: &AnyRow) -> Result<ApiKeyRecord, StoreError> {
    let revoked_at: Option<i64> = row.try_get("revoked_at")?;
    Ok(ApiKeyRecord {
        id: row.try_get("key_id")?,
        tenant: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
        revoked_at: revoked_at.map(millis_to_datetime),
    })
}

fn tenant_from_row(row: &AnyRow) -> Result<TenantRecord, StoreError> {
    Ok(TenantRecord {
        id: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
    })
}

impl Store {
    /// Creates a tenant; `TenantExists` when the id is taken.
    pub async fn create_tenant(
        &self,
        id: &TenantId,
        name: Option<&str>,
    ) -> Result<TenantRecord, StoreError> {
        let now = now_millis();
        let name = name.unwrap_or(&id.0).to_owned();
        let inserted = sqlx::query(
            "INSERT INTO tenants (tenant_id, name, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id) DO NOTHING",
        )
        .bind(&id.0)
        .bind(&name)
        .bind(now)
        .execute(&self.writer)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::TenantExists(id.0.clone()));
        }
        Ok(TenantRecord {
            id: id.0.clone(),
            name,
            created_at: millis_to_datetime(now),
        })
    }

    pub async fn list_tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT tenant_id, name, created_at FROM tenants ORDER BY created_at, tenant_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    /// Creates a key for `tenant` (creating the tenant when it does not exist yet). The plaintext
    /// key is returned once; only its hash is stored.
    pub async fn create_api_key(
        &self,
        tenant: &TenantId,
        name: Option<&str>,
    ) -> Result<CreatedKey, StoreError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        sqlx::query(
            "INSERT INTO tenants (tenant_id, name, created_at) VALUES ($1, $1, $2) \
             ON CONFLICT (tenant_id) DO NOTHING",
        )
        .bind(&tenant.0)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let key = generate_key();
        let record = ApiKeyRecord {
            id: format!("key_{}", uuid::Uuid::now_v7().simple()),
            tenant: tenant.0.clone(),
            name: name.unwrap_or_default().to_owned(),
            prefix: key.prefix.clone(),
            created_at: millis_to_datetime(now),
            revoked_at: None,
        };
        // A prefix collision (1 in 36^8) fails the unique constraint and the caller retries.
        sqlx::query(
            "INSERT INTO api_keys (key_id, tenant_id, name, prefix, key_hash, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&record.id)
        .bind(&tenant.0)
        .bind(&record.name)
        .bind(&key.prefix)
        .bind(&key.hash)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(CreatedKey {
            record,
            plaintext: key.plaintext,
        })
    }

    /// Keys, oldest first, of one tenant or of all.
    pub async fn list_api_keys(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = match tenant {
            Some(tenant) => {
                sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, key_id"
                ))
                .bind(&tenant.0)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, key_id"
                ))
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(key_from_row).collect()
    }

    /// Revokes a key; revoking a revoked key is a no-op. `KeyNotFound` when there is no such key.
    pub async fn revoke_api_key(&self, key_id: &str) -> Result<(), StoreError> {
        let updated = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE key_id = $1",
        )
        .bind(key_id)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::KeyNotFound);
        }
        Ok(())
    }

    /// True when at least one key is not revoked (the service then runs keyed).
    pub async fn has_active_api_keys(&self) -> Result<bool, StoreError> {
        let found: Option<String> =
            sqlx::query_scalar("SELECT key_id FROM api_keys WHERE revoked_at IS NULL LIMIT 1")
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.is_some())
    }

    /// Whether the database has ever held an API key, revoked ones included: once it has,
    /// serving without keys must be asked for explicitly.
    pub async fn has_had_api_keys(&self) -> Result<bool, StoreError> {
        let found: Option<String> = sqlx::query_scalar("SELECT key_id FROM api_keys LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.is_some())
    }

    /// The tenant an active key acts for; `None` for a malformed, unknown or revoked key.
    pub async fn authenticate_api_key(&self, key: &str) -> Result<Option<KeyIdentity>, StoreError> {
        let Some(prefix) = parse_key(key) else {
            return Ok(None);
        };
        let presented = hash_key(key);
        let row = sqlx::query(
            "SELECT key_id, tenant_id, key_hash FROM api_keys WHERE prefix = $1 AND revoked_at IS NULL",
        )
        .bind(prefix)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let stored: String = row.try_get("key_hash")?;
        if !hashes_match(&presented, &stored) {
            return Ok(None);
        }
        Ok(Some(KeyIdentity {
            key_id: row.try_get("key_id")?,
            tenant: TenantId(row.try_get("tenant_id")?),
        }))
    }
}
