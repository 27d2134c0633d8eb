//! Who may call what: authentication (open mode or API keys), the per-tenant rate limit, and the
//! bound on concurrent expensive requests.
//!
//! Access is decided by path, in one middleware, so a new route under `/v1/` is protected without
//! the handler doing anything:
//! - `/v1/admin/…`: the admin key (`LOUPE_ADMIN_KEY`) only;
//! - `/v1/…`: a tenant's API key (open mode: the default tenant, no key);
//! - `/metrics`: the admin key when one is set;
//! - everything else (`/healthz`, `/readyz`, `/openapi.json`, `/docs`, the inspector page `/ui`
//!   and its assets): public. The inspector reads its data through `/v1/…`, with a key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::{ApiError, ProblemKind};
use super::{AppState, Limits};
use crate::auth::{bearer_token, retry_after_secs, secrets_match, RateLimiter};
use crate::store::TenantId;

/// How callers authenticate.
#[derive(Clone)]
pub enum AuthMode {
    /// No keys configured: every `/v1` request acts for the default tenant.
    Open,
    /// Tenant requests need an API key; the admin API needs `admin_key` (off when `None`).
    Keyed { admin_key: Option<String> },
}

impl std::fmt::Debug for AuthMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthMode::Open => f.write_str("Open"),
            AuthMode::Keyed { admin_key } => f
                .debug_struct("Keyed")
                .field("admin_key", &admin_key.as_ref().map(|_| "***"))
                .finish(),
        }
    }
}

impl AuthMode {
    /// Keyed when an admin key is set or the database holds an active key; open otherwise.
    pub fn resolve(admin_key: Option<String>, has_active_keys: bool) -> Self {
        if admin_key.is_some() || has_active_keys {
            AuthMode::Keyed { admin_key }
        } else {
            AuthMode::Open
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, AuthMode::Open)
    }

    fn admin_key(&self) -> Option<&str> {
        match self {
            AuthMode::Keyed { admin_key } => admin_key.as_deref(),
            AuthMode::Open => None,
        }
    }
}

/// The shared state of the guard rails.
#[derive(Debug)]
pub struct Guards {
    pub auth: AuthMode,
    pub rate: RateLimiter,
    expensive: Arc<Semaphore>,
    expensive_wait: Duration,
    /// Each tenant's share of the expensive slots, so that one tenant cannot hold them all.
    tenant_share: usize,
    tenant_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Guards {
    pub fn new(auth: AuthMode, limits: &Limits) -> Self {
        Guards {
            rate: RateLimiter::new(limits.rate_limit_per_sec, limits.rate_limit_burst),
            expensive: Arc::new(Semaphore::new(limits.max_expensive_requests)),
            expensive_wait: limits.expensive_wait,
            // Open mode has one tenant: its share is the whole pool.
            tenant_share: if auth.is_open() {
                limits.max_expensive_requests
            } else {
                limits.max_expensive_per_tenant
            },
            tenant_slots: Mutex::new(HashMap::new()),
            auth,
        }
    }

    /// The semaphore of `tenant`'s share, created on first use. Shares nobody holds are dropped
    /// once the map grows, so it stays as small as the set of busy tenants.
    fn tenant_semaphore(&self, tenant: &str) -> Arc<Semaphore> {
        let mut slots = self
            .tenant_slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slots.len() >= 1_024 && !slots.contains_key(tenant) {
            slots.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
        }
        slots
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.tenant_share)))
            .clone()
    }
}

/// Which credentials a path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Public,
    Tenant,
    Admin,
    Metrics,
}

pub fn access_of(path: &str) -> Access {
    if path == "/metrics" {
        Access::Metrics
    } else if path == "/v1/admin" || path.starts_with("/v1/admin/") {
        Access::Admin
    } else if path == "/v1" || path.starts_with("/v1/") {
        Access::Tenant
    } else {
        Access::Public
    }
}

/// Who presented credentials.
enum Caller {
    Admin,
    Tenant(TenantId),
}

/// Resolves the bearer token of a request; 401 when it is missing, malformed, unknown or revoked.
async fn identify(state: &AppState, authorization: Option<&str>) -> Result<Caller, ApiError> {
    let Some(header) = authorization else {
        return Err(ApiError::unauthorized(
            "send an API key as `Authorization: Bearer <key>`",
        ));
    };
    let token = bearer_token(header)
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be `Bearer <key>`"))?;
    if let Some(admin_key) = state.guards.auth.admin_key() {
        if secrets_match(token, admin_key) {
            return Ok(Caller::Admin);
        }
    }
    match state.store.authenticate_api_key(token).await? {
        Some(identity) => Ok(Caller::Tenant(identity.tenant)),
        None => Err(ApiError::unauthorized(
            "the API key is not valid or was revoked",
        )),
    }
}

