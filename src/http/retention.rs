//! Retention policies: the tenant's (`/v1/retention`) and a thread's own
//! (`/v1/threads/{thread_id}/retention`), which the retention job applies (`store::retention`).

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound};
use super::consistency::Written;
use super::problem::{ApiError, ApiJson, ApiPath, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::store::{millis_to_datetime, RetentionPolicy, ThreadRetention};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_tenant_retention, put_tenant_retention))
        .routes(routes!(
            get_thread_retention,
            put_thread_retention,
            delete_thread_retention
        ))
}

/// The longest age a policy may name: 100 years.
const MAX_SECONDS: u64 = 100 * 365 * 24 * 3_600;

/// A retention policy. With nothing set, threads are kept for ever.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"delete_after_idle_seconds": 2592000, "delete_after_seconds": null,
    "trim_before_last_boundary": true}))]
pub struct RetentionBody {
    /// Delete a thread once it has had no append or metadata change for this long.
    #[schema(minimum = 1, maximum = 3153600000_u64)]
    pub delete_after_idle_seconds: Option<u64>,
    /// Delete a thread this long after it was created.
    #[schema(minimum = 1, maximum = 3153600000_u64)]
    pub delete_after_seconds: Option<u64>,
    /// Keep only what follows the last compact boundary: the entries before the context window
    /// are erased (their compaction summary stays; forks keep their own copies).
    #[serde(default)]
    pub trim_before_last_boundary: bool,
}

impl RetentionBody {
    fn policy(&self) -> Result<RetentionPolicy, ApiError> {
        let millis = |field: &str, seconds: Option<u64>| match seconds {
            None => Ok(None),
            Some(s) if (1..=MAX_SECONDS).contains(&s) => Ok(Some(s as i64 * 1000)),
            Some(_) => Err(ApiError::invalid_field(
                field,
                format!("must be between 1 and {MAX_SECONDS} seconds"),
            )),
        };
        Ok(RetentionPolicy {
            idle_ms: millis("delete_after_idle_seconds", self.delete_after_idle_seconds)?,
            age_ms: millis("delete_after_seconds", self.delete_after_seconds)?,
            trim: self.trim_before_last_boundary,
        })
    }

    fn of(policy: RetentionPolicy) -> Self {
        RetentionBody {
            delete_after_idle_seconds: policy.idle_ms.map(|ms| (ms / 1000) as u64),
            delete_after_seconds: policy.age_ms.map(|ms| (ms / 1000) as u64),
            trim_before_last_boundary: policy.trim,
        }
    }
}

/// A thread's retention.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadRetentionResponse {
    /// The thread's own policy, which replaces its tenant's whole; `null` when it follows the
    /// tenant's.
    pub own: Option<RetentionBody>,
    pub tenant: RetentionBody,
    /// The policy that applies.
    pub effective: RetentionBody,
    /// When the thread expires as it stands (an append moves an idle limit on); `null` for
    /// never. An expired thread is gone at once, as a deleted one (404 to every request by its
    /// id), and its rows are deleted by the next sweep.
    pub expires_at: Option<DateTime<Utc>>,
    /// The consistency token of a change to the thread's policy (also the `Loupe-LSN` header).
    /// Present only on a change, where the service reads from standbys.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

// Flat rather than a flattened `RetentionBody`, whose schema allows no other member.
/// The tenant's retention policy as a change set it, with the change's token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantRetentionResponse {
    /// As set (see `RetentionBody`).
    #[schema(minimum = 1, maximum = 3153600000_u64)]
    pub delete_after_idle_seconds: Option<u64>,
    /// As set (see `RetentionBody`).
    #[schema(minimum = 1, maximum = 3153600000_u64)]
    pub delete_after_seconds: Option<u64>,
    /// As set (see `RetentionBody`).
    pub trim_before_last_boundary: bool,
    /// The change's consistency token (also the `Loupe-LSN` header): a tenant-wide search sent
    /// with it leaves out the threads the policy expires. Present only where the service reads
    /// from standbys.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

impl From<ThreadRetention> for ThreadRetentionResponse {
    fn from(retention: ThreadRetention) -> Self {
        let effective = retention.effective();
        ThreadRetentionResponse {
            own: retention.own.map(RetentionBody::of),
            tenant: RetentionBody::of(retention.tenant),
            effective: RetentionBody::of(effective),
            expires_at: effective
                .expires_at(retention.created_at, retention.updated_at)
                .map(millis_to_datetime),
            lsn: None,
        }
    }
}

