//! Summary-tree nodes and the outline's stored state.
//!
//! Nodes are written once, keyed by `(thread_key, level, idx)`: an insert that finds the key
//! taken writes nothing, so a duplicate or retried job cannot change a line. The outline's state
//! (its tiles) is a single row per thread, replaced by compare-and-set on its version.

use std::collections::{BTreeMap, HashMap};

use sqlx::Row;

use super::rows::entry_from_row;
use super::{now_millis, storable_text, Store, StoreError, TenantId, ThreadId, ThreadKey};
use crate::history::ledger::{add_counts, outline_footer};
use crate::history::model::Entry;
use crate::tree::{NodeId, Outline, OutlineOptions};

/// The outline's stored state and what a reader needs to render it.
#[derive(Debug, Clone)]
pub struct OutlineSnapshot {
    pub thread_key: ThreadKey,
    pub next_seq: i64,
    pub outline: Outline,
    /// 0 when no state was stored yet.
    pub version: i64,
    /// The text of every tile that has one, in order. A tile with no text (it covers only
    /// entries the model never sees) takes no line and is left out, as is a tile whose node is
    /// missing (a stored outline only ever holds built nodes).
    pub lines: Vec<(NodeId, String)>,
    /// Who wrote each of `lines`: `verbatim` (its source word for word) or the summarizer's name.
    pub summarizers: Vec<String>,
    /// What the lines dropped, by kind, for the model (empty when they dropped nothing).
    pub footer: String,
}

/// A stored node as the outline reads it.
struct NodeRow {
    text: String,
    summarizer: String,
    dropped: String,
}

/// What `zoom` read: two indexed reads, whatever the size of the thread.
#[derive(Debug, Clone)]
pub enum ZoomRead {
    Message(Option<Box<Entry>>),
    /// The message is snipped: hidden from every model-facing view, zoom included.
    Hidden,
    /// The message was erased: a tombstone.
    Erased,
    /// The two halves, each with its text when built.
    Halves(Option<(NodeId, String)>, Option<(NodeId, String)>),
}

/// A node to write.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub node: NodeId,
    pub text: String,
    pub summarizer: String,
    pub calls: u32,
    /// Anchors it and the lines below it dropped, by kind (`history::ledger::encode_counts`).
    pub dropped: String,
}

impl NewNode {
    /// A free node: its source, word for word (it drops nothing of it; `dropped` holds what
    /// the lines it was joined from dropped).
    pub fn verbatim(node: NodeId, text: String) -> Self {
        NewNode {
            node,
            text,
            summarizer: "verbatim".to_owned(),
            calls: 0,
            dropped: String::new(),
        }
    }
}

/// A stored line of one level, as a parent is built from it.
#[derive(Debug, Clone, Default)]
pub struct LevelLine {
    pub text: String,
    pub dropped: String,
}

/// Who wrote a level-0 line hidden by a snip (its text is empty: no line).
pub const HIDDEN: &str = "hidden";
/// Who wrote a line rebuilt without a model after a line below it was hidden; a tree job may
/// summarize it again.
pub const STAND_IN: &str = "stand-in";

/// Rows per multi-row insert (7 parameters each, well under every backend's limit).
const NODE_INSERT_ROWS: usize = 200;

/// The tree's build status.
#[derive(Debug, Clone)]
pub struct TreeStatus {
    pub nodes: i64,
    pub calls: i64,
    pub summarized: i64,
    pub last_job_state: Option<String>,
    pub last_error: Option<String>,
}

impl Store {
    /// Nodes written, the model calls they cost, and the latest tree job's state.
    pub async fn tree_status(&self, thread_key: &ThreadKey) -> Result<TreeStatus, StoreError> {
        let (nodes, calls, summarized) = self.tree_costs(thread_key).await?;
        let job = sqlx::query(
            "SELECT state, last_error FROM jobs WHERE thread_key = $1 AND kind = $2 \
             ORDER BY created_at DESC, job_id DESC LIMIT 1",
        )
        .bind(thread_key.as_str())
        .bind(super::KIND_TREE)
        .fetch_optional(&self.pool)
        .await?;
        let (last_job_state, last_error) = match job {
            Some(row) => (Some(row.try_get("state")?), row.try_get("last_error")?),
            None => (None, None),
        };
        Ok(TreeStatus {
            nodes,
            calls,
            summarized,
            last_job_state,
            last_error,
        })
    }

