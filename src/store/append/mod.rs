//! The append engine: concurrent appends committed together, a group to a transaction, each
//! append decided in memory against its thread as the group's earlier appends left it.
//!
//! `Store::append` prepares the batch (uuids, fingerprints, bodies, its token estimate,
//! [`plan::PreparedBatch`]) and queues it ([`queue`]); a runner takes the waiting appends as one
//! group, writes it by one of the paths below, and answers each append once the group's
//! transaction has committed, so an acknowledged append is as durable as one written alone.
//!
//! | path | taken when | falls back to | proven equal to the plain one by |
//! |---|---|---|---|
//! | [`sqlite_writer`]: the group on a thread of its own, through rusqlite | SQLite, every group | the locked group, untouched, when an append would enqueue a job or the group names more than 1,000 uuids | `store::append::sqlite_writer::tests::the_writer_thread_writes_what_the_sqlx_path_writes` (property) |
//! | [`pg_unlocked`]: one compare-and-set statement, no locks, threads from the cache | PostgreSQL, groups of at most 200 rows | the locked group, on a refusal, a job to enqueue, a stored uuid, a thread moved meanwhile or a deadlock | `group_commit::postgres_groups_decide_as_sqlite_groups_do` (property), `group_commit::a_group_with_one_thread_moved_elsewhere_keeps_each_append_once` |
//! | [`locked`]: the plain path, through sqlx under row locks, jobs enqueued in its transaction | whatever the others hand it, and SQLite without the writer thread | each append alone, when a statement of the group failed | `group_commit::a_refused_or_replayed_member_leaves_the_rest_of_its_group_whole`, `group_commit::a_statement_that_fails_fails_only_its_own_append` |
//! | one append alone (the locked path, a group of one) | a group whose statement failed | none: its error is its answer | `group_commit::a_statement_that_fails_fails_only_its_own_append` |
//!
//! Every path decides with [`plan`] (pure, unit-tested) and writes with [`sql`]'s statements; a
//! failure of the database itself (busy, gone, restarting) is answered to the whole group at once.
//! Two writes of messages go elsewhere: an import appends through `Store::append` in batches,
//! and a compaction's summary is written by `Store::write_compaction` (`store/jobs.rs`) with
//! [`crate::store::rows`]' insert.

mod locked;
mod pg_unlocked;
mod plan;
mod queue;
mod sql;
mod sqlite_writer;
mod window_content;

pub(super) use pg_unlocked::ThreadCache;
pub(super) use plan::AppendDefaults;
pub use plan::SNIP_HEADROOM_BYTES;
pub(super) use queue::GroupCommit;
pub use queue::GroupCommitStats;
pub(super) use sqlite_writer::SqliteWriter;
#[cfg(test)]
pub(super) use sqlite_writer::WriterConnection;
pub(in crate::store) use window_content::WindowContent;

use super::rows::numbered;
use super::{now_millis, Store, StoreError, TenantId, ThreadId};
use crate::history::model::Entry;
use crate::history::normalize::estimate::entry_features;
use crate::history::normalize::ClearingOptions;
use plan::{Planned, PreparedBatch, QueuedAppend};

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

impl Store {
    /// Appends a batch atomically: all of it or nothing.
    ///
    /// Retries are idempotent: a batch whose uuids are all stored with the same content returns
    /// the stored messages and writes nothing. A uuid stored with other content is a conflict,
    /// and so is a batch that is only partly stored (it cannot be the retry of one atomic append).
    pub async fn append(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        request: AppendRequest,
    ) -> Result<AppendOutcome, StoreError> {
        // Times are stored in milliseconds: the answer shows what a later read will.
        let now = chrono::DateTime::from_timestamp_millis(now_millis()).unwrap_or_default();
        let batch = PreparedBatch::new(request.entries, now)?;
        let recount = batch.brings_back_a_segment();
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.group_commit.submit(
            self,
            QueuedAppend {
                tenant: tenant.clone(),
                thread_id: thread_id.clone(),
                batch,
                expected_next_seq: request.expected_next_seq,
                reply,
            },
        );
        let (plan, batch) = answer.await.map_err(|_| StoreError::CommitFailed {
            message: "the append's group was abandoned".to_owned(),
            transient: true,
        })??;
        match plan {
            Planned::Write {
                first_seq,
                auto_compaction_job,
                ..
            } => {
                self.changes.changed(tenant, thread_id);
                if recount {
                    // Committed whatever the count does: a fault leaves it low until the next
                    // `usage` anchors it.
                    if let Err(error) = self
                        .recount_context_tokens(tenant, thread_id, Recount::CountOnly)
                        .await
                    {
                        tracing::warn!(%error, "the thread's token count was not recounted");
                    }
                }
                Ok(AppendOutcome {
                    next_seq: first_seq + batch.len(),
                    messages: numbered(batch.entries, first_seq),
                    replayed: false,
                    auto_compaction_job,
                })
            }
            Planned::Replay {
                thread_key,
                next_seq,
            } => {
                let uuids: Vec<String> = batch.entries.into_iter().map(|p| p.uuid).collect();
                let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
                let messages = self.messages_by_uuid(&thread_key, &uuids).await?;
                Ok(AppendOutcome {
                    messages,
                    replayed: true,
                    next_seq,
                    auto_compaction_job: None,
                })
            }
            Planned::Refused(error) => Err(error),
        }
    }
}

