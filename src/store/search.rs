//! Search over what a model could read of each entry (`history::search`), with each backend's
//! own engine: SQLite FTS5 with the trigram tokenizer (substrings, ranked by bm25), PostgreSQL
//! `pg_trgm` for substrings and `ts_rank_cd` over a full-text vector for the ranking
//! (`migrations/*/0011_search.sql`).
//!
//! The index follows the appends rather than joining them: each thread's entries before its
//! `search_seq` are indexed, and [`Store::index_thread`] takes the next ones, outside the
//! append's transaction (an append costs what it did). A thread's search first brings that
//! thread up to date; a sweep ([`Store::index_behind`]) brings the others. What is indexed
//! answers to its source: an entry rewritten (an erasure's tombstone, a summary derived again)
//! loses its row through a trigger, which also moves `search_seq` back so the new text is
//! indexed; a snip's redaction removes its entries' rows; a deleted thread's rows go with it.
//! The indexer writes only under the redaction epoch it read, so a snip or an erasure that
//! commits meanwhile makes it read again rather than index what they took out.

use std::collections::HashSet;

use sqlx::Row;

use super::rows::{entry_from_row, page_within_bytes};
use super::{into_storable, Backend, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::anchors::{self, anchors_of_entry};
use crate::history::model::{subtype, Entry};
use crate::history::normalize::view::snipped_uuids;
use crate::history::search::searchable;

/// The kind of a hit that is a summary line, not an entry.
pub const LINE_KIND: &str = "line";

/// Entries one indexing step reads of a thread.
pub const INDEX_BATCH: i64 = 256;

/// Bytes of bodies one indexing step reads (at least one entry).
pub const INDEX_BATCH_BYTES: i64 = 4 * 1024 * 1024;

/// Indexing steps a thread's search may take first: 2,048 entries.
pub const CATCH_UP_STEPS: usize = 8;

/// Threads a tenant-wide search indexes a step of first.
pub const TENANT_CATCH_UP_THREADS: i64 = 16;

/// Terms one query may hold: each is a match of its own for the engine.
pub const MAX_TERMS: usize = 16;

/// Characters a query may hold.
pub const MAX_QUERY_CHARS: usize = 500;

/// Characters of a row PostgreSQL's word rank reads: a full-text vector holds at most 1 MiB,
/// and a row of more distinct words (a binary file's dump) made every search finding it fail.
/// 100,000 characters make a vector of at most about 250 KB, whatever the words.
const RANKED_CHARS: usize = 100_000;

/// Characters of context on each side of a snippet's match.
const SNIPPET_CONTEXT: usize = 80;

/// Marks around the match in a snippet.
pub const MARK_OPEN: &str = "«";
pub const MARK_CLOSE: &str = "»";

/// What to search for.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    /// Terms, each matched as a substring (case-insensitive); an entry matching more of them,
    /// or matching them more, ranks higher.
    pub terms: Vec<String>,
    pub limit: i64,
    /// Whether thinking is searched too.
    pub thinking: bool,
}

impl SearchQuery {
    /// The terms of a query as written: words apart, a `"quoted phrase"` as one term; at most
    /// [`MAX_TERMS`] (the first), control characters read as spaces.
    pub fn terms_of(query: &str) -> Vec<String> {
        let query: String = query
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut terms = Vec::new();
        for (i, part) in query.split('"').enumerate() {
            if i % 2 == 1 {
                if !part.trim().is_empty() {
                    terms.push(part.trim().to_owned());
                }
            } else {
                terms.extend(part.split_whitespace().map(str::to_owned));
            }
        }
        let mut seen = HashSet::new();
        terms.retain(|t| seen.insert(t.to_lowercase()));
        terms.truncate(MAX_TERMS);
        terms
    }
}

/// One entry found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    pub thread_id: String,
    /// The entry's seq; for a summary line, the first seq it covers.
    pub seq: i64,
    /// Messages the hit covers: 1 for an entry, a summary line's span (its zoom address is
    /// `seq+n`).
    pub n: i64,
    /// The entry's type (`user`, `assistant`, …), or `line` for a summary line.
    pub kind: String,
    /// Where the first match is, marked by [`MARK_OPEN`] and [`MARK_CLOSE`].
    pub snippet: String,
    /// Higher is better; comparable within one answer only.
    pub score: f64,
    /// The match is in the entry's thinking.
    pub in_thinking: bool,
}

