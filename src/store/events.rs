//! A thread's events other than its entries (`thread_events`, migration 0022): written in the
//! transaction of the change they report, read by `GET /v1/threads/{id}/events` beside the
//! entries, and placed among them by the thread's `next_seq` when they committed.

use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use super::rows::{entries_within_room, page_within_room, PageBytes};
use super::{millis_to_datetime, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::Entry;

/// Where a followed thread is: its key, its next seq and its last event's number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsHead {
    pub thread_key: ThreadKey,
    pub next_seq: i64,
    pub last_event: i64,
    /// The thread's redaction epoch: an erasure, a trim or a snip's redaction moves it.
    pub redaction_epoch: i64,
}

/// An event of a thread that is not one of its entries.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadEvent {
    /// Its number in the thread, from 1.
    pub event_seq: i64,
    /// The thread's next seq when it committed: it follows entry `next_seq - 1`.
    pub next_seq: i64,
    /// What happened: `erasure`.
    pub kind: String,
    pub data: Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Records an event of the thread `thread_key` in `tx`, which must hold the thread's row (so
/// that its `next_seq` and the event's number are the thread's own at the commit).
pub(super) async fn record_event(
    tx: &mut Transaction<'_, Any>,
    thread_key: &str,
    kind: &str,
    data: &Value,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO thread_events (thread_key, event_seq, next_seq, kind, data, created_at) \
         SELECT t.thread_key, COALESCE((SELECT MAX(e.event_seq) FROM thread_events e \
         WHERE e.thread_key = t.thread_key), 0) + 1, t.next_seq, $2, $3, $4 \
         FROM threads t WHERE t.thread_key = $1",
    )
    .bind(thread_key)
    .bind(kind)
    .bind(data.to_string())
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Where the tenant's thread is now, in one statement: its key, its next seq, its last
    /// event's number (0 without any) and its redaction epoch.
    pub async fn events_head(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<EventsHead, StoreError> {
        // An expired thread is not found: a stream on it ends as on a deleted one.
        let row = sqlx::query(&format!(
            "SELECT t.thread_key, t.next_seq, t.redaction_epoch, (SELECT MAX(e.event_seq) \
             FROM thread_events e \
             WHERE e.thread_key = t.thread_key) AS last_event FROM threads t \
             WHERE t.tenant_id = $1 AND t.thread_id = $2{}",
            super::expiry::unexpired("t.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(super::now_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok(EventsHead {
            thread_key: ThreadKey::from_stored(row.try_get::<String, _>("thread_key")?),
            next_seq: row.try_get("next_seq")?,
            last_event: row.try_get::<Option<i64>, _>("last_event")?.unwrap_or(0),
            redaction_epoch: row.try_get("redaction_epoch")?,
        })
    }

    /// The thread `thread_key`'s events numbered after `after_event` that follow entry
    /// `after_seq` (`next_seq > after_seq`), at most `limit`, in order.
    pub async fn events_after(
        &self,
        thread_key: &ThreadKey,
        after_event: i64,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<ThreadEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT event_seq, next_seq, kind, data, created_at FROM thread_events \
             WHERE thread_key = $1 AND event_seq > $2 AND next_seq > $4 \
             ORDER BY event_seq LIMIT $3",
        )
        .bind(thread_key.as_str())
        .bind(after_event)
        .bind(i64::from(limit))
        .bind(after_seq)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let data: String = row.try_get("data")?;
                Ok(ThreadEvent {
                    event_seq: row.try_get("event_seq")?,
                    next_seq: row.try_get("next_seq")?,
                    kind: row.try_get("kind")?,
                    data: serde_json::from_str(&data)
                        .map_err(|e| StoreError::Corrupt(format!("thread event: {e}")))?,
                    created_at: millis_to_datetime(row.try_get("created_at")?),
                })
            })
            .collect()
    }

    /// The thread `thread_key`'s entries with `after < seq < before`, in order, at most
    /// `limit`, cut once their bodies would pass `max_bytes` (the first is always in).
    pub async fn entries_between_by_key(
        &self,
        thread_key: &ThreadKey,
        after: i64,
        before: i64,
        limit: u32,
        max_bytes: i64,
    ) -> Result<Vec<Entry>, StoreError> {
        let bytes = PageBytes::unroomed(max_bytes);
        self.entries_within_room_by_key(thread_key, after, before, limit, bytes)
            .await
    }

    /// [`Store::entries_between_by_key`] for an answer read within room ([`PageBytes`]): a page
    /// larger than its room is [`StoreError::PageLargerThanRoom`].
    pub async fn entries_within_room_by_key(
        &self,
        thread_key: &ThreadKey,
        after: i64,
        before: i64,
        limit: u32,
        bytes: PageBytes,
    ) -> Result<Vec<Entry>, StoreError> {
        let rows = sqlx::query(&page_within_room("m.seq, m.uuid, m.created_at", false))
            .bind(thread_key.as_str())
            .bind(after)
            .bind(i64::from(limit))
            .bind(bytes.max)
            .bind(before)
            .bind(bytes.room)
            .fetch_all(&self.pool)
            .await?;
        entries_within_room(&rows)
    }

    /// A receiver that sees every change of the thread from now on (a signal to read again).
    /// On PostgreSQL, this process listens to the others' changes while it has followers.
    pub fn follow(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> tokio::sync::watch::Receiver<u64> {
        let receiver = self.changes().follow(tenant, thread_id);
        if self.backend == super::Backend::Postgres && self.changes().start_listening() {
            tokio::spawn(listen_for_changes(self.clone()));
        }
        receiver
    }
}

/// Forwards `NOTIFY loupe_threads` to this process's followers while it has any, reconnecting
/// on errors.
async fn listen_for_changes(store: Store) {
    use std::time::Duration;
    loop {
        let url = store.url();
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(super::THREADS_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listener.await {
            Ok(mut listener) => loop {
                tokio::select! {
                    () = store.primary_switched() => break,
                    heard = tokio::time::timeout(Duration::from_secs(10), listener.recv()) => {
                        match heard {
                            Ok(Ok(notification)) => store.changes().heard(notification.payload()),
                            Ok(Err(error)) => {
                                tracing::warn!(%error, "the thread change listener lost its connection");
                                break;
                            }
                            Err(_) => {}
                        }
                        if store.changes().stop_listening_unless_followed() {
                            return;
                        }
                    }
                }
            },
            Err(error) => tracing::warn!(%error, "cannot listen for thread changes"),
        }
        if store.changes().stop_listening_unless_followed() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
