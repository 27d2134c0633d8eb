//! Background jobs: `GET /v1/jobs/{job_id}`, a thread's latest jobs
//! `GET /v1/threads/{thread_id}/jobs`, and the compaction trigger
//! `POST /v1/threads/{thread_id}/compact`.

use super::consistency::Written;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::jobs::compaction::DEFAULT_KEEP_RECENT_ROUNDS;
use crate::jobs::CompactionPayload;
use crate::store::{millis_to_datetime, now_millis, Job, JobState, ThreadJobs};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_job))
        .routes(routes!(list_thread_jobs))
        .routes(routes!(compact_thread))
}

/// Most jobs `GET /v1/threads/{thread_id}/jobs` returns (the latest ones).
const MAX_THREAD_JOBS: u32 = 100;

/// Most rounds a compaction may be asked to keep.
const MAX_KEEP_RECENT_ROUNDS: u32 = 10_000;
/// Longest custom instructions for a compaction summary, in characters (JSON Schema's
/// `maxLength` counts characters).
const MAX_INSTRUCTIONS_CHARS: usize = 16 * 1024;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct JobPath {
    /// The job's id (`job_…`).
    pub job_id: String,
}

/// A background job.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "job_0193a1c2d3e4f5a6b7c8d9e0f1a2b3c4", "kind": "compaction",
    "state": "succeeded", "thread_id": "support-4711", "attempts": 1, "max_attempts": 5,
    "payload": {"thread_id": "support-4711", "trigger": "manual", "keep_recent_rounds": 2},
    "result": {"compacted": true, "boundary_seq": 120, "summary_seq": 121,
        "preserved_segment": {"first_seq": 96, "last_seq": 119}, "messages_summarized": 90,
        "pre_tokens": 170000, "summarizer": "extractive", "summarizer_calls": 0},
    "run_after": "2026-11-29T17:00:00Z", "created_at": "2026-11-29T17:00:00Z",
    "updated_at": "2026-11-29T17:00:02Z", "finished_at": "2026-11-29T17:00:02Z"}))]
pub struct JobResponse {
    pub id: String,
    /// `compaction` (or `noop`).
    pub kind: String,
    pub state: JobState,
    /// The thread the job works on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// Claims so far, the running one included.
    pub attempts: i64,
    /// After this many failed attempts the job is `failed`.
    pub max_attempts: i64,
    /// The error of the last failed attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[schema(value_type = Object)]
    pub payload: Value,
    /// What the job did, once `succeeded`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// A pending job is not claimed before this time (retry backoff).
    pub run_after: DateTime<Utc>,
    /// While `running`: when the worker's lease ends unless renewed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

impl From<Job> for JobResponse {
    fn from(job: Job) -> Self {
        JobResponse {
            thread_id: job
                .payload
                .get("thread_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            id: job.id,
            kind: job.kind,
            state: job.state,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            last_error: job.last_error,
            payload: job.payload,
            result: job.result,
            run_after: millis_to_datetime(job.run_after),
            lease_expires_at: job.lease_expires_at.map(millis_to_datetime),
            created_at: millis_to_datetime(job.created_at),
            updated_at: millis_to_datetime(job.updated_at),
            finished_at: job.finished_at.map(millis_to_datetime),
            lsn: None,
        }
    }
}

/// A background job: its state, attempts, last error and result.
#[utoipa::path(
    get, path = "/v1/jobs/{job_id}", tag = "jobs", operation_id = "getJob",
    params(JobPath),
    responses(
        (status = 200, description = "The job", body = JobResponse),
        (status = 404, description = "No such job (`not-found`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_job(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<JobPath>,
) -> Result<Json<JobResponse>, ApiError> {
    let job = state.store.get_job(&tenant, &path.job_id).await?;
    Ok(Json(job.into()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ThreadJobsQuery {
    /// Most jobs returned, newest first: 1–100, default 20.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// A thread's latest jobs, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobListResponse {
    pub jobs: Vec<JobResponse>,
}

/// A thread's latest jobs (compaction and summary tree), newest first: each state, its attempts
/// and its last error. Older succeeded tree jobs are deleted as newer ones finish.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/jobs", tag = "jobs", operation_id = "listThreadJobs",
    params(ThreadPath, ThreadJobsQuery),
    responses(
        (status = 200, description = "The thread's latest jobs, newest first", body = JobListResponse),
        (status = 400, description = "`limit` out of 1–100 (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
    )
)]
pub async fn list_thread_jobs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<ThreadJobsQuery>,
) -> Result<Json<JobListResponse>, ApiError> {
    let limit = super::page_limit(query.limit, 20, MAX_THREAD_JOBS)?;
    let jobs = state
        .store
        .thread_jobs(&tenant, &path.thread_id, ThreadJobs::Newest(limit))
        .await?;
    Ok(Json(JobListResponse {
        jobs: jobs.into_iter().map(Into::into).collect(),
    }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"keep_recent_rounds": 2, "instructions": "Keep the exact error messages."}))]
pub struct CompactRequest {
    /// API rounds kept whole after the summary (default 2).
    #[schema(maximum = 10000)]
    pub keep_recent_rounds: Option<u32>,
    /// Extra instructions for a model summarizer (the extractive summarizer ignores them).
    #[schema(max_length = 16384)]
    pub instructions: Option<String>,
}

/// Compact the thread: a background job summarizes the context up to a round boundary, keeping
/// the last `keep_recent_rounds` rounds whole, and appends a compact boundary and the summary.
///
/// Nothing is deleted: earlier messages stay readable through the messages API. At most one
/// compaction per thread is pending or running: asking again returns that job with 200.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/compact", tag = "jobs", operation_id = "compactThread",
    params(ThreadPath),
    request_body = CompactRequest,
    responses(
        (status = 202, description = "A compaction job was enqueued", body = JobResponse),
        (status = 200, description = "A compaction of this thread is already pending or running: that job", body = JobResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "A bad option (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn compact_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<CompactRequest>,
) -> Result<(StatusCode, Written, Json<JobResponse>), ApiError> {
    let keep = request
        .keep_recent_rounds
        .unwrap_or(DEFAULT_KEEP_RECENT_ROUNDS);
    if keep > MAX_KEEP_RECENT_ROUNDS {
        return Err(ApiError::invalid_field(
            "keep_recent_rounds",
            format!("at most {MAX_KEEP_RECENT_ROUNDS}"),
        ));
    }
    if let Some(instructions) = &request.instructions {
        if instructions.chars().count() > MAX_INSTRUCTIONS_CHARS {
            return Err(ApiError::invalid_field(
                "instructions",
                format!("at most {MAX_INSTRUCTIONS_CHARS} characters"),
            ));
        }
    }
    let payload = CompactionPayload::manual(&path.thread_id, keep, request.instructions);
    let outcome = state
        .store
        .enqueue_compaction(
            &tenant,
            &path.thread_id,
            payload.to_value(),
            state.store.job_max_attempts(),
            now_millis(),
        )
        .await?;
    let status = if outcome.created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let job = JobResponse {
        lsn: written.lsn(),
        ..outcome.job.into()
    };
    Ok((status, written, Json(job)))
}
