//! Reads a window in the order of its view, a page at a time: the order
//! [`view::slice_after_boundary`] puts the window's entries in, without the ones
//! [`view::hide_snipped`] hides, and without tombstones. A compaction plans over this stream and then summarizes from it,
//! so it never holds its window, whatever the window's length.
//!
//! The view of a window whose last compact boundary `b` preserved the segment `[first, last]` is:
//! the boundary; the compact summaries right after it (the "head run"); the segment, without older
//! boundaries and summaries; then everything after the head run outside the segment. Each part
//! is a range of seqs read in order, so the reader needs only the boundary's seq, its segment and
//! where the head run ends.

use std::collections::HashSet;
use std::future::Future;

use super::compaction::plan::{is_superseded, CompactionPlan, NothingToSummarize, PlanScan};
use crate::history::estimate_entry_tokens;
use crate::history::model::{Entry, EntryKind};
use crate::history::normalize::view;
use crate::store::{Store, StoreError, WindowBounds};

/// Entries per read.
pub const PAGE_ENTRIES: i64 = 1_024;

/// Where a window's entries come from: the store, or a window already in memory.
pub trait WindowSource {
    /// The window's entries with a seq in `[from, to)`, in seq order.
    fn range(
        &mut self,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send;

    /// The uuids the window's snip entries remove.
    fn snipped_uuids(&mut self)
        -> impl Future<Output = Result<HashSet<String>, StoreError>> + Send;
}

/// What the reader needs to know of a window before reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowShape {
    pub start_seq: i64,
    pub next_seq: i64,
    /// The seq of the window's last compact boundary.
    pub boundary_seq: Option<i64>,
    /// That boundary's preserved segment `[first, last]`, resolved to seqs.
    pub segment: Option<(i64, i64)>,
}

impl WindowShape {
    pub fn of_bounds(bounds: &WindowBounds) -> Self {
        Self::new(
            bounds.start_seq,
            bounds.next_seq,
            bounds.boundary_seq(),
            bounds.boundary.as_ref().and_then(Entry::preserved_segment),
        )
    }

    /// The shape of a window held whole, its seqs dense from its first entry's.
    pub fn of_entries(entries: &[Entry]) -> Self {
        let start_seq = entries.first().map_or(0, |e| e.seq_or(0));
        let boundary = entries.iter().rev().find(|e| e.is_compact_boundary());
        Self::new(
            start_seq,
            start_seq + entries.len() as i64,
            boundary.and_then(|b| b.seq),
            boundary.and_then(Entry::preserved_segment),
        )
    }

    /// The segment is cut to the window: a boundary's segment is the client's to write, and
    /// seqs outside the window change nothing in the view, while reading toward them could
    /// overflow or walk an empty range for ever.
    fn new(
        start_seq: i64,
        next_seq: i64,
        boundary_seq: Option<i64>,
        segment: Option<(i64, i64)>,
    ) -> Self {
        let segment = segment.map(|(first, last)| (first.max(start_seq), last.min(next_seq - 1)));
        Self {
            start_seq,
            next_seq,
            boundary_seq,
            segment: segment.filter(|(first, last)| first <= last),
        }
    }

    fn in_segment(&self, seq: i64) -> bool {
        self.segment
            .is_some_and(|(first, last)| (first..=last).contains(&seq))
    }
}

/// A window held in memory, its seqs dense from its first entry's, read as the store's would be.
impl WindowSource for &[Entry] {
    fn range(
        &mut self,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        let start = self.first().map_or(0, |e| e.seq_or(0));
        let index = |seq: i64| (seq - start).clamp(0, self.len() as i64) as usize;
        std::future::ready(Ok(self[index(from)..index(to.max(from))].to_vec()))
    }

    fn snipped_uuids(
        &mut self,
    ) -> impl Future<Output = Result<HashSet<String>, StoreError>> + Send {
        let removed = view::snipped_uuids(self.iter());
        std::future::ready(Ok(removed.into_iter().map(str::to_owned).collect()))
    }
}

