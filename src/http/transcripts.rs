//! `/v1/threads/{thread_id}/import` and `/export`: a thread as JSON Lines, one entry per line,
//! in and out.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::ThreadNotFound;
use super::problem::{ApiError, ApiPath, ApiQuery, Problem, ProblemKind};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::import::{ImportReport, Importer, LineSplitter};
use crate::store::{Store, TenantId};

/// The media type of both directions.
pub const NDJSON: &str = "application/x-ndjson";
/// Entries per database read while exporting.
const EXPORT_PAGE: i64 = 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(import_transcript))
        .routes(routes!(export_transcript))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// When this body continues a file sent in an earlier request: that request's `last_uuid`,
    /// so entries without a uuid are named as in one import of the whole file.
    #[param(pattern = r"^[^\u0000]*$")]
    pub previous_uuid: Option<String>,
}

/// Import a transcript (JSON Lines, e.g. a Claude Code session file) into a thread.
///
/// The body is read as it arrives and appended in batches of 500 entries, each one atomic; the
/// answer counts what happened. Every entry type is accepted and stored exactly as sent (a type
/// Loupe does not model is kept and never sent to a model). A retry is idempotent: entries whose
/// uuid the thread already holds with the same content are skipped (`already_stored`); entries
/// without a uuid get one derived from the previous entry's uuid and the line. A line that cannot
/// be stored (not JSON, an invalid entry, a uuid stored with other content, longer than the body
/// limit) is refused with its line number and reason, and the import goes on. Sub-agent entries
/// (`isSidechain: true`) go to the thread `<thread_id>.agent-<agentId>`, created when missing with
/// `parent_thread`, `agent_id` and `sidechain: true` in its metadata.
///
/// The body streams: it has no size limit and no overall time limit (only each line is bounded
/// by the body limit), but the server waits at most the body-read timeout (`--body-read-timeout`)
/// for each next piece of it; a body that stalls longer is answered 408 `body-timeout`, and the
/// batches committed before stay. A file may also be sent in parts, each passing the previous
/// part's `last_uuid` as `previous_uuid`.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/import", tag = "transcripts", operation_id = "importTranscript",
    params(ThreadPath, ImportQuery),
    request_body(
        content = String, content_type = "application/x-ndjson",
        description = "One JSON entry per line (UTF-8, `\\n` or `\\r\\n`); blank lines are skipped; a line may be as long as the server's body limit (`--body-limit`)."
    ),
    responses(
        (status = 200, description = "The body was read to its end; the counts say what was stored, skipped and refused", body = ImportReport),
        (status = 400, description = "A bad query parameter, or the body could not be read (`bad-request`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The next piece of the body did not arrive within the body-read timeout (`body-timeout`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 415, description = "The body is not `application/x-ndjson` (`unsupported-media-type`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn import_transcript(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ImportReport>, ApiError> {
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    if !media_type.is_some_and(|m| m.eq_ignore_ascii_case(NDJSON)) {
        return Err(ApiError::new(
            ProblemKind::UnsupportedMediaType,
            format!("the body must be {NDJSON}"),
        ));
    }
    state.store.get_thread(&tenant, &path.thread_id).await?;
    let mut importer = Importer::new(
        state.store.clone(),
        tenant,
        path.thread_id,
        query.previous_uuid.unwrap_or_default(),
    );
    let mut splitter = LineSplitter::new(state.limits.body_bytes);
    let mut stream = body.into_data_stream();
    let idle = state.limits.body_read_timeout;
    // No overall deadline (a 1 GB file may take minutes), but a stalled client is cut off.
    while let Some(chunk) = tokio::time::timeout(idle, stream.next())
        .await
        .map_err(|_| {
            ApiError::new(
                ProblemKind::BodyTimeout,
                format!(
                    "no part of the body arrived for {} s; the batches before it are stored",
                    idle.as_secs_f64()
                ),
            )
        })?
    {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        for piece in splitter.feed(&chunk) {
            importer.push_piece(piece).await?;
        }
    }
    if let Some(piece) = splitter.finish() {
        importer.push_piece(piece).await?;
    }
    Ok(Json(importer.finish().await?))
}

/// Export a thread as JSON Lines: one entry per line, in seq order, each exactly the JSON that
/// was sent for it (entries Loupe wrote itself, such as compaction boundaries and summaries, as
/// Loupe wrote them). Importing the export into an empty thread gives the same entries back.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/export", tag = "transcripts", operation_id = "exportTranscript",
    params(ThreadPath),
    responses(
        (status = 200, description = "The thread, one entry per line, streamed", body = String, content_type = "application/x-ndjson"),
        ThreadNotFound,
    )
)]
pub async fn export_transcript(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<Response, ApiError> {
    let first = state
        .store
        .export_page(&tenant, &path.thread_id, -1, EXPORT_PAGE)
        .await?;
    let body = Body::from_stream(export_stream(
        state.store.clone(),
        tenant,
        path.thread_id,
        first,
    ));
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    Ok(response)
}

/// The pages of an export, read one at a time as the client consumes them.
fn export_stream(
    store: Store,
    tenant: TenantId,
    thread_id: String,
    first: Vec<(i64, String)>,
) -> impl futures_util::Stream<Item = Result<Bytes, crate::store::StoreError>> {
    futures_util::stream::unfold(Some(first), move |page| {
        let (store, tenant, thread_id) = (store.clone(), tenant.clone(), thread_id.clone());
        async move {
            let page = match page {
                Some(page) => page,
                None => return None,
            };
            if page.is_empty() {
                return None;
            }
            let full = page.len() as i64 == EXPORT_PAGE;
            let last_seq = page.last().map_or(-1, |(seq, _)| *seq);
            let bytes = jsonl(&page);
            let next = if full {
                match store
                    .export_page(&tenant, &thread_id, last_seq, EXPORT_PAGE)
                    .await
                {
                    Ok(next) => Some(next),
                    Err(error) => return Some((Err(error), None)),
                }
            } else {
                None
            };
            Some((Ok(bytes), next))
        }
    })
}

/// Whether a request is an import, whose body the handler streams itself: the body-reading guard
/// and the request timeout leave it alone.
pub fn is_streamed_import(method: &axum::http::Method, path: &str) -> bool {
    let mut segments = path.split('/');
    method == axum::http::Method::POST
        && segments.next() == Some("")
        && segments.next() == Some("v1")
        && segments.next() == Some("threads")
        && segments.next().is_some_and(|id| !id.is_empty())
        && segments.next() == Some("import")
        && segments.next().is_none()
}

/// Stored bodies as JSON Lines.
pub fn jsonl(page: &[(i64, String)]) -> Bytes {
    let mut out = Vec::with_capacity(page.iter().map(|(_, body)| body.len() + 1).sum());
    for (_, body) in page {
        out.extend_from_slice(body.as_bytes());
        out.push(b'\n');
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::is_streamed_import;
    use axum::http::Method;

    #[test]
    fn only_a_thread_import_is_streamed() {
        assert!(is_streamed_import(&Method::POST, "/v1/threads/t-1/import"));
        assert!(!is_streamed_import(&Method::GET, "/v1/threads/t-1/import"));
        assert!(!is_streamed_import(&Method::POST, "/v1/threads/t-1/export"));
        assert!(!is_streamed_import(&Method::POST, "/v1/threads//import"));
        assert!(!is_streamed_import(&Method::POST, "/v1/threads/t/import/x"));
        assert!(!is_streamed_import(&Method::POST, "/v1/threads/import"));
        assert!(!is_streamed_import(&Method::POST, "/v2/threads/t/import"));
    }
}