/// Entries a thread holds that the index has not taken yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexLag {
    pub indexed_through: i64,
    pub pending: i64,
}

struct ThreadMark {
    search_seq: i64,
    next_seq: i64,
    epoch: i64,
}

impl Store {
    /// Indexes up to [`INDEX_BATCH`] entries of the thread after those indexed. Returns what is
    /// left to index (as the step found it, when another indexer or a redaction moved first).
    pub async fn index_thread(&self, thread_key: &ThreadKey) -> Result<IndexLag, StoreError> {
        self.catch_up(thread_key, 1).await
    }

    /// Brings the thread's index up to date, at most `max_steps` steps of [`INDEX_BATCH`]
    /// entries; stops early when another indexer, a snip or an erasure moves the thread first.
    /// The thread's mark and its snips are read once for all the steps: a snip or an erasure
    /// since moves the redaction epoch, which every step's write checks.
    pub async fn catch_up(
        &self,
        thread_key: &ThreadKey,
        max_steps: usize,
    ) -> Result<IndexLag, StoreError> {
        let Some(mut mark) = self.thread_mark(thread_key).await? else {
            return Ok(IndexLag {
                indexed_through: 0,
                pending: 0,
            });
        };
        if mark.search_seq < mark.next_seq {
            let snips = sqlx::query(
                "SELECT seq, uuid, created_at, body FROM messages \
                 WHERE thread_key = $1 AND subtype = $2 ORDER BY seq",
            )
            .bind(thread_key.as_str())
            .bind(subtype::SNIP)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(entry_from_row)
            .collect::<Result<Vec<Entry>, _>>()?;
            let hidden: HashSet<&str> = snipped_uuids(&snips);
            for _ in 0..max_steps {
                match self.index_step(thread_key, &mark, &hidden).await? {
                    Some(through) => mark.search_seq = through,
                    None => break,
                }
                if mark.search_seq >= mark.next_seq {
                    break;
                }
            }
        }
        Ok(IndexLag {
            indexed_through: mark.search_seq,
            pending: (mark.next_seq - mark.search_seq).max(0),
        })
    }

