//! Errors as `application/problem+json` (RFC 9457), with a stable `type` per kind of failure.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::error::Error;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::history::ingest::FieldError;
use crate::store::{MessageRef, StoreError};

/// Declares the problem kinds as one table: each kind with its slug, HTTP status and title.
macro_rules! problem_kinds {
    ($($(#[$doc:meta])* $kind:ident => ($slug:literal, $status:ident, $title:literal),)*) => {
        /// Every problem `type` Loupe answers with. The URN is stable: clients switch on it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ProblemKind {
            $($(#[$doc])* $kind,)*
        }

        impl ProblemKind {
            /// Every kind, in table order (the `type` enum of the OpenAPI document).
            pub const ALL: &'static [ProblemKind] = &[$(ProblemKind::$kind),*];

            const fn row(self) -> (&'static str, StatusCode, &'static str) {
                match self {
                    $(ProblemKind::$kind => ($slug, StatusCode::$status, $title),)*
                }
            }
        }
    };
}

problem_kinds! {
    /// Malformed JSON, a bad query string or path parameter.
    BadRequest => ("bad-request", BAD_REQUEST, "Bad request"),
    /// Well-formed JSON whose values are wrong; `errors` names the fields.
    Validation => ("validation", UNPROCESSABLE_ENTITY, "Invalid field"),
    NotFound => ("not-found", NOT_FOUND, "Not found"),
    ThreadExists => ("thread-exists", CONFLICT, "Thread already exists"),
    /// `expected_next_seq` did not match: another writer appended first.
    SeqConflict => ("seq-conflict", CONFLICT, "Another writer appended first"),
    /// The thread (which exists) holds no message the request names by seq or uuid; `errors`
    /// names the member that named it.
    NoSuchMessage => ("no-such-message", CONFLICT, "The thread holds no such message"),
    /// A message uuid is already stored with different content.
    UuidConflict => ("uuid-conflict", CONFLICT, "Message uuid already used"),
    /// Part of the batch is stored already; a retry must resend the exact batch.
    PartialReplay => ("partial-replay", CONFLICT, "Batch partly stored"),
    /// The context window holds too many entries to load: compact the thread.
    WindowTooLarge => ("window-too-large", UNPROCESSABLE_ENTITY, "Context too large"),
    /// A cursor's bookmark is not where `expected` says, or the caller's lease was taken over.
    CursorConflict => ("cursor-conflict", CONFLICT, "The cursor moved"),
    /// Another worker holds the cursor's lease; `lease_expires_at` says until when.
    CursorLeased => ("cursor-leased", CONFLICT, "The cursor is leased"),
    /// A cursor cannot move back.
    CursorBackward => ("cursor-backward", UNPROCESSABLE_ENTITY, "A cursor moves forward only"),
    PayloadTooLarge => ("payload-too-large", PAYLOAD_TOO_LARGE, "Request body too large"),
    /// The append would take the thread past the server's `--max-thread-bytes`.
    ThreadTooLarge => ("thread-too-large", PAYLOAD_TOO_LARGE, "Thread too large"),
    UnsupportedMediaType => ("unsupported-media-type", UNSUPPORTED_MEDIA_TYPE, "Unsupported media type"),
    MethodNotAllowed => ("method-not-allowed", METHOD_NOT_ALLOWED, "Method not allowed"),
    Timeout => ("timeout", SERVICE_UNAVAILABLE, "Request timed out"),
    /// The request body did not arrive within the body-read timeout.
    BodyTimeout => ("body-timeout", REQUEST_TIMEOUT, "Request body too slow"),
    Unavailable => ("unavailable", SERVICE_UNAVAILABLE, "Service unavailable"),
    Internal => ("internal", INTERNAL_SERVER_ERROR, "Internal error"),
    /// No credentials, or credentials that are not a valid, active key.
    Unauthorized => ("unauthorized", UNAUTHORIZED, "Unauthorized"),
    /// Valid credentials that may not use this endpoint (a tenant key on the admin API).
    Forbidden => ("forbidden", FORBIDDEN, "Forbidden"),
    /// The tenant's rate limit is exhausted; `Retry-After` says when to come back.
    RateLimited => ("rate-limited", TOO_MANY_REQUESTS, "Rate limit exceeded"),
    /// Too many expensive requests at once; retry shortly.
    Overloaded => ("overloaded", SERVICE_UNAVAILABLE, "Service overloaded"),
    /// The tenant has as many requests (or imports) in flight as its share allows; retry shortly.
    TooManyInFlight => ("too-many-in-flight", TOO_MANY_REQUESTS, "Too many requests in flight"),
    /// Open mode answers only loopback host names (and `--allowed-hosts`): a page on another
    /// origin that rebinds its name to this address cannot reach the API.
    HostNotAllowed => ("host-not-allowed", MISDIRECTED_REQUEST, "Host not allowed"),
    TenantExists => ("tenant-exists", CONFLICT, "Tenant already exists"),
    OutlineDisabled => ("outline-disabled", CONFLICT, "The thread is not in outline mode"),
}

impl ProblemKind {
    pub fn slug(self) -> &'static str {
        self.row().0
    }

    pub fn status(self) -> StatusCode {
        self.row().1
    }

    fn title(self) -> &'static str {
        self.row().2
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
    /// The fault behind a 5xx, kept whole so its cause chain reaches the log.
    pub source: Option<Source>,
}

/// The error behind a fault; a thin pointer, to keep `ApiError` small.
pub type Source = Arc<Box<dyn Error + Send + Sync>>;

impl ApiError {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        ApiError {
            kind,
            detail: detail.into(),
            extensions: Map::new(),
            headers: None,
            source: None,
        }
    }

    /// A 500 `internal` caused by `source`; its message and causes are logged, never sent.
    pub fn internal(source: impl Error + Send + Sync + 'static) -> Self {
        ApiError {
            source: Some(Arc::new(Box::new(source))),
            ..ApiError::new(
                ProblemKind::Internal,
                "the server failed to handle the request",
            )
        }
    }

    /// Keeps `source` as the cause of this error (logged, never sent).
    pub fn caused_by(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(Box::new(source)));
        self
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

    /// 409 `no-such-message`: the thread holds no message the member at `path` names. The
    /// request is well-formed and what its path names exists (a 404 would say the thread is
    /// gone); it conflicts with the thread's state, and succeeds once such a message is stored.
    pub fn no_such_message(path: &str, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        ApiError::new(ProblemKind::NoSuchMessage, detail.clone()).with(
            "errors",
            serde_json::json!([{"field": path, "problem": detail}]),
        )
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::new(ProblemKind::BadRequest, detail)
    }

    /// 422 `validation` naming the one field that is wrong: its JSON path and what is wrong.
    pub fn invalid_field(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ApiError::field(FieldError {
            path: path.into(),
            problem: problem.into(),
        })
    }

    /// 422 `validation` for a field error found by a check (`history::ingest`).
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
        if self.kind == ProblemKind::Internal || self.source.is_some() {
            // Logged once, inside the request's span, by `observe::log_faults`.
            response.extensions_mut().insert(Fault {
                kind: self.kind,
                detail: self.detail,
                source: self.source,
            });
        }
        response
    }
}

