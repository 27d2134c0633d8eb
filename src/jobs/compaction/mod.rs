//! The compaction job: summarize the current context up to a round boundary and append, in one
//! write, a compact boundary and the summary. The kept rounds are referenced by the boundary's
//! `preserved_segment`, never copied.
//!
//! The job reads the view of the thread's window twice, a page at a time (see
//! [`super::view_reader`]): once to plan the cut ([`plan::PlanScan`]), once to summarize what lies
//! before it ([`PageCutter`] pages). It calls the summarizer with no transaction open, then writes the
//! boundary and the summary atomically with the job's completion (fenced by its lease). Entries
//! appended while the summarizer ran lie between the read and the new boundary; the preserved
//! segment runs up to the seq just before the boundary, so they stay in the context, in order.

pub mod plan;

pub use plan::{CompactionPayload, DEFAULT_KEEP_RECENT_ROUNDS, SUMMARY_PREFIX};

use serde_json::{json, Value};

use super::view_reader::{
    plan_compaction, StoreWindow, ToSummarize, ViewReader, WindowShape, WindowSource,
};
use super::{Clock, JobError, Runner};
use crate::history::estimate_entry_tokens;
use crate::history::ledger::Tally;
use crate::history::model::Entry;
use crate::store::{ClaimedJob, CompactionWrite, StoreError, TenantId};
use crate::summarize::{Purpose, SummaryRequest};
use plan::{
    boundary_entry, preserved_segment, summary_entry, BoundaryInfo, CompactionPlan, PageCutter,
};

/// The job's steps: read the window and plan the cut, summarize what lies before it a page at a
/// time, then write the boundary and the summary with the job's completion.
impl Runner {
    /// Runs one compaction job to its write (or to "nothing to summarize"). A snip or an
    /// erasure while it ran refuses its write, since the summary may hold what they took out:
    /// it reads and summarizes again, a few times, then fails (and is retried later).
    pub(super) async fn compact(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
    ) -> Result<Value, JobError> {
        let payload: CompactionPayload = serde_json::from_value(claimed.job.payload.clone())
            .map_err(|e| JobError::Invalid(format!("bad compaction payload: {e}")))?;
        let mut restarts = 0;
        loop {
            match self.compact_once(claimed, clock, &payload).await {
                Err(JobError::Store(StoreError::SourcesChanged)) if restarts < MAX_RESTARTS => {
                    restarts += 1;
                }
                done => return done,
            }
        }
    }

    async fn compact_once(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
        payload: &CompactionPayload,
    ) -> Result<Value, JobError> {
        let tenant = TenantId(claimed.job.tenant_id.clone());
        // Read (no transaction stays open past here) a page at a time, twice: once to plan, and
        // again to summarize, a summarizer request's worth of entries at a time. The window is
        // never held whole, whatever its length.
        let bounds = self
            .store
            .window_bounds(&tenant, &payload.thread_id, None)
            .await?;
        // Before any source is read: a snip or an erasure after this moves it.
        let epoch = self.store.redaction_epoch(&bounds.thread_key).await?;
        let window = StoreWindow {
            store: &self.store,
            bounds: &bounds,
        };
        let mut reader = ViewReader::new(window, WindowShape::of_bounds(&bounds)).await?;
        let plan = match plan_compaction(&mut reader, payload.keep_recent_rounds).await? {
            Ok(plan) => plan,
            Err(nothing) => {
                let result = json!({
                    "compacted": false,
                    "reason": format!(
                        "nothing to summarize: the context has {} round(s) and {} are kept",
                        nothing.rounds, nothing.keep_recent_rounds
                    ),
                    "rounds": nothing.rounds,
                });
                self.store
                    .complete_job(claimed, &result, clock.now_ms())
                    .await?;
                return Ok(result);
            }
        };
        let messages_summarized = plan.messages_summarized;
        let (boundary_seq, read_next_seq) = (bounds.boundary_seq(), bounds.next_seq);
        let to_summarize = ToSummarize::new(reader, &plan);
        let (summary, tally) = self.summarize_window(to_summarize, &plan, payload).await?;
        // The summary's text as sent: with the footer naming what it dropped.
        let summary_entry =
            summary_entry(&format!("{}{}", summary.text, tally.footer(&summary.text)));
        // Write the boundary and the summary, and complete the job, in one transaction.
        let write = CompactionWrite {
            expected_boundary_seq: boundary_seq,
            read_next_seq,
            kept_tokens: plan.kept_upper_tokens as i64,
            epoch,
        };
        let job_id = claimed.job.id.clone();
        let (_, result) = self
            .store
            .write_compaction(claimed, &write, clock.now_ms(), |next_seq| {
                let preserved = preserved_segment(
                    plan.first_kept_seq,
                    read_next_seq,
                    next_seq,
                );
                let boundary = boundary_entry(&BoundaryInfo {
                    trigger: &payload.trigger,
                    pre_tokens: plan.pre_tokens,
                    messages_summarized,
                    summarizer: &summary.summarizer,
                    job_id: &job_id,
                    preserved,
                });
                let result = json!({
                    "compacted": true,
                    "boundary_seq": next_seq,
                    "summary_seq": next_seq + 1,
                    "preserved_segment": preserved.map(|(first, last)| json!({"first_seq": first, "last_seq": last})),
                    "messages_summarized": messages_summarized,
                    "pre_tokens": plan.pre_tokens,
                    "summarizer": summary.summarizer,
                    "summarizer_calls": summary.calls,
                });
                (vec![boundary, summary_entry], result)
            })
            .await?;
        Ok(result)
    }

