//! Answers that hold stored entries (message pages, cursor batches, exports, rounds, event
//! streams) take room in the process's answer budget before they read them, and hold what they
//! read until it is sent: however many such answers a client leaves unread, what they hold
//! together stays within `--max-inflight-window-bytes`, and a tenant within half of it.
//!
//! A read takes room for what building the answer from a page holds at most ([`BUILD_FACTOR`]
//! times the page's stored bytes), and keeps room for the answer's own length once built. It
//! takes room for a small page first ([`FIRST_ROOM_BYTES`]): a page larger than that comes
//! without its bodies ([`StoreError::PageLargerThanRoom`]), and the read takes room for its
//! size, then reads it. So a page holds what it is, not the page byte limit, and an entry
//! larger than a page is read alone within room for it.

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
use crate::store::{PageBytes, StoreError, TenantId};

/// What building an answer holds at its peak, per stored byte read: the database's row and the
/// driver's copy of it, the text taken from it, the entries parsed from it, and the answer
/// written from them as it grows. Measured on the release build (BENCHMARKS.md §13): a page of
/// one 30 MiB entry rose 184 MiB (6.1 times) at its peak, with freed memory given back at once
/// (`src/main.rs`); rounded up so that unread pages stay within the budget.
pub const BUILD_FACTOR: u64 = 7;

/// Room a read takes first: most pages are smaller (a page of 1,000 agent messages is ~340 KB),
/// and a larger one is read again within room for its size. At the defaults, 36 such reads fit
/// the budget at once, where each took room for the whole page byte limit (4 MiB) before.
pub const FIRST_ROOM_BYTES: u64 = 1024 * 1024;

/// Reads with `read(bytes)` a page cut at `max_bytes`, within room of the answer budget: room
/// for a small page first, then for the page's size when it is larger, read again. The room
/// comes back with what was read, for [`hold_until_sent`] (or to shrink to what is held).
pub async fn read_within_room<T, F, Fut>(
    guards: &Guards,
    tenant: &TenantId,
    max_bytes: u64,
    mut read: F,
) -> Result<(T, Option<AnswerRoom>), StoreError>
where
    F: FnMut(PageBytes) -> Fut,
    Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    T: Send + 'static,
{
    let max = i64::try_from(max_bytes.max(1)).unwrap_or(i64::MAX);
    let mut room_for = max_bytes.clamp(1, FIRST_ROOM_BYTES);
    loop {
        let room = guards
            .answer_room(&tenant.0, room_for.saturating_mul(BUILD_FACTOR))
            .await;
        let bytes = PageBytes {
            max,
            room: i64::try_from(room_for).unwrap_or(i64::MAX),
        };
        // The read is a task of its own, and holds the room: a request that ends while it reads
        // (its timeout, a client gone) does not stop the database loading what it asked for, and
        // the room must last as long as that memory. Given back as the request ended, it let
        // waiters in one after another, each leaving a load behind (1.1 GB above the budget).
        let reading = read(bytes);
        let (read, room) = tokio::spawn(async move { (reading.await, room) })
            .await
            .unwrap_or_else(|failed| std::panic::resume_unwind(failed.into_panic()));
        match read {
            Err(StoreError::PageLargerThanRoom { bytes })
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
