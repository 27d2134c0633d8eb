//! Retention (migration 0025): a tenant's policy and a thread's own, the expiry that lists apply
//! at once, and what the retention job (`crate::jobs::retention`) deletes and trims.
//!
//! A thread's own policy replaces its tenant's whole. A thread expires when it has been idle
//! (no append or metadata change, by `updated_at`) or has existed (by `created_at`) longer than
//! its policy allows. Expiry deletes it as `DELETE /v1/threads/{id}` does, with an `expired`
//! event first in the same transaction (so webhooks report it). A trimming policy erases the
//! entries before the context window (the last compact boundary, or the segment it preserved).

use sqlx::Row;

use super::expiry::unexpired;
use super::{Store, StoreError, TenantId, ThreadId, ThreadKey};

/// A retention policy; all `None`/`false` keeps everything for ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Delete after this long without a change.
    pub idle_ms: Option<i64>,
    /// Delete this long after creation.
    pub age_ms: Option<i64>,
    /// Erase what comes before the context window.
    pub trim: bool,
}

impl RetentionPolicy {
    /// Whether a thread with these times is expired at `now_ms`.
    pub fn expired(&self, created_at: i64, updated_at: i64, now_ms: i64) -> bool {
        self.idle_ms
            .is_some_and(|idle| updated_at.saturating_add(idle) <= now_ms)
            || self
                .age_ms
                .is_some_and(|age| created_at.saturating_add(age) <= now_ms)
    }