impl<'a> ViewReader<&'a [Entry]> {
    /// A reader of a window held in memory, its seqs dense from its first entry's.
    pub fn of_entries(window: &'a [Entry]) -> Self {
        let removed = view::snipped_uuids(window).into_iter().map(str::to_owned);
        Self::with_removed(window, WindowShape::of_entries(window), removed.collect())
    }
}

/// The window `bounds` describe, read from the store.
pub struct StoreWindow<'a> {
    pub store: &'a Store,
    pub bounds: &'a WindowBounds,
}

impl WindowSource for StoreWindow<'_> {
    fn range(
        &mut self,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        self.store.window_page(self.bounds, from, to)
    }

    fn snipped_uuids(
        &mut self,
    ) -> impl Future<Output = Result<HashSet<String>, StoreError>> + Send {
        self.store.window_snipped_uuids(self.bounds)
    }
}

/// Which part of the view the reader is in, and the next seq it reads there.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// The boundary and the compact summaries right after it.
    Head {
        at: i64,
    },
    /// The preserved segment, up to `end` (exclusive).
    Segment {
        at: i64,
        end: i64,
    },
    /// Everything after the head run, outside the segment.
    Rest {
        at: i64,
    },
    Done,
}

/// Reads a window's view a page at a time (see the module docs).
pub struct ViewReader<S> {
    source: S,
    shape: WindowShape,
    removed: HashSet<String>,
    /// The first seq after the head run, once the head has been read.
    head_end: i64,
    part: Part,
    page_entries: i64,
}

impl<S: WindowSource> ViewReader<S> {
    /// A reader of the window `shape` describes; reads the snips it must hide first.
    pub async fn new(mut source: S, shape: WindowShape) -> Result<Self, StoreError> {
        let removed = source.snipped_uuids().await?;
        Ok(Self::with_removed(source, shape, removed))
    }

    fn with_removed(source: S, shape: WindowShape, removed: HashSet<String>) -> Self {
        let mut reader = Self {
            source,
            shape,
            removed,
            head_end: shape.start_seq,
            part: Part::Done,
            page_entries: PAGE_ENTRIES,
        };
        reader.rewind();
        reader
    }

    /// The same reader, also hiding the entries with these uuids (an erasure reads the window
    /// before its tombstones are committed).
    pub fn hiding(mut self, uuids: &HashSet<String>) -> Self {
        self.removed.extend(uuids.iter().cloned());
        self
    }

    /// Back to the start of the view, the snips it read kept: a second pass reads only pages.
    pub fn rewind(&mut self) {
        self.head_end = self.shape.start_seq;
        self.part = match self.shape.boundary_seq {
            Some(b) => Part::Head { at: b },
            None => Part::Rest {
                at: self.shape.start_seq,
            },
        };
    }

    /// The same reader, reading `entries` at a time (at least 1).
    pub fn with_page_entries(mut self, entries: i64) -> Self {
        self.page_entries = entries.max(1);
        self
    }