    /// Indexes the batch after `mark.search_seq`, leaving out the `hidden` (snipped) uuids.
    /// Returns the new mark, or `None` when the thread moved first (nothing is written then).
    async fn index_step(
        &self,
        thread_key: &ThreadKey,
        mark: &ThreadMark,
        hidden: &HashSet<&str>,
    ) -> Result<Option<i64>, StoreError> {
        // A batch is cut by bytes too: a thread of large entries is read a few at a time.
        let rows = sqlx::query(&page_within_bytes("m.seq, m.uuid, m.created_at"))
            .bind(thread_key.as_str())
            .bind(mark.search_seq - 1)
            .bind(INDEX_BATCH)
            .bind(INDEX_BATCH_BYTES)
            .fetch_all(&self.pool)
            .await?;
        let mut last = mark.search_seq - 1;
        let mut entries = Vec::with_capacity(rows.len());
        for row in &rows {
            let entry = entry_from_row(row)?;
            last = last.max(entry.seq.unwrap_or_default());
            if !entry.uuid.as_deref().is_some_and(|u| hidden.contains(u)) {
                entries.push(entry);
            }
        }
        drop(rows);
        // Reading the texts and their anchors is CPU work (up to 4 MiB of bodies a step): off
        // the async threads, so other requests do not wait behind it.
        let found = tokio::task::spawn_blocking(move || {
            entries
                .iter()
                .filter_map(|entry| {
                    let found = searchable(entry)?;
                    // A NUL the entry's JSON carried would make PostgreSQL refuse the row, and
                    // the thread's index would never move past it.
                    let text = into_storable(found.text);
                    let thinking = into_storable(found.thinking);
                    let anchors = into_storable(anchors::encode(&anchors_of_entry(entry)));
                    Some((entry.seq.unwrap_or_default(), text, thinking, anchors))
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|error| StoreError::Corrupt(format!("the indexer's reader stopped: {error}")))?;
        let through = last + 1;
        // The rows first, the thread's mark last: its row lock, which appends to the thread
        // wait for, is held only for the moment of the compare-and-set.
        let mut tx = self.writer.begin().await?;
        for chunk in found.chunks(super::rows::INSERT_CHUNK) {
            let sql = format!(
                "INSERT INTO search_rows (thread_key, seq, text, thinking, anchors) VALUES {} \
                 ON CONFLICT (thread_key, seq) DO NOTHING",
                super::values_placeholders(chunk.len(), 5)
            );
            let mut query = sqlx::query(&sql);
            for (seq, text, thinking, anchors) in chunk {
                query = query
                    .bind(thread_key.as_str())
                    .bind(*seq)
                    .bind(text.as_str())
                    .bind(thinking.as_str())
                    .bind(anchors.as_str());
            }
            query.execute(&mut *tx).await?;
        }
        let moved = sqlx::query(
            "UPDATE threads SET search_seq = $1 WHERE thread_key = $2 AND search_seq = $3 \
             AND redaction_epoch = $4",
        )
        .bind(through)
        .bind(thread_key.as_str())
        .bind(mark.search_seq)
        .bind(mark.epoch)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 0 {
            // Another indexer, or a snip or an erasure, went first: what was written goes back,
            // and the next step reads again.
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(through))
    }

    /// One sweep step: indexes a batch of each of up to `threads` threads the index is behind
    /// on. Returns how many it found behind.
    pub async fn index_behind(&self, threads: i64) -> Result<usize, StoreError> {
        let keys: Vec<String> = sqlx::query_scalar(
            "SELECT thread_key FROM threads WHERE search_seq < next_seq LIMIT $1",
        )
        .bind(threads)
        .fetch_all(&self.pool)
        .await?;
        for key in &keys {
            self.index_thread(&ThreadKey::from_stored(key.clone()))
                .await?;
        }
        Ok(keys.len())
    }

    /// A thread's entries that match, its index first brought up to date (at most
    /// `CATCH_UP_STEPS` steps: what is left shows in the lag).
    pub async fn search_thread(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        query: &SearchQuery,
    ) -> Result<(Vec<SearchHit>, IndexLag), StoreError> {
        let key = self.thread_head(tenant, thread_id).await?.thread_key;
        let lag = self.catch_up(&key, CATCH_UP_STEPS).await?;
        let hits = self.search(tenant, Some(&key), query).await?;
        Ok((hits, lag))
    }

    /// The tenant's entries that match in any of its threads, after a step of indexing on each
    /// of the (at most `TENANT_CATCH_UP_THREADS`) threads the index is behind on. Also
    /// answers how many entries are still to index.
    pub async fn search_tenant(
        &self,
        tenant: &TenantId,
        query: &SearchQuery,
    ) -> Result<(Vec<SearchHit>, i64), StoreError> {
        let behind: Vec<String> = sqlx::query_scalar(
            "SELECT thread_key FROM threads WHERE tenant_id = $1 AND search_seq < next_seq \
             LIMIT $2",
        )
        .bind(&tenant.0)
        .bind(TENANT_CATCH_UP_THREADS)
        .fetch_all(&self.pool)
        .await?;
        for key in behind {
            self.index_thread(&ThreadKey::from_stored(key)).await?;
        }
        let hits = self.search(tenant, None, query).await?;
        let pending: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(next_seq - search_seq), 0) AS BIGINT) FROM threads \
             WHERE tenant_id = $1 AND search_seq < next_seq",
        )
        .bind(&tenant.0)
        .fetch_one(&self.pool)
        .await?;
        Ok((hits, pending))
    }

