//! Webhooks: a tenant's endpoints and the outbox of their deliveries (migration 0024).
//!
//! Deliveries are queued by triggers in the transaction of the change they report, so the
//! outbox holds exactly what committed. The sender (`crate::webhooks`) asks for
//! [`Store::endpoints_due`], claims one with [`Store::claim_endpoint`] (a lease on the endpoint,
//! and its oldest unsent delivery) and records the attempt with [`Store::finish_delivery`]: a
//! sender killed mid-way leaves its claim to run out, and the delivery is sent again (at least
//! once; receivers deduplicate by the delivery's id). After a failed attempt the endpoint waits
//! before its next; every query reaches the unsent deliveries through a partial index.

use sqlx::Row;

use super::{millis_to_datetime, Store, StoreError, TenantId};

/// The event kinds an endpoint may take.
pub const WEBHOOK_KINDS: &[&str] = &[
    "entries.appended",
    "thread.created",
    "thread.deleted",
    "thread.erasure",
    "thread.expired",
    "thread.outline",
    "thread.trimmed",
];

/// Attempts a delivery gets before it is `failed` (a replay starts it again).
pub const MAX_DELIVERY_ATTEMPTS: i64 = 8;

/// Most unsent deliveries an endpoint keeps: past them, the oldest are `failed` as dropped
/// (still listed, and replayable), so an endpoint that is down holds bounded storage.
pub const MAX_UNSENT_PER_ENDPOINT: i64 = 10_000;

/// Most ended deliveries (delivered, failed or dropped) an endpoint keeps: past them, the oldest
/// are removed however young, so an endpoint that takes every event holds bounded storage.
pub const MAX_ENDED_PER_ENDPOINT: i64 = 10_000;

/// Deliveries [`Store::drop_backlogs`] fails, or [`Store::prune_deliveries`] removes, in one
/// statement.
pub const DROP_CHUNK: i64 = 2_000;

/// Most endpoints a tenant may register.
pub const MAX_WEBHOOKS_PER_TENANT: i64 = 16;

/// The endpoints with something to send now: not claimed, not waiting after a failure, least
/// recently claimed first.
pub const DUE_ENDPOINTS_SQL: &str = "SELECT e.tenant_id, e.endpoint_id FROM webhook_endpoints e \
     WHERE (e.busy_until IS NULL OR e.busy_until <= $1) AND (e.retry_at IS NULL OR e.retry_at <= $1) \
     AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.tenant_id = e.tenant_id \
     AND d.endpoint_id = e.endpoint_id AND d.state IN ('pending', 'sending')) \
     ORDER BY e.last_claimed_at, e.tenant_id, e.endpoint_id LIMIT $2";

/// An endpoint's oldest unsent delivery.
pub const HEAD_DELIVERY_SQL: &str = "SELECT delivery_id, kind, data, created_at, attempts \
     FROM webhook_deliveries WHERE tenant_id = $1 AND endpoint_id = $2 \
     AND state IN ('pending', 'sending') ORDER BY delivery_id LIMIT 1";

/// A registered endpoint. `secret` is only ever shown when it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub endpoint_id: String,
    pub url: String,
    pub secret: String,
    pub kinds: Vec<String>,
    pub description: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// One delivery of one event to one endpoint, as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    pub delivery_id: i64,
    pub endpoint_id: String,
    pub kind: String,
    pub thread_id: String,
    /// The event's JSON (`thread_id` and seqs; never entry content).
    pub data: serde_json::Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// `pending`, `sending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub delivered_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A claimed delivery with what sending it needs.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub tenant_id: String,
    pub endpoint_id: String,
    /// The endpoint's claim: its outcome is recorded only while the claim is still this one.
    pub busy_until: i64,
    pub delivery_id: i64,
    pub url: String,
    pub secret: String,
    pub kind: String,
    pub data: String,
    pub created_at_ms: i64,
    /// This attempt's number, from 1: the claim's token when its outcome is recorded.
    pub attempt: i64,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    Delivered {
        status: u16,
    },
    /// Try again at `retry_at_ms`, unless this was the last attempt.
    Failed {
        status: Option<u16>,
        error: String,
        retry_at_ms: i64,
    },
    /// Not sent, and never will be as it stands (an address the service may not reach).
    Refused {
        error: String,
    },
}

