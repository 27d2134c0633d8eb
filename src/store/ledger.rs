//! The loss ledger, read: for each summary Loupe wrote (a compaction's summary, a summarized
//! line of the outline), the anchors of the entries it covers, each marked kept or dropped
//! against the summary's text. The anchors are stored with the entries' search rows
//! (`history::anchors`, written by the indexer), so they answer to their entries as search
//! does: a snipped, erased, rewritten or deleted entry has none.

use std::collections::{BTreeMap, HashSet};

use sqlx::Row;

use super::search::CATCH_UP_STEPS;
use super::{Backend, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::anchors::{decode, kept_in, AnchorKind};
use crate::history::ledger::without_footer;
use crate::tree::NodeId;

/// Entries whose anchors one summary's ledger reads (its first ones, for a summary of more).
pub const LEDGER_ENTRIES_PER_SUMMARY: i64 = 4_096;

/// Anchors one summary's ledger lists (its counts cover every anchor read).
pub const LEDGER_ANCHORS_PER_SUMMARY: usize = 500;

/// What a ledger read asks for.
#[derive(Debug, Clone, Default)]
pub struct LedgerFilter {
    /// Only anchors of this kind.
    pub kind: Option<AnchorKind>,
    /// Only compaction summaries (`Some(true)`) or only outline lines (`Some(false)`).
    pub compactions: Option<bool>,
    /// Only dropped anchors are listed (the counts still hold both).
    pub dropped_only: bool,
    /// Summaries at most, the first ones in seq order.
    pub limit: usize,
}

/// Which summary a ledger is of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerSummary {
    /// A compaction's summary: the seq of its entry.
    Compaction { seq: i64 },
    /// A line of the outline.
    Line { node: NodeId },
}

/// One anchor of a summary's ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerAnchor {
    pub kind: AnchorKind,
    pub text: String,
    /// The first covered entry holding it.
    pub seq: i64,
    pub kept: bool,
}

/// One summary's ledger.
#[derive(Debug, Clone)]
pub struct SummaryLedger {
    pub summary: LedgerSummary,
    pub summarizer: String,
    /// The entries it covers lie in `[first_seq, end_seq)`.
    pub first_seq: i64,
    pub end_seq: i64,
    /// Kept and dropped anchors of each kind.
    pub counts: BTreeMap<AnchorKind, (u64, u64)>,
    pub anchors: Vec<LedgerAnchor>,
    /// Whether anchors were left out of `anchors` (or entries unread) by the bounds.
    pub truncated: bool,
}

/// A thread's ledger.
#[derive(Debug, Clone)]
pub struct Ledger {
    pub summaries: Vec<SummaryLedger>,
    /// The entries whose anchors are read: those before `indexed_through`; `pending` more wait
    /// for the indexer.
    pub indexed_through: i64,
    pub pending: i64,
}

/// A summary to read the ledger of: its text and what it covers.
struct Covering {
    summary: LedgerSummary,
    summarizer: String,
    text: String,
    first_seq: i64,
    end_seq: i64,
    /// Seqs in the range it does not cover (kept entries, other summaries).
    skipped: Vec<(i64, i64)>,
}

