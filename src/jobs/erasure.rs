//! Erasure (`POST /v1/threads/{thread_id}/erasures`): the named entries' content goes from the
//! record and from every copy derived from it, in one transaction, so no read after the answer
//! serves it. A snip's redaction is the same without the tombstones.
//!
//! First the plan, read with no transaction open (the thread's epoch first, then what is erased
//! and every compaction summary it reached, each derived again without a model from what
//! remains). Then one transaction, which uses its own connection only (so erasures waiting on
//! the thread's row never starve it of the pool):
//! 1. the thread's redaction epoch moves, if it is still the plan's: a snip or erasure since
//!    sends the plan back (as does a compaction written since, found by its summary); a tree or
//!    compaction job that read before cannot write after (each checks the epoch where it
//!    writes);
//! 2. each entry becomes a tombstone ([`crate::history::Entry::tombstone`]);
//! 3. the summaries the plan derived again replace theirs, in place;
//! 4. the summary tree loses the entries: their lines are emptied, the lines of the summaries
//!    derived again are rebuilt from them, and every line that may hold the old text is rebuilt
//!    without a model ([`crate::store::StandIns`]); a tree job summarizes them again later;
//! 5. the receipt is stored.
//!
//! After the commit the caller drops the thread's cached contexts and queues the scrub of the
//! database files ([`crate::store::Store::queue_scrub`]).

use std::collections::{HashMap, HashSet};

use super::compaction::plan::{is_superseded, summary_entry, PageCutter};
use super::tree::LineStandIns;
use super::view_reader::{StoreWindow, ViewReader, WindowShape};
use crate::history::estimate_entry_tokens;
use crate::history::ledger::{without_footer, Tally};
use crate::history::model::Entry;
use crate::store::{
    Erasure, ErasureRead, ErasureTargets, ErasureTx, Store, StoreError, TenantId, ThreadId,
    ThreadKey,
};
use crate::summarize::{extract_without_model, Purpose, SummaryRequest};

/// What to erase, and why (the reason is kept in the receipt, never the content).
#[derive(Debug, Clone)]
pub struct ErasureRequest {
    pub targets: ErasureTargets,
    pub reason: Option<String>,
}

/// The byte budget of a summary derived again without a model: a compaction's.
const REDERIVED_SUMMARY_BYTES: usize = super::JobsConfig::DEFAULT.summary_max_bytes;

/// Times a plan is read again because the thread changed before its transaction began.
const PLAN_ATTEMPTS: u32 = 5;

/// What becomes of the compaction summaries that covered the entries that go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Summaries {
    /// Derived again without them (an erasure, a snip's redaction).
    Rederive,
    /// Kept as they are: a retention trim keeps the summary of the history it erases (and
    /// reports itself as `trimmed`).
    Keep,
}

/// What an erasure or a redaction will write, read before its transaction.
struct Plan {
    summaries: Summaries,
    read: ErasureRead,
    /// The seqs and uuids taken out, in seq order.
    seqs: Vec<i64>,
    /// The seqs of the rows the plan read summaries from: the transaction finds the same.
    summary_rows: Vec<i64>,
    /// Each summary derived again, and its new text.
    rewrites: Vec<(Entry, String)>,
    stand_ins: LineStandIns,
}

impl Plan {
    async fn read(
        store: &Store,
        tenant: &TenantId,
        thread_id: &ThreadId,
        targets: &ErasureTargets,
        must_exist: bool,
        summaries: Summaries,
    ) -> Result<Plan, StoreError> {
        // The epoch first: whatever changes the thread's text after it moves it.
        let read = store.erasure_read(tenant, thread_id).await?;
        let named = store
            .entries_named(&read.thread_key, targets, must_exist)
            .await?;
        let seqs: Vec<i64> = named.iter().map(|(seq, _)| *seq).collect();
        let uuids: HashSet<String> = named.into_iter().map(|(_, uuid)| uuid).collect();
        let (summary_rows, rewrites) = match summaries {
            Summaries::Keep => (Vec::new(), Vec::new()),
            Summaries::Rederive => {
                let first = seqs.first().copied().unwrap_or(i64::MAX);
                let rows = store.summary_rows(&read.thread_key, first).await?;
                let rewrites =
                    rederive_summaries(store, &read, rows.entries, &seqs, &uuids).await?;
                (rows.candidates, rewrites)
            }
        };
        let options = store
            .outline_options_of(&read.thread_key)
            .await?
            .unwrap_or_default();
        Ok(Plan {
            summaries,
            read,
            seqs,
            summary_rows,
            rewrites,
            stand_ins: LineStandIns::new(&options),
        })
    }

