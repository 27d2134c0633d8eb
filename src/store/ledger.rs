//! The loss ledger, read: for each summary Loupe wrote (a compaction's summary, a summarized
//! line of the outline), the anchors of the entries it covers, each marked kept or dropped
//! against the summary's text. The anchors are stored with the entries' search rows
//! (`history::anchors`, written by the indexer), so they answer to their entries as search
//! does: a snipped, erased, rewritten or deleted entry has none.

use std::collections::{BTreeMap, HashSet};

use sqlx::Row;

use super::search::CATCH_UP_STEPS;
use super::{storable_text, Backend, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::anchors::{decode, kept_in, AnchorKind};
use crate::history::ledger::without_footer;
use crate::history::model::Entry;
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
    /// The rounds its boundary kept, which lie in its range but are not summarized.
    kept_rounds: Option<(i64, i64)>,
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
        // The seqs of every boundary and summary: in a summary's range, but summaries of their
        // own (sorted; one list for all).
        let mut summary_seqs = Vec::new();
        if filter.compactions != Some(false) {
            let rows = self.summary_rows(&head.thread_key, 0).await?.entries;
            summary_seqs = rows.iter().filter_map(|entry| entry.seq).collect();
            coverings.extend(compaction_coverings(&rows, filter.limit));
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
                    kept_rounds: None,
                });
            }
        }
        coverings.sort_by_key(|c| (c.first_seq, c.end_seq));
        coverings.truncate(filter.limit);
        let mut summaries = Vec::with_capacity(coverings.len());
        for covering in coverings {
            let ledger = self
                .summary_ledger(&head.thread_key, covering, &summary_seqs, filter)
                .await?;
            summaries.push(ledger);
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

    async fn summary_ledger(
        &self,
        thread_key: &ThreadKey,
        covering: Covering,
        summary_seqs: &[i64],
        filter: &LedgerFilter,
    ) -> Result<SummaryLedger, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, anchors FROM search_rows WHERE thread_key = $1 AND seq >= $2 \
             AND seq < $3 AND anchors <> '' ORDER BY seq LIMIT $4",
        )
        .bind(thread_key.as_str())
        .bind(covering.first_seq)
        .bind(covering.end_seq)
        .bind(LEDGER_ENTRIES_PER_SUMMARY + 1)
        .fetch_all(&self.pool)
        .await?;
        // One more row than is read tells whether any was left.
        let mut truncated = rows.len() as i64 > LEDGER_ENTRIES_PER_SUMMARY;
        let mut counts: BTreeMap<AnchorKind, (u64, u64)> = BTreeMap::new();
        let mut anchors = Vec::new();
        let mut seen = HashSet::new();
        for row in rows.iter().take(LEDGER_ENTRIES_PER_SUMMARY as usize) {
            let seq: i64 = row.try_get("seq")?;
            if covering
                .kept_rounds
                .is_some_and(|(first, last)| (first..=last).contains(&seq))
                || summary_seqs.binary_search(&seq).is_ok()
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

/// The compaction summaries that Loupe wrote among a thread's boundaries and summaries (`rows`,
/// in seq order), the first `limit`, with what each covers: the entries since the boundary
/// before it, less the rounds its boundary kept (and the summaries, which the ledger skips).
fn compaction_coverings(rows: &[Entry], limit: usize) -> Vec<Covering> {
    let mut coverings = Vec::new();
    let mut start = 0;
    for (i, boundary) in rows.iter().enumerate() {
        if coverings.len() >= limit {
            break;
        }
        if !boundary.is_compact_boundary() {
            continue;
        }
        let boundary_seq = boundary.seq.unwrap_or_default();
        let preserved = boundary.preserved_segment();
        let metadata = boundary.compact_metadata.as_ref();
        let loupe_wrote = metadata.is_some_and(|m| m.get("job_id").is_some());
        let summary = rows[i + 1..]
            .iter()
            .find(|entry| entry.is_compact_summary && entry.seq > boundary.seq);
        if let (true, Some(summary)) = (loupe_wrote, summary) {
            let summarizer = metadata
                .and_then(|m| m.get("summarizer"))
                .and_then(|s| s.as_str())
                .unwrap_or("unknown")
                .to_owned();
            coverings.push(Covering {
                summary: LedgerSummary::Compaction {
                    seq: summary.seq.unwrap_or_default(),
                },
                summarizer,
                // As the anchors are stored: a NUL in them is U+FFFD (`storable_text`).
                text: storable_text(without_footer(summary.first_text().unwrap_or_default()))
                    .into_owned(),
                first_seq: start,
                end_seq: boundary_seq,
                kept_rounds: preserved,
            });
        }
        // The next window starts with this one's kept rounds, or after its summary.
        start = preserved.map_or(boundary_seq + 1, |(first, _)| first);
    }
    coverings
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coverings_stop_at_the_limit_and_copy_nothing_per_summary() {
        // A client can append boundaries that look like Loupe's: 20,000 of them, with their
        // summaries, took one `limit=1` read to 12.6 GB when each covering copied every seq.
        let mut rows = Vec::new();
        for i in 0..20_000i64 {
            let boundary: Entry = serde_json::from_value(json!({
                "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
                "compactMetadata": {"job_id": "x", "summarizer": "extractive", "trigger": "manual"}
            }))
            .unwrap();
            let summary: Entry = serde_json::from_value(json!({
                "type": "user", "isCompactSummary": true,
                "message": {"role": "user", "content": "summary src/a.rs"}
            }))
            .unwrap();
            rows.push(Entry {
                seq: Some(2 * i),
                ..boundary
            });
            rows.push(Entry {
                seq: Some(2 * i + 1),
                ..summary
            });
        }
        let coverings = compaction_coverings(&rows, 1);
        assert_eq!(coverings.len(), 1);
        assert_eq!(coverings[0].summary, LedgerSummary::Compaction { seq: 1 });
        assert_eq!((coverings[0].first_seq, coverings[0].end_seq), (0, 0));
        let all = compaction_coverings(&rows, usize::MAX);
        assert_eq!(all.len(), 20_000);
        assert_eq!((all[1].first_seq, all[1].end_seq), (1, 2));
    }
}
