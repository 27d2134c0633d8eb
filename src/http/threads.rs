//! `/v1/threads`: create, find, read, update, delete.

use super::consistency::Written;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{MalformedJson, Overloaded, ThreadNotFound};
use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::{AppState, Tenant};
use crate::store::{
    filterable_key, NewThread, Thread, ThreadFilter, ThreadId, ThreadOrder, MAX_FILTER_KEY_CHARS,
    MAX_FILTER_MEMBERS,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread, list_threads))
        .routes(routes!(get_thread, update_thread, delete_thread))
}

/// Longest metadata filter, as sent.
const MAX_FILTER_BYTES: usize = 4096;

/// Longest client-chosen thread id.
const MAX_THREAD_ID_LEN: usize = 128;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "support-4711", "metadata": {"user": "ana"}}))]
pub struct CreateThreadRequest {
    /// Optional client-chosen id: 1–128 characters of `[A-Za-z0-9._:-]`. Generated when omitted.
    #[schema(pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 128)]
    pub id: Option<String>,
    /// Free-form metadata kept with the thread: at most `--max-metadata-bytes` (16 KiB by
    /// default) of JSON.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "support-4711", "metadata": {"user": "ana"}, "message_count": 0,
    "stored_bytes": 0, "created_at": "2026-11-29T17:00:00Z", "updated_at": "2026-11-29T17:00:00Z"}))]
pub struct ThreadResponse {
    pub id: String,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// Number of stored messages; also the `seq` the next message will get.
    pub message_count: i64,
    /// Bytes of the stored messages, as the server's `--max-thread-bytes` counts them.
    pub stored_bytes: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Where a fork came from (absent on a thread that is no fork). The parent may have been
    /// deleted since; the fork is whole without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
}

/// A fork's parent and how many of its entries the fork took.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkedFrom {
    /// The parent thread's id.
    pub thread_id: String,
    /// The fork took the parent's entries with `seq < at_seq`.
    pub at_seq: i64,
}