/// A server-side failure travelling with its response to the middleware that logs it.
#[derive(Clone)]
pub struct Fault {
    pub kind: ProblemKind,
    pub detail: String,
    pub source: Option<Source>,
}

impl std::fmt::Display for Fault {
    /// The detail, then each cause in turn: `detail: cause: its cause`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)?;
        let mut cause: Option<&(dyn Error + 'static)> = match &self.source {
            Some(source) => Some(source.as_ref().as_ref()),
            None => None,
        };
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
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
            StoreError::DuplicateUuid(ref uuid) => ApiError::invalid_field(
                "messages[].uuid",
                format!("uuid {uuid:?} appears twice in the batch"),
            ),
            StoreError::TenantExists(id) => ApiError::new(
                ProblemKind::TenantExists,
                format!("a tenant with id {id:?} already exists"),
            ),
            StoreError::KeyNotFound => ApiError::not_found("API key"),
            StoreError::BadCursor => ApiError::bad_request("invalid cursor"),
            StoreError::MetadataTooLarge { .. } | StoreError::MetadataHoldsNul(_) => {
                ApiError::invalid_field("metadata", error.to_string())
            }
            StoreError::ForkPastEnd { .. } => ApiError::invalid_field("at_seq", error.to_string()),
            StoreError::JobNotFound => ApiError::not_found("job"),
            StoreError::WebhookNotFound => ApiError::not_found("webhook"),
            StoreError::DeliveryNotFound => ApiError::not_found("delivery"),
            StoreError::NoSuchMessage(ref named) => {
                let path = match named {
                    MessageRef::Seq(_) => "seqs",
                    MessageRef::Uuid(_) => "uuids",
                };
                ApiError::no_such_message(path, error.to_string())
            }
            StoreError::NoSuchEntries { field, .. } => {
                ApiError::no_such_message(field, error.to_string())
            }
            StoreError::WindowTooLarge { .. } => {
                ApiError::new(ProblemKind::WindowTooLarge, error.to_string())
            }
            StoreError::ThreadTooLarge { stored, limit, .. } => {
                ApiError::new(ProblemKind::ThreadTooLarge, error.to_string())
                    .with("stored_bytes", stored)
                    .with("limit_bytes", limit)
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
            // The thread kept changing under the request (erasures, snips, compactions racing
            // it): the same request can succeed once they settle.
            // Readers take room for such a page and read again: one reaching here is a reader
            // that did not, and the answer is the budget's.
            StoreError::PageLargerThanRoom { .. } => ApiError::retry_after(
                ProblemKind::Overloaded,
                "the answer does not fit the server's memory budget now; retry shortly",
                1,
            ),
            StoreError::SourcesChanged => ApiError::retry_after(
                ProblemKind::Unavailable,
                "the thread kept changing while the request read it; retry shortly",
                1,
            ),
            // The request's content, not a fault: 422, so no client retries it forever. In our
            // words: the database's message names its types and may quote what it refused, and
            // stays in the log.
            error if error.refuses_content() => ApiError::new(
                ProblemKind::Validation,
                "the database cannot store the request's content: a value too large, or a \
                 character it does not accept",
            )
            .caused_by(error),
            // A fault of the database, not of the request: the same request can succeed later.
            error if error.is_transient() => ApiError::retry_after(
                ProblemKind::Unavailable,
                "the database is busy or unreachable; retry shortly",
                1,
            )
            .caused_by(error),
            other => ApiError::internal(other),
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

/// A JSON object body, answering its rejections as problems.
///
/// Like `axum::Json`, with two rules of the OpenAPI document: the body must be an object (serde
/// would also read a struct from an array), and a number with a zero fraction (`5.0`) counts as
/// an integer, as in JSON Schema.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !has_json_content_type(request.headers()) {
            return Err(ApiError::new(
                ProblemKind::UnsupportedMediaType,
                "expected a request with `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                let kind = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ProblemKind::PayloadTooLarge
                } else {
                    ProblemKind::BadRequest
                };
                ApiError::new(kind, rejection.body_text())
            })?;
        let value = match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => value,
            Err(JsonRejection::JsonDataError(error)) => {
                // The slow path runs only for a body the strict parse refused.
                integral_reading(&bytes).ok_or(JsonRejection::JsonDataError(error))?
            }
            Err(rejection) => return Err(rejection.into()),
        };
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(ApiError::invalid_field(
                "",
                "the body must be a JSON object",
            ));
        }
        Ok(ApiJson(value))
    }
}

