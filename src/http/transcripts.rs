//! `/v1/threads/{thread_id}/import` and `/export`: a thread as JSON Lines, one entry per line,
//! in and out, or as one JSON array of the same entries (chosen by `Content-Type` and `Accept`).

use std::time::Duration;

use super::consistency::{on_standby, ReadToken, Written};
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
use super::budget::read_within_room;
use super::guard::AnswerRoom;
use super::problem::{ApiError, ApiPath, ApiQuery, Problem, ProblemKind};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::model::Entry;
use crate::import::{ArraySplitter, ImportReport, Importer, LineSplitter, MalformedArray};
use crate::store::{Seq, Store, TenantId, ThreadId};

/// The media type of both directions by default: JSON Lines.
pub const NDJSON: &str = "application/x-ndjson";
/// The other form of both directions: one JSON array of the same entries.
pub const JSON: &str = "application/json";
/// Most entries per database read while exporting.
pub const EXPORT_PAGE_ENTRIES: i64 = 1000;
/// Most bytes of stored bodies per database read while exporting (a page always holds one
/// entry, however large): what an export holds at once, whatever the thread's size.
pub const EXPORT_PAGE_BYTES: u64 = 4 * 1024 * 1024;

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
/// The body is JSON Lines (`Content-Type: application/x-ndjson`), or the same entries as one JSON
/// array (`Content-Type: application/json`), which obeys every rule below with "item" for "line":
/// the array is read item by item as it arrives, each item bounded by the body limit, and a
/// refusal's `line` is the item's 1-based place in the array. A JSON body that is not one array
/// (a syntax error, an unclosed array, anything after it) is 400 `bad-request` where it goes
/// wrong, with the batches before kept.
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
        description = "JSON Lines (`application/x-ndjson`): one JSON entry per line (UTF-8, `\\n` or `\\r\\n`); blank lines are skipped; a line may be as long as the server's body limit (`--body-limit`). Or JSON (`application/json`): one array of the same entries, read item by item as it arrives; an item may be as long as the body limit, and one spread over several lines is stored as one line.",
        content(
            (String = "application/x-ndjson"),
            (Vec<Entry> = "application/json"),
        )
    ),
    responses(
        (status = 200, description = "The body was read to its end; the counts say what was stored, skipped and refused", body = ImportReport),
        (status = 400, description = "A bad query parameter, the body could not be read, or a JSON body is not one array (`bad-request`, `detail` says where); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body stalled past the body-read timeout, arrived slower than the minimum import rate, or ran past the import timeout (`body-timeout`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 409, description = "Other writers kept storing this import's entries between its reads and its appends, past a few re-planned attempts (`partial-replay` or `uuid-conflict`): send the same body again, and what is stored counts as `already_stored`; batches committed before stay", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "A batch would take the thread past the server's limit on its stored bytes (`thread-too-large`, with `stored_bytes` and `limit_bytes`); batches committed before stay", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is neither `application/x-ndjson` nor `application/json` (`unsupported-media-type`)", body = Problem, content_type = "application/problem+json"),
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
) -> Result<(Written, Json<ImportReport>), ApiError> {
    let form = match media_type(&headers, header::CONTENT_TYPE) {
        Some(media) if media.eq_ignore_ascii_case(NDJSON) => Form::Lines,
        Some(media) if media.eq_ignore_ascii_case(JSON) => Form::Array,
        _ => {
            return Err(ApiError::new(
                ProblemKind::UnsupportedMediaType,
                format!("the body must be {NDJSON} or {JSON}"),
            ))
        }
    };
    let _import_slot = state.guards.import_slot(&tenant)?;
    state.store.get_thread(&tenant, &path.thread_id).await?;
    let importer = Importer::new(
        state.store.clone(),
        tenant.clone(),
        path.thread_id.clone(),
        query.previous_uuid.unwrap_or_default(),
    )
    .with_max_parsed_bytes(state.limits.max_inflight_body_bytes);
    let mut stream = body.into_data_stream();
    let mut pace = ImportPace::new(&state.limits);
    // Each line, or each item of the array, is bounded by the body limit.
    let max_piece = state.limits.body_bytes;
    let report = match form {
        Form::Lines => {
            let mut importer = importer;
            let mut splitter = LineSplitter::new(max_piece);
            while let Some(chunk) = pace.next(&mut stream).await? {
                for piece in splitter.feed(&chunk) {
                    importer.push_piece(piece).await?;
                }
            }
            if let Some(piece) = splitter.finish() {
                importer.push_piece(piece).await?;
            }
            importer.finish().await?
        }
        Form::Array => {
            let mut importer = importer.of_array_items();
            let mut splitter = ArraySplitter::new(max_piece);
            while let Some(chunk) = pace.next(&mut stream).await? {
                for piece in splitter.feed(&chunk).map_err(malformed)? {
                    importer.push_piece(piece).await?;
                }
            }
            splitter.finish().map_err(malformed)?;
            importer.finish().await?
        }
    };
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let report = ImportReport {
        lsn: written.lsn(),
        ..report
    };
    Ok((written, Json(report)))
}

