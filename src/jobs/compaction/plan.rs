//! The compaction's pure plan: where the cut goes (a round start, the last rounds kept,
//! [`PlanScan`] over the view fed an entry at a time), the pages the summary is built from
//! ([`PageCutter`]), and the boundary and summary entries it writes.

use std::collections::VecDeque;

use serde_json::{json, Value};

use crate::history::ledger::without_footer;
use crate::history::model::{subtype, ApiMessage, Content, Entry, EntryKind, Role};
use crate::history::normalize::estimate::entry_features;

/// The first words of the summary message (`docs/NORMALIZATION.md` § Compaction).
pub const SUMMARY_PREFIX: &str = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\n";

pub use crate::store::{CompactionPayload, DEFAULT_KEEP_RECENT_ROUNDS};

/// Where to cut the current context, planned over its view read in order (see [`PlanScan`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// How many entries of the view lie before the cut. The ones summarized are these, without
    /// boundaries and old summaries.
    pub cut: usize,
    /// How many entries are summarized.
    pub messages_summarized: usize,
    /// The text of the summary the previous compaction wrote (without its prefix).
    pub previous_summary: Option<String>,
    /// The seq of the first kept entry; `None` when no round is kept.
    pub first_kept_seq: Option<i64>,
    /// Estimated tokens of the current context (the boundary's `pre_tokens`).
    pub pre_tokens: u64,
    /// The kept rounds at the upper bound of the default rates: what the thread's stored count
    /// (the automatic compaction trigger's) counts them as.
    pub kept_upper_tokens: u64,
    pub rounds: usize,
}

/// Why there is nothing to compact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NothingToSummarize {
    pub rounds: usize,
    pub keep_recent_rounds: u32,
}

/// Whether a compaction leaves an entry of its view out of the summary: an older boundary, or an
/// older summary (whose text is folded in as the previous summary instead).
pub fn is_superseded(entry: &Entry) -> bool {
    entry.is_compact_boundary() || entry.is_compact_summary
}

/// Running totals of the view up to some entry.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    tokens: u64,
    /// The upper bound of the same at the default rates.
    upper_tokens: u64,
    /// Entries that would be summarized (not superseded).
    summarized: usize,
    /// Of those, the ones a model reads.
    model_visible: usize,
}

/// Where a round starts in the view, with the totals before it.
#[derive(Debug, Clone, Copy)]
struct RoundStart {
    index: usize,
    before: Totals,
    /// The lowest seq in the round.
    min_seq: Option<i64>,
}

/// Plans a compaction that keeps the last `keep_recent_rounds` rounds, fed the view of the
/// current context one entry at a time, in order (as [`crate::jobs::view_reader::ViewReader`] reads
/// it). The cut is always at a round start. Older boundaries and summaries in the view are never
/// summarized; the previous summary is folded in.
///
/// It holds the starts of the last `keep_recent_rounds` rounds and the texts of the summaries it
/// met, never the entries, so a window of any length is planned in the same memory.
#[derive(Debug)]
pub struct PlanScan {
    keep: usize,
    view_len: usize,
    rounds: usize,
    /// `None` before the first assistant; `Some(None)` when the last one had no id.
    last_assistant: Option<Option<String>>,
    totals: Totals,
    recent_rounds: VecDeque<RoundStart>,
    /// The view index and text (without its prefix) of every compact summary met.
    summaries: Vec<(usize, String)>,
}

impl PlanScan {
    pub fn new(keep_recent_rounds: u32) -> Self {
        Self {
            keep: keep_recent_rounds as usize,
            view_len: 0,
            rounds: 0,
            last_assistant: None,
            totals: Totals::default(),
            recent_rounds: VecDeque::new(),
            summaries: Vec::new(),
        }
    }

    /// The next entry of the view, and its token estimate.
    pub fn push(&mut self, entry: &Entry, tokens: u64) {
        let index = self.view_len;
        // A round starts where `group_rounds` starts one: at the first entry, and at an assistant
        // whose response id differs from the previous assistant's (the first one continues).
        let mut starts_round = index == 0;
        if entry.kind == EntryKind::Assistant {
            let id = entry.response_id();
            starts_round |= match (&self.last_assistant, id) {
                (None, _) => false,
                (Some(Some(previous)), Some(current)) => previous != current,
                (Some(_), _) => true,
            };
            self.last_assistant = Some(id.map(str::to_owned));
        }
        if starts_round {
            self.rounds += 1;
            if self.keep > 0 {
                if self.recent_rounds.len() == self.keep {
                    self.recent_rounds.pop_front();
                }
                self.recent_rounds.push_back(RoundStart {
                    index,
                    before: self.totals,
                    min_seq: None,
                });
            }
        }
        if let (Some(round), Some(seq)) = (self.recent_rounds.back_mut(), entry.seq) {
            round.min_seq = Some(round.min_seq.map_or(seq, |min| min.min(seq)));
        }
        self.totals.tokens += tokens;
        self.totals.upper_tokens += entry_features(entry).upper_at_default_rates();
        if is_superseded(entry) {
            if entry.is_compact_summary {
                if let Some(text) = entry.first_text() {
                    let text = text.strip_prefix(SUMMARY_PREFIX).unwrap_or(text);
                    // The next summary is built on the text, not on what the footer quotes.
                    self.summaries
                        .push((index, without_footer(text).to_owned()));
                }
            }
        } else {
            self.totals.summarized += 1;
            self.totals.model_visible += usize::from(entry.kind.is_model_visible());
        }
        self.view_len += 1;
    }

