//! The statements of a group of appends, shared by its paths: the read of its threads (with their
//! settings and the uuids it names), the rows' insert and the counters' update in one call.

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;

use sqlx::{AnyConnection, Row};

use super::plan::{
    set_counters_sql, thread_of, AppendDefaults, AppendTriggers, Counters, GroupThread,
    QueuedAppend, COUNTER_COLUMNS,
};
use crate::store::rows::{
    bind_rows, insert_rows, insert_rows_sql, stored_hashes_of, AnyQuery, NewRow, INSERT_CHUNK,
    INSERT_WIDTH,
};
use crate::store::{Backend, StoreError, ThreadKey};

/// Who begins and ends a group's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transaction {
    /// The group's own statements do: `BEGIN IMMEDIATE` goes with the read and `COMMIT` with
    /// the write, two calls fewer. SQLite only, which runs statements sent together in one call.
    OwnStatements,
    /// The caller's transaction (PostgreSQL, which takes one statement a call).
    Caller,
}

/// How a group finds out which of the uuids its clients named are stored already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UuidCheck {
    /// The group's read looks them up with its threads.
    Read,
    /// Not read: the insert leaves out a row whose uuid is stored and says how many it wrote.
    /// Fewer than planned means an append may be a replay or a conflict, and so may an append
    /// refused for its `expected_next_seq` (a retry of an append that was written: its replay
    /// comes first). Either way ([`super::locked::GroupOutcome::DecideAgainReadingUuids`]) the caller rolls the group back
    /// and writes it again with [`UuidCheck::Read`].
    /// A retry is rare, and on PostgreSQL the lookup was most of the read's time: its plan,
    /// cached per connection, is only as good as the statistics it was made with, and a plan
    /// made on a young table scans every message (BENCHMARKS.md). PostgreSQL only, for groups
    /// whose rows go in one statement.
    OnInsert,
}

/// Whether a group's read locks its threads' rows (PostgreSQL; SQLite's write lock is the file's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RowLock {
    ForUpdate,
    /// A plain read: the unlocked group (`pg_group`) checks at its write that nothing moved.
    None,
}

/// Most uuids looked up in the statement that locks a PostgreSQL group's threads.
const MAX_JOINED_UUIDS: usize = 1_000;

/// The statement that reads a group's threads and named uuids, and what it binds: each thread's
/// (tenant, thread id), in `keys` order, then `uuids` (empty when they are too many to join,
/// `joined` false: they are looked up in chunks after it), the time now (unix ms, as text) between
/// them.
pub(super) struct GroupRead<'g> {
    pub sql: String,
    /// The keys go as one JSON array of `{t, i}` objects (tenant, thread id), not bound pairs.
    pub keys_json: bool,
    pub keys: Vec<(&'g str, &'g str)>,
    /// Every uuid the group's clients named, with the thread it was named for.
    pub named: Vec<((&'g str, &'g str), &'g str)>,
    pub uuids: Vec<&'g str>,
    pub joined: bool,
}