/// The two forms of a transcript: JSON Lines (the default), or one JSON array of the same entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Lines,
    Array,
}

/// 400 `bad-request` for a JSON body that is not one array; the batches before it are stored.
fn malformed(error: MalformedArray) -> ApiError {
    ApiError::bad_request(format!("{error}; the batches before it are stored"))
}

/// The essence of a media-type header (`application/json` of `application/json; charset=utf-8`).
fn media_type(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
}

/// The form an export is sent in: JSON when the `Accept` header ranks `application/json` above
/// JSON Lines (by its `q` values, a type named before a wildcard), JSON Lines otherwise, and when
/// it names neither.
fn export_form(headers: &HeaderMap) -> Form {
    let mut lines = 0.0_f32;
    let mut array = 0.0_f32;
    // The most specific range that matches each type sets its quality.
    let mut lines_rank = 0;
    let mut array_rank = 0;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let rank = |exact: &str| match media.as_str() {
                m if m == exact => 3,
                "application/*" => 2,
                "*/*" => 1,
                _ => 0,
            };
            let (l, a) = (rank(NDJSON), rank(JSON));
            if l > lines_rank {
                (lines_rank, lines) = (l, quality);
            }
            if a > array_rank {
                (array_rank, array) = (a, quality);
            }
        }
    }
    if array > lines {
        Form::Array
    } else {
        Form::Lines
    }
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
///
/// With `Accept: application/json` the same entries come as one JSON array, each item on a line
/// of its own and byte for byte as in JSON Lines; imported back (`Content-Type:
/// application/json`) it gives the same entries. Either form streams a page at a time: the
/// export holds a few MiB whatever the thread's size.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/export", tag = "transcripts", operation_id = "exportTranscript",
    params(ThreadPath),
    responses(
        (status = 200, description = "The thread, streamed: one entry per line (`application/x-ndjson`, the default), or one array of the entries (`application/json`, when `Accept` prefers it)", content(
            (String = "application/x-ndjson"),
            (Vec<Entry> = "application/json"),
        )),
        ThreadNotFound,
    )
)]
pub async fn export_transcript(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    headers: HeaderMap,
    token: ReadToken,
) -> Result<Response, ApiError> {
    let form = export_form(&headers);
    let (tenant_ref, thread_id) = (&tenant, &path.thread_id);
    // The pages after the first are read where it was: a standby gone mid-export ends the
    // stream (the client sees it cut short, never a page out of place).
    // Each page is read within room of the answer budget, held until the next is read: by then
    // the connection has taken what came before.
    let guards = &*state.guards;
    let (store, first) = on_standby(
        &state,
        tenant_ref,
        Some(thread_id),
        token,
        |store| async move {
            let first = read_within_room(guards, tenant_ref, EXPORT_PAGE_BYTES, |bytes| {
                let (store, tenant, thread_id) =
                    (store.clone(), tenant_ref.clone(), thread_id.clone());
                async move {
                    let after = Seq::new(-1);
                    let page =
                        store.export_page(&tenant, &thread_id, after, EXPORT_PAGE_ENTRIES, bytes);
                    page.await
                }
            })
            .await?;
            Ok((store, first))
        },
    )
    .await?;
    let pages = export_pages(
        state.clone(),
        store,
        tenant,
        path.thread_id,
        shrunk_to_page(first),
    );
    let (body, media) = match form {
        Form::Lines => (
            Body::from_stream(pages.map(|page| page.map(|page| jsonl(&page)))),
            NDJSON,
        ),
        Form::Array => {
            let mut first_item = true;
            let items = pages.map(move |page| {
                page.map(|page| {
                    let items = json_items(&page, first_item);
                    first_item = false;
                    items
                })
            });
            let open = futures_util::stream::once(std::future::ready(Ok(Bytes::from_static(b"["))));
            let close =
                futures_util::stream::once(std::future::ready(Ok(Bytes::from_static(b"\n]\n"))));
            (Body::from_stream(open.chain(items).chain(close)), JSON)
        }
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    headers.insert(header::VARY, HeaderValue::from_static("accept"));
    Ok(response)
}

/// The pages of an export, each read when the client has taken the one before: the export holds
/// one page at a time, in room of the answer budget held until the next page is read. An empty
/// page ends it.
fn export_pages(
    state: AppState,
    store: Store,
    tenant: TenantId,
    thread_id: ThreadId,
    first: ExportPage,
) -> impl futures_util::Stream<Item = Result<Vec<(i64, String)>, std::io::Error>> {
    enum Next {
        Read(ExportPage),
        After(i64, Option<AnswerRoom>),
    }
    futures_util::stream::unfold(Some(Next::Read(first)), move |next| {
        let (state, store, tenant, thread_id) = (
            state.clone(),
            store.clone(),
            tenant.clone(),
            thread_id.clone(),
        );
        async move {
            let (page, room) = match next? {
                Next::Read(page) => page,
                Next::After(seq, held) => {
                    drop(held);
                    let read =
                        read_within_room(&state.guards, &tenant, EXPORT_PAGE_BYTES, |bytes| {
                            let (store, tenant) = (store.clone(), tenant.clone());
                            let thread_id = thread_id.clone();
                            async move {
                                let after = Seq::new(seq);
                                let page = store.export_page(
                                    &tenant,
                                    &thread_id,
                                    after,
                                    EXPORT_PAGE_ENTRIES,
                                    bytes,
                                );
                                page.await
                            }
                        });
                    match read.await {
                        Ok(page) => shrunk_to_page(page),
                        // The answer is under way: the client sees it cut short.
                        Err(error) => return Some((Err(std::io::Error::other(error)), None)),
                    }
                }
            };
            let (last_seq, _) = page.last()?;
            let after = *last_seq;
            Some((Ok(page), Some(Next::After(after, room))))
        }
    })
}

/// A page of an export, with its room in the answer budget.
type ExportPage = (Vec<(i64, String)>, Option<AnswerRoom>);

/// `page` with room for what it holds once read: its bodies, sent as they are.
fn shrunk_to_page((page, mut room): ExportPage) -> ExportPage {
    if let Some(room) = room.as_mut() {
        room.shrink_to(page.iter().map(|(_, body)| body.len() as u64 + 2).sum());
    }
    (page, room)
}

/// Stored bodies as items of a JSON array, each on a line of its own: `first` when no item
/// precedes them (the array's `[` is sent before, its `]` after).
pub fn json_items(page: &[(i64, String)], first: bool) -> Bytes {
    let mut out = Vec::with_capacity(page.iter().map(|(_, body)| body.len() + 2).sum());
    for (index, (_, body)) in page.iter().enumerate() {
        if !(first && index == 0) {
            out.push(b',');
        }
        out.push(b'\n');
        out.extend_from_slice(body.as_bytes());
    }
    Bytes::from(out)
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
