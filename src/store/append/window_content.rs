//! A window's content before its first call, as the learned overhead compares it: kept in
//! `threads.window_content_tokens` by the append paths, a recount and a compaction alike.

use crate::history::model::Entry;
use crate::history::normalize::estimate::entry_features;

/// A window's content at the default rates before any response of it reported `usage`: what
/// its first call's prompt less the content is the model's overhead of. Unknown when the window
/// opened at a boundary that brings back a preserved segment (the segment was counted by
/// whatever wrote the boundary), or was stored before the count existed: no overhead is learned
/// from such a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct WindowContent(pub(super) Option<i64>);

impl WindowContent {
    pub(in crate::store) const EMPTY: WindowContent = WindowContent(Some(0));
    pub(in crate::store) const UNKNOWN: WindowContent = WindowContent(None);

    /// As `threads.window_content_tokens` holds it: -1 for unknown.
    pub(in crate::store) fn column(self) -> i64 {
        self.0.unwrap_or(-1)
    }

    pub(in crate::store) fn from_column(tokens: i64) -> Self {
        WindowContent((tokens >= 0).then_some(tokens))
    }

    /// The content of a window that opens at `boundary` and holds `entries` after it (nothing
    /// reporting `usage` among them).
    pub(in crate::store) fn opened_at<'a>(
        boundary: &Entry,
        entries: impl Iterator<Item = &'a Entry>,
    ) -> Self {
        if brings_back_a_segment(boundary) {
            return WindowContent::UNKNOWN;
        }
        let tokens = entries
            .map(|e| entry_features(e).at_default_rates())
            .sum::<u64>();
        WindowContent(i64::try_from(tokens).ok())
    }

    pub(super) fn plus(self, tokens: Option<i64>) -> Self {
        WindowContent(self.0.zip(tokens).map(|(a, b)| a.saturating_add(b)))
    }
}

impl Default for WindowContent {
    fn default() -> Self {
        WindowContent::EMPTY
    }
}

/// Whether a compact boundary keeps entries from before it in its window (Loupe's
/// `preserved_segment` by seqs, or a Claude Code `preservedSegment` by uuids).
pub(super) fn brings_back_a_segment(boundary: &Entry) -> bool {
    boundary.preserved_segment().is_some() || boundary.preserved_uuids().is_some()
}
