//! The summary tree over HTTP: `zoom` (the tool the model calls) and the outline page.

use super::consistency::{on_standby, ReadToken};
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, Problem};
use super::settings::OutlineBody;
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::model::Entry;
use crate::history::render::entry_text;
use crate::store::ZoomRead;
use crate::tree::{line_size, render_line, NodeId, ZoomError};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(zoom))
        .routes(routes!(get_outline))
}

/// The zoom tool's input, as the model wrote it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": 0, "n": 2}))]
pub struct ZoomRequest {
    /// The line's first message, as in `id+n`.
    pub id: i64,
    /// How many messages the line covers, as in `id+n`.
    pub n: i64,
}

/// One line of the outline or of a zoom.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LineDto {
    pub id: u64,
    pub n: u64,
    pub text: String,
    /// Who wrote the line (outline page only): `verbatim` when it is its source word for word (a
    /// message that fit the line, or two lines that fit side by side), otherwise the summarizer
    /// that wrote it (`extractive`, `anthropic:<model>`, `openai:<model>`,
    /// `fallback:extractive (…)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summarizer: Option<String>,
}

impl LineDto {
    fn new(node: NodeId, text: String) -> Self {
        LineDto {
            id: node.first(),
            n: node.span(),
            text,
            summarizer: None,
        }
    }
}

/// What a zoom shows for a half with no text: it covers only entries the model never sees.
const NOTHING_SENT: &str = "(nothing the model reads: progress or bookkeeping only)";
/// What zoom shows of a snipped message: that it is hidden, never what it said.
const HIDDEN_MESSAGE: &str = "(snipped: hidden from the model)";
/// What zoom shows of an erased message.
const ERASED_MESSAGE: &str = "(erased)";

fn zoom_text(text: String) -> String {
    if text.trim().is_empty() {
        NOTHING_SENT.to_owned()
    } else {
        text
    }
}

/// The answer to `zoom(id, n)`, ready to send back as the tool result.
#[derive(Debug, Serialize, ToSchema)]
pub struct ZoomResponse {
    /// The tool result's text: the two lines (`id+n|text`, one per line), the message written
    /// whole as `id+1|…`, or an error sentence the model can correct.
    pub content: String,
    /// Whether `content` is an error (send the tool result with `is_error: true`).
    pub is_error: bool,
    /// The two lines, for `n > 1`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<LineDto>,
    /// The stored entry, for `n = 1` (for a client that sends files as blocks, not text); absent
    /// for a snipped message, which zoom shows only as hidden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Entry>,
}

impl ZoomResponse {
    fn error(error: ZoomError) -> Self {
        ZoomResponse {
            content: error.to_string(),
            is_error: true,
            lines: Vec::new(),
            message: None,
        }
    }
}

