//! SQLite's group writer: a thread of its own, with a connection of its own, on which SQLite's
//! one group-commit runner runs, writing each group there in one go.
//!
//! Through sqlx, each call a group makes is a hand-off to the driver's thread and back, two
//! thread wake-ups, and a group made two calls; the runner, a task, was one more hand-off away
//! from the thread that wrote. Here the runner itself runs on the writer's thread: it takes a
//! group from the queue, begins, reads, decides every append in memory, writes and commits on
//! its own connection, answers the group's appends, and takes the next, without waiting on
//! any other thread. When the queue is empty the thread sleeps until the next append wakes it.
//!
//! The runner writes only while it holds the writer pool's one connection (`run_groups`), so
//! the thread never competes with the store's other writes for SQLite's write lock. A group
//! that would enqueue a job (a threshold crossed, an outlined thread), or names more uuids than
//! one statement looks up, is rolled back untouched and written through sqlx on that
//! connection instead, sharing the job queries of every other writer.

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags, ToSql};

use super::plan::{
    group_needs_jobs, plan_group, AppendDefaults, AppendTriggers, Counters, GroupThread, Planned,
    QueuedAppend, COUNTER_COLUMNS,
};
use super::sql::{
    read_group_sql, update_threads_sql, GroupRead, RowLock, Transaction, UuidCheck,
    THREAD_COUNTERS_WIDTH,
};
use crate::store::rows::{insert_rows_sql, NewRow, INSERT_CHUNK, INSERT_WIDTH};
use crate::store::{Backend, SqliteSynchronous, StoreError, ThreadKey};

/// What the group writer made of a group.
pub(super) enum GroupWrite {
    /// Committed (or, for replays and refusals only, rolled back): one decision per append.
    Done(Vec<Planned>),
    /// Nothing was written: some append would enqueue a job, or the group names more uuids than
    /// one statement looks up. Write it through sqlx.
    Declined,
}

/// The group-commit runner, handed to the writer's thread to run there, on its connection, until
/// nobody waits. The thread knows nothing of the queue: whoever starts it passes the runner in.
pub(super) type Runner = Box<dyn FnOnce(&mut WriterConnection) + Send>;

/// The handle to the writer's thread. Between runs the thread holds no runner, and so no store:
/// it ends once the last store that can start it is dropped.
pub(in crate::store) struct SqliteWriter {
    runners: mpsc::Sender<Runner>,
}

impl SqliteWriter {
    /// Opens the writer's connection on `path` and starts its thread, idle.
    pub(in crate::store) fn open(
        path: &std::path::Path,
        synchronous: SqliteSynchronous,
    ) -> Result<Self, StoreError> {
        let mut conn = WriterConnection::open(path, synchronous)?;
        let (runners, requests) = mpsc::channel::<Runner>();
        std::thread::Builder::new()
            .name("loupe-sqlite-writer".to_owned())
            .spawn(move || {
                for run in requests {
                    // A panic of the runner ends this run only: its guard starts the next one
                    // (another request) if appends still wait, and this thread goes on.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(&mut conn);
                    }));
                }
            })
            .map_err(|e| StoreError::Config(format!("cannot start the SQLite writer: {e}")))?;
        Ok(SqliteWriter { runners })
    }

    /// Runs `run` on the writer's thread; gives it back when the thread is gone (it cannot end
    /// while this handle lives, but if it did, the caller runs the groups elsewhere).
    pub(super) fn start_runner(&self, run: Runner) -> Result<(), Runner> {
        self.runners.send(run).map_err(|mpsc::SendError(run)| {
            tracing::error!("the SQLite writer thread stopped; a task runs the appends");
            run
        })
    }
}

/// The writer's connection, and what it takes to open it again.
pub(in crate::store) struct WriterConnection {
    conn: Connection,
    path: std::path::PathBuf,
    synchronous: SqliteSynchronous,
}

