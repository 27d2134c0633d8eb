//! Messages: pages of a thread's entries, and entries by uuid.

use super::rows::{entries_within_room, entry_from_row, page_within_room, PageBytes};
use super::{Seq, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::Entry;

/// The seqs a page may hold: those after `after` and before `before` (open where `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SeqWindow {
    pub after: Option<Seq>,
    pub before: Option<Seq>,
}

#[derive(Debug, Clone)]
pub struct MessagePage {
    pub messages: Vec<Entry>,
    /// The thread's next seq at the time of the read.
    pub next_seq: i64,
}

impl Store {
    /// Messages with `seq > after_seq` (all when `None`), in seq order, at most `limit`.
    pub async fn list_messages(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        after_seq: Option<Seq>,
        limit: u32,
    ) -> Result<MessagePage, StoreError> {
        let window = SeqWindow {
            after: after_seq,
            before: None,
        };
        self.list_messages_within(
            tenant,
            thread_id,
            window,
            false,
            limit,
            PageBytes::unroomed(i64::MAX),
        )
        .await
    }

    /// The messages in `window`, oldest first (newest first with `descending`), at most
    /// `limit`, also cut once the stored bodies reach `max_bytes` bytes of JSON (counted in the
    /// database, so what is cut off is never loaded). The first message is always returned, so
    /// a page always moves forward.
    pub async fn list_messages_within(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        window: SeqWindow,
        descending: bool,
        limit: u32,
        bytes: PageBytes,
    ) -> Result<MessagePage, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (thread_key, next_seq) = (head.thread_key, head.next_seq);
        let after = window.after.map_or(-1, Seq::get);
        let before = window.before.map_or(next_seq, Seq::get).min(next_seq);
        let (from, far) = if descending {
            (before, after)
        } else {
            (after, before)
        };
        let sql = page_within_room("m.seq, m.uuid, m.created_at", descending);
        let rows = sqlx::query(&sql)
            .bind(thread_key.as_str())
            .bind(from)
            .bind(i64::from(limit))
            .bind(bytes.max)
            .bind(far)
            .bind(bytes.room)
            .fetch_all(&self.pool)
            .await?;
        Ok(MessagePage {
            messages: entries_within_room(&rows)?,
            next_seq,
        })
    }

    pub(super) async fn messages_by_uuid(
        &self,
        thread_key: &ThreadKey,
        uuids: &[&str],
    ) -> Result<Vec<Entry>, StoreError> {
        let sql = format!(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND uuid IN ({}) ORDER BY seq",
            super::list_placeholders(2, uuids.len())
        );
        let mut query = sqlx::query(&sql).bind(thread_key.as_str().to_owned());
        for uuid in uuids {
            query = query.bind(uuid.to_string());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(entry_from_row).collect()
    }
}
