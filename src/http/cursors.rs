//! `/v1/threads/{thread_id}/cursors`: incremental consumers. Each named cursor is a bookmark that
//! a consumer moves forward once it has processed what follows it; see `docs/CURSORS.md`.

use super::consistency::Written;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::ThreadNotFound;
use super::budget::{hold_until_sent, read_within_room};
use super::context::{off_the_executor, ContextOptions};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, ExpensiveSlot, Tenant};
use crate::history::model::Entry;
use crate::history::{normalize, NormalizeOptions, Normalized};
use crate::store::{
    millis_to_datetime, now_millis, AdvanceRequest, BatchLimit, CursorState, PageBytes,
    PendingBatch, StoreError, TenantId, ThreadId,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_cursors))
        .routes(routes!(get_cursor))
        .routes(routes!(get_pending))
        .routes(routes!(claim_cursor))
        .routes(routes!(advance_cursor))
}

/// Longest cursor name.
const MAX_CURSOR_NAME_LEN: usize = 64;

/// Default batch size of `pending` and `claim`.
const DEFAULT_BATCH: u32 = 100;

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CursorPath {
    /// The thread's id.
    #[param(value_type = String, pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 128)]
    pub thread_id: ThreadId,
    /// The consumer's name: 1–64 characters of `[A-Za-z0-9._:-]`.
    #[param(pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 64)]
    pub name: String,
}

impl CursorPath {
    fn checked(self) -> Result<Self, ApiError> {
        if valid_cursor_name(&self.name) {
            Ok(self)
        } else {
            Err(ApiError::bad_request(format!(
                "cursor name {:?}: must be 1 to {MAX_CURSOR_NAME_LEN} characters of [A-Za-z0-9._:-]",
                self.name
            )))
        }
    }
}

fn valid_cursor_name(name: &str) -> bool {
    (1..=MAX_CURSOR_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BookmarkResponse {
    /// The last entry the consumer processed.
    pub uuid: String,
    pub seq: i64,
    /// When the bookmark last moved.
    pub advanced_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"name": "memory", "bookmark": {"uuid": "m-47", "seq": 47,
    "advanced_at": "2026-11-29T17:00:00Z"}, "new_count": 2, "pending_entries": 2,
    "lease_expires_at": null}))]
