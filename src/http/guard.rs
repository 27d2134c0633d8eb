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

use std::sync::Arc;
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
}

impl Guards {
    pub fn new(auth: AuthMode, limits: &Limits) -> Self {
        Guards {
            auth,
            rate: RateLimiter::new(limits.rate_limit_per_sec, limits.rate_limit_burst),
            expensive: Arc::new(Semaphore::new(limits.max_expensive_requests)),
            expensive_wait: limits.expensive_wait,
        }
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

/// A slot for an expensive request (context reads, normalization), held until the handler
/// returns. When none frees up within the configured wait, the request is answered with 503
/// `overloaded` instead of queueing without bound.
pub struct ExpensiveSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl FromRequestParts<AppState> for ExpensiveSlot {
    type Rejection = ApiError;

    async fn from_request_parts(
        _parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let guards = &state.guards;
        let acquire = guards.expensive.clone().acquire_owned();
        match tokio::time::timeout(guards.expensive_wait, acquire).await {
            Ok(Ok(permit)) => Ok(ExpensiveSlot(permit)),
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