impl WriterConnection {
    /// Opens the connection with the settings of the pool's (`open_pool`).
    pub(in crate::store) fn open(
        path: &std::path::Path,
        synchronous: SqliteSynchronous,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            conn: connect(path, synchronous)?,
            path: path.to_owned(),
            synchronous,
        })
    }

    /// Writes the group in one transaction, or declines it. After a failure (a statement's, or a
    /// panic's, which is a bug and answered with a 503) nothing of the group is kept and no
    /// transaction is left open.
    pub(super) fn write_group(
        &mut self,
        group: &[QueuedAppend],
        defaults: AppendDefaults,
    ) -> Result<GroupWrite, StoreError> {
        self.leave_transaction()?;
        let conn = &mut self.conn;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            try_write_group(conn, group, defaults)
        }))
        .unwrap_or_else(|_| {
            Err(StoreError::CommitFailed {
                message: "the SQLite writer failed unexpectedly".to_owned(),
                transient: true,
            })
        });
        if outcome.is_err() && !conn.is_autocommit() {
            // When this fails too, the next group's `leave_transaction` tries again.
            let _ = conn.execute_batch("ROLLBACK");
        }
        outcome
    }

    /// Ends a transaction a failed group left open (its ROLLBACK failed): rolled back, or, if
    /// the connection cannot, dropped and opened again. Either way SQLite's write lock is given
    /// back, which an open transaction would hold from every other writer.
    fn leave_transaction(&mut self) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        if self.conn.execute_batch("ROLLBACK").is_ok() && self.conn.is_autocommit() {
            return Ok(());
        }
        tracing::warn!("the SQLite writer's connection stayed in a transaction; opening it again");
        self.conn =
            connect(&self.path, self.synchronous).map_err(|error| StoreError::CommitFailed {
                message: error.to_string(),
                transient: true,
            })?;
        Ok(())
    }

    #[cfg(test)]
    pub(in crate::store) fn connection(&self) -> &Connection {
        &self.conn
    }
}

fn connect(
    path: &std::path::Path,
    synchronous: SqliteSynchronous,
) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_failed(&e))?;
    conn.execute_batch(&format!(
        "PRAGMA busy_timeout = 30000; {}; {}; {}; PRAGMA wal_autocheckpoint = {}",
        synchronous.pragma(),
        crate::store::TEMP_STORE_PRAGMA,
        crate::store::SECURE_DELETE_PRAGMA,
        crate::store::WAL_AUTOCHECKPOINT_PAGES
    ))
    .map_err(|e| open_failed(&e))?;
    // A statement per group shape (threads, named uuids, rows): keep the common ones prepared.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn open_failed(error: &rusqlite::Error) -> StoreError {
    StoreError::Config(format!("cannot open the SQLite writer: {error}"))
}

/// A statement's failure, transient when the database is busy, locked or failing to do I/O.
fn failed(error: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    if error.sqlite_error_code() == Some(ErrorCode::TooBig) {
        return StoreError::ContentRefused(error.to_string());
    }
    let transient = matches!(
        error.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::CannotOpen
        )
    );
    StoreError::CommitFailed {
        message: error.to_string(),
        transient,
    }
}

/// The group's transaction: the statements of `Store::write_group`, through rusqlite.
fn try_write_group(
    conn: &mut Connection,
    group: &[QueuedAppend],
    defaults: AppendDefaults,
) -> Result<GroupWrite, StoreError> {
    let read = read_group_sql(
        Backend::Sqlite,
        group,
        Transaction::Caller,
        UuidCheck::Read,
        RowLock::ForUpdate,
    );
    if !read.joined {
        return Ok(GroupWrite::Declined);
    }
    conn.execute_batch("BEGIN IMMEDIATE").map_err(failed)?;
    #[cfg(test)]
    tests::panic_if_asked();
    let mut threads = read_group(conn, &read, defaults)?;
    let mut rows = Vec::new();
    let plans = plan_group(group, &mut threads, &mut rows);
    if group_needs_jobs(group, &plans, &threads) {
        conn.execute_batch("ROLLBACK").map_err(failed)?;
        return Ok(GroupWrite::Declined);
    }
    if !plans.iter().any(Planned::writes) {
        conn.execute_batch("ROLLBACK").map_err(failed)?;
        return Ok(GroupWrite::Done(plans));
    }
    for chunk in rows.chunks(INSERT_CHUNK) {
        insert_rows(conn, chunk)?;
    }
    update_threads(conn, threads.values())?;
    conn.execute_batch("COMMIT").map_err(failed)?;
    Ok(GroupWrite::Done(plans))
}