/// Authenticates and rate-limits every request, by the path's [`Access`].
pub async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    // Only owned copies cross the awaits below (a request body is not `Sync`).
    let path = request.uri().path().to_owned();
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or_default().to_owned());
    match authorize(&state, &path, authorization.as_deref()).await {
        Ok(tenant) => {
            if let Some(tenant) = tenant {
                request.extensions_mut().insert(tenant);
            }
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

/// The tenant a request acts for (`None` off the tenant API), or why it is refused.
async fn authorize(
    state: &AppState,
    path: &str,
    authorization: Option<&str>,
) -> Result<Option<TenantId>, ApiError> {
    let admin_off = || {
        ApiError::new(
            ProblemKind::Forbidden,
            "the admin API is off: set LOUPE_ADMIN_KEY, or use the `loupe keys` command",
        )
    };
    match access_of(path) {
        Access::Public => Ok(None),
        Access::Metrics => {
            if state.guards.auth.admin_key().is_none() {
                return Ok(None);
            }
            match identify(state, authorization).await? {
                Caller::Admin => Ok(None),
                Caller::Tenant(_) => Err(ApiError::new(
                    ProblemKind::Forbidden,
                    "/metrics needs the admin key",
                )),
            }
        }
        Access::Admin => {
            if state.guards.auth.admin_key().is_none() {
                return Err(admin_off());
            }
            match identify(state, authorization).await? {
                Caller::Admin => Ok(None),
                Caller::Tenant(_) => Err(ApiError::new(
                    ProblemKind::Forbidden,
                    "the admin API needs the admin key, not a tenant's key",
                )),
            }
        }
        Access::Tenant => {
            let tenant = if state.guards.auth.is_open() {
                TenantId::default_tenant()
            } else {
                match identify(state, authorization).await? {
                    Caller::Tenant(tenant) => tenant,
                    Caller::Admin => {
                        return Err(ApiError::new(
                            ProblemKind::Forbidden,
                            "the admin key acts for no tenant: use a tenant's API key",
                        ))
                    }
                }
            };
            if let Err(wait) = state.guards.rate.check(&tenant.0, Instant::now()) {
                crate::metrics::rate_limited();
                return Err(ApiError::retry_after(
                    ProblemKind::RateLimited,
                    "this tenant's request rate limit is exhausted",
                    retry_after_secs(wait),
                ));
            }
            Ok(Some(tenant))
        }
    }
}

/// A slot for an expensive request (context reads, rounds, normalization), held until the
/// handler returns: one of the tenant's share (`max_expensive_per_tenant`), then one of the
/// process's (`max_expensive_requests`). When none frees up within the configured wait, the
/// request is answered with 503 `overloaded` instead of queueing without bound. The body was read
/// before (by [`read_body`]), so a slow upload never holds a slot.
pub struct ExpensiveSlot {
    _tenant: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

impl ExpensiveSlot {
    pub async fn acquire(guards: &Guards, tenant: &str) -> Result<Self, ApiError> {
        let acquire = async {
            let tenant = guards.tenant_semaphore(tenant).acquire_owned().await.ok()?;
            let global = guards.expensive.clone().acquire_owned().await.ok()?;
            Some(ExpensiveSlot {
                _tenant: tenant,
                _global: global,
            })
        };
        match tokio::time::timeout(guards.expensive_wait, acquire).await {
            Ok(Some(slot)) => Ok(slot),
            _ => {
                crate::metrics::overloaded();
                Err(ApiError::retry_after(
                    ProblemKind::Overloaded,
                    "too many expensive requests are running; retry shortly",
                    1,
                ))
            }
        }
    }
}

impl FromRequestParts<AppState> for ExpensiveSlot {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let tenant = parts
            .extensions
            .get::<TenantId>()
            .map(|tenant| tenant.0.clone())
            .unwrap_or_default();
        ExpensiveSlot::acquire(&state.guards, &tenant).await
    }
}

/// Refuses a NUL in the path or query, then reads the whole request body before the handler runs, within `body_read_timeout` and the body
/// limit: a client that sends its body slowly is cut off with 408 `body-timeout` and never holds
/// an expensive slot or a database connection while it trickles in. The one exception is a
/// transcript import, which streams its body in bounded pieces, each within the same timeout.
pub async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    use http_body_util::BodyExt;
    // A NUL in a path or query value (a thread id, a job id, a cursor) can be neither stored nor
    // compared by PostgreSQL: refuse it here, for every route.
    let uri = request.uri();
    if uri.path().contains("%00") || uri.query().is_some_and(|query| query.contains("%00")) {
        return ApiError::bad_request("the path and query may not hold a NUL character (%00)")
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let streamed = super::transcripts::is_streamed_import(&parts.method, parts.uri.path());
    if streamed || axum::body::HttpBody::size_hint(&body).exact() == Some(0) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limits = &state.limits;
    let limited = http_body_util::Limited::new(body, limits.body_bytes);
    match tokio::time::timeout(limits.body_read_timeout, limited.collect()).await {
        Ok(Ok(collected)) => {
            let body = axum::body::Body::from(collected.to_bytes());
            next.run(Request::from_parts(parts, body)).await
        }
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => ApiError::new(
            ProblemKind::PayloadTooLarge,
            format!("the body is larger than {} bytes", limits.body_bytes),
        )
        .into_response(),
        Ok(Err(_)) => ApiError::bad_request("the request body could not be read").into_response(),
        Err(_) => ApiError::new(
            ProblemKind::BodyTimeout,
            format!(
                "the request body did not arrive within {} s",
                limits.body_read_timeout.as_secs_f64()
            ),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_their_access() {
        assert_eq!(access_of("/v1/threads"), Access::Tenant);
        assert_eq!(access_of("/v1/threads/x/context"), Access::Tenant);
        assert_eq!(access_of("/v1/normalize"), Access::Tenant);
        assert_eq!(access_of("/v1/admin/keys"), Access::Admin);
        assert_eq!(access_of("/v1/admin"), Access::Admin);
        assert_eq!(access_of("/v1/administrators"), Access::Tenant);
        assert_eq!(access_of("/metrics"), Access::Metrics);
        assert_eq!(access_of("/healthz"), Access::Public);
        assert_eq!(access_of("/openapi.json"), Access::Public);
    }

    #[test]
    fn mode_is_keyed_when_any_key_exists() {
        assert!(AuthMode::resolve(None, false).is_open());
        assert!(!AuthMode::resolve(None, true).is_open());
        assert!(!AuthMode::resolve(Some("k".into()), false).is_open());
        let debug = format!("{:?}", AuthMode::resolve(Some("secret".into()), false));
        assert!(!debug.contains("secret"), "{debug}");
    }
}