pub(super) fn read_group_sql(
    backend: Backend,
    group: &[QueuedAppend],
    transaction: Transaction,
    check: UuidCheck,
    lock: RowLock,
) -> GroupRead<'_> {
    let mut keys: Vec<(&str, &str)> = group.iter().map(thread_of).collect();
    keys.sort_unstable();
    keys.dedup();
    // PostgreSQL takes the keys as one JSON array, so that every group, whatever its size, runs
    // one prepared statement with one cached plan: a list of terms is a new statement per size,
    // planned again at each run (a fifth of a group's time in the database).
    let keys_json = backend == Backend::Postgres;
    let (from, terms) = if keys_json {
        (
            "json_to_recordset($1::json) AS k(t text, i text) \
             JOIN threads ON threads.tenant_id = k.t AND threads.thread_id = k.i",
            "TRUE".to_owned(),
        )
    } else {
        let terms = (0..keys.len())
            .map(|i| {
                format!(
                    "(threads.tenant_id = ${} AND threads.thread_id = ${})",
                    2 * i + 1,
                    2 * i + 2
                )
            })
            .collect::<Vec<_>>()
            .join(" OR ");
        ("threads", terms)
    };
    // The time the threads' expiry is judged at follows the keys, and the uuids follow it: on
    // SQLite a `$n` is numbered by where it first appears, so the numbers go in text order.
    let now_at = if keys_json { 2 } else { 2 * keys.len() + 1 };
    let first_uuid = now_at + 1;
    // Only uuids the client named are looked up: a generated one is new.
    let named: Vec<((&str, &str), &str)> = group
        .iter()
        .filter(|_| check == UuidCheck::Read)
        .flat_map(|append| {
            let key = thread_of(append);
            let sent = append.batch.entries.iter().filter(|p| p.uuid_sent);
            sent.map(move |p| (key, p.uuid.as_str()))
        })
        .collect();
    let mut uuids: Vec<&str> = named.iter().map(|(_, uuid)| *uuid).collect();
    uuids.sort_unstable();
    uuids.dedup();
    // A huge batch's uuids are looked up in chunks instead, below every bind limit. So are a
    // PostgreSQL group's under row locks: a statement that waited for a lock reads the locked
    // rows as the other writer committed them but every other table as it stood when the
    // statement began, so a joined lookup would miss the uuids that writer just stored; the
    // lookup after the lock is a statement of its own, which sees them.
    let locked_on_postgres = backend == Backend::Postgres && lock == RowLock::ForUpdate;
    let joined = uuids.len() <= MAX_JOINED_UUIDS && !locked_on_postgres;
    if !joined {
        uuids.clear();
    }
    // An expired thread is not found, as a deleted one, so an append cannot renew it.
    let unexpired = crate::store::expiry::unexpired("threads.", &format!("${now_at}"));
    let (materialized, lock) = match (backend, lock) {
        (Backend::Postgres, RowLock::ForUpdate) => ("MATERIALIZED", "FOR UPDATE OF threads"),
        _ => ("", ""),
    };
    let begin = match transaction {
        Transaction::OwnStatements => "BEGIN IMMEDIATE; ",
        Transaction::Caller => "",
    };
    let counters = COUNTER_COLUMNS
        .map(|column| format!("threads.{column}"))
        .join(", ");
    let locked = format!(
        "{begin}WITH locked AS {materialized} (\
         SELECT threads.thread_key, threads.tenant_id, threads.thread_id, {counters}, \
         s.auto_compact_tokens, s.outline, s.clearing \
         FROM {from} LEFT JOIN thread_settings s ON s.thread_key = threads.thread_key \
         WHERE ({terms}){unexpired} ORDER BY threads.tenant_id, threads.thread_id {lock})"
    );
    // A uuid is looked up in every thread of the group; a match in another thread than the one
    // it was named for is never asked for.
    let sql = if uuids.is_empty() {
        format!(
            "{locked} SELECT locked.*, NULL AS uuid, NULL AS seq, NULL AS content_hash FROM locked"
        )
    } else {
        format!(
            "{locked} SELECT locked.*, m.uuid, m.seq, m.content_hash FROM locked \
             LEFT JOIN messages m ON m.thread_key = locked.thread_key AND m.uuid IN ({})",
            crate::store::list_placeholders(first_uuid, uuids.len())
        )
    };
    GroupRead {
        sql,
        keys_json,
        keys,
        named,
        uuids,
        joined,
    }
}

/// Reads every thread the group appends to, with its settings and the uuids the group names, in
/// one statement (up to [`MAX_JOINED_UUIDS`] uuids, and not under PostgreSQL's row locks; else
/// the uuids are looked up in chunks after it). On
/// SQLite the write lock is taken first, by the `BEGIN IMMEDIATE` sent with it
/// ([`Transaction::OwnStatements`]), so no other process on the file can write between the group's read
/// and its writes; on PostgreSQL this statement locks the rows, in (tenant, thread) order, the
/// same in every runner, so concurrent groups cannot deadlock. Another tenant's thread is not
/// found.
pub(super) async fn read_group<'g>(
    conn: &mut AnyConnection,
    backend: Backend,
    group: &'g [QueuedAppend],
    defaults: AppendDefaults,
    transaction: Transaction,
    check: UuidCheck,
    lock: RowLock,
) -> Result<HashMap<(&'g str, &'g str), GroupThread>, StoreError> {
    let GroupRead {
        sql,
        keys_json,
        keys,
        named,
        uuids,
        joined,
    } = read_group_sql(backend, group, transaction, check, lock);
    let mut query = sqlx::query(&sql);
    if keys_json {
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|(tenant, thread_id)| serde_json::json!({"t": tenant, "i": thread_id}))
            .collect();
        query = query.bind(serde_json::Value::Array(keys).to_string());
    } else {
        for (tenant, thread_id) in &keys {
            query = query.bind(tenant.to_string()).bind(thread_id.to_string());
        }
    }
    query = query.bind(crate::store::now_millis().to_string());
    for uuid in &uuids {
        query = query.bind(uuid.to_string());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut threads: HashMap<(&str, &str), GroupThread> = HashMap::with_capacity(keys.len());
    for row in rows {
        let (tenant, thread_id): (String, String) =
            (row.try_get("tenant_id")?, row.try_get("thread_id")?);
        // The map borrows its keys from the group, which outlives it.
        let Some(&key) = keys.iter().find(|k| k.0 == tenant && k.1 == thread_id) else {
            continue;
        };
        // On PostgreSQL a thread comes once per uuid found in it.
        let thread = match threads.entry(key) {
            Slot::Occupied(known) => known.into_mut(),
            Slot::Vacant(new) => new.insert(GroupThread::new(
                ThreadKey::from_stored(row.try_get("thread_key")?),
                {
                    let mut counters: Counters = [0; COUNTER_COLUMNS.len()];
                    for (counter, column) in counters.iter_mut().zip(COUNTER_COLUMNS) {
                        *counter = row.try_get(column)?;
                    }
                    counters
                },
                AppendTriggers::from_settings(
                    row.try_get("auto_compact_tokens")?,
                    row.try_get("outline")?,
                    row.try_get("clearing")?,
                    defaults,
                )?,
            )),
        };
        if joined {
            if let Some(uuid) = row.try_get::<Option<String>, _>("uuid")? {
                let found = (row.try_get("seq")?, row.try_get("content_hash")?);
                thread.known.insert(uuid, found);
            }
        }
    }
    if !joined {
        let mut named: Vec<(&str, &str)> = named
            .iter()
            .filter_map(|(key, uuid)| Some((threads.get(key)?.thread_key.as_str(), *uuid)))
            .collect();
        named.sort_unstable();
        for ((thread_key, uuid), found) in stored_hashes_of(conn, &named).await? {
            if let Some(thread) = threads.values_mut().find(|t| t.thread_key == *thread_key) {
                thread.known.insert(uuid, found);
            }
        }
    }
    Ok(threads)
}

