//! Search over HTTP: a thread's entries, all of a tenant's, and the `search` tool the model
//! calls (its results in the outline's `id+n|text` form, so the next call is a zoom).

use super::consistency::{on_standby, ReadToken};
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::answers::{MalformedJson, Overloaded, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::store::{IndexLag, SearchHit, SearchQuery, MAX_QUERY_CHARS};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(search_thread, search_tool))
        .routes(routes!(search_tenant))
}

/// Most hits one search answers.
const MAX_HITS: u32 = 50;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// Words or exact strings, each matched as a case-insensitive substring (a path, a command,
    /// an error code, a number); `"a phrase"` in double quotes is one term. An entry matching
    /// more terms, or matching them more, ranks higher.
    #[param(min_length = 1, max_length = 500, pattern = r"^[^\u0000]*$")]
    pub q: String,
    /// Most hits, 1–50 (default 10).
    #[param(minimum = 1, maximum = 50)]
    pub limit: Option<u32>,
    /// Search thinking too (only when your requests send thinking back to the model).
    pub thinking: Option<bool>,
}

/// One entry found.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchHitDto {
    pub thread_id: String,
    /// The entry's seq; for a summary line, the first seq it covers.
    pub seq: i64,
    /// The entry's type (`user`, `assistant`, `attachment`, `system`), or `line` for a summary
    /// line of the thread's outline tree (which may say what no single entry says).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its role, for a message: `user` or `assistant`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The text around the first match, the match between « and ».
    pub snippet: String,
    /// Relevance, higher first; comparable within one answer only.
    pub score: f64,
    /// Whether the match is in the entry's thinking.
    pub in_thinking: bool,
    /// The zoom address that opens it: `zoom(id, n)` with these (`n` 1 for an entry, which
    /// zoom reads whole; a line's span, which zoom opens into its two halves).
    pub zoom: ZoomAddress,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ZoomAddress {
    pub id: i64,
    pub n: i64,
}

impl From<SearchHit> for SearchHitDto {
    fn from(hit: SearchHit) -> Self {
        let role = matches!(hit.kind.as_str(), "user" | "assistant").then(|| hit.kind.clone());
        SearchHitDto {
            zoom: ZoomAddress {
                id: hit.seq,
                n: hit.n,
            },
            thread_id: hit.thread_id,
            seq: hit.seq,
            kind: hit.kind,
            role,
            snippet: hit.snippet,
            score: hit.score,
            in_thinking: hit.in_thinking,
        }
    }
}

/// The index's progress on a thread: entries from `indexed_through_seq` on are not searched yet.
#[derive(Debug, Serialize, ToSchema)]
pub struct IndexState {
    pub indexed_through_seq: i64,
    /// Entries stored but not yet indexed (0 when the search saw everything).
    pub pending: i64,
}