    /// When a thread with these times expires, if ever.
    pub fn expires_at(&self, created_at: i64, updated_at: i64) -> Option<i64> {
        let idle = self.idle_ms.map(|idle| updated_at.saturating_add(idle));
        let age = self.age_ms.map(|age| created_at.saturating_add(age));
        match (idle, age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A thread's retention as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRetention {
    /// The thread's own policy; `None` when it follows its tenant's.
    pub own: Option<RetentionPolicy>,
    pub tenant: RetentionPolicy,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ThreadRetention {
    pub fn effective(&self) -> RetentionPolicy {
        self.own.unwrap_or(self.tenant)
    }
}

/// A thread the sweep may trim.
#[derive(Debug, Clone)]
pub struct TrimCandidate {
    pub tenant: TenantId,
    pub thread_id: ThreadId,
    pub thread_key: ThreadKey,
    /// Entries below this seq were trimmed already.
    pub trimmed_below: i64,
    /// The thread's `updated_at` when read: it is checked again only once it changes.
    pub updated_at: i64,
}

/// The SQL condition of a thread expired at `now` (SQL: a parameter, or the time written in),
/// its `threads` columns named with `prefix` (`""`, or an alias and a dot): by its own policy,
/// or by `tenant`'s, whose limits are written in as the times they put.
fn expired_condition(tenant: &RetentionPolicy, now_ms: i64, now: &str, prefix: &str) -> String {
    let mut by_tenant = Vec::new();
    if let Some(idle) = tenant.idle_ms {
        by_tenant.push(format!(
            "{prefix}updated_at <= {}",
            now_ms.saturating_sub(idle)
        ));
    }
    if let Some(age) = tenant.age_ms {
        by_tenant.push(format!(
            "{prefix}created_at <= {}",
            now_ms.saturating_sub(age)
        ));
    }
    let by_tenant = if by_tenant.is_empty() {
        "1 = 0".to_owned()
    } else {
        by_tenant.join(" OR ")
    };
    super::expiry::expired_by(now, prefix, &by_tenant)
}

fn policy_from(idle: Option<i64>, age: Option<i64>, trim: i64) -> RetentionPolicy {
    RetentionPolicy {
        idle_ms: idle,
        age_ms: age,
        trim: trim != 0,
    }
}

impl Store {
    /// The tenant's policy (keep everything when it set none).
    pub async fn tenant_retention(&self, tenant: &TenantId) -> Result<RetentionPolicy, StoreError> {
        let row = sqlx::query(
            "SELECT idle_ms, age_ms, trim_before_boundary FROM tenant_retention \
             WHERE tenant_id = $1",
        )
        .bind(&tenant.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            None => RetentionPolicy::default(),
            Some(row) => policy_from(
                row.try_get("idle_ms")?,
                row.try_get("age_ms")?,
                row.try_get("trim_before_boundary")?,
            ),
        })
    }

    /// ` AND NOT <expired>` on the threads aliased `alias` for a read across the tenant's
    /// threads (`thread_key` is `None`): what lists leave out, search leaves out too. Empty for
    /// a read of one thread, whose head was read through [`unexpired`] already.
    pub(super) async fn unexpired_condition(
        &self,
        tenant: &TenantId,
        thread_key: Option<&ThreadKey>,
        alias: &str,
    ) -> Result<String, StoreError> {
        if thread_key.is_some() {
            return Ok(String::new());
        }
        let policy = self.tenant_retention(tenant).await?;
        let now = super::now_millis();
        Ok(format!(
            " AND NOT {}",
            expired_condition(&policy, now, &now.to_string(), &format!("{alias}."))
        ))
    }

    /// Sets the tenant's policy.
    pub async fn set_tenant_retention(
        &self,
        tenant: &TenantId,
        policy: &RetentionPolicy,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO tenant_retention (tenant_id, idle_ms, age_ms, trim_before_boundary, \
             updated_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id) DO UPDATE SET \
             idle_ms = excluded.idle_ms, age_ms = excluded.age_ms, \
             trim_before_boundary = excluded.trim_before_boundary, \
             updated_at = excluded.updated_at",
        )
        .bind(&tenant.0)
        .bind(policy.idle_ms)
        .bind(policy.age_ms)
        .bind(i64::from(policy.trim))
        .bind(super::now_millis())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// The thread's retention: its own policy, its tenant's, and its times. An expired thread
    /// is not found, as every read of one thread finds it.
    pub async fn thread_retention(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ThreadRetention, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT retention_own, retention_idle_ms, retention_age_ms, retention_trim, \
             created_at, updated_at FROM threads WHERE tenant_id = $1 AND thread_id = $2{}",
            unexpired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(super::now_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        let own = (row.try_get::<i64, _>("retention_own")? == 1)
            .then(|| {
                Ok::<_, StoreError>(policy_from(
                    row.try_get("retention_idle_ms")?,
                    row.try_get("retention_age_ms")?,
                    row.try_get("retention_trim")?,
                ))
            })
            .transpose()?;
        Ok(ThreadRetention {
            own,
            tenant: self.tenant_retention(tenant).await?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }

    /// Sets the thread's own policy, or (`None`) makes it follow its tenant's. Its times do not
    /// move: a policy change is not activity. An expired thread is not found: a new policy
    /// cannot bring it back. Returns the thread's retention as set (expired already, if the
    /// new policy says so: the change is made, and the thread is gone from then on).
    pub async fn set_thread_retention(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        policy: Option<&RetentionPolicy>,
    ) -> Result<ThreadRetention, StoreError> {
        let own = policy.copied().unwrap_or_default();
        let times = sqlx::query(&format!(
            "UPDATE threads SET retention_own = $3, retention_idle_ms = $4, \
             retention_age_ms = $5, retention_trim = $6, retention_checked_at = 0 \
             WHERE tenant_id = $1 AND thread_id = $2{} RETURNING created_at, updated_at",
            unexpired("threads.", "$7")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(i64::from(policy.is_some()))
        .bind(own.idle_ms)
        .bind(own.age_ms)
        .bind(i64::from(own.trim))
        .bind(super::now_millis())
        .fetch_optional(&self.writer)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok(ThreadRetention {
            own: policy.copied(),
            tenant: self.tenant_retention(tenant).await?,
            created_at: times.try_get("created_at")?,
            updated_at: times.try_get("updated_at")?,
        })
    }

    /// Up to `limit` threads expired at `now_ms`, of any tenant: those with a policy of their
    /// own (through their partial index), then each policy-holding tenant's (through the
    /// tenant's time indexes).
    pub async fn expired_threads(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(TenantId, ThreadId)>, StoreError> {
        let mut expired = Vec::new();
        let own = sqlx::query(&format!(
            "SELECT tenant_id, thread_id FROM threads WHERE retention_own = 1 AND {} LIMIT $2",
            expired_condition(&RetentionPolicy::default(), now_ms, "$1", "")
        ))
        .bind(now_ms.to_string())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        for row in own {
            expired.push((
                TenantId(row.try_get("tenant_id")?),
                ThreadId::new(row.try_get::<String, _>("thread_id")?),
            ));
        }
        let policies = sqlx::query(
            "SELECT tenant_id, idle_ms, age_ms FROM tenant_retention \
             WHERE idle_ms IS NOT NULL OR age_ms IS NOT NULL ORDER BY tenant_id",
        )
        .fetch_all(&self.pool)
        .await?;
        for policy_row in policies {
            let room = limit as usize - expired.len().min(limit as usize);
            if room == 0 {
                break;
            }
            let tenant: String = policy_row.try_get("tenant_id")?;
            let policy = policy_from(
                policy_row.try_get("idle_ms")?,
                policy_row.try_get("age_ms")?,
                0,
            );
            let rows = sqlx::query(&format!(
                "SELECT thread_id FROM threads WHERE tenant_id = $2 AND retention_own = 0 \
                 AND {} LIMIT $3",
                expired_condition(&policy, now_ms, "$1", "")
            ))
            .bind(now_ms.to_string())
            .bind(&tenant)
            .bind(room as i64)
            .fetch_all(&self.pool)
            .await?;
            for row in rows {
                expired.push((
                    TenantId(tenant.clone()),
                    ThreadId::new(row.try_get::<String, _>("thread_id")?),
                ));
            }
        }
        Ok(expired)
    }

    /// Deletes the tenant's thread if it is still expired at `now_ms` (an append since may have
    /// renewed it), with an `expired` event in the same transaction. Returns whether it did.
    pub async fn expire_thread(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let policy = self.tenant_retention(tenant).await?;
        let mut tx = self.writer.begin().await?;
        // A write first: it takes SQLite's write lock, or PostgreSQL's row lock, so the thread
        // cannot be renewed between this check and the delete.
        let key: Option<String> = sqlx::query_scalar(&format!(
            "UPDATE threads SET updated_at = updated_at WHERE tenant_id = $2 AND thread_id = $3 \
             AND {} RETURNING thread_key",
            expired_condition(&policy, now_ms, "$1", "")
        ))
        .bind(now_ms.to_string())
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(key) = key else {
            return Ok(false);
        };
        super::events::record_event(
            &mut tx,
            &key,
            "expired",
            &serde_json::json!({"expired_at": now_ms}),
            now_ms,
        )
        .await?;
        self.delete_thread_in(tx, tenant, thread_id).await?;
        Ok(true)
    }

    /// Up to `limit` threads whose policy trims and that changed since they were last checked:
    /// those with a trimming policy of their own (through their partial index), then the
    /// threads of each tenant whose policy trims (through the tenant's index). A tenant without
    /// such a policy costs nothing here.
    pub async fn trim_candidates(&self, limit: u32) -> Result<Vec<TrimCandidate>, StoreError> {
        const COLUMNS: &str =
            "tenant_id, thread_id, thread_key, retention_trimmed_below, updated_at";
        let mut rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM threads WHERE retention_own = 1 AND retention_trim = 1 \
             AND updated_at > retention_checked_at LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let tenants: Vec<String> = sqlx::query_scalar(
            "SELECT tenant_id FROM tenant_retention WHERE trim_before_boundary = 1 \
             ORDER BY tenant_id",
        )
        .fetch_all(&self.pool)
        .await?;
        for tenant in tenants {
            let room = (limit as usize).saturating_sub(rows.len());
            if room == 0 {
                break;
            }
            rows.extend(
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM threads WHERE tenant_id = $1 AND retention_own = 0 \
                     AND updated_at > retention_checked_at LIMIT $2"
                ))
                .bind(&tenant)
                .bind(room as i64)
                .fetch_all(&self.pool)
                .await?,
            );
        }
        rows.iter()
            .map(|row| {
                Ok(TrimCandidate {
                    tenant: TenantId(row.try_get("tenant_id")?),
                    thread_id: ThreadId::new(row.try_get::<String, _>("thread_id")?),
                    thread_key: ThreadKey::from_stored(row.try_get::<String, _>("thread_key")?),
                    trimmed_below: row.try_get("retention_trimmed_below")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Of the thread's entries with `from <= seq < below`, a page (at most `limit` entries,
    /// cut at 4 MiB of bodies, the first always in): the seqs not erased yet, and the last seq
    /// read (`None` when none was).
    pub async fn unerased_seqs_between(
        &self,
        thread_key: &ThreadKey,
        from: i64,
        below: i64,
        limit: u32,
    ) -> Result<(Vec<i64>, Option<i64>), StoreError> {
        let page = self
            .entries_between_by_key(thread_key, from - 1, below, limit, 4 * 1024 * 1024)
            .await?;
        let last = page.last().and_then(|entry| entry.seq);
        let seqs = page
            .into_iter()
            .filter(|entry| !entry.is_erased())
            .filter_map(|entry| entry.seq)
            .collect();
        Ok((seqs, last))
    }

    /// Records that the thread holds nothing to trim below `below`. It is checked again once
    /// it changes: if it ended at `next_seq` still (no entry, hence no boundary, came since the
    /// check read it), from its `updated_at` now, which the trim itself moved; else from
    /// `read_at`, the `updated_at` the check read.
    pub async fn mark_trimmed(
        &self,
        thread_key: &ThreadKey,
        below: i64,
        next_seq: i64,
        read_at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE threads SET retention_trimmed_below = $2, retention_checked_at = \
             CASE WHEN next_seq = $3 THEN updated_at ELSE $4 END WHERE thread_key = $1",
        )
        .bind(thread_key.as_str())
        .bind(below)
        .bind(next_seq)
        .bind(read_at)
        .execute(&self.writer)
        .await?;
        Ok(())
    }
}
