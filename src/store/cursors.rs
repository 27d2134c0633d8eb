//! Cursors: named bookmarks of a thread's consumers, moved forward only, with optional leases for
//! competing workers of one consumer.
//!
//! Every function takes `now_ms` (Unix milliseconds) instead of reading the clock, so lease expiry
//! is tested by passing a later time rather than by sleeping.

use sqlx::any::AnyRow;
use sqlx::{Any, Row};

use super::rows::PageBytes;
use super::{MessageRef, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::Entry;

/// Where a consumer stands: its bookmark and what is new after it.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorState {
    pub name: String,
    /// `None` until the first successful advance: everything is new.
    pub bookmark: Option<Bookmark>,
    /// Model-visible entries (user and assistant) after the bookmark.
    pub new_count: i64,
    /// Entries of any kind after the bookmark (what a reader must pass to catch up).
    pub pending_entries: i64,
    /// The expiry of the live lease, if one is held.
    pub lease_expires_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookmark {
    pub seq: i64,
    pub uuid: String,
    /// When the bookmark last moved (Unix milliseconds).
    pub advanced_at: i64,
}

/// The entries after a bookmark, oldest first.
#[derive(Debug, Clone)]
pub struct PendingBatch {
    pub cursor: CursorState,
    /// At most `limit` entries of every kind, so a consumer can advance past all of them.
    pub entries: Vec<Entry>,
    /// More entries follow the batch.
    pub has_more: bool,
}

impl PendingBatch {
    /// The uuid to advance to once the batch is processed: its last entry's.
    pub fn advance_to(&self) -> Option<&str> {
        self.entries.last().and_then(|e| e.uuid.as_deref())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub token: String,
    pub expires_at: i64,
}

#[derive(Debug, Clone)]
pub struct Claim {
    pub batch: PendingBatch,
    /// `None` when nothing is pending: there is nothing to hold.
    pub lease: Option<Lease>,
}

/// A request to move a bookmark.
#[derive(Debug, Clone, Default)]
pub struct AdvanceRequest {
    /// The uuid of the last entry processed.
    pub to: String,
    /// Compare-and-set: `Some(None)` expects no bookmark yet, `Some(Some(uuid))` that bookmark.
    pub expected: Option<Option<String>>,
    /// The lease token of a claim.
    pub lease: Option<String>,
}

#[derive(Debug, Clone)]
pub struct AdvanceOutcome {
    pub cursor: CursorState,
    /// False when the bookmark already was at `to` (an idempotent repeat).
    pub moved: bool,
}

/// The cursor columns as read together with the thread's counts.
struct CursorRow {
    bookmark: Option<Bookmark>,
    bookmark_rank: i64,
    lease_token: Option<String>,
    lease_expires_at: Option<i64>,
}

impl CursorRow {
    fn from_row(row: &AnyRow) -> Result<Self, StoreError> {
        let seq: Option<i64> = row.try_get("bookmark_seq")?;
        let uuid: Option<String> = row.try_get("bookmark_uuid")?;
        let bookmark = match (seq, uuid) {
            (Some(seq), Some(uuid)) => Some(Bookmark {
                seq,
                uuid,
                advanced_at: row.try_get::<Option<i64>, _>("advanced_at")?.unwrap_or(0),
            }),
            _ => None,
        };
        Ok(CursorRow {
            bookmark,
            bookmark_rank: row.try_get("bookmark_rank")?,
            lease_token: row.try_get("lease_token")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
        })
    }

    fn none_yet() -> Self {
        CursorRow {
            bookmark: None,
            bookmark_rank: 0,
            lease_token: None,
            lease_expires_at: None,
        }
    }

    fn live_lease(&self, now_ms: i64) -> Option<i64> {
        self.lease_expires_at.filter(|expires| *expires > now_ms)
    }

    fn state(&self, name: &str, counts: ThreadCounts, now_ms: i64) -> CursorState {
        let after_seq = self.bookmark.as_ref().map_or(-1, |b| b.seq);
        CursorState {
            name: name.to_owned(),
            bookmark: self.bookmark.clone(),
            new_count: counts.visible_count - self.bookmark_rank,
            pending_entries: counts.next_seq - 1 - after_seq,
            lease_expires_at: self.live_lease(now_ms),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct ThreadCounts {
    next_seq: i64,
    visible_count: i64,
}

const CURSOR_COLUMNS: &str =
    "bookmark_seq, bookmark_uuid, bookmark_rank, advanced_at, lease_token, lease_expires_at";

/// The checks of an advance, on the locked row. Pure, so every rule is unit-tested.
fn check_advance(
    current: &CursorRow,
    request: &AdvanceRequest,
    target_seq: i64,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let current_position = current.bookmark.as_ref().map(|b| (b.seq, b.uuid.clone()));
    if let Some(expires_at) = current.live_lease(now_ms) {
        if request.lease.is_none() || request.lease != current.lease_token {
            return Err(StoreError::CursorLeased { expires_at });
        }
    } else if request.lease.is_some() && request.lease != current.lease_token {
        // The lease expired and another worker claimed the cursor since: its batch may already be
        // processed again, so this worker's acknowledgement must not count.
        return Err(StoreError::CursorConflict {
            current: current_position,
            reason: "the lease was lost: another worker claimed the cursor since",
        });
    }
    if let Some(expected) = &request.expected {
        let current_uuid = current.bookmark.as_ref().map(|b| &b.uuid);
        if expected.as_ref() != current_uuid {
            return Err(StoreError::CursorConflict {
                current: current_position,
                reason: "the bookmark is not where `expected` says: another consumer moved it",
            });
        }
    }
    match &current.bookmark {
        Some(bookmark) if target_seq < bookmark.seq => Err(StoreError::CursorBackward {
            current_seq: bookmark.seq,
            target_seq,
        }),
        Some(bookmark) if target_seq == bookmark.seq => Ok(false),
        _ => Ok(true),
    }
}

impl Store {
    /// The thread's key and counts.
    async fn cursor_thread(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<(ThreadKey, ThreadCounts), StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let counts = ThreadCounts {
            next_seq: head.next_seq,
            visible_count: head.visible_count,
        };
        Ok((head.thread_key, counts))
    }

    async fn cursor_row(
        &self,
        thread_key: &ThreadKey,
        name: &str,
    ) -> Result<CursorRow, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CURSOR_COLUMNS} FROM cursors WHERE thread_key = $1 AND name = $2"
        ))
        .bind(thread_key.as_str())
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref()
            .map_or(Ok(CursorRow::none_yet()), CursorRow::from_row)
    }

    /// The cursor's bookmark and `new_count`: two primary-key reads, whatever the thread's length.
    pub async fn cursor(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        name: &str,
        now_ms: i64,
    ) -> Result<CursorState, StoreError> {
        let (thread_key, counts) = self.cursor_thread(tenant, thread_id).await?;
        let row = self.cursor_row(&thread_key, name).await?;
        Ok(row.state(name, counts, now_ms))
    }

    /// The thread's cursors, by name.
    pub async fn list_cursors(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        now_ms: i64,
    ) -> Result<Vec<CursorState>, StoreError> {
        let (thread_key, counts) = self.cursor_thread(tenant, thread_id).await?;
        let rows = sqlx::query(&format!(
            "SELECT name, {CURSOR_COLUMNS} FROM cursors WHERE thread_key = $1 ORDER BY name"
        ))
        .bind(thread_key.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                Ok(CursorRow::from_row(row)?.state(&name, counts, now_ms))
            })
            .collect()
    }

    /// The entries after the bookmark (within `limit`), without taking a lease.
    pub async fn cursor_pending(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        name: &str,
        limit: impl Into<BatchLimit>,
        now_ms: i64,
    ) -> Result<PendingBatch, StoreError> {
        let limit = limit.into();
        let (thread_key, counts) = self.cursor_thread(tenant, thread_id).await?;
        let row = self.cursor_row(&thread_key, name).await?;
        let next_seq = counts.next_seq;
        let state = row.state(name, counts, now_ms);
        let entries = read_after(&self.pool, &thread_key, &row, limit).await?;
        Ok(batch(state, entries, limit, next_seq))
    }

    /// Takes a lease on the pending batch for `lease_ms`. While it lives, other claims fail with
    /// [`StoreError::CursorLeased`] and only its holder can advance. Nothing pending: no lease.
    pub async fn claim_cursor(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        name: &str,
        limit: impl Into<BatchLimit>,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Claim, StoreError> {
        let limit = limit.into();
        let (thread_key, _) = self.cursor_thread(tenant, thread_id).await?;
        let mut tx = self.writer.begin().await?;
        let row = lock_cursor(&mut tx, &thread_key, name, now_ms).await?;
        if let Some(expires_at) = row.live_lease(now_ms) {
            return Err(StoreError::CursorLeased { expires_at });
        }
        let counts = locked_counts(&mut tx, self.backend, &thread_key).await?;
        let entries = read_after(&mut *tx, &thread_key, &row, limit).await?;
        let lease = if entries.is_empty() {
            None
        } else {
            let lease = Lease {
                token: uuid::Uuid::new_v4().simple().to_string(),
                expires_at: now_ms.saturating_add(lease_ms),
            };
            sqlx::query(
                "UPDATE cursors SET lease_token = $1, lease_expires_at = $2 \
                 WHERE thread_key = $3 AND name = $4",
            )
            .bind(&lease.token)
            .bind(lease.expires_at)
            .bind(thread_key.as_str())
            .bind(name)
            .execute(&mut *tx)
            .await?;
            Some(lease)
        };
        tx.commit().await?;
        let next_seq = counts.next_seq;
        let mut state = row.state(name, counts, now_ms);
        state.lease_expires_at = lease.as_ref().map(|l| l.expires_at);
        Ok(Claim {
            batch: batch(state, entries, limit, next_seq),
            lease,
        })
    }

    /// Moves the bookmark forward to `request.to` and releases any lease.
    ///
    /// Fails, changing nothing, with [`StoreError::NoSuchMessage`] when the thread does not hold
    /// `to`, [`StoreError::CursorLeased`] when another worker holds the lease,
    /// [`StoreError::CursorConflict`] when `expected` does not match (or the caller's lease was
    /// taken over), and [`StoreError::CursorBackward`] when `to` lies before the bookmark.
    pub async fn advance_cursor(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        name: &str,
        request: AdvanceRequest,
        now_ms: i64,
    ) -> Result<AdvanceOutcome, StoreError> {
        let (thread_key, _) = self.cursor_thread(tenant, thread_id).await?;
        // Messages never change, so the target is resolved before the transaction.
        let target = sqlx::query(
            "SELECT seq, visible_rank FROM messages WHERE thread_key = $1 AND uuid = $2",
        )
        .bind(thread_key.as_str())
        .bind(&request.to)
        .fetch_optional(&self.pool)
        .await?;
        let Some(target) = target else {
            let to = MessageRef::Uuid(request.to.clone());
            return Err(self.missing_message(tenant, thread_id, to).await);
        };
        let target_seq: i64 = target.try_get("seq")?;
        let target_rank: i64 = target.try_get("visible_rank")?;

        let mut tx = self.writer.begin().await?;
        let mut row = lock_cursor(&mut tx, &thread_key, name, now_ms).await?;
        let moved = check_advance(&row, &request, target_seq, now_ms)?;
        if moved {
            row.bookmark = Some(Bookmark {
                seq: target_seq,
                uuid: request.to.clone(),
                advanced_at: now_ms,
            });
            row.bookmark_rank = target_rank;
        }
        // Releasing keeps the token, so the holder's retry is told apart from a stranger.
        row.lease_expires_at = None;
        let bookmark = row.bookmark.as_ref();
        sqlx::query(
            "UPDATE cursors SET bookmark_seq = $1, bookmark_uuid = $2, bookmark_rank = $3, \
             advanced_at = $4, lease_expires_at = NULL WHERE thread_key = $5 AND name = $6",
        )
        .bind(bookmark.map(|b| b.seq))
        .bind(bookmark.map(|b| b.uuid.clone()))
        .bind(row.bookmark_rank)
        .bind(bookmark.map(|b| b.advanced_at))
        .bind(thread_key.as_str())
        .bind(name)
        .execute(&mut *tx)
        .await?;
        let counts = locked_counts(&mut tx, self.backend, &thread_key).await?;
        tx.commit().await?;
        Ok(AdvanceOutcome {
            cursor: row.state(name, counts, now_ms),
            moved,
        })
    }
}

fn counts_from_row(row: &AnyRow) -> Result<ThreadCounts, StoreError> {
    Ok(ThreadCounts {
        next_seq: row.try_get("next_seq")?,
        visible_count: row.try_get("visible_count")?,
    })
}

/// Creates the cursor's row if missing and locks it for the transaction, returning its state.
///
/// An upsert is the first statement on purpose: it takes the row lock on PostgreSQL and the write
/// lock on SQLite at once, so competing workers queue here (a read first would let two of them
/// act on the same state, and on SQLite fail to upgrade to a write).
async fn lock_cursor(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &ThreadKey,
    name: &str,
    now_ms: i64,
) -> Result<CursorRow, StoreError> {
    let row = sqlx::query(&format!(
        "INSERT INTO cursors (thread_key, name, bookmark_rank, created_at) VALUES ($1, $2, 0, $3) \
         ON CONFLICT (thread_key, name) DO UPDATE SET name = excluded.name \
         RETURNING {CURSOR_COLUMNS}"
    ))
    .bind(thread_key.as_str())
    .bind(name)
    .bind(now_ms)
    .fetch_one(&mut **tx)
    .await?;
    CursorRow::from_row(&row)
}

/// The thread's counts, its row share-locked on PostgreSQL ([`Store::thread_key_in`]): a
/// cursor row written under a thread being deleted is either refused here or removed by the
/// delete.
async fn locked_counts(
    tx: &mut sqlx::Transaction<'_, Any>,
    backend: super::Backend,
    thread_key: &ThreadKey,
) -> Result<ThreadCounts, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT next_seq, visible_count FROM threads WHERE thread_key = $1{}",
        super::threads::share_lock(backend)
    ))
    .bind(thread_key.as_str())
    .fetch_optional(&mut **tx)
    .await?
    .ok_or(StoreError::ThreadNotFound)?;
    counts_from_row(&row)
}