impl From<IndexLag> for IndexState {
    fn from(lag: IndexLag) -> Self {
        IndexState {
            indexed_through_seq: lag.indexed_through,
            pending: lag.pending,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadSearchResponse {
    pub hits: Vec<SearchHitDto>,
    pub index: IndexState,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantSearchResponse {
    pub hits: Vec<SearchHitDto>,
    /// Entries of the tenant's threads not yet indexed (a worker, and each search, index them).
    pub pending: i64,
}

fn query_of(params: &SearchParams) -> Result<SearchQuery, ApiError> {
    let limit = super::page_limit(params.limit, 10, MAX_HITS)?;
    let chars = params.q.chars().count();
    if chars == 0 || chars > MAX_QUERY_CHARS {
        return Err(ApiError::bad_request(format!(
            "q must hold 1 to {MAX_QUERY_CHARS} characters, got {chars}"
        )));
    }
    Ok(SearchQuery {
        terms: SearchQuery::terms_of(&params.q),
        limit: i64::from(limit),
        thinking: params.thinking.unwrap_or(false),
    })
}

/// Search a thread: every text a model could read in its entries (messages, tool calls and
/// results, documents, compaction summaries), never a snipped or erased one. The thread's index
/// is brought up to date first.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/search", tag = "search", operation_id = "searchThread",
    params(ThreadPath, SearchParams),
    responses(
        (status = 200, description = "The hits, best first", body = ThreadSearchResponse),
        (status = 400, description = "A bad query parameter", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        Overloaded,
    )
)]
pub async fn search_thread(
    State(state): State<AppState>,
    _slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(params): ApiQuery<SearchParams>,
    token: ReadToken,
) -> Result<Json<ThreadSearchResponse>, ApiError> {
    let query = &query_of(&params)?;
    let (tenant, thread_id) = (&tenant, &path.thread_id);
    let (hits, lag) = on_standby(&state, tenant, Some(thread_id), token, |store| async move {
        Ok(store.search_thread(tenant, thread_id, query).await?)
    })
    .await?;
    Ok(Json(ThreadSearchResponse {
        hits: hits.into_iter().map(SearchHitDto::from).collect(),
        index: lag.into(),
    }))
}

/// Search all of the tenant's threads; each hit names its thread.
#[utoipa::path(
    get, path = "/v1/search", tag = "search", operation_id = "searchThreads",
    params(SearchParams),
    responses(
        (status = 200, description = "The hits, best first", body = TenantSearchResponse),
        (status = 400, description = "A bad query parameter", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn search_tenant(
    State(state): State<AppState>,
    _slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<SearchParams>,
    token: ReadToken,
) -> Result<Json<TenantSearchResponse>, ApiError> {
    let query = &query_of(&params)?;
    let tenant = &tenant;
    let (hits, pending) = on_standby(&state, tenant, None, token, |store| async move {
        Ok(store.search_tenant(tenant, query).await?)
    })
    .await?;
    Ok(Json(TenantSearchResponse {
        hits: hits.into_iter().map(SearchHitDto::from).collect(),
        pending,
    }))
}

/// The search tool's input, as the model wrote it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"query": "src/store/jobs.rs"}))]
pub struct SearchToolRequest {
    /// Words or exact strings to find; `"a phrase"` in quotes. The first 16 terms are used; a
    /// longer query than 500 characters is answered as the model's mistake.
    pub query: String,
    /// Most results (default 10, at most 50).
    pub limit: Option<i64>,
}

/// The answer to `search(query)`, ready to send back as the tool result.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchToolResponse {
    /// The tool result's text: one `id+n|snippet` line per hit, best first (zoom(id, 1) reads
    /// an entry whole; a summary line's hit is opened like any line), or a sentence the model
    /// can act on.
    pub content: String,
    /// Whether `content` is an error (send the tool result with `is_error: true`).
    pub is_error: bool,
}

/// `search(query)`: the tool the model calls. A model's mistake (an empty query) is a 200
/// answer with `is_error: true` and a sentence it can correct.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/search", tag = "search", operation_id = "searchTool",
    params(ThreadPath),
    request_body = SearchToolRequest,
    responses(
        (status = 200, description = "The tool result", body = SearchToolResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "Not `{query, limit?}` (`validation`)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn search_tool(
    State(state): State<AppState>,
    _slot: ExpensiveSlot,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    token: ReadToken,
    ApiJson(body): ApiJson<SearchToolRequest>,
) -> Result<Json<SearchToolResponse>, ApiError> {
    let terms = SearchQuery::terms_of(&body.query);
    let mistake = if body.query.chars().count() > MAX_QUERY_CHARS {
        Some(format!(
            "search takes at most {MAX_QUERY_CHARS} characters: search for one distinctive word \
             or string at a time."
        ))
    } else if terms.is_empty() {
        Some("search needs a query: the words or exact strings to find.".to_owned())
    } else {
        None
    };
    if let Some(content) = mistake {
        // The thread must exist even for a query the model got wrong; nothing is indexed.
        state.store.get_thread(&tenant, &path.thread_id).await?;
        return Ok(Json(SearchToolResponse {
            content,
            is_error: true,
        }));
    }
    let query = SearchQuery {
        terms,
        limit: body.limit.unwrap_or(10).clamp(1, i64::from(MAX_HITS)),
        thinking: false,
    };
    let (query, tenant, thread_id) = (&query, &tenant, &path.thread_id);
    let (hits, lag) = on_standby(&state, tenant, Some(thread_id), token, |store| async move {
        Ok(store.search_thread(tenant, thread_id, query).await?)
    })
    .await?;
    let mut content = if hits.is_empty() {
        format!(
            "Nothing in this conversation matches {:?}. Try another word, a shorter part of it, \
             or zoom into the summary.",
            body.query
        )
    } else {
        hits.iter()
            .map(|hit| format!("{}+{}|{}", hit.seq, hit.n, hit.snippet))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if lag.pending > 0 {
        content.push_str(&format!(
            "\n({} newer messages are not searched yet.)",
            lag.pending
        ));
    }
    Ok(Json(SearchToolResponse {
        content,
        is_error: false,
    }))
}
