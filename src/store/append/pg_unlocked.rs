//! PostgreSQL's fast path for a group of appends: no transaction of its own, no read under locks.
//!
//! A locked group (`Store::write_group`) costs four calls (begin, the locked read, the write,
//! commit) and a row lock per thread, which PostgreSQL writes to its WAL. Most groups need none
//! of that: no job to enqueue, no uuid stored already, no other writer on their threads. For
//! them, the threads are taken as the last group of this process left them ([`ThreadCache`]),
//! or read plainly when it does not know them; every append is decided in memory as usual; and
//! one statement, which PostgreSQL runs as a transaction of its own, writes the whole group:
//!
//! - it moves each thread's counters only where `next_seq`, the estimate (a settings change
//!   counts it again) and the settings columns behind its triggers are still as the group saw
//!   them (a compare-and-set: another process appended, compacted, deleted or reconfigured the
//!   thread otherwise);
//! - it inserts the rows of the threads it moved, with a plain insert, so a stored uuid is a
//!   unique violation;
//! - it locks the threads' rows first, in the order every group locks them, so groups never
//!   deadlock on each other;
//! - it asserts that it moved every thread (`loupe_assert`, migration 0006), so a thread that
//!   moved meanwhile aborts the statement, and nothing of the group is kept.
//!
//! A group that cannot go this way, or whose statement was refused, is written under locks, as
//! before (`UnderLocks`), and its threads are forgotten by the cache: their next group reads
//! them again. So the cache only saves a read, never decides: a stale entry costs a refused
//! statement and a locked group, no wrong answer. One call and one commit for most groups
//! (two calls when a thread is new to the cache), against four (BENCHMARKS.md).

use std::collections::HashMap;
use std::sync::Mutex;

use sqlx::AnyConnection;

use super::plan::{
    group_needs_jobs, plan_group, set_counters_sql, thread_of, AppendTriggers, Counters,
    GroupThread, Planned, QueuedAppend, COUNTER_COLUMNS,
};
use super::sql::{read_group, RowLock, Transaction, UuidCheck, LATER_UPDATED_AT};
use crate::store::rows::{bind_rows, INSERT_CHUNK, INSERT_WIDTH};
use crate::store::{Store, StoreError, ThreadKey};

/// Threads the cache remembers; past it, it starts again empty (a full cache costs one read per
/// thread, not a wrong answer).
const MAX_CACHED_THREADS: usize = 10_000;

/// The SQLSTATE `loupe_assert` raises.
const ASSERT_FAILED: &str = "LP001";
/// PostgreSQL's `unique_violation`: a named uuid is stored already.
const UNIQUE_VIOLATION: &str = "23505";
/// PostgreSQL's `deadlock_detected`.
const DEADLOCK_DETECTED: &str = "40P01";

/// How the threads of this process's last groups were left, by (tenant, thread id).
#[derive(Default)]
pub(in crate::store) struct ThreadCache {
    threads: Mutex<HashMap<(String, String), CachedThread>>,
}

#[derive(Clone)]
struct CachedThread {
    thread_key: ThreadKey,
    counters: Counters,
    triggers: AppendTriggers,
}

impl ThreadCache {
    /// The group's threads, if the cache knows every one of them.
    fn threads_of<'g>(
        &self,
        group: &'g [QueuedAppend],
    ) -> Option<HashMap<(&'g str, &'g str), GroupThread>> {
        let cached = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let mut threads = HashMap::new();
        for append in group {
            let key = thread_of(append);
            if threads.contains_key(&key) {
                continue;
            }
            let known = cached.get(&(key.0.to_owned(), key.1.to_owned()))?;
            threads.insert(
                key,
                GroupThread::new(
                    known.thread_key.clone(),
                    known.counters,
                    known.triggers.clone(),
                ),
            );
        }
        Some(threads)
    }

    /// Remembers the threads as a committed group left them.
    fn keep(&self, threads: &HashMap<(&str, &str), GroupThread>) {
        let mut cached = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if cached.len() + threads.len() > MAX_CACHED_THREADS {
            cached.clear();
        }
        for ((tenant, thread_id), thread) in threads {
            cached.insert(
                ((*tenant).to_owned(), (*thread_id).to_owned()),
                CachedThread {
                    thread_key: thread.thread_key.clone(),
                    counters: thread.counters(),
                    triggers: thread.triggers.clone(),
                },
            );
        }
    }

    /// Forgets the group's threads: their next group reads them again.
    fn forget(&self, group: &[QueuedAppend]) {
        let mut cached = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        for append in group {
            let (tenant, thread_id) = thread_of(append);
            cached.remove(&(tenant.to_owned(), thread_id.to_owned()));
        }
    }
}

