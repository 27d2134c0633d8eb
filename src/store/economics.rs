//! A thread's economics, read: its entries from the first on, a byte-bounded page at a time, up
//! to the `next_seq` read first, each folded by `history::economics` as it is read. What a read
//! holds is one page, the running totals of the last few thousand entries, and the points and
//! markers it answers, whatever the thread's length. A boundary whose preserved segment reaches
//! further back than those totals has its segment read again: its time, not its memory.
//!
//! The figures are cumulative, so a read that goes on after `after_seq` folds the entries before
//! it again (without answering them): its time grows with `after_seq`, its memory does not.

use std::collections::VecDeque;

use sqlx::any::AnyRow;

use super::rows::{entry_from_row, page_within_bytes};
use super::{Store, StoreError, TenantId, ThreadId, ThreadKey, ThreadSettings};
use crate::history::economics::{window_start, EconomicsFold, Marker, MarkerKind, Point};
use crate::history::model::Entry;
use crate::history::normalize::context_entry_tokens;

/// Entries one page reads at most.
const PAGE_ENTRIES: i64 = 1_000;
/// Bytes of stored bodies past which a page stops (it always holds one entry).
const PAGE_BYTES: i64 = 4 * 1024 * 1024;
/// Entries whose running content total the read keeps (16 bytes each): a boundary's preserved
/// segment within them (the last rounds, as compactions keep) is summed without reading it again.
const RECENT_ENTRIES: usize = 4_096;

/// What an economics read answers.
#[derive(Debug, Clone, Copy)]
pub struct EconomicsRead {
    /// Points and markers at seqs after this one are answered (-1: from the start).
    pub after_seq: i64,
    /// Most points.
    pub limit: usize,
    /// Most markers.
    pub max_markers: usize,
}

/// A thread's economics from `after_seq` on.
#[derive(Debug, Clone)]
pub struct Economics {
    /// The thread's next seq when the read started; entries from it on are not read.
    pub next_seq: i64,
    pub settings: ThreadSettings,
    /// The automatic-compaction threshold in force (the thread's, else the server's; 0: off).
    pub auto_compact_tokens: i64,
    /// In seq order.
    pub points: Vec<Point>,
    /// In seq order.
    pub markers: Vec<Marker>,
    /// Set when a bound cut the answer short: entries up to it are answered, pass it as
    /// `after_seq` to read on.
    pub next_after_seq: Option<i64>,
}

