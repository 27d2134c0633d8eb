//! The compaction job: summarize the current context up to a round boundary and append, in one
//! write, a compact boundary and the summary. The kept rounds are referenced by the boundary's
//! `preserved_segment`, never copied.
//!
//! The job reads the thread, calls the summarizer with no transaction open, then writes the
//! boundary and the summary atomically with the job's completion (fenced by its lease). Entries
//! appended while the summarizer ran lie between the read and the new boundary; the preserved
//! segment runs up to the seq just before the boundary, so they stay in the context, in order.

use serde_json::{json, Value};

use crate::history::model::{subtype, ApiMessage, Content, Entry, EntryKind, Role};
use crate::history::normalize::view;
use crate::history::{estimate_entry_tokens, group_rounds};

/// The first words of the summary message (`docs/NORMALIZATION.md` § Compaction).
pub const SUMMARY_PREFIX: &str = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\n";

pub use crate::store::{CompactionPayload, DEFAULT_KEEP_RECENT_ROUNDS};

/// Where to cut the current context, computed from the entries the store returned for it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// The entries to summarize: the view before the cut, without boundaries and old summaries
    /// (as given: whole entries, or the skeletons a job plans over).
    pub to_summarize: Vec<Entry>,
    /// The token estimate of each entry to summarize, in the same order.
    pub to_summarize_tokens: Vec<u64>,
    /// The text of the summary the previous compaction wrote (without its prefix).
    pub previous_summary: Option<String>,
    /// The seq of the first kept entry; `None` when no round is kept.
    pub first_kept_seq: Option<i64>,
    /// Estimated tokens of the current context (the boundary's `pre_tokens`).
    pub pre_tokens: u64,
    /// Estimated tokens of the kept rounds.
    pub kept_tokens: u64,
    pub rounds: usize,
}

/// Why there is nothing to compact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NothingToSummarize {
    pub rounds: usize,
    pub keep_recent_rounds: u32,
}

/// Plans a compaction of the current view of `entries` (as [`crate::store::Store::context_window`]
/// returns them), keeping the last `keep_recent_rounds` rounds. The cut is always at a round
/// start. Older boundaries and summaries inside the view are never kept (the view skips them in a
/// preserved range; see [`view::slice_after_boundary`]); the previous summary is folded in.
pub fn plan(
    entries: Vec<Entry>,
    keep_recent_rounds: u32,
) -> Result<CompactionPlan, NothingToSummarize> {
    let tokens: Vec<u64> = entries.iter().map(estimate_entry_tokens).collect();
    plan_with_tokens(entries, &tokens, keep_recent_rounds)
}

/// [`plan`], with each entry's token estimate given beside it (`tokens[i]` for `entries[i]`),
/// so that it can plan over [`skeleton`]s of a window read a page at a time.
///
/// It consumes the window and moves the entries to summarize out of it: a window can be large,
/// and a copy of it would be a second one in memory for the whole of the summarizer's run.
pub fn plan_with_tokens(
    entries: Vec<Entry>,
    tokens: &[u64],
    keep_recent_rounds: u32,
) -> Result<CompactionPlan, NothingToSummarize> {
    assert_eq!(entries.len(), tokens.len(), "one estimate per entry");
    let (indices, _) = view::slice_after_boundary(&entries);
    let indices = view::hide_snipped(&entries, indices);
    let view_tokens: Vec<u64> = indices.iter().map(|&i| tokens[i]).collect();
    let mut view = take_in_order(entries, &indices);
    let rounds = group_rounds(&view);
    let nothing = NothingToSummarize {
        rounds: rounds.len(),
        keep_recent_rounds,
    };
    let keep = keep_recent_rounds as usize;
    if rounds.len() <= keep {
        return Err(nothing);
    }
    let cut = if keep == 0 {
        view.len()
    } else {
        rounds[rounds.len() - keep].first_index
    };
    let rounds = rounds.len();
    let kept = view.split_off(cut);
    let superseded = |e: &Entry| e.is_compact_boundary() || e.is_compact_summary;
    let previous: Vec<String> = view
        .iter()
        .filter(|e| e.is_compact_summary)
        .filter_map(|e| e.first_text())
        .map(|text| text.strip_prefix(SUMMARY_PREFIX).unwrap_or(text).to_owned())
        .collect();
    let mut to_summarize_tokens = Vec::with_capacity(view.len());
    let mut at = 0;
    view.retain(|e| {
        let summarized = !superseded(e);
        if summarized {
            to_summarize_tokens.push(view_tokens[at]);
        }
        at += 1;
        summarized
    });
    let to_summarize = view;
    if !to_summarize.iter().any(|e| e.kind.is_model_visible()) {
        return Err(nothing);
    }
    Ok(CompactionPlan {
        to_summarize,
        to_summarize_tokens,
        previous_summary: (!previous.is_empty()).then(|| previous.join("\n\n")),
        first_kept_seq: kept.iter().filter_map(|e| e.seq).min(),
        pre_tokens: view_tokens.iter().sum(),
        kept_tokens: view_tokens[cut..].iter().sum(),
        rounds,
    })
}

