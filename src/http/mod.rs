//! The REST API: one router per resource, the shared state, and the middleware stack.

pub mod context;
pub mod cursors;
pub mod health;
pub mod messages;
pub mod problem;
pub mod threads;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_scalar::{Scalar, Servable};

use crate::store::{Store, TenantId};
use problem::{ApiError, ProblemKind};

/// Bounds on what one request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest accepted request body, in bytes.
    pub body_bytes: usize,
    /// Longest a request may run before it is answered with 503 `timeout`.
    pub request_timeout: Duration,
    /// Most messages in one append.
    pub max_batch_messages: usize,
    /// Largest page of threads.
    pub max_page_size: u32,
    /// Largest page of messages.
    pub max_page_size_messages: u32,
    /// Lease of a cursor claim that names no `lease_seconds`.
    pub cursor_lease_default: Duration,
    /// Longest lease a cursor claim may ask for.
    pub cursor_lease_max: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The size of the largest provider request (Anthropic Messages, 32 MB).
            body_bytes: 32 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            max_batch_messages: 10_000,
            max_page_size: 200,
            max_page_size_messages: 1_000,
            cursor_lease_default: Duration::from_secs(60),
            cursor_lease_max: Duration::from_secs(3_600),
        }
    }
}

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
}

/// The tenant the request acts for, resolved by the authentication middleware.
pub struct Tenant(pub TenantId);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<TenantId>()
            .cloned()
            .map(Tenant)
            .ok_or_else(|| ApiError::new(ProblemKind::Internal, "no tenant was resolved"))
    }
}

/// Open mode: every request acts for the single default tenant.
async fn open_mode(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(TenantId::default_tenant());
    next.run(request).await
}

/// Validates a requested page size against its bounds.
pub(crate) fn page_limit(requested: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    match requested {
        None => Ok(default),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::bad_request(format!(
            "limit must be between 1 and {max}, got {limit}"
        ))),
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Loupe",
        description = "Keeps LLM conversation threads whole and hands them back ready for the model.\n\n\
            Errors are `application/problem+json` (RFC 9457); switch on `type` (`urn:loupe:problem:<kind>`).",
        license(name = "MIT", identifier = "MIT"),
    ),
    tags(
        (name = "threads", description = "Conversation threads"),
        (name = "messages", description = "The append-only history of a thread"),
        (name = "context", description = "Model-ready views: API rounds, the normalized context, snips"),
        (name = "cursors", description = "Incremental consumers: named bookmarks, pending batches, leases"),
        (name = "operations", description = "Health and readiness"),
    )
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(threads::router())
        .merge(messages::router())
        .merge(context::router())
        .merge(cursors::router())
        .merge(health::router())
}

/// The OpenAPI document of the whole API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().split_for_parts().1
}

/// The service: every route, with its middleware.
pub fn router(state: AppState) -> Router {
    let (api, openapi) = api_router().split_for_parts();
    let openapi = Arc::new(openapi);
    let spec = openapi.clone();
    let request_id = HeaderName::from_static("x-request-id");
    let limits = state.limits.clone();
    api.route("/openapi.json", get(move || async move { Json(spec.as_ref().clone()) }))
        .merge(Scalar::with_url("/docs", openapi.as_ref().clone()))
        .fallback(|| async { ApiError::new(ProblemKind::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(ProblemKind::MethodNotAllowed, "method not allowed on this route")
        })
        .layer(middleware::from_fn(open_mode))
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(middleware::from_fn_with_state(limits, timeout))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(ProblemKind::Internal, "a handler panicked").into_response()
        }))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    let request_id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default();
                    tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id)
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

/// Answers 503 `timeout` when a request runs longer than the configured limit.
async fn timeout(
    axum::extract::State(limits): axum::extract::State<Arc<Limits>>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            ProblemKind::Timeout,
            format!("the request took longer than {:?}", limits.request_timeout),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn a_request_over_the_time_limit_gets_a_503_problem() {
        let limits = Arc::new(Limits {
            request_timeout: Duration::from_secs(1),
            ..Limits::default()
        });
        let app: Router = Router::new()
            .route(
                "/slow",
                get(|| async {
                    // The paused clock jumps ahead: no real waiting.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    "too late"
                }),
            )
            .route("/fast", get(|| async { "in time" }))
            .layer(middleware::from_fn_with_state(limits, timeout));
        let slow = app
            .clone()
            .oneshot(Request::builder().uri("/slow").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(slow.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            slow.headers()[axum::http::header::CONTENT_TYPE],
            "application/problem+json"
        );
        let fast = app
            .oneshot(Request::builder().uri("/fast").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(fast.status(), axum::http::StatusCode::OK);
    }
}
