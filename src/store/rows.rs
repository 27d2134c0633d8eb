//! Message rows, the leaf every reader and writer of `messages` shares: an entry read back from
//! its row, entries made ready to write (uuid, fingerprint, body) and inserted many to a
//! statement, the page cut at a byte budget, and the lookup of the uuids a thread holds.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Row};

use super::{StoreError, ThreadKey};
use crate::history::model::Entry;

/// The rows of compact boundaries, as [`Entry::is_compact_boundary`] tells them: the subtype on
/// a system entry (any other entry may carry the subtype too). Every query for "the last
/// boundary" filters with it, so the reads and the compaction's check agree.
pub(super) const BOUNDARY_ROWS: &str = "subtype = 'compact_boundary' AND kind = 'system'";

pub(super) type AnyQuery<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// Rows per INSERT statement; keeps the bind count under every backend's limit.
pub(super) const INSERT_CHUNK: usize = 200;

/// An entry ready to be written.
pub(super) struct Prepared {
    pub(super) entry: Entry,
    pub(super) uuid: String,
    /// The client named the uuid (a generated one cannot be stored already).
    pub(super) uuid_sent: bool,
    pub(super) content_hash: String,
    pub(super) body: String,
}

/// Fills the uuid, fingerprints what the client sent, then fills `created_at`.
/// The fingerprint is taken before the server's defaults so a retry of the same request matches.
pub(super) fn prepare(
    mut entry: Entry,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Prepared, StoreError> {
    entry.seq = None;
    let uuid_sent = entry.uuid.is_some();
    let uuid = entry
        .uuid
        .get_or_insert_with(|| uuid::Uuid::new_v4().to_string())
        .clone();
    let content_hash = fingerprint(&entry)?;
    // The body is what the client sent, verbatim, so an export gives it back exactly; the
    // server's defaults (uuid, `created_at`) live in their columns and are filled in on read.
    entry.created_at.get_or_insert(now);
    let body = match entry.sent.take() {
        Some(sent) => sent,
        None => serde_json::to_string(&entry).map_err(|e| StoreError::Corrupt(e.to_string()))?,
    };
    Ok(Prepared {
        entry,
        uuid,
        uuid_sent,
        content_hash,
        body,
    })
}

/// The fingerprint of what a client sent: SHA-256 of the entry as Loupe understood it (without
/// `seq`), so a retry matches whatever spelling or key order it uses.
pub fn fingerprint(entry: &Entry) -> Result<String, StoreError> {
    let understood = serde_json::to_vec(entry).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(hex::encode(Sha256::digest(&understood)))
}

/// An entry from its row (`seq, uuid, created_at, body`): the body as sent, with the server's `seq`, and its
/// `uuid` and `created_at` when the body does not carry them.
pub(super) fn entry_from_row(row: &AnyRow) -> Result<Entry, StoreError> {
    let body: String = row.try_get("body")?;
    let mut entry: Entry = serde_json::from_str(&body)
        .map_err(|e| StoreError::Corrupt(format!("message body: {e}")))?;
    entry.seq = Some(row.try_get("seq")?);
    if entry.uuid.is_none() {
        entry.uuid = Some(row.try_get("uuid")?);
    }
    if entry.created_at.is_none() {
        let millis: i64 = row.try_get("created_at")?;
        entry.created_at = chrono::DateTime::from_timestamp_millis(millis);
    }
    Ok(entry)
}

/// The rows with `seq > $2` of the thread `$1`, in seq order, at most `$3` of them, cut once
/// their bodies would pass `$4` bytes: the sizes of the page's rows are summed first (the LIMIT
/// applies before the running sum), then only the bodies that fit are read, so what is cut off
/// is never loaded. The first row is always in, so a page always moves forward, and only it
/// may be larger than `$4`. `columns` are of the messages row `m`, without `body`, which comes
/// after them. The sizes are `octet_length`s, which both engines read without loading the value
/// (SQLite from the record header, PostgreSQL from the TOAST pointer); `LENGTH` counts characters
/// and so loads every body it sizes.
pub(super) fn page_within_bytes(columns: &str) -> String {
    page_of_window(columns, false, "", Lone::Read)
}

/// What a page read for an answer may hold: its bodies are cut at `max` bytes (its first entry
/// always in), and a page whose bodies pass `room` bytes comes without them, with its size
/// ([`StoreError::PageLargerThanRoom`]), so the reader takes room for that much before it loads
/// it. Most pages are far smaller than `max`: a reader takes little room first, and room for a
/// large page only once it knows the page is one.
#[derive(Clone, Copy, Debug)]
pub struct PageBytes {
    pub max: i64,
    pub room: i64,
}

impl PageBytes {
    /// Pages cut at `max` bytes, read whatever their size (a reader that keeps no budget).
    pub fn unroomed(max: i64) -> PageBytes {
        PageBytes {
            max,
            room: i64::MAX,
        }
    }
}

/// [`page_within_bytes`] over the window `$2 < seq < $5` (oldest first), or with `descending`
/// over `$5 < seq < $2`, newest first, for an answer read within room ([`PageBytes`]): `$4` is
/// the page's `max`, `$6` the room. When the page's bodies pass the room, its rows come without
/// them (`body` NULL) and with `page_size`, the bytes the page holds.
pub(super) fn page_within_room(columns: &str, descending: bool) -> String {
    page_of_window(columns, descending, far_end(descending), Lone::Sized)
}

fn far_end(descending: bool) -> &'static str {
    if descending {
        " AND seq > $5"
    } else {
        " AND seq < $5"
    }
}

