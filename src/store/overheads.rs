//! What each model's requests carry that no stored entry holds (system prompt, tools), learned
//! per tenant from the first call of each context window (`docs/NORMALIZATION.md` § Token
//! estimate): a content-only estimate adds it.

use sqlx::{AnyConnection, Row};

use crate::history::normalize::{LearnedOverheads, Overhead};
use crate::store::{Store, StoreError, TenantId, ThreadKey};

/// Samples after which a new one moves the learned overhead by an eighth: a running mean that
/// follows a changed system prompt within a few threads.
const OVERHEAD_MEMORY: i64 = 8;

/// Models a tenant learns overheads for at once: a new model's first row is not written while
/// the tenant has this many learned in the last `STALE_AFTER_MILLIS`. Nothing is evicted in the
/// append's transaction: a delete there locks rows in another order than the upserts, and two
/// groups of one tenant deadlocked on PostgreSQL (found by the hostile-tenant attack).
const MAX_OVERHEAD_MODELS: i64 = 16;

/// After this long without a sample, a model's row no longer counts against the tenant's.
const STALE_AFTER_MILLIS: i64 = 30 * 24 * 3600 * 1000;

/// One sample into the tenant's overhead for its model: the mean and mean deviation move toward
/// it (a new row starts with a tenth of the sample as its spread, if the tenant has room).
pub(super) async fn learn_in(
    conn: &mut AnyConnection,
    thread_key: &ThreadKey,
    tenant: &str,
    model: &str,
    tokens: i64,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO overhead_sources (thread_key, tenant_id, model) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(thread_key.as_str())
    .bind(tenant)
    .bind(model)
    .execute(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO model_overheads (tenant_id, model, tokens, spread, samples, updated_at) \
         SELECT $1, $2, $3, $3 / 10, 1, $4 \
         WHERE EXISTS (SELECT 1 FROM model_overheads WHERE tenant_id = $1 AND model = $2) \
         OR (SELECT COUNT(*) FROM model_overheads WHERE tenant_id = $1 AND updated_at > $5) < $6 \
         ON CONFLICT (tenant_id, model) DO UPDATE SET \
         tokens = model_overheads.tokens + (excluded.tokens - model_overheads.tokens) / {weight}, \
         spread = model_overheads.spread \
         + (ABS(excluded.tokens - model_overheads.tokens) - model_overheads.spread) / {weight}, \
         samples = model_overheads.samples + 1, updated_at = excluded.updated_at",
        weight = format_args!(
            "(CASE WHEN model_overheads.samples + 1 < {OVERHEAD_MEMORY} \
             THEN model_overheads.samples + 1 ELSE {OVERHEAD_MEMORY} END)"
        ),
    ))
    .bind(tenant)
    .bind(model)
    .bind(tokens)
    .bind(now)
    .bind(now - STALE_AFTER_MILLIS)
    .bind(MAX_OVERHEAD_MODELS)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Forgets the overheads `thread_key` taught, in the caller's transaction: an erasure in the
/// thread or its deletion. Other threads' first calls of those models learn them again.
pub(super) async fn forget_taught_by(
    conn: &mut AnyConnection,
    thread_key: &ThreadKey,
) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM model_overheads WHERE EXISTS (SELECT 1 FROM overhead_sources s \
         WHERE s.thread_key = $1 AND s.tenant_id = model_overheads.tenant_id \
         AND s.model = model_overheads.model)",
    )
    .bind(thread_key.as_str())
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM overhead_sources WHERE thread_key = $1")
        .bind(thread_key.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A tenant's overheads read back, most recently learned first.
const MAX_READ: i64 = MAX_OVERHEAD_MODELS;

impl Store {
    /// The tenant's learned overheads; the upper bound of each is its mean and twice its mean
    /// deviation.
    pub async fn learned_overheads(
        &self,
        tenant: &TenantId,
    ) -> Result<LearnedOverheads, StoreError> {
        let rows = sqlx::query(
            "SELECT model, tokens, spread FROM model_overheads WHERE tenant_id = $1 \
             ORDER BY updated_at DESC, model LIMIT $2",
        )
        .bind(&tenant.0)
        .bind(MAX_READ)
        .fetch_all(&self.pool)
        .await?;
        let mut learned = Vec::with_capacity(rows.len());
        for row in rows {
            let tokens = row.try_get::<i64, _>("tokens")?.max(0) as u64;
            let spread = row.try_get::<i64, _>("spread")?.max(0) as u64;
            learned.push(Overhead {
                model_digest: row.try_get("model")?,
                tokens,
                upper_tokens: tokens.saturating_add(spread.saturating_mul(2)),
            });
        }
        Ok(LearnedOverheads(learned))
    }
}
