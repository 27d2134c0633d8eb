//! Forks (`POST /v1/threads/{thread_id}/fork`): a new thread whose history is a prefix of
//! another's, copied in bulk in one transaction, with what is derived from that prefix and
//! still true of it: the summary tree's nodes that cover only the prefix (their model calls are
//! not made again), the search rows, and the settings.
//!
//! The copy is the fork's own: appends, snips, erasures and compactions in the parent do not
//! reach it, and deleting the parent does not break it. One thing does reach it: an erasure in
//! the parent erases the same entries in every fork that copied them
//! (`crate::jobs::erasure::erase_everywhere`). The parent's row is held while the copy is made
//! (PostgreSQL: `FOR UPDATE`; SQLite: the write lock, taken by the transaction's first write), so
//! an erasure of the parent commits either before the copy, which then holds tombstones, or after
//! the fork's commit, and then finds the fork.

use serde_json::{Map, Value};
use sqlx::Row;

use super::threads::{thread_from_row, THREAD_COLUMNS};
use super::{now_millis, Backend, Store, StoreError, TenantId, Thread, ThreadId, ThreadKey};
use crate::history::model::subtype;

/// What a fork is made of.
#[derive(Debug, Clone, Default)]
pub struct NewFork {
    /// The fork takes the parent's entries with `seq < at_seq` (all of them when `None`).
    pub at_seq: Option<i64>,
    /// The fork's id; generated when `None`.
    pub id: Option<ThreadId>,
    /// The fork's metadata; the parent's when `None`.
    pub metadata: Option<Map<String, Value>>,
}

/// A fork of a thread, as its parent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkOf {
    pub thread_id: ThreadId,
    pub thread_key: ThreadKey,
    /// The fork holds the parent's entries with `seq < at_seq`.
    pub at_seq: i64,
}

/// Tree levels a fork looks at: a level's nodes cover `2^level` entries, and a thread has
/// fewer than `2^62`.
const MAX_TREE_LEVEL: u32 = 62;

