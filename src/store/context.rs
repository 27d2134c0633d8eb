//! Reads for the context view: the entries after the last compact boundary, found by index so
//! the cost does not grow with the length of the history.

use sqlx::Row;

use super::messages::entry_from_row;
use super::{Store, StoreError, TenantId};
use crate::history::model::{subtype, Entry};

/// The stored entries a context is built from.
#[derive(Debug, Clone)]
pub struct ContextWindow {
    /// In seq order, from the window's start to the end of the thread.
    pub entries: Vec<Entry>,
    /// The seq of the last compact boundary, if the thread has one.
    pub boundary_seq: Option<i64>,
    pub next_seq: i64,
}

/// Most entries one window read returns; a larger window is refused rather than loaded whole.
pub const MAX_WINDOW_ENTRIES: i64 = 100_000;

impl Store {
    /// The entries from the last compact boundary on (and the segment it preserved by reference,
    /// which lies before it), or from `from_seq` when given.
    pub async fn context_window(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        from_seq: Option<i64>,
    ) -> Result<ContextWindow, StoreError> {
        let (thread_key, next_seq) = self.thread_key_and_next_seq(tenant, thread_id).await?;
        let boundary = sqlx::query(
            "SELECT seq, body FROM messages WHERE thread_key = $1 AND subtype = $2 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(&thread_key)
        .bind(subtype::COMPACT_BOUNDARY)
        .fetch_optional(&self.pool)
        .await?;
        let boundary = boundary.map(|row| entry_from_row(&row)).transpose()?;
        let boundary_seq = boundary.as_ref().and_then(|b| b.seq);
        let start = match from_seq {
            Some(seq) => seq.max(0),
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
        if next_seq - start > MAX_WINDOW_ENTRIES {
            return Err(StoreError::WindowTooLarge {
                entries: next_seq - start,
                max: MAX_WINDOW_ENTRIES,
            });
        }
        let rows = sqlx::query(
            "SELECT seq, body FROM messages WHERE thread_key = $1 AND seq >= $2 ORDER BY seq",
        )
        .bind(&thread_key)
        .bind(start)
        .fetch_all(&self.pool)
        .await?;
        Ok(ContextWindow {
            entries: rows.iter().map(entry_from_row).collect::<Result<_, _>>()?,
            boundary_seq,
            next_seq,
        })
    }

    /// The (seq, uuid) of the named messages; names the first that the thread does not hold.
    pub async fn resolve_messages(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        seqs: &[i64],
        uuids: &[String],
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let (thread_key, _) = self.thread_key_and_next_seq(tenant, thread_id).await?;
        let mut found = Vec::with_capacity(seqs.len() + uuids.len());
        for seq in seqs {
            let uuid: Option<String> =
                sqlx::query_scalar("SELECT uuid FROM messages WHERE thread_key = $1 AND seq = $2")
                    .bind(&thread_key)
                    .bind(*seq)
                    .fetch_optional(&self.pool)
                    .await?;
            let uuid = uuid.ok_or_else(|| StoreError::NoSuchMessage(format!("seq {seq}")))?;
            found.push((*seq, uuid));
        }
        for uuid in uuids {
            let seq: Option<i64> =
                sqlx::query_scalar("SELECT seq FROM messages WHERE thread_key = $1 AND uuid = $2")
                    .bind(&thread_key)
                    .bind(uuid)
                    .fetch_optional(&self.pool)
                    .await?;
            let seq = seq.ok_or_else(|| StoreError::NoSuchMessage(format!("uuid {uuid}")))?;
            found.push((seq, uuid.clone()));
        }
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    pub(crate) async fn thread_key_and_next_seq(
        &self,
        tenant: &TenantId,
        thread_id: &str,
    ) -> Result<(String, i64), StoreError> {
        let row = sqlx::query(
            "SELECT thread_key, next_seq FROM threads WHERE tenant_id = $1 AND thread_id = $2",
        )
        .bind(&tenant.0)
        .bind(thread_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::ThreadNotFound)?;
        Ok((row.try_get("thread_key")?, row.try_get("next_seq")?))
    }
}
