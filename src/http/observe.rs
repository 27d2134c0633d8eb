//! Observability: request metrics by route template, `GET /metrics`, and the request id in
//! problem bodies.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::problem::{Fault, Problem, ProblemKind};
use super::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Largest problem body rewritten to carry the request id (problems are small).
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// Prometheus metrics in the text exposition format. Guarded by the admin key when one is set.
#[utoipa::path(get, path = "/metrics", tag = "operations", operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
        (status = 401, description = "No valid admin key (`unauthorized`)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A tenant key instead of the admin key (`forbidden`)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let (size, idle) = state.store.pool_usage();
    crate::metrics::db_pool(size, idle);
    let groups = state.store.group_commit_stats();
    crate::metrics::append_groups(groups.groups, groups.appends, groups.split_groups);
    match state.store.queued_job_count().await {
        Ok(depth) => crate::metrics::set_jobs_queued(depth.max(0) as u64),
        // The scrape still answers; the gauge keeps its last value.
        Err(error) => tracing::warn!(%error, "cannot count the queued jobs"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(),
    )
        .into_response()
}

/// Logs the fault behind a 5xx answer once, with its cause chain, inside the request's span
/// (`ApiError` only attaches it to the response: the error path itself does not log).
pub async fn log_faults(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if let Some(fault) = response.extensions_mut().remove::<Fault>() {
        if fault.kind == ProblemKind::Internal {
            tracing::error!(kind = fault.kind.slug(), error = %fault, "request failed");
        } else {
            tracing::warn!(kind = fault.kind.slug(), error = %fault, "request failed");
        }
    }
    response
}

/// Counts every answered request by method, route template and status, with its latency.
pub async fn record_metrics(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(request.method());
    let start = Instant::now();
    let response = next.run(request).await;
    crate::metrics::http_request(method, &route, response.status().as_u16(), start.elapsed());
    response
}

/// Methods as a bounded label set (arbitrary extension methods would not be).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Adds `request_id` to every `application/problem+json` body, so a caller can quote it.
pub async fn problem_request_id(request: Request, next: Next) -> Response {
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let response = next.run(request).await;
    let Some(request_id) = request_id else {
        return response;
    };
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/problem+json"));
    if !is_problem {
        return response;
    }
    // A body too large to rewrite is passed on untouched rather than dropped.
    let size = axum::body::HttpBody::size_hint(response.body());
    if size
        .upper()
        .is_none_or(|upper| upper > MAX_PROBLEM_BYTES as u64)
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_PROBLEM_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return Response::from_parts(parts, Body::empty()),
    };
    let body = match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
        Ok(mut problem) => {
            problem.insert("request_id".to_owned(), request_id.into());
            serde_json::to_vec(&problem)
                .map(Body::from)
                .unwrap_or_else(|_| Body::from(bytes))
        }
        Err(_) => Body::from(bytes),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}
