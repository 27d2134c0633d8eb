//! The problem answers that several operations document alike, each written once.
//!
//! Each type is one response for `#[utoipa::path(responses(...))]`: list it by name beside the
//! operation's own tuples (`responses((status = 200, ...), ThreadNotFound, Overloaded)`). utoipa
//! inlines it in every operation, so the document reads as if it were written there; an answer
//! that says something about one operation only stays a tuple on that operation.

use utoipa::IntoResponses;

use super::problem::Problem;

/// 404 on an operation under `/v1/threads/{thread_id}`.
#[derive(IntoResponses)]
#[response(
    status = 404,
    description = "No such thread (`not-found`)",
    content_type = "application/problem+json"
)]
pub struct ThreadNotFound(pub Problem);

/// 400 on an operation whose JSON body the server could not parse.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "Malformed JSON (`bad-request`)",
    content_type = "application/problem+json"
)]
pub struct MalformedJson(pub Problem);

/// 413 on an operation that takes a body.
#[derive(IntoResponses)]
#[response(
    status = 413,
    description = "Body over the size limit (`payload-too-large`)",
    content_type = "application/problem+json"
)]
pub struct PayloadTooLarge(pub Problem);

/// 413 on an operation that stores what its body holds.
#[derive(IntoResponses)]
#[response(
    status = 413,
    description = "Body over the size limit (`payload-too-large`), or the thread would pass the server's limit on its stored bytes (`thread-too-large`, with `stored_bytes` and `limit_bytes`)",
    content_type = "application/problem+json"
)]
pub struct TooLargeToStore(pub Problem);

/// 422 on an operation whose fields are checked one by one; `errors[].field` names the field.
#[derive(IntoResponses)]
#[response(
    status = 422,
    description = "An invalid field (`validation`)",
    content_type = "application/problem+json"
)]
pub struct InvalidField(pub Problem);

/// 422 on an operation that loads a thread's context window.
#[derive(IntoResponses)]
#[response(
    status = 422,
    description = "The context is too large to load (`window-too-large`): compact the thread",
    content_type = "application/problem+json"
)]
pub struct WindowTooLarge(pub Problem);

/// 503 on an expensive operation, which waits for one of the limited slots.
///
/// The document adds the database's `unavailable` to this description (`document_security`).
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "Too many expensive requests at once (`overloaded`); see `Retry-After`",
    content_type = "application/problem+json"
)]
pub struct Overloaded(pub Problem);
