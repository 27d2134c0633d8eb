//! The durable job queue.
//!
//! A job is a row of `jobs`. It is enqueued inside the transaction of the write that causes it, is
//! claimed under a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL; on SQLite the claiming UPDATE is
//! one atomic statement under the single-writer lock), and is completed, failed or released only
//! by the claim that holds the lease (`lease_owner`, a fresh token per claim): a worker whose lease
//! expired and was taken over can no longer finish the job.
//!
//! Every function takes the time (`now_ms`, Unix milliseconds) so lease expiry and backoff are
//! tested without waiting.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Row, Transaction};
use utoipa::ToSchema;

use super::rows::{entry_from_row, insert_entries, BOUNDARY_ROWS};
use super::{Backend, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::Entry;
use crate::history::normalize::estimate::entry_features;

/// Which of a thread's jobs [`Store::thread_jobs`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadJobs {
    /// Every job, oldest first.
    All,
    /// The latest `n` jobs, newest first.
    Newest(u32),
}

/// The PostgreSQL `NOTIFY` channel an enqueue signals on.
pub const NOTIFY_CHANNEL: &str = "loupe_jobs";

/// Where a job is in its lifecycle (see `docs/COMPACTION.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting to be claimed (first run, or a retry after `run_after`).
    Pending,
    /// Claimed by a worker whose lease runs until `lease_expires_at`.
    Running,
    Succeeded,
    /// Every attempt failed; `last_error` says why.
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "pending" => JobState::Pending,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            other => return Err(StoreError::Corrupt(format!("job state {other:?}"))),
        })
    }
}

/// A stored job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: String,
    pub tenant_id: String,
    pub thread_key: Option<ThreadKey>,
    pub kind: String,
    pub state: JobState,
    pub payload: Value,
    pub result: Option<Value>,
    pub dedup_key: Option<String>,
    /// Claims so far, the running one included.
    pub attempts: i64,
    pub max_attempts: i64,
    pub run_after: i64,
    pub lease_expires_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub tenant: TenantId,
    pub thread_key: Option<ThreadKey>,
    pub kind: String,
    pub payload: Value,
    /// At most one pending or running job per key; enqueuing a second returns the first.
    pub dedup_key: Option<String>,
    pub max_attempts: i64,
}

#[derive(Debug, Clone)]
pub struct EnqueueOutcome {
    pub job: Job,
    /// False when a pending or running job with the same dedup key was returned instead.
    pub created: bool,
}

/// A job held by one claim. `lease` is the fencing token of the claim.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job: Job,
    pub lease: String,
}

/// What a compaction job writes, atomically with its completion.
#[derive(Debug, Clone)]
pub struct CompactionWrite {
    /// The seq of the last compact boundary when the job read the thread.
    pub expected_boundary_seq: Option<i64>,
    /// The thread's next seq when the job read it: entries from there on were appended while
    /// the job ran.
    pub read_next_seq: i64,
    /// The kept rounds as of the read, at the upper bound of the default rates (as the stored
    /// count counts them); the boundary and the summary are counted when they are written.
    pub kept_tokens: i64,
    /// The thread's redaction epoch read before the job read its sources: a snip or an
    /// erasure since then refuses the write ([`StoreError::SourcesChanged`]).
    pub epoch: i64,
}

const JOB_COLUMNS: &str = "job_id, tenant_id, thread_key, kind, state, payload, result, dedup_key, \
    attempts, max_attempts, run_after, lease_expires_at, last_error, created_at, updated_at, finished_at";

