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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::{ApiError, ProblemKind};
use super::{AppState, Limits};
use crate::auth::{
    bearer_token, hash_key, retry_after_secs, secrets_match, AuthFailures, RateLimiter,
};
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
    /// Failed authentications per peer, and keys just found not valid.
    pub auth_failures: AuthFailures,
    expensive: Arc<Semaphore>,
    expensive_wait: Duration,
    /// Each tenant's share of the expensive slots, so that one tenant cannot hold them all.
    expensive_shares: TenantShares,
    /// Each tenant's requests in flight: its share of the connections.
    in_flight: TenantShares,
    /// Each tenant's imports running.
    imports: TenantShares,
    /// Each tenant's event streams open, and the process's: a stream holds its connection for
    /// as long as the client likes, so they may fill a share of the connections only.
    streams: TenantShares,
    streams_open: Arc<Semaphore>,
    /// Request bodies held in memory across the process, in KiB.
    body_budget: Arc<Semaphore>,
    /// Stored entries that answers hold across the process (context windows, pages, batches,
    /// streams, exports), in KiB, its size, and each tenant's share of it.
    answer_budget: Arc<Semaphore>,
    answer_budget_kib: u32,
    answer_shares: TenantShares,
    /// Host names open mode answers besides loopback's.
    allowed_hosts: Vec<String>,
}

impl Guards {
    pub fn new(auth: AuthMode, limits: &Limits) -> Self {
        // Open mode has one tenant: its share of the slots and connections is the whole pool.
        let share = |keyed: usize, whole: usize| if auth.is_open() { whole } else { keyed };
        // 0 turns the budget off.
        let answer_budget_kib =
            u32::try_from(kib(limits.max_inflight_window_bytes).min(Semaphore::MAX_PERMITS))
                .unwrap_or(u32::MAX);
        // A tenant may hold half of it: another tenant's answers always find room.
        let answer_share_kib = share(answer_budget_kib as usize / 2, answer_budget_kib as usize);
        Guards {
            rate: RateLimiter::new(limits.rate_limit_per_sec, limits.rate_limit_burst),
            auth_failures: AuthFailures::new(
                limits.auth_failures_per_sec,
                limits.auth_failure_burst,
            ),
            expensive: Arc::new(Semaphore::new(limits.max_expensive_requests)),
            expensive_wait: limits.expensive_wait,
            expensive_shares: TenantShares::new(share(
                limits.max_expensive_per_tenant,
                limits.max_expensive_requests,
            )),
            in_flight: TenantShares::new(share(
                limits.max_requests_per_tenant,
                limits.max_connections,
            )),
            imports: TenantShares::new(limits.max_imports_per_tenant),
            streams: TenantShares::new(MAX_STREAMS_PER_TENANT),
            streams_open: Arc::new(Semaphore::new((limits.max_connections / 4).max(1))),
            body_budget: Arc::new(Semaphore::new(
                kib(limits.max_inflight_body_bytes).min(Semaphore::MAX_PERMITS),
            )),
            answer_budget: Arc::new(Semaphore::new(answer_budget_kib as usize)),
            answer_budget_kib,
            answer_shares: TenantShares::new(answer_share_kib),
            allowed_hosts: limits
                .allowed_hosts
                .iter()
                .map(|host| host.to_ascii_lowercase())
                .collect(),
            auth,
        }
    }

    /// Room for an answer that holds `bytes` of stored entries, in `tenant`'s share of the
    /// process's answer budget and in the budget itself, waited for (the request's timeout bounds
    /// the wait) and held until the answer is sent ([`Holding`]). An answer larger than the share
    /// takes all of it, so it runs alone among the tenant's, and takes no more of the budget: a
    /// tenant never holds more than its share of the budget, so another's answers always find
    /// room (a read of one large entry, seven times its size, would otherwise wait for the whole
    /// budget, and hold up every read queued behind it). In keyed mode, such a read may hold
    /// more than it is charged: the budget is exact for entries up to a fourteenth of it (18 MiB
    /// at the defaults). `None` when the budget is off.
    pub async fn answer_room(&self, tenant: &str, bytes: u64) -> Option<AnswerRoom> {
        if self.answer_budget_kib == 0 {
            return None;
        }
        let wanted = u32::try_from(kib(usize::try_from(bytes).unwrap_or(usize::MAX)))
            .unwrap_or(u32::MAX)
            .max(1);
        let share = self.answer_shares.semaphore(tenant);
        let in_share = wanted.min(self.answer_shares.share as u32);
        // The tenant's share first: a tenant waiting on its own answers holds nothing of the
        // process's budget meanwhile.
        let tenant = share.acquire_many_owned(in_share).await.ok()?;
        let process = self
            .answer_budget
            .clone()
            .acquire_many_owned(in_share)
            .await
            .ok()?;
        Some(AnswerRoom { tenant, process })
    }