/// Every thread of the group with its settings and the uuids the group named: the rows of
/// [`read_group_sql`], keyed as the group names its threads. Another tenant's thread is not
/// found.
fn read_group<'g>(
    conn: &Connection,
    read: &GroupRead<'g>,
    defaults: AppendDefaults,
) -> Result<HashMap<(&'g str, &'g str), GroupThread>, StoreError> {
    let mut statement = conn.prepare_cached(&read.sql).map_err(failed)?;
    let mut binds: Vec<&str> = Vec::with_capacity(read.keys.len() * 2 + 1 + read.uuids.len());
    for (tenant, thread_id) in &read.keys {
        binds.push(tenant);
        binds.push(thread_id);
    }
    let now = crate::store::now_millis().to_string();
    binds.push(&now);
    binds.extend(read.uuids.iter().copied());
    let mut rows = statement
        .query(rusqlite::params_from_iter(binds))
        .map_err(failed)?;
    let mut threads: HashMap<(&str, &str), GroupThread> = HashMap::with_capacity(read.keys.len());
    while let Some(row) = rows.next().map_err(failed)? {
        let tenant: String = row.get("tenant_id").map_err(failed)?;
        let thread_id: String = row.get("thread_id").map_err(failed)?;
        let Some(&key) = read.keys.iter().find(|k| k.0 == tenant && k.1 == thread_id) else {
            continue;
        };
        let thread = match threads.entry(key) {
            Slot::Occupied(known) => known.into_mut(),
            Slot::Vacant(new) => new.insert(GroupThread::new(
                ThreadKey::from_stored(row.get("thread_key").map_err(failed)?),
                {
                    let mut counters: Counters = [0; COUNTER_COLUMNS.len()];
                    for (counter, column) in counters.iter_mut().zip(COUNTER_COLUMNS) {
                        *counter = row.get(column).map_err(failed)?;
                    }
                    counters
                },
                AppendTriggers::from_settings(
                    row.get("auto_compact_tokens").map_err(failed)?,
                    row.get("outline").map_err(failed)?,
                    row.get("clearing").map_err(failed)?,
                    defaults,
                )?,
            )),
        };
        if let Some(uuid) = row.get::<_, Option<String>>("uuid").map_err(failed)? {
            let found = (
                row.get("seq").map_err(failed)?,
                row.get("content_hash").map_err(failed)?,
            );
            thread.known.insert(uuid, found);
        }
    }
    Ok(threads)
}

/// Inserts up to [`INSERT_CHUNK`] rows in one statement.
fn insert_rows(conn: &Connection, rows: &[NewRow<'_>]) -> Result<(), StoreError> {
    let kinds: Vec<&str> = rows
        .iter()
        .map(|row| row.prepared.entry.type_name())
        .collect();
    let keys: Vec<&str> = rows.iter().map(|row| row.thread_key.as_str()).collect();
    let mut values: Vec<&dyn ToSql> = Vec::with_capacity(rows.len() * INSERT_WIDTH);
    for ((row, kind), key) in rows.iter().zip(&kinds).zip(&keys) {
        let p = row.prepared;
        values.extend([
            key as &dyn ToSql,
            &row.seq,
            &p.uuid,
            kind,
            &p.entry.subtype,
            &row.visible_rank,
            &p.body,
            &p.content_hash,
            &row.created_at,
        ]);
    }
    execute(conn, &insert_rows_sql(rows.len()), &values)
}

/// Moves the counters of every thread the group wrote to, in one statement.
fn update_threads<'a>(
    conn: &Connection,
    threads: impl Iterator<Item = &'a GroupThread>,
) -> Result<(), StoreError> {
    let written: Vec<(&str, i64, Counters)> = threads
        .filter_map(|thread| {
            let key = thread.thread_key.as_str();
            Some((key, thread.updated_at?, thread.counters()))
        })
        .collect();
    if written.is_empty() {
        return Ok(());
    }
    let mut values: Vec<&dyn ToSql> = Vec::with_capacity(written.len() * THREAD_COUNTERS_WIDTH);
    for (key, updated_at, counters) in &written {
        values.extend([key as &dyn ToSql, updated_at]);
        values.extend(counters.iter().map(|c| c as &dyn ToSql));
    }
    execute(conn, &update_threads_sql(1, written.len()), &values)
}

