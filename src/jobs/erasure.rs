//! Erasure (`POST /v1/threads/{thread_id}/erasures`): the named entries' content goes from the
//! record and from every copy derived from it, in one transaction, so no read after the answer
//! serves it.
//!
//! In [`erase`]'s transaction, in order:
//! 1. the thread's redaction epoch moves: a tree or compaction job that read before cannot
//!    write after (each checks the epoch where it writes);
//! 2. each entry becomes a tombstone ([`crate::history::Entry::tombstone`]);
//! 3. each compaction summary that covered it, directly or through the summary before it, is
//!    derived again, without a model, from the entries it covered that remain;
//! 4. the summary tree loses it: its line is emptied, the lines of the summaries derived again
//!    are rebuilt from them, and every line that may hold the old text is rebuilt without a
//!    model ([`crate::store::StandIns`]); a tree job summarizes them again later;
//! 5. the receipt is stored.
//!
//! After the commit the caller drops the thread's cached contexts and scrubs the database files
//! ([`crate::store::Store::scrub_storage`]).

use std::collections::HashSet;

use super::compaction::plan::{is_superseded, summary_entry};
use super::tree::LineStandIns;
use super::view_reader::{StoreWindow, ViewReader, WindowShape};
use crate::history::model::{Content, Entry};
use crate::store::{
    Erasure, ErasureTargets, ErasureTx, Store, StoreError, StoredSummary, TenantId, ThreadId,
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

/// Erases the named entries (see the module docs); `cached_contexts` is how many cached contexts
/// the caller dropped, for the receipt. Fails with [`StoreError::NoSuchEntries`] when the thread
/// does not hold one of them; nothing changes then.
pub async fn erase(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    request: ErasureRequest,
    cached_contexts: u64,
) -> Result<Erasure, StoreError> {
    let mut tx = store.begin_erasure(tenant, thread_id).await?;
    tx.count_cached_contexts(cached_contexts);
    let erased = tx.tombstone(&request.targets).await?;
    let seqs: Vec<i64> = erased.iter().filter_map(|entry| entry.seq).collect();
    let leaves: Vec<u64> = seqs.iter().map(|&seq| seq as u64).collect();
    let uuids: HashSet<String> = erased.iter().filter_map(|e| e.uuid.clone()).collect();
    if let Some(&first) = seqs.first() {
        rederive_summaries(store, &mut tx, first, &seqs, &uuids).await?;
    }
    let options = store
        .outline_options_of(&tx.thread_key)
        .await?
        .unwrap_or_default();
    let rewritten = tx.rewritten.clone();
    tx.hide_in_tree(&leaves, &rewritten, &LineStandIns::new(&options))
        .await?;
    tx.commit(seqs, request.reason).await
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
        let thread_key = store.thread_head(&tenant, &thread_id).await?.thread_key;
        let seqs = store.seqs_of_uuids(&thread_key, &named).await?;
        let rewritten = redact_snipped(&store, &tenant, &thread_id, &seqs, &named).await?;
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

/// A snip's redaction: what is derived from the thread stops holding the snipped entries at
/// `seqs` (uuids `uuids`), in one transaction that moves the redaction epoch: the compaction
/// summaries that covered them are derived again without a model, and the outline loses them as
/// an erasure's does. The record keeps them (a snip hides; it does not erase). Returns the
/// outline lines rewritten.
pub async fn redact_snipped(
    store: &Store,
    tenant: &TenantId,
    thread_id: &ThreadId,
    seqs: &[u64],
    uuids: &[String],
) -> Result<u64, StoreError> {
    let mut tx = store.begin_erasure(tenant, thread_id).await?;
    let mut snipped: Vec<i64> = seqs.iter().map(|&seq| seq as i64).collect();
    snipped.sort_unstable();
    let uuids: HashSet<String> = uuids.iter().cloned().collect();
    if let Some(&first) = snipped.first() {
        rederive_summaries(store, &mut tx, first, &snipped, &uuids).await?;
    }
    let options = store
        .outline_options_of(&tx.thread_key)
        .await?
        .unwrap_or_default();
    let rewritten = tx.rewritten.clone();
    tx.hide_in_tree(seqs, &rewritten, &LineStandIns::new(&options))
        .await?;
    tx.commit_redaction().await
}

/// Derives again, without a model, every compaction summary an erased entry reached: a summary
/// at boundary `b` covered every entry before `b` outside its preserved segment (the ones before
/// its window through the summary it folded in). Each is rebuilt from the summary before it (as
/// it now stands) and the entries of its window it covered, less the erased ones.
async fn rederive_summaries(
    store: &Store,
    tx: &mut ErasureTx,
    first_erased: i64,
    erased_seqs: &[i64],
    erased_uuids: &HashSet<String>,
) -> Result<(), StoreError> {
    // Each summary folds in the one before it: read them in order, from the one before the
    // first erased entry.
    let mut previous: Option<String> = None;
    for StoredSummary { boundary, summary } in tx.summaries_from(first_erased).await? {
        let boundary_seq = boundary.seq.unwrap_or_default();
        let Some(summary) = summary.filter(|summary| !summary.is_erased()) else {
            // No summary, or one erased itself: the next folds in nothing before it.
            previous = None;
            continue;
        };
        if boundary_seq <= first_erased {
            previous = summary_text(&summary);
            continue;
        }
        let segment = boundary.preserved_segment();
        let covered =
            |seq: i64| seq < boundary_seq && !segment.is_some_and(|(a, b)| (a..=b).contains(&seq));
        if !erased_seqs.iter().any(|&seq| covered(seq)) {
            previous = summary_text(&summary);
            continue;
        }
        let bounds = store
            .window_bounds_below(&tx.thread_key, boundary_seq)
            .await?;
        let window = StoreWindow {
            store,
            bounds: &bounds,
        };
        let mut reader = ViewReader::new(window, WindowShape::of_bounds(&bounds))
            .await?
            .hiding(erased_uuids);
        let mut text = previous.clone();
        while let Some(page) = reader.next_page().await? {
            let entries: Vec<Entry> = page
                .into_iter()
                .filter(|entry| {
                    let seq = entry.seq.unwrap_or_default();
                    covered(seq) && !is_superseded(entry) && !entry.is_compact_summary
                })
                .collect();
            if entries.is_empty() {
                continue;
            }
            let mut request =
                SummaryRequest::new(entries, Purpose::Compaction, REDERIVED_SUMMARY_BYTES);
            request.previous_summary = text.take();
            text = Some(extract_without_model(&request));
        }
        let text = text.unwrap_or_default();
        tx.rewrite_summary(&summary, &summary_content(&text))
            .await?;
        previous = Some(text);
    }
    Ok(())
}

/// A summary entry's text without the prefix every summary opens with.
fn summary_text(summary: &Entry) -> Option<String> {
    let text = match &summary.message.as_ref()?.content {
        Content::Text(text) => text.clone(),
        Content::Blocks(_) => summary.first_text()?.to_owned(),
    };
    Some(
        text.strip_prefix(super::compaction::SUMMARY_PREFIX)
            .map(str::to_owned)
            .unwrap_or(text),
    )
}

/// The content a summary entry holds for `text`, as a compaction writes it.
fn summary_content(text: &str) -> String {
    summary_entry(text)
        .first_text()
        .unwrap_or_default()
        .to_owned()
}
