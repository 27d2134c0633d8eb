//! The REST API: one router per resource, the shared state, and the middleware stack.

pub mod admin;
pub mod answers;
pub mod budget;
pub mod consistency;
pub mod context;
pub mod cursors;
pub mod docs;
pub mod document;
pub mod economics;
pub mod erasures;
pub mod events;
mod forks;
pub mod guard;
pub mod health;
pub mod jobs;
pub mod ledger;
pub mod messages;
pub mod observe;
pub mod options;
pub mod problem;
pub mod retention;
pub mod search;
pub mod settings;
pub mod threads;
pub mod transcripts;
pub mod tree;
pub mod ui;
pub mod webhooks;

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

use crate::store::{Store, TenantId};
pub use guard::{AuthMode, ExpensiveSlot, Guards};
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
    /// Requests per second each tenant may send on average (0: no limit).
    pub rate_limit_per_sec: f64,
    /// Requests a tenant may send at once above the average rate.
    pub rate_limit_burst: u32,
    /// Most expensive requests (context reads, normalization) running at once.
    pub max_expensive_requests: usize,
    /// How long an expensive request waits for a slot before 503 `overloaded`.
    pub expensive_wait: Duration,
    /// Most expensive requests one tenant may run at once (its share of the slots).
    pub max_expensive_per_tenant: usize,
    /// Longest time a request body may take to arrive; slower gets 408 `body-timeout`.
    pub body_read_timeout: Duration,
    /// Largest thread metadata, in bytes of JSON.
    pub max_metadata_bytes: usize,
    /// Most bytes of message bodies in one page of messages (at least one message is returned).
    pub max_page_bytes: usize,
    /// Most open client connections (the listener stops accepting beyond them).
    pub max_connections: usize,
    /// Longest time a connection may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// Bytes of normalized context prefixes kept in memory, so a context read normalizes only
    /// what was appended since the last one (0: every read normalizes the whole window).
    pub context_cache_bytes: usize,
    /// Entries a context read that finds no checkpoint fetches and normalizes at a time: what it
    /// holds parsed at once, whatever the length of the window.
    pub context_page_entries: usize,
    /// Host names open mode answers on `/v1` and `/metrics` besides loopback's (`localhost`,
    /// `127.0.0.1`, `[::1]`), lower case and without a port.
    pub allowed_hosts: Vec<String>,
    /// Slowest average rate, in bytes per second, at which an import's body may arrive once its
    /// first `body_read_timeout` has passed; a slower import is cut off with 408 `body-timeout`.
    pub import_min_bytes_per_sec: u64,
    /// Longest an import may run, however fast its body arrives.
    pub import_timeout: Duration,
    /// Most imports one tenant may run at once.
    pub max_imports_per_tenant: usize,
    /// Most requests one tenant may have in flight at once, a streamed answer until its last
    /// byte: its share of the connections (open mode has one tenant, which gets them all).
    pub max_requests_per_tenant: usize,
    /// Longest a connection's write may wait for the client to read before the connection is
    /// closed: a client that stops reading an answer does not hold its connection.
    pub write_timeout: Duration,
    /// Memory the request bodies held at once across the process may take, each counted as
    /// it will be once parsed (`json_weight`) plus the copies storing it makes
    /// (`guard::body_peak_bytes`); past it a request is answered 503 `overloaded` with
    /// `Retry-After`, and a body that alone would pass it 413.
    pub max_inflight_body_bytes: usize,
    /// Bytes of stored entries that answers hold at once across the process (`http::budget`):
    /// context reads of a window past [`guard::WINDOW_FLOOR_BYTES`], message pages, cursor
    /// batches, exports, rounds and event streams wait for room first; one larger than the whole
    /// budget runs alone, and a tenant holds at most half of it.
    pub max_inflight_window_bytes: usize,
    /// Of `max_connections`, how many one peer address (an IPv6 /64) may hold at once; past it
    /// its new connections are closed as they come. 0 for no limit (behind a reverse proxy,
    /// which is one address for every client).
    pub max_connections_per_address: usize,
    /// Failed authentications one peer address may make per second on average (0: no limit);
    /// past the burst, its requests are answered 429 before any key is looked up.
    pub auth_failures_per_sec: f64,
    pub auth_failure_burst: u32,
    /// Webhook endpoints on loopback and private addresses are accepted (and sent to).
    pub webhooks_allow_private: bool,
}