    /// Opens the plan's transaction: `None` when the thread changed since the plan was read.
    async fn begin(
        &self,
        store: &Store,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<Option<ErasureTx>, StoreError> {
        let mut tx = match store.begin_erasure(tenant, thread_id, &self.read).await {
            Err(StoreError::SourcesChanged) => return Ok(None),
            other => other?,
        };
        let first = self.seqs.first().copied().unwrap_or(i64::MAX);
        if self.summaries == Summaries::Rederive
            && tx.summary_candidates(first).await? != self.summary_rows
        {
            // A compaction wrote a summary since: it may quote what goes.
            return Ok(None);
        }
        Ok(Some(tx))
    }

    /// Writes the plan's summaries and outline lines in `tx`.
    async fn write_derived(&self, tx: &mut ErasureTx) -> Result<(), StoreError> {
        let mut rewritten = Vec::with_capacity(self.rewrites.len());
        for (summary, text) in &self.rewrites {
            tx.rewrite_summary(summary, &summary_content(text)).await?;
            rewritten.extend(summary.seq.map(|seq| seq as u64));
        }
        tx.forget_searched(&self.seqs).await?;
        let leaves: Vec<u64> = self.seqs.iter().map(|&seq| seq as u64).collect();
        tx.hide_in_tree(&leaves, &rewritten, &self.stand_ins).await
    }
}

/// Erases the named entries (see the module docs); `cached_contexts` is how many cached contexts
/// the caller dropped, for the receipt. Fails with [`StoreError::NoSuchEntries`] when the thread
/// does not hold one of them (nothing changes then), and with [`StoreError::SourcesChanged`]
/// when the thread kept changing under its plan.
pub async fn erase(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    request: ErasureRequest,
    cached_contexts: u64,
) -> Result<Erasure, StoreError> {
    erase_keyed(
        store,
        tenant,
        thread_id,
        None,
        request,
        cached_contexts,
        Summaries::Rederive,
    )
    .await
}

/// [`erase`] in the thread named `thread_id` only while it is the thread `key` (else
/// [`StoreError::ThreadNotFound`]): a fork reached by its key is never confused with a thread
/// that took its id after it was deleted.
async fn erase_keyed(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    key: Option<&ThreadKey>,
    request: ErasureRequest,
    cached_contexts: u64,
    summaries: Summaries,
) -> Result<Erasure, StoreError> {
    let _turn = store.erasure_turn(tenant, thread_id).await;
    for _ in 0..PLAN_ATTEMPTS {
        let plan = Plan::read(store, tenant, thread_id, &request.targets, true, summaries).await?;
        if key.is_some_and(|key| *key != plan.read.thread_key) {
            return Err(StoreError::ThreadNotFound);
        }
        let Some(mut tx) = plan.begin(store, tenant, thread_id).await? else {
            continue;
        };
        tx.count_cached_contexts(cached_contexts);
        if summaries == Summaries::Keep {
            tx.report_as_trim();
        }
        tx.tombstone(&plan.seqs).await?;
        plan.write_derived(&mut tx).await?;
        let erasure = tx.commit(plan.seqs.clone(), request.reason).await?;
        store.changes().changed(tenant, thread_id);
        // The erasure is committed, whatever happens to the count: a fault here leaves the old
        // count (high, never low: an erasure only takes content out) until the thread's next
        // erasure or settings change counts it again.
        if let Err(error) = store.recount_after_erasure(tenant, thread_id).await {
            tracing::warn!(%error, "the erased thread's token count was not recounted");
        }
        return Ok(erasure);
    }
    Err(StoreError::SourcesChanged)
}

/// Why a retention trim's receipt says its entries went.
pub const TRIM_REASON: &str = "retention: before the last compact boundary";

/// Erases, for a retention policy that keeps only what follows the last compact boundary, the
/// entries at `seqs` of the thread `key` (all before its context window): as an erasure does
/// (tombstones, search rows, outline lines, a receipt, an event: `trimmed`), except that the
/// compaction summaries stay as they are: they are what the policy keeps of that history. Nor
/// does it reach forks, which have retention of their own.
pub async fn trim(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    key: &ThreadKey,
    seqs: &[i64],
) -> Result<Erasure, StoreError> {
    let request = ErasureRequest {
        targets: ErasureTargets {
            uuids: Vec::new(),
            seqs: seqs.to_vec(),
        },
        reason: Some(TRIM_REASON.to_owned()),
    };
    erase_keyed(
        store,
        tenant,
        thread_id,
        Some(key),
        request,
        0,
        Summaries::Keep,
    )
    .await
}

/// Erases in every fork of the tenant's thread `parent` (and in their forks, and so on) the
/// entries of `seqs` that the fork took from it: what was erased in a thread is gone from every
/// copy made of it. A fork deleted on the way hands its forks to its parent (`delete_thread`),
/// so each thread's forks are listed again until no new one comes. A fork whose taken entries
/// are all erased already (a retried erasure) is passed over, and so is one deleted meanwhile.
/// Returns each fork's erasure.
pub async fn erase_in_forks(
    store: &Store,
    tenant: &TenantId,
    parent: &ThreadKey,
    seqs: &[i64],
    reason: &str,
) -> Result<Vec<(ThreadId, Erasure)>, StoreError> {
    let mut erased = Vec::new();
    let mut seen: HashSet<ThreadKey> = HashSet::new();
    let mut reached = vec![(parent.clone(), seqs.to_vec())];
    while let Some((thread_key, seqs)) = reached.pop() {
        loop {
            let forks: Vec<_> = store
                .forks_of(tenant, &thread_key)
                .await?
                .into_iter()
                .filter(|fork| !seen.contains(&fork.thread_key))
                .collect();
            if forks.is_empty() {
                break;
            }
            for fork in forks {
                seen.insert(fork.thread_key.clone());
                let taken: Vec<i64> = seqs
                    .iter()
                    .copied()
                    .filter(|&seq| seq < fork.at_seq)
                    .collect();
                if taken.is_empty() {
                    continue;
                }
                reached.push((fork.thread_key.clone(), taken.clone()));
                if store.all_erased(&fork.thread_key, &taken).await? {
                    continue;
                }
                let request = ErasureRequest {
                    targets: ErasureTargets {
                        uuids: Vec::new(),
                        seqs: taken,
                    },
                    reason: Some(reason.to_owned()),
                };
                match erase_keyed(
                    store,
                    tenant,
                    &fork.thread_id,
                    Some(&fork.thread_key),
                    request,
                    0,
                    Summaries::Rederive,
                )
                .await
                {
                    Ok(erasure) => erased.push((fork.thread_id, erasure)),
                    // Deleted meanwhile: its forks are its parent's now, listed again above.
                    Err(StoreError::ThreadNotFound) => {}
                    Err(error) => return Err(error),
                }
            }
        }
    }
    Ok(erased)
}

/// Most threads a receipt names as still holding copies of what it erased: past them it says
/// there are more, and stops looking (a thread forked by thousands is walked no further).
pub const MAX_HOLDERS_NAMED: usize = 1_000;

/// The threads still holding copies of what an erasure took out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldElsewhere {
    /// Their ids: the thread's ancestors that hold them first (nearest first), then the other
    /// forks of those ancestors (and their forks) that copied them.
    pub thread_ids: Vec<ThreadId>,
    /// Whether more hold them than the [`MAX_HOLDERS_NAMED`] named.
    pub truncated: bool,
}

