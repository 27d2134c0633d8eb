//! Messages: atomic, idempotent appends and paging.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, Row};

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
struct Prepared {
    entry: Entry,
    uuid: String,
    content_hash: String,
    body: String,
}

/// Fills the uuid, fingerprints what the client sent, then fills `created_at`.
/// The fingerprint is taken before the server's defaults so a retry of the same request matches.
fn prepare(mut entry: Entry, now: chrono::DateTime<chrono::Utc>) -> Result<Prepared, StoreError> {
    entry.seq = None;
    let uuid = entry
        .uuid
        .get_or_insert_with(|| uuid::Uuid::new_v4().to_string())
        .clone();
    let content_hash = fingerprint(&entry)?;
    // The body is what the client sent, verbatim, so an export gives it back exactly; the
    // server's defaults (uuid, `created_at`) live in their columns and are filled in on read.
    let body = match entry.sent.take() {
        Some(sent) => sent,
        None => {
            entry.created_at.get_or_insert(now);
            serde_json::to_string(&entry).map_err(|e| StoreError::Corrupt(e.to_string()))?
        }
    };
    entry.created_at.get_or_insert(now);
    Ok(Prepared {
        entry,
        uuid,
        content_hash,
        body,
    })
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
        let now = chrono::Utc::now();
        let prepared = request
            .entries
            .into_iter()
            .map(|entry| prepare(entry, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut uuids = HashSet::with_capacity(prepared.len());
        if let Some(duplicate) = prepared.iter().find(|p| !uuids.insert(p.uuid.as_str())) {
            return Err(StoreError::DuplicateUuid(duplicate.uuid.clone()));
        }

        let mut tx = self.pool.begin().await?;
        // Writing first takes the thread's lock at once (the row lock on PostgreSQL, the write
        // lock on SQLite), so concurrent appenders queue here instead of racing on `next_seq`.
        let row = sqlx::query(
            "UPDATE threads SET updated_at = $1 WHERE tenant_id = $2 AND thread_id = $3 \
             RETURNING thread_key, next_seq, visible_count, context_tokens",
        )
        .bind(now_millis())
        .bind(&tenant.0)
        .bind(thread_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        let thread_key: String = row.try_get("thread_key")?;
        let next_seq: i64 = row.try_get("next_seq")?;
        let visible_count: i64 = row.try_get("visible_count")?;
        let tokens_before: i64 = row.try_get("context_tokens")?;

        let stored = stored_hashes(&mut tx, &thread_key, &prepared).await?;
        if !stored.is_empty() {
            for p in &prepared {
                if let Some((seq, hash)) = stored.get(&p.uuid) {
                    if *hash != p.content_hash {
                        return Err(StoreError::UuidConflict {
                            uuid: p.uuid.clone(),
                            seq: *seq,
                        });
                    }
                }
            }
            if stored.len() < prepared.len() {
                return Err(StoreError::PartialReplay {
                    stored: stored.len(),
                    total: prepared.len(),
                });
            }
            tx.rollback().await?;
            let uuids: Vec<&str> = prepared.iter().map(|p| p.uuid.as_str()).collect();
            let messages = self.messages_by_uuid(&thread_key, &uuids).await?;
            return Ok(AppendOutcome {
                messages,
                replayed: true,
                next_seq,
                auto_compaction_job: None,
            });
        }

        if let Some(expected) = request.expected_next_seq {
            if expected != next_seq {
                return Err(StoreError::SeqConflict {
                    expected,
                    actual: next_seq,
                });
            }
        }

        let batch_tokens = context_tokens_of(prepared.iter().map(|p| &p.entry));
        let (messages, visible) =
            insert_prepared(&mut tx, &thread_key, next_seq, visible_count, prepared, now).await?;
        let new_next_seq = next_seq + messages.len() as i64;
        // The running estimate of the context: a batch holding a compact boundary starts it over.
        let (reset, tokens) = match batch_tokens {
            BatchTokens::Add(tokens) => (0_i64, tokens),
            BatchTokens::Reset(tokens) | BatchTokens::Anchor(tokens) => (1_i64, tokens),
        };
        let compacted = matches!(batch_tokens, BatchTokens::Reset(_));
        let context_tokens: i64 = sqlx::query_scalar(
            "UPDATE threads SET next_seq = $1, visible_count = $2, \
             context_tokens = CASE WHEN $3 = 1 THEN $4 ELSE context_tokens + $4 END \
             WHERE thread_key = $5 RETURNING context_tokens",
        )
        .bind(new_next_seq)
        .bind(visible)
        .bind(reset)
        .bind(tokens)
        .bind(&thread_key)
        .fetch_one(&mut *tx)
        .await?;
        let mut auto_compaction_job = None;
        let triggers = self.append_triggers(&mut tx, &thread_key).await?;
        // An outlined thread is never auto-compacted: its outline keeps the context small, and a
        // compact boundary in its tail would cut the tail short.
        if !compacted && !triggers.outlined {
            let threshold = triggers.auto_compact_tokens;
            if crosses_threshold(tokens_before, context_tokens, threshold) {
                let outcome = super::jobs::enqueue_in(
                    &mut tx,
                    self.backend,
                    &super::NewJob {
                        tenant: tenant.clone(),
                        thread_key: Some(thread_key.clone()),
                        kind: crate::jobs::KIND_COMPACTION.to_owned(),
                        payload: crate::jobs::CompactionPayload::auto(thread_id).to_value(),
                        dedup_key: Some(super::jobs::compaction_dedup_key(&thread_key)),
                        max_attempts: self.job_max_attempts,
                    },
                    now.timestamp_millis(),
                )
                .await?;
                auto_compaction_job = Some((outcome.job.id, outcome.created));
            }
        }
        let tree_job = if triggers.outlined {
            let outcome = super::jobs::enqueue_tree_in(
                &mut tx,
                self.backend,
                tenant,
                &thread_key,
                self.job_max_attempts,
            )
            .await?;
            outcome.created
        } else {
            false
        };
        tx.commit().await?;
        if matches!(auto_compaction_job, Some((_, true))) || tree_job {
            self.job_signal.notify_one();
        }
        Ok(AppendOutcome {
            messages,
            replayed: false,
            next_seq: new_next_seq,
            auto_compaction_job: auto_compaction_job.map(|(id, _)| id),
        })
    }

    /// Messages with `seq > after_seq` (all when `None`), in seq order, at most `limit`.
    pub async fn list_messages(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        after_seq: Option<i64>,
        limit: u32,
    ) -> Result<MessagePage, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (thread_key, next_seq) = (head.thread_key, head.next_seq);
        let rows = sqlx::query(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(&thread_key)
        .bind(after_seq.unwrap_or(-1))
        .bind(i64::from(limit))
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

/// Auto-compaction fires once, on the append that takes the estimate from below the threshold to
/// at or above it (0 = off).
/// What an append may trigger.
struct AppendTriggers {
    auto_compact_tokens: i64,
    outlined: bool,
}

fn crosses_threshold(before: i64, after: i64, threshold: i64) -> bool {
    threshold > 0 && before < threshold && after >= threshold
}

impl Store {
    /// What an append may trigger, from the thread's settings (one read): its auto-compaction
    /// threshold (its own, else the server default) and whether it is outlined.
    async fn append_triggers(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        thread_key: &str,
    ) -> Result<AppendTriggers, StoreError> {
        let row = sqlx::query(
            "SELECT auto_compact_tokens, outline FROM thread_settings WHERE thread_key = $1",
        )
        .bind(thread_key)
        .fetch_optional(&mut **tx)
        .await?;
        let (own, outline): (Option<i64>, Option<String>) = match row {
            Some(row) => (row.try_get("auto_compact_tokens")?, row.try_get("outline")?),
            None => (None, None),
        };
        Ok(AppendTriggers {
            auto_compact_tokens: own.unwrap_or(self.auto_compact_tokens),
            outlined: super::settings::outline_column(outline)?
                .is_some_and(|options| options.enabled),
        })
    }
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

/// (seq, content hash) of the batch's uuids that the thread already holds.
async fn stored_hashes(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &str,
    batch: &[Prepared],
) -> Result<HashMap<String, (i64, String)>, StoreError> {
    let mut stored = HashMap::new();
    let uuids: Vec<&str> = batch.iter().map(|p| p.uuid.as_str()).collect();
    for chunk in uuids.chunks(INSERT_CHUNK) {
        let sql = format!(
            "SELECT uuid, seq, content_hash FROM messages WHERE thread_key = $1 AND uuid IN ({})",
            super::list_placeholders(2, chunk.len())
        );
        let mut query = sqlx::query(&sql).bind(thread_key.to_owned());
        for uuid in chunk {
            query = query.bind(uuid.to_string());
        }
        for row in query.fetch_all(&mut **tx).await? {
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
