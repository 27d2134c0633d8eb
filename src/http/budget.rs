//! Answers that hold stored entries (message pages, cursor batches, exports, rounds, event
//! streams) take room in the process's answer budget before they read them, and hold what they
//! read until it is sent: however many such answers a client leaves unread, what they hold
//! together stays within `--max-inflight-window-bytes`, and a tenant within half of it.
//!
//! A read takes room for what building the answer from a page holds at most ([`BUILD_FACTOR`]
//! times the page's stored bytes), reads a page cut within its bytes, and keeps room for the
//! answer's own length once built. An entry larger than a page comes without its body
//! ([`StoreError::EntryLargerThanRoom`]): the read takes room for it first, then reads it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header;
use axum::response::Response;
use hyper::body::Frame;

use super::guard::{send_deadline, AnswerRoom, Guards, Holding};
use super::AppState;
use crate::store::{StoreError, TenantId};

/// What building an answer holds at its peak, per stored byte read: the database's row and the
/// driver's copy of it, the text taken from it, the entries parsed from it, and the answer
/// written from them as it grows. Measured on the release build: four unread pages of one
/// 30 MiB entry each rose 564 MiB when a page was charged three times its bytes.
pub const BUILD_FACTOR: u64 = 6;

/// Reads with `read(max_bytes)` within room of the answer budget: room for building from
/// `max_bytes` first, then for a first entry larger than that, read again. The room comes back
/// with what was read, for [`hold_until_sent`] (or to shrink to what is held once built).
pub async fn read_within_room<T, F, Fut>(
    guards: &Guards,
    tenant: &TenantId,
    max_bytes: u64,
    mut read: F,
) -> Result<(T, Option<AnswerRoom>), StoreError>
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut room_for = max_bytes.max(1);
    loop {
        let room = guards
            .answer_room(&tenant.0, room_for.saturating_mul(BUILD_FACTOR))
            .await;
        match read(i64::try_from(room_for).unwrap_or(i64::MAX)).await {
            Err(StoreError::EntryLargerThanRoom { bytes })
                if u64::try_from(bytes).is_ok_and(|bytes| bytes > room_for) =>
            {
                drop(room);
                room_for = bytes as u64;
            }
            read => return Ok((read?, room)),
        }
    }
}

/// `answer` holding `room` until its body is sent (or the client is too slow to take it,
/// [`send_deadline`]), room kept for the answer's own length.
pub fn hold_until_sent(state: &AppState, answer: Response, room: Option<AnswerRoom>) -> Response {
    let Some(mut room) = room else {
        return answer;
    };
    let length = answer
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse().ok())
        .or_else(|| hyper::body::Body::size_hint(answer.body()).exact());
    if let Some(length) = length {
        room.shrink_to(length);
    }
    let bytes = length.unwrap_or(room.kib() as u64 * 1024);
    let deadline = send_deadline(state.limits.write_timeout, bytes);
    let room = Arc::new(room);
    answer.map(|body| {
        let held = Body::new(HeldByFrames {
            body,
            room: room.clone(),
        });
        Body::new(Holding::until(held, room, deadline))
    })
}

/// A body whose every piece holds `room` until the connection has written it and let it go:
/// hyper takes an answer's pieces long before it writes them (a whole JSON answer is one piece,
/// taken at once), and the room must last as long as the bytes do.
struct HeldByFrames {
    body: Body,
    room: Arc<AnswerRoom>,
}

/// A piece of an answer and the room it holds.
struct HeldBytes {
    bytes: Bytes,
    _room: Arc<AnswerRoom>,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl HttpBody for HeldByFrames {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let room = self.room.clone();
        Pin::new(&mut self.body).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| {
                    frame.map_data(|bytes| Bytes::from_owner(HeldBytes { bytes, _room: room }))
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
