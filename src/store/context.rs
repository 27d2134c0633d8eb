//! Reads for the context view: the entries after the last compact boundary, found by index so
//! the cost does not grow with the length of the history; and the entries from a seq on, for a
//! read that goes on from a cached checkpoint of the window's prefix.

use std::collections::HashSet;

use futures_util::TryStreamExt;
use sqlx::Row;

use super::rows::{entry_from_row, BOUNDARY_ROWS};
use super::settings::{settings_from_row, ThreadSettings};
use super::{MessageRef, Seq, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::{subtype, Entry};
use crate::history::normalize::view;

/// The stored entries a context is built from.
#[derive(Debug, Clone)]
pub struct ContextWindow {
    /// In seq order, from the window's start to the end of the thread.
    pub entries: Vec<Entry>,
    pub next_seq: i64,
    /// The seq the window starts at: the boundary, its preserved segment's first seq, or
    /// `from_seq`.
    pub start_seq: i64,
    /// The thread's internal key, opaque: a thread deleted and created again under the same id
    /// has another, so what was cached of the old one is not used for the new one.
    pub thread_key: ThreadKey,
}

/// A thread's entries from a seq on: what a context read fetches when it goes on from a cached
/// checkpoint of the window's prefix.
#[derive(Debug, Clone)]
pub struct ContextTail {
    /// In seq order, from the seq asked for to the end of the thread.
    pub entries: Vec<Entry>,
    pub next_seq: i64,
    /// See [`ContextWindow::thread_key`].
    pub thread_key: ThreadKey,
}

/// What a context read learns of its thread first, in one statement: where the thread ends, its
/// identity and its settings (which choose the normalization options, hence the cached
/// checkpoint, before any entry is read).
#[derive(Debug, Clone)]
pub struct ContextHead {
    pub settings: ThreadSettings,
    /// See [`ContextWindow::thread_key`].
    pub thread_key: ThreadKey,
    pub next_seq: i64,
    /// The bytes of the thread's stored bodies: a bound on its window's.
    pub stored_bytes: i64,
    /// The thread's redaction epoch: moved by every snip and erasure.
    pub redaction_epoch: i64,
    /// Whether its window holds a response that reported `usage`: if not, its estimate is
    /// content only, and adds the overhead learned for the model.
    pub context_anchored: bool,
}

/// Most entries one window read returns; a larger window is refused rather than loaded whole.
pub const MAX_WINDOW_ENTRIES: i64 = 100_000;

/// Where a thread's context window lies, without its entries: what a reader that pages through
/// the window reads first.
#[derive(Debug, Clone)]
pub struct WindowBounds {
    /// The last compact boundary, its Claude Code preserved segment resolved to seqs.
    pub boundary: Option<Entry>,
    pub next_seq: i64,
    /// See [`ContextWindow::start_seq`].
    pub start_seq: i64,
    /// See [`ContextWindow::thread_key`].
    pub thread_key: ThreadKey,
}

impl WindowBounds {
    /// The seq of the last compact boundary, if the thread has one.
    pub fn boundary_seq(&self) -> Option<i64> {
        self.boundary.as_ref().and_then(|b| b.seq)
    }

    /// Puts the boundary as read (its segment resolved) in place of its stored copy.
    fn resolve(&self, entries: &mut [Entry]) {
        if let (Some(entry), Some(seq)) = (&self.boundary, self.boundary_seq()) {
            if let Some(slot) = entries.iter_mut().find(|e| e.seq == Some(seq)) {
                *slot = entry.clone();
            }
        }
    }
}

impl Store {
    /// The entries from the last compact boundary on (and the segment it preserved by reference,
    /// which lies before it), or from `from_seq` when given.
    pub async fn context_window(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        from_seq: Option<Seq>,
    ) -> Result<ContextWindow, StoreError> {
        let bounds = self.window_bounds(tenant, thread_id, from_seq).await?;
        self.window_entries(bounds).await
    }

    /// The whole window `bounds` describe, up to the end they saw: its entries and `next_seq`
    /// agree even while appends land.
    pub async fn window_entries(&self, bounds: WindowBounds) -> Result<ContextWindow, StoreError> {
        let entries = self
            .window_page(&bounds, bounds.start_seq, bounds.next_seq)
            .await?;
        Ok(ContextWindow {
            entries,
            next_seq: bounds.next_seq,
            start_seq: bounds.start_seq,
            thread_key: bounds.thread_key,
        })
    }

    /// Where [`Store::context_window`] would start and end, and its boundary, without reading
    /// its entries; [`Store::window_page`] then reads them a page at a time.
    pub async fn window_bounds(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        from_seq: Option<Seq>,
    ) -> Result<WindowBounds, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        self.bounds_below(head.thread_key, head.next_seq, from_seq)
            .await
    }

    /// [`Store::window_bounds`] of the context window, from the head a context read already
    /// holds: the thread is not read again.
    pub async fn context_bounds(&self, head: &ContextHead) -> Result<WindowBounds, StoreError> {
        self.bounds_below(head.thread_key.clone(), head.next_seq, None)
            .await
    }

    /// The window's bounds in the thread `thread_key` as it was when it ended at `next_seq`
    /// (an erasure reads the window a compaction summarized, from that compaction's boundary).
    /// Unlike a context read's, not bounded by [`MAX_WINDOW_ENTRIES`]: the caller reads it a
    /// page at a time.
    pub async fn window_bounds_below(
        &self,
        thread_key: &ThreadKey,
        next_seq: i64,
    ) -> Result<WindowBounds, StoreError> {
        self.bounds_within(thread_key.clone(), next_seq, None, i64::MAX)
            .await
    }

    /// The window's bounds in the thread `thread_key` as it ended at `next_seq`.
    async fn bounds_below(
        &self,
        thread_key: ThreadKey,
        next_seq: i64,
        from_seq: Option<Seq>,
    ) -> Result<WindowBounds, StoreError> {
        self.bounds_within(thread_key, next_seq, from_seq, MAX_WINDOW_ENTRIES)
            .await
    }

    /// [`Store::bounds_below`], refusing a window of more than `max_entries`.
    async fn bounds_within(
        &self,
        thread_key: ThreadKey,
        next_seq: i64,
        from_seq: Option<Seq>,
        max_entries: i64,
    ) -> Result<WindowBounds, StoreError> {
        // Below `next_seq`: a boundary committed after the head was read belongs to a later read
        // (else the window would start past its own end).
        let boundary = sqlx::query(&format!(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 \
             AND {BOUNDARY_ROWS} AND seq < $2 ORDER BY seq DESC LIMIT 1"
        ))
        .bind(thread_key.as_str())
        .bind(next_seq)
        .fetch_optional(&self.pool)
        .await?;
        let mut boundary = boundary.map(|row| entry_from_row(&row)).transpose()?;
        if let Some(entry) = boundary.as_mut() {
            self.resolve_preserved_uuids(&thread_key, entry).await?;
        }
        let start = match from_seq {
            Some(seq) => seq.get().max(0),
            None => match &boundary {
                Some(entry) => {
                    let seq = entry.seq.unwrap_or(0);
                    entry
                        .preserved_segment()
                        .map_or(seq, |(first, _)| first.clamp(0, seq))
                }
                None => 0,
            },
        };
        if next_seq - start > max_entries {
            return Err(StoreError::WindowTooLarge {
                entries: next_seq - start,
                max: max_entries,
            });
        }
        Ok(WindowBounds {
            boundary,
            next_seq,
            start_seq: start,
            thread_key,
        })
    }

    /// The window's entries with a seq in `[from, to)`, in seq order, the boundary as
    /// [`Store::window_bounds`] read it.
    pub async fn window_page(
        &self,
        bounds: &WindowBounds,
        from: i64,
        to: i64,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut entries = self
            .entries_between(&bounds.thread_key, from.max(0) as u64, to.max(0) as u64)
            .await?;
        bounds.resolve(&mut entries);
        Ok(entries)
    }

    /// Every entry of the window `bounds` describe, in seq order, each passed through `reduce` as
    /// it is read: the window is read in pages cut at `bytes.max` bytes of bodies, so what is
    /// held at once is one page and the reduced entries, whatever the window's size. A page
    /// larger than `bytes.room` is [`StoreError::PageLargerThanRoom`]: read again with room.
    pub async fn window_reduced<T>(
        &self,
        bounds: &WindowBounds,
        bytes: super::PageBytes,
        mut reduce: impl FnMut(Entry) -> T,
    ) -> Result<Vec<T>, StoreError> {
        const PAGE_ENTRIES: i64 = 1_000;
        let sql = super::rows::page_within_room("m.seq, m.uuid, m.created_at", false);
        let mut reduced = Vec::new();
        let mut after = bounds.start_seq.max(0) - 1;
        while after + 1 < bounds.next_seq {
            let rows = sqlx::query(&sql)
                .bind(bounds.thread_key.as_str())
                .bind(after)
                .bind(PAGE_ENTRIES.min(bounds.next_seq - after - 1))
                .bind(bytes.max)
                .bind(bounds.next_seq)
                .bind(bytes.room)
                .fetch_all(&self.pool)
                .await?;
            if rows.is_empty() {
                break;
            }
            super::rows::check_room(&rows)?;
            for row in rows {
                let mut entry = entry_from_row(&row)?;
                after = entry.seq.unwrap_or(after + 1);
                bounds.resolve(std::slice::from_mut(&mut entry));
                reduced.push(reduce(entry));
            }
        }
        Ok(reduced)
    }

    /// The uuids the snip entries of the window `bounds` describe remove (see
    /// [`view::hide_snipped`]), read through the subtype index without the rest of the window.
    pub async fn window_snipped_uuids(
        &self,
        bounds: &WindowBounds,
    ) -> Result<HashSet<String>, StoreError> {
        self.snipped_between(&bounds.thread_key, bounds.start_seq, bounds.next_seq)
            .await
    }

    /// The uuids every snip entry of the thread removes, wherever in the thread it is: what the
    /// summary tree and zoom hide.
    pub async fn thread_snipped_uuids(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<HashSet<String>, StoreError> {
        self.snipped_between(thread_key, 0, i64::MAX).await
    }

    /// The uuids removed by the snip entries with seqs in `[from, to)`, through the subtype index.
    async fn snipped_between(
        &self,
        thread_key: &ThreadKey,
        from: i64,
        to: i64,
    ) -> Result<HashSet<String>, StoreError> {
        let mut rows = sqlx::query(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND subtype = $2 \
             AND seq >= $3 AND seq < $4 ORDER BY seq",
        )
        .bind(thread_key.as_str())
        .bind(subtype::SNIP)
        .bind(from)
        .bind(to)
        .fetch(&self.pool);
        let mut snips = Vec::new();
        while let Some(row) = rows.try_next().await? {
            snips.push(entry_from_row(&row)?);
        }
        Ok(view::snipped_uuids(&snips)
            .into_iter()
            .map(str::to_owned)
            .collect())
    }

    /// [`Store::thread_snipped_uuids`] of the tenant's thread.
    pub async fn snipped_uuids_of(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<HashSet<String>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        self.thread_snipped_uuids(&thread_key).await
    }

    /// The thread's [`ContextHead`]: one indexed read.
    pub async fn context_head(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ContextHead, StoreError> {
        // No settings row reads as NULLs, which are the defaults.
        let row = sqlx::query(&format!(
            "SELECT t.thread_key, t.next_seq, t.stored_bytes, t.redaction_epoch, t.context_anchored, \
             s.auto_compact_tokens, \
             s.microcompact, s.outline, s.clearing \
             FROM threads t LEFT JOIN thread_settings s ON s.thread_key = t.thread_key \
             WHERE t.tenant_id = $1 AND t.thread_id = $2{}",
            super::expiry::unexpired("t.", "$3")
        ))
        .bind(&tenant.0)
        .bind(thread_id.as_str())
        .bind(super::now_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok(ContextHead {
            settings: settings_from_row(&row)?,
            thread_key: ThreadKey::from_stored(row.try_get("thread_key")?),
            next_seq: row.try_get("next_seq")?,
            stored_bytes: row.try_get("stored_bytes")?,
            redaction_epoch: row.try_get("redaction_epoch")?,
            context_anchored: row.try_get::<i64, _>("context_anchored")? != 0,
        })
    }

    /// The bytes of the stored bodies in the window `head` leads to, at most: the thread's
    /// `stored_bytes`, without a query, up to `exact_above`; past it, the window's own, summed
    /// without reading the bodies (the lengths are kept beside the values on both backends), so a
    /// long compacted thread is not charged for what its boundary left behind. The sum reads
    /// every row of the window, a cost only the largest threads pay (a 10,000-entry window
    /// summed on every read ran at a quarter of the reads per second).
    pub async fn window_bytes(
        &self,
        head: &ContextHead,
        exact_above: i64,
    ) -> Result<i64, StoreError> {
        if head.stored_bytes <= exact_above {
            return Ok(head.stored_bytes);
        }
        let bounds = self.context_bounds(head).await?;
        let bytes: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(octet_length(body)), 0) FROM messages \
             WHERE thread_key = $1 AND seq >= $2 AND seq < $3",
        )
        .bind(bounds.thread_key.as_str())
        .bind(bounds.start_seq)
        .bind(bounds.next_seq)
        .fetch_one(&self.pool)
        .await?;
        Ok(bytes)
    }

    /// The entries from `from_seq` up to the end `head` saw, for a read that goes on from a
    /// checkpoint of the window starting at `window_start` (whose size is bounded as
    /// [`Store::context_window`] bounds it). One indexed read, whatever the length of the thread;
    /// what was appended after `head` waits for the next read, so the answer and its `next_seq`
    /// agree.
    pub async fn context_tail(
        &self,
        head: &ContextHead,
        from_seq: Seq,
        window_start: Seq,
    ) -> Result<ContextTail, StoreError> {
        if head.next_seq - window_start.get() > MAX_WINDOW_ENTRIES {
            return Err(StoreError::WindowTooLarge {
                entries: head.next_seq - window_start.get(),
                max: MAX_WINDOW_ENTRIES,
            });
        }
        let entries = self
            .entries_between(
                &head.thread_key,
                from_seq.get().max(0) as u64,
                head.next_seq.max(0) as u64,
            )
            .await?;
        Ok(ContextTail {
            entries,
            next_seq: head.next_seq,
            thread_key: head.thread_key.clone(),
        })
    }

    /// The stored entries with seq in `[start, end)`, in order. Each row is parsed as it
    /// arrives, so the raw rows of a large range are never all held beside their entries.
    pub async fn entries_between(
        &self,
        thread_key: &ThreadKey,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut rows = sqlx::query(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND seq >= $2 AND seq < $3 \
             ORDER BY seq",
        )
        .bind(thread_key.as_str())
        .bind(start as i64)
        .bind(end as i64)
        .fetch(&self.pool);
        let mut entries = Vec::new();
        while let Some(row) = rows.try_next().await? {
            entries.push(entry_from_row(&row)?);
        }
        Ok(entries)
    }

    /// A Claude Code boundary names its preserved segment by uuids
    /// (`compactMetadata.preservedSegment {headUuid, tailUuid}`); Loupe's reads work on seqs, so
    /// the segment is added in memory as `preserved_segment {first_seq, last_seq}` when both
    /// uuids are stored in the thread. The stored body is left as it came.
    pub(super) async fn resolve_preserved_uuids(
        &self,
        thread_key: &ThreadKey,
        boundary: &mut Entry,
    ) -> Result<(), StoreError> {
        if boundary.preserved_segment().is_some() {
            return Ok(());
        }
        let Some((head, tail)) = boundary.preserved_uuids() else {
            return Ok(());
        };
        let (head, tail) = (head.to_owned(), tail.to_owned());
        let found = self
            .messages_where_in(thread_key, "uuid", &[head.clone(), tail.clone()])
            .await?;
        let seq_of = |uuid: &str| found.iter().find(|(_, u)| u == uuid).map(|(seq, _)| *seq);
        if let (Some(first), Some(last), Some(metadata)) = (
            seq_of(&head),
            seq_of(&tail),
            boundary
                .compact_metadata
                .as_mut()
                .and_then(|m| m.as_object_mut()),
        ) {
            if first <= last {
                metadata.insert(
                    "preserved_segment".to_owned(),
                    serde_json::json!({"first_seq": first, "last_seq": last}),
                );
            }
        }
        Ok(())
    }

    /// The seqs of the thread's messages with these uuids (those it holds; others are skipped).
    pub async fn seqs_of_uuids(
        &self,
        thread_key: &ThreadKey,
        uuids: &[String],
    ) -> Result<Vec<u64>, StoreError> {
        let found = self.messages_where_in(thread_key, "uuid", uuids).await?;
        Ok(found.into_iter().map(|(seq, _)| seq as u64).collect())
    }

    /// Why a named message was not found: the thread holds no such message, or the thread itself
    /// was deleted since it was read (a delete racing the request is a 404, not the caller's
    /// mistake about a message).
    pub(crate) async fn missing_message(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        reference: MessageRef,
    ) -> StoreError {
        match self.thread_head(tenant, thread_id).await {
            Ok(_) => StoreError::NoSuchMessage(reference),
            Err(error) => error,
        }
    }

    /// The (seq, uuid) of the named messages, in seq order; names the first that the thread does
    /// not hold.
    pub async fn resolve_messages(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        seqs: &[i64],
        uuids: &[String],
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let by_seq = self.messages_where_in(&thread_key, "seq", seqs).await?;
        let found_seqs: HashSet<i64> = by_seq.iter().map(|(seq, _)| *seq).collect();
        if let Some(missing) = seqs.iter().find(|seq| !found_seqs.contains(seq)) {
            return Err(self
                .missing_message(tenant, thread_id, MessageRef::Seq(*missing))
                .await);
        }
        let by_uuid = self.messages_where_in(&thread_key, "uuid", uuids).await?;
        let found_uuids: HashSet<&str> = by_uuid.iter().map(|(_, uuid)| uuid.as_str()).collect();
        if let Some(missing) = uuids
            .iter()
            .find(|uuid| !found_uuids.contains(uuid.as_str()))
        {
            return Err(self
                .missing_message(tenant, thread_id, MessageRef::Uuid(missing.clone()))
                .await);
        }
        let mut found: Vec<(i64, String)> = by_seq.into_iter().chain(by_uuid).collect();
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// (seq, uuid) of the thread's messages whose `column` is one of `values`, in chunks that keep
    /// the bind count under every backend's limit.
    pub(super) async fn messages_where_in<T>(
        &self,
        thread_key: &ThreadKey,
        column: &str,
        values: &[T],
    ) -> Result<Vec<(i64, String)>, StoreError>
    where
        T: Clone + Send + for<'q> sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any> + 'static,
    {
        let mut found = Vec::with_capacity(values.len());
        for chunk in values.chunks(super::rows::INSERT_CHUNK) {
            let sql = format!(
                "SELECT seq, uuid FROM messages WHERE thread_key = $1 AND {column} IN ({})",
                super::list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(thread_key.as_str().to_owned());
            for value in chunk {
                query = query.bind(value.clone());
            }
            for row in query.fetch_all(&self.pool).await? {
                found.push((row.try_get("seq")?, row.try_get("uuid")?));
            }
        }
        Ok(found)
    }
}