pub struct CursorResponse {
    pub name: String,
    /// `null` until the first advance: everything is new.
    pub bookmark: Option<BookmarkResponse>,
    /// Model-visible entries (`user` and `assistant`, counted as stored) after the bookmark.
    pub new_count: i64,
    /// Entries of every type after the bookmark.
    pub pending_entries: i64,
    /// Until when a worker holds the lease; `null` when nobody does.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

impl From<CursorState> for CursorResponse {
    fn from(state: CursorState) -> Self {
        CursorResponse {
            name: state.name,
            bookmark: state.bookmark.map(|b| BookmarkResponse {
                uuid: b.uuid,
                seq: b.seq,
                advanced_at: millis_to_datetime(b.advanced_at),
            }),
            new_count: state.new_count,
            pending_entries: state.pending_entries,
            lease_expires_at: state.lease_expires_at.map(millis_to_datetime),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CursorListResponse {
    /// The thread's cursors that have been claimed or advanced, by name.
    pub cursors: Vec<CursorResponse>,
}

/// How a batch is returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BatchFormat {
    /// The stored entries, as appended.
    #[default]
    Raw,
    /// The batch normalized for a provider, with the options of the context endpoint.
    Normalized,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PendingQuery {
    /// Most entries in the batch, 1–1000 (default 100); the batch is also cut at the server's
    /// page byte limit.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// `raw` (the default) or `normalized`.
    #[serde(default)]
    #[param(value_type = Option<BatchFormat>)]
    pub format: BatchFormat,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PendingResponse {
    pub cursor: CursorResponse,
    pub format: BatchFormat,
    /// The batch as stored (`format=raw`): every entry after the bookmark, of every type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Entry>>,
    /// The batch normalized for the provider (`format=normalized`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalized: Option<Normalized>,
    /// Entries in the batch.
    pub entry_count: usize,
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    /// Pass as `to` to `advance` once the batch is processed (its last entry); `null` when empty.
    pub advance_to: Option<String>,
    /// More entries follow the batch.
    pub has_more: bool,
}

impl PendingResponse {
    /// The answer for `batch`. A normalized batch is normalized off the executor in `slot`, which
    /// the caller took (before claiming, so a refused slot never leaves a lease behind).
    async fn build(
        state: &AppState,
        tenant: &TenantId,
        thread_id: &ThreadId,
        batch: PendingBatch,
        format: BatchFormat,
        options: &ContextOptions,
        slot: Option<&ExpensiveSlot>,
    ) -> Result<Self, ApiError> {
        let advance_to = batch.advance_to().map(str::to_owned);
        let first_seq = batch.entries.first().and_then(|e| e.seq);
        let last_seq = batch.entries.last().and_then(|e| e.seq);
        let entry_count = batch.entries.len();
        let (messages, normalized) = match (format, slot) {
            (BatchFormat::Normalized, Some(slot)) => {
                let options = options.normalize_options()?;
                // A snip hides its messages from the model wherever the batch cuts the thread
                // (the snip itself may come in a later batch): the raw batch keeps them.
                let hidden = state.store.snipped_uuids_of(tenant, thread_id).await?;
                let mut entries = batch.entries;
                entries.retain(|e| e.uuid.as_ref().is_none_or(|uuid| !hidden.contains(uuid)));
                let normalized =
                    off_the_executor(slot, move || normalize_batch(entries, &options)).await?;
                (None, Some(normalized))
            }
            _ => (Some(batch.entries), None),
        };
        Ok(PendingResponse {
            cursor: batch.cursor.into(),
            format,
            messages,
            normalized,
            entry_count,
            first_seq,
            last_seq,
            advance_to,
            has_more: batch.has_more,
        })
    }
}

/// The slot a batch in `format` needs: normalizing is expensive work, a raw batch is not.
async fn slot_for(
    state: &AppState,
    tenant: &TenantId,
    format: BatchFormat,
) -> Result<Option<ExpensiveSlot>, ApiError> {
    match format {
        BatchFormat::Normalized => Ok(Some(
            ExpensiveSlot::acquire(&state.guards, &tenant.0).await?,
        )),
        BatchFormat::Raw => Ok(None),
    }
}

/// How much one batch may hold: the count asked for, the page byte limit of message pages, and
/// the batch's room in the answer budget.
fn batch_limit(entries: u32, bytes: PageBytes) -> BatchLimit {
    BatchLimit { entries, bytes }
}

/// The page byte limit of message pages, which batches share.
fn page_bytes(state: &AppState) -> u64 {
    state.limits.max_page_bytes as u64
}

/// Normalizes a batch on its own. A compact boundary inside the batch is not a cut here: the
/// entries before it are new to the consumer too, so the boundary is left out rather than obeyed.
fn normalize_batch(mut entries: Vec<Entry>, options: &NormalizeOptions) -> Normalized {
    entries.retain(|e| !e.is_compact_boundary());
    normalize(&entries, options)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"limit": 50, "lease_seconds": 120}))]
pub struct ClaimRequest {
    /// Most entries in the batch, 1–1000 (default 100); the batch is also cut at the server's
    /// page byte limit. When both this and the query's `limit` are given, this one counts.
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// How long the lease lives, 1 to the server's maximum, `--cursor-lease-max-secs` (3,600
    /// unless configured; default: `--cursor-lease-secs`, 60).
    #[schema(minimum = 1, maximum = 3600)]
    pub lease_seconds: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseResponse {
    /// Pass as `lease` to `advance`.
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimResponse {
    #[serde(flatten)]
    pub batch: PendingResponse,
    /// `null` when nothing is pending (no lease is taken).
    pub lease: Option<LeaseResponse>,
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

fn double_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"to": "m-49", "expected": "m-47"}))]
pub struct AdvanceCursorRequest {
    /// The uuid of the last entry processed (a batch's `advance_to`).
    pub to: String,
    /// Compare-and-set: the bookmark's uuid as read (`null`: no bookmark yet). When another
    /// consumer moved it since, 409 `cursor-conflict` and nothing changes. Omitted: no check.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub expected: Option<Option<String>>,
    /// The token of a claim. Required while a lease is held.
    pub lease: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdvanceResponse {
    pub cursor: CursorResponse,
    /// False when the bookmark already was at `to` (an idempotent repeat).
    pub moved: bool,
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

/// List a thread's cursors.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/cursors", tag = "cursors", operation_id = "listCursors",
    params(ThreadPath),
    responses(
        (status = 200, description = "The cursors, by name", body = CursorListResponse),
        ThreadNotFound,
    )
)]
pub async fn list_cursors(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<Json<CursorListResponse>, ApiError> {
    let cursors = state
        .store
        .list_cursors(&tenant, &path.thread_id, now_millis())
        .await?;
    Ok(Json(CursorListResponse {
        cursors: cursors.into_iter().map(Into::into).collect(),
    }))
}

/// A cursor's bookmark and the number of model-visible messages after it.
///
/// `new_count` is an indexed count (two primary-key reads), whatever the thread's length. A cursor
/// never used has no bookmark, and every model-visible message is new.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/cursors/{name}", tag = "cursors", operation_id = "getCursor",
    params(CursorPath),
    responses(
        (status = 200, description = "The cursor", body = CursorResponse),
        (status = 400, description = "A bad cursor name (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
    )
)]
pub async fn get_cursor(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<CursorPath>,
) -> Result<Json<CursorResponse>, ApiError> {
    let path = path.checked()?;
    let cursor = state
        .store
        .cursor(&tenant, &path.thread_id, &path.name, now_millis())
        .await?;
    Ok(Json(cursor.into()))
}

/// The entries after the bookmark, to process before advancing.
///
/// The batch holds entries of every type (so a consumer can advance past system entries too), at
/// most `limit`, cut once their stored bodies reach the page byte limit (`--max-page-bytes`, 4 MiB
/// by default; a batch always holds its first entry): `has_more` says more follow. Reading takes no lease and moves nothing: a consumer that fails simply does not
/// advance, and the next read returns the same entries.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/cursors/{name}/pending", tag = "cursors", operation_id = "getPending",
    params(CursorPath, PendingQuery, ContextOptions),
    responses(
        (status = 200, description = "The pending batch", body = PendingResponse),
        (status = 400, description = "A bad cursor name, limit or option (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
    )
)]
pub async fn get_pending(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<CursorPath>,
    ApiQuery(query): ApiQuery<PendingQuery>,
    ApiQuery(options): ApiQuery<ContextOptions>,
) -> Result<Response, ApiError> {
    let path = path.checked()?;
    let limit = super::page_limit(
        query.limit,
        DEFAULT_BATCH,
        state.limits.max_page_size_messages,
    )?;
    // Checked whatever the format, as the document states the options' rules.
    options.normalize_options()?;
    let (batch, room) = read_within_room(&state.guards, &tenant, page_bytes(&state), |bytes| {
        let (store, tenant, path) = (state.store.clone(), tenant.clone(), path.clone());
        async move {
            let limit = batch_limit(limit, bytes);
            (store.cursor_pending(&tenant, &path.thread_id, &path.name, limit, now_millis())).await
        }
    })
    .await?;
    let slot = slot_for(&state, &tenant, query.format).await?;
    let answer = Json(
        PendingResponse::build(
            &state,
            &tenant,
            &path.thread_id,
            batch,
            query.format,
            &options,
            slot.as_ref(),
        )
        .await?,
    )
    .into_response();
    Ok(hold_until_sent(&state, answer, room))
}