    /// Room for a context read's window of `bytes` stored bytes: [`Guards::answer_room`] for
    /// what the read holds at its peak ([`WINDOW_BUILD_FACTOR`] times its window; the answer
    /// keeps room for its own length once built), for a window past [`WINDOW_FLOOR_BYTES`] only.
    /// What smaller windows hold at once is bounded by the requests in flight, and the most
    /// common reads then pay nothing for the budget.
    pub async fn window_room(&self, tenant: &str, bytes: i64) -> Option<AnswerRoom> {
        let bytes = u64::try_from(bytes).ok()?;
        if bytes < WINDOW_FLOOR_BYTES as u64 {
            return None;
        }
        self.answer_room(tenant, bytes.saturating_mul(WINDOW_BUILD_FACTOR))
            .await
    }

    /// Past this many stored bytes, a thread's window is summed rather than charged as the whole
    /// thread: a quarter of the budget, where over-charging would start to make reads wait.
    pub fn window_exact_above(&self) -> i64 {
        i64::from(self.answer_budget_kib) * 1024 / 4
    }

    /// The answer budget's room free now, in KiB (for tests).
    pub fn answer_room_free(&self) -> usize {
        self.answer_budget.available_permits()
    }

    /// One of `tenant`'s import slots, or 429 `too-many-in-flight` when it runs its share.
    pub fn import_slot(&self, tenant: &TenantId) -> Result<OwnedSemaphorePermit, ApiError> {
        self.imports
            .semaphore(&tenant.0)
            .try_acquire_owned()
            .map_err(|_| {
                ApiError::retry_after(
                    ProblemKind::TooManyInFlight,
                    "this tenant runs as many imports as it may at once; retry when one ends",
                    1,
                )
            })
    }

    /// Whether open mode answers a request for `host` (the `Host` header, with or without its
    /// port): loopback's names, and the allowed ones. A request naming no host at all (HTTP/1.0)
    /// is answered: a browser, the only client DNS rebinding can drive, always names one.
    fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(name) = host.map(host_name) else {
            return true;
        };
        let name = name.to_ascii_lowercase();
        matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]")
            || self.allowed_hosts.contains(&name)
    }
}

/// What a context read holds at its peak per byte of its window: the rows, the entries, the
/// normalized messages and the answer (BENCHMARKS.md §13). An attack measured 121 MiB a read of
/// one 30 MiB entry.
pub const WINDOW_BUILD_FACTOR: u64 = 4;

/// Whole KiB, rounded up: the body budget's unit.
/// Windows smaller than this are read without counting against the window budget, so the most
/// common reads (and every thread that stores less) pay nothing for it. What such reads hold at
/// once is bounded by the requests in flight: a tenant's share times a few MiB.
pub const WINDOW_FLOOR_BYTES: usize = 1024 * 1024;

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