/// The tenant's threads that hold, not yet erased, copies of the entries at `seqs` of the thread
/// `thread_key`, outside that thread and the forks below it (which [`erase_in_forks`] reaches):
/// the thread it was forked from holds those with a seq below where it was copied, and so on
/// up, and every other fork of those threads holds those it copied too. An erasure does not go
/// up the lineage (the parent is another thread, perhaps another user's, which the caller did
/// not name): its receipt names them, and an erasure in the topmost reaches the rest.
pub async fn held_elsewhere(
    store: &Store,
    tenant: &TenantId,
    thread_key: &ThreadKey,
    seqs: &[i64],
) -> Result<HeldElsewhere, StoreError> {
    let mut seen: HashSet<ThreadKey> = HashSet::from([thread_key.clone()]);
    // Up: each ancestor holds what lies below where its child copied.
    let mut holders: Vec<(ThreadId, ThreadKey, Vec<i64>)> = Vec::new();
    let (mut current, mut pending) = (thread_key.clone(), seqs.to_vec());
    while let Some(parent) = store.copied_from(tenant, &current).await? {
        pending.retain(|&seq| seq < parent.below_seq);
        if pending.is_empty() || !seen.insert(parent.thread_key.clone()) {
            break;
        }
        holders.push((parent.thread_id, parent.thread_key.clone(), pending.clone()));
        current = parent.thread_key;
    }
    // Then across: their other forks, and the forks of those, by what each copied. The
    // thread itself is seen, so its own forks are not walked.
    let (mut walked, mut cut) = (0, false);
    while walked < holders.len() {
        let (_, key, seqs) = holders[walked].clone();
        walked += 1;
        for fork in store.forks_of(tenant, &key).await? {
            if seen.contains(&fork.thread_key) {
                continue;
            }
            let taken: Vec<i64> = seqs.iter().copied().filter(|&s| s < fork.at_seq).collect();
            if !taken.is_empty() {
                seen.insert(fork.thread_key.clone());
                holders.push((fork.thread_id, fork.thread_key, taken));
            }
        }
        if holders.len() > MAX_HOLDERS_NAMED * 2 {
            cut = walked < holders.len();
            break;
        }
    }
    let mut held = HeldElsewhere {
        thread_ids: Vec::new(),
        truncated: cut,
    };
    for (thread_id, key, seqs) in holders {
        // A copy erased there already (by an erasure of its own) holds nothing.
        if store.all_erased(&key, &seqs).await? {
            continue;
        }
        if held.thread_ids.len() == MAX_HOLDERS_NAMED {
            held.truncated = true;
            break;
        }
        held.thread_ids.push(thread_id);
    }
    Ok(held)
}

