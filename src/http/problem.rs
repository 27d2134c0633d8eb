//! Errors as `application/problem+json` (RFC 9457), with a stable `type` per kind of failure.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::history::ingest::FieldError;
use crate::store::{MessageRef, StoreError};

/// Every problem `type` Loupe answers with. The URN is stable: clients switch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Malformed JSON, a bad query string or path parameter.
    BadRequest,
    /// Well-formed JSON whose values are wrong; `errors` names the fields.
    Validation,
    NotFound,
    ThreadExists,
    /// `expected_next_seq` did not match: another writer appended first.
    SeqConflict,
    /// A message uuid is already stored with different content.
    UuidConflict,
    /// Part of the batch is stored already; a retry must resend the exact batch.
    PartialReplay,
    /// The context window holds too many entries to load: compact the thread.
    WindowTooLarge,
    /// A cursor's bookmark is not where `expected` says, or the caller's lease was taken over.
    CursorConflict,
    /// Another worker holds the cursor's lease; `lease_expires_at` says until when.
    CursorLeased,
    /// A cursor cannot move back.
    CursorBackward,
    PayloadTooLarge,
    UnsupportedMediaType,
    MethodNotAllowed,
    Timeout,
    /// The request body did not arrive within the body-read timeout.
    BodyTimeout,
    Unavailable,
    Internal,
    /// No credentials, or credentials that are not a valid, active key.
    Unauthorized,
    /// Valid credentials that may not use this endpoint (a tenant key on the admin API).
    Forbidden,
    /// The tenant's rate limit is exhausted; `Retry-After` says when to come back.
    RateLimited,
    /// Too many expensive requests at once; retry shortly.
    Overloaded,
    TenantExists,
    OutlineDisabled,
}

impl ProblemKind {
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::BadRequest => "bad-request",
            ProblemKind::Validation => "validation",
            ProblemKind::NotFound => "not-found",
            ProblemKind::ThreadExists => "thread-exists",
            ProblemKind::SeqConflict => "seq-conflict",
            ProblemKind::UuidConflict => "uuid-conflict",
            ProblemKind::PartialReplay => "partial-replay",
            ProblemKind::WindowTooLarge => "window-too-large",
            ProblemKind::CursorConflict => "cursor-conflict",
            ProblemKind::CursorLeased => "cursor-leased",
            ProblemKind::CursorBackward => "cursor-backward",
            ProblemKind::PayloadTooLarge => "payload-too-large",
            ProblemKind::UnsupportedMediaType => "unsupported-media-type",
            ProblemKind::MethodNotAllowed => "method-not-allowed",
            ProblemKind::Timeout => "timeout",
            ProblemKind::BodyTimeout => "body-timeout",
            ProblemKind::Unavailable => "unavailable",
            ProblemKind::Internal => "internal",
            ProblemKind::Unauthorized => "unauthorized",
            ProblemKind::Forbidden => "forbidden",
            ProblemKind::RateLimited => "rate-limited",
            ProblemKind::Overloaded => "overloaded",
            ProblemKind::TenantExists => "tenant-exists",
            ProblemKind::OutlineDisabled => "outline-disabled",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::BadRequest => StatusCode::BAD_REQUEST,
            ProblemKind::Validation | ProblemKind::WindowTooLarge | ProblemKind::CursorBackward => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ProblemKind::NotFound => StatusCode::NOT_FOUND,
            ProblemKind::ThreadExists
            | ProblemKind::TenantExists
            | ProblemKind::SeqConflict
            | ProblemKind::UuidConflict
            | ProblemKind::PartialReplay
            | ProblemKind::CursorConflict
            | ProblemKind::CursorLeased
            | ProblemKind::OutlineDisabled => StatusCode::CONFLICT,
            ProblemKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProblemKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProblemKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProblemKind::Timeout | ProblemKind::Unavailable | ProblemKind::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProblemKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ProblemKind::Forbidden => StatusCode::FORBIDDEN,
            ProblemKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ProblemKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(self) -> &'static str {
        match self {
            ProblemKind::BadRequest => "Bad request",
            ProblemKind::Validation => "Invalid field",
            ProblemKind::NotFound => "Not found",
            ProblemKind::ThreadExists => "Thread already exists",
            ProblemKind::SeqConflict => "Another writer appended first",
            ProblemKind::UuidConflict => "Message uuid already used",
            ProblemKind::PartialReplay => "Batch partly stored",
            ProblemKind::WindowTooLarge => "Context too large",
            ProblemKind::CursorConflict => "The cursor moved",
            ProblemKind::CursorLeased => "The cursor is leased",
            ProblemKind::CursorBackward => "A cursor moves forward only",
            ProblemKind::PayloadTooLarge => "Request body too large",
            ProblemKind::UnsupportedMediaType => "Unsupported media type",
            ProblemKind::MethodNotAllowed => "Method not allowed",
            ProblemKind::Timeout => "Request timed out",
            ProblemKind::BodyTimeout => "Request body too slow",
            ProblemKind::Unavailable => "Service unavailable",
            ProblemKind::Internal => "Internal error",
            ProblemKind::Unauthorized => "Unauthorized",
            ProblemKind::Forbidden => "Forbidden",
            ProblemKind::RateLimited => "Rate limit exceeded",
            ProblemKind::OutlineDisabled => "The thread is not in outline mode",
            ProblemKind::Overloaded => "Service overloaded",
            ProblemKind::TenantExists => "Tenant already exists",
        }
    }

    pub fn type_uri(self) -> String {
        format!("urn:loupe:problem:{}", self.slug())
    }
}

