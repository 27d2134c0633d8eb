//! `GET /v1/threads/{thread_id}/events`: a thread followed live, as Server-Sent Events.
//!
//! The stored record is the source of truth: entries by seq (`messages`), other events by their
//! number in the thread (`thread_events`), each placed after entry `next_seq - 1`. A stream reads
//! a page of each, sends them in that order, and waits for a signal that the thread changed
//! (`store::changes`: this process's writes, other processes' through PostgreSQL `NOTIFY`) or
//! a few seconds, whichever comes first. Its position is its last event's id, so a client that
//! reconnects with `Last-Event-ID` gets what follows it exactly: nothing missed, nothing twice,
//! whichever process serves it and whether or not the server restarted.
//!
//! A stream holds no database connection while it waits and reads a small page when it does;
//! a slow client stops its reads (the next page is read when the last is sent).
//!
//! What a stream read ahead and has not sent may have been erased since: before it sends any,
//! it checks the thread's redaction epoch when the thread's change signal moved (or its last
//! check is three seconds old), and reads again from its last event sent if an erasure,
//! trim or snip's redaction committed meanwhile (or the thread is gone). So nothing read
//! before an erasure is sent after the erasure's answer (docs/ARCHITECTURE.md § Forgetting).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::answers::{Overloaded, ThreadNotFound};
use super::budget::read_within_room;
use super::guard::{AnswerRoom, Guards, StreamSlot};
use super::problem::{ApiError, ApiPath, ApiQuery, Problem};
use super::threads::ThreadPath;
use super::{AppState, Tenant};
use crate::store::{Store, StoreError, TenantId, ThreadEvent, ThreadId, ThreadKey};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(follow_thread))
}

/// Entries, or events, read at a time.
const PAGE: u32 = 100;

/// The most entry bytes a stream reads ahead of what it has sent (at least one entry): a stream
/// its client stopped reading holds this much, and a tenant may hold
/// [`super::guard::MAX_STREAMS_PER_TENANT`] streams.
const PAGE_BYTES: u64 = 256 * 1024;

/// Longest a stream waits without reading, whatever it hears: it catches a change whose signal
/// was lost (a `NOTIFY` dropped, another process on the same SQLite file).
const READ_AGAIN_AFTER: Duration = Duration::from_secs(3);

/// How often an idle stream sends a comment, so proxies and clients see it alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Start after this seq: `-1` from the thread's first entry; one the thread does not hold
    /// yet is 409 `no-such-message`. Without it (and without a `Last-Event-ID` header, which
    /// wins) the stream starts at the thread's end, with what comes next.
    #[param(minimum = -1)]
    pub after_seq: Option<i64>,
}

/// Where a stream is: the last entry and the last other event it sent (their ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    /// The last entry's seq (-1 before the first).
    seq: i64,
    /// The last other event's number in the thread (0 before the first). Unknown after a
    /// resume from an entry's id: then every event after that entry follows.
    event: i64,
}

impl Position {
    /// An event id: an entry's is its seq (`"41"`); another event's is the seq of the entry it
    /// follows and its own number (`"41.3"`).
    fn parse(id: &str) -> Option<Position> {
        let number = |text: &str| {
            (!text.is_empty()
                && text.len() <= 20
                && text
                    .trim_start_matches('-')
                    .bytes()
                    .all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<i64>().ok())
            .flatten()
        };
        match id.split_once('.') {
            None => Some(Position {
                seq: number(id).filter(|seq| *seq >= -1)?,
                event: 0,
            }),
            Some((seq, event)) => Some(Position {
                seq: number(seq).filter(|seq| *seq >= -1)?,
                event: number(event).filter(|event| *event >= 1)?,
            }),
        }
    }
}

