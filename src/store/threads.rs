//! Threads: create, read, update, find, delete.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::expiry::unexpired;
use super::{millis_to_datetime, now_millis, Store, StoreError, TenantId, ThreadId, ThreadKey};

/// A stored thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    /// The caller's id, unique within the tenant.
    pub id: ThreadId,
    pub metadata: Map<String, Value>,
    /// The seq the next appended message will get (= number of messages).
    pub next_seq: i64,
    /// The bytes of its stored bodies, which `--max-thread-bytes` limits.
    pub stored_bytes: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The thread it was forked from, if it is a fork.
    pub forked_from: Option<Lineage>,
}

/// Where a fork came from: its parent (which may have been deleted since) and how many of the
/// parent's entries it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    pub thread_id: ThreadId,
    pub at_seq: i64,
}

#[derive(Debug, Clone, Default)]
pub struct NewThread {
    /// A client-chosen id; generated when `None`.
    pub id: Option<ThreadId>,
    pub metadata: Map<String, Value>,
}

/// One page of threads, in the order asked for.
#[derive(Debug, Clone)]
pub struct ThreadPage {
    pub threads: Vec<Thread>,
    /// Pass back as `cursor` (with the same filter) to read the next page; `None` on the last.
    pub next_cursor: Option<String>,
    /// How many threads match the filter, when asked for.
    pub total: Option<i64>,
}

/// Which time a list of threads goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadOrder {
    #[default]
    Created,
    Updated,
}

impl ThreadOrder {
    fn column(self) -> &'static str {
        match self {
            ThreadOrder::Created => "created_at",
            ThreadOrder::Updated => "updated_at",
        }
    }
}

/// Which of a tenant's threads a list holds, and in which order.
#[derive(Debug, Clone, Default)]
pub struct ThreadFilter {
    /// Top-level metadata members every listed thread has, each with this value (a string,
    /// number or boolean; never null, which is how an update removes a member).
    pub metadata: Map<String, Value>,
    /// Unix ms: only threads created, or updated, after it.
    pub created_after: Option<i64>,
    pub updated_after: Option<i64>,
    pub order_by: ThreadOrder,
    pub descending: bool,
    /// Also count every thread the filter matches (one more query).
    pub with_total: bool,
    /// Only the forks of this thread (none once it is deleted).
    pub forked_from: Option<ThreadId>,
}

/// The longest metadata key a filter may name (the JSON path quotes it).
pub const MAX_FILTER_KEY_CHARS: usize = 64;

/// The most members one metadata filter may name: each is tested on every row a filtered list
/// reads (SQLite parses the document once per member).
pub const MAX_FILTER_MEMBERS: usize = 8;

/// The most threads `include_total` counts; past it the total says "at least this many".
pub const MAX_COUNTED_THREADS: i64 = 10_000;