    async fn thread_mark(&self, thread_key: &ThreadKey) -> Result<Option<ThreadMark>, StoreError> {
        let row = sqlx::query(
            "SELECT search_seq, next_seq, redaction_epoch FROM threads WHERE thread_key = $1",
        )
        .bind(thread_key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(ThreadMark {
                search_seq: row.try_get(0)?,
                next_seq: row.try_get(1)?,
                epoch: row.try_get(2)?,
            })
        })
        .transpose()
    }

    /// The tenant's entries that match, best first: in one thread (`thread_key`) or in all
    /// of the tenant's.
    pub async fn search(
        &self,
        tenant: &TenantId,
        thread_key: Option<&ThreadKey>,
        query: &SearchQuery,
    ) -> Result<Vec<SearchHit>, StoreError> {
        if query.terms.is_empty() || query.limit <= 0 {
            return Ok(Vec::new());
        }
        let rows = match self.backend {
            Backend::Sqlite => self.search_sqlite(tenant, thread_key, query).await?,
            Backend::Postgres => self.search_postgres(tenant, thread_key, query).await?,
        };
        let mut hits = Vec::with_capacity(rows.len());
        for row in rows {
            let text: String = row.try_get("text")?;
            let thinking: String = row.try_get("thinking")?;
            let (snippet, in_thinking) = match snippet(&text, &query.terms) {
                Some(snippet) => (snippet, false),
                None if query.thinking => match snippet(&thinking, &query.terms) {
                    Some(snippet) => (snippet, true),
                    None => continue,
                },
                // A trigram match the substring test does not confirm (case folding beyond
                // ASCII): not a hit.
                None => continue,
            };
            hits.push(SearchHit {
                thread_id: row.try_get("thread_id")?,
                seq: row.try_get("seq")?,
                n: 1,
                kind: row.try_get("kind")?,
                snippet,
                score: row.try_get("score")?,
                in_thinking,
            });
        }
        // The entries come first: they are the source, and the two engines' scores do not
        // compare (a short line out-ranks its long entry on bm25, the reverse on ts_rank_cd).
        // Lines fill the room left, each only when no entry listed lies within it: a line is
        // worth a hit for what no listed entry says.
        let room = (query.limit as usize).saturating_sub(hits.len());
        if room > 0 {
            let lines = self.search_lines(tenant, thread_key, query).await?;
            let covered = |line: &SearchHit| {
                hits.iter().any(|hit| {
                    hit.thread_id == line.thread_id
                        && (line.seq..line.seq + line.n).contains(&hit.seq)
                })
            };
            let lines: Vec<SearchHit> = lines
                .into_iter()
                .filter(|line| !covered(line))
                .take(room)
                .collect();
            hits.extend(lines);
        }
        Ok(hits)
    }

    /// The summary lines a summarizer wrote that match (verbatim lines repeat entries, which
    /// are searched already), best first (the finer, then the later, on a tie): SQLite's FTS5 index over them
    /// (`migrations/sqlite/0013_line_search.sql`) when every term is long enough for its
    /// trigrams, else `LIKE`; PostgreSQL's trigram index through `ILIKE`, ranked by
    /// `ts_rank_cd`. Scored as entries are, so the two lists merge.
    async fn search_lines(
        &self,
        tenant: &TenantId,
        thread_key: Option<&ThreadKey>,
        query: &SearchQuery,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let postgres = self.backend == Backend::Postgres;
        let scope = if thread_key.is_some() {
            "AND n.thread_key = $3".to_owned()
        } else {
            format!(
                "AND $3 = $3{}",
                self.unexpired_condition(tenant, thread_key, "t").await?
            )
        };
        let key = thread_key.map_or("", ThreadKey::as_str).to_owned();
        let terms = query.terms.len();
        let fts = !postgres && query.terms.iter().all(|t| t.chars().count() >= 3);
        let like = if postgres { "ILIKE" } else { "LIKE" };
        let matched: Vec<String> = (0..terms)
            .map(|i| format!("n.text {like} ${} ESCAPE '\\'", i + 5))
            .collect();
        let counted = matched
            .iter()
            .map(|m| format!("(CASE WHEN {m} THEN 1 ELSE 0 END)"))
            .collect::<Vec<_>>()
            .join(" + ");
        let summarized = "n.summarizer NOT IN ('verbatim', 'hidden')";
        let sql = if fts {
            format!(
                "SELECT thread_id, level, idx, text, matched - relevance / (1.0 - relevance) \
                 AS score FROM (SELECT t.thread_id, n.level, n.idx, n.text, \
                 CAST({counted} AS REAL) AS matched, bm25(line_index) AS relevance \
                 FROM line_index JOIN tree_nodes n ON n.rowid = line_index.rowid \
                 JOIN threads t ON t.thread_key = n.thread_key \
                 WHERE line_index MATCH $1 AND t.tenant_id = $2 {scope}) \
                 ORDER BY score DESC, level, idx DESC LIMIT $4"
            )
        } else {
            let rank = if postgres {
                let words = (0..terms)
                    .map(|i| format!("plainto_tsquery('simple', ${})", i + 5 + terms))
                    .collect::<Vec<_>>()
                    .join(" || ");
                format!(
                    "CAST({counted} AS DOUBLE PRECISION) \
                     + ts_rank_cd(to_tsvector('simple', left(n.text, {RANKED_CHARS})), {words})"
                )
            } else {
                format!("CAST({counted} AS REAL)")
            };
            format!(
                "SELECT t.thread_id, n.level, n.idx, n.text, {rank} AS score \
                 FROM tree_nodes n JOIN threads t ON t.thread_key = n.thread_key \
                 WHERE t.tenant_id = $2 {scope} AND {summarized} AND ({}) \
                 ORDER BY score DESC, n.level, n.idx DESC LIMIT $4",
                matched.join(" OR ")
            )
        };
        let indexed: Vec<String> = query
            .terms
            .iter()
            .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
            .collect();
        let mut q = sqlx::query(&sql)
            .bind(if fts {
                indexed.join(" OR ")
            } else {
                String::new()
            })
            .bind(&tenant.0)
            .bind(key)
            .bind(query.limit);
        for term in &query.terms {
            q = q.bind(format!("%{}%", like_escaped(term)));
        }
        if postgres {
            for term in &query.terms {
                q = q.bind(term.clone());
            }
        }
        let mut hits = Vec::new();
        for row in q.fetch_all(&self.pool).await? {
            let text: String = row.try_get("text")?;
            let Some(snippet) = snippet(&text, &query.terms) else {
                continue;
            };
            let level: i64 = row.try_get("level")?;
            let idx: i64 = row.try_get("idx")?;
            hits.push(SearchHit {
                thread_id: row.try_get("thread_id")?,
                seq: idx << level,
                n: 1 << level,
                kind: LINE_KIND.to_owned(),
                snippet,
                score: row.try_get("score")?,
                in_thinking: false,
            });
        }
        Ok(hits)
    }

    async fn search_sqlite(
        &self,
        tenant: &TenantId,
        thread_key: Option<&ThreadKey>,
        query: &SearchQuery,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        // The trigram tokenizer matches terms of three characters or more through the index;
        // shorter ones are matched by LIKE (a scan of the thread, or of the tenant's rows).
        let columns = if query.thinking {
            "{text thinking}"
        } else {
            "text"
        };
        let indexed: Vec<String> = query
            .terms
            .iter()
            .filter(|t| t.chars().count() >= 3)
            .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
            .collect();
        let scope = if thread_key.is_some() {
            "AND r.thread_key = $3".to_owned()
        } else {
            format!(
                "AND $3 = $3{}",
                self.unexpired_condition(tenant, thread_key, "t").await?
            )
        };
        let key = thread_key.map_or("", ThreadKey::as_str).to_owned();
        if indexed.len() == query.terms.len() {
            // More terms matched rank first; bm25 (negative, lower is better), squashed into
            // [0, 1), orders entries that match as many.
            let counted = (0..query.terms.len())
                .map(|i| {
                    let p = i + 5;
                    let mut found = format!("instr(lower(r.text), lower(${p})) > 0");
                    if query.thinking {
                        found = format!("({found} OR instr(lower(r.thinking), lower(${p})) > 0)");
                    }
                    format!("(CASE WHEN {found} THEN 1 ELSE 0 END)")
                })
                .collect::<Vec<_>>()
                .join(" + ");
            // The hits are ranked on their ids, and only the best's text is read, a window of
            // it around the first match.
            let (text, thinking) = (
                windowed("r.text", 5, query.terms.len(), false),
                windowed("r.thinking", 5, query.terms.len(), false),
            );
            let sql = format!(
                "SELECT h.thread_id, h.seq, {text} AS text, {thinking} AS thinking, h.kind, \
                 h.score FROM (\
                 SELECT id, thread_id, seq, kind, \
                 matched - relevance / (1.0 - relevance) AS score FROM (\
                 SELECT r.id, t.thread_id, r.seq, m.kind, \
                 CAST({counted} AS REAL) AS matched, bm25(search_index) AS relevance \
                 FROM search_index JOIN search_rows r ON r.id = search_index.rowid \
                 JOIN threads t ON t.thread_key = r.thread_key \
                 JOIN messages m ON m.thread_key = r.thread_key AND m.seq = r.seq \
                 WHERE search_index MATCH $1 AND t.tenant_id = $2 {scope}) \
                 ORDER BY score DESC, seq DESC LIMIT $4) h \
                 JOIN search_rows r ON r.id = h.id ORDER BY h.score DESC, h.seq DESC"
            );
            let matched = format!("{columns} : ({})", indexed.join(" OR "));
            let mut q = sqlx::query(&sql)
                .bind(matched)
                .bind(&tenant.0)
                .bind(key)
                .bind(query.limit);
            for term in &query.terms {
                q = q.bind(term.clone());
            }
            return Ok(q.fetch_all(&self.pool).await?);
        }
        self.search_by_like(tenant, &key, &scope, query).await
    }

    async fn search_postgres(
        &self,
        tenant: &TenantId,
        thread_key: Option<&ThreadKey>,
        query: &SearchQuery,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        let scope = if thread_key.is_some() {
            "AND r.thread_key = $3".to_owned()
        } else {
            format!(
                "AND $3 = $3{}",
                self.unexpired_condition(tenant, thread_key, "t").await?
            )
        };
        let key = thread_key.map_or("", ThreadKey::as_str).to_owned();
        self.search_by_like(tenant, &key, &scope, query).await
    }

    /// Substring matching by `LIKE` (SQLite: terms too short for its trigrams) or `ILIKE`
    /// (PostgreSQL, through the `pg_trgm` index), ranked by how many terms match, then by
    /// `ts_rank_cd` (PostgreSQL) or recency.
    async fn search_by_like(
        &self,
        tenant: &TenantId,
        key: &str,
        scope: &str,
        query: &SearchQuery,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        let postgres = self.backend == Backend::Postgres;
        let like = if postgres { "ILIKE" } else { "LIKE" };
        let escape = " ESCAPE '\\'";
        let mut matches = Vec::new();
        let mut counts = Vec::new();
        for i in 0..query.terms.len() {
            let p = i + 5;
            let mut term = format!("r.text {like} ${p}{escape}");
            if query.thinking {
                term = format!("({term} OR r.thinking {like} ${p}{escape})");
            }
            counts.push(format!("(CASE WHEN {term} THEN 1 ELSE 0 END)"));
            matches.push(term);
        }
        let plain = 5 + query.terms.len();
        let rank = if postgres {
            let words = (0..query.terms.len())
                .map(|i| format!("plainto_tsquery('simple', ${})", i + plain))
                .collect::<Vec<_>>()
                .join(" || ");
            format!(
                "CAST({} AS DOUBLE PRECISION) \
                 + ts_rank_cd(to_tsvector('simple', left(r.text, {RANKED_CHARS})), {words})",
                counts.join(" + ")
            )
        } else {
            format!("CAST({} AS REAL)", counts.join(" + "))
        };
        let (text, thinking) = (
            windowed("r.text", plain, query.terms.len(), postgres),
            windowed("r.thinking", plain, query.terms.len(), postgres),
        );
        let sql = format!(
            "SELECT h.thread_id, h.seq, {text} AS text, {thinking} AS thinking, h.kind, h.score \
             FROM (SELECT t.thread_id, r.thread_key, r.seq, m.kind, {rank} AS score \
             FROM search_rows r JOIN threads t ON t.thread_key = r.thread_key \
             JOIN messages m ON m.thread_key = r.thread_key AND m.seq = r.seq \
             WHERE t.tenant_id = $2 {scope} AND ({}) \
             ORDER BY score DESC, r.seq DESC LIMIT $4) h \
             JOIN search_rows r ON r.thread_key = h.thread_key AND r.seq = h.seq \
             ORDER BY h.score DESC, h.seq DESC",
            matches.join(" OR ")
        );
        let mut q = sqlx::query(&sql)
            .bind(String::new())
            .bind(&tenant.0)
            .bind(key.to_owned())
            .bind(query.limit);
        for term in &query.terms {
            q = q.bind(format!("%{}%", like_escaped(term)));
        }
        // Plain, for the text's window (and PostgreSQL's word rank).
        for term in &query.terms {
            q = q.bind(term.clone());
        }
        Ok(q.fetch_all(&self.pool).await?)
    }

    /// Removes the index rows of a thread's entries at `seqs` (a snip's redaction), in the
    /// caller's transaction.
    pub(crate) async fn forget_searched(
        conn: &mut sqlx::AnyConnection,
        thread_key: &ThreadKey,
        seqs: &[i64],
    ) -> Result<u64, StoreError> {
        let mut removed = 0;
        for chunk in seqs.chunks(super::rows::INSERT_CHUNK) {
            let sql = format!(
                "DELETE FROM search_rows WHERE thread_key = $1 AND seq IN ({})",
                super::list_placeholders(2, chunk.len())
            );
            let mut query = sqlx::query(&sql).bind(thread_key.as_str());
            for seq in chunk {
                query = query.bind(*seq);
            }
            removed += query.execute(&mut *conn).await?.rows_affected();
        }
        Ok(removed)
    }
}