    /// The next entries of the view, in order; `None` at its end. A page is never empty.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Entry>>, StoreError> {
        loop {
            let page = match self.part {
                Part::Done => return Ok(None),
                Part::Head { at } => self.read_head(at).await?,
                Part::Segment { at, end } => {
                    let to = at.saturating_add(self.page_entries).min(end);
                    self.part = if to < end {
                        Part::Segment { at: to, end }
                    } else {
                        Part::Rest { at: self.head_end }
                    };
                    let (b, head_end) = (self.shape.boundary_seq, self.head_end);
                    let mut page = self.read(at, to).await?;
                    // The boundary and its head run came first; older boundaries and summaries
                    // in the segment are history (the new summary folds them in).
                    page.retain(|e| {
                        let seq = e.seq_or(0);
                        let in_head = b.is_some_and(|b| b <= seq && seq < head_end);
                        !in_head && !is_superseded(e)
                    });
                    page
                }
                Part::Rest { at } => {
                    let next = self.shape.next_seq;
                    if at >= next {
                        self.part = Part::Done;
                        continue;
                    }
                    let to = at.saturating_add(self.page_entries).min(next);
                    self.part = Part::Rest { at: to };
                    let mut page = self.read(at, to).await?;
                    page.retain(|e| !self.shape.in_segment(e.seq_or(0)));
                    page
                }
            };
            let mut page = page;
            if !self.removed.is_empty() {
                page.retain(|e| e.uuid.as_deref().is_none_or(|u| !self.removed.contains(u)));
            }
            // A tombstone holds nothing to summarize; a boundary's keeps the view's shape.
            page.retain(|e| !e.is_erased() || e.is_compact_boundary());
            if !page.is_empty() {
                return Ok(Some(page));
            }
        }
    }

    /// The window's entries in `[from, to)`. Seqs are dense, so a range short of entries means
    /// the thread went (deleted, or deleted and made again) since the window was bounded.
    async fn read(&mut self, from: i64, to: i64) -> Result<Vec<Entry>, StoreError> {
        let entries = self.source.range(from, to).await?;
        if entries.len() as i64 != (to - from).max(0) {
            return Err(StoreError::ThreadNotFound);
        }
        Ok(entries)
    }

    /// The boundary at `at` or the head run's entries from `at`, up to a page of them; moves on
    /// to the segment (or the rest) where the run ends.
    async fn read_head(&mut self, at: i64) -> Result<Vec<Entry>, StoreError> {
        let next = self.shape.next_seq;
        let to = at.saturating_add(self.page_entries).min(next);
        let boundary = self.shape.boundary_seq;
        let mut head = Vec::new();
        let mut run_end = None;
        for entry in self.read(at, to).await? {
            let seq = entry.seq_or(0);
            let in_run = Some(seq) == boundary
                || (entry.kind == EntryKind::User && entry.is_compact_summary);
            if !in_run {
                run_end = Some(seq);
                break;
            }
            head.push(entry);
        }
        match run_end.or((to >= next).then_some(next)) {
            Some(end) => {
                self.head_end = end;
                self.part = match self.shape.segment {
                    Some((first, last)) => Part::Segment {
                        at: first.max(self.shape.start_seq),
                        end: last.saturating_add(1).min(next),
                    },
                    None => Part::Rest { at: end },
                };
            }
            None => self.part = Part::Head { at: to },
        }
        Ok(head)
    }
}

/// Plans a compaction keeping the last `keep_recent_rounds` rounds of the window: the view goes
/// through a [`PlanScan`] a page at a time.
pub async fn plan_compaction<S: WindowSource>(
    reader: &mut ViewReader<S>,
    keep_recent_rounds: u32,
) -> Result<Result<CompactionPlan, NothingToSummarize>, StoreError> {
    let mut scan = PlanScan::new(keep_recent_rounds);
    while let Some(page) = reader.next_page().await? {
        for entry in &page {
            scan.push(entry, estimate_entry_tokens(entry));
        }
    }
    Ok(scan.finish())
}

/// The entries a [`CompactionPlan`] summarizes, in view order, read again a page at a time.
pub struct ToSummarize<S> {
    reader: ViewReader<S>,
    /// The entries of the view before the cut that are still to be read.
    left_before_cut: usize,
    page: std::vec::IntoIter<Entry>,
}

impl<S: WindowSource> ToSummarize<S> {
    /// Reads from the start of `reader`'s view, wherever an earlier pass left it.
    pub fn new(mut reader: ViewReader<S>, plan: &CompactionPlan) -> Self {
        reader.rewind();
        Self {
            reader,
            left_before_cut: plan.cut,
            page: Vec::new().into_iter(),
        }
    }