impl Limits {
    /// The defaults, which the command line's flags also take theirs from.
    pub const DEFAULT: Limits = Limits {
        // The size of the largest provider request (Anthropic Messages, 32 MB).
        body_bytes: 32 * 1024 * 1024,
        request_timeout: Duration::from_secs(30),
        max_batch_messages: 10_000,
        max_page_size: 200,
        max_page_size_messages: 1_000,
        cursor_lease_default: Duration::from_secs(60),
        cursor_lease_max: Duration::from_secs(3_600),
        rate_limit_per_sec: 50.0,
        rate_limit_burst: 100,
        max_expensive_requests: 16,
        expensive_wait: Duration::from_millis(500),
        max_expensive_per_tenant: 8,
        body_read_timeout: Duration::from_secs(10),
        max_metadata_bytes: 16 * 1024,
        max_page_bytes: 4 * 1024 * 1024,
        max_connections: 1_024,
        header_read_timeout: Duration::from_secs(10),
        context_cache_bytes: 256 * 1024 * 1024,
        context_page_entries: 1_024,
        allowed_hosts: Vec::new(),
        import_min_bytes_per_sec: 16 * 1024,
        import_timeout: Duration::from_secs(3_600),
        max_imports_per_tenant: 4,
        max_requests_per_tenant: 256,
        write_timeout: Duration::from_secs(30),
        max_inflight_body_bytes: 512 * 1024 * 1024,
        max_inflight_window_bytes: 256 * 1024 * 1024,
        max_connections_per_address: 256,
        auth_failures_per_sec: 1.0,
        auth_failure_burst: 20,
        webhooks_allow_private: false,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// What every handler can reach. One shared allocation: the router's layers and extractors
/// clone the state for every request, and a clone is then one reference count.
#[derive(Clone)]
pub struct AppState(Arc<SharedState>);

pub struct SharedState {
    pub store: Store,
    pub limits: Arc<Limits>,
    pub guards: Arc<Guards>,
    /// The threads' normalized context prefixes (`context::cache`), shared by every request.
    pub context_cache: Arc<crate::context::cache::ContextCache>,
}

impl std::ops::Deref for AppState {
    type Target = SharedState;

    fn deref(&self) -> &SharedState {
        &self.0
    }
}

impl AppState {
    /// The state of a service authenticating callers by `auth`.
    pub fn new(store: Store, limits: Limits, auth: AuthMode) -> Self {
        let guards = Arc::new(Guards::new(auth, &limits));
        let context_cache = Arc::new(crate::context::cache::ContextCache::new(
            limits.context_cache_bytes,
        ));
        AppState(Arc::new(SharedState {
            store,
            limits: Arc::new(limits),
            guards,
            context_cache,
        }))
    }
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

/// Checks a string a request names something by (a uuid, a lease token, a name): at most `max`
/// characters (as the document's `maxLength` and an entry's own uuid count them) and no NUL
/// character, which PostgreSQL cannot store or compare. 422 names the field.
pub(crate) fn check_key_field(path: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.chars().count() > max || value.contains('\0') {
        return Err(ApiError::invalid_field(
            path,
            format!("must be at most {max} characters, without NUL characters"),
        ));
    }
    Ok(())
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
        (name = "context", description = "Model-ready views: API rounds, the normalized context, snips, erasures"),
        (name = "transcripts", description = "Whole transcripts as JSON Lines: import and export"),
        (name = "cursors", description = "Incremental consumers: named bookmarks, pending batches, leases"),
        (name = "jobs", description = "Background jobs: compaction"),
        (name = "tree", description = "The summary tree: the outline and zoom(id, n)"),
        (name = "search", description = "Search everything a thread holds, and the search tool"),
        (name = "webhooks", description = "Signed deliveries of a tenant's thread events to its endpoints"),
        (name = "admin", description = "Tenants and API keys (admin key only)"),
        (name = "operations", description = "Health, readiness and metrics"),
    ),
    // Named only by query parameters, which utoipa does not collect.
    components(schemas(context::ContextView)),
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(threads::router())
        .merge(forks::router())
        .merge(events::router())
        .merge(webhooks::router())
        .merge(retention::router())
        .merge(messages::router())
        .merge(context::router())
        .merge(erasures::router())
        .merge(cursors::router())
        .merge(admin::router())
        .merge(jobs::router())
        .merge(settings::router())
        .merge(transcripts::router())
        .merge(tree::router())
        .merge(search::router())
        .merge(ledger::router())
        .merge(economics::router())
        .merge(health::router())
        .merge(observe::router())
}

/// The routes and their OpenAPI document, with the security requirements added.
fn documented_api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = api_router().split_for_parts();
    document::document_security(&mut openapi);
    (router, openapi)
}

/// The OpenAPI document of the whole API, as served at `/openapi.json`.
pub fn openapi() -> serde_json::Value {
    document::complete(&documented_api().1)
}

/// The service: every route, with its middleware.
pub fn router(state: AppState) -> Router {
    crate::metrics::init();
    let (api, openapi) = documented_api();
    let openapi = Arc::new(document::complete(&openapi));
    let spec = openapi.clone();
    let request_id = HeaderName::from_static("x-request-id");
    let limits = state.limits.clone();
    api.route("/openapi.json", get(move || async move { Json(spec.as_ref().clone()) }))
        .merge(docs::router())
        .merge(ui::router())
        .fallback(|| async { ApiError::new(ProblemKind::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(ProblemKind::MethodNotAllowed, "method not allowed on this route")
        })
        .layer(middleware::from_fn_with_state(state.clone(), guard::read_body))
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(middleware::from_fn_with_state(limits, timeout))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(ProblemKind::Internal, "a handler panicked").into_response()
        }))
        .layer(middleware::from_fn(observe::log_faults))
        .layer(middleware::from_fn(observe::record_metrics))
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
        .layer(middleware::from_fn(observe::problem_request_id))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        // Outermost: it sees every answer, the guards' early ones too.
        .layer(middleware::from_fn(guard::close_when_body_unread))
        .with_state(state)
}

/// Answers 503 `timeout` when a request runs longer than the configured limit. A streamed
/// import has no overall limit: it runs as long as its body keeps arriving.
async fn timeout(
    axum::extract::State(limits): axum::extract::State<Arc<Limits>>,
    request: Request,
    next: Next,
) -> Response {
    if guard::is_streamed_import(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        // A fault of the moment (the service too busy to answer in time): worth a retry.
        Err(_) => ApiError::retry_after(
            ProblemKind::Timeout,
            format!("the request took longer than {:?}", limits.request_timeout),
            1,
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    /// Counted in characters, as an entry's own uuid and the document's `maxLength` are: a uuid an
    /// append accepts is accepted where a request names it.
    #[test]
    fn key_fields_are_counted_in_characters() {
        assert!(check_key_field("to", &"é".repeat(200), 200).is_ok());
        assert!(check_key_field("to", &"é".repeat(201), 200).is_err());
        assert!(check_key_field("to", "a\0b", 200).is_err());
    }

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