impl Store {
    /// The tenant's thread's ledger: its index caught up first (as a search does), then the
    /// summaries' anchors read and marked.
    pub async fn ledger(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        filter: &LedgerFilter,
    ) -> Result<Ledger, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let lag = self.catch_up(&head.thread_key, CATCH_UP_STEPS).await?;
        let mut coverings = Vec::new();
        if filter.compactions != Some(false) {
            coverings.extend(self.compaction_coverings(&head.thread_key).await?);
        }
        if filter.compactions != Some(true) {
            let snapshot = self.outline_snapshot(tenant, thread_id).await?;
            for ((node, text), summarizer) in snapshot.lines.into_iter().zip(snapshot.summarizers) {
                if summarizer == "verbatim" {
                    continue;
                }
                coverings.push(Covering {
                    summary: LedgerSummary::Line { node },
                    summarizer,
                    text,
                    first_seq: node.first() as i64,
                    end_seq: node.end() as i64,
                    skipped: Vec::new(),
                });
            }
        }
        coverings.sort_by_key(|c| (c.first_seq, c.end_seq));
        coverings.truncate(filter.limit);
        let mut summaries = Vec::with_capacity(coverings.len());
        for covering in coverings {
            summaries.push(
                self.summary_ledger(&head.thread_key, covering, filter)
                    .await?,
            );
        }
        Ok(Ledger {
            summaries,
            indexed_through: lag.indexed_through,
            pending: lag.pending,
        })
    }

    /// The ledger's size beside what it describes: the bytes the thread's anchors take, and
    /// the bytes of its stored entries (the thread must be indexed for the first to be whole).
    pub async fn ledger_size(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<(i64, i64), StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let bytes = match self.backend {
            Backend::Postgres => "octet_length(anchors)",
            Backend::Sqlite => "length(CAST(anchors AS BLOB))",
        };
        let row = sqlx::query(&format!(
            "SELECT CAST(COALESCE(SUM({bytes}), 0) AS BIGINT) AS anchors, \
             (SELECT stored_bytes FROM threads WHERE thread_key = $1) AS stored \
             FROM search_rows WHERE thread_key = $1"
        ))
        .bind(head.thread_key.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok((row.try_get("anchors")?, row.try_get("stored")?))
    }

    /// The thread's compaction summaries that Loupe wrote, with what each covers: the entries
    /// since the boundary before it, less the rounds its boundary kept and the summaries.
    async fn compaction_coverings(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<Vec<Covering>, StoreError> {
        let rows = self.summary_rows(thread_key, 0).await?.entries;
        let summary_seqs: Vec<(i64, i64)> = rows
            .iter()
            .filter_map(|entry| entry.seq)
            .map(|seq| (seq, seq))
            .collect();
        let mut coverings = Vec::new();
        let mut start = 0;
        for (i, boundary) in rows.iter().enumerate() {
            if !boundary.is_compact_boundary() {
                continue;
            }
            let boundary_seq = boundary.seq.unwrap_or_default();
            let preserved = boundary.preserved_segment();
            let loupe_wrote = boundary
                .compact_metadata
                .as_ref()
                .is_some_and(|m| m.get("job_id").is_some());
            let summary = rows[i + 1..]
                .iter()
                .find(|entry| entry.is_compact_summary && entry.seq > boundary.seq);
            if let (true, Some(summary)) = (loupe_wrote, summary) {
                let summarizer = boundary
                    .compact_metadata
                    .as_ref()
                    .and_then(|m| m.get("summarizer"))
                    .and_then(|s| s.as_str())
                    .unwrap_or("unknown")
                    .to_owned();
                let mut skipped = summary_seqs.clone();
                skipped.extend(preserved);
                coverings.push(Covering {
                    summary: LedgerSummary::Compaction {
                        seq: summary.seq.unwrap_or_default(),
                    },
                    summarizer,
                    text: without_footer(summary.first_text().unwrap_or_default()).to_owned(),
                    first_seq: start,
                    end_seq: boundary_seq,
                    skipped,
                });
            }
            // The next window starts with this one's kept rounds, or after its summary.
            start = preserved.map_or(boundary_seq + 1, |(first, _)| first);
        }
        Ok(coverings)
    }

    async fn summary_ledger(
        &self,
        thread_key: &ThreadKey,
        covering: Covering,
        filter: &LedgerFilter,
    ) -> Result<SummaryLedger, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, anchors FROM search_rows WHERE thread_key = $1 AND seq >= $2 \
             AND seq < $3 AND anchors <> '' ORDER BY seq LIMIT $4",
        )
        .bind(thread_key.as_str())
        .bind(covering.first_seq)
        .bind(covering.end_seq)
        .bind(LEDGER_ENTRIES_PER_SUMMARY)
        .fetch_all(&self.pool)
        .await?;
        let mut truncated = rows.len() as i64 >= LEDGER_ENTRIES_PER_SUMMARY;
        let mut counts: BTreeMap<AnchorKind, (u64, u64)> = BTreeMap::new();
        let mut anchors = Vec::new();
        let mut seen = HashSet::new();
        for row in &rows {
            let seq: i64 = row.try_get("seq")?;
            if covering
                .skipped
                .iter()
                .any(|&(first, last)| (first..=last).contains(&seq))
            {
                continue;
            }
            let stored: String = row.try_get("anchors")?;
            for anchor in decode(&stored) {
                if filter.kind.is_some_and(|kind| kind != anchor.kind)
                    || !seen.insert((anchor.kind, anchor.text.clone()))
                {
                    continue;
                }
                let kept = kept_in(&covering.text, &anchor.text);
                let (k, d) = counts.entry(anchor.kind).or_default();
                if kept {
                    *k += 1;
                } else {
                    *d += 1;
                }
                if kept && filter.dropped_only {
                    continue;
                }
                if anchors.len() >= LEDGER_ANCHORS_PER_SUMMARY {
                    truncated = true;
                    continue;
                }
                anchors.push(LedgerAnchor {
                    kind: anchor.kind,
                    text: anchor.text,
                    seq,
                    kept,
                });
            }
        }
        Ok(SummaryLedger {
            summary: covering.summary,
            summarizer: covering.summarizer,
            first_seq: covering.first_seq,
            end_seq: covering.end_seq,
            counts,
            anchors,
            truncated,
        })
    }
}