/// Runs a prepared (and cached) statement with its values bound by position: SQLite numbers
/// `$N` parameters in the order they first appear, which is N's in every statement here.
fn execute(conn: &Connection, sql: &str, values: &[&dyn ToSql]) -> Result<(), StoreError> {
    let mut statement = conn.prepare_cached(sql).map_err(failed)?;
    statement.execute(values).map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The writer's thread against the sqlx path it replaces: the same groups, written through
    //! each into a database of its own, decide the same and leave the same rows.

    use proptest::prelude::*;
    use sqlx::Row;

    use super::super::plan::PreparedBatch;
    use super::*;
    use crate::history::model::Entry;
    use crate::store::{NewThread, Store, StoreOptions, TenantId, ThreadId};

    /// One append: its thread (the last index names no thread), its entries as (uuid from a
    /// small pool, content variant, assistant or user), and its compare-and-append offset.
    #[derive(Debug, Clone)]
    struct AppendSpec {
        thread: usize,
        entries: Vec<(u8, u8, bool)>,
        expect_offset: Option<i8>,
    }

    const THREADS: usize = 3;

    fn append_spec() -> impl Strategy<Value = AppendSpec> {
        (
            0..=THREADS,
            proptest::collection::vec((0..12_u8, 0..2_u8, any::<bool>()), 1..4),
            proptest::option::weighted(0.3, -1..=1_i8),
        )
            .prop_map(|(thread, entries, expect_offset)| AppendSpec {
                thread,
                entries,
                expect_offset,
            })
    }

    fn groups() -> impl Strategy<Value = Vec<Vec<AppendSpec>>> {
        proptest::collection::vec(proptest::collection::vec(append_spec(), 1..6), 1..6)
    }

    fn entry(thread: usize, (uuid, variant, assistant): (u8, u8, bool)) -> Entry {
        let role = if assistant { "assistant" } else { "user" };
        serde_json::from_value(serde_json::json!({
            "uuid": format!("u-{thread}-{uuid}"),
            "type": role,
            "message": {"role": role, "content": format!("{role} says {uuid} the {variant} way")},
        }))
        .expect("a valid entry")
    }

    /// The group of `specs`, prepared at a fixed time so both databases store the same.
    fn group(specs: &[AppendSpec], next_seqs: &[i64]) -> Vec<QueuedAppend> {
        let now = chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap();
        specs
            .iter()
            .filter_map(|spec| {
                let entries = spec
                    .entries
                    .iter()
                    .map(|e| entry(spec.thread, *e))
                    .collect();
                // A batch naming a uuid twice is refused before it is queued.
                let batch = PreparedBatch::new(entries, now).ok()?;
                let known = next_seqs.get(spec.thread).copied().unwrap_or(0);
                Some(QueuedAppend {
                    tenant: TenantId("t".to_owned()),
                    thread_id: ThreadId::new(format!("th{}", spec.thread)),
                    batch,
                    expected_next_seq: spec.expect_offset.map(|o| known + i64::from(o)),
                    reply: tokio::sync::oneshot::channel().0,
                })
            })
            .collect()
    }

    fn decided(plans: &[Planned]) -> Vec<String> {
        plans
            .iter()
            .map(|plan| match plan {
                Planned::Write {
                    first_seq,
                    tokens_before,
                    ..
                } => format!("write at {first_seq}, {tokens_before} tokens before"),
                Planned::Replay { next_seq, .. } => format!("replay at {next_seq}"),
                Planned::Refused(error) => format!("refused: {error}"),
            })
            .collect()
    }

    async fn open(path: &std::path::Path, defaults: AppendDefaults) -> Store {
        let _ = std::fs::remove_file(path);
        let store = Store::connect(&StoreOptions {
            auto_compact_tokens: defaults.auto_compact_tokens,
            max_thread_bytes: defaults.max_thread_bytes,
            ..StoreOptions::new(format!("sqlite://{}", path.display()))
        })
        .await
        .expect("the store opens");
        store.migrate().await.expect("migrations run");
        let tenant = TenantId("t".to_owned());
        store.create_tenant(&tenant, None).await.expect("tenant");
        for thread in 0..THREADS {
            let new = NewThread {
                id: Some(format!("th{thread}").into()),
                metadata: Default::default(),
            };
            store.create_thread(&tenant, new).await.expect("thread");
        }
        // Created before the groups' fixed clock, in both databases alike.
        sqlx::query("UPDATE threads SET created_at = 0, updated_at = 0")
            .execute(&store.writer)
            .await
            .expect("times");
        store
    }

    /// Every row and counter that an append writes, by thread id (keys differ per database).
    async fn state(store: &Store) -> (Vec<String>, Vec<String>, Vec<String>) {
        let messages = sqlx::query(
            "SELECT t.thread_id, m.seq, m.uuid, m.kind, m.subtype, m.visible_rank, m.body, \
             m.content_hash, m.created_at FROM messages m JOIN threads t \
             ON t.thread_key = m.thread_key ORDER BY t.thread_id, m.seq",
        )
        .fetch_all(&store.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let subtype: Option<String> = r.get(4);
            format!(
                "{} {} {} {} {subtype:?} {} {} {} {}",
                r.get::<String, _>(0),
                r.get::<i64, _>(1),
                r.get::<String, _>(2),
                r.get::<String, _>(3),
                r.get::<i64, _>(5),
                r.get::<String, _>(6),
                r.get::<String, _>(7),
                r.get::<i64, _>(8)
            )
        })
        .collect();
        let threads = sqlx::query(
            "SELECT thread_id, next_seq, visible_count, context_tokens, updated_at, stored_bytes \
             FROM threads ORDER BY thread_id",
        )
        .fetch_all(&store.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            // An untouched thread's `updated_at` is its creation's, which differs.
            let written = r.get::<i64, _>(1) > 0;
            format!(
                "{} {} {} {} {:?} {}",
                r.get::<String, _>(0),
                r.get::<i64, _>(1),
                r.get::<i64, _>(2),
                r.get::<i64, _>(3),
                written.then(|| r.get::<i64, _>(4)),
                r.get::<i64, _>(5)
            )
        })
        .collect();
        let jobs = sqlx::query("SELECT kind, state FROM jobs ORDER BY kind, state")
            .fetch_all(&store.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| format!("{} {}", r.get::<String, _>(0), r.get::<String, _>(1)))
            .collect();
        (messages, threads, jobs)
    }

    async fn next_seqs(store: &Store) -> Vec<i64> {
        let tenant = TenantId("t".to_owned());
        let mut seqs = Vec::new();
        for thread in 0..THREADS {
            let found = store
                .get_thread(&tenant, &format!("th{thread}").into())
                .await;
            seqs.push(found.map(|t| t.next_seq).unwrap_or(0));
        }
        seqs
    }

    /// Writes the groups into two databases, through the writer's thread and through sqlx, and
    /// compares every decision and the stored result.
    async fn both_paths_agree(groups: Vec<Vec<AppendSpec>>, defaults: AppendDefaults) {
        let dir = std::env::temp_dir().join(format!("loupe-writer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let fast = open(&dir.join("fast.db"), defaults).await;
        let mut plain = open(&dir.join("plain.db"), defaults).await;
        plain.sqlite_writer = None;
        let mut sqlite =
            WriterConnection::open(&dir.join("fast.db"), SqliteSynchronous::default()).unwrap();
        for specs in &groups {
            if self::group(specs, &[]).is_empty() {
                // Every batch was refused before queueing: no group forms.
                continue;
            }
            let group = self::group(specs, &next_seqs(&fast).await);
            let outcome = sqlite.write_group(&group, defaults);
            let fast_plans = match outcome.expect("no statement fails") {
                GroupWrite::Done(plans) => plans,
                GroupWrite::Declined => {
                    let mut conn = fast.writer.acquire().await.unwrap();
                    fast.write_group_in(&mut conn, &group)
                        .await
                        .unwrap()
                        .unwrap()
                }
            };
            let group = self::group(specs, &next_seqs(&plain).await);
            let mut conn = plain.writer.acquire().await.unwrap();
            let plain_plans = plain
                .write_group_in(&mut conn, &group)
                .await
                .unwrap()
                .unwrap();
            drop(conn);
            assert_eq!(
                decided(&fast_plans),
                decided(&plain_plans),
                "group {specs:?}"
            );
        }
        assert_eq!(state(&fast).await, state(&plain).await);
        fast.close().await;
        plain.close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn the_writer_thread_writes_what_the_sqlx_path_writes(
            groups in groups(),
            auto_compact_tokens in prop_oneof![Just(0_i64), 20..200_i64],
            // Each entry's body is some tens of bytes: a limit that some appends pass.
            max_thread_bytes in prop_oneof![Just(0_i64), 100..2_000_i64],
        ) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let defaults = AppendDefaults { auto_compact_tokens, max_thread_bytes };
            runtime.block_on(both_paths_agree(groups, defaults));
        }
    }

    /// A store of `THREADS` threads in a directory of its own, and a writer on its file.
    struct Fixture {
        dir: std::path::PathBuf,
        store: Store,
        sqlite: WriterConnection,
    }

    impl Fixture {
        fn defaults(auto_compact_tokens: i64) -> AppendDefaults {
            AppendDefaults {
                auto_compact_tokens,
                max_thread_bytes: 0,
            }
        }

        async fn new(auto_compact_tokens: i64) -> Self {
            let dir = std::env::temp_dir().join(format!("loupe-writer-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("loupe.db");
            let store = open(&path, Self::defaults(auto_compact_tokens)).await;
            let sqlite = WriterConnection::open(&path, SqliteSynchronous::default()).unwrap();
            Fixture { dir, store, sqlite }
        }

        /// Writes one append of `entries` to thread `thread` as a group.
        fn write(
            &mut self,
            thread: usize,
            entries: Vec<(u8, u8, bool)>,
            threshold: i64,
        ) -> Result<GroupWrite, StoreError> {
            let specs = [AppendSpec {
                thread,
                entries,
                expect_offset: None,
            }];
            let next_seqs = [0; THREADS];
            self.sqlite
                .write_group(&group(&specs, &next_seqs), Self::defaults(threshold))
        }

        async fn finish(self) {
            self.store.close().await;
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn a_group_that_would_enqueue_a_job_is_declined_untouched() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            // A threshold of 1 token: any append crosses it.
            let mut fixture = Fixture::new(1).await;
            let outcome = fixture.write(0, vec![(1, 0, false)], 1);
            assert!(matches!(outcome, Ok(GroupWrite::Declined)));
            assert!(
                fixture.sqlite.connection().is_autocommit(),
                "no transaction is left open"
            );
            assert_eq!(
                next_seqs(&fixture.store).await,
                vec![0; THREADS],
                "nothing was written"
            );
            fixture.finish().await;
        });
    }

    #[test]
    fn a_transaction_left_open_is_ended_before_the_next_group() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let mut fixture = Fixture::new(0).await;
            // What a failed ROLLBACK leaves: a transaction holding SQLite's write lock.
            let conn = fixture.sqlite.connection();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            let outcome = fixture.write(1, vec![(1, 0, false), (2, 0, true)], 0);
            assert!(matches!(outcome, Ok(GroupWrite::Done(_))));
            assert!(fixture.sqlite.connection().is_autocommit());
            let mut expected = vec![0; THREADS];
            expected[1] = 2;
            assert_eq!(
                next_seqs(&fixture.store).await,
                expected,
                "committed, seen by the pool"
            );
            fixture.finish().await;
        });
    }

    thread_local! {
        /// Makes the next group written on this thread panic inside its transaction.
        static PANIC_IN_NEXT_GROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    pub(super) fn panic_if_asked() {
        if PANIC_IN_NEXT_GROUP.with(|asked| asked.replace(false)) {
            panic!("a bug while writing a group (injected by a test)");
        }
    }

    #[test]
    fn a_panic_fails_only_its_group_and_leaves_no_transaction() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let mut fixture = Fixture::new(0).await;
            PANIC_IN_NEXT_GROUP.with(|asked| asked.set(true));
            let outcome = fixture.write(0, vec![(1, 0, false)], 0);
            // A transient failure, which the HTTP layer answers with a 503 and `Retry-After`.
            assert!(
                matches!(
                    outcome,
                    Err(StoreError::CommitFailed {
                        transient: true,
                        ..
                    })
                ),
                "{:?}",
                outcome.err()
            );
            assert!(fixture.sqlite.connection().is_autocommit(), "rolled back");
            assert_eq!(
                next_seqs(&fixture.store).await,
                vec![0; THREADS],
                "nothing kept"
            );
            let outcome = fixture.write(0, vec![(1, 0, false)], 0);
            assert!(
                matches!(outcome, Ok(GroupWrite::Done(_))),
                "the next group is written"
            );
            assert_eq!(next_seqs(&fixture.store).await[0], 1);
            fixture.finish().await;
        });
    }
}