/// Claim the pending batch for one worker of a consumer.
///
/// While the lease lives, other claims get 409 `cursor-leased` and only the holder (passing the
/// token as `lease`) can advance; advancing releases it. When it expires, the next claim gets the
/// same batch. Nothing pending: an empty batch and no lease. Takes the query options of `pending`.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/cursors/{name}/claim", tag = "cursors", operation_id = "claimCursor",
    params(CursorPath, PendingQuery, ContextOptions),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "The batch and its lease", body = ClaimResponse),
        (status = 400, description = "Malformed JSON, a bad cursor name or option (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 409, description = "Another worker holds the lease (`cursor-leased`; `lease_expires_at` says until when)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad `limit` or `lease_seconds` (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn claim_cursor(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<CursorPath>,
    ApiQuery(query): ApiQuery<PendingQuery>,
    ApiQuery(options): ApiQuery<ContextOptions>,
    ApiJson(request): ApiJson<ClaimRequest>,
) -> Result<Response, ApiError> {
    let path = path.checked()?;
    let max_limit = state.limits.max_page_size_messages;
    let limit = match request.limit.or(query.limit) {
        None => DEFAULT_BATCH,
        Some(limit) if (1..=max_limit).contains(&limit) => limit,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "limit",
                format!("must be between 1 and {max_limit}"),
            ))
        }
    };
    let max_lease = state.limits.cursor_lease_max.as_secs();
    let lease_seconds = match request.lease_seconds {
        None => state.limits.cursor_lease_default.as_secs().min(max_lease),
        Some(seconds) if (1..=max_lease).contains(&seconds) => seconds,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "lease_seconds",
                format!("must be between 1 and {max_lease}"),
            ))
        }
    };
    options.normalize_options()?;
    let lease_ms = i64::try_from(lease_seconds.saturating_mul(1_000)).unwrap_or(i64::MAX);
    let slot = slot_for(&state, &tenant, query.format).await?;
    // A claim that finds its first entry larger than the room takes no lease: it is read again.
    let (claim, room) = read_within_room(&state.guards, &tenant, page_bytes(&state), |bytes| {
        let (store, tenant, path) = (state.store.clone(), tenant.clone(), path.clone());
        async move {
            let (name, limit) = (&path.name, batch_limit(limit, bytes));
            let claim = store.claim_cursor(
                &tenant,
                &path.thread_id,
                name,
                limit,
                lease_ms,
                now_millis(),
            );
            claim.await
        }
    })
    .await?;
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let answer = (
        written.clone(),
        Json(ClaimResponse {
            lsn: written.lsn(),
            batch: PendingResponse::build(
                &state,
                &tenant,
                &path.thread_id,
                claim.batch,
                query.format,
                &options,
                slot.as_ref(),
            )
            .await?,
            lease: claim.lease.map(|lease| LeaseResponse {
                token: lease.token,
                expires_at: millis_to_datetime(lease.expires_at),
            }),
        }),
    )
        .into_response();
    Ok(hold_until_sent(&state, answer, room))
}