/// Characters of an entry's text read around its first match, for the snippet.
const WINDOW_CHARS: usize = 600;

/// SQL for a window of `column` around the first place one of the `count` terms bound from
/// `$first` on occurs (case folded), or its start: a hit's snippet needs no more of a long text.
fn windowed(column: &str, first: usize, count: usize, postgres: bool) -> String {
    let find = if postgres { "strpos" } else { "instr" };
    let places = (first..first + count)
        .map(|p| format!("NULLIF({find}(lower({column}), lower(${p})), 0)"))
        .collect::<Vec<_>>()
        .join(", ");
    let greatest = if postgres { "greatest" } else { "max" };
    format!(
        "substr({column}, {greatest}(1, COALESCE({places}, 1) - {}), {WINDOW_CHARS})",
        WINDOW_CHARS / 3
    )
}

/// `term` for a `LIKE … ESCAPE '\'` pattern: its wildcards and backslashes taken literally.
fn like_escaped(term: &str) -> String {
    let mut out = String::with_capacity(term.len());
    for c in term.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The text around the first place any term occurs (ASCII case folded), the match marked;
/// `None` when no term occurs.
pub fn snippet(text: &str, terms: &[String]) -> Option<String> {
    let folded = text.to_ascii_lowercase();
    let (start, len) = terms
        .iter()
        .filter_map(|t| {
            let t = t.to_ascii_lowercase();
            folded.find(&t).map(|at| (at, t.len()))
        })
        .min()?;
    let end = start + len;
    let from = floor_char(
        text,
        start.saturating_sub(SNIPPET_CONTEXT * 4),
        start,
        SNIPPET_CONTEXT,
    );
    let to = ceil_char(text, end, SNIPPET_CONTEXT);
    let mut out = String::new();
    if from > 0 {
        out.push('…');
    }
    out.push_str(&text[from..start]);
    out.push_str(MARK_OPEN);
    out.push_str(&text[start..end]);
    out.push_str(MARK_CLOSE);
    out.push_str(&text[end..to]);
    if to < text.len() {
        out.push('…');
    }
    Some(out.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The byte where `chars` characters before `at` start (not before `floor`).
fn floor_char(text: &str, floor: usize, at: usize, chars: usize) -> usize {
    let mut from = at;
    for (i, _) in text[..at].char_indices().rev().take(chars) {
        from = i;
    }
    from.max(floor)
}

/// The byte `chars` characters after `at`.
fn ceil_char(text: &str, at: usize, chars: usize) -> usize {
    text[at..]
        .char_indices()
        .nth(chars)
        .map_or(text.len(), |(i, _)| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_words_or_quoted_phrases_and_few() {
        assert_eq!(SearchQuery::terms_of("abc\u{0}def"), ["abc", "def"]);
        let many: String = (0..1000).map(|i| format!("t{i} ")).collect();
        assert_eq!(SearchQuery::terms_of(&many).len(), MAX_TERMS);
        assert_eq!(
            SearchQuery::terms_of(r#"E0282 "cargo test  -p" src/store/jobs.rs e0282 """#),
            ["E0282", "cargo test  -p", "src/store/jobs.rs"]
        );
    }

    #[test]
    fn a_snippet_marks_the_first_match_with_its_context() {
        let text = format!(
            "{} the error E0282 appeared {}",
            "x".repeat(500),
            "y".repeat(500)
        );
        let s = snippet(&text, &["e0282".to_owned()]).unwrap();
        assert!(s.contains("«E0282»"), "{s}");
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.chars().count() < 200, "{s}");
        assert_eq!(
            snippet("héllo wörld", &["wö".to_owned()]).unwrap(),
            "héllo «wö»rld"
        );
        assert_eq!(snippet("abc", &["zz".to_owned()]), None);
    }
}
