//! `POST /v1/threads/{thread_id}/fork`: a new thread from a prefix of another (`store::forks`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, Overloaded, ThreadNotFound};
use super::consistency::Written;
use super::guard::ExpensiveSlot;
use super::problem::{ApiError, ApiJson, ApiPath, Problem};
use super::threads::{check_metadata_size, check_thread_id, ThreadPath, ThreadResponse};
use super::{AppState, Tenant};
use crate::store::{NewFork, ThreadId};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(fork_thread))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"at_seq": 12, "id": "support-4711-retry", "metadata": {"user": "ana"}}))]
pub struct ForkThreadRequest {
    /// The fork takes the parent's entries with `seq < at_seq`: from 0 (an empty fork) to the
    /// parent's `message_count` (all of it, the default). A rewind is a fork at an earlier seq.
    #[schema(minimum = 0)]
    pub at_seq: Option<i64>,
    /// The fork's id, as a new thread's: 1–128 characters of `[A-Za-z0-9._:-]`, unique in the
    /// tenant (409 when taken, even by the parent). Generated when omitted.
    #[schema(pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 128)]
    pub id: Option<String>,
    /// The fork's metadata (at most `--max-metadata-bytes` of JSON); the parent's when omitted.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// Fork a thread at a message: a new thread whose history is the parent's entries before
/// `at_seq`, copied whole.
///
/// The parent is untouched. The fork is a thread like any other (append, context, outline, zoom,
/// cursors, compaction, export, erasure) and records its lineage in `forked_from`. It starts
/// with the parent's settings, the summary tree's lines that cover only what it took (no model
/// call is made again for them) and its search rows; cursors, jobs and erasure receipts are the
/// parent's alone. Later changes to the parent do not reach the fork, with one exception: an
/// erasure in the parent erases the same entries in every fork that took them (its receipt
/// names them). A snip is an edit of one thread's history: a fork made before it keeps what it
/// hid; erase to forget everywhere. Deleting the parent leaves the fork whole. The fork takes
/// the parent's own retention policy, if it has one (else it follows the tenant's, as every
/// thread), and its retention clock starts at the fork. An expired parent is 404.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/fork", tag = "threads", operation_id = "forkThread",
    params(ThreadPath),
    request_body = ForkThreadRequest,
    responses(
        (status = 201, description = "The fork was created", body = ThreadResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 409, description = "A thread with the fork's id exists (`thread-exists`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid field (`validation`): `at_seq` past the parent's messages, an invalid id, or metadata over its limit", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn fork_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<ForkThreadRequest>,
) -> Result<(StatusCode, Written, Json<ThreadResponse>), ApiError> {
    if let Some(id) = &request.id {
        check_thread_id(id)?;
    }
    if let Some(metadata) = &request.metadata {
        check_metadata_size(&state, metadata)?;
    }
    if let Some(at_seq) = request.at_seq {
        if at_seq < 0 {
            return Err(ApiError::invalid_field("at_seq", "must be 0 or more"));
        }
    }
    // The copy reads and writes the whole prefix: one of the tenant's expensive slots.
    let _slot = ExpensiveSlot::acquire(&state.guards, &tenant.0).await?;
    // A missing parent is 404 whatever the id asked for.
    state.store.thread_head(&tenant, &path.thread_id).await?;
    let fork = NewFork {
        at_seq: request.at_seq,
        id: request.id.map(ThreadId::new),
        metadata: request.metadata,
    };
    let thread = state
        .store
        .fork_thread(&tenant, &path.thread_id, fork)
        .await?;
    let written = Written::now(&state, &tenant, Some(&thread.id)).await;
    let response = ThreadResponse {
        lsn: written.lsn(),
        ..thread.into()
    };
    Ok((StatusCode::CREATED, written, Json(response)))
}