/// How much one batch may hold: at most `entries` entries, cut once their bodies reach
/// `bytes.max` bytes (a batch always holds its first entry, so a consumer always moves forward),
/// read within `bytes.room`.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimit {
    pub entries: u32,
    pub bytes: PageBytes,
}

impl From<u32> for BatchLimit {
    /// A count alone: no bound on bytes.
    fn from(entries: u32) -> Self {
        BatchLimit {
            entries,
            bytes: PageBytes::unroomed(i64::MAX),
        }
    }
}

/// The entries after the bookmark within `limit`, plus one to learn whether more follow.
async fn read_after<'e, E>(
    executor: E,
    thread_key: &ThreadKey,
    row: &CursorRow,
    limit: BatchLimit,
) -> Result<Vec<Entry>, StoreError>
where
    E: sqlx::Executor<'e, Database = Any>,
{
    let after_seq = row.bookmark.as_ref().map_or(-1, |b| b.seq);
    let rows = sqlx::query(&super::rows::page_within_room(
        "m.seq, m.uuid, m.created_at",
        false,
    ))
    .bind(thread_key.as_str())
    .bind(after_seq)
    .bind(i64::from(limit.entries) + 1)
    .bind(limit.bytes.max)
    .bind(i64::MAX)
    .bind(limit.bytes.room)
    .fetch_all(executor)
    .await?;
    super::rows::entries_within_room(&rows)
}