/// `application/json`, or any `application/*+json` type.
fn has_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Reads `bytes` again with every integral float (`5.0`) turned into an integer.
fn integral_reading<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let mut value: Value = serde_json::from_slice(bytes).ok()?;
    integralize(&mut value);
    serde_json::from_value(value).ok()
}

fn integralize(value: &mut Value) {
    match value {
        Value::Number(number) => {
            let Some(float) = number.as_f64().filter(|_| number.is_f64()) else {
                return;
            };
            // The bounds are -2^63, 2^63 and 2^64, exact in f64 (`u64::MAX as f64` rounds to
            // 2^64): the casts below cannot saturate. -2^63 itself is left out, as integers just
            // below it round to it.
            if float.fract() == 0.0 && float > i64::MIN as f64 {
                if float < -(i64::MIN as f64) {
                    *number = (float as i64).into();
                } else if float < u64::MAX as f64 {
                    *number = (float as u64).into();
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integralize),
        Value::Object(members) => members.values_mut().for_each(integralize),
        _ => {}
    }
}

/// `axum::extract::Query`, answering its rejections as problems.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path`, answering its rejections as problems.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_floats_read_as_integers_and_others_do_not() {
        #[derive(Debug, serde::Deserialize, PartialEq)]
        struct Body {
            n: i64,
            m: Option<u32>,
        }
        assert_eq!(
            integral_reading::<Body>(br#"{"n": -227.0, "m": 29.0}"#),
            Some(Body {
                n: -227,
                m: Some(29)
            })
        );
        assert_eq!(integral_reading::<Body>(br#"{"n": 1.5}"#), None);
        assert_eq!(integral_reading::<Body>(br#"{"n": 1e300}"#), None);
        // Out of range, not rounded into it.
        assert_eq!(
            integral_reading::<Body>(br#"{"n": -9223372036854775809}"#),
            None
        );
    }

    #[test]
    fn every_kind_has_its_own_slug_and_an_error_status() {
        let mut slugs = std::collections::HashSet::new();
        for kind in ProblemKind::ALL {
            assert!(slugs.insert(kind.slug()), "{kind:?}: slug used twice");
            assert!(kind.status().as_u16() >= 400, "{kind:?}");
            assert!(!kind.title().is_empty(), "{kind:?}");
        }
    }

    #[test]
    fn a_fault_travels_with_its_cause_chain_and_stays_out_of_the_body() {
        let cause = StoreError::Corrupt("message body: disk gone".to_owned());
        let response = ApiError::from(cause).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let fault = response.extensions().get::<Fault>().expect("the fault");
        assert!(fault.to_string().contains("disk gone"), "{fault}");
        // A fault of the database answers 503 and keeps its cause too.
        let cause = StoreError::Database(sqlx::Error::Io(std::io::Error::other("reset")));
        let response = ApiError::from(cause).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let fault = response.extensions().get::<Fault>().expect("the fault");
        assert!(fault.to_string().contains("reset"), "{fault}");
        // A caller's mistake carries no fault: nothing to log.
        let response = ApiError::not_found("thread").into_response();
        assert!(response.extensions().get::<Fault>().is_none());
    }
}