/// `zoom(id, n)`: open line `id+n` into the two lines it was made from (`n/2` messages each), or,
/// with `n = 1`, read message `id` whole. A model's mistake (a malformed line, no such line or
/// message, halves not built yet) is a 200 answer with `is_error: true` and a sentence it can
/// correct; only the caller's mistakes (no thread, a body that is not `{id, n}`) are problems.
/// Two indexed reads, whatever the size of the thread.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/zoom", tag = "tree", operation_id = "zoom",
    params(ThreadPath),
    request_body = ZoomRequest,
    responses(
        (status = 200, description = "The tool result", body = ZoomResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "Not `{id, n}` with integers (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn zoom(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    token: ReadToken,
    ApiJson(body): ApiJson<ZoomRequest>,
) -> Result<Json<ZoomResponse>, ApiError> {
    let (tenant, thread_id, id, n) = (&tenant, &path.thread_id, body.id, body.n);
    let read = on_standby(&state, tenant, Some(thread_id), token, |store| async move {
        Ok(store.zoom_read(tenant, thread_id, id, n).await?)
    })
    .await?;
    let no_line = || ZoomError::NoSuchLine {
        id: body.id,
        n: body.n,
    };
    let response = match read {
        Err(error) => ZoomResponse::error(error),
        Ok(ZoomRead::Message(None))
        | Ok(ZoomRead::Halves(None, _))
        | Ok(ZoomRead::Halves(_, None)) => ZoomResponse::error(no_line()),
        Ok(ZoomRead::Hidden) => ZoomResponse {
            content: format!("{}+1|{HIDDEN_MESSAGE}", body.id),
            is_error: false,
            lines: Vec::new(),
            message: None,
        },
        Ok(ZoomRead::Erased) => ZoomResponse {
            content: format!("{}+1|{ERASED_MESSAGE}", body.id),
            is_error: false,
            lines: Vec::new(),
            message: None,
        },
        Ok(ZoomRead::Message(Some(entry))) => ZoomResponse {
            content: format!("{}+1|{}", body.id, entry_text(&entry)),
            is_error: false,
            lines: Vec::new(),
            message: Some(*entry),
        },
        Ok(ZoomRead::Halves(Some((left, left_text)), Some((right, right_text)))) => {
            let (left_text, right_text) = (zoom_text(left_text), zoom_text(right_text));
            ZoomResponse {
                content: format!(
                    "{}\n{}",
                    render_line(left, &left_text),
                    render_line(right, &right_text)
                ),
                is_error: false,
                lines: vec![
                    LineDto::new(left, left_text),
                    LineDto::new(right, right_text),
                ],
                message: None,
            }
        }
    };
    Ok(Json(response))
}

/// How far the background build has come.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildStatus {
    /// Nodes written so far (every level).
    pub nodes: i64,
    /// Nodes a summarizer wrote (the others are free: their source fit a line, word for word).
    pub summarized_nodes: i64,
    /// Model calls those nodes cost (free and extractive nodes cost none).
    pub summarizer_calls: i64,
    /// The thread's latest tree job: `pending`, `running`, `succeeded` or `failed`.
    pub last_job_state: Option<String>,
    /// Its last error, if its last attempt failed.
    pub last_error: Option<String>,
}

/// The outline for people and dashboards.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutlineResponse {
    pub options: OutlineBody,
    /// The outline covers the messages `[0, boundary)`; the rest are sent whole.
    pub boundary: u64,
    pub next_seq: i64,
    /// Bumped on every change of the outline; equal versions render identical bytes.
    pub version: i64,
    /// The lines the model reads, oldest first, each with who wrote it. A part of the thread
    /// holding only entries the model never sees (progress events, bookkeeping) has no line.
    pub lines: Vec<LineDto>,
    /// Bytes of the rendered lines (`id+n|text` and a newline each).
    pub line_bytes: usize,
    pub build: BuildStatus,
    /// The zoom tool definition, once the outline has a line (it is then in the context's tools).
    #[schema(value_type = Option<Object>)]
    pub zoom_tool: Option<Value>,
}

/// The thread's outline: its lines, the boundary, and the build status.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/outline", tag = "tree", operation_id = "getOutline",
    params(ThreadPath),
    responses(
        (status = 200, description = "The outline", body = OutlineResponse),
        ThreadNotFound,
    )
)]
pub async fn get_outline(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    token: ReadToken,
) -> Result<Json<OutlineResponse>, ApiError> {
    let (tenant, thread_id) = (&tenant, &path.thread_id);
    let (settings, snapshot, status) =
        on_standby(&state, tenant, Some(thread_id), token, |store| async move {
            let settings = store.thread_settings(tenant, thread_id).await?;
            let snapshot = store.outline_snapshot(tenant, thread_id).await?;
            let status = store.tree_status(&snapshot.thread_key).await?;
            Ok((settings, snapshot, status))
        })
        .await?;
    let line_bytes = snapshot
        .lines
        .iter()
        .map(|(node, text)| line_size(*node, text))
        .sum();
    Ok(Json(OutlineResponse {
        options: OutlineBody::from_options(settings.outline.unwrap_or_default()),
        boundary: snapshot.outline.boundary(),
        next_seq: snapshot.next_seq,
        version: snapshot.version,
        zoom_tool: (!snapshot.lines.is_empty()).then(crate::tree::zoom::tool_definition),
        lines: snapshot
            .lines
            .into_iter()
            .zip(snapshot.summarizers)
            .map(|((node, text), summarizer)| LineDto {
                summarizer: Some(summarizer),
                ..LineDto::new(node, text)
            })
            .collect(),
        line_bytes,
        build: BuildStatus {
            nodes: status.nodes,
            summarized_nodes: status.summarized,
            summarizer_calls: status.calls,
            last_job_state: status.last_job_state,
            last_error: status.last_error,
        },
    }))
}
