//! Messages: pages of a thread's entries, and entries by uuid.

use super::rows::{entry_from_row, page_within_bytes_towards};
use super::{Seq, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::model::Entry;

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
        self.list_messages_within(tenant, thread_id, after_seq, limit, i64::MAX)
            .await
    }

    /// [`Store::list_messages`], also cut once the stored bodies reach `max_bytes` bytes
    /// of JSON (counted in the database, so what is cut off is never loaded). The first message
    /// is always returned, so a page always moves forward.
    pub async fn list_messages_within(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        after_seq: Option<Seq>,
        limit: u32,
        max_bytes: i64,
    ) -> Result<MessagePage, StoreError> {
        let from = |_next_seq| after_seq.map_or(-1, Seq::get);
        self.page_of(tenant, thread_id, false, from, limit, max_bytes)
            .await
    }

    /// Messages with `seq < before_seq` (from the newest when `None`), newest first, at most
    /// `limit`, cut once the stored bodies reach `max_bytes` as [`Store::list_messages_within`].
    pub async fn list_messages_before_within(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        before_seq: Option<Seq>,
        limit: u32,
        max_bytes: i64,
    ) -> Result<MessagePage, StoreError> {
        let from = |next_seq: i64| before_seq.map_or(next_seq, Seq::get).min(next_seq);
        self.page_of(tenant, thread_id, true, from, limit, max_bytes)
            .await
    }

    /// A byte-bounded page from the seq `from` gives for the thread's next seq, either way.
    async fn page_of(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        descending: bool,
        from: impl FnOnce(i64) -> i64,
        limit: u32,
        max_bytes: i64,
    ) -> Result<MessagePage, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (thread_key, next_seq) = (head.thread_key, head.next_seq);
        let sql = page_within_bytes_towards("m.seq, m.uuid, m.created_at, m.body", descending);
        let rows = sqlx::query(&sql)
            .bind(thread_key.as_str())
            .bind(from(next_seq))
            .bind(i64::from(limit))
            .bind(max_bytes)
            .fetch_all(&self.pool)
            .await?;
        Ok(MessagePage {
            messages: rows.iter().map(entry_from_row).collect::<Result<_, _>>()?,
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
