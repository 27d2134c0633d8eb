//! Group commit: appends that arrive while another group is being written wait, then commit
//! together, in one transaction and one fsync.
//!
//! The first append to find no group running starts one on a task of its own (so that a caller
//! that goes away cannot cancel the others' writes; on SQLite, on the group writer's thread,
//! `sqlite_writer`) and the appends queued meanwhile form the next group. A group costs the same few statements whatever its size (`Store::write_group`): its
//! threads are locked and read, its named uuids looked up, then every append is decided in
//! memory, in queue order, and the group's rows and counters are written at once. A replay or a
//! refused append (conflict, unknown thread) writes nothing, and the others of its group still
//! commit. If a statement fails, the group is rolled back and each of its appends is written
//! alone, so only the one at fault fails; a failure of the database itself (busy, gone,
//! restarting) is answered to every append of the group at once instead. Nobody is answered
//! before the group's commit returns, so an acknowledged append is as durable as a
//! single-append transaction; if the commit fails, every append of the group is answered with
//! the error (on SQLite, where the commit is one of the group's statements, split as above)
//! and a retry is idempotent as always.
//!
//! A group locks its threads in (tenant, thread) order, so the groups of concurrent runners
//! (PostgreSQL) cannot deadlock.
//!
//! On PostgreSQL a group is first tried in one statement with no locks (`pg_group`), and only
//! written under locks when that cannot be; and a runner waits a moment for a group as full as
//! the last ones ([`GroupCommit::gather`]) before it writes. Two runners: one fills while the
//! other commits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, Connection};
use tokio::sync::oneshot;

use super::locked::GroupOutcome;
use super::pg_unlocked::Unlocked;
use super::plan::{Planned, PreparedBatch, QueuedAppend};
use super::sql::{Transaction, UuidCheck};
use super::sqlite_writer::{GroupWrite, Runner, WriterConnection};
use crate::store::{Backend, Store, StoreError};

/// Most appends written in one group: bounds the transaction and the wait of its last member.
const MAX_GROUP_APPENDS: usize = 64;
/// Most entries written in one group; a larger batch still forms a group of its own.
const MAX_GROUP_ENTRIES: usize = 2_000;

/// How long a runner keeps the writer connection before it gives it back, at the next group, to
/// the pool, whose other borrowers queue in arrival order.
const MAX_WRITER_HOLD: Duration = Duration::from_millis(5);

/// A runner's writer connection. While a group's transaction may be open on it, letting it go
/// (after a failure, or a panic unwinding the runner) closes it instead of lending it again: on
/// SQLite the transaction is the group's own statements', unknown to sqlx, and would keep the
/// write lock.
#[derive(Default)]
struct Writer {
    conn: Option<PoolConnection<Any>>,
    in_transaction: bool,
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.in_transaction, self.conn.as_mut()) {
            conn.close_on_drop();
        }
    }
}

/// The appends waiting, and how many runners are writing groups.
pub(in crate::store) struct GroupCommit {
    state: Mutex<Queue>,
    /// Runners allowed at once: 1 on SQLite (one writer), a few on PostgreSQL.
    max_runners: usize,
    /// Transactions committed, and the appends they held.
    groups: AtomicU64,
    grouped_appends: AtomicU64,
    /// Groups rolled back by a failed statement and written again one append at a time.
    split_groups: AtomicU64,
    /// The longest a runner waits for a group as full as the last ones ([`GroupCommit::gather`]).
    gather: Duration,
    /// Rung by every append queued while a runner runs.
    arrived: tokio::sync::Notify,
    /// How many appends the next group waits for: the size the last groups reached, less one a
    /// group, so a load that falls away stops being waited for within a few groups.
    expected: AtomicUsize,
}

/// How appends were grouped since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Group transactions that committed.
    pub groups: u64,
    /// Appends those transactions held (replays and refusals included).
    pub appends: u64,
    /// Groups a failed statement rolled back, whose appends were then written alone.
    pub split_groups: u64,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<QueuedAppend>,
    runners: usize,
}