const ENDPOINT_COLUMNS: &str = "endpoint_id, url, secret, kinds, description, created_at";
const DELIVERY_COLUMNS: &str = "delivery_id, endpoint_id, kind, thread_id, data, created_at, \
     state, attempts, next_attempt_at, last_status, last_error, delivered_at";

fn endpoint_from_row(row: &sqlx::any::AnyRow) -> Result<WebhookEndpoint, StoreError> {
    let kinds: String = row.try_get("kinds")?;
    Ok(WebhookEndpoint {
        endpoint_id: row.try_get("endpoint_id")?,
        url: row.try_get("url")?,
        secret: row.try_get("secret")?,
        kinds: kinds
            .split(',')
            .filter(|kind| !kind.is_empty())
            .map(str::to_owned)
            .collect(),
        description: row.try_get("description")?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
    })
}

fn delivery_from_row(row: &sqlx::any::AnyRow) -> Result<WebhookDelivery, StoreError> {
    let data: String = row.try_get("data")?;
    let state: String = row.try_get("state")?;
    let waiting = state == "pending";
    Ok(WebhookDelivery {
        delivery_id: row.try_get("delivery_id")?,
        endpoint_id: row.try_get("endpoint_id")?,
        kind: row.try_get("kind")?,
        thread_id: row.try_get("thread_id")?,
        data: serde_json::from_str(&data)
            .map_err(|e| StoreError::Corrupt(format!("webhook delivery: {e}")))?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
        next_attempt_at: waiting
            .then(|| row.try_get("next_attempt_at").map(millis_to_datetime))
            .transpose()?,
        state,
        attempts: row.try_get("attempts")?,
        last_status: row.try_get("last_status")?,
        last_error: row.try_get("last_error")?,
        delivered_at: row
            .try_get::<Option<i64>, _>("delivered_at")?
            .map(millis_to_datetime),
    })
}