/// Inserts the group's rows and moves the counters of every thread it wrote to, ending the
/// transaction too with [`Transaction::OwnStatements`], in one call: the statements sent together on
/// SQLite, the insert a data-modifying part of the update on PostgreSQL (which takes one
/// statement a call). Only rows past the first [`INSERT_CHUNK`] take calls of their own. Each
/// call is a round trip, or on SQLite two thread wake-ups, that the group's writer waits for.
/// With [`UuidCheck::OnInsert`] (PostgreSQL, one statement's rows), rows whose uuid is stored are
/// left out and the answer is how many went in.
pub(super) async fn write_rows<'a>(
    conn: &mut AnyConnection,
    backend: Backend,
    rows: &[NewRow<'_>],
    threads: impl Iterator<Item = &'a GroupThread>,
    transaction: Transaction,
    check: UuidCheck,
) -> Result<Option<usize>, StoreError> {
    let written: Vec<&GroupThread> = threads.filter(|t| t.updated_at.is_some()).collect();
    // A group holds at most 64 appends, so its counters always fit one statement.
    debug_assert!(written.len() <= INSERT_CHUNK);
    let commit = match transaction {
        Transaction::OwnStatements => "; COMMIT",
        Transaction::Caller => "",
    };
    let (earlier, last) = rows.split_at(rows.len().saturating_sub(1) / INSERT_CHUNK * INSERT_CHUNK);
    insert_rows(conn, earlier).await?;
    let update = update_threads_sql(last.len() * INSERT_WIDTH + 1, written.len());
    let insert = insert_rows_sql(last.len());
    let counted = check == UuidCheck::OnInsert;
    debug_assert!(!counted || (backend == Backend::Postgres && earlier.is_empty()));
    let sql = match backend {
        _ if last.is_empty() => format!("{update}{commit}"),
        Backend::Sqlite => format!("{insert}; {update}{commit}"),
        Backend::Postgres if counted => format!(
            "WITH inserted AS ({insert} ON CONFLICT (thread_key, uuid) DO NOTHING RETURNING 1) \
             {update} RETURNING (SELECT count(*) FROM inserted)"
        ),
        Backend::Postgres => {
            format!("WITH inserted AS ({insert} RETURNING 1) {update}{commit}")
        }
    };
    let query = bind_thread_counters(bind_rows(sqlx::query(&sql), last), &written);
    if !counted {
        query.execute(&mut *conn).await?;
        return Ok(None);
    }
    // One row per thread moved, each with the count.
    let inserted: i64 = match query.fetch_optional(&mut *conn).await? {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    Ok(Some(usize::try_from(inserted).unwrap_or(0)))
}

/// A thread's `updated_at` after a batch: the batch's time, unless a write that committed after
/// the batch took its time (a PATCH) set a later one, so that it never steps back.
pub(super) const LATER_UPDATED_AT: &str =
    "CASE WHEN v.column2 > threads.updated_at THEN v.column2 ELSE threads.updated_at END";

/// Values each thread binds: its key, `updated_at`, then its [`COUNTER_COLUMNS`].
pub(super) const THREAD_COUNTERS_WIDTH: usize = 2 + COUNTER_COLUMNS.len();

/// The update of `count` threads' counters, its placeholders numbered from `$start`.
pub(super) fn update_threads_sql(start: usize, count: usize) -> String {
    format!(
        "UPDATE threads SET updated_at = {LATER_UPDATED_AT}, {} \
         FROM (VALUES {}) AS v WHERE threads.thread_key = v.column1",
        set_counters_sql(3),
        crate::store::values_placeholders_from(start, count, THREAD_COUNTERS_WIDTH)
    )
}

fn bind_thread_counters<'q>(mut query: AnyQuery<'q>, threads: &[&GroupThread]) -> AnyQuery<'q> {
    for thread in threads {
        query = query
            .bind(thread.thread_key.as_str().to_owned())
            .bind(thread.updated_at.unwrap_or_default());
        for counter in thread.counters() {
            query = query.bind(counter);
        }
    }
    query
}
