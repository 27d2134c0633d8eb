//! Liveness and readiness probes.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::problem::{ApiError, Problem, ProblemKind};
use super::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HealthResponse {
    #[schema(example = "ok")]
    pub status: &'static str,
    /// The database backend, on `/readyz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "sqlite")]
    pub database: Option<&'static str>,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations", operation_id = "healthz",
    responses((status = 200, description = "The process is up", body = HealthResponse)))]
pub async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok",
        database: None,
    })
}

/// Readiness: the database answers.
#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "Ready to serve", body = HealthResponse),
        (status = 503, description = "The database does not answer (`unavailable`)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<HealthResponse>, ApiError> {
    state.store.ping().await.map_err(|error| {
        // The database's own words (host names, users) stay in the log.
        tracing::warn!(%error, "readiness check: the database does not answer");
        ApiError::retry_after(ProblemKind::Unavailable, "the database does not answer", 1)
    })?;
    Ok(Json(HealthResponse {
        status: "ok",
        database: Some(state.store.backend().name()),
    }))
}
