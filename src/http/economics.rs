//! A thread's economics over HTTP: the context's size at each request the history shows, as
//! Loupe estimated it and as the response reported it, and the input cost so far, reported and
//! under a modelled automatic compaction (`history::economics`, read by `store::economics`).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::answers::{Overloaded, ThreadNotFound};
use super::problem::{ApiError, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::history::economics::{MarkerKind, Point, MODELLED_SUMMARY_TOKENS};
use crate::history::normalize::EstimateBasis;
use crate::store::{EconomicsRead, ThreadSettings};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(thread_economics))
}

/// Most points one answer holds.
const MAX_POINTS: u32 = 10_000;
/// Points an answer holds when the query names no `limit`.
const DEFAULT_POINTS: u32 = 2_000;
/// Most markers one answer holds (at least three: one entry's markers are never split).
const MAX_MARKERS: usize = 10_000;
/// The window drawn when the query names none: a 200K model's.
const DEFAULT_WINDOW_TOKENS: u64 = 200_000;
const MIN_WINDOW_TOKENS: u64 = 1_000;
const MAX_WINDOW_TOKENS: u64 = 10_000_000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EconomicsParams {
    /// Answer the requests and markers at seqs after this one (from the start when omitted): a
    /// cut-short answer's `next_after_seq`. The figures stay cumulative from the thread's start.
    pub after_seq: Option<i64>,
    /// Most points, 1–10,000 (default 2,000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
    /// The model's context window in tokens, answered as `window_tokens` for a chart's ceiling:
    /// 1,000–10,000,000 (default 200,000).
    #[param(minimum = 1000, maximum = 10000000)]
    pub window_tokens: Option<u64>,
}

/// What the thread's settings send the model: the whole window, old tool results cleared
/// (reversibly), an outline of the old entries, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsMode {
    Plain,
    Clearing,
    Outline,
    OutlineClearing,
}

impl EconomicsMode {
    fn of(settings: &ThreadSettings) -> Self {
        let outline = settings.outline.is_some_and(|o| o.enabled);
        match (outline, settings.clearing_options().is_some()) {
            (false, false) => EconomicsMode::Plain,
            (false, true) => EconomicsMode::Clearing,
            (true, false) => EconomicsMode::Outline,
            (true, true) => EconomicsMode::OutlineClearing,
        }
    }
}

/// Loupe's estimate of the context before a request.
#[derive(Debug, Serialize, ToSchema)]
pub struct EconomicsEstimate {
    pub tokens: u64,
    pub basis: EstimateBasis,
}

/// What a response's `usage` reports (each figure a non-negative integer, at most
/// 1,000,000,000; anything else counts 0).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReportedUsage {
    /// The prompt, cache reads and writes included: Anthropic's `input_tokens +
    /// cache_read_input_tokens + cache_creation_input_tokens`, OpenAI Responses' `input_tokens`,
    /// Chat Completions' `prompt_tokens`, Gemini's `promptTokenCount + toolUsePromptTokenCount`.
    pub prompt_tokens: u64,
    /// Anthropic's and Responses' `output_tokens`, Chat Completions' `completion_tokens`,
    /// Gemini's `candidatesTokenCount + thoughtsTokenCount`.
    pub output_tokens: u64,
}

/// Cumulative input cost up to and including this request, in token-units at prompt-cache
/// prices (plain input 1×, cache writes 1.25×, cache reads 0.1×).
#[derive(Debug, Serialize, ToSchema)]
pub struct EconomicsCost {
    /// What the responses that report `usage` cost (plain input × 1 + cache writes × 1.25 +
    /// cache reads × 0.1, summed: Anthropic's `input_tokens`, `cache_creation_input_tokens` and
    /// `cache_read_input_tokens`; for OpenAI and Gemini, the cached tokens their prompt includes
    /// are its cache reads and the rest plain input); null at a response without `usage`.
    pub reported: Option<f64>,
    /// What the same history would cost under the modelled automatic compaction (see the
    /// operation).
    pub auto_compaction: f64,
}

/// One request of the history: an assistant response, at its first entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct EconomicsPoint {
    /// The response's first entry (streamed fragments share `message.id`).
    pub seq: i64,
    /// The entry's own `timestamp` field (when it happened), null when it has none; at most
    /// 100 characters.
    pub timestamp: Option<String>,
    /// `message.model`, at most 100 characters.
    pub model: Option<String>,
    /// The context estimate made of the entries before the response only: what a context read
    /// of the thread as it stood then answers as `context_tokens`, less the `overhead_tokens` a
    /// content-only read adds (what the tenant had learned then is not stored).
    pub estimate: EconomicsEstimate,
    /// Null when the response has no `usage`.
    pub reported: Option<ReportedUsage>,
    pub cost: EconomicsCost,
}

impl From<Point> for EconomicsPoint {
    fn from(point: Point) -> Self {
        let units = |hundredths: u64| hundredths as f64 / 100.0;
        EconomicsPoint {
            seq: point.seq,
            timestamp: point.timestamp,
            model: point.model,
            estimate: EconomicsEstimate {
                tokens: point.estimate,
                basis: point.basis,
            },
            reported: point.reported.map(|r| ReportedUsage {
                prompt_tokens: r.prompt_tokens,
                output_tokens: r.output_tokens,
            }),
            cost: EconomicsCost {
                reported: point.cost_reported.map(units),
                auto_compaction: units(point.cost_auto_compaction),
            },
        }
    }
}