impl Store {
    /// The tenant's thread's economics (`history::economics`): every entry folded in seq order,
    /// the points and markers after `read.after_seq` answered, until `read.limit` points or
    /// `read.max_markers` markers (an entry's points and markers go together, so the answer is
    /// cut between entries). An outline marker is where the outline's boundary moved (a merge:
    /// the request after it is the first sent with the new lines); an outline from before merges
    /// were kept is marked at its current boundary alone.
    pub async fn economics(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        read: EconomicsRead,
    ) -> Result<Economics, StoreError> {
        let head = self.context_head(tenant, thread_id).await?;
        let auto_compact_tokens = head
            .settings
            .auto_compact_tokens
            .unwrap_or(self.auto_compact_tokens)
            .max(0);
        let mut fold =
            EconomicsFold::new(auto_compact_tokens as u64, head.settings.clearing_options());
        let outline_seqs = self.outline_markers(&head, &read).await?;
        let (mut points, mut markers) = (Vec::new(), Vec::new());
        let mut next_after_seq = None;
        let mut after = -1;
        let mut recent = RecentTotals::default();
        // Nothing after `after_seq` to answer: the entries are not read at all.
        let answers_any = read.after_seq + 1 < head.next_seq;
        'pages: while answers_any && after + 1 < head.next_seq {
            let rows = self.page(&head.thread_key, after, head.next_seq).await?;
            if rows.is_empty() {
                // The thread was deleted since its head was read.
                break;
            }
            for row in rows {
                let entry = entry_from_row(&row)?;
                let seq = entry.seq.unwrap_or(after + 1);
                after = seq;
                let pushed = fold.push(&entry);
                let tokens = pushed.tokens;
                if entry.is_compact_boundary() {
                    let preserved = self
                        .preserved_tokens(&head.thread_key, entry, seq, &recent)
                        .await?;
                    fold.preserve(preserved);
                }
                recent.push(seq, tokens);
                if seq <= read.after_seq {
                    continue;
                }
                let mut kinds = pushed.markers;
                if outline_seqs.binary_search(&seq).is_ok() {
                    kinds.push(MarkerKind::Outline);
                }
                let answered = !points.is_empty() || !markers.is_empty();
                let points_after = points.len() + usize::from(pushed.point.is_some());
                if answered
                    && (points_after > read.limit || markers.len() + kinds.len() > read.max_markers)
                {
                    next_after_seq = Some(seq - 1);
                    break 'pages;
                }
                markers.extend(kinds.into_iter().map(|kind| Marker { seq, kind }));
                points.extend(pushed.point);
            }
        }
        // A merge after the last entry (an outline that covers every entry) is where the next
        // entry will be.
        if next_after_seq.is_none() {
            for &seq in outline_seqs.iter().filter(|&&seq| seq >= head.next_seq) {
                if seq > read.after_seq && markers.len() < read.max_markers {
                    markers.push(Marker {
                        seq,
                        kind: MarkerKind::Outline,
                    });
                }
            }
        }
        Ok(Economics {
            next_seq: head.next_seq,
            settings: head.settings,
            auto_compact_tokens,
            points,
            markers,
            next_after_seq,
        })
    }

    /// The rows after `after` and below `end`, a page cut at `PAGE_BYTES`.
    async fn page(
        &self,
        thread_key: &ThreadKey,
        after: i64,
        end: i64,
    ) -> Result<Vec<AnyRow>, StoreError> {
        Ok(
            sqlx::query(&page_within_bytes("m.seq, m.uuid, m.created_at"))
                .bind(thread_key.as_str())
                .bind(after)
                .bind(PAGE_ENTRIES.min(end - after - 1))
                .bind(PAGE_BYTES)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// The seqs to mark as outline merges after `read.after_seq`, in order: the merges kept,
    /// or, for an outline saved before they were, its current boundary alone.
    async fn outline_markers(
        &self,
        head: &crate::store::ContextHead,
        read: &EconomicsRead,
    ) -> Result<Vec<i64>, StoreError> {
        let merges = self
            .outline_merges(&head.thread_key, read.after_seq, read.max_markers + 1)
            .await?;
        if !merges.is_empty()
            || !self
                .outline_merges(&head.thread_key, -1, 1)
                .await?
                .is_empty()
        {
            return Ok(merges);
        }
        let boundary = self.outline_state(&head.thread_key).await?.0.boundary() as i64;
        Ok(if boundary > read.after_seq.max(0) {
            vec![boundary]
        } else {
            Vec::new()
        })
    }

    /// The content tokens of the entries a compact boundary at `seq` keeps before it (its
    /// preserved segment, Claude Code's named by uuids resolved as the context read resolves
    /// them, up to the boundary): from the recent totals when the segment lies within them, else
    /// read again, a page at a time, since the fold keeps no entry.
    async fn preserved_tokens(
        &self,
        thread_key: &ThreadKey,
        mut boundary: Entry,
        seq: i64,
        recent: &RecentTotals,
    ) -> Result<u64, StoreError> {
        self.resolve_preserved_uuids(thread_key, &mut boundary)
            .await?;
        let start = window_start(&boundary, seq);
        if let Some(tokens) = recent.since(start) {
            return Ok(tokens);
        }
        let mut after = start - 1;
        let mut tokens = 0_u64;
        while after + 1 < seq {
            let rows = self.page(thread_key, after, seq).await?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                let entry = entry_from_row(&row)?;
                after = entry.seq.unwrap_or(after + 1);
                tokens = tokens.saturating_add(context_entry_tokens(&entry));
            }
        }
        Ok(tokens)
    }
}

/// The running content total before each of the last `RECENT_ENTRIES` entries.
#[derive(Debug, Default)]
struct RecentTotals {
    /// `(seq, total of the entries before it)`, oldest first.
    before: VecDeque<(i64, u64)>,
    total: u64,
}

impl RecentTotals {
    fn push(&mut self, seq: i64, tokens: u64) {
        if self.before.len() == RECENT_ENTRIES {
            self.before.pop_front();
        }
        self.before.push_back((seq, self.total));
        self.total = self.total.saturating_add(tokens);
    }

    /// The tokens of the entries from `start` on, if `start` is among the recent ones (or past
    /// them: none).
    fn since(&self, start: i64) -> Option<u64> {
        let next = self.before.back().map_or(0, |&(seq, _)| seq + 1);
        if start >= next {
            return Some(0);
        }
        let (first, _) = *self.before.front()?;
        if start < first {
            return None;
        }
        // Seqs are dense: the entry at `start` sits `start - first` from the front.
        let &(seq, before) = self.before.get((start - first) as usize)?;
        (seq == start).then(|| self.total - before)
    }
}