/// The batch of `entries` (read with one entry past `limit`), and whether more follow: the entry
/// past the count, or entries a cut by bytes left out (seqs are dense up to `next_seq`).
fn batch(
    cursor: CursorState,
    mut entries: Vec<Entry>,
    limit: BatchLimit,
    next_seq: i64,
) -> PendingBatch {
    let mut has_more = entries.len() > limit.entries as usize;
    entries.truncate(limit.entries as usize);
    if let Some(last) = entries.last().and_then(|e| e.seq) {
        has_more |= last + 1 < next_seq;
    }
    PendingBatch {
        cursor,
        entries,
        has_more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: i64, uuid: &str) -> CursorRow {
        CursorRow {
            bookmark: Some(Bookmark {
                seq,
                uuid: uuid.to_owned(),
                advanced_at: 0,
            }),
            bookmark_rank: 0,
            lease_token: None,
            lease_expires_at: None,
        }
    }

    fn to(uuid: &str) -> AdvanceRequest {
        AdvanceRequest {
            to: uuid.to_owned(),
            ..AdvanceRequest::default()
        }
    }

    #[test]
    fn a_bookmark_moves_forward_only_and_a_repeat_is_idempotent() {
        assert!(check_advance(&CursorRow::none_yet(), &to("a"), 0, 0).unwrap());
        assert!(check_advance(&at(3, "c"), &to("e"), 5, 0).unwrap());
        assert!(!check_advance(&at(3, "c"), &to("c"), 3, 0).unwrap());
        assert!(matches!(
            check_advance(&at(3, "c"), &to("a"), 0, 0),
            Err(StoreError::CursorBackward {
                current_seq: 3,
                target_seq: 0
            })
        ));
    }

    #[test]
    fn expected_is_compared_with_the_bookmark() {
        let mut request = to("e");
        request.expected = Some(Some("c".to_owned()));
        assert!(check_advance(&at(3, "c"), &request, 5, 0).unwrap());
        request.expected = Some(None);
        assert!(matches!(
            check_advance(&at(3, "c"), &request, 5, 0),
            Err(StoreError::CursorConflict {
                current: Some((3, _)),
                ..
            })
        ));
        assert!(check_advance(&CursorRow::none_yet(), &request, 5, 0).unwrap());
        request.expected = Some(Some("b".to_owned()));
        assert!(matches!(
            check_advance(&CursorRow::none_yet(), &request, 5, 0),
            Err(StoreError::CursorConflict { current: None, .. })
        ));
    }

    #[test]
    fn a_live_lease_admits_only_its_holder_and_a_lost_lease_is_refused() {
        let mut row = at(3, "c");
        row.lease_token = Some("t1".to_owned());
        row.lease_expires_at = Some(1_000);
        let mut request = to("e");
        assert!(matches!(
            check_advance(&row, &request, 5, 999),
            Err(StoreError::CursorLeased { expires_at: 1_000 })
        ));
        request.lease = Some("t2".to_owned());
        assert!(matches!(
            check_advance(&row, &request, 5, 999),
            Err(StoreError::CursorLeased { .. })
        ));
        request.lease = Some("t1".to_owned());
        assert!(check_advance(&row, &request, 5, 999).unwrap());
        // Expired but not claimed again: the late holder may still acknowledge.
        assert!(check_advance(&row, &request, 5, 1_000).unwrap());
        // Expired, and another worker took a lease since: the old token is refused.
        row.lease_token = Some("t2".to_owned());
        row.lease_expires_at = None;
        request.lease = Some("t1".to_owned());
        assert!(matches!(
            check_advance(&row, &request, 5, 2_000),
            Err(StoreError::CursorConflict { .. })
        ));
        // Without a live lease, a plain consumer needs no token.
        assert!(check_advance(&row, &to("e"), 5, 2_000).unwrap());
    }
}