/// Whether `key` may be filtered on: it is quoted into a JSON path on SQLite.
pub fn filterable_key(key: &str) -> bool {
    !key.is_empty()
        && key.chars().count() <= MAX_FILTER_KEY_CHARS
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// What a read or write of a thread's data needs first: its internal key and where it stands.
#[derive(Debug, Clone)]
pub(crate) struct ThreadHead {
    pub thread_key: ThreadKey,
    pub next_seq: i64,
    /// User and assistant entries stored so far.
    pub visible_count: i64,
}

pub(super) const THREAD_COLUMNS: &str = "thread_key, thread_id, metadata, next_seq, stored_bytes, \
     created_at, updated_at, forked_from_id, forked_at_seq";

pub(super) fn thread_from_row(row: &AnyRow) -> Result<Thread, StoreError> {
    let metadata: String = row.try_get("metadata")?;
    let metadata = serde_json::from_str(&metadata)
        .map_err(|e| StoreError::Corrupt(format!("thread metadata: {e}")))?;
    Ok(Thread {
        id: ThreadId::new(row.try_get::<String, _>("thread_id")?),
        metadata,
        next_seq: row.try_get("next_seq")?,
        stored_bytes: row.try_get("stored_bytes")?,
        created_at: millis_to_datetime(row.try_get("created_at")?),
        updated_at: millis_to_datetime(row.try_get("updated_at")?),
        forked_from: match (
            row.try_get::<Option<String>, _>("forked_from_id")?,
            row.try_get::<Option<i64>, _>("forked_at_seq")?,
        ) {
            (Some(thread_id), Some(at_seq)) => Some(Lineage {
                thread_id: ThreadId::new(thread_id),
                at_seq,
            }),
            _ => None,
        },
    })
}

/// Takes the tenant's thread name `id` for the thread `thread_key` in `tx`: unique in
/// `thread_names` (distributed by tenant, where `threads` is distributed by thread: migration
/// 0018). [`StoreError::ThreadExists`] when taken. On SQLite, as a first write, it also takes the
/// write lock, so nothing the transaction reads after it changes before the commit.
pub(super) async fn claim_name(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    tenant: &TenantId,
    id: &ThreadId,
    thread_key: &ThreadKey,
) -> Result<(), StoreError> {
    let named = sqlx::query(
        "INSERT INTO thread_names (tenant_id, thread_id, thread_key) VALUES ($1, $2, $3) \
         ON CONFLICT (tenant_id, thread_id) DO NOTHING",
    )
    .bind(&tenant.0)
    .bind(id.as_str())
    .bind(thread_key.as_str())
    .execute(&mut **tx)
    .await?;
    if named.rows_affected() == 0 {
        return Err(StoreError::ThreadExists(id.as_str().to_owned()));
    }
    Ok(())
}

/// The list cursor: the (created_at, thread_key) of the last thread of a page.
fn encode_cursor(created_at: i64, thread_key: &str) -> String {
    format!("{created_at}.{thread_key}")
}

fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    let (millis, key) = cursor.split_once('.').ok_or(StoreError::BadCursor)?;
    let millis = millis.parse().map_err(|_| StoreError::BadCursor)?;
    if key.is_empty() {
        return Err(StoreError::BadCursor);
    }
    Ok((millis, key.to_owned()))
}

impl Store {
    /// Creates a thread. An id still held by an expired thread the sweep has not reached is
    /// free: that thread is expired now, as the sweep would (its `expired` event first).
    pub async fn create_thread(
        &self,
        tenant: &TenantId,
        new: NewThread,
    ) -> Result<Thread, StoreError> {
        let id = new.id.clone().unwrap_or_else(ThreadId::generate);
        let new = NewThread {
            id: Some(id.clone()),
            ..new
        };
        match self.create_thread_once(tenant, new.clone()).await {
            Err(StoreError::ThreadExists(_))
                if self.expire_thread(tenant, &id, now_millis()).await? =>
            {
                self.create_thread_once(tenant, new).await
            }
            outcome => outcome,
        }
    }

    async fn create_thread_once(
        &self,
        tenant: &TenantId,
        new: NewThread,
    ) -> Result<Thread, StoreError> {
        let id = new.id.unwrap_or_else(ThreadId::generate);
        let thread_key = ThreadKey::mint();
        let now = now_millis();
        let metadata = Value::Object(new.metadata.clone()).to_string();
        // The name is taken in the transaction that creates the row.
        let mut tx = self.writer.begin().await?;
        claim_name(&mut tx, tenant, &id, &thread_key).await?;
        sqlx::query(
            "INSERT INTO threads (thread_key, tenant_id, thread_id, metadata, next_seq, visible_count, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 0, 0, $5, $5)",
        )
        .bind(thread_key.as_str())
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(&metadata)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        self.index_metadata(&mut tx, tenant, &thread_key, &metadata)
            .await?;
        tx.commit().await?;
        Ok(Thread {
            id,
            metadata: new.metadata,
            next_seq: 0,
            stored_bytes: 0,
            created_at: millis_to_datetime(now),
            updated_at: millis_to_datetime(now),
            forked_from: None,
        })
    }