/// Move the bookmark forward, after the consumer processed everything up to `to`.
///
/// Forward only: a `to` before the bookmark is 422 `cursor-backward`; `to` at the bookmark is an
/// idempotent success (`moved: false`); a `to` the thread does not hold is 409
/// `no-such-message`. With `expected` it is a compare-and-set. Releases the lease.
#[utoipa::path(
    post, path = "/v1/threads/{thread_id}/cursors/{name}/advance", tag = "cursors", operation_id = "advanceCursor",
    params(CursorPath),
    request_body = AdvanceCursorRequest,
    responses(
        (status = 200, description = "The bookmark is at `to`", body = AdvanceResponse),
        (status = 400, description = "Malformed JSON or a bad cursor name (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 409, description = "`no-such-message` (the thread holds no message with the uuid `to` names; `errors[0].field` is `to`), `cursor-conflict` (the bookmark is not at `expected`, or the caller's lease was taken over; `current` says where it is) or `cursor-leased` (another worker holds the lease, or the token is missing)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`to` lies before the bookmark (`cursor-backward`), or a member is invalid (`validation`; `errors[0].field` names it)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn advance_cursor(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<CursorPath>,
    ApiJson(request): ApiJson<AdvanceCursorRequest>,
) -> Result<(Written, Json<AdvanceResponse>), ApiError> {
    let path = path.checked()?;
    use crate::history::ingest::MAX_UUID_LEN;
    super::check_key_field("to", &request.to, MAX_UUID_LEN)?;
    if let Some(Some(expected)) = &request.expected {
        super::check_key_field("expected", expected, MAX_UUID_LEN)?;
    }
    if let Some(lease) = &request.lease {
        super::check_key_field("lease", lease, MAX_UUID_LEN)?;
    }
    let outcome = state
        .store
        .advance_cursor(
            &tenant,
            &path.thread_id,
            &path.name,
            AdvanceRequest {
                to: request.to,
                expected: request.expected,
                lease: request.lease,
            },
            now_millis(),
        )
        .await
        .map_err(|error| match error {
            StoreError::NoSuchMessage(_) => ApiError::no_such_message("to", error.to_string()),
            other => other.into(),
        })?;
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    Ok((
        written.clone(),
        Json(AdvanceResponse {
            cursor: outcome.cursor.into(),
            moved: outcome.moved,
            lsn: written.lsn(),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_names_are_checked() {
        assert!(valid_cursor_name("memory"));
        assert!(valid_cursor_name("index:v2.shard_1-a"));
        assert!(valid_cursor_name(&"x".repeat(64)));
        assert!(!valid_cursor_name(""));
        assert!(!valid_cursor_name(&"x".repeat(65)));
        assert!(!valid_cursor_name("has space"));
        assert!(!valid_cursor_name("ünï"));
    }

    #[test]
    fn expected_tells_null_from_absent() {
        let absent: AdvanceCursorRequest = serde_json::from_str(r#"{"to": "a"}"#).unwrap();
        assert_eq!(absent.expected, None);
        let null: AdvanceCursorRequest =
            serde_json::from_str(r#"{"to": "a", "expected": null}"#).unwrap();
        assert_eq!(null.expected, Some(None));
        let set: AdvanceCursorRequest =
            serde_json::from_str(r#"{"to": "a", "expected": "b"}"#).unwrap();
        assert_eq!(set.expected, Some(Some("b".to_owned())));
    }
}