/// The tenant's retention policy, for its threads without one of their own.
#[utoipa::path(
    get, path = "/v1/retention", tag = "threads", operation_id = "getRetention",
    responses((status = 200, description = "The tenant's policy", body = RetentionBody))
)]
pub async fn get_tenant_retention(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<Json<RetentionBody>, ApiError> {
    Ok(Json(RetentionBody::of(
        state.store.tenant_retention(&tenant).await?,
    )))
}

/// Set the tenant's retention policy.
///
/// Threads it expires are gone at once, as deleted ones: they leave `GET /v1/threads` and
/// search, and every request by their id (reads, appends, forks, event streams) is 404
/// `not-found`. The retention job, which runs every minute, deletes them whole (as
/// `DELETE /v1/threads/{id}` deletes) and reports each as a `thread.expired` webhook event. A
/// trimming policy erases what precedes the last compact boundary of every thread that changed
/// since the last sweep (`thread.trimmed`).
#[utoipa::path(
    put, path = "/v1/retention", tag = "threads", operation_id = "putRetention",
    request_body = RetentionBody,
    responses(
        (status = 200, description = "The policy was set", body = TenantRetentionResponse),
        MalformedJson,
        (status = 422, description = "A time out of range (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn put_tenant_retention(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<RetentionBody>,
) -> Result<(Written, Json<TenantRetentionResponse>), ApiError> {
    let policy = body.policy()?;
    state.store.set_tenant_retention(&tenant, &policy).await?;
    let written = Written::now(&state, &tenant, None).await;
    let RetentionBody {
        delete_after_idle_seconds,
        delete_after_seconds,
        trim_before_last_boundary,
    } = RetentionBody::of(policy);
    let response = TenantRetentionResponse {
        delete_after_idle_seconds,
        delete_after_seconds,
        trim_before_last_boundary,
        lsn: written.lsn(),
    };
    Ok((written, Json(response)))
}

/// A thread's retention: its own policy, its tenant's, and when it expires.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/retention", tag = "threads",
    operation_id = "getThreadRetention",
    params(ThreadPath),
    responses(
        (status = 200, description = "The thread's retention", body = ThreadRetentionResponse),
        ThreadNotFound,
    )
)]
pub async fn get_thread_retention(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<Json<ThreadRetentionResponse>, ApiError> {
    let retention = state
        .store
        .thread_retention(&tenant, &path.thread_id)
        .await?;
    Ok(Json(retention.into()))
}

/// Give a thread a retention policy of its own, in place of its tenant's.
#[utoipa::path(
    put, path = "/v1/threads/{thread_id}/retention", tag = "threads",
    operation_id = "putThreadRetention",
    params(ThreadPath),
    request_body = RetentionBody,
    responses(
        (status = 200, description = "The thread's retention", body = ThreadRetentionResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "A time out of range (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn put_thread_retention(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(body): ApiJson<RetentionBody>,
) -> Result<(Written, Json<ThreadRetentionResponse>), ApiError> {
    let policy = body.policy()?;
    let retention = state
        .store
        .set_thread_retention(&tenant, &path.thread_id, Some(&policy))
        .await?;
    answer_thread_retention(state, tenant, path, retention).await
}

/// Make a thread follow its tenant's retention policy again.
#[utoipa::path(
    delete, path = "/v1/threads/{thread_id}/retention", tag = "threads",
    operation_id = "deleteThreadRetention",
    params(ThreadPath),
    responses(
        (status = 200, description = "The thread's retention", body = ThreadRetentionResponse),
        ThreadNotFound,
    )
)]
pub async fn delete_thread_retention(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<(Written, Json<ThreadRetentionResponse>), ApiError> {
    let retention = state
        .store
        .set_thread_retention(&tenant, &path.thread_id, None)
        .await?;
    answer_thread_retention(state, tenant, path, retention).await
}

/// The answer to a change of a thread's policy: the retention it now has (as the change set
/// it: a policy that expires the thread answers with its `expires_at`, though the thread is
/// gone from then on), with the change's token.
async fn answer_thread_retention(
    state: AppState,
    tenant: crate::store::TenantId,
    path: ThreadPath,
    retention: crate::store::ThreadRetention,
) -> Result<(Written, Json<ThreadRetentionResponse>), ApiError> {
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let response = ThreadRetentionResponse {
        lsn: written.lsn(),
        ..retention.into()
    };
    Ok((written, Json(response)))
}