/// The name of a `Host` value, without its port (`[::1]:8080` → `[::1]`).
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(end) = host.strip_prefix('[').and_then(|rest| rest.find(']')) {
        return &host[..end + 2];
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// A per-tenant share of some pool: a semaphore per busy tenant, created on first use. Shares
/// nobody holds are dropped once the map grows, so it stays as small as the set of busy tenants.
/// Event streams one tenant may hold open at once (`GET /v1/threads/{id}/events`).
pub const MAX_STREAMS_PER_TENANT: usize = 32;

/// A place for one event stream: the tenant's and the process's, taken at once or refused.
pub struct StreamSlot {
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl StreamSlot {
    /// A place now, or 429 `overloaded`: a stream never waits for one.
    pub fn take(guards: &Guards, tenant: &str) -> Result<Self, ApiError> {
        let tenant = guards.streams.semaphore(tenant).try_acquire_owned();
        let process = guards.streams_open.clone().try_acquire_owned();
        match (tenant, process) {
            (Ok(tenant), Ok(process)) => Ok(StreamSlot {
                _permits: (tenant, process),
            }),
            _ => {
                crate::metrics::overloaded();
                Err(ApiError::retry_after(
                    ProblemKind::Overloaded,
                    format!(
                        "too many event streams are open (at most {MAX_STREAMS_PER_TENANT} a \
                         tenant); close one, or retry shortly"
                    ),
                    1,
                ))
            }
        }
    }
}

/// Room taken in the answer budget ([`Guards::answer_room`]): given back when dropped.
#[derive(Debug)]
pub struct AnswerRoom {
    tenant: OwnedSemaphorePermit,
    process: OwnedSemaphorePermit,
}

impl AnswerRoom {
    /// Keeps room for `bytes` only (never less than 1 KiB), giving the rest back: a read takes
    /// room for the most a page may hold, then keeps what its page holds.
    pub fn shrink_to(&mut self, bytes: u64) {
        let kept = u32::try_from(kib(usize::try_from(bytes).unwrap_or(usize::MAX)))
            .unwrap_or(u32::MAX)
            .max(1);
        for permit in [&mut self.tenant, &mut self.process] {
            let excess = permit.num_permits().saturating_sub(kept as usize);
            if excess > 0 {
                drop(permit.split(excess));
            }
        }
    }

    /// The room held, in KiB.
    pub fn kib(&self) -> usize {
        self.process.num_permits()
    }
}

#[derive(Debug)]
struct TenantShares {
    share: usize,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantShares {
    fn new(share: usize) -> Self {
        TenantShares {
            share: share.max(1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn semaphore(&self, tenant: &str) -> Arc<Semaphore> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slots.len() >= 1_024 && !slots.contains_key(tenant) {
            slots.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
        }
        slots
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
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

/// What the guard knows of a request before it runs.
struct Presented<'a> {
    path: &'a str,
    authorization: Option<&'a str>,
    /// The `Host` the request names (its URI's authority, else the header).
    host: Option<&'a str>,
    /// The peer's address, when the connection told it (tests calling the router do not).
    peer: Option<String>,
}

/// Resolves the bearer token of a request; 401 when it is missing, malformed, unknown or revoked.
/// A peer that failed too often is answered 429 before anything is looked up, and a key found not
/// valid moments ago is refused without a lookup.
async fn identify(state: &AppState, presented: &Presented<'_>) -> Result<Caller, ApiError> {
    let failures = &state.guards.auth_failures;
    let now = Instant::now();
    if let Some(peer) = &presented.peer {
        if let Err(wait) = failures.check_peer(peer, now) {
            crate::metrics::rate_limited();
            return Err(ApiError::retry_after(
                ProblemKind::RateLimited,
                "too many failed authentications from this address",
                retry_after_secs(wait),
            ));
        }
    }
    let refuse = |key_hash: Option<&str>, detail: &str| {
        failures.record(presented.peer.as_deref(), key_hash, now);
        ApiError::unauthorized(detail)
    };
    let Some(header) = presented.authorization else {
        return Err(refuse(
            None,
            "send an API key as `Authorization: Bearer <key>`",
        ));
    };
    let Some(token) = bearer_token(header) else {
        return Err(refuse(
            None,
            "the Authorization header must be `Bearer <key>`",
        ));
    };
    if let Some(admin_key) = state.guards.auth.admin_key() {
        if secrets_match(token, admin_key) {
            return Ok(Caller::Admin);
        }
    }
    let key_hash = hash_key(token);
    const NOT_VALID: &str = "the API key is not valid or was revoked";
    if failures.known_unknown(&key_hash, now) {
        return Err(refuse(Some(&key_hash), NOT_VALID));
    }
    match state.store.authenticate_api_key(token).await? {
        Some(identity) => Ok(Caller::Tenant(identity.tenant)),
        None => Err(refuse(Some(&key_hash), NOT_VALID)),
    }
}

/// Authenticates and rate-limits every request, by the path's [`Access`], and holds one of the
/// tenant's in-flight slots until the answer's last byte is sent.
pub async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    // Only owned copies cross the awaits below (a request body is not `Sync`).
    let path = request.uri().path().to_owned();
    let authorization = header_text(&request, header::AUTHORIZATION);
    let host = request
        .uri()
        .authority()
        .map(|authority| authority.as_str().to_owned())
        .or_else(|| header_text(&request, header::HOST));
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip().to_string());
    let presented = Presented {
        path: &path,
        authorization: authorization.as_deref(),
        host: host.as_deref(),
        peer,
    };
    let tenant = match authorize(&state, &presented).await {
        Ok(tenant) => tenant,
        Err(error) => return error.into_response(),
    };
    let Some(tenant) = tenant else {
        return next.run(request).await;
    };
    let Ok(in_flight) = state
        .guards
        .in_flight
        .semaphore(&tenant.0)
        .try_acquire_owned()
    else {
        return ApiError::retry_after(
            ProblemKind::TooManyInFlight,
            "this tenant has as many requests in flight as its share of the connections allows",
            1,
        )
        .into_response();
    };
    request.extensions_mut().insert(tenant);
    let response = next.run(request).await;
    response.map(|body| Body::new(Holding::new(body, in_flight)))
}

/// A header's value as text (empty when it is not text).
fn header_text(request: &Request, name: header::HeaderName) -> Option<String> {
    request
        .headers()
        .get(name)
        .map(|value| value.to_str().unwrap_or_default().to_owned())
}

/// Whether the request may reach a route of `access` by the `Host` it names: in open mode, `/v1`
/// and `/metrics` answer only loopback's names and the allowed ones, so a web page that rebinds
/// its own name to this address cannot read or delete the threads.
fn check_host(state: &AppState, access: Access, host: Option<&str>) -> Result<(), ApiError> {
    let guarded = matches!(access, Access::Tenant | Access::Admin | Access::Metrics);
    if !state.guards.auth.is_open() || !guarded || state.guards.host_allowed(host) {
        return Ok(());
    }
    Err(ApiError::new(
        ProblemKind::HostNotAllowed,
        format!(
            "open mode answers only localhost, 127.0.0.1 and [::1] (and --allowed-hosts), not {:?}",
            host.unwrap_or_default()
        ),
    ))
}

/// The tenant a request acts for (`None` off the tenant API), or why it is refused.
async fn authorize(
    state: &AppState,
    presented: &Presented<'_>,
) -> Result<Option<TenantId>, ApiError> {
    let admin_off = || {
        ApiError::new(
            ProblemKind::Forbidden,
            "the admin API is off: set LOUPE_ADMIN_KEY, or use the `loupe keys` command",
        )
    };
    let access = access_of(presented.path);
    check_host(state, access, presented.host)?;
    match access {
        Access::Public => Ok(None),
        Access::Metrics => {
            if state.guards.auth.admin_key().is_none() {
                return Ok(None);
            }
            match identify(state, presented).await? {
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
            match identify(state, presented).await? {
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
                match identify(state, presented).await? {
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

/// An answer's body with something held until the body is sent whole or dropped (a slot, a
/// budget): the body streams as it did, its size hint and so its `Content-Length` unchanged.
pub struct Holding<T> {
    body: Body,
    _held: T,
    /// When the body must be sent whole: past it, the body fails and the connection is cut.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Holding<T> {
    pub fn new(body: Body, held: T) -> Self {
        Holding {
            body,
            _held: held,
            deadline: None,
        }
    }

    /// Holds `held` until the body is sent, at most until `deadline`: a client that reads slowly
    /// (never stalling long enough for the write timeout) cannot keep what is held for longer.
    pub fn until(body: Body, held: T, deadline: tokio::time::Instant) -> Self {
        Holding {
            body,
            _held: held,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }
}

/// When an answer of `bytes` must be sent by: the write timeout, plus its size at
/// [`MIN_SEND_BYTES_PER_SEC`].
pub fn send_deadline(write_timeout: Duration, bytes: u64) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    let allowed = write_timeout.saturating_add(Duration::from_secs(bytes / MIN_SEND_BYTES_PER_SEC));
    now.checked_add(allowed)
        .unwrap_or(now + Duration::from_secs(365 * 24 * 3600))
}

/// The slowest a client may read an answer that holds room in a budget.
pub const MIN_SEND_BYTES_PER_SEC: u64 = 1024 * 1024;

impl<T: Unpin> HttpBody for Holding<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if let Some(deadline) = self.deadline.as_mut() {
            if std::future::Future::poll(deadline.as_mut(), cx).is_ready() {
                return Poll::Ready(Some(Err(axum::Error::new(
                    "the client did not read the answer in time",
                ))));
            }
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A slot for an expensive request (context reads, rounds, normalization), held until the
/// handler returns and until every piece of CPU work it started off the executor has ended: one of
/// the tenant's share (`max_expensive_per_tenant`), then one of the process's
/// (`max_expensive_requests`). When none frees up within the configured wait, the request is
/// answered with 503 `overloaded` instead of queueing without bound. The body was read before (by
/// [`read_body`]), so a slow upload never holds a slot.
///
/// Clones share the slot: `http::context::off_the_executor` moves one into
/// the blocking task, so a request answered by its timeout while that task still runs does not
/// give the slot back before the CPU work ends.
#[derive(Clone)]
pub struct ExpensiveSlot {
    /// The tenant's permit and the process's.
    _permits: Arc<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

impl ExpensiveSlot {
    pub async fn acquire(guards: &Guards, tenant: &str) -> Result<Self, ApiError> {
        let acquire = async {
            let tenant = guards
                .expensive_shares
                .semaphore(tenant)
                .acquire_owned()
                .await
                .ok()?;
            let global = guards.expensive.clone().acquire_owned().await.ok()?;
            Some(ExpensiveSlot {
                _permits: Arc::new((tenant, global)),
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

    /// Slots of the whole process free now (for tests and metrics).
    pub fn available(guards: &Guards) -> usize {
        guards.expensive.available_permits()
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

/// Refuses a NUL in the path or query, then reads the whole request body before the handler
/// runs, within `body_read_timeout`, the body limit and the process's body budget: a client that
/// sends its body slowly is cut off with 408 `body-timeout` and never holds an expensive slot or a
/// database connection while it trickles in, and when the bodies held across the process would
/// pass `max_inflight_body_bytes` the request is answered 503 `overloaded`. Its share of the
/// budget is held until the answer is sent. The one exception is a transcript import, which
/// streams its body in bounded pieces (`http::transcripts`).
pub async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    // A NUL in a path or query value (a thread id, a job id, a cursor) can be neither stored nor
    // compared by PostgreSQL: refuse it here, for every route.
    let uri = request.uri();
    if uri.path().contains("%00") || uri.query().is_some_and(|query| query.contains("%00")) {
        return ApiError::bad_request("the path and query may not hold a NUL character (%00)")
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let streamed = is_streamed_import(&parts.method, parts.uri.path());
    if streamed || body.size_hint().exact() == Some(0) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limits = &state.limits;
    let read = read_within_budget(body, limits.body_bytes, &state.guards.body_budget);
    match tokio::time::timeout(limits.body_read_timeout, read).await {
        Ok(Ok((bytes, mut budget))) => {
            // The budget holds the body's bytes; its parsed values take more, and so do the
            // copies storing it makes: all are held as well.
            let weight = match crate::json_weight::within(&bytes, limits.max_inflight_body_bytes) {
                Ok(weight) => weight,
                Err(heavy) => return too_heavy(&heavy).into_response(),
            };
            let held = body_peak_bytes(weight.parsed_bytes(), bytes.len());
            if held > limits.max_inflight_body_bytes {
                return ApiError::new(
                    ProblemKind::PayloadTooLarge,
                    format!(
                        "handling the body would take about {held} bytes of memory, more than the \
                         {} the server gives request bodies: split it",
                        limits.max_inflight_body_bytes
                    ),
                )
                .into_response();
            }
            let owed = kib(held).saturating_sub(budget.num_permits());
            if owed > 0 {
                let permits = u32::try_from(owed).unwrap_or(u32::MAX);
                match state
                    .guards
                    .body_budget
                    .clone()
                    .try_acquire_many_owned(permits)
                {
                    Ok(more) => budget.merge(more),
                    Err(_) => return overloaded().into_response(),
                }
            }
            let response = next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
            response.map(|body| Body::new(Holding::new(body, budget)))
        }
        Ok(Err(error)) => error.into_response(),
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

/// Copies of a body's text that handling it makes beside the text and its parsed values: the
/// entries written back as JSON to be stored, their fingerprints, and the database's own buffer.
/// Measured: ten parallel 30 MiB appends peaked at 1.58 GB above idle, about 5 times their text.
pub const BODY_COPIES: usize = 4;

/// What a body of `text` bytes, `parsed` once parsed ([`crate::json_weight`]), holds at its peak
/// while it is handled: what the body budget charges it.
pub fn body_peak_bytes(parsed: usize, text: usize) -> usize {
    parsed.saturating_add(text.saturating_mul(BODY_COPIES))
}

/// Says `Connection: close` on an answer sent before its request's body was read to its end (a
/// 401, a 403, a 413 announced, a NUL refused, a body cut off): hyper then closes the connection,
/// as it would anyway with the body unread, but the client knows it and does not send its next
/// request there. An answer to a body read whole leaves the connection open.
pub async fn close_when_body_unread(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let body = Body::new(ReadToEnd {
        body,
        ended: ended.clone(),
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if !ended.load(Ordering::Acquire) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// A request body that records whether it was read to its end.
struct ReadToEnd {
    body: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for ReadToEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.body.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// 413 for a body whose parsed values would take more than the process's budget of request
/// bodies (`json_weight`): many small objects cost many times their text.
pub fn too_heavy(heavy: &crate::json_weight::TooHeavy) -> ApiError {
    ApiError::new(
        ProblemKind::PayloadTooLarge,
        format!("the body holds {heavy}: send fewer, larger values, or split it"),
    )
}

/// 503 `overloaded`: the bodies in memory fill the process's budget.
fn overloaded() -> ApiError {
    crate::metrics::overloaded();
    ApiError::retry_after(
        ProblemKind::Overloaded,
        "the request bodies in memory fill the server's budget; retry shortly",
        1,
    )
}

/// Reads `body` whole, taking its size from `budget` (in KiB) as it arrives: all of it at once
/// when it announces its length, piece by piece otherwise. 413 past `limit`; 503 `overloaded`
/// when the budget has no room.
async fn read_within_budget(
    mut body: Body,
    limit: usize,
    budget: &Arc<Semaphore>,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(
            ProblemKind::PayloadTooLarge,
            format!("the body is larger than {limit} bytes"),
        )
    };
    let take = |bytes: usize| {
        let permits = u32::try_from(kib(bytes)).unwrap_or(u32::MAX);
        budget.clone().try_acquire_many_owned(permits)
    };
    let announced = body.size_hint().exact().map(|n| n as usize);
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut held = take(announced.unwrap_or(0)).map_err(|_| overloaded())?;
    let mut data = Vec::with_capacity(announced.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|_| ApiError::bad_request("the request body could not be read"))?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        if data.len() + chunk.len() > limit {
            return Err(too_large());
        }
        data.extend_from_slice(&chunk);
        let owed = kib(data.len()).saturating_sub(held.num_permits());
        if owed > 0 {
            held.merge(take(owed * 1024).map_err(|_| overloaded())?);
        }
    }
    Ok((Bytes::from(data), held))
}

/// Whether a request is an import, whose body the handler streams itself: the body-reading guard
/// and the request timeout leave it alone.
pub fn is_streamed_import(method: &axum::http::Method, path: &str) -> bool {
    let mut segments = path.split('/');
    method == axum::http::Method::POST
        && segments.next() == Some("")
        && segments.next() == Some("v1")
        && segments.next() == Some("threads")
        && segments.next().is_some_and(|id| !id.is_empty())
        && segments.next() == Some("import")
        && segments.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows past the floor take room for their size, a window past the whole budget takes all
    /// of it, and a read that finds no room waits until an earlier one's answer is sent.
    #[tokio::test]
    async fn large_windows_take_turns_in_the_window_budget() {
        use futures_util::FutureExt;
        const MIB: i64 = 1024 * 1024;
        // Each window is charged four times its bytes while it is read.
        let limits = Limits {
            max_inflight_window_bytes: 96 * MIB as usize,
            ..Limits::default()
        };
        let guards = Guards::new(AuthMode::Open, &limits);
        let all = guards.answer_room_free();
        assert_eq!(all, 96 * 1024);
        assert!(guards
            .window_room("t", WINDOW_FLOOR_BYTES as i64 - 1)
            .await
            .is_none());
        let first = guards.window_room("t", 10 * MIB).await.expect("room");
        let second = guards.window_room("t", 10 * MIB).await.expect("room");
        assert_eq!(guards.answer_room_free(), 16 * 1024);
        let whole = guards.window_room("t", 500 * MIB);
        tokio::pin!(whole);
        assert!(whole.as_mut().now_or_never().is_none(), "no room: it waits");
        drop(first);
        assert!(whole.as_mut().now_or_never().is_none());
        drop(second);
        let whole = whole.await.expect("the whole budget");
        assert_eq!(guards.answer_room_free(), 0);
        drop(whole);
        assert_eq!(guards.answer_room_free(), all);
        let off = Guards::new(
            AuthMode::Open,
            &Limits {
                max_inflight_window_bytes: 0,
                ..Limits::default()
            },
        );
        assert!(
            off.window_room("t", 500 * MIB).await.is_none(),
            "0 turns it off"
        );
    }

    /// A tenant holds at most half the answer budget: past it, its room waits while another
    /// tenant's is had at once; room shrunk to what an answer holds goes back at once.
    #[tokio::test]
    async fn a_tenant_holds_at_most_half_the_answer_budget() {
        use futures_util::FutureExt;
        let limits = Limits {
            max_inflight_window_bytes: 16 * 1024 * 1024,
            ..Limits::default()
        };
        let guards = Guards::new(AuthMode::Keyed { admin_key: None }, &limits);
        let mib = 1024 * 1024;
        let mut first = guards.answer_room("a", 6 * mib).await.expect("room");
        let over = guards.answer_room("a", 4 * mib);
        tokio::pin!(over);
        assert!(
            over.as_mut().now_or_never().is_none(),
            "past its half: it waits"
        );
        let other = guards.answer_room("b", 8 * mib).now_or_never().flatten();
        assert!(other.is_some(), "another tenant's room is had at once");
        first.shrink_to(mib);
        assert_eq!(first.kib(), 1024);
        let over = over
            .now_or_never()
            .flatten()
            .expect("room shrunk goes back");
        assert_eq!(
            guards.answer_room_free(),
            16 * 1024 - 1024 - 4 * 1024 - 8 * 1024
        );
        drop((first, over, other));
        assert_eq!(guards.answer_room_free(), 16 * 1024);
        // A read larger than the share (one large entry) takes the share, not the budget: with
        // a little of the budget held, another tenant's large read is still had at once.
        let held = guards.answer_room("a", mib).await.expect("room");
        let large = guards.answer_room("b", 20 * mib).now_or_never().flatten();
        assert_eq!(large.as_ref().map(AnswerRoom::kib), Some(8 * 1024));
        let small = guards.answer_room("c", 4 * mib).now_or_never().flatten();
        assert!(small.is_some(), "a third tenant's room is had at once");
        drop((held, large, small));
        assert_eq!(guards.answer_room_free(), 16 * 1024);
    }

    /// An answer holding room that its client does not take in time fails, and gives the room
    /// back: a slow reader cannot keep it.
    #[tokio::test]
    async fn a_held_answer_not_taken_by_its_deadline_fails_and_lets_go() {
        use http_body_util::BodyExt;
        let budget = Arc::new(Semaphore::new(1));
        let held = budget.clone().try_acquire_owned().unwrap();
        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let deadline = tokio::time::Instant::now() + Duration::from_millis(30);
        let mut body = Holding::until(never, held, deadline);
        let frame = body.frame().await.expect("a frame");
        assert!(frame.is_err(), "past its deadline the body fails");
        drop(body);
        assert_eq!(budget.available_permits(), 1);
        assert!(
            send_deadline(Duration::from_secs(30), 64 * 1024 * 1024)
                > tokio::time::Instant::now() + Duration::from_secs(93),
            "64 MiB at 1 MiB/s after the write timeout"
        );
    }

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

    #[test]
    fn only_a_thread_import_is_streamed() {
        assert!(is_streamed_import(
            &axum::http::Method::POST,
            "/v1/threads/t-1/import"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::GET,
            "/v1/threads/t-1/import"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::POST,
            "/v1/threads/t-1/export"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::POST,
            "/v1/threads//import"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::POST,
            "/v1/threads/t/import/x"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::POST,
            "/v1/threads/import"
        ));
        assert!(!is_streamed_import(
            &axum::http::Method::POST,
            "/v2/threads/t/import"
        ));
    }
}
