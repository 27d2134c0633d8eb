//! Read-your-writes across standbys (`docs/SCALING.md`): every write is answered with the
//! primary's WAL position as `Loupe-LSN` (and `lsn` in its body), and a read that sends it back
//! (the same header, or `min_lsn`) is served by a standby only once the standby has replayed it
//! ([`crate::store::Store::for_read`]).

use std::future::Future;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponseParts, ResponseParts};
use serde::Deserialize;

use super::problem::{ApiError, ProblemKind};
use super::AppState;
use crate::store::{Lsn, ReadRoute, Store, TenantId, ThreadId};

/// The consistency token's header, on a write's answer and on a read that must see it.
pub const LSN_HEADER: HeaderName = HeaderName::from_static("loupe-lsn");

/// What a consistency token looks like: PostgreSQL's `pg_lsn` text.
pub const LSN_PATTERN: &str = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$";

/// The reads a standby may serve (by operation id): each takes a token.
pub const ROUTED_READS: &[&str] = &[
    "getContext",
    "getRounds",
    "listMessages",
    "getOutline",
    "zoom",
    "exportTranscript",
    "searchThread",
    "searchThreads",
    "searchTool",
];

/// The writes answered with a token (by operation id): every write to a thread, and the tenant's
/// retention policy, which decides what a tenant-wide search finds.
pub const TOKEN_WRITES: &[&str] = &[
    "createThread",
    "forkThread",
    "updateThread",
    "deleteThread",
    "appendMessages",
    "snipMessages",
    "createErasure",
    "putThreadSettings",
    "compactThread",
    "importTranscript",
    "claimCursor",
    "advanceCursor",
    "putThreadRetention",
    "deleteThreadRetention",
    "putRetention",
];

/// The query parameter a read may carry its token in, for clients that cannot set headers.
/// (Documented on each of [`ROUTED_READS`] by `document::describe_consistency`.)
#[derive(Debug, Deserialize)]
pub struct MinLsnQuery {
    pub min_lsn: Option<String>,
}

/// The token a read carries, if any: `Loupe-LSN` or `min_lsn`, the later of the two. A
/// malformed one is the caller's mistake (400).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadToken(pub Option<Lsn>);

fn malformed(source: &str) -> ApiError {
    ApiError::new(
        ProblemKind::BadRequest,
        format!("{source} must be a WAL position as a write answered it (like `16/B374D848`)"),
    )
}

impl<S: Send + Sync> FromRequestParts<S> for ReadToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Every copy of the header counts: one malformed is refused, the latest is kept.
        let mut header: Option<Lsn> = None;
        for value in parts.headers.get_all(&LSN_HEADER) {
            let lsn = value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<Lsn>().ok())
                .ok_or_else(|| malformed("Loupe-LSN"))?;
            header = header.max(Some(lsn));
        }
        let param = axum::extract::Query::<MinLsnQuery>::try_from_uri(&parts.uri)
            .map_err(|_| malformed("min_lsn"))?
            .0
            .min_lsn
            .map(|text| text.trim().parse::<Lsn>().map_err(|_| malformed("min_lsn")))
            .transpose()?;
        Ok(ReadToken(header.max(param)))
    }
}

/// Runs `read` on a standby that has replayed what it must see (the token, and this process's
/// last write to the thread), else on the primary. A standby's fault (a 503: it went away, or
/// cancelled the query to replay) is read again on the primary, so losing a standby costs reads
/// no error.
pub async fn on_standby<T, F, Fut>(
    state: &AppState,
    tenant: &TenantId,
    thread_id: Option<&ThreadId>,
    token: ReadToken,
    read: F,
) -> Result<T, ApiError>
where
    F: Fn(Store) -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let (store, route) = state.store.for_read(tenant, thread_id, token.0).await;
    if let Some(stats) = state.store.standby_stats() {
        let label = match route {
            ReadRoute::Standby => "standby",
            ReadRoute::StandbyAfterWait => "standby_after_wait",
            ReadRoute::Primary => "primary",
            ReadRoute::PrimaryAfterWait => "primary_after_wait",
        };
        crate::metrics::standby_read(label, stats.max_lag_bytes);
    }
    if route.is_primary() {
        return read(store).await;
    }
    match read(store).await {
        Err(error) if error.kind.status().as_u16() == 503 => {
            crate::metrics::standby_read_retried();
            read(state.store.clone()).await
        }
        answered => answered,
    }
}

/// The consistency token of a write just committed: the primary's WAL position past its commit,
/// remembered for the thread's next reads in this process. `None` without standbys (a single
/// database reads its own writes) and when the position could not be read (the write stands;
/// this process's own reads still wait for it through the next write's position).
#[derive(Debug, Clone, Default)]
pub struct Written(pub Option<String>);

impl Written {
    /// The token of the tenant's write just answered (to `thread_id`, if it wrote one thread).
    pub async fn now(state: &AppState, tenant: &TenantId, thread_id: Option<&ThreadId>) -> Self {
        Written(
            Self::remembered(state, tenant, thread_id)
                .await
                .map(|lsn| lsn.to_string()),
        )
    }

    /// The position past the tenant's write, remembered for its next reads in this process: for
    /// a write that must be remembered even if its client is gone before the answer (an
    /// erasure), called where the write runs.
    pub async fn remembered(
        state: &AppState,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
    ) -> Option<Lsn> {
        state
            .store
            .written(tenant, thread_id)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "the primary's WAL position was not read");
                None
            })
    }

    /// The token for a response body's `lsn` field.
    pub fn lsn(&self) -> Option<String> {
        self.0.clone()
    }
}

/// `Loupe-LSN` on the answer, when there is a token.
impl IntoResponseParts for Written {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, mut parts: ResponseParts) -> Result<ResponseParts, Self::Error> {
        if let Some(value) = self.0.and_then(|lsn| HeaderValue::from_str(&lsn).ok()) {
            parts.headers_mut().insert(LSN_HEADER, value);
        }
        Ok(parts)
    }
}
