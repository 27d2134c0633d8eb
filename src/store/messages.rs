//! Messages: atomic, idempotent appends and paging.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, Row};

use super::group_commit::QueuedAppend;
use super::{now_millis, Store, StoreError, TenantId};
use crate::history::model::Entry;
use crate::history::normalize::{context_entry_tokens, usage_tokens};

/// A batch to append to one thread.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub entries: Vec<Entry>,
    /// Compare-and-append: fail with [`StoreError::SeqConflict`] unless the thread's next seq
    /// is this value.
    pub expected_next_seq: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct AppendOutcome {
    /// The stored messages, with their `seq`, `uuid` and `created_at`.
    pub messages: Vec<Entry>,
    /// True when every message was already stored (an idempotent retry): nothing was written.
    pub replayed: bool,
    pub next_seq: i64,
    /// The compaction job this append enqueued (or found pending) because it pushed the
    /// context's estimated tokens past the auto-compaction threshold.
    pub auto_compaction_job: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MessagePage {
    pub messages: Vec<Entry>,
    /// The thread's next seq at the time of the read.
    pub next_seq: i64,
}

/// Rows per INSERT statement; keeps the bind count under every backend's limit.
pub(super) const INSERT_CHUNK: usize = 200;

/// An entry ready to be written.
pub(super) struct Prepared {
    entry: Entry,
    uuid: String,
    /// The client named the uuid (a generated one cannot be stored already).
    uuid_sent: bool,
    content_hash: String,
    body: String,
}

/// Fills the uuid, fingerprints what the client sent, then fills `created_at`.
/// The fingerprint is taken before the server's defaults so a retry of the same request matches.
fn prepare(mut entry: Entry, now: chrono::DateTime<chrono::Utc>) -> Result<Prepared, StoreError> {
    entry.seq = None;
    let uuid_sent = entry.uuid.is_some();
    let uuid = entry
        .uuid
        .get_or_insert_with(|| uuid::Uuid::new_v4().to_string())
        .clone();
    let content_hash = fingerprint(&entry)?;
    // The body is what the client sent, verbatim, so an export gives it back exactly; the
    // server's defaults (uuid, `created_at`) live in their columns and are filled in on read.
    entry.created_at.get_or_insert(now);
    let body = match entry.sent.take() {
        Some(sent) => sent,
        None => serde_json::to_string(&entry).map_err(|e| StoreError::Corrupt(e.to_string()))?,
    };
    Ok(Prepared {
        entry,
        uuid,
        uuid_sent,
        content_hash,
        body,
    })
}

/// A whole batch, prepared before any statement runs: what it will change on the thread row is
/// known up front, so one `UPDATE` both takes the thread's lock and moves its counters.
pub(super) struct PreparedBatch {
    pub(super) entries: Vec<Prepared>,
    /// Entries a model sees (they get a `visible_rank`).
    visible: i64,
    tokens: BatchTokens,
    now: chrono::DateTime<chrono::Utc>,
}

impl PreparedBatch {
    fn new(entries: Vec<Entry>, now: chrono::DateTime<chrono::Utc>) -> Result<Self, StoreError> {
        let entries = entries
            .into_iter()
            .map(|entry| prepare(entry, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut uuids = HashSet::with_capacity(entries.len());
        if let Some(duplicate) = entries.iter().find(|p| !uuids.insert(p.uuid.as_str())) {
            return Err(StoreError::DuplicateUuid(duplicate.uuid.clone()));
        }
        let visible = entries
            .iter()
            .filter(|p| p.entry.kind.is_model_visible())
            .count() as i64;
        let tokens = context_tokens_of(entries.iter().map(|p| &p.entry));
        Ok(PreparedBatch {
            entries,
            visible,
            tokens,
            now,
        })
    }

    fn len(&self) -> i64 {
        self.entries.len() as i64
    }
}

/// What one append did inside its group's transaction.
pub(super) enum AppendStep {
    Written {
        messages: Vec<Entry>,
        next_seq: i64,
        auto_compaction_job: Option<String>,
        /// A job was created, so a worker should wake once the group commits.
        jobs_created: bool,
    },
    /// Every entry was already stored: an idempotent retry, to be rolled back.
    Replayed {
        thread_key: String,
        next_seq: i64,
        uuids: Vec<String>,
    },
}

/// The thread row as the append's `UPDATE` left it, and what it was before.
struct ClaimedThread {
    thread_key: String,
    /// `next_seq` before the batch: the seq of its first entry.
    first_seq: i64,
    /// `visible_count` before the batch.
    visible_before: i64,
    /// `context_tokens` before and after the batch.
    tokens_before: i64,
    tokens_after: i64,
    triggers: AppendTriggers,
}

/// The fingerprint of what a client sent: SHA-256 of the entry as Loupe understood it (without
/// `seq`), so a retry matches whatever spelling or key order it uses.
pub fn fingerprint(entry: &Entry) -> Result<String, StoreError> {
    let understood = serde_json::to_vec(entry).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(hex::encode(Sha256::digest(&understood)))
}

/// An entry from its row (`seq, uuid, created_at, body`): the body as sent, with the server's `seq`, and its
/// `uuid` and `created_at` when the body does not carry them.
pub(super) fn entry_from_row(row: &AnyRow) -> Result<Entry, StoreError> {
    let body: String = row.try_get("body")?;
    let mut entry: Entry = serde_json::from_str(&body)
        .map_err(|e| StoreError::Corrupt(format!("message body: {e}")))?;
    entry.seq = Some(row.try_get("seq")?);
    if entry.uuid.is_none() {
        entry.uuid = Some(row.try_get("uuid")?);
    }
    if entry.created_at.is_none() {
        let millis: i64 = row.try_get("created_at")?;
        entry.created_at = chrono::DateTime::from_timestamp_millis(millis);
    }
    Ok(entry)
}

impl Store {
    /// Appends a batch atomically: all of it or nothing.
    ///
    /// Retries are idempotent: a batch whose uuids are all stored with the same content returns
    /// the stored messages and writes nothing. A uuid stored with other content is a conflict,
    /// and so is a batch that is only partly stored (it cannot be the retry of one atomic append).
    pub async fn append(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        request: AppendRequest,
    ) -> Result<AppendOutcome, StoreError> {
        // Times are stored in milliseconds: the answer shows what a later read will.
        let now = chrono::DateTime::from_timestamp_millis(now_millis()).unwrap_or_default();
        let batch = PreparedBatch::new(request.entries, now)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.group_commit.submit(
            self,
            QueuedAppend {
                tenant: tenant.clone(),
                thread_id: thread_id.to_owned(),
                batch,
                expected_next_seq: request.expected_next_seq,
                reply,
            },
        );
        let step = answer.await.map_err(|_| StoreError::CommitFailed {
            message: "the append's group was abandoned".to_owned(),
            transient: true,
        })??;
        match step {
            AppendStep::Written {
                messages,
                next_seq,
                auto_compaction_job,
                jobs_created: _,
            } => Ok(AppendOutcome {
                messages,
                replayed: false,
                next_seq,
                auto_compaction_job,
            }),
            AppendStep::Replayed {
                thread_key,
                next_seq,
                uuids,
            } => {
                let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
                let messages = self.messages_by_uuid(&thread_key, &uuids).await?;
                Ok(AppendOutcome {
                    messages,
                    replayed: true,
                    next_seq,
                    auto_compaction_job: None,
                })
            }
        }
    }

    /// The append's statements, inside the transaction (a savepoint of its group's): claim the
    /// thread, recognise a replay, check the expected seq, insert, enqueue what it triggers. A
    /// replay is returned for the caller to roll back: nothing of it may stay, not even the
    /// counters.
    pub(super) async fn append_in(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        tenant: &TenantId,
        thread_id: &str,
        batch: PreparedBatch,
        expected_next_seq: Option<i64>,
    ) -> Result<AppendStep, StoreError> {
        let thread = claim_thread(tx, tenant, thread_id, &batch, self.auto_compact_tokens).await?;
        if let Some(stored) = check_replay(tx, &thread, &batch).await? {
            debug_assert_eq!(stored, batch.entries.len());
            return Ok(AppendStep::Replayed {
                thread_key: thread.thread_key,
                next_seq: thread.first_seq,
                uuids: batch.entries.into_iter().map(|p| p.uuid).collect(),
            });
        }
        if let Some(expected) = expected_next_seq {
            if expected != thread.first_seq {
                return Err(StoreError::SeqConflict {
                    expected,
                    actual: thread.first_seq,
                });
            }
        }
        let now = batch.now;
        let next_seq = thread.first_seq + batch.len();
        let tokens = batch.tokens;
        let (messages, _) = insert_prepared(
            tx,
            &thread.thread_key,
            thread.first_seq,
            thread.visible_before,
            batch.entries,
            now,
        )
        .await?;
        let jobs = self
            .enqueue_triggered_jobs(tx, tenant, thread_id, &thread, &tokens)
            .await?;
        Ok(AppendStep::Written {
            messages,
            next_seq,
            auto_compaction_job: jobs.auto_compaction,
            jobs_created: jobs.created,
        })
    }

    /// Enqueues, in the append's transaction, what the append triggers: a compaction when the
    /// estimate crosses the thread's threshold, the tree job of an outlined thread.
    async fn enqueue_triggered_jobs(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        tenant: &TenantId,
        thread_id: &str,
        thread: &ClaimedThread,
        tokens: &BatchTokens,
    ) -> Result<TriggeredJobs, StoreError> {
        let mut jobs = TriggeredJobs::default();
        let triggers = &thread.triggers;
        // An outlined thread is never auto-compacted: its outline keeps the context small, and a
        // compact boundary in its tail would cut the tail short.
        let threshold = triggers.auto_compact_tokens;
        // A batch that holds a compact boundary has just compacted the thread.
        let eligible = !matches!(tokens, BatchTokens::Reset(_)) && !triggers.outlined;
        let crossed =
            eligible && crosses_threshold(thread.tokens_before, thread.tokens_after, threshold);
        // Still above after an attempt that failed or found nothing: try again, backing off.
        let retry = eligible
            && !crossed
            && threshold > 0
            && thread.tokens_after >= threshold
            && super::jobs::auto_compaction_due(tx, &thread.thread_key, now_millis()).await?;
        if crossed || retry {
            let outcome = super::jobs::enqueue_in(
                tx,
                self.backend,
                &super::NewJob {
                    tenant: tenant.clone(),
                    thread_key: Some(thread.thread_key.clone()),
                    kind: super::KIND_COMPACTION.to_owned(),
                    payload: super::CompactionPayload::auto(thread_id).to_value(),
                    dedup_key: Some(super::jobs::compaction_dedup_key(&thread.thread_key)),
                    max_attempts: self.job_max_attempts,
                },
                now_millis(),
            )
            .await?;
            jobs.created |= outcome.created;
            jobs.auto_compaction = Some(outcome.job.id);
        }
        if triggers.outlined {
            let outcome = super::jobs::enqueue_tree_in(
                tx,
                self.backend,
                tenant,
                &thread.thread_key,
                self.job_max_attempts,
            )
            .await?;
            jobs.created |= outcome.created;
        }
        Ok(jobs)
    }

    /// Messages with `seq > after_seq` (all when `None`), in seq order, at most `limit`.
    pub async fn list_messages(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        after_seq: Option<i64>,
        limit: u32,
    ) -> Result<MessagePage, StoreError> {
        self.list_messages_within(tenant, thread_id, after_seq, limit, i64::MAX)
            .await
    }

    /// [`Store::list_messages`], also cut once the stored bodies reach `max_chars` characters
    /// of JSON (counted in the database, so what is cut off is never loaded). The first message
    /// is always returned, so a page always moves forward.
    pub async fn list_messages_within(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        after_seq: Option<i64>,
        limit: u32,
        max_chars: i64,
    ) -> Result<MessagePage, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (thread_key, next_seq) = (head.thread_key, head.next_seq);
        let rows = sqlx::query(
            // The sizes of the page's rows only (the LIMIT applies before the running sum),
            // then the bodies of those that fit.
            "SELECT m.seq, m.uuid, m.created_at, m.body FROM \
             (SELECT seq, SUM(size) OVER (ORDER BY seq) - size AS before_size FROM \
              (SELECT seq, LENGTH(body) AS size FROM messages \
               WHERE thread_key = $1 AND seq > $2 ORDER BY seq LIMIT $3) sizes) page \
             JOIN messages m ON m.thread_key = $1 AND m.seq = page.seq \
             WHERE page.before_size < $4 ORDER BY m.seq",
        )
        .bind(&thread_key)
        .bind(after_seq.unwrap_or(-1))
        .bind(i64::from(limit))
        .bind(max_chars)
        .fetch_all(&self.pool)
        .await?;
        Ok(MessagePage {
            messages: rows.iter().map(entry_from_row).collect::<Result<_, _>>()?,
            next_seq,
        })
    }

    async fn messages_by_uuid(
        &self,
        thread_key: &str,
        uuids: &[&str],
    ) -> Result<Vec<Entry>, StoreError> {
        let sql = format!(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND uuid IN ({}) ORDER BY seq",
            super::list_placeholders(2, uuids.len())
        );
        let mut query = sqlx::query(&sql).bind(thread_key.to_owned());
        for uuid in uuids {
            query = query.bind(uuid.to_string());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(entry_from_row).collect()
    }
}

/// How a batch changes the running context-token estimate of its thread.
#[derive(Debug, Clone, Copy)]
enum BatchTokens {
    Add(i64),
    /// The batch holds a compact boundary: the context restarts at its last one.
    Reset(i64),
    /// The batch holds an assistant entry reporting `usage`: the estimate becomes its figures
    /// plus what follows it (`history::normalize::estimate_context` on a whole window).
    Anchor(i64),
}

fn context_tokens_of<'a>(entries: impl Iterator<Item = &'a Entry>) -> BatchTokens {
    let mut tokens = 0_i64;
    let mut reset = false;
    let mut anchored = false;
    for entry in entries {
        if entry.is_compact_boundary() {
            reset = true;
            anchored = false;
            tokens = 0;
        }
        match usage_tokens(entry) {
            Some(reported) => {
                anchored = true;
                tokens = reported as i64;
            }
            None => tokens += context_entry_tokens(entry) as i64,
        }
    }
    if reset {
        BatchTokens::Reset(tokens)
    } else if anchored {
        BatchTokens::Anchor(tokens)
    } else {
        BatchTokens::Add(tokens)
    }
}

/// What an append may trigger, from the thread's settings: its auto-compaction threshold (its
/// own, else the server default) and whether it is outlined.
struct AppendTriggers {
    auto_compact_tokens: i64,
    outlined: bool,
}

/// The jobs an append enqueued.
#[derive(Default)]
struct TriggeredJobs {
    /// The auto-compaction job, created now or found pending or running.
    auto_compaction: Option<String>,
    /// A job was created (so a worker should wake).
    created: bool,
}

/// Auto-compaction fires once, on the append that takes the estimate from below the threshold to
/// at or above it (0 = off).
fn crosses_threshold(before: i64, after: i64, threshold: i64) -> bool {
    threshold > 0 && before < threshold && after >= threshold
}

/// The append's one statement on the thread row: it takes the thread's lock at once (the row
/// lock on PostgreSQL; on SQLite the write lock, already ours on the writer connection), so
/// concurrent appenders queue instead of racing on `next_seq`; it moves the counters by the
/// batch; and it returns what the triggers need, the thread's settings included. Another
/// tenant's thread is not found. A replay or a conflict rolls it back.
async fn claim_thread(
    tx: &mut sqlx::Transaction<'_, Any>,
    tenant: &TenantId,
    thread_id: &str,
    batch: &PreparedBatch,
    default_threshold: i64,
) -> Result<ClaimedThread, StoreError> {
    let (reset, tokens) = match batch.tokens {
        BatchTokens::Add(tokens) => (0_i64, tokens),
        BatchTokens::Reset(tokens) => (1_i64, tokens),
        // Set below, once the value before the batch is known (the trigger compares the two).
        BatchTokens::Anchor(_) => (0_i64, 0_i64),
    };
    let row = sqlx::query(
        "UPDATE threads SET updated_at = $1, next_seq = next_seq + $2, \
         visible_count = visible_count + $3, \
         context_tokens = CASE WHEN $4 = 1 THEN $5 ELSE context_tokens + $5 END \
         WHERE tenant_id = $6 AND thread_id = $7 \
         RETURNING thread_key, next_seq, visible_count, context_tokens, \
         (SELECT s.auto_compact_tokens FROM thread_settings s \
          WHERE s.thread_key = threads.thread_key) AS auto_compact_tokens, \
         (SELECT s.outline FROM thread_settings s \
          WHERE s.thread_key = threads.thread_key) AS outline",
    )
    .bind(batch.now.timestamp_millis())
    .bind(batch.len())
    .bind(batch.visible)
    .bind(reset)
    .bind(tokens)
    .bind(&tenant.0)
    .bind(thread_id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or(StoreError::ThreadNotFound)?;
    let thread_key: String = row.try_get("thread_key")?;
    let returned: i64 = row.try_get("context_tokens")?;
    let (tokens_before, tokens_after) = match batch.tokens {
        BatchTokens::Anchor(anchored) => {
            sqlx::query("UPDATE threads SET context_tokens = $1 WHERE thread_key = $2")
                .bind(anchored)
                .bind(&thread_key)
                .execute(&mut **tx)
                .await?;
            (returned, anchored)
        }
        _ => (returned - tokens, returned),
    };
    let own_threshold: Option<i64> = row.try_get("auto_compact_tokens")?;
    Ok(ClaimedThread {
        thread_key,
        first_seq: row.try_get::<i64, _>("next_seq")? - batch.len(),
        visible_before: row.try_get::<i64, _>("visible_count")? - batch.visible,
        tokens_before,
        tokens_after,
        triggers: AppendTriggers {
            auto_compact_tokens: own_threshold.unwrap_or(default_threshold),
            outlined: super::settings::outline_column(row.try_get("outline")?)?
                .is_some_and(|options| options.enabled),
        },
    })
}

/// Whether the batch is an idempotent retry: `Some(count)` when every entry is already stored
/// with the same fingerprint. A uuid stored with another fingerprint is a conflict, and so is a
/// batch only partly stored (it cannot be the retry of one atomic append). Only uuids the client
/// named are looked up: a generated one is new.
async fn check_replay(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread: &ClaimedThread,
    batch: &PreparedBatch,
) -> Result<Option<usize>, StoreError> {
    if !batch.entries.iter().any(|p| p.uuid_sent) {
        return Ok(None);
    }
    let named: Vec<&str> = batch
        .entries
        .iter()
        .filter(|p| p.uuid_sent)
        .map(|p| p.uuid.as_str())
        .collect();
    let stored = stored_hashes(tx, &thread.thread_key, &named).await?;
    if stored.is_empty() {
        return Ok(None);
    }
    for p in &batch.entries {
        if let Some((seq, hash)) = stored.get(&p.uuid) {
            if *hash != p.content_hash {
                return Err(StoreError::UuidConflict {
                    uuid: p.uuid.clone(),
                    seq: *seq,
                });
            }
        }
    }
    if stored.len() < batch.entries.len() {
        return Err(StoreError::PartialReplay {
            stored: stored.len(),
            total: batch.entries.len(),
        });
    }
    Ok(Some(stored.len()))
}

/// Makes entries ready to write (uuid, fingerprint, `created_at`) and inserts them from
/// `next_seq` on. Returns the stored entries and the new visible count.
pub(super) async fn insert_entries(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &str,
    next_seq: i64,
    visible_count: i64,
    entries: Vec<Entry>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Vec<Entry>, i64), StoreError> {
    let prepared = entries
        .into_iter()
        .map(|entry| prepare(entry, now))
        .collect::<Result<Vec<_>, _>>()?;
    insert_prepared(tx, thread_key, next_seq, visible_count, prepared, now).await
}

async fn insert_prepared(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &str,
    next_seq: i64,
    visible_count: i64,
    prepared: Vec<Prepared>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Vec<Entry>, i64), StoreError> {
    let mut visible = visible_count;
    let mut messages = Vec::with_capacity(prepared.len());
    for (chunk_index, chunk) in prepared.chunks(INSERT_CHUNK).enumerate() {
        let sql = format!(
            "INSERT INTO messages (thread_key, seq, uuid, kind, subtype, visible_rank, body, content_hash, created_at) VALUES {}",
            super::values_placeholders(chunk.len(), 9)
        );
        let mut insert = sqlx::query(&sql);
        let base = next_seq + (chunk_index * INSERT_CHUNK) as i64;
        for (offset, p) in chunk.iter().enumerate() {
            if p.entry.kind.is_model_visible() {
                visible += 1;
            }
            insert = insert
                .bind(thread_key.to_owned())
                .bind(base + offset as i64)
                .bind(p.uuid.clone())
                .bind(p.entry.type_name().to_owned())
                .bind(p.entry.subtype.clone())
                .bind(visible)
                .bind(p.body.clone())
                .bind(p.content_hash.clone())
                .bind(now.timestamp_millis());
        }
        insert.execute(&mut **tx).await?;
    }
    for (offset, p) in prepared.into_iter().enumerate() {
        let mut entry = p.entry;
        entry.seq = Some(next_seq + offset as i64);
        messages.push(entry);
    }
    Ok((messages, visible))
}

/// `uuid → (seq, content hash)` of the given uuids that the thread already holds (the append's
/// replay check, and the import's skip of what is stored).
pub(super) async fn stored_hashes(
    conn: &mut sqlx::AnyConnection,
    thread_key: &str,
    uuids: &[&str],
) -> Result<HashMap<String, (i64, String)>, StoreError> {
    let mut stored = HashMap::new();
    for chunk in uuids.chunks(INSERT_CHUNK) {
        let sql = format!(
            "SELECT uuid, seq, content_hash FROM messages WHERE thread_key = $1 AND uuid IN ({})",
            super::list_placeholders(2, chunk.len())
        );
        let mut query = sqlx::query(&sql).bind(thread_key.to_owned());
        for uuid in chunk {
            query = query.bind(uuid.to_string());
        }
        for row in query.fetch_all(&mut *conn).await? {
            stored.insert(
                row.try_get("uuid")?,
                (row.try_get("seq")?, row.try_get("content_hash")?),
            );
        }
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: serde_json::Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_fingerprint_ignores_server_defaults_but_not_content() {
        let now = chrono::Utc::now();
        let sent =
            json!({"uuid": "u1", "type": "user", "message": {"role": "user", "content": "hi"}});
        let a = prepare(entry(sent.clone()), now).unwrap();
        let b = prepare(entry(sent), now + chrono::Duration::seconds(5)).unwrap();
        assert_eq!(a.content_hash, b.content_hash);
        assert!(a.entry.created_at.is_some());
        let other = prepare(
            entry(json!({"uuid": "u1", "type": "user", "message": {"role": "user", "content": "hello"}})),
            now,
        )
        .unwrap();
        assert_ne!(a.content_hash, other.content_hash);
    }

    #[test]
    fn the_threshold_fires_once_when_crossed() {
        assert!(crosses_threshold(90, 100, 100));
        assert!(crosses_threshold(0, 500, 100));
        assert!(!crosses_threshold(100, 150, 100));
        assert!(!crosses_threshold(10, 50, 100));
        assert!(!crosses_threshold(0, 500, 0));
    }

    #[test]
    fn a_boundary_in_a_batch_restarts_the_estimate() {
        let e = |v: serde_json::Value| entry(v);
        let batch = [
            e(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            e(json!({"type": "system", "subtype": "compact_boundary", "content": "x"})),
            e(json!({"type": "user", "message": {"role": "user", "content": "abcd"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()),
            BatchTokens::Reset(1)
        ));
        assert!(matches!(
            context_tokens_of(batch[..1].iter()),
            BatchTokens::Add(2)
        ));
    }

    #[test]
    fn usage_in_a_batch_anchors_the_estimate() {
        let batch = [
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m",
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 30000, "output_tokens": 20},
                "content": [{"type": "text", "text": "hi"}]}}),
            ),
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()),
            BatchTokens::Anchor(30027)
        ));
    }

    #[test]
    fn a_missing_uuid_is_generated() {
        let p = prepare(
            entry(json!({"type": "user", "message": {"role": "user", "content": "hi"}})),
            chrono::Utc::now(),
        )
        .unwrap();
        assert_eq!(p.entry.uuid.as_deref(), Some(p.uuid.as_str()));
        assert!(uuid::Uuid::parse_str(&p.uuid).is_ok());
    }
}