fn job_from_row(row: &AnyRow) -> Result<Job, StoreError> {
    let parse = |column: &str, text: String| {
        serde_json::from_str::<Value>(&text)
            .map_err(|e| StoreError::Corrupt(format!("job {column}: {e}")))
    };
    let payload: String = row.try_get("payload")?;
    let result: Option<String> = row.try_get("result")?;
    let state: String = row.try_get("state")?;
    Ok(Job {
        id: row.try_get("job_id")?,
        tenant_id: row.try_get("tenant_id")?,
        thread_key: row
            .try_get::<Option<String>, _>("thread_key")?
            .map(ThreadKey::from_stored),
        kind: row.try_get("kind")?,
        state: JobState::parse(&state)?,
        payload: parse("payload", payload)?,
        result: result.map(|r| parse("result", r)).transpose()?,
        dedup_key: row.try_get("dedup_key")?,
        attempts: row.try_get("attempts")?,
        max_attempts: row.try_get("max_attempts")?,
        run_after: row.try_get("run_after")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

/// Inserts a job in the caller's transaction, or returns the pending/running job holding its
/// dedup key. On PostgreSQL a `NOTIFY` is queued (delivered at commit).
pub(crate) async fn enqueue_in(
    conn: &mut AnyConnection,
    backend: Backend,
    new: &NewJob,
    now_ms: i64,
) -> Result<EnqueueOutcome, StoreError> {
    let payload = new.payload.to_string();
    // The existing job may finish between a conflicting insert and the read of it: try again.
    for _ in 0..3 {
        let job_id = format!("job_{}", uuid::Uuid::now_v7().simple());
        let inserted = sqlx::query(&format!(
            "INSERT INTO jobs (job_id, tenant_id, thread_key, kind, state, payload, dedup_key, \
             attempts, max_attempts, run_after, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'pending', $5, $6, 0, $7, $8, $8, $8) \
             ON CONFLICT DO NOTHING RETURNING {JOB_COLUMNS}"
        ))
        .bind(&job_id)
        .bind(&new.tenant.0)
        .bind(new.thread_key.as_ref().map(|key| key.as_str().to_owned()))
        .bind(&new.kind)
        .bind(&payload)
        .bind(new.dedup_key.clone())
        .bind(new.max_attempts.max(1))
        .bind(now_ms)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = inserted {
            if backend == Backend::Postgres {
                sqlx::query(&format!("NOTIFY {NOTIFY_CHANNEL}"))
                    .execute(&mut *conn)
                    .await?;
            }
            return Ok(EnqueueOutcome {
                job: job_from_row(&row)?,
                created: true,
            });
        }
        let existing = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE dedup_key = $1 AND state IN ('pending', 'running')"
        ))
        .bind(new.dedup_key.clone())
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = existing {
            let job = job_from_row(&row)?;
            // A running tree job may already have read past what this write added: mark it to
            // run again when it completes. When it completed meanwhile, insert a new one.
            if job.kind == super::KIND_TREE && job.state == JobState::Running {
                let marked = sqlx::query(
                    "UPDATE jobs SET payload = $2 WHERE job_id = $1 AND state = 'running'",
                )
                .bind(&job.id)
                .bind(RERUN_PAYLOAD)
                .execute(&mut *conn)
                .await?;
                if marked.rows_affected() == 0 {
                    continue;
                }
            }
            return Ok(EnqueueOutcome {
                job,
                created: false,
            });
        }
    }
    Err(StoreError::Corrupt(
        "a job with this dedup key keeps appearing and vanishing".to_owned(),
    ))
}

/// The dedup key of a thread's compaction: one pending or running compaction per thread.
pub(crate) fn compaction_dedup_key(thread_key: &ThreadKey) -> String {
    format!("compaction:{thread_key}")
}

/// First wait before auto-compaction tries a thread again after an attempt that failed or
/// found nothing to summarize; doubled per such attempt in a row, up to
/// [`AUTO_COMPACTION_RETRY_MAX_MS`].
pub const AUTO_COMPACTION_RETRY_BASE_MS: i64 = 60_000;
pub const AUTO_COMPACTION_RETRY_MAX_MS: i64 = 3_600_000;

/// Whether an append to a thread already above its auto-compaction threshold should enqueue
/// another compaction: none is pending or running, and the last ones (the latest few, newest
/// first) were unproductive (failed, or succeeded without compacting), the newest longer ago
/// than the backoff their number in a row calls for. When the latest worked (the context grew
/// back since), only the next crossing enqueues.
pub(crate) async fn auto_compaction_due(
    conn: &mut AnyConnection,
    thread_key: &ThreadKey,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let rows = sqlx::query(
        "SELECT state, result, updated_at FROM jobs WHERE thread_key = $1 AND kind = $2 \
         ORDER BY created_at DESC, job_id DESC LIMIT 8",
    )
    .bind(thread_key.as_str())
    .bind(super::KIND_COMPACTION)
    .fetch_all(&mut *conn)
    .await?;
    let mut unproductive = 0_u32;
    let mut newest_at = None;
    for row in &rows {
        let state: String = row.try_get("state")?;
        let result: Option<String> = row.try_get("result")?;
        let updated_at: i64 = row.try_get("updated_at")?;
        let compacted = result
            .as_deref()
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .and_then(|value| value.get("compacted").and_then(Value::as_bool))
            .unwrap_or(false);
        match state.as_str() {
            "pending" | "running" => return Ok(false),
            "succeeded" if compacted => break,
            _ => {
                unproductive += 1;
                newest_at.get_or_insert(updated_at);
            }
        }
    }
    let Some(newest_at) = newest_at else {
        // The last compaction worked (the context grew back since) or there is none: only a
        // crossing enqueues.
        return Ok(false);
    };
    let backoff = AUTO_COMPACTION_RETRY_BASE_MS
        .saturating_mul(1_i64 << (unproductive - 1).min(20))
        .min(AUTO_COMPACTION_RETRY_MAX_MS);
    Ok(now_ms >= newest_at.saturating_add(backoff))
}

/// The payload of a running tree job that a write made during its run marked to run again.
const RERUN_PAYLOAD: &str = r#"{"rerun":true}"#;

/// The dedup key of a thread's tree job: one pending or running tree job per thread, so two runs
/// never build (and pay the summarizer for) the same nodes. A write while it runs marks it to run
/// again ([`Store::complete_or_rerun`]).
pub(crate) fn tree_dedup_key(thread_key: &ThreadKey) -> String {
    format!("tree:{thread_key}")
}

/// Enqueues the thread's tree job (build the missing nodes, advance the outline) in the caller's
/// transaction, or finds the pending one.
pub(crate) async fn enqueue_tree_in(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant: &TenantId,
    thread_key: &ThreadKey,
    max_attempts: i64,
) -> Result<EnqueueOutcome, StoreError> {
    enqueue_in(
        conn,
        backend,
        &NewJob {
            tenant: tenant.clone(),
            thread_key: Some(thread_key.clone()),
            kind: super::KIND_TREE.to_owned(),
            payload: serde_json::json!({}),
            dedup_key: Some(tree_dedup_key(thread_key)),
            max_attempts,
        },
        super::now_millis(),
    )
    .await
}

/// A job's thread still exists (or it names none): a deleted thread's jobs are never read, even
/// in the moment before its delete removes them.
const THREAD_ALIVE: &str = "(jobs.thread_key IS NULL OR EXISTS \
     (SELECT 1 FROM threads t WHERE t.thread_key = jobs.thread_key))";

impl Store {
    /// Completes the claimed job, unless a write marked it to run again while it ran: then it
    /// is pending again at once, its payload cleared and the attempt not counted. Returns
    /// whether it completed. [`StoreError::LeaseLost`] when the claim no longer holds the job.
    pub async fn complete_or_rerun(
        &self,
        claimed: &ClaimedJob,
        result: &Value,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        // One statement: every CASE reads the payload as it was, under the row's write lock, so
        // a mark made concurrently is either seen here or finds the job no longer running.
        let state: Option<String> = sqlx::query_scalar(
            "UPDATE jobs SET \
             state = CASE WHEN payload = $5 THEN 'pending' ELSE 'succeeded' END, \
             attempts = CASE WHEN payload = $5 THEN attempts - 1 ELSE attempts END, \
             finished_at = CASE WHEN payload = $5 THEN NULL ELSE $4 END, \
             result = CASE WHEN payload = $5 THEN NULL ELSE $3 END, \
             payload = '{}', run_after = $4, lease_owner = NULL, lease_expires_at = NULL, \
             updated_at = $4 \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' RETURNING state",
        )
        .bind(&claimed.job.id)
        .bind(&claimed.lease)
        .bind(result.to_string())
        .bind(now_ms)
        .bind(RERUN_PAYLOAD)
        .fetch_optional(&self.writer)
        .await?;
        match state.as_deref() {
            Some("succeeded") => Ok(true),
            Some(_) => {
                self.job_signal.notify_one();
                Ok(false)
            }
            None => Err(StoreError::LeaseLost(claimed.job.id.clone())),
        }
    }

    /// Gives back every running job whose claim was made under `owner_prefix` (the workers of a
    /// process before it restarted): pending at once, the attempt not counted, instead of
    /// waiting for their leases to run out. Returns how many were released.
    pub async fn release_jobs_of(
        &self,
        owner_prefix: &str,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "UPDATE jobs SET state = 'pending', \
             attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, \
             lease_owner = NULL, lease_expires_at = NULL, run_after = $2, updated_at = $2 \
             WHERE state = 'running' AND substr(lease_owner, 1, length($1)) = $1",
        )
        .bind(owner_prefix)
        .bind(now_ms)
        .execute(&self.writer)
        .await?
        .rows_affected())
    }

    /// Deletes the thread's succeeded jobs of `kind` other than `keep`: jobs that run after
    /// every append (tree jobs) would otherwise grow the table by a row per message. Failed jobs
    /// stay, with their errors, for people to read.
    pub async fn prune_succeeded_jobs(
        &self,
        thread_key: &ThreadKey,
        kind: &str,
        keep: &str,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "DELETE FROM jobs WHERE thread_key = $1 AND kind = $2 AND state = 'succeeded' \
             AND job_id <> $3",
        )
        .bind(thread_key.as_str())
        .bind(kind)
        .bind(keep)
        .execute(&self.writer)
        .await?
        .rows_affected())
    }

    /// Enqueues the thread's tree job and wakes this process's workers.
    pub async fn enqueue_tree(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut tx = self.writer.begin().await?;
        let thread_key = Store::thread_key_in(&mut tx, tenant, thread_id).await?;
        let outcome = enqueue_tree_in(
            &mut tx,
            self.backend,
            tenant,
            &thread_key,
            self.job_max_attempts,
        )
        .await?;
        tx.commit().await?;
        if outcome.created {
            self.job_signal.notify_one();
        }
        Ok(outcome)
    }

    /// Enqueues a job in a transaction of its own and wakes this process's workers.
    pub async fn enqueue_job(
        &self,
        new: &NewJob,
        now_ms: i64,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut tx = self.writer.begin().await?;
        let outcome = enqueue_in(&mut tx, self.backend, new, now_ms).await?;
        tx.commit().await?;
        if outcome.created {
            self.job_signal.notify_one();
        }
        Ok(outcome)
    }

    /// Enqueues a compaction of a thread (deduplicated per thread). `payload` must name the
    /// thread (`thread_id`).
    pub async fn enqueue_compaction(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        payload: Value,
        max_attempts: i64,
        now_ms: i64,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut tx = self.writer.begin().await?;
        let thread_key = Store::thread_key_in(&mut tx, tenant, thread_id).await?;
        let new = NewJob {
            tenant: tenant.clone(),
            dedup_key: Some(compaction_dedup_key(&thread_key)),
            thread_key: Some(thread_key),
            kind: super::KIND_COMPACTION.to_owned(),
            payload,
            max_attempts,
        };
        let outcome = enqueue_in(&mut tx, self.backend, &new, now_ms).await?;
        tx.commit().await?;
        if outcome.created {
            self.job_signal.notify_one();
        }
        Ok(outcome)
    }

    /// The job, when it belongs to the tenant.
    pub async fn get_job(&self, tenant: &TenantId, job_id: &str) -> Result<Job, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = $1 AND tenant_id = $2 \
             AND {THREAD_ALIVE}"
        ))
        .bind(job_id)
        .bind(&tenant.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::JobNotFound)?;
        job_from_row(&row)
    }

    /// Jobs waiting to run (pending, including those backing off before a retry), for the
    /// queue-depth gauge.
    pub async fn queued_job_count(&self) -> Result<i64, StoreError> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'pending'")
            .fetch_one(&self.pool)
            .await?;
        Ok(count)
    }

    /// A thread's jobs, as `which` says: all of them oldest first, or the latest few newest
    /// first. Either is one indexed read.
    pub async fn thread_jobs(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        which: ThreadJobs,
    ) -> Result<Vec<Job>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let order = match which {
            ThreadJobs::All => "created_at, job_id",
            ThreadJobs::Newest(_) => "created_at DESC, job_id DESC LIMIT $3",
        };
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE thread_key = $1 AND tenant_id = $2 \
             AND {THREAD_ALIVE} ORDER BY {order}"
        );
        let mut query = sqlx::query(&sql).bind(thread_key.as_str()).bind(&tenant.0);
        if let ThreadJobs::Newest(limit) = which {
            query = query.bind(i64::from(limit));
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Claims the oldest claimable job: a pending job whose `run_after` has come, or a running
    /// job whose lease expired (its worker died) with attempts left. Running jobs whose lease
    /// expired on their last attempt are marked failed first. The claim gets a fresh lease token.
    pub async fn claim_job(
        &self,
        worker: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        sqlx::query(
            "UPDATE jobs SET state = 'failed', lease_owner = NULL, lease_expires_at = NULL, \
             last_error = 'the worker''s lease expired on the last attempt', \
             updated_at = $1, finished_at = $1 \
             WHERE state = 'running' AND lease_expires_at <= $1 AND attempts >= max_attempts",
        )
        .bind(now_ms)
        .execute(&self.writer)
        .await?;
        let lock = match self.backend {
            Backend::Postgres => "FOR UPDATE SKIP LOCKED",
            // One UPDATE statement is atomic under SQLite's single-writer lock.
            Backend::Sqlite => "",
        };
        let lease = format!("{worker}/{}", uuid::Uuid::new_v4().simple());
        let row = sqlx::query(&format!(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = $1, \
             lease_expires_at = $2, updated_at = $3 \
             WHERE job_id = (SELECT job_id FROM jobs \
                 WHERE (state = 'pending' AND run_after <= $3) \
                    OR (state = 'running' AND lease_expires_at <= $3 AND attempts < max_attempts) \
                 ORDER BY run_after, job_id LIMIT 1 {lock}) \
             RETURNING {JOB_COLUMNS}"
        ))
        .bind(&lease)
        .bind(now_ms.saturating_add(lease_ms))
        .bind(now_ms)
        .fetch_optional(&self.writer)
        .await?;
        row.map(|row| {
            Ok(ClaimedJob {
                job: job_from_row(&row)?,
                lease,
            })
        })
        .transpose()
    }

    /// Marks the claimed job succeeded with `result`. [`StoreError::LeaseLost`] when the claim no
    /// longer holds the job.
    pub async fn complete_job(
        &self,
        claimed: &ClaimedJob,
        result: &Value,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        complete_in(&mut tx, claimed, result, now_ms).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a failed attempt: the job is pending again from `retry_at`, or `failed` when it
    /// has used its attempts. Returns the new state.
    pub async fn fail_job(
        &self,
        claimed: &ClaimedJob,
        error: &str,
        retry_at_ms: i64,
        now_ms: i64,
    ) -> Result<JobState, StoreError> {
        let state: Option<String> = sqlx::query_scalar(
            "UPDATE jobs SET \
             state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END, \
             finished_at = CASE WHEN attempts >= max_attempts THEN $4 ELSE NULL END, \
             run_after = $3, last_error = $5, lease_owner = NULL, lease_expires_at = NULL, \
             updated_at = $4 \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' RETURNING state",
        )
        .bind(&claimed.job.id)
        .bind(&claimed.lease)
        .bind(retry_at_ms)
        .bind(now_ms)
        // A summarizer's error may quote what it read, NULs included.
        .bind(super::storable_text(error).into_owned())
        .fetch_optional(&self.writer)
        .await?;
        let state = state.ok_or_else(|| StoreError::LeaseLost(claimed.job.id.clone()))?;
        JobState::parse(&state)
    }

    /// Gives a claimed job back unfinished (graceful shutdown): pending at once, and the attempt
    /// does not count.
    pub async fn release_job(&self, claimed: &ClaimedJob, now_ms: i64) -> Result<(), StoreError> {
        let released = sqlx::query(
            "UPDATE jobs SET state = 'pending', attempts = attempts - 1, run_after = $3, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = $3 \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
        )
        .bind(&claimed.job.id)
        .bind(&claimed.lease)
        .bind(now_ms)
        .execute(&self.writer)
        .await?;
        if released.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(claimed.job.id.clone()));
        }
        Ok(())
    }

    /// Extends the lease of a job still being worked on.
    pub async fn extend_lease(
        &self,
        claimed: &ClaimedJob,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<(), StoreError> {
        let extended = sqlx::query(
            "UPDATE jobs SET lease_expires_at = $3, updated_at = $4 \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
        )
        .bind(&claimed.job.id)
        .bind(&claimed.lease)
        .bind(now_ms.saturating_add(lease_ms))
        .bind(now_ms)
        .execute(&self.writer)
        .await?;
        if extended.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(claimed.job.id.clone()));
        }
        Ok(())
    }

    /// Appends a compaction's entries and completes its job, atomically: both happen or neither.
    ///
    /// `build(next_seq)` makes the entries (the boundary at `next_seq`, then the summary) and the
    /// job's result, once the thread is locked and its next seq is known: the preserved segment
    /// runs up to `next_seq - 1`, so entries appended while the job ran are kept. Fails with
    /// [`StoreError::BoundaryMoved`] when another boundary was appended since the job read the
    /// thread, with [`StoreError::SourcesChanged`] when a snip or an erasure moved the redaction
    /// epoch since (the summary may hold what they took out), and with [`StoreError::LeaseLost`]
    /// when the claim was taken over (nothing is written then). The thread's stored count becomes `kept_tokens` plus the
    /// new entries and the entries appended while the job ran, all at the upper rates.
    pub async fn write_compaction<F>(
        &self,
        claimed: &ClaimedJob,
        write: &CompactionWrite,
        now_ms: i64,
        build: F,
    ) -> Result<(Vec<Entry>, Value), StoreError>
    where
        F: FnOnce(i64) -> (Vec<Entry>, Value),
    {
        let thread_key = claimed
            .job
            .thread_key
            .clone()
            .ok_or(StoreError::ThreadNotFound)?;
        let mut tx = self.writer.begin().await?;
        // A thread that expired since the job began is gone: its compaction must not renew it.
        let row = sqlx::query(&format!(
            "UPDATE threads SET updated_at = $1 WHERE thread_key = $2 AND tenant_id = $3{} \
             RETURNING next_seq, visible_count, redaction_epoch, thread_id",
            super::expiry::unexpired("threads.", "$1")
        ))
        .bind(now_ms)
        .bind(thread_key.as_str())
        .bind(&claimed.job.tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        if row.try_get::<i64, _>("redaction_epoch")? != write.epoch {
            return Err(StoreError::SourcesChanged);
        }
        let next_seq: i64 = row.try_get("next_seq")?;
        let visible_count: i64 = row.try_get("visible_count")?;
        let last_boundary: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT seq FROM messages WHERE thread_key = $1 AND {BOUNDARY_ROWS} \
             ORDER BY seq DESC LIMIT 1"
        ))
        .bind(thread_key.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if last_boundary != write.expected_boundary_seq {
            return Err(StoreError::BoundaryMoved);
        }
        let appended_since = sqlx::query(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND seq >= $2 ORDER BY seq",
        )
        .bind(thread_key.as_str())
        .bind(write.read_next_seq)
        .fetch_all(&mut *tx)
        .await?;
        let mut tokens = write.kept_tokens;
        for row in &appended_since {
            tokens += entry_features(&entry_from_row(row)?).upper_at_default_rates() as i64;
        }
        let (entries, result) = build(next_seq);
        tokens += entries
            .iter()
            .map(|e| entry_features(e).upper_at_default_rates() as i64)
            .sum::<i64>();
        let content = match entries.split_first() {
            Some((boundary, after)) => {
                super::append::WindowContent::opened_at(boundary, after.iter())
            }
            None => super::append::WindowContent::EMPTY,
        };
        let (stored, visible) = insert_entries(
            &mut tx,
            &thread_key,
            next_seq,
            visible_count,
            entries,
            chrono::Utc::now(),
        )
        .await?;
        // The summary's bytes count toward the thread's like any append's (never refused: a
        // compaction is how a thread near its limit keeps a usable context, though it frees nothing).
        sqlx::query(
            "UPDATE threads SET next_seq = $1, visible_count = $2, context_tokens = $3, \
             context_anchored = 0, window_content_tokens = $6, stored_bytes = stored_bytes + (SELECT COALESCE(SUM(octet_length(body)), 0) \
             FROM messages WHERE thread_key = $4 AND seq >= $5) \
             WHERE thread_key = $4",
        )
        .bind(next_seq + stored.len() as i64)
        .bind(visible)
        .bind(tokens)
        .bind(thread_key.as_str())
        .bind(next_seq)
        .bind(content.column())
        .execute(&mut *tx)
        .await?;
        complete_in(&mut tx, claimed, &result, now_ms).await?;
        tx.commit().await?;
        let thread_id = ThreadId::new(row.try_get::<String, _>("thread_id")?);
        self.changes
            .changed(&TenantId(claimed.job.tenant_id.clone()), &thread_id);
        Ok((stored, result))
    }
}

/// Completes a claimed job in the caller's transaction; fenced by the claim's lease token.
async fn complete_in(
    tx: &mut Transaction<'_, Any>,
    claimed: &ClaimedJob,
    result: &Value,
    now_ms: i64,
) -> Result<(), StoreError> {
    let done = sqlx::query(
        "UPDATE jobs SET state = 'succeeded', result = $3, lease_owner = NULL, \
         lease_expires_at = NULL, updated_at = $4, finished_at = $4 \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
    )
    .bind(&claimed.job.id)
    .bind(&claimed.lease)
    .bind(result.to_string())
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::LeaseLost(claimed.job.id.clone()));
    }
    Ok(())
}
