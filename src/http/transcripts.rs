//! `/v1/threads/{thread_id}/import` and `/export`: a thread as JSON Lines, one entry per line,
//! in and out.

use std::time::Duration;

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
/// Most entries per database read while exporting.
pub const EXPORT_PAGE_ENTRIES: i64 = 1000;
/// Most bytes of stored bodies per database read while exporting (a page always holds one
/// entry, however large): what an export holds at once, whatever the thread's size.
pub const EXPORT_PAGE_BYTES: i64 = 4 * 1024 * 1024;

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
/// The body streams: it has no size limit (only each line is bounded by the body limit), and the
/// import holds at most a few MiB of it plus its largest line, whatever the file's size. Its time
/// is bounded three ways, each answered 408 `body-timeout` with the batches committed before
/// kept: each next piece must come within the body-read timeout (`--body-read-timeout-secs`),
/// past that timeout the body must keep an average of `--import-min-bytes-per-sec` (16 KiB/s by
/// default), and the whole import must end within `--import-timeout-secs` (an hour). A tenant
/// runs at most `--max-imports-per-tenant` imports at once (429 `too-many-in-flight` past it). A
/// file may also be sent in parts, each passing the previous part's `last_uuid` as
/// `previous_uuid`.
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
        (status = 408, description = "The body stalled past the body-read timeout, arrived slower than the minimum import rate, or ran past the import timeout (`body-timeout`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 413, description = "A batch would take the thread past the server's limit on its stored bytes (`thread-too-large`, with `stored_bytes` and `limit_bytes`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not `application/x-ndjson` (`unsupported-media-type`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant runs as many imports as it may at once (`too-many-in-flight`); see `Retry-After`", body = Problem, content_type = "application/problem+json"),
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
    let _import_slot = state.guards.import_slot(&tenant)?;
    state.store.get_thread(&tenant, &path.thread_id).await?;
    let mut importer = Importer::new(
        state.store.clone(),
        tenant,
        path.thread_id,
        query.previous_uuid.unwrap_or_default(),
    );
    let mut splitter = LineSplitter::new(state.limits.body_bytes);
    let mut stream = body.into_data_stream();
    let mut pace = ImportPace::new(&state.limits);
    while let Some(chunk) = pace.next(&mut stream).await? {
        for piece in splitter.feed(&chunk) {
            importer.push_piece(piece).await?;
        }
    }
    if let Some(piece) = splitter.finish() {
        importer.push_piece(piece).await?;
    }
    Ok(Json(importer.finish().await?))
}

/// The bounds on how an import's body arrives: each piece within the body-read timeout, an
/// average rate of at least `import_min_bytes_per_sec` once the first body-read timeout has
/// passed, and the whole import within `import_timeout`. The rate counts only the time spent
/// waiting for the client, so a slow database never cuts an import off.
struct ImportPace {
    started: tokio::time::Instant,
    /// Time spent waiting for the body's pieces.
    waited: Duration,
    received: u64,
    idle: Duration,
    min_rate: u64,
    deadline: Duration,
}

impl ImportPace {
    fn new(limits: &super::Limits) -> Self {
        ImportPace {
            started: tokio::time::Instant::now(),
            waited: Duration::ZERO,
            received: 0,
            idle: limits.body_read_timeout,
            min_rate: limits.import_min_bytes_per_sec,
            deadline: limits.import_timeout,
        }
    }

    /// The body's next piece (`None` at its end), or 408 `body-timeout` when the body breaks one
    /// of the bounds.
    async fn next(
        &mut self,
        stream: &mut axum::body::BodyDataStream,
    ) -> Result<Option<Bytes>, ApiError> {
        let left = self.deadline.saturating_sub(self.started.elapsed());
        let wait = self.idle.min(left);
        let asked = tokio::time::Instant::now();
        let next = tokio::time::timeout(wait, stream.next()).await;
        self.waited += asked.elapsed();
        let Ok(next) = next else {
            let detail = if wait < self.idle {
                format!(
                    "the import ran longer than {} s (`--import-timeout-secs`); the batches before it are stored",
                    self.deadline.as_secs()
                )
            } else {
                format!(
                    "no part of the body arrived for {} s; the batches before it are stored",
                    self.idle.as_secs_f64()
                )
            };
            return Err(ApiError::new(ProblemKind::BodyTimeout, detail));
        };
        let Some(chunk) = next else {
            return Ok(None);
        };
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        self.received += chunk.len() as u64;
        if self.waited > self.idle {
            let rate = self.received as f64 / self.waited.as_secs_f64();
            if rate < self.min_rate as f64 {
                return Err(ApiError::new(
                    ProblemKind::BodyTimeout,
                    format!(
                        "the body arrives at {rate:.0} bytes/s, slower than the {} bytes/s an import needs (`--import-min-bytes-per-sec`); the batches before it are stored",
                        self.min_rate
                    ),
                ));
            }
        }
        Ok(Some(chunk))
    }
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
        .export_page(
            &tenant,
            &path.thread_id,
            -1,
            EXPORT_PAGE_ENTRIES,
            EXPORT_PAGE_BYTES,
        )
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

/// The pages of an export, each read when the client has taken the one before: the export holds
/// one page at a time. An empty page ends it.
fn export_stream(
    store: Store,
    tenant: TenantId,
    thread_id: String,
    first: Vec<(i64, String)>,
) -> impl futures_util::Stream<Item = Result<Bytes, crate::store::StoreError>> {
    enum Next {
        Read(Vec<(i64, String)>),
        After(i64),
    }
    futures_util::stream::unfold(Some(Next::Read(first)), move |next| {
        let (store, tenant, thread_id) = (store.clone(), tenant.clone(), thread_id.clone());
        async move {
            let page = match next? {
                Next::Read(page) => page,
                Next::After(seq) => match store
                    .export_page(
                        &tenant,
                        &thread_id,
                        seq,
                        EXPORT_PAGE_ENTRIES,
                        EXPORT_PAGE_BYTES,
                    )
                    .await
                {
                    Ok(page) => page,
                    Err(error) => return Some((Err(error), None)),
                },
            };
            let (last_seq, _) = page.last()?;
            let after = *last_seq;
            Some((Ok(jsonl(&page)), Some(Next::After(after))))
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