impl GroupCommit {
    pub(in crate::store) fn new(max_runners: usize, gather: Duration) -> Self {
        GroupCommit {
            state: Mutex::new(Queue::default()),
            max_runners: max_runners.max(1),
            groups: AtomicU64::new(0),
            grouped_appends: AtomicU64::new(0),
            split_groups: AtomicU64::new(0),
            gather,
            arrived: tokio::sync::Notify::new(),
            expected: AtomicUsize::new(1),
        }
    }

    /// Waits, at most [`GroupCommit::gather`], until as many appends wait as the last groups
    /// held, as PostgreSQL's own `commit_delay` does for commits: under concurrent load the
    /// clients answered by the last group are about to send their next appends, and a group
    /// costs the database about the same whatever its size. A lone writer (groups of one) never
    /// waits.
    async fn gather(&self) {
        let expected = self.expected.load(Ordering::Relaxed);
        if self.gather.is_zero() || expected <= 1 {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.gather;
        loop {
            let waiting = self
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting
                .len();
            if waiting >= expected {
                return;
            }
            if tokio::time::timeout_at(deadline, self.arrived.notified())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Queues the append and starts a runner when fewer than allowed are running.
    pub(super) fn submit(&self, store: &Store, append: QueuedAppend) {
        let start = {
            let mut queue = self.state.lock().unwrap_or_else(|e| e.into_inner());
            queue.waiting.push(append);
            let start = queue.runners < self.max_runners;
            if start {
                queue.runners += 1;
            }
            start
        };
        if start {
            spawn_runner(store.clone());
        } else if !self.gather.is_zero() {
            self.arrived.notify_one();
        }
    }

    /// The next group, oldest first, or `None` (and one runner fewer) when nothing waits.
    fn next_group(&self) -> Option<Vec<QueuedAppend>> {
        let mut queue = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if queue.waiting.is_empty() {
            queue.runners -= 1;
            return None;
        }
        let (mut count, mut entries) = (0, 0);
        for append in &queue.waiting {
            if count == MAX_GROUP_APPENDS
                || (count > 0 && entries + append.batch.entries.len() > MAX_GROUP_ENTRIES)
            {
                break;
            }
            count += 1;
            entries += append.batch.entries.len();
        }
        let previous = self.expected.load(Ordering::Relaxed);
        self.expected
            .store(count.max(previous.saturating_sub(1)), Ordering::Relaxed);
        Some(queue.waiting.drain(..count).collect())
    }
}

/// A runner on a task of its own, so that no caller going away can cancel a group; on SQLite,
/// on the group writer's thread instead (`sqlite_writer`).
fn spawn_runner(store: Store) {
    if let (Some(writer), Ok(runtime)) = (
        store.sqlite_writer.clone(),
        tokio::runtime::Handle::try_current(),
    ) {
        let on_thread = store.clone();
        let run: Runner = Box::new(move |conn| runtime.block_on(on_thread.run_sqlite_groups(conn)));
        if writer.start_runner(run).is_ok() {
            return;
        }
    }
    tokio::spawn(async move {
        let runner = RunnerGuard(store);
        runner.0.run_groups(None).await;
    });
}

/// Gives the runner's place back if its task ends early (a panic): the appends still waiting get
/// a new runner instead of waiting forever.
struct RunnerGuard(Store);

impl Drop for RunnerGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let queue = &self.0.group_commit;
        let restart = {
            let mut state = queue.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.waiting.is_empty() {
                state.runners -= 1;
                false
            } else {
                true
            }
        };
        if restart {
            spawn_runner(self.0.clone());
        }
    }
}

impl Store {
    /// The runner, on the group writer's thread (`sqlite_writer`), writing on its connection.
    async fn run_sqlite_groups(&self, sqlite: &mut WriterConnection) {
        let runner = RunnerGuard(self.clone());
        runner.0.run_groups(Some(sqlite)).await;
    }