/// The entries at `indices` (distinct), in that order, moved out of `entries`: in place when the
/// indices ascend, as they do unless a preserved segment comes first.
fn take_in_order(mut entries: Vec<Entry>, indices: &[usize]) -> Vec<Entry> {
    debug_assert!(
        {
            let mut seen = std::collections::HashSet::new();
            indices.iter().all(|i| seen.insert(*i))
        },
        "a view names each entry once"
    );
    if indices.windows(2).all(|pair| pair[0] < pair[1]) {
        let mut wanted = vec![false; entries.len()];
        for &i in indices {
            wanted[i] = true;
        }
        let mut at = 0;
        entries.retain(|_| {
            at += 1;
            wanted[at - 1]
        });
        return entries;
    }
    let mut window: Vec<Option<Entry>> = entries.into_iter().map(Some).collect();
    indices.iter().filter_map(|&i| window[i].take()).collect()
}

/// What [`plan_with_tokens`] reads of an entry, and nothing else: the message's content and the
/// fields Loupe does not model are dropped, except on a compaction's summary, whose text is
/// folded into the next one. A window of skeletons is a small fraction of the window it stands
/// for, so a compaction can plan over a window of any length and then read only a page of
/// bodies at a time.
pub fn skeleton(mut entry: Entry) -> Entry {
    if !entry.is_compact_summary {
        if let Some(message) = entry.message.as_mut() {
            message.content = Content::Blocks(Vec::new());
            message.usage = None;
            message.extra = Default::default();
        }
        entry.content = None;
        entry.extra = Default::default();
        entry.sent = None;
    }
    entry
}

/// Cuts the entries to summarize, given by their token estimates in order, into pages of at most
/// `max_tokens` (and `max_entries`) each: the ranges of each page. An entry larger than a page is
/// a page of its own; an entry of no tokens (one the model never reads) never starts a page on
/// account of tokens, so it stays with what came before it. One page when everything fits.
pub fn summary_pages(
    tokens: &[u64],
    max_tokens: u64,
    max_entries: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut pages = Vec::new();
    let (mut start, mut sum) = (0, 0u64);
    for (i, &t) in tokens.iter().enumerate() {
        let over = t > 0 && sum + t > max_tokens;
        let full = i > start && (over || i - start >= max_entries);
        if full {
            pages.push(start..i);
            (start, sum) = (i, 0);
        }
        sum += t;
    }
    if start < tokens.len() {
        pages.push(start..tokens.len());
    }
    pages
}

/// What the boundary records besides its position.
#[derive(Debug, Clone)]
pub struct BoundaryInfo<'a> {
    pub trigger: &'a str,
    pub pre_tokens: u64,
    pub messages_summarized: usize,
    pub summarizer: &'a str,
    pub job_id: &'a str,
    /// The preserved segment `[first_seq, last_seq]`, when anything is kept.
    pub preserved: Option<(i64, i64)>,
}

/// The `compact_boundary` system entry.
pub fn boundary_entry(info: &BoundaryInfo<'_>) -> Entry {
    let mut metadata = json!({
        "trigger": info.trigger,
        "pre_tokens": info.pre_tokens,
        "messages_summarized": info.messages_summarized,
        "summarizer": info.summarizer,
        "job_id": info.job_id,
    });
    if let Some((first, last)) = info.preserved {
        metadata["preserved_segment"] = json!({"first_seq": first, "last_seq": last});
    }
    Entry {
        subtype: Some(subtype::COMPACT_BOUNDARY.to_owned()),
        content: Some(Value::String("Conversation compacted".to_owned())),
        compact_metadata: Some(metadata),
        ..Entry::new(EntryKind::System)
    }
}

/// The summary as a user message with `is_compact_summary` (`docs/NORMALIZATION.md` § Compaction).
pub fn summary_entry(summary: &str) -> Entry {
    Entry {
        message: Some(ApiMessage::new(
            Role::User,
            Content::Text(format!("{SUMMARY_PREFIX}{summary}")),
        )),
        is_compact_summary: true,
        ..Entry::new(EntryKind::User)
    }
}

