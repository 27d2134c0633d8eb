//! Webhooks: a tenant's endpoints and the outbox of their deliveries (migration 0024).
//!
//! Deliveries are queued by triggers in the transaction of the change they report, so the
//! outbox holds exactly what committed. [`Store::claim_deliveries`] hands the due ones to the
//! sender (`crate::webhooks`) under a lease, one per endpoint at a time, and
//! [`Store::finish_delivery`] records the attempt: a sender killed mid-way leaves its claims to
//! expire and be sent again (at least once; receivers deduplicate by the delivery's id).

use sqlx::Row;

use super::{millis_to_datetime, Store, StoreError, TenantId};

/// The event kinds an endpoint may take.
pub const WEBHOOK_KINDS: &[&str] = &[
    "entries.appended",
    "thread.created",
    "thread.deleted",
    "thread.erasure",
    "thread.expired",
    "thread.trimmed",
];

/// Attempts a delivery gets before it is `failed` (a replay starts it again).
pub const MAX_DELIVERY_ATTEMPTS: i64 = 8;

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
    /// Registers an endpoint of the tenant's for `kinds` (checked by the caller).
    pub async fn create_webhook(
        &self,
        tenant: &TenantId,
        url: &str,
        kinds: &[String],
        description: Option<&str>,
        secret: &str,
    ) -> Result<WebhookEndpoint, StoreError> {
        let endpoint_id = format!("wh_{}", uuid::Uuid::now_v7().simple());
        let kinds = format!(",{},", kinds.join(","));
        let row = sqlx::query(&format!(
            "INSERT INTO webhook_endpoints (tenant_id, endpoint_id, url, secret, kinds, \
             description, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             RETURNING {ENDPOINT_COLUMNS}"
        ))
        .bind(&tenant.0)
        .bind(&endpoint_id)
        .bind(url)
        .bind(secret)
        .bind(&kinds)
        .bind(description)
        .bind(super::now_millis())
        .fetch_one(&self.writer)
        .await?;
        endpoint_from_row(&row)
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
        .fetch_all(&self.writer)
        .await?;
        rows.iter().map(endpoint_from_row).collect()
    }

    /// How many endpoints the tenant has.
    pub async fn webhook_count(&self, tenant: &TenantId) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM webhook_endpoints WHERE tenant_id = $1")
                .bind(&tenant.0)
                .fetch_one(&self.writer)
                .await?,
        )
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
        .fetch_optional(&self.writer)
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
        .fetch_all(&self.writer)
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
        delivery_from_row(&row)
    }

    /// Claims up to `limit` due deliveries until `now_ms + lease_ms`: for each endpoint with
    /// none in flight, its oldest due one (so one endpoint, however slow, holds one sender, and
    /// its events arrive in order unless one is retried). A claim whose lease ran out (its
    /// sender died) is due again.
    pub async fn claim_deliveries(
        &self,
        now_ms: i64,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        let due = "((d.state = 'pending' AND d.next_attempt_at <= $1) \
                   OR (d.state = 'sending' AND d.lease_until <= $1))";
        let rows = sqlx::query(&format!(
            "UPDATE webhook_deliveries SET state = 'sending', lease_until = $2, \
             attempts = attempts + 1 \
             WHERE delivery_id IN (SELECT MIN(d.delivery_id) FROM webhook_deliveries d \
             WHERE {due} AND NOT EXISTS (SELECT 1 FROM webhook_deliveries s \
             WHERE s.tenant_id = d.tenant_id AND s.endpoint_id = d.endpoint_id \
             AND s.state = 'sending' AND s.lease_until > $1) \
             GROUP BY d.tenant_id, d.endpoint_id LIMIT $3) \
             AND {} \
             RETURNING delivery_id, tenant_id, endpoint_id, kind, data, created_at, attempts",
            due.replace("d.", "")
        ))
        .bind(now_ms)
        .bind(now_ms + lease_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.writer)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let tenant: String = row.try_get("tenant_id")?;
            let endpoint_id: String = row.try_get("endpoint_id")?;
            let delivery_id: i64 = row.try_get("delivery_id")?;
            let endpoint = sqlx::query(
                "SELECT url, secret FROM webhook_endpoints WHERE tenant_id = $1 \
                 AND endpoint_id = $2",
            )
            .bind(&tenant)
            .bind(&endpoint_id)
            .fetch_optional(&self.writer)
            .await?;
            // The endpoint was deleted meanwhile: its deliveries go with it.
            let Some(endpoint) = endpoint else { continue };
            claimed.push(DueDelivery {
                delivery_id,
                url: endpoint.try_get("url")?,
                secret: endpoint.try_get("secret")?,
                kind: row.try_get("kind")?,
                data: row.try_get("data")?,
                created_at_ms: row.try_get("created_at")?,
                attempt: row.try_get("attempts")?,
            });
        }
        Ok(claimed)
    }

    /// Records how attempt `attempt` of a claimed delivery ended. Nothing is written when the
    /// claim is no longer this one (its lease ran out and another sender took it).
    pub async fn finish_delivery(
        &self,
        delivery: &DueDelivery,
        outcome: &AttemptOutcome,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (state, status, error, next): (&str, Option<u16>, Option<&str>, i64) = match outcome {
            AttemptOutcome::Delivered { status } => ("delivered", Some(*status), None, now_ms),
            AttemptOutcome::Failed {
                status,
                error,
                retry_at_ms,
            } => {
                let last = delivery.attempt >= MAX_DELIVERY_ATTEMPTS;
                let state = if last { "failed" } else { "pending" };
                (state, *status, Some(error.as_str()), *retry_at_ms)
            }
            AttemptOutcome::Refused { error } => ("failed", None, Some(error.as_str()), now_ms),
        };
        sqlx::query(
            "UPDATE webhook_deliveries SET state = $1, last_status = $2, last_error = $3, \
             next_attempt_at = $4, lease_until = NULL, \
             delivered_at = CASE WHEN $1 = 'delivered' THEN $5 ELSE delivered_at END \
             WHERE delivery_id = $6 AND state = 'sending' AND attempts = $7",
        )
        .bind(state)
        .bind(status.map(i64::from))
        .bind(error.map(|e| super::clip(e, 500).into_owned()))
        .bind(next)
        .bind(now_ms)
        .bind(delivery.delivery_id)
        .bind(delivery.attempt)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Removes deliveries that ended (delivered or failed) before `before_ms`.
    pub async fn prune_deliveries(&self, before_ms: i64) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "DELETE FROM webhook_deliveries WHERE state IN ('delivered', 'failed') \
             AND created_at < $1",
        )
        .bind(before_ms)
        .execute(&self.writer)
        .await?
        .rows_affected())
    }
}