    /// The next index to build at each level `0..=max_level` (nodes are built in order, so the
    /// built nodes of a level are `0..next`).
    pub async fn tree_frontier(
        &self,
        thread_key: &ThreadKey,
        max_level: u32,
    ) -> Result<Vec<u64>, StoreError> {
        let mut frontier = Vec::with_capacity(max_level as usize + 1);
        for level in 0..=max_level {
            let max: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(idx) FROM tree_nodes WHERE thread_key = $1 AND level = $2",
            )
            .bind(thread_key.as_str())
            .bind(i64::from(level))
            .fetch_one(&self.pool)
            .await?;
            frontier.push(max.map_or(0, |idx| idx as u64 + 1));
        }
        Ok(frontier)
    }

    /// The lines of `level` with index in `[from, to)`, by index, with what each dropped.
    pub async fn tree_level_lines(
        &self,
        thread_key: &ThreadKey,
        level: u32,
        from: u64,
        to: u64,
    ) -> Result<HashMap<u64, LevelLine>, StoreError> {
        let rows = sqlx::query(
            "SELECT idx, text, dropped FROM tree_nodes WHERE thread_key = $1 AND level = $2 \
             AND idx >= $3 AND idx < $4",
        )
        .bind(thread_key.as_str())
        .bind(i64::from(level))
        .bind(from as i64)
        .bind(to as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let idx: i64 = row.try_get("idx")?;
                let line = LevelLine {
                    text: row.try_get("text")?,
                    dropped: row.try_get("dropped")?,
                };
                Ok((idx as u64, line))
            })
            .collect()
    }

    /// The texts of the nodes of `level` with index in `[from, to)`, by index.
    pub async fn tree_level_texts(
        &self,
        thread_key: &ThreadKey,
        level: u32,
        from: u64,
        to: u64,
    ) -> Result<HashMap<u64, String>, StoreError> {
        let lines = self.tree_level_lines(thread_key, level, from, to).await?;
        Ok(lines
            .into_iter()
            .map(|(idx, line)| (idx, line.text))
            .collect())
    }

    /// Writes nodes once, in one transaction; returns how many were new (a node already written
    /// keeps its stored line). Fenced by `epoch`, the thread's redaction epoch when the writer
    /// read its sources: if a snip moved it since, nothing is written
    /// ([`StoreError::SourcesChanged`]), since the nodes may hold text now hidden.
    pub async fn put_tree_nodes(
        &self,
        thread_key: &ThreadKey,
        epoch: i64,
        nodes: &[NewNode],
    ) -> Result<u64, StoreError> {
        let now = now_millis();
        let mut written = 0;
        let mut tx = self.writer.begin().await?;
        Store::check_epoch_in(&mut tx, self.backend, thread_key, epoch).await?;
        for chunk in nodes.chunks(NODE_INSERT_ROWS) {
            let rows: Vec<String> = (0..chunk.len())
                .map(|row| {
                    let p = row * 8;
                    format!(
                        "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                        p + 1,
                        p + 2,
                        p + 3,
                        p + 4,
                        p + 5,
                        p + 6,
                        p + 7,
                        p + 8
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO tree_nodes (thread_key, level, idx, text, summarizer, calls, \
                 created_at, dropped) VALUES {} ON CONFLICT (thread_key, level, idx) DO NOTHING",
                rows.join(", ")
            );
            let mut query = sqlx::query(&sql);
            for node in chunk {
                query = query
                    .bind(thread_key.as_str())
                    .bind(i64::from(node.node.level))
                    .bind(node.node.index as i64)
                    .bind(storable_text(&node.text).into_owned())
                    .bind(&node.summarizer)
                    .bind(i64::from(node.calls))
                    .bind(now)
                    .bind(&node.dropped);
            }
            written += query.execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok(written)
    }

    /// Hides the messages at `seqs` from the tree, in one transaction (`hide_in_tree_in`).
    /// The redaction epoch moves, so a tree job that read its sources before cannot write
    /// after. Returns the nodes rewritten.
    pub async fn hide_in_tree(
        &self,
        thread_key: &ThreadKey,
        seqs: &[u64],
        stand_ins: &dyn StandIns,
    ) -> Result<u64, StoreError> {
        let mut tx = self.writer.begin().await?;
        let bumped: Option<i64> = sqlx::query_scalar(
            "UPDATE threads SET redaction_epoch = redaction_epoch + 1 WHERE thread_key = $1 \
             RETURNING redaction_epoch",
        )
        .bind(thread_key.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if bumped.is_none() {
            return Err(StoreError::ThreadNotFound);
        }
        let rewritten =
            hide_in_tree_in(&mut tx, thread_key, seqs, &[], stand_ins, now_millis()).await?;
        tx.commit().await?;
        Ok(rewritten)
    }

    /// The seqs among `seqs` whose level-0 line still shows text: snipped messages a snip's own
    /// redaction did not reach (the process stopped between the snip's append and it).
    pub async fn shown_leaves(
        &self,
        thread_key: &ThreadKey,
        seqs: &[u64],
    ) -> Result<Vec<u64>, StoreError> {
        let mut shown = Vec::new();
        // Integers from the database, written into the statement: one read per 500.
        for chunk in seqs.chunks(500) {
            let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
            let found: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT idx FROM tree_nodes WHERE thread_key = $1 AND level = 0 \
                 AND text <> '' AND idx IN ({})",
                list.join(", ")
            ))
            .bind(thread_key.as_str())
            .fetch_all(&self.pool)
            .await?;
            shown.extend(found.into_iter().map(|idx| idx as u64));
        }
        Ok(shown)
    }

    /// The thread's stand-in lines (summarizer `stand-in`), lowest level first: what a tree job summarizes
    /// again. At most `limit`.
    pub async fn stand_in_nodes(
        &self,
        thread_key: &ThreadKey,
        limit: i64,
    ) -> Result<Vec<NodeId>, StoreError> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT level, idx FROM tree_nodes WHERE thread_key = $1 AND summarizer = $2 \
             ORDER BY level, idx LIMIT $3",
        )
        .bind(thread_key.as_str())
        .bind(STAND_IN)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(level, idx)| NodeId::new(level as u32, idx as u64))
            .collect())
    }

    /// Replaces stand-in lines with their summaries, fenced by the redaction epoch as
    /// [`Store::put_tree_nodes`] is; a line that is no longer a stand-in is left alone. Returns
    /// how many were replaced.
    pub async fn replace_stand_ins(
        &self,
        thread_key: &ThreadKey,
        epoch: i64,
        nodes: &[NewNode],
    ) -> Result<u64, StoreError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        Store::check_epoch_in(&mut tx, self.backend, thread_key, epoch).await?;
        let mut replaced = 0;
        for node in nodes {
            replaced += sqlx::query(
                "UPDATE tree_nodes SET text = $1, summarizer = $2, calls = $3, created_at = $4, \
                 dropped = $5 WHERE thread_key = $6 AND level = $7 AND idx = $8 AND summarizer = $9",
            )
            .bind(storable_text(&node.text).into_owned())
            .bind(&node.summarizer)
            .bind(i64::from(node.calls))
            .bind(now)
            .bind(&node.dropped)
            .bind(thread_key.as_str())
            .bind(i64::from(node.node.level))
            .bind(node.node.index as i64)
            .bind(STAND_IN)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok(replaced)
    }

    /// How many nodes the thread has, the model calls they cost, and how many a summarizer
    /// wrote (the rest are free nodes, their source word for word).
    async fn tree_costs(&self, thread_key: &ThreadKey) -> Result<(i64, i64, i64), StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS nodes, \
             CAST(COALESCE(SUM(calls), 0) AS BIGINT) AS calls, \
             CAST(COALESCE(SUM(CASE WHEN summarizer = 'verbatim' THEN 0 ELSE 1 END), 0) AS BIGINT) \
             AS summarized FROM tree_nodes WHERE thread_key = $1",
        )
        .bind(thread_key.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok((
            row.try_get("nodes")?,
            row.try_get("calls")?,
            row.try_get("summarized")?,
        ))
    }

    /// The outline's stored tiles and version (an empty outline at version 0 when none).
    pub async fn outline_state(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<(Outline, i64), StoreError> {
        let row = sqlx::query("SELECT tiles, version FROM outlines WHERE thread_key = $1")
            .bind(thread_key.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else {
            return Ok((Outline::default(), 0));
        };
        let tiles: String = row.try_get("tiles")?;
        let pairs: Vec<(u32, u64)> = serde_json::from_str(&tiles)
            .map_err(|e| StoreError::Corrupt(format!("outline tiles: {e}")))?;
        let outline = Outline::new(
            pairs
                .into_iter()
                .map(|(level, index)| NodeId::new(level, index))
                .collect(),
        );
        Ok((outline, row.try_get("version")?))
    }

    /// Replaces the outline's state if it is still at `expected_version`; `false` when another
    /// writer changed it first (the caller reads again).
    pub async fn save_outline(
        &self,
        thread_key: &ThreadKey,
        outline: &Outline,
        expected_version: i64,
    ) -> Result<bool, StoreError> {
        let tiles: Vec<(u32, u64)> = outline.tiles.iter().map(|n| (n.level, n.index)).collect();
        let tiles =
            serde_json::to_string(&tiles).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let now = now_millis();
        let boundary = outline.boundary() as i64;
        let mut tx = self.writer.begin().await?;
        if !Store::thread_exists_in(&mut tx, self.backend, thread_key).await? {
            return Err(StoreError::ThreadNotFound);
        }
        let previous: Option<i64> =
            sqlx::query_scalar("SELECT boundary FROM outlines WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let changed = if expected_version == 0 {
            sqlx::query(
                "INSERT INTO outlines (thread_key, tiles, boundary, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) ON CONFLICT (thread_key) DO NOTHING",
            )
            .bind(thread_key.as_str())
            .bind(&tiles)
            .bind(boundary)
            .bind(now)
            .execute(&mut *tx)
            .await?
        } else {
            sqlx::query(
                "UPDATE outlines SET tiles = $1, boundary = $2, version = version + 1, \
                 updated_at = $3 WHERE thread_key = $4 AND version = $5",
            )
            .bind(&tiles)
            .bind(boundary)
            .bind(now)
            .bind(thread_key.as_str())
            .bind(expected_version)
            .execute(&mut *tx)
            .await?
        };
        let saved = changed.rows_affected() == 1;
        if saved {
            // Followers and webhooks learn that the outline moved (never what it says).
            super::events::record_event(
                &mut tx,
                thread_key.as_str(),
                "outline",
                &serde_json::json!({"boundary": boundary, "version": expected_version + 1}),
                now,
            )
            .await?;
        }
        if saved && previous.unwrap_or(0) != boundary {
            // A merge: kept so that the economics chart can mark each one where it happened.
            sqlx::query(
                "INSERT INTO outline_merges (thread_key, at_seq, boundary) \
                 SELECT thread_key, next_seq, $2 FROM threads WHERE thread_key = $1 \
                 ON CONFLICT DO NOTHING",
            )
            .bind(thread_key.as_str())
            .bind(boundary)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if saved {
            let named =
                sqlx::query("SELECT tenant_id, thread_id FROM threads WHERE thread_key = $1")
                    .bind(thread_key.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
            if let Some(row) = named {
                self.changes.changed(
                    &TenantId(row.try_get("tenant_id")?),
                    &ThreadId::new(row.try_get::<String, _>("thread_id")?),
                );
            }
        }
        Ok(saved)
    }

    /// The seqs at which the outline's boundary moved after `after_seq`, in order, at most
    /// `limit` of them.
    pub async fn outline_merges(
        &self,
        thread_key: &ThreadKey,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let seqs: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT at_seq FROM outline_merges WHERE thread_key = $1 AND at_seq > $2 \
             ORDER BY at_seq LIMIT $3",
        )
        .bind(thread_key.as_str())
        .bind(after_seq)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        Ok(seqs)
    }

    /// Texts of the given nodes (one indexed query per level present).
    pub async fn tree_node_texts(
        &self,
        thread_key: &ThreadKey,
        nodes: &[NodeId],
    ) -> Result<HashMap<NodeId, String>, StoreError> {
        Ok(self
            .tree_node_rows(thread_key, nodes)
            .await?
            .into_iter()
            .map(|(node, row)| (node, row.text))
            .collect())
    }

    /// Text and summarizer (`verbatim` for a free node) of the given nodes, one indexed query per
    /// level present.
    async fn tree_node_rows(
        &self,
        thread_key: &ThreadKey,
        nodes: &[NodeId],
    ) -> Result<HashMap<NodeId, NodeRow>, StoreError> {
        let mut by_level: HashMap<u32, Vec<u64>> = HashMap::new();
        for node in nodes {
            by_level.entry(node.level).or_default().push(node.index);
        }
        let mut rows = HashMap::with_capacity(nodes.len());
        for (level, indexes) in by_level {
            for chunk in indexes.chunks(500) {
                let placeholders: Vec<String> =
                    (0..chunk.len()).map(|i| format!("${}", i + 3)).collect();
                let sql = format!(
                    "SELECT idx, text, summarizer, dropped FROM tree_nodes WHERE thread_key = $1 \
                     AND level = $2 AND idx IN ({})",
                    placeholders.join(", ")
                );
                let mut query = sqlx::query(&sql)
                    .bind(thread_key.as_str())
                    .bind(i64::from(level));
                for index in chunk {
                    query = query.bind(*index as i64);
                }
                for row in query.fetch_all(&self.pool).await? {
                    let idx: i64 = row.try_get("idx")?;
                    let node = NodeRow {
                        text: row.try_get("text")?,
                        summarizer: row.try_get("summarizer")?,
                        dropped: row.try_get("dropped")?,
                    };
                    rows.insert(NodeId::new(level, idx as u64), node);
                }
            }
        }
        Ok(rows)
    }

    /// The thread's outline with its lines' texts, for the context view and the outline page
    /// (the options are in the thread's settings, which both callers read anyway).
    pub async fn outline_snapshot(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<OutlineSnapshot, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (outline, version) = self.outline_state(&head.thread_key).await?;
        let rows = self
            .tree_node_rows(&head.thread_key, &outline.tiles)
            .await?;
        // A tile with no text covers only entries the model never sees: it takes no line.
        let mut dropped = BTreeMap::new();
        let (lines, summarizers) = outline
            .tiles
            .iter()
            .filter_map(|node| {
                let row = rows.get(node)?;
                add_counts(&row.dropped, &mut dropped);
                (!row.text.trim().is_empty())
                    .then(|| ((*node, row.text.clone()), row.summarizer.clone()))
            })
            .unzip();
        Ok(OutlineSnapshot {
            thread_key: head.thread_key,
            next_seq: head.next_seq,
            outline,
            version,
            lines,
            summarizers,
            footer: outline_footer(&dropped),
        })
    }

    /// `zoom(id, n)` on the thread: the thread's head, then two indexed reads at most, whatever
    /// the size of the thread. The inner error is the model's mistake, in words it can correct.
    pub async fn zoom_read(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        id: i64,
        n: i64,
    ) -> Result<Result<ZoomRead, crate::tree::ZoomError>, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let target = match crate::tree::plan_zoom(id, n, head.next_seq.max(0) as u64) {
            Ok(target) => target,
            Err(error) => return Ok(Err(error)),
        };
        Ok(Ok(match target {
            crate::tree::ZoomTarget::Message(seq) => {
                let row = sqlx::query(
                    "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND seq = $2",
                )
                .bind(head.thread_key.as_str())
                .bind(seq as i64)
                .fetch_optional(&self.pool)
                .await?;
                let entry = row.map(|row| entry_from_row(&row)).transpose()?;
                let snipped = match entry.as_ref().and_then(|entry| entry.uuid.as_ref()) {
                    Some(uuid) => self
                        .thread_snipped_uuids(&head.thread_key)
                        .await?
                        .contains(uuid),
                    None => false,
                };
                if snipped {
                    ZoomRead::Hidden
                } else if entry.as_ref().is_some_and(|entry| entry.is_erased()) {
                    ZoomRead::Erased
                } else {
                    ZoomRead::Message(entry.map(Box::new))
                }
            }
            crate::tree::ZoomTarget::Halves(left, right) => {
                let text = |node: NodeId| {
                    sqlx::query_scalar::<_, String>(
                        "SELECT text FROM tree_nodes WHERE thread_key = $1 AND level = $2 \
                         AND idx = $3",
                    )
                    .bind(head.thread_key.as_str().to_owned())
                    .bind(i64::from(node.level))
                    .bind(node.index as i64)
                    .fetch_optional(&self.pool)
                };
                ZoomRead::Halves(
                    text(left).await?.map(|t| (left, t)),
                    text(right).await?.map(|t| (right, t)),
                )
            }
        }))
    }

    /// The next seq of the thread with this key (for jobs, which name threads by key).
    pub async fn next_seq_by_key(&self, thread_key: &ThreadKey) -> Result<i64, StoreError> {
        let next: Option<i64> =
            sqlx::query_scalar("SELECT next_seq FROM threads WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&self.pool)
                .await?;
        next.ok_or(StoreError::ThreadNotFound)
    }

    /// The thread's stored outline options (`None`: never set).
    pub async fn outline_options_of(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<Option<OutlineOptions>, StoreError> {
        let json: Option<Option<String>> =
            sqlx::query_scalar("SELECT outline FROM thread_settings WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&self.pool)
                .await?;
        super::settings::outline_column(json.flatten())
    }

    /// The thread's clearing options, when it clears: the outline's tail counts what it sends.
    pub async fn clearing_options_of(
        &self,
        thread_key: &ThreadKey,
    ) -> Result<Option<crate::history::normalize::ClearingOptions>, StoreError> {
        let json: Option<Option<String>> =
            sqlx::query_scalar("SELECT clearing FROM thread_settings WHERE thread_key = $1")
                .bind(thread_key.as_str())
                .fetch_optional(&self.pool)
                .await?;
        super::settings::clearing_column(json.flatten())
    }
}

/// How lines are rebuilt without a model when text leaves the tree.
pub trait StandIns: Send + Sync {
    /// A parent's line from its two children's.
    fn merge(&self, left: &str, right: &str) -> String;
    /// A message's own line (empty when the model never sees it).
    fn leaf(&self, entry: &Entry) -> String;
}

/// The lines before a line that its summarizer read as context (a tree job gives a model the
/// non-empty lines just before the one it writes, at the level it reads): a line a model wrote
/// within this many of a hidden one may quote it.
pub const LINE_CONTEXT_LINES: usize = 8;

/// Hides the messages at `hidden` from the tree in the caller's transaction, and rebuilds the
/// lines of the messages at `rewritten` (their text changed in place: a compaction summary
/// derived again): the hidden level-0 lines become empty (summarizer `hidden`), the rewritten
/// ones are rebuilt from their messages, and every line that may hold the old text is rebuilt
/// without a model (summarizer `stand-in`), bottom up: the built ancestors, from their
/// children; and the lines a model wrote with a changed line among its context
/// ([`LINE_CONTEXT_LINES`]), a leaf from its message, a parent from its children. Returns the
/// nodes rewritten.
pub(crate) async fn hide_in_tree_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    thread_key: &ThreadKey,
    hidden: &[u64],
    rewritten_leaves: &[u64],
    stand_ins: &dyn StandIns,
    now: i64,
) -> Result<u64, StoreError> {
    use std::collections::BTreeSet;
    let mut rewritten = 0;
    let hidden: BTreeSet<u64> = hidden.iter().copied().collect();
    for &seq in &hidden {
        rewritten += sqlx::query(
            "UPDATE tree_nodes SET text = '', summarizer = $1, calls = 0, created_at = $2, \
             dropped = '' WHERE thread_key = $3 AND level = 0 AND idx = $4",
        )
        .bind(HIDDEN)
        .bind(now)
        .bind(thread_key.as_str())
        .bind(seq as i64)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    }
    // Leaves rebuilt from their messages: those rewritten (whoever wrote their line), and
    // those a model wrote with a changed leaf in its context.
    let mut changed: BTreeSet<u64> = hidden.clone();
    changed.extend(rewritten_leaves.iter().copied());
    let mut leaves: Vec<(u64, Rewrite)> = rewritten_leaves
        .iter()
        .filter(|seq| !hidden.contains(seq))
        .map(|&seq| (seq, Rewrite::Any))
        .collect();
    for index in read_with_context(tx, thread_key, 0, &changed).await? {
        if !changed.contains(&index) {
            leaves.push((index, Rewrite::ModelWritten));
        }
    }
    let mut dirty = hidden.clone();
    for (index, which) in leaves {
        let row = sqlx::query(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND seq = $2",
        )
        .bind(thread_key.as_str())
        .bind(index as i64)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else { continue };
        let text = stand_ins.leaf(&entry_from_row(&row)?);
        let node = NodeId::leaf(index);
        let done = rewrite_line(tx, thread_key, node, &text, now, which).await?;
        if done > 0 {
            rewritten += done;
            dirty.insert(index);
        }
    }
    for level in 1..64_u32 {
        // The built parents of dirty lines, and the lines a model wrote whose context (the
        // lines before their children) held one.
        let mut parents: BTreeSet<(u64, Rewrite)> = dirty
            .iter()
            .map(|index| (index / 2, Rewrite::Any))
            .collect();
        for child in read_with_context(tx, thread_key, level - 1, &dirty).await? {
            if child % 2 == 0 {
                parents.insert((child / 2, Rewrite::ModelWritten));
            }
        }
        let mut built = BTreeSet::new();
        for (index, which) in parents {
            if built.contains(&index) {
                continue;
            }
            let children: Vec<(i64, String)> = sqlx::query_as(
                "SELECT idx, text FROM tree_nodes WHERE thread_key = $1 AND level = $2 \
                 AND idx >= $3 AND idx <= $4 ORDER BY idx",
            )
            .bind(thread_key.as_str())
            .bind(i64::from(level - 1))
            .bind((index * 2) as i64)
            .bind((index * 2 + 1) as i64)
            .fetch_all(&mut **tx)
            .await?;
            // A parent is built only once both children are: a path stops at a missing node.
            let [(_, left), (_, right)] = children.as_slice() else {
                continue;
            };
            let text = stand_ins.merge(left, right);
            let node = NodeId::new(level, index);
            let changed = rewrite_line(tx, thread_key, node, &text, now, which).await?;
            if changed > 0 {
                rewritten += changed;
                built.insert(index);
            }
        }
        if built.is_empty() {
            break;
        }
        dirty = built;
    }
    // Outline reads built from the old lines are not reused.
    sqlx::query("UPDATE outlines SET version = version + 1 WHERE thread_key = $1")
        .bind(thread_key.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(rewritten)
}

/// Which lines [`rewrite_line`] replaces.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rewrite {
    /// The line, whoever wrote it.
    Any,
    /// Only a line a model wrote (it cost calls): a free or extractive line quotes nothing
    /// from its context.
    ModelWritten,
}

/// Replaces the line of `node` with a stand-in; returns 1 when it did.
async fn rewrite_line(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    thread_key: &ThreadKey,
    node: NodeId,
    text: &str,
    now: i64,
    which: Rewrite,
) -> Result<u64, StoreError> {
    let only_model = if which == Rewrite::ModelWritten {
        " AND calls > 0"
    } else {
        ""
    };
    Ok(sqlx::query(&format!(
        "UPDATE tree_nodes SET text = $1, summarizer = $2, calls = 0, created_at = $3, \
         dropped = '' WHERE thread_key = $4 AND level = $5 AND idx = $6{only_model}"
    ))
    .bind(storable_text(text).into_owned())
    .bind(STAND_IN)
    .bind(now)
    .bind(thread_key.as_str())
    .bind(i64::from(node.level))
    .bind(node.index as i64)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}

/// The indexes at `level` after each of `dirty` that a summarizer may have read one of `dirty`
/// as context for: those with fewer than [`LINE_CONTEXT_LINES`] non-empty lines between
/// (counted as the lines are now, which can only make more of them qualify).
async fn read_with_context(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    thread_key: &ThreadKey,
    level: u32,
    dirty: &std::collections::BTreeSet<u64>,
) -> Result<std::collections::BTreeSet<u64>, StoreError> {
    let mut reached = std::collections::BTreeSet::new();
    // Empty lines (entries the model never sees: a progress flood) do not count: read on, a
    // page at a time, until enough lines or a gap.
    const PAGE: i64 = 256;
    for &from in dirty {
        let mut lines_between = 0;
        let mut next = from + 1;
        'pages: loop {
            let rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT idx, text FROM tree_nodes WHERE thread_key = $1 AND level = $2 \
                 AND idx >= $3 ORDER BY idx LIMIT $4",
            )
            .bind(thread_key.as_str())
            .bind(i64::from(level))
            .bind(next as i64)
            .bind(PAGE)
            .fetch_all(&mut **tx)
            .await?;
            let full = rows.len() as i64 == PAGE;
            for (index, text) in rows {
                // A gap: nothing was built past it, so nothing read past it either.
                if index as u64 != next || lines_between >= LINE_CONTEXT_LINES {
                    break 'pages;
                }
                reached.insert(next);
                if !text.trim().is_empty() && !dirty.contains(&next) {
                    lines_between += 1;
                }
                next += 1;
            }
            if !full {
                break;
            }
        }
    }
    Ok(reached)
}