/// Applies the snips among `appended` (entries just stored in the tenant's thread, or found
/// stored by a retry) to what is derived from the thread before the append is answered: the
/// lines of the messages they name go, the lines that may quote them become stand-ins built
/// without a model, and compaction summaries that covered them are derived again without them
/// ([`redact_snipped`]). A thread with no snip among `appended` is not touched.
/// Returns the lines rewritten.
pub async fn hide_snipped(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    appended: &[Entry],
) -> Result<u64, StoreError> {
    let named: Vec<String> = crate::history::normalize::view::snipped_uuids(appended)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if named.is_empty() {
        return Ok(0);
    }
    // On a task of its own: a caller that goes away (a client disconnecting after the snip was
    // stored) does not stop the redaction halfway.
    let (store, tenant, thread_id) = (store.clone(), tenant.clone(), thread_id.clone());
    let redaction = tokio::spawn(async move {
        let rewritten = redact_snipped(&store, &tenant, &thread_id, named).await?;
        if rewritten > 0 {
            // The tree job summarizes the stand-ins again with the thread's summarizer.
            store.enqueue_tree(&tenant, &thread_id).await?;
        }
        Ok(rewritten)
    });
    redaction
        .await
        .map_err(|error| StoreError::Corrupt(format!("the snip's redaction stopped: {error}")))?
}

/// A snip's redaction: what is derived from the thread stops holding the entries with the
/// snipped `uuids` (those it holds), in one transaction that moves the redaction epoch: the compaction summaries that
/// covered them are derived again without a model, and the outline loses them as an erasure's
/// does. The record keeps them (a snip hides; it does not erase). Returns the outline lines
/// rewritten.
pub async fn redact_snipped(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    uuids: Vec<String>,
) -> Result<u64, StoreError> {
    let targets = ErasureTargets {
        uuids,
        seqs: Vec::new(),
    };
    let _turn = store.erasure_turn(tenant, thread_id).await;
    for _ in 0..PLAN_ATTEMPTS {
        let plan = Plan::read(
            store,
            tenant,
            thread_id,
            &targets,
            false,
            Summaries::Rederive,
        )
        .await?;
        let Some(mut tx) = plan.begin(store, tenant, thread_id).await? else {
            continue;
        };
        plan.write_derived(&mut tx).await?;
        return tx.commit_redaction().await;
    }
    Err(StoreError::SourcesChanged)
}

