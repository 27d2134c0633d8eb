//! Reads behind transcript import and export: which uuids a thread already holds, and the stored
//! bodies exactly as they were sent.

use std::collections::HashMap;

use sqlx::Row;

use super::{Seq, Store, StoreError, TenantId, ThreadId};

impl Store {
    /// `uuid → (seq, fingerprint)` for the given uuids that the thread already holds.
    pub async fn stored_fingerprints(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        uuids: &[String],
    ) -> Result<HashMap<String, (i64, String)>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
        let mut conn = self.pool.acquire().await?;
        super::rows::stored_hashes(&mut conn, &thread_key, &uuids).await
    }

    /// `(seq, body)` of the messages with `seq > after_seq`, in seq order, at most `limit`, cut
    /// once the bodies would pass `bytes.max` bytes (a page larger than `bytes.room` is
    /// [`StoreError::PageLargerThanRoom`]: read again with room for it): each body is the
    /// JSON text that was sent (or, for an entry Loupe wrote itself, its JSON). An empty page is
    /// the end of the thread.
    pub async fn export_page(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        after_seq: Seq,
        limit: i64,
        bytes: super::PageBytes,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let thread_key = self.thread_head(tenant, thread_id).await?.thread_key;
        let rows = sqlx::query(&super::rows::page_within_room("m.seq", false))
            .bind(thread_key.as_str())
            .bind(after_seq.get())
            .bind(limit)
            .bind(bytes.max)
            .bind(i64::MAX)
            .bind(bytes.room)
            .fetch_all(&self.pool)
            .await?;
        super::rows::check_room(&rows)?;
        rows.iter()
            .map(|row| Ok((row.try_get("seq")?, row.try_get("body")?)))
            .collect()
    }
}