impl Store {
    /// Counts the thread's stored estimate (the auto-compaction trigger's) again, after a
    /// change the appends did not make: new settings (clearing changes what it counts) or an
    /// erasure (the entries and their `usage` are gone). A page of the window at a time, then
    /// written only if no append moved the thread meanwhile (else counted again; an append made
    /// after the change counts its own entries under it either way). After a settings change, a
    /// thread left at or past its threshold is compacted, as an append crossing it would be (an
    /// append made while it is already past it enqueues nothing); an erasure only lowers it.
    pub(in crate::store) async fn recount_context_tokens(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        after: Recount,
    ) -> Result<(), StoreError> {
        const PAGE: u64 = 500;
        for _ in 0..RECOUNT_TRIES {
            let head = self.context_head(tenant, thread_id).await?;
            let clearing = head.settings.clearing_options();
            let bounds = self.context_bounds(&head).await?;
            let (mut at, end) = (bounds.start_seq.max(0) as u64, head.next_seq.max(0) as u64);
            let mut count = plan::StoredCount::default();
            // The entries before the last boundary in the window are the segment it brings
            // back: the boundary restarts the count, and they are added after it.
            let boundary_seq = bounds.boundary_seq().unwrap_or(i64::MIN);
            let mut segment = 0_i64;
            while at < end {
                let until = (at + PAGE).min(end);
                let page = self.entries_between(&head.thread_key, at, until).await?;
                segment = page
                    .iter()
                    .filter(|e| e.seq.is_some_and(|seq| seq < boundary_seq))
                    .map(|e| entry_features(e).upper_at_default_rates() as i64)
                    .fold(segment, i64::saturating_add);
                count = plan::count_page(count, &page, clearing.as_ref());
                at = until;
            }
            // A `usage` after the boundary counted the segment already.
            let tokens = if count.anchored {
                count.tokens
            } else {
                count.tokens.saturating_add(segment)
            };
            let written = sqlx::query(
                "UPDATE threads SET context_tokens = $1, context_anchored = $4, \
                 window_content_tokens = $5 WHERE thread_key = $2 AND next_seq = $3",
            )
            .bind(tokens)
            .bind(head.thread_key.as_str())
            .bind(head.next_seq)
            .bind(i64::from(count.anchored))
            .bind(count.content.column())
            .execute(&self.writer)
            .await?;
            if written.rows_affected() == 1 {
                if after == Recount::CountOnly {
                    return Ok(());
                }
                let settings = &head.settings;
                let threshold = settings
                    .auto_compact_tokens
                    .unwrap_or(self.auto_compact_tokens);
                let allowance = clearing
                    .as_ref()
                    .map_or(0, ClearingOptions::most_whole_tokens);
                let outlined = settings.outline.is_some_and(|o| o.enabled);
                if threshold > 0 && !outlined && tokens.saturating_add(allowance) >= threshold {
                    self.enqueue_compaction(
                        tenant,
                        thread_id,
                        super::CompactionPayload::auto(thread_id).to_value(),
                        self.job_max_attempts,
                        now_millis(),
                    )
                    .await?;
                }
                return Ok(());
            }
        }
        Ok(())
    }
}

impl Store {
    /// Counts the thread's stored estimate again after an erasure in it committed: the erased
    /// entries count as their tombstones, and a window whose only `usage` was erased is
    /// estimated from content again (with the learned overhead).
    pub async fn recount_after_erasure(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<(), StoreError> {
        self.recount_context_tokens(tenant, thread_id, Recount::CountOnly)
            .await
    }
}

/// Counts of a thread's estimate a settings change tries before leaving it to the appends.
const RECOUNT_TRIES: usize = 3;

/// What changed a thread's window other than an append, for [`Store::recount_context_tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Recount {
    /// Its settings: may leave it past its compaction threshold.
    Settings,
    /// The count alone, never a trigger: after an erasure (which takes entries and their
    /// `usage` out), or an append whose boundary brings back a segment of stored entries the
    /// append could not count (the boundary compacted the thread already).
    CountOnly,
}