impl From<Thread> for ThreadResponse {
    fn from(thread: Thread) -> Self {
        ThreadResponse {
            id: thread.id.into_string(),
            metadata: thread.metadata,
            message_count: thread.next_seq,
            stored_bytes: thread.stored_bytes,
            created_at: thread.created_at,
            updated_at: thread.updated_at,
            forked_from: thread.forked_from.map(|lineage| ForkedFrom {
                thread_id: lineage.thread_id.into_string(),
                at_seq: lineage.at_seq,
            }),
            lsn: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadListResponse {
    pub threads: Vec<ThreadResponse>,
    /// Pass as `cursor`, with the same filter and order, to get the next page; absent on the
    /// last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// How many threads match the filter, with `include_total=true`: counted up to 10,000, so
    /// 10,000 means at least that many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"metadata": {"status": "closed", "draft": null}}))]
pub struct UpdateThreadRequest {
    /// Merged into the thread's metadata: each member given replaces the one of that name, and
    /// a member set to `null` is removed; members not named stay. The result is held to
    /// `--max-metadata-bytes` (422 `validation` otherwise, nothing changed).
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
}

/// What a list of threads goes by.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreadListOrderBy {
    #[default]
    CreatedAt,
    UpdatedAt,
}

/// Oldest first, or newest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    #[default]
    Asc,
    Desc,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListThreadsQuery {
    /// The `next_cursor` of the previous page.
    #[param(pattern = r"^-?[0-9]{1,18}\.[^\u0000]+$")]
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// Only threads whose metadata has each of these members with this value: a JSON object of
    /// at most 8 strings, numbers and booleans, like `{"user":"ana","tier":2}` (URL-encoded).
    /// Keys are 1–64 characters of `[A-Za-z0-9_.:-]`. A filtered list is one of the tenant's
    /// expensive requests (429/503 `overloaded` past its share).
    /// The pattern is the compact form of such an object; spaces between tokens are accepted too.
    #[param(
        max_length = 4096,
        example = r#"{"user":"ana"}"#,
        pattern = r#"^\{(?:"[A-Za-z0-9_.:-]{1,64}":(?:"[^"\\\u0000-\u001f]{0,256}"|-?(?:0|[1-9][0-9]{0,14})|true|false)(?:,"[A-Za-z0-9_.:-]{1,64}":(?:"[^"\\\u0000-\u001f]{0,256}"|-?(?:0|[1-9][0-9]{0,14})|true|false)){0,7})?\}$"#
    )]
    pub metadata: Option<String>,
    /// Only threads created after this time (RFC 3339, with its offset: `Z` or `+01:00`).
    pub created_after: Option<DateTime<Utc>>,
    /// Only threads updated (appended to, or their metadata changed) after this time (RFC 3339,
    /// with its offset). Commit order is not time order: when polling, overlap the last
    /// `updated_at` seen by a few seconds.
    pub updated_after: Option<DateTime<Utc>>,
    /// What the list goes by: `created_at` (the default) or `updated_at`.
    #[param(inline)]
    pub order_by: Option<ThreadListOrderBy>,
    /// `asc` (oldest first, the default) or `desc` (newest first).
    #[param(inline)]
    pub order: Option<SortOrder>,
    /// Also count the threads the filter matches (`total`, up to 10,000); an expensive request.
    pub include_total: Option<bool>,
    /// Only the forks of this thread (none once it is deleted: its forks stay, with their
    /// `forked_from`).
    #[param(pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 128)]
    pub forked_from: Option<String>,
}

impl ListThreadsQuery {
    fn filter(&self) -> Result<ThreadFilter, ApiError> {
        let metadata = match &self.metadata {
            None => Map::new(),
            Some(text) => {
                if text.len() > MAX_FILTER_BYTES {
                    return Err(ApiError::bad_request(format!(
                        "metadata filters are at most {MAX_FILTER_BYTES} bytes"
                    )));
                }
                let Ok(Value::Object(members)) = serde_json::from_str::<Value>(text) else {
                    return Err(ApiError::bad_request(
                        "metadata must be a JSON object, like {\"user\":\"ana\"}",
                    ));
                };
                if members.len() > MAX_FILTER_MEMBERS {
                    return Err(ApiError::bad_request(format!(
                        "a metadata filter names at most {MAX_FILTER_MEMBERS} members"
                    )));
                }
                for (key, value) in &members {
                    if !filterable_key(key) {
                        return Err(ApiError::bad_request(format!(
                            "metadata keys to filter on are 1–{MAX_FILTER_KEY_CHARS} characters \
                             of [A-Za-z0-9_.:-]"
                        )));
                    }
                    if !(value.is_string() || value.is_number() || value.is_boolean()) {
                        return Err(ApiError::bad_request(
                            "metadata filter values are strings, numbers or booleans",
                        ));
                    }
                }
                members
            }
        };
        Ok(ThreadFilter {
            metadata,
            created_after: self.created_after.map(|at| at.timestamp_millis()),
            updated_after: self.updated_after.map(|at| at.timestamp_millis()),
            order_by: match self.order_by.unwrap_or_default() {
                ThreadListOrderBy::CreatedAt => ThreadOrder::Created,
                ThreadListOrderBy::UpdatedAt => ThreadOrder::Updated,
            },
            descending: self.order == Some(SortOrder::Desc),
            with_total: self.include_total.unwrap_or(false),
            forked_from: match &self.forked_from {
                None => None,
                Some(id) => {
                    check_thread_id(id).map_err(|_| {
                        ApiError::bad_request(format!(
                            "forked_from is a thread id: 1 to {MAX_THREAD_ID_LEN} characters of \
                             [A-Za-z0-9._:-]"
                        ))
                    })?;
                    Some(ThreadId::new(id.clone()))
                }
            },
        })
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ThreadPath {
    /// The thread's id.
    #[param(value_type = String, pattern = r"^[A-Za-z0-9._:-]+$", min_length = 1, max_length = 128)]
    pub thread_id: ThreadId,
}

pub(super) fn check_thread_id(id: &str) -> Result<(), ApiError> {
    if crate::auth::is_identifier(id, MAX_THREAD_ID_LEN) {
        Ok(())
    } else {
        Err(ApiError::invalid_field(
            "id",
            format!("must be 1 to {MAX_THREAD_ID_LEN} characters of [A-Za-z0-9._:-]"),
        ))
    }
}

/// Listing threads loads every metadata of the page: each must stay small.
pub(super) fn check_metadata_size(
    state: &AppState,
    metadata: &Map<String, Value>,
) -> Result<(), ApiError> {
    let bytes = serde_json::to_string(metadata).map_or(usize::MAX, |text| text.len());
    let max = state.limits.max_metadata_bytes;
    if bytes > max {
        return Err(ApiError::invalid_field(
            "metadata",
            format!("at most {max} bytes of JSON, got {bytes}"),
        ));
    }
    Ok(())
}

/// Create a thread.
#[utoipa::path(
    post, path = "/v1/threads", tag = "threads", operation_id = "createThread",
    request_body = CreateThreadRequest,
    responses(
        (status = 201, description = "The thread was created", body = ThreadResponse),
        MalformedJson,
        (status = 409, description = "A thread with this id exists (`thread-exists`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid field (`validation`), or metadata over its size limit (16 KiB of JSON by default)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(request): ApiJson<CreateThreadRequest>,
) -> Result<(StatusCode, Written, Json<ThreadResponse>), ApiError> {
    if let Some(id) = &request.id {
        check_thread_id(id)?;
    }
    if let Some(metadata) = &request.metadata {
        check_metadata_size(&state, metadata)?;
    }
    let thread = state
        .store
        .create_thread(
            &tenant,
            NewThread {
                id: request.id.map(ThreadId::new),
                metadata: request.metadata.unwrap_or_default(),
            },
        )
        .await?;
    let written = Written::now(&state, &tenant, Some(&thread.id)).await;
    let response = ThreadResponse {
        lsn: written.lsn(),
        ..thread.into()
    };
    Ok((StatusCode::CREATED, written, Json(response)))
}

/// Find the tenant's threads: filtered by metadata and time, by creation or update time, oldest
/// or newest first, with the count of all that match when asked.
#[utoipa::path(
    get, path = "/v1/threads", tag = "threads", operation_id = "listThreads",
    params(ListThreadsQuery),
    responses(
        (status = 200, description = "One page of threads", body = ThreadListResponse),
        (status = 400, description = "A bad cursor, limit, metadata filter, time or order (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn list_threads(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(query): ApiQuery<ListThreadsQuery>,
) -> Result<Json<ThreadListResponse>, ApiError> {
    let limit = super::page_limit(query.limit, 50, state.limits.max_page_size)?;
    let filter = query.filter()?;
    // A metadata filter or a total reads rows a page does not hold: one of the tenant's
    // expensive requests, so that no tenant's lists hold every connection.
    let _slot = if !filter.metadata.is_empty() || filter.with_total {
        Some(super::guard::ExpensiveSlot::acquire(&state.guards, &tenant.0).await?)
    } else {
        None
    };
    let page = state
        .store
        .list_threads(&tenant, &filter, query.cursor.as_deref(), limit)
        .await?;
    Ok(Json(ThreadListResponse {
        threads: page.threads.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        total: page.total,
    }))
}

/// Read a thread.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}", tag = "threads", operation_id = "getThread",
    params(ThreadPath),
    responses(
        (status = 200, description = "The thread", body = ThreadResponse),
        ThreadNotFound,
    )
)]
pub async fn get_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<Json<ThreadResponse>, ApiError> {
    let thread = state.store.get_thread(&tenant, &path.thread_id).await?;
    Ok(Json(thread.into()))
}

/// Update a thread's metadata: a merge (JSON Merge Patch, one level), `null` removing a member.
#[utoipa::path(
    patch, path = "/v1/threads/{thread_id}", tag = "threads", operation_id = "updateThread",
    params(ThreadPath),
    request_body = UpdateThreadRequest,
    responses(
        (status = 200, description = "The thread, updated", body = ThreadResponse),
        MalformedJson,
        ThreadNotFound,
        (status = 422, description = "The metadata would pass `--max-metadata-bytes` (`validation`)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn update_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiJson(request): ApiJson<UpdateThreadRequest>,
) -> Result<(Written, Json<ThreadResponse>), ApiError> {
    let thread = state
        .store
        .update_thread_metadata(
            &tenant,
            &path.thread_id,
            &request.metadata,
            state.limits.max_metadata_bytes,
        )
        .await?;
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    let response = ThreadResponse {
        lsn: written.lsn(),
        ..thread.into()
    };
    Ok((written, Json(response)))
}

/// Delete a thread and everything stored under it.
#[utoipa::path(
    delete, path = "/v1/threads/{thread_id}", tag = "threads", operation_id = "deleteThread",
    params(ThreadPath),
    responses(
        (status = 204, description = "The thread and all its data are gone"),
        ThreadNotFound,
    )
)]
pub async fn delete_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
) -> Result<(StatusCode, Written, ()), ApiError> {
    state.store.delete_thread(&tenant, &path.thread_id).await?;
    // Never served again (a thread made later under the id has another key), but a deleted
    // thread's text should not stay in the process either.
    state.context_cache.forget_thread(&tenant, &path.thread_id);
    let written = Written::now(&state, &tenant, Some(&path.thread_id)).await;
    Ok((StatusCode::NO_CONTENT, written, ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_are_checked() {
        assert!(check_thread_id("support-4711").is_ok());
        assert!(check_thread_id("a.b:c_d-E9").is_ok());
        assert!(check_thread_id("").is_err());
        assert!(check_thread_id("has space").is_err());
        assert!(check_thread_id("slash/y").is_err());
        assert!(check_thread_id(&"x".repeat(129)).is_err());
    }

    fn documented_metadata_pattern() -> String {
        let document = crate::http::openapi();
        let parameters = document["paths"]["/v1/threads"]["get"]["parameters"]
            .as_array()
            .expect("listThreads has parameters")
            .clone();
        let metadata = parameters
            .iter()
            .find(|parameter| parameter["name"] == "metadata")
            .expect("the metadata filter is documented");
        metadata["schema"]["pattern"]
            .as_str()
            .expect("with a pattern")
            .to_owned()
    }

    fn listing(metadata: &str) -> ListThreadsQuery {
        ListThreadsQuery {
            cursor: None,
            limit: None,
            metadata: Some(metadata.to_owned()),
            created_after: None,
            updated_after: None,
            order_by: None,
            order: None,
            include_total: None,
            forked_from: None,
        }
    }

    proptest::proptest! {
        /// Whatever the documented pattern allows is a filter the service takes: a generated
        /// client (or a fuzzer) that keeps to the document is never refused.
        #[test]
        fn every_documented_metadata_filter_is_accepted(
            text in proptest::string::string_regex(
                // proptest generates from the pattern without its anchors.
                documented_metadata_pattern().trim_start_matches('^').trim_end_matches('$')
            ).unwrap()
        ) {
            proptest::prop_assert!(text.chars().count() <= MAX_FILTER_BYTES);
            let filter = listing(&text).filter();
            proptest::prop_assert!(filter.is_ok(), "{text:?}");
        }
    }

    #[test]
    fn the_documented_pattern_refuses_what_the_service_refuses() {
        let pattern = regex::Regex::new(&documented_metadata_pattern()).unwrap();
        for refused in [
            r#"{"user":null}"#,
            r#"[1]"#,
            r#"{"a":{"b":1}}"#,
            r#"{"":1}"#,
            "00",
        ] {
            assert!(!pattern.is_match(refused), "{refused}");
            assert!(listing(refused).filter().is_err(), "{refused}");
        }
        assert!(pattern.is_match(r#"{"user":"ana","tier":2,"vip":true}"#));
    }
}
