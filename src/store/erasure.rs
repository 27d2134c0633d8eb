//! Erasure: entries whose content goes for good, from the record and from everything derived
//! from it, in one transaction ([`ErasureTx`]). The caller (`jobs::erasure`) drives the steps
//! that need more than the store (stand-in lines, summaries derived again without a model); the
//! store holds the transaction, the tombstones, the receipts, and the scrubbing of the files
//! afterwards.

use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use super::rows::{entry_from_row, fingerprint};
use super::tree::StandIns;
use super::{
    list_placeholders, millis_to_datetime, now_millis, Backend, Store, StoreError, TenantId,
    ThreadId, ThreadKey,
};
use crate::history::model::{Entry, ErasedMark};

/// What an erasure names: entries by uuid, or by seq.
#[derive(Debug, Clone)]
pub enum ErasureTargets {
    Uuids(Vec<String>),
    Seqs(Vec<i64>),
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

/// A compact boundary in the thread, and the summary right after it.
#[derive(Debug, Clone)]
pub struct StoredSummary {
    pub boundary: Entry,
    pub summary: Option<Entry>,
}

/// Most entries one erasure names.
pub const MAX_ERASED_ENTRIES: usize = 1_000;

/// An erasure in progress: one write transaction on the thread, whose redaction epoch has
/// moved (so no job that read the thread before can write after) and whose row is held until
/// [`ErasureTx::commit`].
pub struct ErasureTx {
    tx: Transaction<'static, Any>,
    pub thread_key: ThreadKey,
    pub mark: ErasedMark,
    artifacts: ErasureArtifacts,
    /// The seqs of the summaries derived again.
    pub rewritten: Vec<u64>,
}

impl Store {
    /// Opens an erasure on the tenant's thread: takes its row (the write lock on SQLite) and
    /// moves its redaction epoch.
    pub async fn begin_erasure(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ErasureTx, StoreError> {
        let mut tx = self.writer.begin().await?;
        let now = now_millis();
        let key: Option<String> = sqlx::query_scalar(
            "UPDATE threads SET redaction_epoch = redaction_epoch + 1, updated_at = $3 \
             WHERE tenant_id = $1 AND thread_id = $2 RETURNING thread_key",
        )
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let thread_key = ThreadKey::from_stored(key.ok_or(StoreError::ThreadNotFound)?);
        Ok(ErasureTx {
            tx,
            thread_key,
            mark: ErasedMark {
                erasure_id: uuid::Uuid::now_v7().to_string(),
                erased_at: millis_to_datetime(now),
            },
            artifacts: ErasureArtifacts::default(),
            rewritten: Vec::new(),
        })
    }

    /// The thread's erasures, oldest first.
    pub async fn erasures(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<Vec<Erasure>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let rows = sqlx::query(
            "SELECT erasure_id, seqs, reason, artifacts, created_at, scrubbed_at FROM erasures \
             WHERE thread_key = $1 ORDER BY created_at, erasure_id",
        )
        .bind(thread_key.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(erasure_from_row).collect()
    }

    /// Empties what the database files keep of rows changed or deleted (after an erasure or a
    /// delete): on an SQLite file, the WAL (its pages as they were) is checkpointed and cut to
    /// nothing, waiting for older readers; on PostgreSQL the thread tables are vacuumed, which
    /// removes the dead row versions that hold the old text. Returns once done.
    pub async fn scrub_storage(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => {
                if self.wal_scrub.is_some() {
                    super::truncate_wal(&self.pool).await;
                }
            }
            Backend::Postgres => {
                for table in SCRUBBED_TABLES {
                    sqlx::query(&format!("VACUUM {table}"))
                        .execute(&self.pool)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Records that the erasure's text is out of the database files.
    pub async fn mark_erasure_scrubbed(&self, erasure_id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE erasures SET scrubbed_at = $1 WHERE erasure_id = $2")
            .bind(now_millis())
            .bind(erasure_id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }
}

/// The tables whose rows an erasure rewrites (PostgreSQL vacuums them afterwards).
const SCRUBBED_TABLES: &[&str] = &["messages", "tree_nodes"];

impl ErasureTx {
    /// Makes the named entries tombstones ([`Entry::tombstone`]): content gone, the hash of
    /// it too, the thread's stored bytes lowered. Returns the erased entries (already erased
    /// ones included, so a repeated erasure answers the same seqs). Names not found fail with
    /// [`StoreError::NoSuchEntries`].
    pub async fn tombstone(&mut self, targets: &ErasureTargets) -> Result<Vec<Entry>, StoreError> {
        let (column, names): (&str, Vec<String>) = match targets {
            ErasureTargets::Uuids(uuids) => ("uuid", uuids.clone()),
            ErasureTargets::Seqs(seqs) => ("seq", seqs.iter().map(i64::to_string).collect()),
        };
        let mut found = Vec::new();
        for chunk in names.chunks(500) {
            let sql = format!(
                "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 \
                 AND {column} IN ({}) ORDER BY seq",
                list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(self.thread_key.as_str());
            for name in chunk {
                query = match targets {
                    ErasureTargets::Uuids(_) => query.bind(name.as_str()),
                    ErasureTargets::Seqs(_) => query.bind(name.parse::<i64>().unwrap_or(i64::MIN)),
                };
            }
            for row in query.fetch_all(&mut *self.tx).await? {
                let body: String = row.try_get("body")?;
                found.push((entry_from_row(&row)?, body.len() as i64));
            }
        }
        let missing: Vec<String> = names
            .iter()
            .filter(|name| {
                !found.iter().any(|(entry, _)| match targets {
                    ErasureTargets::Uuids(_) => entry.uuid.as_deref() == Some(name.as_str()),
                    ErasureTargets::Seqs(_) => {
                        entry.seq.map(|s| s.to_string()) == Some(name.to_string())
                    }
                })
            })
            .cloned()
            .collect();
        if !missing.is_empty() {
            let field = match targets {
                ErasureTargets::Uuids(_) => "uuids",
                ErasureTargets::Seqs(_) => "seqs",
            };
            return Err(StoreError::NoSuchEntries {
                field,
                names: missing,
            });
        }
        found.sort_by_key(|(entry, _)| entry.seq);
        found.dedup_by_key(|(entry, _)| entry.seq);
        let mut erased = Vec::with_capacity(found.len());
        for (entry, old_bytes) in found {
            if entry.is_erased() {
                erased.push(entry);
                continue;
            }
            let seq = entry.seq.unwrap_or_default();
            let mut tombstone = entry.tombstone(self.mark.clone());
            tombstone.seq = None;
            let body = serde_json::to_string(&tombstone)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let hash = fingerprint(&tombstone)?;
            sqlx::query(
                "UPDATE messages SET body = $1, content_hash = $2 WHERE thread_key = $3 AND seq = $4",
            )
            .bind(&body)
            .bind(&hash)
            .bind(self.thread_key.as_str())
            .bind(seq)
            .execute(&mut *self.tx)
            .await?;
            sqlx::query(
                "UPDATE threads SET stored_bytes = stored_bytes - $1 WHERE thread_key = $2",
            )
            .bind(old_bytes - body.len() as i64)
            .bind(self.thread_key.as_str())
            .execute(&mut *self.tx)
            .await?;
            self.artifacts.messages += 1;
            tombstone.seq = Some(seq);
            erased.push(tombstone);
        }
        Ok(erased)
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

    /// The thread's compact boundaries from the last one at or before `seq` on, oldest first,
    /// each with the summary right after it (`None` when the entry after it is not one): the
    /// summaries an entry at `seq` or later may have reached, and the one they fold in.
    pub async fn summaries_from(&mut self, seq: i64) -> Result<Vec<StoredSummary>, StoreError> {
        let boundaries = super::rows::BOUNDARY_ROWS;
        let rows = sqlx::query(&format!(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 \
             AND seq >= COALESCE((SELECT MAX(seq) FROM messages WHERE thread_key = $1 \
             AND {boundaries} AND seq <= $2), 0) \
             AND ({boundaries} OR seq IN (SELECT seq + 1 FROM messages \
             WHERE thread_key = $1 AND {boundaries})) ORDER BY seq"
        ))
        .bind(self.thread_key.as_str())
        .bind(seq)
        .fetch_all(&mut *self.tx)
        .await?;
        let mut summaries: Vec<StoredSummary> = Vec::new();
        for row in &rows {
            let entry = entry_from_row(row)?;
            if entry.is_compact_boundary() {
                summaries.push(StoredSummary {
                    boundary: entry,
                    summary: None,
                });
                continue;
            }
            if let Some(last) = summaries.last_mut() {
                let follows = last.boundary.seq.map(|seq| seq + 1) == entry.seq;
                if follows && entry.is_compact_summary {
                    last.summary = Some(entry);
                }
            }
        }
        Ok(summaries)
    }

    /// Replaces a compaction summary's text with `text`, in place: the entry keeps its seq,
    /// uuid and place, and says it was derived again after an erasure.
    pub async fn rewrite_summary(&mut self, summary: &Entry, text: &str) -> Result<(), StoreError> {
        let seq = summary.seq.unwrap_or_default();
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
        self.rewritten.push(seq as u64);
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
    pub async fn commit_redaction(mut self) -> Result<u64, StoreError> {
        sqlx::query("UPDATE outlines SET version = version + 1 WHERE thread_key = $1")
            .bind(self.thread_key.as_str())
            .execute(&mut *self.tx)
            .await?;
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
        let seqs_json = Value::from(seqs.clone()).to_string();
        let artifacts_json = serde_json::to_string(&self.artifacts)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let created_at = self.mark.erased_at.timestamp_millis();
        // Outline reads built from the old lines are not reused.
        sqlx::query("UPDATE outlines SET version = version + 1 WHERE thread_key = $1")
            .bind(self.thread_key.as_str())
            .execute(&mut *self.tx)
            .await?;
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