    /// The next entry to summarize; `None` once the cut is reached.
    pub async fn next(&mut self) -> Result<Option<Entry>, StoreError> {
        while self.left_before_cut > 0 {
            let Some(entry) = self.page.next() else {
                match self.reader.next_page().await? {
                    Some(page) => self.page = page.into_iter(),
                    None => return Ok(None),
                }
                continue;
            };
            self.left_before_cut -= 1;
            if !is_superseded(&entry) {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::compaction::plan::{boundary_entry, summary_entry, BoundaryInfo};
    use futures_util::FutureExt;
    use serde_json::json;

    fn at(seq: i64, mut entry: Entry) -> Entry {
        entry.seq = Some(seq);
        entry.uuid = Some(format!("e{seq}"));
        entry
    }

    fn message(seq: i64, kind: &str) -> Entry {
        let role = if kind == "assistant" {
            "assistant"
        } else {
            "user"
        };
        let entry = serde_json::from_value(json!({"type": kind, "message": {"role": role,
            "id": format!("msg_{seq}"), "content": [{"type": "text", "text": "x"}]}}));
        at(seq, entry.unwrap())
    }

    fn boundary(seq: i64, preserved: Option<(i64, i64)>) -> Entry {
        let info = BoundaryInfo {
            trigger: "manual",
            pre_tokens: 0,
            messages_summarized: 1,
            summarizer: "extractive",
            job_id: "j",
            preserved,
        };
        at(seq, boundary_entry(&info))
    }

    /// The seqs of the view, read `page` entries at a time.
    fn read(window: &[Entry], page: i64) -> Vec<i64> {
        let mut reader = ViewReader::of_entries(window).with_page_entries(page);
        let mut seqs = Vec::new();
        while let Some(entries) = reader.next_page().now_or_never().unwrap().unwrap() {
            seqs.extend(entries.iter().map(|e| e.seq.unwrap()));
        }
        seqs
    }

    #[test]
    fn a_segment_reaching_past_an_older_compaction_leaves_its_boundary_and_summary_out() {
        let snip = Entry::snip(vec!["e9".to_owned()]);
        let window = vec![
            boundary(2, None),
            at(3, summary_entry("FIRST")),
            message(4, "user"),
            message(5, "assistant"),
            boundary(6, Some((2, 5))),
            at(7, summary_entry("SECOND")),
            message(8, "user"),
            message(9, "assistant"),
            at(10, snip),
        ];
        let (view, _) = view::slice_after_boundary(&window);
        let view = view::hide_snipped(&window, view);
        let plain: Vec<i64> = view.iter().map(|&i| window[i].seq.unwrap()).collect();
        assert_eq!(plain, [6, 7, 4, 5, 8, 10]);
        for page in 1..5 {
            assert_eq!(read(&window, page), plain, "pages of {page}");
        }
    }

    #[test]
    fn a_window_without_a_boundary_is_read_in_seq_order() {
        let window: Vec<Entry> = (0..5).map(|seq| message(seq, "user")).collect();
        assert_eq!(read(&window, 2), [0, 1, 2, 3, 4]);
        assert_eq!(read(&[], 2), Vec::<i64>::new());
    }

    #[test]
    fn a_range_short_of_entries_means_the_thread_went() {
        let window: Vec<Entry> = (0..5).map(|seq| message(seq, "user")).collect();
        let shape = WindowShape {
            next_seq: 8,
            ..WindowShape::of_entries(&window)
        };
        let reader = ViewReader::new(window.as_slice(), shape).now_or_never();
        let mut reader = reader.unwrap().unwrap().with_page_entries(4);
        let first = reader.next_page().now_or_never().unwrap().unwrap();
        assert_eq!(first.map(|page| page.len()), Some(4));
        let short = reader.next_page().now_or_never().unwrap();
        assert!(
            matches!(short, Err(StoreError::ThreadNotFound)),
            "{short:?}"
        );
    }
}