/// The preserved segment of a boundary written at `boundary_seq`: from the first kept entry (or,
/// when no round is kept, from the first entry appended while the job ran) up to the entry just
/// before the boundary. `None` when that range is empty.
pub fn preserved_segment(
    first_kept_seq: Option<i64>,
    read_next_seq: i64,
    boundary_seq: i64,
) -> Option<(i64, i64)> {
    let first = first_kept_seq.unwrap_or(read_next_seq);
    let last = boundary_seq - 1;
    (first <= last).then_some((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: Value) -> Entry {
        serde_json::from_value(v).unwrap()
    }

    fn user(seq: i64, text: &str) -> Entry {
        entry(json!({"seq": seq, "type": "user", "message": {"role": "user", "content": text}}))
    }

    fn asst(seq: i64, id: &str) -> Entry {
        entry(json!({"seq": seq, "type": "assistant",
            "message": {"role": "assistant", "id": id, "content": [{"type": "text", "text": "ok"}]}}))
    }

    #[test]
    fn cuts_at_a_round_start_and_keeps_the_last_rounds() {
        let e = vec![
            user(0, "a"),
            asst(1, "A"),
            user(2, "b"),
            asst(3, "B"),
            user(4, "c"),
            asst(5, "C"),
        ];
        // Rounds: [0,1,2], [3,4], [5].
        let p = plan(e.clone(), 2).unwrap();
        assert_eq!(p.rounds, 3);
        assert_eq!(p.first_kept_seq, Some(3));
        assert_eq!(
            p.to_summarize
                .iter()
                .map(|e| e.seq.unwrap())
                .collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(
            plan(e.clone(), 3),
            Err(NothingToSummarize {
                rounds: 3,
                keep_recent_rounds: 3
            })
        );
        let all = plan(e.clone(), 0).unwrap();
        assert_eq!((all.to_summarize.len(), all.first_kept_seq), (6, None));
    }

    #[test]
    fn a_second_compaction_folds_the_first_summary_and_skips_the_old_boundary() {
        let mut b = boundary_entry(&BoundaryInfo {
            trigger: "manual",
            pre_tokens: 0,
            messages_summarized: 2,
            summarizer: "extractive",
            job_id: "j",
            preserved: Some((3, 5)),
        });
        b.seq = Some(6);
        let mut s = summary_entry("FIRST");
        s.seq = Some(7);
        let e = vec![
            asst(3, "B"),
            user(4, "c"),
            asst(5, "C"),
            b,
            s,
            user(8, "d"),
            asst(9, "D"),
            user(10, "e"),
        ];
        // View: 6, 7, 3, 4, 5, 8, 9, 10 — rounds [6,7] (no assistant yet: joins the first),
        // then [3,4], [5,8], [9,10].
        let p = plan(e.clone(), 2).unwrap();
        assert_eq!(p.previous_summary.as_deref(), Some("FIRST"));
        assert_eq!(p.first_kept_seq, Some(5));
        assert_eq!(
            p.to_summarize
                .iter()
                .map(|e| e.seq.unwrap())
                .collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(preserved_segment(p.first_kept_seq, 11, 12), Some((5, 11)));
    }

    #[test]
    fn summary_pages_fill_up_to_the_bound_and_never_split_an_entry() {
        assert_eq!(
            summary_pages(&[], 10, 100),
            Vec::<std::ops::Range<usize>>::new()
        );
        assert_eq!(summary_pages(&[3, 3, 3], 10, 100), vec![(0..3)]);
        assert_eq!(summary_pages(&[4, 4, 4, 4], 8, 100), [0..2, 2..4]);
        // An entry over the bound is a page of its own; pages never come out empty.
        assert_eq!(summary_pages(&[2, 50, 2, 2], 8, 100), [0..1, 1..2, 2..4]);
        // Entries of no tokens stay with the page before them, even after a large entry.
        assert_eq!(summary_pages(&[2, 50, 0, 0], 8, 100), [0..1, 1..4]);
        assert_eq!(summary_pages(&[6, 0, 3], 8, 100), [0..2, 2..3]);
        assert_eq!(summary_pages(&[50], 8, 100), vec![(0..1)]);
        // The entry count bounds a page too.
        assert_eq!(summary_pages(&[0; 5], 8, 2), [0..2, 2..4, 4..5]);
    }

    #[test]
    fn a_skeleton_keeps_what_planning_reads_and_a_summary_whole() {
        let mut tool = asst(1, "A");
        tool.extra.insert("progress".into(), json!({"a": 1}));
        let bare = skeleton(tool.clone());
        assert_eq!(bare.response_id(), Some("A"));
        assert_eq!((bare.seq, bare.kind), (Some(1), EntryKind::Assistant));
        assert!(bare.extra.is_empty());
        assert_eq!(bare.first_text(), None);
        let mut summary = summary_entry("FIRST");
        summary.seq = Some(2);
        assert_eq!(skeleton(summary.clone()), summary);
    }

    #[test]
    fn the_preserved_segment_covers_what_was_appended_during_the_job() {
        assert_eq!(preserved_segment(Some(4), 10, 12), Some((4, 11)));
        assert_eq!(preserved_segment(None, 10, 12), Some((10, 11)));
        assert_eq!(preserved_segment(None, 10, 10), None);
    }
}