    /// The plan, once the whole view went through [`PlanScan::push`].
    pub fn finish(self) -> Result<CompactionPlan, NothingToSummarize> {
        let nothing = NothingToSummarize {
            rounds: self.rounds,
            keep_recent_rounds: self.keep as u32,
        };
        if self.rounds <= self.keep {
            return Err(nothing);
        }
        let (cut, before, first_kept_seq) = match self.recent_rounds.front() {
            Some(first_kept) => (
                first_kept.index,
                first_kept.before,
                self.recent_rounds.iter().filter_map(|r| r.min_seq).min(),
            ),
            None => (self.view_len, self.totals, None),
        };
        if before.model_visible == 0 {
            return Err(nothing);
        }
        let previous: Vec<String> = self
            .summaries
            .into_iter()
            .filter(|(index, _)| *index < cut)
            .map(|(_, text)| text)
            .collect();
        Ok(CompactionPlan {
            cut,
            messages_summarized: before.summarized,
            previous_summary: (!previous.is_empty()).then(|| previous.join("\n\n")),
            first_kept_seq,
            pre_tokens: self.totals.tokens,
            kept_upper_tokens: self.totals.upper_tokens - before.upper_tokens,
            rounds: self.rounds,
        })
    }
}

/// Cuts the entries to summarize, given one at a time by their token estimates, into pages of at
/// most `max_tokens` (and `max_entries`) each. An entry larger than a page is a page of its own;
/// an entry of no tokens (one the model never reads) never starts a page on account of tokens, so
/// it stays with what came before it.
#[derive(Debug)]
pub struct PageCutter {
    max_tokens: u64,
    max_entries: usize,
    entries: usize,
    tokens: u64,
}

impl PageCutter {
    pub fn new(max_tokens: u64, max_entries: usize) -> Self {
        Self {
            max_tokens,
            max_entries,
            entries: 0,
            tokens: 0,
        }
    }

    /// Takes the next entry's estimate; whether it starts a new page (the first never does).
    pub fn starts_page(&mut self, tokens: u64) -> bool {
        let over = tokens > 0 && self.tokens + tokens > self.max_tokens;
        let full = self.entries > 0 && (over || self.entries >= self.max_entries);
        if full {
            (self.entries, self.tokens) = (0, 0);
        }
        self.entries += 1;
        self.tokens += tokens;
        full
    }
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
    use crate::jobs::view_reader::{plan_compaction, ToSummarize, ViewReader};
    use futures_util::FutureExt;

    /// The plan of a window held in memory, and the seqs it summarizes (its futures are ready).
    fn plan(window: &[Entry], keep: u32) -> Result<(CompactionPlan, Vec<i64>), NothingToSummarize> {
        // Pages of 2: the head run and the segment span pages. A window in memory reads
        // through ready futures.
        let mut reader = ViewReader::of_entries(window).with_page_entries(2);
        let plan = plan_compaction(&mut reader, keep)
            .now_or_never()
            .unwrap()
            .unwrap()?;
        let mut entries = ToSummarize::new(reader, &plan);
        let mut seqs = Vec::new();
        while let Some(entry) = entries.next().now_or_never().unwrap().unwrap() {
            seqs.push(entry.seq.unwrap());
        }
        Ok((plan, seqs))
    }

    /// The pages `tokens` are cut into, as ranges.
    fn summary_pages(
        tokens: &[u64],
        max_tokens: u64,
        max_entries: usize,
    ) -> Vec<std::ops::Range<usize>> {
        let mut cutter = PageCutter::new(max_tokens, max_entries);
        let mut pages: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            if cutter.starts_page(t) || pages.is_empty() {
                pages.push(i..i);
            }
            pages.last_mut().unwrap().end = i + 1;
        }
        pages
    }

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
        let (p, seqs) = plan(&e, 2).unwrap();
        assert_eq!(p.rounds, 3);
        assert_eq!(p.first_kept_seq, Some(3));
        assert_eq!((seqs, p.messages_summarized), (vec![0, 1, 2], 3));
        assert_eq!(
            plan(&e, 3).map(|(p, _)| p),
            Err(NothingToSummarize {
                rounds: 3,
                keep_recent_rounds: 3
            })
        );
        let (all, seqs) = plan(&e, 0).unwrap();
        assert_eq!((seqs.len(), all.first_kept_seq), (6, None));
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
        let (p, seqs) = plan(&e, 2).unwrap();
        assert_eq!(p.previous_summary.as_deref(), Some("FIRST"));
        assert_eq!(p.first_kept_seq, Some(5));
        assert_eq!(seqs, [3, 4]);
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
    fn the_preserved_segment_covers_what_was_appended_during_the_job() {
        assert_eq!(preserved_segment(Some(4), 10, 12), Some((4, 11)));
        assert_eq!(preserved_segment(None, 10, 12), Some((10, 11)));
        assert_eq!(preserved_segment(None, 10, 10), None);
    }
}