/// A problem details document (RFC 9457).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:loupe:problem:not-found",
    "title": "Not found",
    "status": 404,
    "detail": "thread not found",
    "request_id": "0b6c1b3e-8c39-4c67-9f0e-4d2b5d2e8f10"
}))]
pub struct Problem {
    /// Stable machine-readable kind: `urn:loupe:problem:<kind>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Extension members: `errors` (field errors), `next_seq` (seq conflicts), …
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extensions: Map<String, Value>,
}

/// An error a handler returns; rendered as a [`Problem`].
#[derive(Debug)]
pub struct ApiError {
    pub kind: ProblemKind,
    pub detail: String,
    pub extensions: Map<String, Value>,
    /// Extra response headers (`WWW-Authenticate`, `Retry-After`); boxed to keep errors small.
    pub headers: Option<Box<HeaderMap>>,
}

impl ApiError {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        ApiError {
            kind,
            detail: detail.into(),
            extensions: Map::new(),
            headers: None,
        }
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers
            .get_or_insert_with(Default::default)
            .insert(name, value);
        self
    }

    /// 401 `unauthorized`, with the `WWW-Authenticate: Bearer` challenge.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        ApiError::new(ProblemKind::Unauthorized, detail).with_header(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"loupe\""),
        )
    }

    /// A problem telling the caller to come back after `seconds`.
    pub fn retry_after(kind: ProblemKind, detail: impl Into<String>, seconds: u64) -> Self {
        ApiError::new(kind, detail)
            .with("retry_after", seconds)
            .with_header(header::RETRY_AFTER, HeaderValue::from(seconds))
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(key.to_owned(), value.into());
        self
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(ProblemKind::NotFound, format!("{what} not found"))
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::new(ProblemKind::BadRequest, detail)
    }

    pub fn field(error: FieldError) -> Self {
        let detail = error.to_string();
        ApiError::new(ProblemKind::Validation, detail).with(
            "errors",
            serde_json::json!([{"field": error.path, "problem": error.problem}]),
        )
    }

    pub fn problem(&self) -> Problem {
        Problem {
            kind: self.kind.type_uri(),
            title: self.kind.title().to_owned(),
            status: self.kind.status().as_u16(),
            detail: self.detail.clone(),
            extensions: self.extensions.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.kind == ProblemKind::Internal {
            tracing::error!(detail = %self.detail, "internal error");
        }
        let status = self.kind.status();
        let mut problem = self.problem();
        if self.kind == ProblemKind::Internal {
            // Details of internal failures stay in the log.
            problem.detail = "the server failed to handle the request; see its log".to_owned();
        }
        let mut response = problem_response(status, &problem);
        if let Some(headers) = self.headers {
            response.headers_mut().extend(*headers);
        }
        response
    }
}

