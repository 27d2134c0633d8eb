//! The loss ledger over HTTP: for each summary Loupe wrote of a thread, which anchors of what it
//! covers it kept and which it dropped (`store::ledger`).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::answers::{Overloaded, ThreadNotFound};
use super::problem::{ApiError, ApiPath, ApiQuery, Problem};
use super::search::{IndexState, ZoomAddress};
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::history::anchors::AnchorKind;
use crate::store::{IndexLag, LedgerFilter, LedgerSummary, SummaryLedger};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(thread_ledger))
}

/// Most summaries one answer holds.
const MAX_SUMMARIES: u32 = 200;

/// Which summaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SummaryKindDto {
    /// A compaction's summary (an entry of the thread).
    Compaction,
    /// A summarized line of the thread's outline.
    Line,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LedgerParams {
    /// Only anchors of this kind.
    pub kind: Option<AnchorKind>,
    /// Only compaction summaries, or only outline lines.
    pub summary: Option<SummaryKindDto>,
    /// List only dropped anchors (the counts still hold both).
    pub dropped_only: Option<bool>,
    /// Most summaries, 1–200 (default 50), the first in seq order.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// One anchor of what a summary covers.
#[derive(Debug, Serialize, ToSchema)]
pub struct LedgerAnchorDto {
    pub kind: AnchorKind,
    /// The anchor as the entry wrote it.
    pub text: String,
    /// The first covered entry that holds it (`zoom(seq, 1)` opens it).
    pub seq: i64,
    /// Whether the summary holds it.
    pub kept: bool,
}

/// Kept and dropped anchors of one kind.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnchorCounts {
    pub kept: u64,
    pub dropped: u64,
}

/// One summary's ledger.
#[derive(Debug, Serialize, ToSchema)]
pub struct SummaryLedgerDto {
    pub summary: SummaryKindDto,
    /// A compaction summary's own seq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    /// An outline line's zoom address (`id+n`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<ZoomAddress>,
    /// Who wrote it (`extractive`, `anthropic:<model>`, …).
    pub summarizer: String,
    /// The entries it covers have seqs in `[first_seq, end_seq)`.
    pub first_seq: i64,
    pub end_seq: i64,
    /// Kept and dropped anchors, by kind (every anchor read, whatever `dropped_only`).
    pub counts: BTreeMap<AnchorKind, AnchorCounts>,
    pub anchors: Vec<LedgerAnchorDto>,
    /// Whether bounds left anchors out: at most 500 are listed, read from the first 4,096
    /// entries with anchors in its range.
    pub truncated: bool,
}

impl From<SummaryLedger> for SummaryLedgerDto {
    fn from(ledger: SummaryLedger) -> Self {
        let (summary, seq, line) = match ledger.summary {
            LedgerSummary::Compaction { seq } => (SummaryKindDto::Compaction, Some(seq), None),
            LedgerSummary::Line { node } => (
                SummaryKindDto::Line,
                None,
                Some(ZoomAddress {
                    id: node.first() as i64,
                    n: node.span() as i64,
                }),
            ),
        };
        SummaryLedgerDto {
            summary,
            seq,
            line,
            summarizer: ledger.summarizer,
            first_seq: ledger.first_seq,
            end_seq: ledger.end_seq,
            counts: ledger
                .counts
                .into_iter()
                .map(|(kind, (kept, dropped))| (kind, AnchorCounts { kept, dropped }))
                .collect(),
            anchors: ledger
                .anchors
                .into_iter()
                .map(|anchor| LedgerAnchorDto {
                    kind: anchor.kind,
                    text: anchor.text,
                    seq: anchor.seq,
                    kept: anchor.kept,
                })
                .collect(),
            truncated: ledger.truncated,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LedgerResponse {
    /// The summaries Loupe wrote of the thread, in seq order: its compactions' summaries, and
    /// the summarized lines its outline shows now.
    pub summaries: Vec<SummaryLedgerDto>,
    /// The index the anchors are read from (entries not indexed yet have none here).
    pub index: IndexState,
}

/// The thread's loss ledger: for each summary Loupe wrote (a compaction's summary, a summarized
/// outline line), the anchors of the entries it covers (file paths, commands, URLs, identifiers
/// and error codes, numbers with units), each kept (the summary holds it) or dropped. What a
/// summary dropped, search finds. Snipped and erased entries have no anchors.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/ledger", tag = "search", operation_id = "getLedger",
    params(ThreadPath, LedgerParams),
    responses(
        (status = 200, description = "The thread's ledger", body = LedgerResponse),
        (status = 400, description = "A bad query parameter", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        Overloaded,
    )
)]
pub async fn thread_ledger(
    State(state): State<AppState>,
    _slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(params): ApiQuery<LedgerParams>,
) -> Result<Json<LedgerResponse>, ApiError> {
    let filter = LedgerFilter {
        kind: params.kind,
        compactions: params.summary.map(|s| s == SummaryKindDto::Compaction),
        dropped_only: params.dropped_only.unwrap_or(false),
        limit: super::page_limit(params.limit, 50, MAX_SUMMARIES)? as usize,
    };
    let ledger = state
        .store
        .ledger(&tenant, &path.thread_id, &filter)
        .await?;
    Ok(Json(LedgerResponse {
        summaries: ledger.summaries.into_iter().map(Into::into).collect(),
        index: IndexLag {
            indexed_through: ledger.indexed_through,
            pending: ledger.pending,
        }
        .into(),
    }))
}
