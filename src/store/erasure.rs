//! Erasure: entries whose content goes for good, from the record and from everything derived
//! from it, in one transaction ([`ErasureTx`]). The caller (`jobs::erasure`) drives the steps
//! that need more than the store (stand-in lines, summaries derived again without a model); the
//! store holds the transaction, the tombstones, the receipts, and the scrubbing of the files
//! afterwards.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use super::rows::{entry_from_row, fingerprint};
use super::tree::StandIns;
use super::{
    list_placeholders, millis_to_datetime, now_millis, Backend, Store, StoreError, TenantId,
    ThreadId, ThreadKey,
};
use crate::history::model::{Entry, ErasedMark};
use crate::turns::Turn;

/// What an erasure names: entries by uuid, by seq, or both (the union).
#[derive(Debug, Clone, Default)]
pub struct ErasureTargets {
    pub uuids: Vec<String>,
    pub seqs: Vec<i64>,
}

impl ErasureTargets {
    /// How many names it holds (an entry named twice counts twice).
    pub fn len(&self) -> usize {
        self.uuids.len() + self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many copies of each kind an erasure took text out of.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ErasureArtifacts {
    /// Entries made tombstones (an entry already erased is not counted again).
    pub messages: u64,
    /// Summary-tree nodes (outline lines) emptied or replaced by stand-ins.
    pub tree_nodes: u64,
    /// Compaction summaries derived again without the erased entries.
    pub compaction_summaries: u64,
    /// Running jobs whose output, read before the erasure, can no longer be written.
    pub jobs_fenced: u64,
    /// Cached normalized contexts (incremental checkpoints) dropped.
    pub cached_contexts: u64,
    /// The tenant's other threads that still held copies of the erased entries when it was
    /// answered ([`crate::jobs::erasure::held_elsewhere`]): kept with the counts (the receipt's
    /// one JSON column). `None` in receipts from before it was recorded, and in those of the
    /// erasures made in forks and by trims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub still_held_by: Option<Vec<String>>,
    /// Whether more threads held copies than `still_held_by` names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub still_held_by_truncated: bool,
}

/// A stored erasure: its receipt.
#[derive(Debug, Clone)]
pub struct Erasure {
    pub erasure_id: String,
    pub seqs: Vec<i64>,
    pub reason: Option<String>,
    pub artifacts: ErasureArtifacts,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When the database files stopped holding the erased text (SQLite's WAL emptied, or
    /// PostgreSQL's tables vacuumed); `None` until then.
    pub scrubbed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What an erasure's plan read of its thread first: the thread, and its redaction epoch then.
#[derive(Debug, Clone)]
pub struct ErasureRead {
    pub thread_key: ThreadKey,
    pub epoch: i64,
}

/// Most entries one erasure, or one snip, names in one list (by uuid, or by seq).
pub const MAX_ERASED_ENTRIES: usize = 1_000;

/// An erasure in progress: one write transaction on the thread, whose redaction epoch has
/// moved (so no job that read the thread before can write after) and whose row is held until
/// [`ErasureTx::commit`].
pub struct ErasureTx {
    tx: Transaction<'static, Any>,
    pub thread_key: ThreadKey,
    pub mark: ErasedMark,
    artifacts: ErasureArtifacts,
    /// The summaries derived again, by seq: the event of the erasure names them.
    rewritten: Vec<i64>,
    /// The kind of the event the commit records: `erasure`, or `trimmed` for a retention trim.
    event_kind: &'static str,
}

impl Store {
    /// The thread and its redaction epoch: what an erasure's plan reads first.
    pub async fn erasure_read(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ErasureRead, StoreError> {
        let row = sqlx::query(
            "SELECT thread_key, redaction_epoch FROM threads WHERE tenant_id = $1 AND thread_id = $2",
        )
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok(ErasureRead {
            thread_key: ThreadKey::from_stored(row.try_get("thread_key")?),
            epoch: row.try_get("redaction_epoch")?,
        })
    }

    /// The (seq, uuid) of the entries `targets` names, in seq order, each once. With
    /// `must_exist` (an erasure), fails with [`StoreError::NoSuchEntries`] naming those the
    /// thread does not hold; without (a snip, which may name uuids never stored), skips them.
    pub async fn entries_named(
        &self,
        thread_key: &ThreadKey,
        targets: &ErasureTargets,
        must_exist: bool,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let by_uuid = match targets.uuids.is_empty() {
            true => Vec::new(),
            false => {
                self.messages_where_in(thread_key, "uuid", &targets.uuids)
                    .await?
            }
        };
        let by_seq = match targets.seqs.is_empty() {
            true => Vec::new(),
            false => {
                self.messages_where_in(thread_key, "seq", &targets.seqs)
                    .await?
            }
        };
        if must_exist {
            let uuids: HashSet<&str> = by_uuid.iter().map(|(_, uuid)| uuid.as_str()).collect();
            let seqs: HashSet<i64> = by_seq.iter().map(|(seq, _)| *seq).collect();
            let missing_uuids = targets.uuids.iter().filter(|u| !uuids.contains(u.as_str()));
            let missing_seqs = targets.seqs.iter().filter(|s| !seqs.contains(s));
            for (field, names) in [
                ("uuids", missing_uuids.cloned().collect::<Vec<_>>()),
                ("seqs", missing_seqs.map(i64::to_string).collect()),
            ] {
                if !names.is_empty() {
                    return Err(StoreError::NoSuchEntries { field, names });
                }
            }
        }
        let mut found = by_uuid;
        found.extend(by_seq);
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// The thread's compact boundaries and compaction summaries (user entries marked so, wherever
    /// after a boundary they are) from the last boundary at or before `seq` on (from `seq` when
    /// there is none: a summary covers only what came before it), in seq order.
    pub async fn summary_rows(
        &self,
        thread_key: &ThreadKey,
        seq: i64,
    ) -> Result<SummaryRows, StoreError> {
        let rows = sqlx::query(&summary_rows_sql("seq, uuid, created_at, body"))
            .bind(thread_key.as_str())
            .bind(seq)
            .fetch_all(&self.pool)
            .await?;
        let mut summaries = SummaryRows::default();
        for row in &rows {
            let entry = entry_from_row(row)?;
            summaries.candidates.extend(entry.seq);
            if entry.is_compact_boundary() || entry.is_compact_summary {
                summaries.entries.push(entry);
            }
        }
        Ok(summaries)
    }

    /// Opens an erasure on the tenant's thread as its plan read it: takes its row (the write
    /// lock on SQLite) and moves its redaction epoch. Fails with [`StoreError::SourcesChanged`]
    /// when the epoch moved since `read` (or the thread was made again under its id).
    pub async fn begin_erasure(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        read: &ErasureRead,
    ) -> Result<ErasureTx, StoreError> {
        let mut tx = self.writer.begin().await?;
        let now = now_millis();
        // An expired thread is still reached (an erasure fans out to every fork that holds
        // the entries, an expired one too, until the sweep deletes it), but not renewed.
        let key: Option<String> = sqlx::query_scalar(&format!(
            "UPDATE threads SET redaction_epoch = redaction_epoch + 1, \
             updated_at = CASE WHEN {} THEN updated_at ELSE $3 END \
             WHERE tenant_id = $1 AND thread_id = $2 AND thread_key = $4 \
             AND redaction_epoch = $5 RETURNING thread_key",
            super::expiry::expired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(now)
        .bind(read.thread_key.as_str())
        .bind(read.epoch)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(key) = key else {
            drop(tx);
            self.thread_head(tenant, thread_id).await?;
            return Err(StoreError::SourcesChanged);
        };
        let thread_key = ThreadKey::from_stored(key);
        Ok(ErasureTx {
            tx,
            thread_key,
            mark: ErasedMark {
                erasure_id: uuid::Uuid::now_v7().to_string(),
                erased_at: millis_to_datetime(now),
            },
            artifacts: ErasureArtifacts::default(),
            rewritten: Vec::new(),
            event_kind: "erasure",
        })
    }

    /// The thread's erasures after `after` (an erasure id; ids grow with time), oldest first,
    /// at most `limit`.
    pub async fn erasures(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Erasure>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let rows = sqlx::query(
            "SELECT erasure_id, seqs, reason, artifacts, created_at, scrubbed_at FROM erasures \
             WHERE thread_key = $1 AND erasure_id > $2 ORDER BY erasure_id LIMIT $3",
        )
        .bind(thread_key.as_str())
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(erasure_from_row).collect()
    }

    /// Empties what the database files keep of rows changed or deleted (after an erasure or a
    /// delete): on an SQLite file, the WAL (its pages as they were) is checkpointed and cut to
    /// nothing, once older readers are done (freed cells are zeroed as they go, `secure_delete`);
    /// on PostgreSQL the thread tables are vacuumed and analyzed, which removes the dead row
    /// versions that hold the old text from the tables and from the planner's statistics (their
    /// bytes stay in free space until it is reused; `docs/ARCHITECTURE.md` § Forgetting).
    /// Returns once done.
    pub async fn scrub_storage(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => {
                // The search indexes delete a row's tokens at once (FTS5 `secure-delete`,
                // `migrations/sqlite/0014_fts_secure_delete.sql`), their pages zeroed as they
                // are freed: what is left is the WAL.
                if self.wal_scrub.is_some() {
                    super::truncate_wal(&self.pool).await;
                }
            }
            Backend::Postgres => {
                // ANALYZE too: the planner's statistics sample column values (a histogram of
                // `body`), and would keep erased ones until the next analysis.
                for table in SCRUBBED_TABLES {
                    sqlx::query(&format!("VACUUM (ANALYZE) {table}"))
                        .execute(&self.pool)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Queues the scrub of every erasure whose receipt says it was not done (the process
    /// stopped before it ran): called at start.
    pub async fn resume_scrubs(&self) -> Result<usize, StoreError> {
        let pending: Vec<String> = sqlx::query_scalar(
            "SELECT erasure_id FROM erasures WHERE scrubbed_at IS NULL ORDER BY erasure_id LIMIT 100000",
        )
        .fetch_all(&self.pool)
        .await?;
        let count = pending.len();
        for erasure_id in pending {
            self.queue_scrub(erasure_id);
        }
        Ok(count)
    }

    /// Scrubs the files after the erasure `erasure_id` ([`Store::scrub_storage`]), in the
    /// background, then records it in the receipt. One scrub runs at a time in a process, and
    /// each covers every erasure queued before it started: a burst of erasures costs a few
    /// scrubs, never one connection (and, on PostgreSQL, one waiting `VACUUM`) each.
    pub fn queue_scrub(&self, erasure_id: String) {
        self.scrubs.lock().push(erasure_id);
        if self.scrubs.running.swap(true, Ordering::SeqCst) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move { store.run_scrubs().await });
    }

    async fn run_scrubs(&self) {
        loop {
            let batch = std::mem::take(&mut *self.scrubs.lock());
            if batch.is_empty() {
                self.scrubs.running.store(false, Ordering::SeqCst);
                // One queued between the take and the store finds `running` set and leaves it
                // to this loop: look once more.
                if self.scrubs.lock().is_empty() || self.scrubs.running.swap(true, Ordering::SeqCst)
                {
                    return;
                }
                continue;
            }
            let scrubbed = match self.scrub_storage().await {
                Ok(()) => self.mark_erasures_scrubbed(&batch).await,
                Err(error) => Err(error),
            };
            if let Err(error) = scrubbed {
                if self.pool.is_closed() {
                    self.scrubs.running.store(false, Ordering::SeqCst);
                    return;
                }
                tracing::warn!(%error, erasures = batch.len(), "scrubbing after erasures failed; trying again");
                self.scrubs.lock().extend(batch);
                tokio::time::sleep(SCRUB_RETRY).await;
            }
        }
    }

    /// Rewrites the counts of the erasure `erasure_id`'s receipt as `artifacts` (once it knows
    /// which threads still hold copies).
    pub async fn record_artifacts(
        &self,
        erasure_id: &str,
        artifacts: &ErasureArtifacts,
    ) -> Result<(), StoreError> {
        let artifacts =
            serde_json::to_string(artifacts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query("UPDATE erasures SET artifacts = $1 WHERE erasure_id = $2")
            .bind(artifacts)
            .bind(erasure_id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Records that the erasures' text is out of the database files.
    async fn mark_erasures_scrubbed(&self, erasure_ids: &[String]) -> Result<(), StoreError> {
        let now = now_millis();
        for chunk in erasure_ids.chunks(500) {
            let sql = format!(
                "UPDATE erasures SET scrubbed_at = $1 WHERE erasure_id IN ({})",
                list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(now);
            for id in chunk {
                query = query.bind(id.as_str());
            }
            query.execute(&self.writer).await?;
        }
        Ok(())
    }
}

/// A thread's turn to erase or redact ([`Store::erasure_turn`]), given back when dropped.
pub type ErasureTurn = Turn<(String, String)>;

impl Store {
    /// Waits for the tenant's thread's turn to erase or redact in this process. Each moves the
    /// thread's epoch, which sends back the plan of any other read meanwhile, so side by side
    /// they would only make each other read again.
    pub async fn erasure_turn(&self, tenant: &TenantId, thread_id: &ThreadId) -> ErasureTurn {
        let key = (tenant.0.clone(), thread_id.as_str().to_owned());
        self.erasure_turns.turn(&key).await
    }
}

/// How long a failed scrub waits before it runs again.
const SCRUB_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The erasures waiting for a scrub, and whether one is running.
#[derive(Debug, Default)]
pub(super) struct ScrubQueue {
    pending: std::sync::Mutex<Vec<String>>,
    running: AtomicBool,
}

impl ScrubQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The tables whose rows an erasure rewrites (PostgreSQL vacuums them afterwards).
const SCRUBBED_TABLES: &[&str] = &["messages", "search_rows", "tree_nodes"];

impl ErasureTx {
    /// Makes the entries at `seqs` tombstones ([`Entry::tombstone`]): content gone, the hash
    /// of it too, the thread's stored bytes lowered. An entry already a tombstone is left as it
    /// is (and not counted); one that only claims to be (an `erased` field sent with content)
    /// is emptied like any other.
    pub async fn tombstone(&mut self, seqs: &[i64]) -> Result<(), StoreError> {
        let mut freed = 0_i64;
        for chunk in seqs.chunks(500) {
            let sql = format!(
                "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 \
                 AND seq IN ({}) ORDER BY seq",
                list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(self.thread_key.as_str());
            for seq in chunk {
                query = query.bind(*seq);
            }
            let rows = query.fetch_all(&mut *self.tx).await?;
            for row in rows {
                let body: String = row.try_get("body")?;
                let entry = entry_from_row(&row)?;
                let seq = entry.seq.unwrap_or_default();
                let mark = entry.erased.clone().unwrap_or_else(|| self.mark.clone());
                let mut tombstone = entry.tombstone(mark);
                if entry.is_erased() && tombstone == entry {
                    continue;
                }
                tombstone.seq = None;
                let new_body = serde_json::to_string(&tombstone)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                sqlx::query(
                    "UPDATE messages SET body = $1, content_hash = $2, subtype = $3 \
                     WHERE thread_key = $4 AND seq = $5",
                )
                .bind(&new_body)
                .bind(fingerprint(&tombstone)?)
                .bind(tombstone.subtype.as_deref())
                .bind(self.thread_key.as_str())
                .bind(seq)
                .execute(&mut *self.tx)
                .await?;
                freed += body.len() as i64 - new_body.len() as i64;
                self.artifacts.messages += 1;
            }
        }
        sqlx::query("UPDATE threads SET stored_bytes = stored_bytes - $1 WHERE thread_key = $2")
            .bind(freed)
            .bind(self.thread_key.as_str())
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    /// Takes the erased seqs out of the summary tree, and rebuilds the lines of the summaries
    /// derived again (`rewritten`), with every line that may quote them (`hide_in_tree_in`, in
    /// this transaction).
    pub async fn hide_in_tree(
        &mut self,
        seqs: &[u64],
        rewritten: &[u64],
        stand_ins: &dyn StandIns,
    ) -> Result<(), StoreError> {
        let rewritten = super::tree::hide_in_tree_in(
            &mut self.tx,
            &self.thread_key,
            seqs,
            rewritten,
            stand_ins,
            now_millis(),
        )
        .await?;
        self.artifacts.tree_nodes += rewritten;
        Ok(())
    }

    /// The seqs of the rows [`Store::summary_rows`] reads (its `candidates`), read in this
    /// transaction without their bodies: the plan's must match.
    pub async fn summary_candidates(&mut self, seq: i64) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar(&summary_rows_sql("seq"))
            .bind(self.thread_key.as_str())
            .bind(seq)
            .fetch_all(&mut *self.tx)
            .await?)
    }

    /// Replaces a compaction summary's text with `text`, in place: the entry keeps its seq,
    /// uuid and place, and says it was derived again after an erasure.
    pub async fn rewrite_summary(&mut self, summary: &Entry, text: &str) -> Result<(), StoreError> {
        let seq = summary.seq.unwrap_or_default();
        self.rewritten.push(seq);
        let mut entry = summary.clone();
        entry.seq = None;
        if let Some(message) = entry.message.as_mut() {
            message.content = crate::history::Content::Text(text.to_owned());
        }
        entry.extra.insert(
            "rederived".to_owned(),
            serde_json::json!({"erasure_id": self.mark.erasure_id, "summarizer": "extractive"}),
        );
        let body = serde_json::to_string(&entry).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(
            "UPDATE threads SET stored_bytes = stored_bytes + $1 - (SELECT octet_length(body) \
             FROM messages WHERE thread_key = $2 AND seq = $3) WHERE thread_key = $2",
        )
        .bind(body.len() as i64)
        .bind(self.thread_key.as_str())
        .bind(seq)
        .execute(&mut *self.tx)
        .await?;
        sqlx::query(
            "UPDATE messages SET body = $1, content_hash = $2 WHERE thread_key = $3 AND seq = $4",
        )
        .bind(&body)
        .bind(fingerprint(&entry)?)
        .bind(self.thread_key.as_str())
        .bind(seq)
        .execute(&mut *self.tx)
        .await?;
        self.artifacts.compaction_summaries += 1;
        Ok(())
    }

    /// Records how many cached contexts the caller dropped.
    pub fn count_cached_contexts(&mut self, dropped: u64) {
        self.artifacts.cached_contexts = dropped;
    }

    /// Counts the thread's running jobs: the redaction epoch fences their writes.
    async fn count_fenced_jobs(&mut self) -> Result<u64, StoreError> {
        let running: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM jobs WHERE thread_key = $1 AND state = 'running'",
        )
        .bind(self.thread_key.as_str())
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(running as u64)
    }

    /// Commits a snip's redaction (no tombstone, no receipt). Returns the outline lines
    /// rewritten.
    /// Takes the entries at `seqs` out of the search index (an erasure's tombstones already
    /// are, through the rewrite's trigger; a snip keeps the entries but hides them).
    pub async fn forget_searched(&mut self, seqs: &[i64]) -> Result<(), StoreError> {
        Store::forget_searched(&mut self.tx, &self.thread_key, seqs).await?;
        Ok(())
    }

    /// Reports the commit as a retention policy's trim (event `trimmed`), not an erasure.
    pub fn report_as_trim(&mut self) {
        self.event_kind = "trimmed";
    }

    pub async fn commit_redaction(self) -> Result<u64, StoreError> {
        self.tx.commit().await?;
        Ok(self.artifacts.tree_nodes)
    }

    /// Records the receipt and commits.
    pub async fn commit(
        mut self,
        seqs: Vec<i64>,
        reason: Option<String>,
    ) -> Result<Erasure, StoreError> {
        self.artifacts.jobs_fenced = self.count_fenced_jobs().await?;
        // The overheads the thread taught came from its first calls, which may be among these.
        super::overheads::forget_taught_by(&mut self.tx, &self.thread_key).await?;
        // Until the thread is counted again (after the commit), its window's content is not
        // known: a first call appended in between must learn nothing from the erased entries.
        sqlx::query("UPDATE threads SET window_content_tokens = -1 WHERE thread_key = $1")
            .bind(self.thread_key.as_str())
            .execute(&mut *self.tx)
            .await?;
        let seqs_json = Value::from(seqs.clone()).to_string();
        let artifacts_json = serde_json::to_string(&self.artifacts)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let created_at = self.mark.erased_at.timestamp_millis();
        sqlx::query(
            "INSERT INTO erasures (erasure_id, thread_key, seqs, reason, artifacts, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&self.mark.erasure_id)
        .bind(self.thread_key.as_str())
        .bind(&seqs_json)
        .bind(reason.as_deref())
        .bind(&artifacts_json)
        .bind(created_at)
        .execute(&mut *self.tx)
        .await?;
        // A follower holds these summaries as they were: it reads them again.
        let event = serde_json::json!({
            "erasure_id": self.mark.erasure_id,
            "seqs": seqs,
            "rewritten_seqs": self.rewritten,
        });
        super::events::record_event(
            &mut self.tx,
            self.thread_key.as_str(),
            self.event_kind,
            &event,
            created_at,
        )
        .await?;
        self.tx.commit().await?;
        Ok(Erasure {
            erasure_id: self.mark.erasure_id,
            seqs,
            reason,
            artifacts: self.artifacts,
            created_at: self.mark.erased_at,
            scrubbed_at: None,
        })
    }
}

/// What [`Store::summary_rows`] read.
#[derive(Debug, Default)]
pub struct SummaryRows {
    /// Every row the statement matched, a summary or not: what a later read must find again.
    pub candidates: Vec<i64>,
    /// The boundaries and summaries among them.
    pub entries: Vec<Entry>,
}

/// The statement behind [`Store::summary_rows`], reading `columns`. A summary is found by a
/// marker in its body (a body holding the words is then parsed, and kept only when it is one):
/// no column says it, and a summary need not follow its boundary directly (an imported
/// transcript puts other entries between them).
fn summary_rows_sql(columns: &str) -> String {
    let boundaries = super::rows::BOUNDARY_ROWS;
    format!(
        "SELECT {columns} FROM messages WHERE thread_key = $1 \
         AND seq >= COALESCE((SELECT MAX(seq) FROM messages WHERE thread_key = $1 \
         AND {boundaries} AND seq <= $2), $2) \
         AND ({boundaries} OR (kind = 'user' AND (body LIKE '%ompactSummary%' \
         OR body LIKE '%ompact_summary%'))) ORDER BY seq"
    )
}

fn erasure_from_row(row: &sqlx::any::AnyRow) -> Result<Erasure, StoreError> {
    let seqs: String = row.try_get("seqs")?;
    let artifacts: String = row.try_get("artifacts")?;
    let scrubbed_at: Option<i64> = row.try_get("scrubbed_at")?;
    Ok(Erasure {
        erasure_id: row.try_get("erasure_id")?,
        seqs: serde_json::from_str(&seqs).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        reason: row.try_get("reason")?,
        artifacts: serde_json::from_str(&artifacts)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
        scrubbed_at: scrubbed_at.map(millis_to_datetime),
    })
}