    /// The summary of the plan's entries, read in order from `entries`: one summarizer request
    /// per page of `compaction_page_tokens`, each carrying the previous page's summary (the
    /// first, the previous compaction's). The bodies of one page at a time are in memory. The
    /// tally holds the anchors of the entries summarized, for the ledger's footer.
    async fn summarize_window<S: WindowSource>(
        &self,
        mut entries: ToSummarize<S>,
        plan: &CompactionPlan,
        payload: &CompactionPayload,
    ) -> Result<(crate::summarize::Summary, Tally), JobError> {
        let mut tally = Tally::default();
        let mut cutter = PageCutter::new(self.config.compaction_page_tokens, SUMMARY_PAGE_ENTRIES);
        let mut pages = PageSummaries {
            previous: plan.previous_summary.clone(),
            calls: 0,
            summary: None,
        };
        // A thread deleted meanwhile comes up short in a page, and the reader fails there.
        let mut page = Vec::new();
        while let Some(entry) = entries.next().await? {
            if cutter.starts_page(estimate_entry_tokens(&entry)) {
                self.summarize_page(std::mem::take(&mut page), &mut pages, payload)
                    .await?;
            }
            tally.add_entry(&entry);
            page.push(entry);
        }
        self.summarize_page(page, &mut pages, payload).await?;
        let mut summary = pages.summary.ok_or_else(|| {
            JobError::Invalid("a compaction plan with nothing to summarize".to_owned())
        })?;
        summary.calls = pages.calls;
        Ok((summary, tally))
    }

    /// Summarizes one page of a compaction into `pages`, on top of the summary so far.
    async fn summarize_page(
        &self,
        entries: Vec<Entry>,
        pages: &mut PageSummaries,
        payload: &CompactionPayload,
    ) -> Result<(), JobError> {
        if entries.is_empty()
            || (pages.summary.is_some() && !entries.iter().any(|e| e.kind.is_model_visible()))
        {
            // Nothing a model reads: the summary so far stands.
            return Ok(());
        }
        let request = SummaryRequest {
            entries,
            previous_summary: pages.previous.take(),
            instructions: payload.instructions.clone(),
            max_bytes: self.config.summary_max_bytes,
            purpose: Purpose::Compaction,
            lines: Vec::new(),
            context: Vec::new(),
        };
        let page_summary = self.summarizer.summarize(&request).await?;
        pages.calls += page_summary.calls;
        pages.previous = Some(page_summary.text.clone());
        pages.summary = Some(page_summary);
        Ok(())
    }
}

/// A compaction's summary so far, page after page.
struct PageSummaries {
    /// The summary the next page builds on.
    previous: Option<String>,
    calls: u32,
    summary: Option<crate::summarize::Summary>,
}

/// Times a compaction starts over because a snip or an erasure changed its sources.
const MAX_RESTARTS: u32 = 5;

/// Most entries in one summarizer request of a compaction, whatever their tokens.
pub const SUMMARY_PAGE_ENTRIES: usize = 4_096;