impl Store {
    /// Forks the tenant's thread `parent` (see the module docs). Fails with
    /// [`StoreError::ThreadNotFound`], [`StoreError::ThreadExists`] (the id is taken) or
    /// [`StoreError::ForkPastEnd`].
    pub async fn fork_thread(
        &self,
        tenant: &TenantId,
        parent: &ThreadId,
        fork: NewFork,
    ) -> Result<Thread, StoreError> {
        let id = fork.id.unwrap_or_else(ThreadId::generate);
        let thread_key = ThreadKey::mint();
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        // The name first: on SQLite the first write takes the write lock, so nothing read after
        // it changes before the commit.
        let named = sqlx::query(
            "INSERT INTO thread_names (tenant_id, thread_id, thread_key) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id, thread_id) DO NOTHING",
        )
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(thread_key.as_str())
        .execute(&mut *tx)
        .await?;
        if named.rows_affected() == 0 {
            return Err(StoreError::ThreadExists(id.into_string()));
        }
        let lock = match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        };
        let row = sqlx::query(&format!(
            "SELECT thread_key, metadata, next_seq, search_seq FROM threads \
             WHERE tenant_id = $1 AND thread_id = $2{lock}"
        ))
        .bind(&tenant.0)
        .bind(parent.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        let parent_key = ThreadKey::from_stored(row.try_get::<String, _>("thread_key")?);
        let next_seq: i64 = row.try_get("next_seq")?;
        let at = fork.at_seq.unwrap_or(next_seq);
        if !(0..=next_seq).contains(&at) {
            return Err(StoreError::ForkPastEnd {
                at_seq: at,
                next_seq,
            });
        }
        let metadata = match fork.metadata {
            Some(members) => Value::Object(members).to_string(),
            None => row.try_get("metadata")?,
        };
        let parent_searched: i64 = row.try_get("search_seq")?;

        // A snip after the prefix hid some of its entries from the parent's tree (their lines
        // are empty, the lines above them rebuilt without them); in the fork, which lacks the
        // snip, they are visible again, so the tree is built anew there,
        // and their search rows (which left them out) are made again.
        let snipped_later = sqlx::query_scalar::<_, i64>(
            "SELECT seq FROM messages WHERE thread_key = $1 AND subtype = $2 AND seq >= $3 LIMIT 1",
        )
        .bind(parent_key.as_str())
        .bind(subtype::SNIP)
        .bind(at)
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
        let searched = if snipped_later {
            0
        } else {
            parent_searched.min(at)
        };
        sqlx::query(
            "INSERT INTO messages (thread_key, seq, uuid, kind, subtype, visible_rank, body, \
             content_hash, created_at) \
             SELECT $1, seq, uuid, kind, subtype, visible_rank, body, content_hash, created_at \
             FROM messages WHERE thread_key = $2 AND seq < $3",
        )
        .bind(thread_key.as_str())
        .bind(parent_key.as_str())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        let counts = sqlx::query(
            "SELECT COALESCE(SUM(octet_length(body)), 0) AS stored_bytes, \
             COALESCE(MAX(visible_rank), 0) AS visible_count FROM messages WHERE thread_key = $1",
        )
        .bind(thread_key.as_str())
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO threads (thread_key, tenant_id, thread_id, metadata, next_seq, \
             visible_count, stored_bytes, search_seq, created_at, updated_at, forked_from_key, \
             forked_from_id, forked_at_seq) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $5)",
        )
        .bind(thread_key.as_str())
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(&metadata)
        .bind(at)
        .bind(counts.try_get::<i64, _>("visible_count")?)
        .bind(counts.try_get::<i64, _>("stored_bytes")?)
        .bind(searched)
        .bind(now)
        .bind(parent_key.as_str())
        .bind(parent.as_str())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO search_rows (thread_key, seq, text, thinking, anchors) \
             SELECT $1, seq, text, thinking, anchors FROM search_rows \
             WHERE thread_key = $2 AND seq < $3",
        )
        .bind(thread_key.as_str())
        .bind(parent_key.as_str())
        .bind(searched)
        .execute(&mut *tx)
        .await?;
        if !snipped_later {
            self.copy_tree_nodes(&mut tx, &parent_key, &thread_key, at)
                .await?;
        }
        sqlx::query(
            "INSERT INTO thread_settings (thread_key, auto_compact_tokens, microcompact, outline, \
             clearing, updated_at) \
             SELECT $1, auto_compact_tokens, microcompact, outline, clearing, $3 \
             FROM thread_settings WHERE thread_key = $2",
        )
        .bind(thread_key.as_str())
        .bind(parent_key.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let outline: Option<Option<String>> =
            sqlx::query_scalar("SELECT outline FROM thread_settings WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let outlined = super::settings::outline_column(outline.flatten())?
            .is_some_and(|options| options.enabled);
        self.index_metadata(&mut tx, tenant, &thread_key, &metadata)
            .await?;
        let created = if outlined {
            // Its outline is built from the nodes copied, and the rest summarized.
            super::jobs::enqueue_tree_in(
                &mut tx,
                self.backend,
                tenant,
                &thread_key,
                self.job_max_attempts,
            )
            .await?
            .created
        } else {
            false
        };
        let row = sqlx::query(&format!(
            "SELECT {THREAD_COLUMNS} FROM threads WHERE thread_key = $1"
        ))
        .bind(thread_key.as_str())
        .fetch_one(&mut *tx)
        .await?;
        let thread = thread_from_row(&row)?;
        tx.commit().await?;
        if created {
            self.job_signal.notify_one();
        }
        // The estimate the auto-compaction trigger reads, counted from the copied window.
        if let Err(error) = self
            .recount_context_tokens(tenant, &id, super::append::Recount::CountOnly)
            .await
        {
            tracing::warn!(%error, "the fork's token count was not counted");
        }
        Ok(thread)
    }

    /// Copies the tree nodes of `parent` that cover only entries before `at` to `fork`.
    async fn copy_tree_nodes(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        parent: &ThreadKey,
        fork: &ThreadKey,
        at: i64,
    ) -> Result<(), StoreError> {
        for level in 0..=MAX_TREE_LEVEL {
            // Node (level, idx) covers [idx·2^level, (idx+1)·2^level): inside the prefix when
            // idx < at / 2^level.
            let whole = at >> level;
            if whole == 0 {
                break;
            }
            sqlx::query(
                "INSERT INTO tree_nodes (thread_key, level, idx, text, summarizer, calls, \
                 created_at, dropped) \
                 SELECT $1, level, idx, text, summarizer, calls, created_at, dropped \
                 FROM tree_nodes WHERE thread_key = $2 AND level = $3 AND idx < $4",
            )
            .bind(fork.as_str())
            .bind(parent.as_str())
            .bind(i64::from(level))
            .bind(whole)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// The forks made of the tenant's thread `thread_key`, oldest first.
    pub async fn forks_of(
        &self,
        tenant: &TenantId,
        thread_key: &ThreadKey,
    ) -> Result<Vec<ForkOf>, StoreError> {
        let rows = sqlx::query(
            "SELECT thread_id, thread_key, forked_at_seq FROM threads \
             WHERE forked_from_key = $1 AND tenant_id = $2 ORDER BY created_at, thread_key",
        )
        .bind(thread_key.as_str())
        .bind(&tenant.0)
        .fetch_all(&self.writer)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ForkOf {
                    thread_id: ThreadId::new(row.try_get::<String, _>("thread_id")?),
                    thread_key: ThreadKey::from_stored(row.try_get("thread_key")?),
                    at_seq: row.try_get("forked_at_seq")?,
                })
            })
            .collect()
    }
}