    /// How appends were grouped into transactions so far.
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            groups: self.group_commit.groups.load(Ordering::Relaxed),
            appends: self.group_commit.grouped_appends.load(Ordering::Relaxed),
            split_groups: self.group_commit.split_groups.load(Ordering::Relaxed),
        }
    }

    /// Writes groups until nobody waits, on one writer connection held across groups: taking it
    /// from the pool and giving it back cost a call each (the pool pings a connection given
    /// back), which on SQLite's single writer the next group would otherwise wait behind. Once
    /// it has been held [`MAX_WRITER_HOLD`], it is given back before the next group, so that the
    /// pool's other writers (new threads, settings, jobs) take their turn even while appends
    /// never stop coming.
    ///
    /// With `sqlite`, the group writer's connection, groups are written on it in one go
    /// (`sqlite_writer::write_group`); without, through sqlx on the writer connection.
    async fn run_groups(&self, mut sqlite: Option<&mut WriterConnection>) {
        let mut writer = Writer::default();
        let mut held_since = Instant::now();
        loop {
            self.group_commit.gather().await;
            let Some(group) = self.group_commit.next_group() else {
                break;
            };
            if writer.conn.is_some() && held_since.elapsed() >= MAX_WRITER_HOLD {
                writer.conn = None;
            }
            if writer.conn.is_none() {
                held_since = Instant::now();
            }
            let Err((group, error)) = self
                .commit_group(&mut writer, group, sqlite.as_deref_mut())
                .await
            else {
                continue;
            };
            if group.len() == 1 {
                answer_error(group, error);
                continue;
            }
            if error.is_transient() {
                // The database, not an append, is at fault (busy, gone, restarting): alone, each
                // would only wait for the same failure again.
                let replies = group.into_iter().map(|append| append.reply);
                answer_failed(replies, &error);
                continue;
            }
            // A statement failed, so nothing of the group was kept. Which append it was is not
            // known: each is written alone, and only the one at fault fails again.
            self.group_commit
                .split_groups
                .fetch_add(1, Ordering::Relaxed);
            for append in group {
                let sqlite = sqlite.as_deref_mut();
                if let Err((alone, error)) =
                    self.commit_group(&mut writer, vec![append], sqlite).await
                {
                    answer_error(alone, error);
                }
            }
        }
    }

    /// One transaction for the whole group (`Store::write_group`) on the runner's connection,
    /// taken from the pool when it has none; answers each append once the transaction's fate is
    /// known. A statement that failed gives the group back, unanswered. After any failure the
    /// connection is let go: on PostgreSQL back to the pool, whose ping drops it if it is broken;
    /// on SQLite closed, since the failure may have left its transaction open.
    async fn commit_group(
        &self,
        writer: &mut Writer,
        group: Vec<QueuedAppend>,
        sqlite: Option<&mut WriterConnection>,
    ) -> Result<(), (Vec<QueuedAppend>, StoreError)> {
        let conn = match &mut writer.conn {
            Some(conn) => conn,
            None => match self.writer.acquire().await {
                Ok(conn) => writer.conn.insert(conn),
                Err(error) => {
                    let replies = group.into_iter().map(|append| append.reply);
                    answer_failed(replies, &error.into());
                    return Ok(());
                }
            },
        };
        let outcome = match sqlite {
            // The writer pool's connection, held, keeps every other writer of this process off
            // the file while the group writer's connection writes.
            Some(sqlite) => match sqlite.write_group(&group, self.append_defaults()) {
                Ok(GroupWrite::Done(plans)) => Ok(Ok(plans)),
                Err(error) => Ok(Err(error)),
                Ok(GroupWrite::Declined) => {
                    writer.in_transaction = true;
                    self.write_group_in(conn, &group).await
                }
            },
            None => {
                // Only SQLite's transaction is the group's own; sqlx rolls its own back when
                // dropped.
                writer.in_transaction = self.backend == Backend::Sqlite;
                self.write_group_in(conn, &group).await
            }
        };
        if matches!(outcome, Ok(Ok(_))) {
            writer.in_transaction = false;
        } else {
            drop(std::mem::take(writer));
        }
        let plans = match outcome {
            Ok(Ok(plans)) => plans,
            Ok(Err(error)) => return Err((group, error)),
            Err(error) => {
                let replies = group.into_iter().map(|append| append.reply);
                answer_failed(replies, &error);
                return Ok(());
            }
        };
        let stats = &self.group_commit;
        stats.groups.fetch_add(1, Ordering::Relaxed);
        stats
            .grouped_appends
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        let created = plans.iter().any(|plan| {
            matches!(
                plan,
                Planned::Write {
                    jobs_created: true,
                    ..
                }
            )
        });
        if created {
            self.job_signal.notify_one();
        }
        for (QueuedAppend { reply, batch, .. }, plan) in group.into_iter().zip(plans) {
            let _ = reply.send(Ok((plan, batch)));
        }
        Ok(())
    }

    /// Begins, writes and commits the group on `conn`. The outer error is the transaction's own
    /// (begin or commit failed: nothing is stored); the inner one a statement of the group's.
    /// On SQLite the group's own statements begin and commit (`Transaction::OwnStatements`), so a failed
    /// statement, the commit included, is an inner error after which the transaction may still
    /// be open: the caller closes that connection.
    pub(super) async fn write_group_in(
        &self,
        conn: &mut AnyConnection,
        group: &[QueuedAppend],
    ) -> Result<Result<Vec<Planned>, StoreError>, StoreError> {
        if self.backend == Backend::Sqlite {
            return Ok(
                match self
                    .write_group(conn, group, Transaction::OwnStatements, UuidCheck::Read)
                    .await
                {
                    Ok(GroupOutcome::Decided(plans)) => Ok(plans),
                    Ok(GroupOutcome::DecideAgainReadingUuids) => {
                        unreachable!("SQLite reads the uuids")
                    }
                    Err(error) => Err(error),
                },
            );
        }
        let mut check = match self.write_group_unlocked(conn, group).await? {
            Unlocked::Written(plans) => return Ok(Ok(plans)),
            Unlocked::UnderLocks(check) => check,
        };
        loop {
            let mut tx = conn.begin().await?;
            let plans = match self
                .write_group(&mut tx, group, Transaction::Caller, check)
                .await
            {
                Ok(GroupOutcome::Decided(plans)) => plans,
                Ok(GroupOutcome::DecideAgainReadingUuids) => {
                    // A replay, a conflict or a race with another process: decide again
                    // knowing what is stored.
                    tx.rollback().await?;
                    check = UuidCheck::Read;
                    continue;
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    return Ok(Err(error));
                }
            };
            if plans.iter().any(Planned::writes) {
                tx.commit().await?;
            } else {
                // Replays and refusals only: nothing to keep.
                let _ = tx.rollback().await;
            }
            return Ok(Ok(plans));
        }
    }
}

/// A lone append whose statement failed gets that error itself.
fn answer_error(alone: Vec<QueuedAppend>, error: StoreError) {
    debug_assert_eq!(alone.len(), 1);
    if let Some(append) = alone.into_iter().next() {
        let _ = append.reply.send(Err(error));
    }
}

/// Every append of a group whose transaction failed gets the failure: none of them is stored.
fn answer_failed(
    replies: impl Iterator<Item = oneshot::Sender<Result<(Planned, PreparedBatch), StoreError>>>,
    error: &StoreError,
) {
    let (message, transient) = (error.to_string(), error.is_transient());
    for reply in replies {
        let _ = reply.send(Err(StoreError::CommitFailed {
            message: message.clone(),
            transient,
        }));
    }
}