/// What a marker marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsMarkerKind {
    /// A compact boundary entry.
    Compaction,
    /// Reversible clearing's frontier moved: the request at this seq is the first to send a
    /// batch of old tool results as stubs.
    Clearing,
    /// An outline merge: the outline's boundary moved here (the thread's next seq then), so the
    /// request after it is the first sent with the new lines.
    Outline,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EconomicsMarker {
    pub seq: i64,
    pub kind: EconomicsMarkerKind,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EconomicsResponse {
    pub thread_id: String,
    /// The context window the query named (default 200,000).
    pub window_tokens: u64,
    /// The automatic-compaction threshold in force: the thread's, else the server's (0: off).
    pub auto_compact_tokens: i64,
    /// The size of the summary the modelled automatic compaction leaves.
    pub modelled_summary_tokens: u64,
    pub mode: EconomicsMode,
    /// The thread's next seq when the read started: entries from it on are not counted.
    pub next_seq: i64,
    /// The requests after `after_seq`, in seq order.
    pub points: Vec<EconomicsPoint>,
    /// Compact boundaries, clearing batches and outline merges after `after_seq`, in seq order.
    pub markers: Vec<EconomicsMarker>,
    /// Whether `limit` (or the bound of 10,000 markers) cut the answer short.
    pub truncated: bool,
    /// When truncated: entries up to this seq are answered; pass it as `after_seq` to read on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<i64>,
}

fn window_tokens(requested: Option<u64>) -> Result<u64, ApiError> {
    match requested {
        None => Ok(DEFAULT_WINDOW_TOKENS),
        Some(tokens) if (MIN_WINDOW_TOKENS..=MAX_WINDOW_TOKENS).contains(&tokens) => Ok(tokens),
        Some(tokens) => Err(ApiError::bad_request(format!(
            "window_tokens must be between {MIN_WINDOW_TOKENS} and {MAX_WINDOW_TOKENS}, got {tokens}"
        ))),
    }
}

/// A thread's economics: its context's size and input cost at each request.
///
/// One point per assistant response in the history (streamed fragments sharing `message.id`
/// count once, at their first entry; synthetic and API-error entries are not requests): Loupe's
/// context estimate before it (made of the entries before it only, by the rules of
/// `context_tokens`), the prompt size its `usage` reports, and the cumulative input cost in
/// token-units at prompt-cache prices (plain input 1×, cache writes 1.25×, cache reads 0.1×), as
/// reported and under a modelled automatic compaction.
///
/// The model: the context grows by the content estimate of each entry (the history's own
/// compaction summaries left out); before a request whose prompt reaches the threshold in force
/// from below, it is replaced by a summary of `modelled_summary_tokens` (4,000). A prompt is the
/// fixed part (system prompt and tools: what the first response with `usage` reports beyond
/// the content before it, taken as cached from the first request on) plus the context. Each
/// request pays 0.1× for the prefix the previous request shared and 1.25× for the rest; after a
/// compaction only the fixed part is shared. The summarizer's own request is not counted.
///
/// Markers: compact boundaries; clearing batches when the thread clears old tool results (the
/// rule run over the results after each boundary, a turn ending at the next request); outline
/// merges, where the outline's boundary moved (an outline saved before merges were kept: its
/// current boundary).
///
/// The thread is read a page at a time; at most `limit` points are answered, then `truncated`
/// and `next_after_seq` say where to go on (a read that goes on folds the entries before
/// `after_seq` again, without answering them).
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/economics", tag = "context", operation_id = "getThreadEconomics",
    params(ThreadPath, EconomicsParams),
    responses(
        (status = 200, description = "The thread's requests, sizes, costs and markers", body = EconomicsResponse),
        (status = 400, description = "A bad query parameter", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        Overloaded,
    )
)]
pub async fn thread_economics(
    State(state): State<AppState>,
    _slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(params): ApiQuery<EconomicsParams>,
) -> Result<Json<EconomicsResponse>, ApiError> {
    let limit = super::page_limit(params.limit, DEFAULT_POINTS, MAX_POINTS)? as usize;
    let window_tokens = window_tokens(params.window_tokens)?;
    let read = EconomicsRead {
        after_seq: params.after_seq.unwrap_or(-1).max(-1),
        limit,
        max_markers: MAX_MARKERS,
    };
    let economics = state
        .store
        .economics(&tenant, &path.thread_id, read)
        .await?;
    Ok(Json(EconomicsResponse {
        thread_id: path.thread_id.as_str().to_owned(),
        window_tokens,
        auto_compact_tokens: economics.auto_compact_tokens,
        modelled_summary_tokens: MODELLED_SUMMARY_TOKENS,
        mode: EconomicsMode::of(&economics.settings),
        next_seq: economics.next_seq,
        points: economics.points.into_iter().map(Into::into).collect(),
        markers: economics
            .markers
            .into_iter()
            .map(|marker| EconomicsMarker {
                seq: marker.seq,
                kind: match marker.kind {
                    MarkerKind::Compaction => EconomicsMarkerKind::Compaction,
                    MarkerKind::Clearing => EconomicsMarkerKind::Clearing,
                    MarkerKind::Outline => EconomicsMarkerKind::Outline,
                },
            })
            .collect(),
        truncated: economics.next_after_seq.is_some(),
        next_after_seq: economics.next_after_seq,
    }))
}