/// What [`Store::write_group_unlocked`] did.
pub(super) enum Unlocked {
    /// Committed: every append decided and the writes kept.
    Written(Vec<Planned>),
    /// Nothing written: write the group under locks, checking its uuids so.
    UnderLocks(UuidCheck),
}

/// Values each moved thread binds: its key, its new `updated_at` and [`COUNTER_COLUMNS`], then
/// what the write checks is unchanged: the counters as read (an erasure or a settings change
/// moves some without appending) and the settings columns.
const THREAD_WIDTH: usize = 2 + 2 * COUNTER_COLUMNS.len() + 3;

/// The group's one statement for `threads` moved and `rows` inserted. The threads' rows are
/// locked first, in (tenant, thread) order as the locked group takes them: the update alone
/// would lock them in whatever order its plan meets them, and two groups meeting the same
/// threads in opposite orders deadlock.
pub(super) fn unlocked_write_sql(threads: usize, rows: usize) -> String {
    let keys = (0..threads)
        .map(|thread| format!("${}", thread * THREAD_WIDTH + 1))
        .collect::<Vec<_>>()
        .join(", ");
    let counters = COUNTER_COLUMNS.len();
    let unmoved = COUNTER_COLUMNS
        .iter()
        .zip(3 + counters..)
        .map(|(column, n)| format!("threads.{column} = v.column{n}"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let settings = 3 + 2 * counters;
    format!(
        "WITH locked AS MATERIALIZED (SELECT thread_key FROM threads WHERE thread_key IN ({keys}) \
         ORDER BY tenant_id, thread_id FOR UPDATE), \
         moved AS (UPDATE threads SET updated_at = {LATER_UPDATED_AT}, {} \
         FROM (VALUES {}) AS v LEFT JOIN thread_settings s ON s.thread_key = v.column1 \
         WHERE threads.thread_key = v.column1 AND {unmoved} \
         AND threads.thread_key IN (SELECT thread_key FROM locked){unexpired} \
         AND s.auto_compact_tokens IS NOT DISTINCT FROM v.column{settings} \
         AND s.outline IS NOT DISTINCT FROM v.column{outline} \
         AND s.clearing IS NOT DISTINCT FROM v.column{clearing} \
         RETURNING threads.thread_key), \
         inserted AS (INSERT INTO messages (thread_key, seq, uuid, kind, subtype, visible_rank, \
         body, content_hash, created_at) SELECT r.* FROM (VALUES {}) AS r(thread_key, seq, \
         uuid, kind, subtype, visible_rank, body, content_hash, created_at) \
         JOIN moved ON moved.thread_key = r.thread_key RETURNING 1) \
         SELECT loupe_assert(count(*) = ${}, 'a thread of the group moved since it was read') \
         FROM moved",
        set_counters_sql(3),
        crate::store::values_placeholders(threads, THREAD_WIDTH),
        crate::store::values_placeholders_from(threads * THREAD_WIDTH + 1, rows, INSERT_WIDTH),
        threads * THREAD_WIDTH + rows * INSERT_WIDTH + 1,
        outline = settings + 1,
        clearing = settings + 2,
        // Bound after the count: a cached thread that expired since is not moved, and the
        // locked group then finds it gone.
        unexpired = crate::store::expiry::unexpired(
            "threads.",
            &format!("${}", threads * THREAD_WIDTH + rows * INSERT_WIDTH + 2)
        ),
    )
}

impl Store {
    /// Writes the group in one statement when it can (the module docs); otherwise writes
    /// nothing and says how to write it under locks. Only a fault of the database is an error.
    pub(super) async fn write_group_unlocked(
        &self,
        conn: &mut AnyConnection,
        group: &[QueuedAppend],
    ) -> Result<Unlocked, StoreError> {
        let entries: usize = group.iter().map(|append| append.batch.entries.len()).sum();
        if entries > INSERT_CHUNK {
            // Rows past one statement's take calls of their own: the locked group's way.
            return Ok(Unlocked::UnderLocks(UuidCheck::Read));
        }
        let cache = &self.thread_cache;
        let mut threads = match cache.threads_of(group) {
            Some(threads) => threads,
            None => match read_group(
                conn,
                self.backend,
                group,
                self.append_defaults(),
                Transaction::Caller,
                UuidCheck::OnInsert,
                RowLock::None,
            )
            .await
            {
                Ok(threads) => threads,
                Err(error) if error.is_transient() => return Err(error),
                // What one append's thread holds (settings that do not parse, say) fails only
                // that append: the locked group splits a failing group.
                Err(_) => return Ok(Unlocked::UnderLocks(UuidCheck::Read)),
            },
        };
        let mut rows = Vec::new();
        let plans = plan_group(group, &mut threads, &mut rows);
        if plans.iter().any(|plan| matches!(plan, Planned::Refused(_))) {
            // A refusal decided on a cached thread may be stale (a thread recreated, say), and a
            // refused compare-and-append may be a replay: the locked read, with the uuids,
            // decides it.
            cache.forget(group);
            return Ok(Unlocked::UnderLocks(UuidCheck::Read));
        }
        if group_needs_jobs(group, &plans, &threads) {
            // The locked group moves the threads on: what the cache holds of them is then old.
            cache.forget(group);
            return Ok(Unlocked::UnderLocks(UuidCheck::OnInsert));
        }
        let moved: Vec<&GroupThread> = threads
            .values()
            .filter(|thread| thread.updated_at.is_some())
            .collect();
        if moved.is_empty() {
            return Ok(Unlocked::UnderLocks(UuidCheck::Read));
        }
        let sql = unlocked_write_sql(moved.len(), rows.len());
        let mut query = sqlx::query(&sql);
        for thread in &moved {
            let columns = &thread.triggers.columns;
            query = query
                .bind(thread.thread_key.as_str().to_owned())
                .bind(thread.updated_at.unwrap_or_default());
            for counter in thread.counters().into_iter().chain(thread.read) {
                query = query.bind(counter);
            }
            query = query
                .bind(columns.auto_compact_tokens)
                .bind(columns.outline.clone())
                .bind(columns.clearing.clone());
        }
        let query = bind_rows(query, &rows)
            .bind(moved.len() as i64)
            .bind(crate::store::now_millis().to_string());
        match query.execute(&mut *conn).await {
            Ok(_) => {
                cache.keep(&threads);
                Ok(Unlocked::Written(plans))
            }
            Err(error) => {
                cache.forget(group);
                let code = match &error {
                    sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
                    _ => None,
                };
                match code.as_deref() {
                    Some(UNIQUE_VIOLATION) => Ok(Unlocked::UnderLocks(UuidCheck::Read)),
                    // A deadlock with another writer (a compaction's, a deleted thread's) aborted
                    // only this statement: the locked group waits its turn instead.
                    Some(ASSERT_FAILED | DEADLOCK_DETECTED) => {
                        Ok(Unlocked::UnderLocks(UuidCheck::OnInsert))
                    }
                    _ => {
                        let error = StoreError::from(error);
                        if error.is_transient() {
                            Err(error)
                        } else {
                            // The locked group runs the same writes and reports what is wrong.
                            tracing::warn!(%error, "a group's one statement failed; writing it under locks");
                            Ok(Unlocked::UnderLocks(UuidCheck::Read))
                        }
                    }
                }
            }
        }
    }
}