/// Follow a thread live: its entries, erasures, outline moves, trims and deletion, as
/// Server-Sent Events.
///
/// Each event has an `event` type, an `id` and JSON `data`:
/// - `entry` (id: its seq, like `41`): an entry stored in the thread, as the messages API
///   returns it (compaction summaries and boundaries and snips are entries too);
/// - `erasure` (id: the seq of the entry it follows and its number, like `41.3`):
///   `{"erasure_id", "seqs", "rewritten_seqs", "created_at"}`, never the erased content:
///   `seqs` are tombstones now, and the compaction summaries at `rewritten_seqs` were derived
///   again without it (read them again);
/// - `trimmed` (id like an erasure's): a retention policy erased the entries before the last
///   compact boundary, the same fields (its compaction summary stays as it was);
/// - `outline` (id like an erasure's): a tree job moved the outline, `{"version", "boundary"}`
///   (read the outline again);
/// - `deleted` (no id): the thread was deleted (or expired by a retention policy: webhooks
///   report that as `thread.expired`); the stream ends.
///
/// Reconnect with the last id received as `Last-Event-ID` (browsers' `EventSource` does so by
/// itself) to get exactly what follows it, from any process serving the same database and
/// after a restart. An idle stream sends a comment every 15 seconds. A tenant holds at most 32
/// streams open at once (503 `overloaded` past them), and a stream counts among its requests in
/// flight while it is open.
///
/// A stream reads a little ahead of what its client has taken. Once an erasure (or a delete) is
/// answered, the stream sends nothing it read before: it reads again, and erased entries come
/// as tombstones before the `erasure` event (through another process serving the same
/// database: once its change notice arrives, within 3 seconds at most). Bytes already written
/// to the connection (socket buffers, proxies) cannot be called back.
#[utoipa::path(
    get, path = "/v1/threads/{thread_id}/events", tag = "threads", operation_id = "followThread",
    params(ThreadPath, EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id (`41` or `41.3`), which wins over `after_seq`")),
    responses(
        (status = 200, description = "A stream of events (`text/event-stream`), until the thread is deleted or the client leaves", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad `Last-Event-ID` or `after_seq`, or a `Last-Event-ID` past the thread's end (`bad-request`)", body = Problem, content_type = "application/problem+json"),
        ThreadNotFound,
        (status = 409, description = "`after_seq` past the thread's end: the thread holds no such message (`no-such-message`; `errors[0].field` is `after_seq`)", body = Problem, content_type = "application/problem+json"),
        Overloaded,
    )
)]
pub async fn follow_thread(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(path): ApiPath<ThreadPath>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // Held as long as the stream: a stream holds its connection as long as the client likes.
    let slot = StreamSlot::take(&state.guards, &tenant.0)?;
    let store = state.store.clone();
    let thread_id = path.thread_id;
    // Followed before the start is read: a change after that read is signalled.
    let changes = store.follow(&tenant, &thread_id);
    let head = store.events_head(&tenant, &thread_id).await?;
    // An empty id is no id (as the SSE rules say).
    let resumed = match headers.get("last-event-id").map(|value| value.to_str()) {
        None => None,
        Some(Ok(id)) if id.trim().is_empty() => None,
        Some(id) => Some(
            id.ok()
                .and_then(|id| Position::parse(id.trim()))
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID is not an id of this stream")
                })?,
        ),
    };
    let start = match (resumed, query.after_seq) {
        (Some(position), _) => {
            // An id past what the thread holds is another thread's (one deleted since, whose
            // id was taken again): following on from it would skip this one's events.
            if position.seq >= head.next_seq || position.event > head.last_event {
                return Err(ApiError::bad_request(
                    "Last-Event-ID is past the thread's end: not an id of this thread",
                ));
            }
            position
        }
        (None, Some(seq)) if (-1..head.next_seq).contains(&seq) => Position { seq, event: 0 },
        (None, Some(seq)) if seq < -1 => {
            return Err(ApiError::bad_request("after_seq is -1 or more"))
        }
        // Past the end: a seq the thread does not hold, as a snip naming one is (following on
        // from it would skip the entries up to it).
        (None, Some(seq)) => {
            return Err(ApiError::no_such_message(
                "after_seq",
                format!(
                    "the thread holds no message {seq}: after_seq is less than its message_count"
                ),
            ))
        }
        (None, None) => Position {
            seq: head.next_seq - 1,
            event: head.last_event,
        },
    };
    let follower = Follower {
        guards: state.guards.clone(),
        room: None,
        store,
        tenant,
        thread_id,
        thread_key: head.thread_key,
        _slot: slot,
        position: start,
        sent: start,
        changes,
        ready: VecDeque::new(),
        read_epoch: head.redaction_epoch,
        checked_at: Instant::now(),
        max_page_bytes: (state.limits.max_page_bytes as u64).min(PAGE_BYTES),
        ended: false,
    };
    let events = stream::unfold(follower, |mut follower| async move {
        follower.next().await.map(|event| (Ok(event), follower))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// One stream's state between the events it sends.
struct Follower {
    guards: Arc<Guards>,
    /// The room in the answer budget of the entries read last, held until the next read: by
    /// then the connection has taken them.
    room: Option<AnswerRoom>,
    store: Store,
    tenant: TenantId,
    thread_id: ThreadId,
    /// The thread followed: one created since under the same id is another.
    thread_key: ThreadKey,
    _slot: StreamSlot,
    /// Where the last event read leaves the stream.
    position: Position,
    /// Where the last event sent leaves it.
    sent: Position,
    changes: tokio::sync::watch::Receiver<u64>,
    /// Read and not yet sent, in order, each with the position it moves the stream to.
    ready: VecDeque<(Event, Position)>,
    /// The thread's redaction epoch when `ready` was read.
    read_epoch: i64,
    /// When `ready` was last known to hold nothing erased since it was read.
    checked_at: Instant,
    max_page_bytes: u64,
    ended: bool,
}

impl Follower {
    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if !self.ready.is_empty() && !self.ended {
                match self.erased_since_read().await {
                    // Read again from the last event sent: erased entries come as tombstones.
                    Ok(true) => {
                        self.ready.clear();
                        self.position = self.sent;
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, "a followed thread could not be read");
                        return None;
                    }
                }
            }
            if let Some((event, position)) = self.ready.pop_front() {
                self.sent = position;
                return Some(event);
            }
            if self.ended {
                return None;
            }
            // Everything read was taken: its room goes back before the stream waits.
            self.room = None;
            // Marked seen before the read: a change during it is signalled again.
            self.changes.borrow_and_update();
            match self.read().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(StoreError::ThreadNotFound) => {
                    self.ended = true;
                    let data = json!({"thread_id": self.thread_id.as_str()});
                    let deleted = Event::default().event("deleted").data(data.to_string());
                    self.ready.push_back((deleted, self.position));
                    continue;
                }
                Err(error) => {
                    // The client reconnects from its last id; nothing is lost.
                    tracing::warn!(%error, "a followed thread could not be read");
                    return None;
                }
            }
            tokio::select! {
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        // The sender is gone only with the store: read once more, then wait.
                        tokio::time::sleep(READ_AGAIN_AFTER).await;
                    }
                }
                () = tokio::time::sleep(READ_AGAIN_AFTER) => {}
            }
        }
    }

    /// Whether what `ready` holds may hold text an erasure (or a trim, or a snip's redaction
    /// of a summary) took out since it was read, or the thread is gone: the thread changed
    /// since (its signal, which moves before an erasure in this process answers) or the last
    /// check is old (a change in another process whose signal is late or lost), and its
    /// redaction epoch is not the one `ready` was read under.
    async fn erased_since_read(&mut self) -> Result<bool, StoreError> {
        let signalled = self.changes.has_changed().unwrap_or(false);
        if !signalled && self.checked_at.elapsed() < READ_AGAIN_AFTER {
            return Ok(false);
        }
        // Marked seen before the read: a change during it is signalled again.
        self.changes.borrow_and_update();
        let head = match self.store.events_head(&self.tenant, &self.thread_id).await {
            Err(StoreError::ThreadNotFound) => return Ok(true),
            head => head?,
        };
        self.checked_at = Instant::now();
        Ok(head.thread_key != self.thread_key || head.redaction_epoch != self.read_epoch)
    }

    /// Reads what follows the position into `ready`, in order: whether it found anything.
    async fn read(&mut self) -> Result<bool, StoreError> {
        // The head first: an event not read below commits later, so its `next_seq` is at least
        // the head's, and it follows every entry read below the head. Its epoch is the one the
        // entries are read under (an erasure after it moves it again).
        let head = self
            .store
            .events_head(&self.tenant, &self.thread_id)
            .await?;
        if head.thread_key != self.thread_key {
            return Err(StoreError::ThreadNotFound);
        }
        self.read_epoch = head.redaction_epoch;
        self.checked_at = Instant::now();
        let events = self
            .store
            .events_after(
                &self.thread_key,
                self.position.event,
                self.position.seq,
                PAGE,
            )
            .await?;
        // A full page of events may not hold every event before the head: the entries read
        // stop where the unread ones may start.
        let before = match events.last() {
            Some(last) if events.len() == PAGE as usize => head.next_seq.min(last.next_seq),
            _ => head.next_seq,
        };
        let (store, thread_key, after) = (&self.store, &self.thread_key, self.position.seq);
        let (entries, room) =
            read_within_room(&self.guards, &self.tenant, self.max_page_bytes, |bytes| {
                let (store, thread_key) = (store.clone(), thread_key.clone());
                async move {
                    let page =
                        store.entries_within_room_by_key(&thread_key, after, before, PAGE, bytes);
                    page.await
                }
            })
            .await?;
        self.room = room;
        let mut events = events.into_iter().peekable();
        let before = self.ready.len();
        let mut held = 0;
        for entry in entries {
            let Some(seq) = entry.seq else { continue };
            while let Some(event) = events.next_if(|event| event.next_seq <= seq) {
                self.send_event(event);
            }
            let data = serde_json::to_string(&entry).unwrap_or_default();
            held += data.len();
            self.position.seq = seq;
            self.ready.push_back((
                Event::default()
                    .event("entry")
                    .id(seq.to_string())
                    .data(data),
                self.position,
            ));
        }
        // The events that follow the last entry sent.
        while let Some(event) = events.next_if(|event| event.next_seq <= self.position.seq + 1) {
            self.send_event(event);
        }
        // What the page holds now is its events' text.
        if let Some(room) = self.room.as_mut() {
            room.shrink_to(held as u64);
        }
        Ok(self.ready.len() > before)
    }

    fn send_event(&mut self, event: ThreadEvent) {
        let follows = event.next_seq - 1;
        let mut data = event.data;
        if let Some(members) = data.as_object_mut() {
            members.insert("created_at".to_owned(), json!(event.created_at));
        }
        self.position.event = event.event_seq;
        self.ready.push_back((
            Event::default()
                .event(event.kind)
                .id(format!("{follows}.{}", event.event_seq))
                .data(data.to_string()),
            self.position,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_read_back_and_nothing_else() {
        assert_eq!(Position::parse("41"), Some(Position { seq: 41, event: 0 }));
        assert_eq!(Position::parse("-1"), Some(Position { seq: -1, event: 0 }));
        assert_eq!(
            Position::parse("41.3"),
            Some(Position { seq: 41, event: 3 })
        );
        for bad in [
            "",
            "x",
            "-2",
            "41.",
            ".3",
            "41.0",
            "41.-3",
            "+4",
            "1.2.3",
            "99999999999999999999999",
        ] {
            assert_eq!(Position::parse(bad), None, "{bad}");
        }
    }
}
