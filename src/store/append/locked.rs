//! The locked group: a group of appends written through sqlx under its threads' row locks, with
//! the jobs its appends trigger enqueued in the same transaction. Every group can go this way;
//! the faster paths (`sqlite_writer`, `pg_unlocked`) hand it what they cannot write.

use std::collections::HashMap;

use sqlx::AnyConnection;

use super::plan::{
    may_be_replays, plan_group, thread_of, CompactionTrigger, GroupThread, OverheadSample, Planned,
    QueuedAppend,
};
use super::sql::{read_group, write_rows, RowLock, Transaction, UuidCheck};
use crate::store::jobs::{auto_compaction_due, compaction_dedup_key, enqueue_in, enqueue_tree_in};
use crate::store::payloads::{CompactionPayload, KIND_COMPACTION};
use crate::store::{now_millis, NewJob, Store, StoreError, ThreadKey};

/// What [`Store::write_group`] did.
pub(super) enum GroupOutcome {
    /// Every append decided, and the writes done (not committed).
    Decided(Vec<Planned>),
    /// With [`UuidCheck::OnInsert`], an append's outcome depends on what the uuids it named hold:
    /// nothing may be kept, and the group is decided again reading them.
    DecideAgainReadingUuids,
}

impl Store {
    /// Writes a whole group of appends with a fixed number of statements, however many appends
    /// it holds: read the group's threads and the uuids they name, insert every new row, move
    /// every thread's counters. Each append is decided in memory, in queue order, against its
    /// thread as the earlier appends of the group left it: a refusal or a replay writes nothing
    /// and leaves the others alone. Jobs the appends trigger are enqueued before the rows, in the
    /// same transaction, so that the rows' call can end it. An `Err` is a statement that failed:
    /// nothing of the group may be kept, and with [`Transaction::OwnStatements`] the transaction may still
    /// be open.
    pub(super) async fn write_group(
        &self,
        conn: &mut AnyConnection,
        group: &[QueuedAppend],
        transaction: Transaction,
        check: UuidCheck,
    ) -> Result<GroupOutcome, StoreError> {
        let mut threads = read_group(
            conn,
            self.backend,
            group,
            self.append_defaults(),
            transaction,
            check,
            RowLock::ForUpdate,
        )
        .await?;
        let mut rows = Vec::new();
        let mut plans = plan_group(group, &mut threads, &mut rows);
        if check == UuidCheck::OnInsert && may_be_replays(group, &plans) {
            return Ok(GroupOutcome::DecideAgainReadingUuids);
        }
        for (append, plan) in group.iter().zip(&mut plans) {
            if let Planned::Write {
                tokens_before,
                auto_compaction_job,
                jobs_created,
                ..
            } = plan
            {
                let thread = &threads[&thread_of(append)];
                let jobs = self
                    .enqueue_triggered_jobs(conn, append, thread, *tokens_before)
                    .await?;
                *auto_compaction_job = jobs.auto_compaction;
                *jobs_created = jobs.created;
            }
        }
        self.learn_overheads(conn, group, &plans, &threads).await?;
        if plans.iter().any(Planned::writes) {
            let inserted = write_rows(
                conn,
                self.backend,
                &rows,
                threads.values(),
                transaction,
                check,
            )
            .await?;
            if inserted.is_some_and(|inserted| inserted < rows.len()) {
                return Ok(GroupOutcome::DecideAgainReadingUuids);
            }
        } else if transaction == Transaction::OwnStatements {
            // Replays and refusals only: nothing to keep.
            sqlx::query("ROLLBACK").execute(&mut *conn).await?;
        }
        Ok(GroupOutcome::Decided(plans))
    }

    /// Enqueues, in the group's transaction, what one append triggers: a compaction when the
    /// estimate crosses the thread's threshold, the tree job of an outlined thread.
    async fn enqueue_triggered_jobs(
        &self,
        conn: &mut AnyConnection,
        append: &QueuedAppend,
        thread: &GroupThread,
        tokens_before: i64,
    ) -> Result<TriggeredJobs, StoreError> {
        let mut jobs = TriggeredJobs::default();
        // One time for the backoff's check and the job it may enqueue.
        let now = now_millis();
        let compaction = CompactionTrigger::of(append, thread, tokens_before);
        let retry = compaction == CompactionTrigger::RetryIfDue
            && auto_compaction_due(conn, &thread.thread_key, now).await?;
        if compaction == CompactionTrigger::Crossed || retry {
            let outcome = enqueue_in(
                conn,
                self.backend,
                &NewJob {
                    tenant: append.tenant.clone(),
                    thread_key: Some(thread.thread_key.clone()),
                    kind: KIND_COMPACTION.to_owned(),
                    payload: CompactionPayload::auto(&append.thread_id).to_value(),
                    dedup_key: Some(compaction_dedup_key(&thread.thread_key)),
                    max_attempts: self.job_max_attempts,
                },
                now,
            )
            .await?;
            jobs.created |= outcome.created;
            jobs.auto_compaction = Some(outcome.job.id);
        }
        if thread.triggers.outlined {
            let outcome = enqueue_tree_in(
                conn,
                self.backend,
                &append.tenant,
                &thread.thread_key,
                self.job_max_attempts,
            )
            .await?;
            jobs.created |= outcome.created;
        }
        Ok(jobs)
    }
}

impl Store {
    /// Folds what the group's first calls taught into their tenants' `model_overheads`, in
    /// (tenant, model) order, so that two groups lock the rows in one order.
    async fn learn_overheads(
        &self,
        conn: &mut AnyConnection,
        group: &[QueuedAppend],
        plans: &[Planned],
        threads: &HashMap<(&str, &str), GroupThread>,
    ) -> Result<(), StoreError> {
        let mut samples: Vec<(&str, &OverheadSample, &ThreadKey)> = group
            .iter()
            .zip(plans)
            .filter_map(|(append, plan)| match plan {
                Planned::Write {
                    overhead: Some(sample),
                    ..
                } => Some((
                    append.tenant.0.as_str(),
                    sample,
                    &threads[&thread_of(append)].thread_key,
                )),
                _ => None,
            })
            .collect();
        samples.sort_by(|a, b| (a.0, &a.1.model_digest).cmp(&(b.0, &b.1.model_digest)));
        let now = now_millis();
        for (tenant, sample, thread_key) in samples {
            let (model, tokens) = (&sample.model_digest, sample.tokens);
            crate::store::overheads::learn_in(conn, thread_key, tenant, model, tokens, now).await?;
        }
        Ok(())
    }
}

/// The jobs an append enqueued.
#[derive(Default)]
struct TriggeredJobs {
    /// The auto-compaction job, created now or found pending or running.
    auto_compaction: Option<String>,
    /// A job was created (so a worker should wake).
    created: bool,
}
