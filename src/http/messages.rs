//! `/v1/threads/{thread_id}/messages`: atomic, idempotent appends and paging.

use super::consistency::{on_standby, ReadToken, Written};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound, TooLargeToStore};
use super::budget::{hold_until_sent, read_within_room};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::history::ingest::check_entry;
use crate::history::model::Entry;
use crate::store::{AppendRequest, Seq, SeqWindow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(append_messages, list_messages))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "messages": [
        {"uuid": "6f1c7d2e-0000-4000-8000-000000000001", "type": "user",
         "message": {"role": "user", "content": "What is 50 * 50?"}},
        {"uuid": "6f1c7d2e-0000-4000-8000-000000000002", "type": "assistant",
         "message": {"role": "assistant", "id": "msg_01", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "calculator", "input": {"expr": "50*50"}}]}}
    ],
    "expected_next_seq": 0
}))]
pub struct AppendMessagesRequest {
    /// The batch, stored all or nothing, in order: 1 to `--max-batch-messages` (10,000 unless
    /// configured) entries. Each entry's JSON is stored as sent. The uuids given are unique
    /// within the batch (422 `validation` otherwise; JSON Schema's `uniqueItems` compares whole
    /// items, not one member).
    #[serde(deserialize_with = "crate::history::model::deserialize_sent_entries")]
    #[schema(min_items = 1, max_items = 10000)]
    pub messages: Vec<Entry>,
    /// Compare-and-append: 409 `seq-conflict` (nothing written) unless the thread's next seq is
    /// this value.
    pub expected_next_seq: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AppendMessagesResponse {
    /// The stored messages with their `seq`, `uuid` and `created_at`.
    pub messages: Vec<Entry>,
    /// The seq the next message will get.
    pub next_seq: i64,
    /// True when the whole batch was already stored (an idempotent retry): nothing was written.
    pub replayed: bool,
    /// Set when this append pushed the context's estimated tokens past the thread's
    /// auto-compaction threshold: the compaction job (see `GET /v1/jobs/{job_id}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_job_id: Option<String>,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MessagePageResponse {
    pub messages: Vec<Entry>,
    /// The thread's next seq when the page was read.
    pub next_seq: i64,
    /// Pass as `after_seq` to read on; absent when the page reached the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<i64>,
    /// With `order=desc`: pass as `before_seq` to read on (older); absent once seq 0 is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before_seq: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListMessagesQuery {
    /// Return messages with a greater seq (from the start when omitted). With `order=desc`, the
    /// page stops there instead of starting there.
    pub after_seq: Option<i64>,
    /// Page size, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// `asc` (oldest first, the default) or `desc` (newest first).
    #[param(inline)]
    pub order: Option<super::threads::SortOrder>,
    /// Return messages with a smaller seq (from the newest when omitted). With `order=desc` the
    /// page starts there; oldest first, it stops there. Both bounds together give a window.
    pub before_seq: Option<i64>,
}

/// Append messages to a thread, atomically.
///
/// Retries are safe: a batch whose uuids are all stored with the same content returns the stored
/// messages with `replayed: true` (200) and writes nothing.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/messages", tag = "messages", operation_id = "appendMessages",
    params(ThreadPath),
    request_body = AppendMessagesRequest,
    responses(
        (status = 201, description = "The batch was stored", body = AppendMessagesResponse),
        (status = 200, description = "The batch was already stored (idempotent retry)", body = AppendMessagesResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 409, description = "`seq-conflict` (another writer appended first; `next_seq` says where the thread is), `uuid-conflict` (a uuid stored with other content) or `partial-replay`", body = Problem, content_type = "application/problem+json"),
        TooLargeToStore,
        (status = 422, description = "An invalid message; `errors[].field` names it (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn append_messages(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<AppendMessagesRequest>,
) -> Result<(StatusCode, Written, Json<AppendMessagesResponse>), ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "must hold at least one message",
        ));
    }
    if request.messages.len() > state.limits.max_batch_messages {
        return Err(ApiError::invalid_field(
            "messages",
            format!(
                "at most {} messages per append",
                state.limits.max_batch_messages
            ),
        ));
    }
    for (index, entry) in request.messages.iter().enumerate() {
        check_entry(entry, &format!("messages[{index}]")).map_err(ApiError::field)?;
    }
    let outcome = state
        .store
        .append(
            &tenant,
            &path.thread_id,
            AppendRequest {
                entries: request.messages,
                expected_next_seq: request.expected_next_seq,
            },
        )
        .await?;
    // A snip appended here hides its messages from the summary tree before the answer, as one
    // sent to `/snip` does (a retry applies it again, in case the first was cut short).
    crate::jobs::erasure::hide_snipped(&state.store, &tenant, &path.thread_id, &outcome.messages)
        .await?;
    let status = if outcome.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    Ok((
        status,
        written.clone(),
        Json(AppendMessagesResponse {
            messages: outcome.messages,
            next_seq: outcome.next_seq,
            replayed: outcome.replayed,
            compaction_job_id: outcome.auto_compaction_job,
            lsn: written.lsn(),
        }),
    ))
}

/// Page through a thread's messages exactly as they were appended: oldest first from
/// `after_seq`, or newest first (`order=desc`) from `before_seq`.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/messages", tag = "messages", operation_id = "listMessages",
    params(ThreadPath, ListMessagesQuery),
    responses(
        (status = 200, description = "One page of messages in seq order (newest first with `order=desc`): at most `limit`, and cut once the stored bodies reach `--max-page-bytes` (4 MiB by default; a page holds at least one message). Go on from `next_after_seq` (or `next_before_seq`)", body = MessagePageResponse),
        (status = 400, description = "A bad query parameter", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
    )
)]
pub async fn list_messages(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<ListMessagesQuery>,
    token: ReadToken,
) -> Result<Response, ApiError> {
    let limit = super::page_limit(query.limit, 100, state.limits.max_page_size_messages)?;
    let (tenant, thread_id, query) = (&tenant, &path.thread_id, &query);
    let max_bytes = state.limits.max_page_bytes as u64;
    let guards = &*state.guards;
    let descending = query.order == Some(super::threads::SortOrder::Desc);
    let window = SeqWindow {
        after: query.after_seq.map(Seq::new),
        before: query.before_seq.map(Seq::new),
    };
    // The page holds its entries until it is sent: within room of the answer budget.
    let (page, room) = on_standby(&state, tenant, Some(thread_id), token, |store| async move {
        Ok(read_within_room(guards, tenant, max_bytes, |bytes| {
            let (store, tenant, thread_id) = (store.clone(), tenant.clone(), thread_id.clone());
            async move {
                let page = store
                    .list_messages_within(&tenant, &thread_id, window, descending, limit, bytes);
                page.await
            }
        })
        .await?)
    })
    .await?;
    let last_seq = page.messages.last().and_then(|m| m.seq);
    // A next page is offered while seqs remain inside the window past the last one returned.
    let (next_after_seq, next_before_seq) = if descending {
        let lowest = query
            .after_seq
            .map_or(0, |after| after.max(-1).saturating_add(1));
        (None, last_seq.filter(|seq| *seq > lowest))
    } else {
        let end = query
            .before_seq
            .map_or(page.next_seq, |before| before.min(page.next_seq));
        (last_seq.filter(|seq| seq + 1 < end), None)
    };
    let answer = Json(MessagePageResponse {
        messages: page.messages,
        next_seq: page.next_seq,
        next_after_seq,
        next_before_seq,
    })
    .into_response();
    Ok(hold_until_sent(&state, answer, room))
}