impl Store {
    /// Registers an endpoint of the tenant's for `kinds` (checked by the caller), unless it has
    /// [`MAX_WEBHOOKS_PER_TENANT`] already (`None`). The count and the insert are one
    /// transaction, serialized per tenant (SQLite's write lock; a PostgreSQL advisory lock).
    pub async fn create_webhook(
        &self,
        tenant: &TenantId,
        url: &str,
        kinds: &[String],
        description: Option<&str>,
        secret: &str,
    ) -> Result<Option<WebhookEndpoint>, StoreError> {
        let endpoint_id = format!("wh_{}", uuid::Uuid::now_v7().simple());
        let kinds = format!(",{},", kinds.join(","));
        let mut tx = self.writer.begin().await?;
        if self.backend == super::Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('loupe_webhooks:' || $1))")
                .bind(&tenant.0)
                .execute(&mut *tx)
                .await?;
        }
        let row = sqlx::query(&format!(
            "INSERT INTO webhook_endpoints (tenant_id, endpoint_id, url, secret, kinds, \
             description, created_at) SELECT $1, $2, $3, $4, $5, $6, $7 \
             WHERE (SELECT COUNT(*) FROM webhook_endpoints WHERE tenant_id = $1) < $8 \
             RETURNING {ENDPOINT_COLUMNS}"
        ))
        .bind(&tenant.0)
        .bind(&endpoint_id)
        .bind(url)
        .bind(secret)
        .bind(&kinds)
        .bind(description)
        .bind(super::now_millis())
        .bind(MAX_WEBHOOKS_PER_TENANT)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.as_ref().map(endpoint_from_row).transpose()
    }

    /// The tenant's endpoints, oldest first.
    pub async fn list_webhooks(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<WebhookEndpoint>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE tenant_id = $1 \
             ORDER BY created_at, endpoint_id"
        ))
        .bind(&tenant.0)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(endpoint_from_row).collect()
    }

    /// One of the tenant's endpoints.
    pub async fn get_webhook(
        &self,
        tenant: &TenantId,
        endpoint_id: &str,
    ) -> Result<WebhookEndpoint, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints \
             WHERE tenant_id = $1 AND endpoint_id = $2"
        ))
        .bind(&tenant.0)
        .bind(endpoint_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::WebhookNotFound)?;
        endpoint_from_row(&row)
    }

    /// Removes an endpoint and its deliveries, in one transaction.
    pub async fn delete_webhook(
        &self,
        tenant: &TenantId,
        endpoint_id: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        let deleted =
            sqlx::query("DELETE FROM webhook_endpoints WHERE tenant_id = $1 AND endpoint_id = $2")
                .bind(&tenant.0)
                .bind(endpoint_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if deleted == 0 {
            return Err(StoreError::WebhookNotFound);
        }
        sqlx::query("DELETE FROM webhook_deliveries WHERE tenant_id = $1 AND endpoint_id = $2")
            .bind(&tenant.0)
            .bind(endpoint_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The endpoint's deliveries after `after_id`, oldest first, at most `limit`, only those
    /// in `state` when given.
    pub async fn webhook_deliveries(
        &self,
        tenant: &TenantId,
        endpoint_id: &str,
        state: Option<&str>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        self.get_webhook(tenant, endpoint_id).await?;
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
             WHERE tenant_id = $1 AND endpoint_id = $2 AND delivery_id > $3 \
             AND ($4 = '' OR state = $4) ORDER BY delivery_id LIMIT $5"
        ))
        .bind(&tenant.0)
        .bind(endpoint_id)
        .bind(after_id)
        .bind(state.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }

    /// Sends a delivery again, whatever became of it: pending now, its attempts counted anew.
    pub async fn replay_delivery(
        &self,
        tenant: &TenantId,
        endpoint_id: &str,
        delivery_id: i64,
        now_ms: i64,
    ) -> Result<WebhookDelivery, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE webhook_deliveries SET state = 'pending', attempts = 0, \
             next_attempt_at = $4, lease_until = NULL \
             WHERE tenant_id = $1 AND endpoint_id = $2 AND delivery_id = $3 \
             RETURNING {DELIVERY_COLUMNS}"
        ))
        .bind(&tenant.0)
        .bind(endpoint_id)
        .bind(delivery_id)
        .bind(now_ms)
        .fetch_optional(&self.writer)
        .await?
        .ok_or(StoreError::DeliveryNotFound)?;
        // Asked for now: the endpoint's wait after a failure does not hold it back.
        sqlx::query(
            "UPDATE webhook_endpoints SET retry_at = NULL WHERE tenant_id = $1 AND endpoint_id = $2",
        )
        .bind(&tenant.0)
        .bind(endpoint_id)
        .execute(&self.writer)
        .await?;
        delivery_from_row(&row)
    }

    /// Up to `limit` endpoints with a delivery to send at `now_ms` ([`DUE_ENDPOINTS_SQL`]).
    pub async fn endpoints_due(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(DUE_ENDPOINTS_SQL)
            .bind(now_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("tenant_id")?, row.try_get("endpoint_id")?)))
            .collect()
    }

    /// Claims the endpoint until `now_ms + lease_ms` if it is due, and its oldest unsent
    /// delivery with it: `None` when another sender took it first or it has nothing to send.
    pub async fn claim_endpoint(
        &self,
        tenant_id: &str,
        endpoint_id: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<DueDelivery>, StoreError> {
        let busy_until = now_ms + lease_ms;
        let mut tx = self.writer.begin().await?;
        let endpoint = sqlx::query(
            "UPDATE webhook_endpoints SET busy_until = $3, last_claimed_at = $4 \
             WHERE tenant_id = $1 AND endpoint_id = $2 \
             AND (busy_until IS NULL OR busy_until <= $4) AND (retry_at IS NULL OR retry_at <= $4) \
             RETURNING url, secret",
        )
        .bind(tenant_id)
        .bind(endpoint_id)
        .bind(busy_until)
        .bind(now_ms)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(endpoint) = endpoint else {
            return Ok(None);
        };
        let head = sqlx::query(HEAD_DELIVERY_SQL)
            .bind(tenant_id)
            .bind(endpoint_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(head) = head else {
            sqlx::query(
                "UPDATE webhook_endpoints SET busy_until = NULL \
                 WHERE tenant_id = $1 AND endpoint_id = $2",
            )
            .bind(tenant_id)
            .bind(endpoint_id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(None);
        };
        let delivery_id: i64 = head.try_get("delivery_id")?;
        let attempt = head.try_get::<i64, _>("attempts")? + 1;
        sqlx::query(
            "UPDATE webhook_deliveries SET state = 'sending', attempts = $2, lease_until = $3 \
             WHERE delivery_id = $1",
        )
        .bind(delivery_id)
        .bind(attempt)
        .bind(busy_until)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(DueDelivery {
            tenant_id: tenant_id.to_owned(),
            endpoint_id: endpoint_id.to_owned(),
            busy_until,
            delivery_id,
            url: endpoint.try_get("url")?,
            secret: endpoint.try_get("secret")?,
            kind: head.try_get("kind")?,
            data: head.try_get("data")?,
            created_at_ms: head.try_get("created_at")?,
            attempt,
        }))
    }

    /// Records how a claimed attempt ended and gives the endpoint back (waiting until the
    /// retry's time after a failure that is not the last). Nothing is written once the claim is
    /// no longer this one (its lease ran out and another sender took the endpoint).
    pub async fn finish_delivery(
        &self,
        delivery: &DueDelivery,
        outcome: &AttemptOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (state, status, error, retry_at): (&str, Option<u16>, Option<&str>, Option<i64>) =
            match outcome {
                AttemptOutcome::Delivered { status } => ("delivered", Some(*status), None, None),
                AttemptOutcome::Failed {
                    status,
                    error,
                    retry_at_ms,
                } if delivery.attempt < MAX_DELIVERY_ATTEMPTS => {
                    ("pending", *status, Some(error.as_str()), Some(*retry_at_ms))
                }
                AttemptOutcome::Failed { status, error, .. } => {
                    ("failed", *status, Some(error.as_str()), None)
                }
                AttemptOutcome::Refused { error } => ("failed", None, Some(error.as_str()), None),
            };
        let mut tx = self.writer.begin().await?;
        let released = sqlx::query(
            "UPDATE webhook_endpoints SET busy_until = NULL, retry_at = $4 \
             WHERE tenant_id = $1 AND endpoint_id = $2 AND busy_until = $3",
        )
        .bind(&delivery.tenant_id)
        .bind(&delivery.endpoint_id)
        .bind(delivery.busy_until)
        .bind(retry_at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if released == 1 {
            sqlx::query(
                "UPDATE webhook_deliveries SET state = $1, last_status = $2, last_error = $3, \
                 next_attempt_at = $4, lease_until = NULL, \
                 delivered_at = CASE WHEN $1 = 'delivered' THEN $5 ELSE delivered_at END \
                 WHERE delivery_id = $6 AND attempts = $7",
            )
            .bind(state)
            .bind(status.map(i64::from))
            .bind(error.map(|e| super::storable_text(&super::clip(e, 500)).into_owned()))
            .bind(retry_at.unwrap_or(now_ms))
            .bind(now_ms)
            .bind(delivery.delivery_id)
            .bind(delivery.attempt)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Fails, as dropped, the oldest unsent deliveries of every endpoint past
    /// [`MAX_UNSENT_PER_ENDPOINT`], `DROP_CHUNK` rows a statement (one long write would hold
    /// SQLite's writer from appends). Returns how many.
    pub async fn drop_backlogs(&self) -> Result<u64, StoreError> {
        let dropped = format!(
            "UPDATE webhook_deliveries SET state = 'failed', lease_until = NULL, \
             last_error = 'dropped: the endpoint fell more than {MAX_UNSENT_PER_ENDPOINT} \
             deliveries behind' WHERE delivery_id IN (SELECT delivery_id \
             FROM webhook_deliveries WHERE tenant_id = $1 AND endpoint_id = $2 \
             AND state = 'pending' AND delivery_id < $3 ORDER BY delivery_id LIMIT $4)"
        );
        self.past_newest_per_endpoint("'pending', 'sending'", MAX_UNSENT_PER_ENDPOINT, &dropped)
            .await
    }

    /// Removes ended deliveries (delivered, failed or dropped): those created before
    /// `before_ms`, and each endpoint's past its newest [`MAX_ENDED_PER_ENDPOINT`], however
    /// young, `DROP_CHUNK` rows a statement (one long delete would hold SQLite's writer from
    /// appends). Returns how many.
    pub async fn prune_deliveries(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut pruned = 0;
        loop {
            let done = sqlx::query(
                "DELETE FROM webhook_deliveries WHERE delivery_id IN (SELECT delivery_id \
                 FROM webhook_deliveries WHERE state IN ('delivered', 'failed') \
                 AND created_at < $1 LIMIT $2)",
            )
            .bind(before_ms)
            .bind(DROP_CHUNK)
            .execute(&self.writer)
            .await?
            .rows_affected();
            pruned += done;
            if done < DROP_CHUNK as u64 {
                break;
            }
        }
        let ended = "DELETE FROM webhook_deliveries WHERE delivery_id IN (SELECT delivery_id \
             FROM webhook_deliveries WHERE tenant_id = $1 AND endpoint_id = $2 \
             AND state IN ('delivered', 'failed') AND delivery_id < $3 \
             ORDER BY delivery_id LIMIT $4)";
        pruned += self
            .past_newest_per_endpoint("'delivered', 'failed'", MAX_ENDED_PER_ENDPOINT, ended)
            .await?;
        Ok(pruned)
    }

    /// Runs `write` on each endpoint's deliveries older than its newest `keep` in `states`
    /// (`$1` tenant, `$2` endpoint, `$3` the oldest delivery kept, `$4` at most `DROP_CHUNK`
    /// rows), a chunk at a time so that no long write holds SQLite's writer from appends.
    /// Returns the rows written.
    async fn past_newest_per_endpoint(
        &self,
        states: &str,
        keep: i64,
        write: &str,
    ) -> Result<u64, StoreError> {
        let endpoints = sqlx::query("SELECT tenant_id, endpoint_id FROM webhook_endpoints")
            .fetch_all(&self.pool)
            .await?;
        let newest = format!(
            "SELECT delivery_id FROM webhook_deliveries WHERE tenant_id = $1 \
             AND endpoint_id = $2 AND state IN ({states}) \
             ORDER BY delivery_id DESC LIMIT 1 OFFSET $3"
        );
        let mut written = 0;
        for endpoint in endpoints {
            let tenant: String = endpoint.try_get("tenant_id")?;
            let endpoint_id: String = endpoint.try_get("endpoint_id")?;
            let kept_from: Option<i64> = sqlx::query_scalar(&newest)
                .bind(&tenant)
                .bind(&endpoint_id)
                .bind(keep - 1)
                .fetch_optional(&self.pool)
                .await?;
            let Some(kept_from) = kept_from else { continue };
            loop {
                let done = sqlx::query(write)
                    .bind(&tenant)
                    .bind(&endpoint_id)
                    .bind(kept_from)
                    .bind(DROP_CHUNK)
                    .execute(&self.writer)
                    .await?
                    .rows_affected();
                written += done;
                if done < DROP_CHUNK as u64 {
                    break;
                }
            }
        }
        Ok(written)
    }
}
