//! A compaction plans over its window's view read a page at a time, and reads it again to
//! summarize (see `loupe::jobs::view_reader`): what it summarizes and what it keeps must be the
//! plain plan below (the whole window in memory, the view cut at a round start), for any stored
//! history and any page size.

use futures_util::FutureExt;
use loupe::history::normalize::estimate::entry_features;
use loupe::history::normalize::view;
use loupe::history::{estimate_entry_tokens, group_rounds, Entry};
use loupe::jobs::compaction::SUMMARY_PREFIX;
use loupe::jobs::view_reader::{plan_compaction, ToSummarize, ViewReader};
use proptest::prelude::*;

use crate::chaos;

/// What the plain plan decides.
#[derive(Debug, PartialEq)]
pub struct PlainPlan {
    /// The seqs summarized, in order.
    pub summarized: Vec<Option<i64>>,
    pub pre_tokens: u64,
    pub kept_upper_tokens: u64,
    pub first_kept_seq: Option<i64>,
    pub previous_summary: Option<String>,
    pub rounds: usize,
}

/// The plain plan, written independently of the job's: the whole window's view, cut at the start
/// of the `keep`-th round from the end; `None` when there is nothing to summarize.
pub fn reference_plan(entries: &[Entry], keep: u32) -> Option<PlainPlan> {
    let (indices, _) = view::slice_after_boundary(entries);
    let indices = view::hide_snipped(entries, indices);
    // Tombstones hold nothing to summarize (a boundary's keeps its place).
    let view: Vec<Entry> = indices
        .iter()
        .map(|&i| entries[i].clone())
        .filter(|e| !e.is_erased() || e.is_compact_boundary())
        .collect();
    let rounds = group_rounds(&view);
    if rounds.len() <= keep as usize {
        return None;
    }
    let cut = match keep {
        0 => view.len(),
        keep => rounds[rounds.len() - keep as usize].first_index,
    };
    let superseded = |e: &Entry| e.is_compact_boundary() || e.is_compact_summary;
    let summarized: Vec<&Entry> = view[..cut].iter().filter(|e| !superseded(e)).collect();
    if !summarized.iter().any(|e| e.kind.is_model_visible()) {
        return None;
    }
    let previous: Vec<&str> = view[..cut]
        .iter()
        .filter(|e| e.is_compact_summary)
        .filter_map(|e| e.first_text())
        .map(|text| text.strip_prefix(SUMMARY_PREFIX).unwrap_or(text))
        .collect();
    Some(PlainPlan {
        summarized: summarized.iter().map(|e| e.seq).collect(),
        pre_tokens: view.iter().map(estimate_entry_tokens).sum(),
        kept_upper_tokens: view[cut..]
            .iter()
            .map(|e| entry_features(e).upper_at_default_rates())
            .sum(),
        first_kept_seq: view[cut..].iter().filter_map(|e| e.seq).min(),
        previous_summary: (!previous.is_empty()).then(|| previous.join("\n\n")),
        rounds: rounds.len(),
    })
}

/// The job's plan of `window`, read `page` entries at a time, as a [`PlainPlan`].
fn streamed_plan(window: &[Entry], keep: u32, page: i64) -> Option<PlainPlan> {
    // A window in memory reads through ready futures.
    let mut reader = ViewReader::of_entries(window).with_page_entries(page);
    let plan = plan_compaction(&mut reader, keep)
        .now_or_never()
        .unwrap()
        .unwrap()
        .ok()?;
    let mut entries = ToSummarize::new(reader, &plan);
    let mut summarized = Vec::new();
    while let Some(entry) = entries.next().now_or_never().unwrap().unwrap() {
        summarized.push(entry.seq);
    }
    assert_eq!(summarized.len(), plan.messages_summarized);
    Some(PlainPlan {
        summarized,
        pre_tokens: plan.pre_tokens,
        kept_upper_tokens: plan.kept_upper_tokens,
        first_kept_seq: plan.first_kept_seq,
        previous_summary: plan.previous_summary,
        rounds: plan.rounds,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn planning_a_page_at_a_time_equals_planning_over_the_whole_window(
        entries in chaos::chaotic_history(),
        keep in 0u32..5,
        page in 1i64..9,
    ) {
        prop_assert_eq!(streamed_plan(&entries, keep, page), reference_plan(&entries, keep));
    }
}