/// Derives again, without a model, every compaction summary an entry at `seqs` reached, in seq
/// order, from `summaries` (the boundaries and summaries from the last boundary at or before the
/// first of them on). A summary after boundary `b` covered every entry before `b` outside its
/// preserved segment (those before its window through the summary it folded in: the last one
/// before `b`); one with no boundary before it covered everything before it. Each reached is
/// rebuilt from the summary before it (as it now stands) and the entries of its window it
/// covered, less the ones taken out (`seqs`, `uuids`).
async fn rederive_summaries(
    store: &Store,
    read: &ErasureRead,
    summaries: Vec<Entry>,
    seqs: &[i64],
    uuids: &HashSet<String>,
) -> Result<Vec<(Entry, String)>, StoreError> {
    let mut rewrites = Vec::new();
    // Each summary's text as it will stand, by seq, and those rebuilt.
    let mut texts: Vec<(i64, String)> = Vec::new();
    let mut rebuilt: HashSet<i64> = HashSet::new();
    // What each boundary's summaries are rebuilt to (computed once per boundary).
    let mut by_boundary: HashMap<Option<i64>, Option<String>> = HashMap::new();
    let mut boundary: Option<Entry> = None;
    for entry in summaries {
        if entry.is_compact_boundary() {
            boundary = Some(entry);
            continue;
        }
        let seq = entry.seq.unwrap_or_default();
        if entry.is_erased() || seqs.contains(&seq) {
            // Going itself: the next summary folds in nothing of it.
            continue;
        }
        let boundary_seq = boundary.as_ref().and_then(|b| b.seq);
        let end = boundary_seq.unwrap_or(seq);
        let segment = boundary.as_ref().and_then(Entry::preserved_segment);
        let covered =
            |s: i64| s < end && !segment.is_some_and(|(first, last)| (first..=last).contains(&s));
        // The summary it folded in: the last one before its boundary.
        let previous = boundary_seq.and_then(|b| texts.iter().rev().find(|(s, _)| *s < b));
        let reached =
            seqs.iter().any(|&s| covered(s)) || previous.is_some_and(|(s, _)| rebuilt.contains(s));
        if !reached {
            texts.extend(summary_text(&entry).map(|text| (seq, text)));
            continue;
        }
        let previous = previous.map(|(_, text)| text.clone());
        let text = match by_boundary.get(&boundary_seq) {
            Some(text) => text.clone(),
            None => {
                let text = summarize_covered(store, read, end, previous, &covered, uuids).await?;
                by_boundary.insert(boundary_seq, text.clone());
                text
            }
        };
        let text = text.unwrap_or_default();
        rebuilt.insert(seq);
        texts.push((seq, without_footer(&text).to_owned()));
        rewrites.push((entry, text));
    }
    Ok(rewrites)
}

/// The summary, without a model, of `previous` and the entries of the window that ended at
/// `end` which `covered` holds, less those with `uuids`; read a page at a time and summarized in
/// pages as a compaction's are. `None` when there is nothing to summarize.
async fn summarize_covered(
    store: &Store,
    read: &ErasureRead,
    end: i64,
    previous: Option<String>,
    covered: &(dyn Fn(i64) -> bool + Sync),
    uuids: &HashSet<String>,
) -> Result<Option<String>, StoreError> {
    // Unbounded: a window a client's own boundary left longer than a context read's bound is
    // still read, a page at a time.
    let bounds = store.window_bounds_below(&read.thread_key, end).await?;
    let window = StoreWindow {
        store,
        bounds: &bounds,
    };
    let mut reader = ViewReader::new(window, WindowShape::of_bounds(&bounds))
        .await?
        .hiding(uuids);
    let mut cutter = PageCutter::new(
        super::JobsConfig::DEFAULT.compaction_page_tokens,
        super::compaction::SUMMARY_PAGE_ENTRIES,
    );
    let mut text = previous;
    let mut tally = Tally::default();
    let mut page: Vec<Entry> = Vec::new();
    let summarize = |page: Vec<Entry>, text: Option<String>| {
        if page.is_empty() {
            return text;
        }
        let mut request = SummaryRequest::new(page, Purpose::Compaction, REDERIVED_SUMMARY_BYTES);
        request.previous_summary = text;
        Some(extract_without_model(&request))
    };
    while let Some(entries) = reader.next_page().await? {
        for entry in entries {
            let seq = entry.seq.unwrap_or_default();
            if !covered(seq) || is_superseded(&entry) || entry.is_compact_summary {
                continue;
            }
            if cutter.starts_page(estimate_entry_tokens(&entry)) {
                text = summarize(std::mem::take(&mut page), text);
            }
            tally.add_entry(&entry);
            page.push(entry);
        }
    }
    // The footer is derived again with the text: it names only what the kept entries said.
    Ok(summarize(page, text).map(|text| format!("{text}{}", tally.footer(&text))))
}

/// A summary entry's text without the prefix every summary opens with.
fn summary_text(summary: &Entry) -> Option<String> {
    let text = summary.first_text()?;
    let prefix = super::compaction::SUMMARY_PREFIX;
    let text = text.strip_prefix(prefix).unwrap_or(text);
    Some(without_footer(text).to_owned())
}

/// The content a summary entry holds for `text`, as a compaction writes it.
fn summary_content(text: &str) -> String {
    summary_entry(text)
        .first_text()
        .unwrap_or_default()
        .to_owned()
}