pub fn problem_response(status: StatusCode, problem: &Problem) -> Response {
    let body = serde_json::to_vec(problem).unwrap_or_default();
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body,
    )
        .into_response()
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::ThreadNotFound => ApiError::not_found("thread"),
            StoreError::ThreadExists(id) => ApiError::new(
                ProblemKind::ThreadExists,
                format!("a thread with id {id:?} already exists"),
            ),
            StoreError::SeqConflict { expected, actual } => ApiError::new(
                ProblemKind::SeqConflict,
                format!("expected_next_seq is {expected}, but the thread's next seq is {actual}"),
            )
            .with("next_seq", actual),
            StoreError::UuidConflict { ref uuid, seq } => {
                let uuid = uuid.clone();
                ApiError::new(ProblemKind::UuidConflict, error.to_string())
                    .with("uuid", uuid)
                    .with("seq", seq)
            }
            StoreError::PartialReplay { .. } => {
                ApiError::new(ProblemKind::PartialReplay, error.to_string())
            }
            StoreError::DuplicateUuid(ref uuid) => {
                let path = "messages[].uuid".to_owned();
                ApiError::field(FieldError {
                    path,
                    problem: format!("uuid {uuid:?} appears twice in the batch"),
                })
            }
            StoreError::TenantExists(id) => ApiError::new(
                ProblemKind::TenantExists,
                format!("a tenant with id {id:?} already exists"),
            ),
            StoreError::KeyNotFound => ApiError::not_found("API key"),
            StoreError::BadCursor => ApiError::bad_request("invalid cursor"),
            StoreError::JobNotFound => ApiError::not_found("job"),
            StoreError::NoSuchMessage(ref named) => ApiError::field(FieldError {
                path: match named {
                    MessageRef::Seq(_) => "seqs",
                    MessageRef::Uuid(_) => "uuids",
                }
                .to_owned(),
                problem: error.to_string(),
            }),
            StoreError::WindowTooLarge { .. } => {
                ApiError::new(ProblemKind::WindowTooLarge, error.to_string())
            }
            StoreError::CursorConflict { ref current, .. } => {
                let current = current
                    .as_ref()
                    .map(|(seq, uuid)| serde_json::json!({"seq": seq, "uuid": uuid}));
                ApiError::new(ProblemKind::CursorConflict, error.to_string())
                    .with("current", current.unwrap_or(Value::Null))
            }
            StoreError::CursorLeased { expires_at } => {
                let expires = crate::store::millis_to_datetime(expires_at)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                ApiError::new(
                    ProblemKind::CursorLeased,
                    "another worker holds the cursor's lease",
                )
                .with("lease_expires_at", expires)
            }
            StoreError::CursorBackward {
                current_seq,
                target_seq,
            } => ApiError::new(ProblemKind::CursorBackward, error.to_string())
                .with("current_seq", current_seq)
                .with("target_seq", target_seq),
            // A fault of the database, not of the request: the same request can succeed later.
            ref transient if transient.is_transient() => {
                tracing::warn!(error = %transient, "database unavailable");
                ApiError::retry_after(
                    ProblemKind::Unavailable,
                    "the database is busy or unreachable; retry shortly",
                    1,
                )
            }
            other => ApiError::new(ProblemKind::Internal, other.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let kind = match rejection {
            JsonRejection::JsonDataError(_) => ProblemKind::Validation,
            JsonRejection::MissingJsonContentType(_) => ProblemKind::UnsupportedMediaType,
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ProblemKind::PayloadTooLarge
            }
            _ => ProblemKind::BadRequest,
        };
        ApiError::new(kind, rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request(rejection.body_text())
    }
}

/// `axum::Json`, answering its rejections as problems.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Query`, answering its rejections as problems.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path`, answering its rejections as problems.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