    pub async fn get_thread(&self, tenant: &TenantId, id: &ThreadId) -> Result<Thread, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {THREAD_COLUMNS} FROM threads WHERE tenant_id = $1 AND thread_id = $2{}",
            unexpired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        thread_from_row(&row)
    }

    /// The head of a tenant's thread: one read by the `(tenant_id, thread_id)` key. An expired
    /// thread is not found, as a deleted one, before the sweep deletes it.
    pub(crate) async fn thread_head(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ThreadHead, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT thread_key, next_seq, visible_count FROM threads \
             WHERE tenant_id = $1 AND thread_id = $2{}",
            unexpired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok(ThreadHead {
            thread_key: ThreadKey::from_stored(row.try_get("thread_key")?),
            next_seq: row.try_get("next_seq")?,
            visible_count: row.try_get("visible_count")?,
        })
    }

    /// A page of the tenant's threads that `filter` matches, after `cursor`, at most `limit`.
    /// Served by an index on both backends: by (tenant, created or updated time), and on
    /// PostgreSQL a GIN index of the metadata for its filter.
    pub async fn list_threads(
        &self,
        tenant: &TenantId,
        filter: &ThreadFilter,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ThreadPage, StoreError> {
        let column = filter.order_by.column();
        let (past, direction) = if filter.descending {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        let parent = match &filter.forked_from {
            None => None,
            Some(parent) => match self.thread_head(tenant, parent).await {
                Ok(head) => Some(head.thread_key),
                Err(StoreError::ThreadNotFound) => {
                    return Ok(ThreadPage {
                        threads: Vec::new(),
                        next_cursor: None,
                        total: filter.with_total.then_some(0),
                    })
                }
                Err(error) => return Err(error),
            },
        };
        let (mut conditions, binds) = self.filter_conditions(tenant, filter, parent.as_ref(), 2);
        // An expired thread is never listed, even before the retention job deletes it.
        conditions.push_str(&self.unexpired_condition(tenant, None, "threads").await?);
        let mut sql =
            format!("SELECT {THREAD_COLUMNS} FROM threads WHERE tenant_id = $1{conditions}");
        let next = binds.len() + 2;
        let cursor = cursor.map(decode_cursor).transpose()?;
        if cursor.is_some() {
            sql.push_str(&format!(
                " AND ({column} {past} ${next} OR ({column} = ${next} AND thread_key {past} ${}))",
                next + 1
            ));
        }
        let limit_at = next + if cursor.is_some() { 2 } else { 0 };
        // A metadata filter on PostgreSQL reads its matches through the GIN index, then sorts
        // them: the planner, which cannot estimate a containment's matches (it guesses 1%),
        // would otherwise walk the list's index in order and probe every thread's metadata,
        // reading most of a large tenant for a rare match. `+ 0` takes that index off its list.
        let sort_key = if self.backend == super::Backend::Postgres && !filter.metadata.is_empty() {
            format!("{column} + 0")
        } else {
            column.to_owned()
        };
        sql.push_str(&format!(
            " ORDER BY {sort_key} {direction}, thread_key {direction} LIMIT ${limit_at}"
        ));
        // Not kept prepared: PostgreSQL plans an unnamed statement for its values, where a kept
        // one soon gets a generic plan, which cannot see how rare a metadata filter is.
        let mut query = sqlx::query(&sql).persistent(false).bind(&tenant.0);
        for bind in &binds {
            query = query.bind(bind.clone());
        }
        if let Some((millis, key)) = &cursor {
            query = query.bind(*millis).bind(key.clone());
        }
        let rows = query
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let page = &rows[..rows.len().min(limit as usize)];
        let threads = page.iter().map(thread_from_row).collect::<Result<_, _>>()?;
        // A row past the page means more follow: the cursor is the page's last thread.
        let next_cursor = match page.last() {
            Some(last) if rows.len() > page.len() => Some(encode_cursor(
                last.try_get(column)?,
                &last.try_get::<String, _>("thread_key")?,
            )),
            _ => None,
        };
        // Counted up to a bound: a total over many threads reads each of them.
        let total = if filter.with_total {
            let sql = format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM threads WHERE tenant_id = $1{conditions} \
                 LIMIT {MAX_COUNTED_THREADS}) counted"
            );
            let mut query = sqlx::query_scalar::<_, i64>(&sql)
                .persistent(false)
                .bind(&tenant.0);
            for bind in binds {
                query = query.bind(bind);
            }
            Some(query.fetch_one(&self.pool).await?)
        } else {
            None
        };
        Ok(ThreadPage {
            threads,
            next_cursor,
            total,
        })
    }

    /// The SQL conditions of `filter` (each starting with ` AND`), numbered from `$first`, and
    /// their values in order: every value binds as text.
    fn filter_conditions(
        &self,
        tenant: &TenantId,
        filter: &ThreadFilter,
        parent: Option<&ThreadKey>,
        first: usize,
    ) -> (String, Vec<String>) {
        let mut sql = String::new();
        let mut binds: Vec<String> = Vec::new();
        let next = |binds: &mut Vec<String>, value: String| {
            binds.push(value);
            first + binds.len() - 1
        };
        if let Some(after) = filter.created_after {
            let n = next(&mut binds, after.to_string());
            sql.push_str(&format!(" AND created_at > CAST(${n} AS BIGINT)"));
        }
        if let Some(parent) = parent {
            let n = next(&mut binds, parent.as_str().to_owned());
            sql.push_str(&format!(" AND forked_from_key = ${n}"));
        }
        if let Some(after) = filter.updated_after {
            let n = next(&mut binds, after.to_string());
            sql.push_str(&format!(" AND updated_at > CAST(${n} AS BIGINT)"));
        }
        if !filter.metadata.is_empty() {
            match self.backend {
                super::Backend::Postgres => {
                    let mut wanted = Map::new();
                    wanted.insert(tenant.0.clone(), Value::Object(filter.metadata.clone()));
                    let n = next(&mut binds, Value::Object(wanted).to_string());
                    // Through the GIN index of `thread_metadata`, the tenant's path only
                    // (migration 0020).
                    sql.push_str(&format!(
                        " AND EXISTS (SELECT 1 FROM thread_metadata m \
                         WHERE m.thread_key = threads.thread_key AND m.members @> ${n}::jsonb)"
                    ));
                }
                // Each member: the same value, a boolean only for a boolean (SQLite reads true
                // as 1), and never an array or object (read as its JSON text, which a string
                // could equal).
                super::Backend::Sqlite => {
                    for (key, value) in &filter.metadata {
                        let path = next(&mut binds, format!("$.\"{key}\""));
                        let wanted = next(&mut binds, value.to_string());
                        sql.push_str(&format!(
                            " AND json_extract(metadata, ${path}) = json_extract(${wanted}, '$') \
                             AND (json_type(metadata, ${path}) IN ('true', 'false')) \
                             = (json_type(${wanted}, '$') IN ('true', 'false')) \
                             AND json_type(metadata, ${path}) NOT IN ('array', 'object')"
                        ));
                    }
                }
            }
        }
        (sql, binds)
    }

    /// Writes the thread's metadata where PostgreSQL's filters find it (`thread_metadata`, its
    /// GIN index kept off the row every append updates); SQLite has no JSON index, so nothing.
    pub(super) async fn index_metadata(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        tenant: &TenantId,
        thread_key: &ThreadKey,
        metadata: &str,
    ) -> Result<(), StoreError> {
        if self.backend != super::Backend::Postgres {
            return Ok(());
        }
        sqlx::query("DELETE FROM thread_metadata WHERE thread_key = $1")
            .bind(thread_key.as_str())
            .execute(&mut **tx)
            .await?;
        if metadata != "{}" {
            sqlx::query(
                "INSERT INTO thread_metadata (thread_key, members) \
                 SELECT $1, jsonb_build_object(CAST($3 AS TEXT), members) \
                 FROM (SELECT loupe_metadata_jsonb(CAST($2 AS TEXT)) AS members) m \
                 WHERE members IS NOT NULL",
            )
            .bind(thread_key.as_str())
            .bind(metadata)
            .bind(&tenant.0)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// Merges `patch` into the thread's metadata (a member set to null is removed) and returns
    /// the thread. Refused, with nothing changed, when the result would pass `max_bytes` of JSON.
    pub async fn update_thread_metadata(
        &self,
        tenant: &TenantId,
        id: &ThreadId,
        patch: &Map<String, Value>,
        max_bytes: usize,
    ) -> Result<Thread, StoreError> {
        let mut tx = self.writer.begin().await?;
        // A write that changes nothing first: it takes SQLite's write lock at once (a read first
        // would pin a snapshot that a racing write makes stale, and the update would then fail
        // as busy), and PostgreSQL's row lock.
        // An expired thread is not found: a change would renew it.
        let row = sqlx::query(&format!(
            "UPDATE threads SET updated_at = updated_at WHERE tenant_id = $1 AND thread_id = $2{} \
             RETURNING {THREAD_COLUMNS}",
            unexpired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(id.as_str())
        .bind(now_millis())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        let mut thread = thread_from_row(&row)?;
        for (key, value) in patch {
            if value.is_null() {
                thread.metadata.remove(key);
            } else {
                thread.metadata.insert(key.clone(), value.clone());
            }
        }
        let metadata = Value::Object(thread.metadata.clone()).to_string();
        if metadata.len() > max_bytes {
            return Err(StoreError::MetadataTooLarge {
                bytes: metadata.len(),
                max: max_bytes,
            });
        }
        let now = now_millis().max(thread.updated_at.timestamp_millis());
        let thread_key = ThreadKey::from_stored(row.try_get::<String, _>("thread_key")?);
        sqlx::query("UPDATE threads SET metadata = $1, updated_at = $2 WHERE thread_key = $3")
            .bind(&metadata)
            .bind(now)
            .bind(thread_key.as_str())
            .execute(&mut *tx)
            .await?;
        self.index_metadata(&mut tx, tenant, &thread_key, &metadata)
            .await?;
        tx.commit().await?;
        thread.updated_at = millis_to_datetime(now);
        Ok(thread)
    }

    /// Removes the thread and everything stored under it. The thread's row and its name go
    /// first, in a transaction with its small tables, so from then on the thread is gone for every reader
    /// and no job can write under it (tree and compaction writes check it in their own
    /// transactions). On PostgreSQL the rest goes in the same transaction (row locks block no
    /// one else). On SQLite, whose single write lock a long delete would hold against every
    /// other writer, messages and tree nodes are then deleted in chunks of
    /// `DELETE_CHUNK_ROWS`, each its own transaction.
    pub async fn delete_thread(&self, tenant: &TenantId, id: &ThreadId) -> Result<(), StoreError> {
        let tx = self.writer.begin().await?;
        self.delete_thread_in(tx, tenant, id).await
    }

    /// [`Store::delete_thread`] in `tx`, which may already have written under the thread (an
    /// expiry's event); commits it.
    pub(super) async fn delete_thread_in(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Any>,
        tenant: &TenantId,
        id: &ThreadId,
    ) -> Result<(), StoreError> {
        let deleted = sqlx::query(
            "DELETE FROM threads WHERE tenant_id = $1 AND thread_id = $2 \
             RETURNING thread_key, forked_from_key, copied_below_seq",
        )
        .bind(&tenant.0)
        .bind(id.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        let thread_key = ThreadKey::from_stored(deleted.try_get::<String, _>("thread_key")?);
        // Its forks hold entries it copied from its own parent: an erasure there must still
        // reach them (migration 0023).
        if let (Some(parent), Some(below)) = (
            deleted.try_get::<Option<String>, _>("forked_from_key")?,
            deleted.try_get::<Option<i64>, _>("copied_below_seq")?,
        ) {
            sqlx::query(
                "UPDATE threads SET forked_from_key = $1, copied_below_seq = \
                 CASE WHEN copied_below_seq < $2 THEN copied_below_seq ELSE $2 END \
                 WHERE forked_from_key = $3 AND tenant_id = $4",
            )
            .bind(&parent)
            .bind(below)
            .bind(thread_key.as_str())
            .bind(&tenant.0)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM thread_names WHERE tenant_id = $1 AND thread_id = $2")
            .bind(&tenant.0)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let chunked = self.backend == super::Backend::Sqlite;
        super::overheads::forget_taught_by(&mut tx, &thread_key).await?;
        for table in super::THREAD_DATA_TABLES {
            if chunked && CHUNKED_TABLES.contains(table) {
                continue;
            }
            sqlx::query(&format!("DELETE FROM {table} WHERE thread_key = $1"))
                .bind(thread_key.as_str())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        // Its followers learn it is gone.
        self.changes.changed(tenant, id);
        if chunked {
            self.delete_rows_in_chunks(&thread_key).await?;
        }
        self.scrub_wal();
        Ok(())
    }

    /// After text was deleted: on an SQLite file, asks for the WAL, which still holds the pages
    /// as they were, to be emptied (in the background: it waits for older readers to finish).
    pub(crate) fn scrub_wal(&self) {
        if let Some(scrub) = &self.wal_scrub {
            scrub.notify_one();
        }
    }

    /// Deletes a deleted thread's large tables a chunk per transaction (SQLite). A crash midway
    /// leaves rows under a key no thread has, which nothing reads; [`Store::sweep_orphans`]
    /// removes them at the next start.
    pub(super) async fn delete_rows_in_chunks(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for table in CHUNKED_TABLES {
            loop {
                let done = sqlx::query(&format!(
                    "DELETE FROM {table} WHERE rowid IN \
                     (SELECT rowid FROM {table} WHERE thread_key = $1 LIMIT $2)"
                ))
                .bind(thread_key.as_str())
                .bind(DELETE_CHUNK_ROWS)
                .execute(&self.writer)
                .await?
                .rows_affected();
                deleted += done;
                if done < DELETE_CHUNK_ROWS as u64 {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// Removes rows of the chunked tables left under keys no thread has (a delete interrupted
    /// by a crash, SQLite only). Returns how many were removed.
    pub async fn sweep_orphans(&self) -> Result<u64, StoreError> {
        if self.backend != super::Backend::Sqlite {
            return Ok(0);
        }
        let mut deleted = 0;
        for table in CHUNKED_TABLES {
            let orphans: Vec<String> = sqlx::query_scalar(&format!(
                "SELECT DISTINCT thread_key FROM {table} t WHERE NOT EXISTS \
                 (SELECT 1 FROM threads h WHERE h.thread_key = t.thread_key)"
            ))
            .fetch_all(&self.pool)
            .await?;
            for thread_key in orphans.into_iter().map(ThreadKey::from_stored) {
                deleted += self.delete_rows_in_chunks(&thread_key).await?;
            }
        }
        Ok(deleted)
    }

    /// The key of the tenant's thread, as the first statement of the caller's write transaction
    /// before it writes under the thread (settings, jobs). The statement is a write that changes
    /// nothing: on SQLite it takes the write lock at once (a read first would pin a snapshot that
    /// a concurrent append makes stale, and the later write would fail), and on PostgreSQL it
    /// locks the row until the transaction ends. A racing delete then either ran first (the
    /// thread is not found) or waits and removes what was written: nothing is left under a
    /// deleted thread.
    pub(crate) async fn thread_key_in(
        conn: &mut sqlx::AnyConnection,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ThreadKey, StoreError> {
        // An expired thread is not found: nothing is written under it.
        let key: Option<String> = sqlx::query_scalar(&format!(
            "UPDATE threads SET updated_at = updated_at WHERE tenant_id = $1 AND thread_id = $2{} \
             RETURNING thread_key",
            unexpired("threads.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(now_millis())
        .fetch_optional(&mut *conn)
        .await?;
        key.map(ThreadKey::from_stored)
            .ok_or(StoreError::ThreadNotFound)
    }

    /// Whether the thread still exists, read in the caller's transaction: background writes
    /// (tree nodes, the outline) check it there, so nothing is written under a deleted thread.
    /// On PostgreSQL the row is share-locked until the transaction ends, so a delete waits
    /// for the write, then removes what it wrote.
    pub(crate) async fn thread_exists_in(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        backend: super::Backend,
        thread_key: &ThreadKey,
    ) -> Result<bool, StoreError> {
        let found: Option<String> = sqlx::query_scalar(&format!(
            "SELECT thread_key FROM threads WHERE thread_key = $1{}",
            share_lock(backend)
        ))
        .bind(thread_key.as_str())
        .fetch_optional(&mut **tx)
        .await?;
        Ok(found.is_some())
    }
}

impl Store {
    /// The thread's redaction epoch, read in the caller's write transaction (tree writes): `None`
    /// when the thread is gone. The row is held for the transaction (share-locked on PostgreSQL;
    /// on SQLite the statement is a write that changes nothing, taking the write lock at once), so
    /// a snip's redaction either ran first (the epoch moved) or waits for this write and then
    /// rewrites what it wrote.
    pub(crate) async fn redaction_epoch_in(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        backend: super::Backend,
        thread_key: &ThreadKey,
    ) -> Result<Option<i64>, StoreError> {
        let sql = match backend {
            super::Backend::Postgres => {
                "SELECT redaction_epoch FROM threads WHERE thread_key = $1 FOR SHARE"
            }
            super::Backend::Sqlite => {
                "UPDATE threads SET updated_at = updated_at WHERE thread_key = $1 \
                 RETURNING redaction_epoch"
            }
        };
        Ok(sqlx::query_scalar(sql)
            .bind(thread_key.as_str())
            .fetch_optional(&mut **tx)
            .await?)
    }

    /// Refuses a background write whose sources were read at `epoch` when the thread's epoch
    /// moved since ([`StoreError::SourcesChanged`]) or the thread is gone.
    pub(crate) async fn check_epoch_in(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        backend: super::Backend,
        thread_key: &ThreadKey,
        epoch: i64,
    ) -> Result<(), StoreError> {
        match Store::redaction_epoch_in(tx, backend, thread_key).await? {
            None => Err(StoreError::ThreadNotFound),
            Some(now) if now != epoch => Err(StoreError::SourcesChanged),
            Some(_) => Ok(()),
        }
    }

    /// The thread's redaction epoch now (a job reads it before it reads what it summarizes).
    pub async fn redaction_epoch(&self, thread_key: &ThreadKey) -> Result<i64, StoreError> {
        let epoch: Option<i64> =
            sqlx::query_scalar("SELECT redaction_epoch FROM threads WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&self.pool)
                .await?;
        epoch.ok_or(StoreError::ThreadNotFound)
    }
}

/// The clause that share-locks a read thread row until the transaction ends (PostgreSQL; SQLite
/// runs one writer at a time, and its transactions see no row change under them).
pub(crate) fn share_lock(backend: super::Backend) -> &'static str {
    match backend {
        super::Backend::Postgres => " FOR SHARE",
        super::Backend::Sqlite => "",
    }
}

/// Tables a thread can hold millions of rows in, deleted in chunks on SQLite.
const CHUNKED_TABLES: &[&str] = &["messages", "search_rows", "tree_nodes"];

/// Rows deleted per transaction when a thread is deleted on SQLite.
pub(crate) const DELETE_CHUNK_ROWS: i64 = 5_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let cursor = encode_cursor(1_700_000_000_000, "0190-abc");
        assert_eq!(
            decode_cursor(&cursor).unwrap(),
            (1_700_000_000_000, "0190-abc".to_owned())
        );
        assert!(matches!(decode_cursor("nope"), Err(StoreError::BadCursor)));
        assert!(matches!(decode_cursor("x.y"), Err(StoreError::BadCursor)));
        assert!(matches!(decode_cursor("12."), Err(StoreError::BadCursor)));
    }
}
