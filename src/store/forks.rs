//! Forks (`POST /v1/threads/{thread_id}/fork`): a new thread whose history is a prefix of
//! another's, copied in bulk in one transaction, with what is derived from that prefix and
//! still true of it: the summary tree's nodes that cover only the prefix (their model calls are
//! not made again), the search rows, and the settings.
//!
//! The copy is the fork's own: appends, snips, erasures and compactions in the parent do not
//! reach it, and deleting the parent does not break it. One thing does reach it: an erasure in
//! the parent erases the same entries in every fork that copied them
//! (`crate::jobs::erasure::erase_in_forks`). Not the other way: an erasure in a fork leaves the
//! parent's entries and its other forks' copies as they are, and its receipt names them
//! (`crate::jobs::erasure::held_elsewhere`). The parent's row is held while the copy is made
//! (PostgreSQL: `FOR UPDATE`; SQLite: the write lock, taken by the transaction's first write), so
//! an erasure of the parent commits either before the copy, which then holds tombstones, or after
//! the fork's commit, and then finds the fork.

use serde_json::{Map, Value};
use sqlx::{AnyConnection, Row};

use super::threads::{claim_name, thread_from_row, THREAD_COLUMNS};
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

/// Where a fork's copied entries came from: the thread, and below which seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedFrom {
    pub thread_id: ThreadId,
    pub thread_key: ThreadKey,
    /// The fork's entries with `seq < below_seq` are copies of that thread's.
    pub below_seq: i64,
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
        let id = fork.id.clone().unwrap_or_else(ThreadId::generate);
        for _ in 0..FORK_ATTEMPTS {
            let thread_key = ThreadKey::mint();
            let copied = match self.backend {
                Backend::Postgres => None,
                Backend::Sqlite => Some(self.copy_before(tenant, parent, &thread_key, &fork).await),
            };
            let outcome = match copied {
                None => {
                    self.finish_fork(tenant, parent, &id, &thread_key, &fork, None)
                        .await
                }
                Some(Ok(copied)) => {
                    self.finish_fork(tenant, parent, &id, &thread_key, &fork, Some(copied))
                        .await
                }
                Some(Err(error)) => Err(error),
            };
            if self.backend == Backend::Sqlite && outcome.is_err() {
                // The rows copied before are under a key no thread has (a crash here leaves
                // them to `sweep_orphans`).
                self.delete_rows_in_chunks(&thread_key).await?;
            }
            match outcome {
                Err(StoreError::SourcesChanged) => continue,
                Err(error) => return Err(error),
                Ok(thread) => {
                    // The estimate the auto-compaction trigger reads, counted from the copy.
                    if let Err(error) = self
                        .recount_context_tokens(tenant, &id, super::append::Recount::CountOnly)
                        .await
                    {
                        tracing::warn!(%error, "the fork's token count was not counted");
                    }
                    return Ok(thread);
                }
            }
        }
        Err(StoreError::SourcesChanged)
    }

    /// On SQLite, the bulk of a fork's copy before its transaction: a chunk of rows per
    /// statement, so the one write lock is never held long, under the fork's key, which no
    /// thread has until [`Store::finish_fork`] commits (and checks that no erasure or snip
    /// changed the parent meanwhile).
    async fn copy_before(
        &self,
        tenant: &TenantId,
        parent: &ThreadId,
        fork_key: &ThreadKey,
        fork: &NewFork,
    ) -> Result<Copied, StoreError> {
        let copied = {
            let mut conn = self.writer.acquire().await?;
            read_source(&mut conn, tenant, parent, fork.at_seq, "").await?
        };
        // The writer's connection is taken for each statement: other writes go between them.
        copy_rows(
            Target::Pool(&self.writer),
            &copied,
            fork_key,
            Some(FORK_CHUNK_ROWS),
        )
        .await?;
        Ok(copied)
    }

    /// The fork's transaction: its name, its row, settings and metadata, and (unless
    /// `copied` says they are copied already) its rows.
    async fn finish_fork(
        &self,
        tenant: &TenantId,
        parent: &ThreadId,
        id: &ThreadId,
        thread_key: &ThreadKey,
        fork: &NewFork,
        copied: Option<Copied>,
    ) -> Result<Thread, StoreError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        // The name first: on SQLite it takes the write lock for what is read next.
        claim_name(&mut tx, tenant, id, thread_key).await?;
        let lock = match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        };
        let source = read_source(&mut tx, tenant, parent, fork.at_seq, lock).await?;
        // The parent's policy as it is now (a copy made before may have read an older one).
        let retention = source.retention;
        let source = match copied {
            None => {
                copy_rows(Target::Conn(&mut tx), &source, thread_key, None).await?;
                source
            }
            // Copied from the parent as it was then: still so only if no erasure or snip moved
            // its epoch since (and it is the same thread).
            Some(copied) => {
                if copied.parent_key != source.parent_key || copied.epoch != source.epoch {
                    return Err(StoreError::SourcesChanged);
                }
                copied
            }
        };
        let at = source.at;
        let metadata = match &fork.metadata {
            Some(members) => Value::Object(members.clone()).to_string(),
            None => source.metadata.clone(),
        };
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
             forked_from_id, forked_at_seq, copied_below_seq, retention_own, retention_idle_ms, \
             retention_age_ms, retention_trim) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $5, $5, $12, $13, $14, $15)",
        )
        .bind(thread_key.as_str())
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(&metadata)
        .bind(at)
        .bind(counts.try_get::<i64, _>("visible_count")?)
        .bind(counts.try_get::<i64, _>("stored_bytes")?)
        .bind(source.searched)
        .bind(now)
        .bind(source.parent_key.as_str())
        .bind(parent.as_str())
        .bind(retention.own)
        .bind(retention.idle_ms)
        .bind(retention.age_ms)
        .bind(retention.trim)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO thread_settings (thread_key, auto_compact_tokens, microcompact, outline, \
             clearing, updated_at) \
             SELECT $1, auto_compact_tokens, microcompact, outline, clearing, $3 \
             FROM thread_settings WHERE thread_key = $2",
        )
        .bind(thread_key.as_str())
        .bind(source.parent_key.as_str())
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
        self.index_metadata(&mut tx, tenant, thread_key, &metadata)
            .await?;
        let created = if outlined {
            // Its outline is built from the nodes copied, and the rest summarized.
            super::jobs::enqueue_tree_in(
                &mut tx,
                self.backend,
                tenant,
                thread_key,
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
        Ok(thread)
    }

    /// The threads holding entries copied from the tenant's thread `thread_key`: its forks,
    /// and the forks of its deleted forks (migration 0023), oldest first.
    pub async fn forks_of(
        &self,
        tenant: &TenantId,
        thread_key: &ThreadKey,
    ) -> Result<Vec<ForkOf>, StoreError> {
        let rows = sqlx::query(
            "SELECT thread_id, thread_key, copied_below_seq AS forked_at_seq FROM threads \
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

    /// The thread the tenant's thread `thread_key` copied its first entries from (its parent,
    /// or the parent of a deleted one: migration 0023), while that thread lives; `None` for a
    /// thread that is no fork.
    pub async fn copied_from(
        &self,
        tenant: &TenantId,
        thread_key: &ThreadKey,
    ) -> Result<Option<CopiedFrom>, StoreError> {
        // Two statements, each on one thread's row: a fork and its parent may live on
        // different shards.
        let fork = sqlx::query(
            "SELECT forked_from_key, copied_below_seq FROM threads \
             WHERE thread_key = $1 AND tenant_id = $2",
        )
        .bind(thread_key.as_str())
        .bind(&tenant.0)
        .fetch_optional(&self.writer)
        .await?;
        let Some(fork) = fork else { return Ok(None) };
        let Some(parent_key) = fork.try_get::<Option<String>, _>("forked_from_key")? else {
            return Ok(None);
        };
        let below_seq = fork.try_get("copied_below_seq")?;
        let parent = sqlx::query(
            "SELECT thread_id, thread_key FROM threads WHERE thread_key = $1 AND tenant_id = $2",
        )
        .bind(&parent_key)
        .bind(&tenant.0)
        .fetch_optional(&self.writer)
        .await?;
        parent
            .map(|row| {
                Ok(CopiedFrom {
                    thread_id: ThreadId::new(row.try_get::<String, _>("thread_id")?),
                    thread_key: ThreadKey::from_stored(row.try_get("thread_key")?),
                    below_seq,
                })
            })
            .transpose()
    }

    /// Whether each of `seqs` in the thread `thread_key` is already erased (a tombstone).
    pub async fn all_erased(
        &self,
        thread_key: &ThreadKey,
        seqs: &[i64],
    ) -> Result<bool, StoreError> {
        for chunk in seqs.chunks(500) {
            let sql = format!(
                "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 \
                 AND seq IN ({})",
                super::list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(thread_key.as_str());
            for seq in chunk {
                query = query.bind(*seq);
            }
            for row in query.fetch_all(&self.pool).await? {
                if !super::rows::entry_from_row(&row)?.is_erased() {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}

/// What a fork takes of its parent, read from the parent's row.
#[derive(Debug, Clone)]
struct Copied {
    parent_key: ThreadKey,
    /// The parent's redaction epoch then: an erasure or snip since moves it.
    epoch: i64,
    /// The fork takes the entries before it.
    at: i64,
    /// The search rows it takes are those before it.
    searched: i64,
    /// Whether it takes the tree nodes inside the prefix.
    with_tree: bool,
    metadata: String,
    /// The parent's own retention policy, which the fork takes.
    retention: OwnRetention,
}

/// A thread's own retention policy as its row holds it (`retention_own` 0: none, it follows
/// its tenant's).
#[derive(Debug, Clone, Copy)]
struct OwnRetention {
    own: i64,
    idle_ms: Option<i64>,
    age_ms: Option<i64>,
    trim: i64,
}

/// Attempts at a fork whose parent an erasure or snip changed during its copy (SQLite).
const FORK_ATTEMPTS: usize = 3;

/// Rows a statement of a SQLite fork's copy takes at most (as a delete's chunks).
const FORK_CHUNK_ROWS: i64 = super::threads::DELETE_CHUNK_ROWS;

/// The parent's row as a fork reads it (`lock` appended to the statement), and what the fork
/// will take of it.
async fn read_source(
    conn: &mut AnyConnection,
    tenant: &TenantId,
    parent: &ThreadId,
    at_seq: Option<i64>,
    lock: &str,
) -> Result<Copied, StoreError> {
    // An expired parent is not found, as a deleted one.
    let row = sqlx::query(&format!(
        "SELECT thread_key, metadata, next_seq, search_seq, redaction_epoch, retention_own, \
         retention_idle_ms, retention_age_ms, retention_trim FROM threads \
         WHERE tenant_id = $1 AND thread_id = $2{}{lock}",
        super::expiry::unexpired("threads.", "$3")
    ))
    .bind(&tenant.0)
    .bind(parent.as_str())
    .bind(now_millis())
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::ThreadNotFound)?;
    let parent_key = ThreadKey::from_stored(row.try_get::<String, _>("thread_key")?);
    let next_seq: i64 = row.try_get("next_seq")?;
    let at = at_seq.unwrap_or(next_seq);
    if !(0..=next_seq).contains(&at) {
        return Err(StoreError::ForkPastEnd {
            at_seq: at,
            next_seq,
        });
    }
    // A snip after the prefix hid some of its entries from the parent's tree (their lines are
    // empty, the lines above them rebuilt without them) and from its search rows; in the fork,
    // which lacks the snip, they are visible again: its tree and search rows are made anew.
    let snipped_later = sqlx::query_scalar::<_, i64>(
        "SELECT seq FROM messages WHERE thread_key = $1 AND subtype = $2 AND seq >= $3 LIMIT 1",
    )
    .bind(parent_key.as_str())
    .bind(subtype::SNIP)
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?
    .is_some();
    let searched = if snipped_later {
        0
    } else {
        row.try_get::<i64, _>("search_seq")?.min(at)
    };
    Ok(Copied {
        parent_key,
        epoch: row.try_get("redaction_epoch")?,
        at,
        searched,
        with_tree: !snipped_later,
        metadata: row.try_get("metadata")?,
        retention: OwnRetention {
            own: row.try_get("retention_own")?,
            idle_ms: row.try_get("retention_idle_ms")?,
            age_ms: row.try_get("retention_age_ms")?,
            trim: row.try_get("retention_trim")?,
        },
    })
}

/// Copies the rows a fork takes (`copied`) under `fork`: all at once, or `chunk` rows a
/// statement.
async fn copy_rows(
    mut target: Target<'_>,
    copied: &Copied,
    fork: &ThreadKey,
    chunk: Option<i64>,
) -> Result<(), StoreError> {
    let parent = copied.parent_key.as_str();
    let ranges = |end: i64| {
        let step = chunk.unwrap_or(end).max(1);
        (0..end.max(0))
            .step_by(step as usize)
            .map(move |lo| (lo, lo.saturating_add(step).min(end)))
    };
    for (lo, hi) in ranges(copied.at) {
        copy_range(&mut target, &MESSAGES, parent, fork, (lo, hi), None).await?;
    }
    for (lo, hi) in ranges(copied.searched) {
        copy_range(&mut target, &SEARCH_ROWS, parent, fork, (lo, hi), None).await?;
    }
    if !copied.with_tree {
        return Ok(());
    }
    for level in 0..=MAX_TREE_LEVEL {
        // Node (level, idx) covers [idx·2^level, (idx+1)·2^level): inside the prefix when
        // idx < at / 2^level.
        let whole = copied.at >> level;
        if whole == 0 {
            break;
        }
        for range in ranges(whole) {
            copy_range(&mut target, &TREE_NODES, parent, fork, range, Some(level)).await?;
        }
    }
    Ok(())
}

/// A table a fork copies rows of: its columns but `thread_key`, and the one its ranges go by.
struct CopiedTable {
    table: &'static str,
    columns: &'static str,
    by: &'static str,
}

const MESSAGES: CopiedTable = CopiedTable {
    table: "messages",
    columns: "seq, uuid, kind, subtype, visible_rank, body, content_hash, created_at",
    by: "seq",
};

const SEARCH_ROWS: CopiedTable = CopiedTable {
    table: "search_rows",
    columns: "seq, text, thinking, anchors",
    by: "seq",
};

const TREE_NODES: CopiedTable = CopiedTable {
    table: "tree_nodes",
    columns: "level, idx, text, summarizer, calls, created_at, dropped",
    by: "idx",
};

/// Copies the rows of `table` of the thread `parent` with `lo <= by < hi` (and of tree `level`
/// when given) under `fork`, in one `INSERT … SELECT`.
async fn copy_range(
    target: &mut Target<'_>,
    table: &CopiedTable,
    parent: &str,
    fork: &ThreadKey,
    (lo, hi): (i64, i64),
    level: Option<u32>,
) -> Result<(), StoreError> {
    let CopiedTable { table, columns, by } = table;
    let of_level = if level.is_some() {
        " AND level = $5"
    } else {
        ""
    };
    let sql = format!(
        "INSERT INTO {table} (thread_key, {columns}) SELECT $1, {columns} FROM {table} \
         WHERE thread_key = $2 AND {by} >= $3 AND {by} < $4{of_level}"
    );
    let mut query = sqlx::query(&sql)
        .bind(fork.as_str())
        .bind(parent)
        .bind(lo)
        .bind(hi);
    if let Some(level) = level {
        query = query.bind(i64::from(level));
    }
    match target {
        Target::Conn(conn) => query.execute(&mut **conn).await?,
        Target::Pool(pool) => query.execute(*pool).await?,
    };
    Ok(())
}

/// Where a fork's copy runs: in its transaction, or a statement at a time on the pool.
enum Target<'c> {
    Conn(&'c mut AnyConnection),
    Pool(&'c sqlx::AnyPool),
}