/// What a page does with a first row larger than its bytes.
#[derive(Clone, Copy)]
enum Lone {
    /// Reads it whole.
    Read,
    /// Leaves the page's bodies out when they pass the room (`$6`), and tells their size.
    Sized,
}

fn page_of_window(columns: &str, descending: bool, far: &str, lone: Lone) -> String {
    let (past, order) = if descending {
        ("<", "seq DESC")
    } else {
        (">", "seq")
    };
    let sizes = format!(
        "SELECT seq, size, SUM(size) OVER (ORDER BY {order}) AS through_size FROM \
         (SELECT seq, octet_length(body) AS size FROM messages \
          WHERE thread_key = $1 AND seq {past} $2{far} ORDER BY {order} LIMIT $3) sizes"
    );
    let cut = "through_size <= $4 OR through_size = size";
    // The page's own size is summed over the sizes alone: a window function beside the bodies
    // would have SQLite copy every body into its window's table before the CASE could leave
    // one out.
    let (page, body) = match lone {
        Lone::Read => (
            format!("SELECT seq FROM ({sizes}) cut WHERE {cut}"),
            "m.body",
        ),
        Lone::Sized => (
            format!("SELECT seq, SUM(size) OVER () AS page_size FROM ({sizes}) cut WHERE {cut}"),
            "CASE WHEN page.page_size > $6 THEN NULL ELSE m.body END AS body, page.page_size",
        ),
    };
    format!(
        "SELECT {columns}, {body} FROM ({page}) page \
         JOIN messages m ON m.thread_key = $1 AND m.seq = page.seq ORDER BY m.{order}"
    )
}

/// The entries of a page read by [`page_within_room`]: [`StoreError::PageLargerThanRoom`]
/// when the page is larger than the room it was read in (it came without its bodies).
pub(super) fn entries_within_room(rows: &[AnyRow]) -> Result<Vec<Entry>, StoreError> {
    check_room(rows)?;
    rows.iter().map(entry_from_row).collect()
}

/// [`StoreError::PageLargerThanRoom`] when the page's rows came without their bodies.
pub(super) fn check_room(rows: &[AnyRow]) -> Result<(), StoreError> {
    use sqlx::ValueRef as _;
    match rows.first() {
        Some(first) if first.try_get_raw("body")?.is_null() => {
            Err(StoreError::PageLargerThanRoom {
                bytes: first.try_get("page_size")?,
            })
        }
        _ => Ok(()),
    }
}

/// Makes entries ready to write (uuid, fingerprint, `created_at`) and inserts them from
/// `next_seq` on. Returns the stored entries and the new visible count.
pub(super) async fn insert_entries(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &ThreadKey,
    next_seq: i64,
    visible_count: i64,
    entries: Vec<Entry>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Vec<Entry>, i64), StoreError> {
    let prepared = entries
        .into_iter()
        .map(|entry| prepare(entry, now))
        .collect::<Result<Vec<_>, _>>()?;
    insert_prepared(tx, thread_key, next_seq, visible_count, prepared, now).await
}

pub(super) async fn insert_prepared(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &ThreadKey,
    next_seq: i64,
    visible_count: i64,
    prepared: Vec<Prepared>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(Vec<Entry>, i64), StoreError> {
    let mut visible = visible_count;
    let rows: Vec<NewRow> = prepared
        .iter()
        .zip(next_seq..)
        .map(|(p, seq)| {
            if p.entry.kind.is_model_visible() {
                visible += 1;
            }
            NewRow {
                thread_key: thread_key.clone(),
                seq,
                prepared: p,
                visible_rank: visible,
                created_at: now.timestamp_millis(),
            }
        })
        .collect();
    insert_rows(tx, &rows).await?;
    drop(rows);
    Ok((numbered(prepared, next_seq), visible))
}

/// The entries of a written batch, numbered from the seq of its first.
pub(super) fn numbered(prepared: Vec<Prepared>, first_seq: i64) -> Vec<Entry> {
    prepared
        .into_iter()
        .zip(first_seq..)
        .map(|(p, seq)| Entry {
            seq: Some(seq),
            ..p.entry
        })
        .collect()
}

/// A message row about to be inserted.
pub(super) struct NewRow<'p> {
    pub(super) thread_key: ThreadKey,
    pub(super) seq: i64,
    pub(super) prepared: &'p Prepared,
    /// The thread's visible count once this entry is in: its rank among what a model sees.
    pub(super) visible_rank: i64,
    pub(super) created_at: i64,
}

/// Inserts rows of any threads, [`INSERT_CHUNK`] to a statement.
pub(super) async fn insert_rows(
    conn: &mut AnyConnection,
    rows: &[NewRow<'_>],
) -> Result<(), StoreError> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let sql = insert_rows_sql(chunk.len());
        bind_rows(sqlx::query(&sql), chunk)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Values a message row binds.
pub(super) const INSERT_WIDTH: usize = 9;

pub(super) fn insert_rows_sql(count: usize) -> String {
    format!(
        "INSERT INTO messages (thread_key, seq, uuid, kind, subtype, visible_rank, body, content_hash, created_at) VALUES {}",
        super::values_placeholders(count, INSERT_WIDTH)
    )
}

pub(super) fn bind_rows<'q>(mut query: AnyQuery<'q>, rows: &[NewRow<'_>]) -> AnyQuery<'q> {
    for row in rows {
        let p = row.prepared;
        query = query
            .bind(row.thread_key.as_str().to_owned())
            .bind(row.seq)
            .bind(p.uuid.clone())
            .bind(p.entry.type_name().to_owned())
            .bind(p.entry.subtype.clone())
            .bind(row.visible_rank)
            .bind(p.body.clone())
            .bind(p.content_hash.clone())
            .bind(row.created_at);
    }
    query
}

/// `uuid → (seq, content hash)` of the given uuids that the thread already holds (the import's
/// skip of what is stored).
pub(super) async fn stored_hashes(
    conn: &mut sqlx::AnyConnection,
    thread_key: &ThreadKey,
    uuids: &[&str],
) -> Result<HashMap<String, (i64, String)>, StoreError> {
    let named: Vec<(&str, &str)> = uuids
        .iter()
        .map(|uuid| (thread_key.as_str(), *uuid))
        .collect();
    Ok(stored_hashes_of(conn, &named)
        .await?
        .into_iter()
        .map(|((_, uuid), stored)| (uuid, stored))
        .collect())
}

/// `(thread_key, uuid) → (seq, content hash)` of the named pairs that are stored: the append's
/// replay check for a whole group, in one statement per [`INSERT_CHUNK`] uuids. Consecutive
/// pairs of one thread share a term, so each term is an index lookup.
pub(super) async fn stored_hashes_of(
    conn: &mut sqlx::AnyConnection,
    named: &[(&str, &str)],
) -> Result<HashMap<(String, String), (i64, String)>, StoreError> {
    let mut stored = HashMap::new();
    for chunk in named.chunks(INSERT_CHUNK) {
        let mut terms = Vec::new();
        let mut binds: Vec<&str> = Vec::with_capacity(chunk.len() * 2);
        for run in chunk.chunk_by(|a, b| a.0 == b.0) {
            binds.push(run[0].0);
            let key = binds.len();
            let first = binds.len() + 1;
            binds.extend(run.iter().map(|(_, uuid)| *uuid));
            terms.push(format!(
                "(thread_key = ${key} AND uuid IN ({}))",
                super::list_placeholders(first, run.len())
            ));
        }
        let sql = format!(
            "SELECT thread_key, uuid, seq, content_hash FROM messages WHERE {}",
            terms.join(" OR ")
        );
        let mut query = sqlx::query(&sql);
        for value in binds {
            query = query.bind(value.to_owned());
        }
        for row in query.fetch_all(&mut *conn).await? {
            stored.insert(
                (row.try_get("thread_key")?, row.try_get("uuid")?),
                (row.try_get("seq")?, row.try_get("content_hash")?),
            );
        }
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: serde_json::Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_fingerprint_ignores_server_defaults_but_not_content() {
        let now = chrono::Utc::now();
        let sent =
            json!({"uuid": "u1", "type": "user", "message": {"role": "user", "content": "hi"}});
        let a = prepare(entry(sent.clone()), now).unwrap();
        let b = prepare(entry(sent), now + chrono::Duration::seconds(5)).unwrap();
        assert_eq!(a.content_hash, b.content_hash);
        assert!(a.entry.created_at.is_some());
        let other = prepare(
            entry(json!({"uuid": "u1", "type": "user", "message": {"role": "user", "content": "hello"}})),
            now,
        )
        .unwrap();
        assert_ne!(a.content_hash, other.content_hash);
    }

    #[test]
    fn a_missing_uuid_is_generated() {
        let p = prepare(
            entry(json!({"type": "user", "message": {"role": "user", "content": "hi"}})),
            chrono::Utc::now(),
        )
        .unwrap();
        assert_eq!(p.entry.uuid.as_deref(), Some(p.uuid.as_str()));
        assert!(uuid::Uuid::parse_str(&p.uuid).is_ok());
    }

    #[test]
    fn boundary_rows_name_the_boundary_subtype_on_a_system_entry() {
        let expected = format!(
            "subtype = '{}' AND kind = '{}'",
            crate::history::model::subtype::COMPACT_BOUNDARY,
            crate::history::model::EntryKind::System.as_str()
        );
        assert_eq!(BOUNDARY_ROWS, expected);
    }
}
