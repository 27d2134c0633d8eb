//! Messages: atomic, idempotent appends and paging.

use std::collections::hash_map::Entry as Slot;
use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Row};

use super::group_commit::QueuedAppend;
use super::{now_millis, Store, StoreError, TenantId};
use crate::history::model::Entry;
use crate::history::normalize::{context_entry_tokens, usage_tokens};

type AnyQuery<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// A batch to append to one thread.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub entries: Vec<Entry>,
    /// Compare-and-append: fail with [`StoreError::SeqConflict`] unless the thread's next seq
    /// is this value.
    pub expected_next_seq: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct AppendOutcome {
    /// The stored messages, with their `seq`, `uuid` and `created_at`.
    pub messages: Vec<Entry>,
    /// True when every message was already stored (an idempotent retry): nothing was written.
    pub replayed: bool,
    pub next_seq: i64,
    /// The compaction job this append enqueued (or found pending) because it pushed the
    /// context's estimated tokens past the auto-compaction threshold.
    pub auto_compaction_job: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MessagePage {
    pub messages: Vec<Entry>,
    /// The thread's next seq at the time of the read.
    pub next_seq: i64,
}

/// Rows per INSERT statement; keeps the bind count under every backend's limit.
pub(super) const INSERT_CHUNK: usize = 200;

/// An entry ready to be written.
pub(super) struct Prepared {
    pub(super) entry: Entry,
    pub(super) uuid: String,
    /// The client named the uuid (a generated one cannot be stored already).
    uuid_sent: bool,
    pub(super) content_hash: String,
    pub(super) body: String,
}

/// Fills the uuid, fingerprints what the client sent, then fills `created_at`.
/// The fingerprint is taken before the server's defaults so a retry of the same request matches.
fn prepare(mut entry: Entry, now: chrono::DateTime<chrono::Utc>) -> Result<Prepared, StoreError> {
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

/// A whole batch, prepared before any statement runs (uuids, fingerprints, bodies, its token
/// estimate), so its group is decided in memory between the group's reads and writes.
pub(super) struct PreparedBatch {
    pub(super) entries: Vec<Prepared>,
    tokens: BatchTokens,
    /// The bytes of its bodies, as the thread's `stored_bytes` counts them.
    bytes: i64,
    now: chrono::DateTime<chrono::Utc>,
}

impl PreparedBatch {
    pub(super) fn new(
        entries: Vec<Entry>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, StoreError> {
        let entries = entries
            .into_iter()
            .map(|entry| prepare(entry, now))
            .collect::<Result<Vec<_>, _>>()?;
        let mut uuids = HashSet::with_capacity(entries.len());
        if let Some(duplicate) = entries.iter().find(|p| !uuids.insert(p.uuid.as_str())) {
            return Err(StoreError::DuplicateUuid(duplicate.uuid.clone()));
        }
        let tokens = context_tokens_of(entries.iter().map(|p| &p.entry));
        let bytes = entries.iter().map(|p| p.body.len() as i64).sum();
        Ok(PreparedBatch {
            entries,
            tokens,
            bytes,
            now,
        })
    }

    fn len(&self) -> i64 {
        self.entries.len() as i64
    }

    /// Snips alone: what a thread at its byte limit may still take, within
    /// [`SNIP_HEADROOM_BYTES`] past it.
    fn is_snips(&self) -> bool {
        self.entries.iter().all(|p| p.entry.is_snip())
    }
}

/// Bytes past `--max-thread-bytes` a thread may take in snips alone, so that a thread at its limit
/// can still hide what it holds. A bound, not an exception: a snip can carry anything, so without
/// it snips would be a way around the limit.
pub const SNIP_HEADROOM_BYTES: i64 = 1024 * 1024;

/// What one append did inside its group's transaction.
pub(super) enum AppendStep {
    Written {
        messages: Vec<Entry>,
        next_seq: i64,
        auto_compaction_job: Option<String>,
    },
    /// Every entry was already stored: an idempotent retry, to be rolled back.
    Replayed {
        thread_key: String,
        next_seq: i64,
        uuids: Vec<String>,
    },
}

/// What the group writer decided for one append.
pub(super) enum Planned {
    Write {
        first_seq: i64,
        /// The thread's estimate before this append, for its triggers.
        tokens_before: i64,
        auto_compaction_job: Option<String>,
        /// A job was created, so a worker should wake once the group commits.
        jobs_created: bool,
    },
    /// Every entry is stored already: an idempotent retry, nothing written.
    Replay {
        thread_key: String,
        next_seq: i64,
    },
    Refused(StoreError),
}

impl Planned {
    /// The append's answer once its group committed: the written entries get their seqs.
    pub(super) fn into_step(self, batch: PreparedBatch) -> Result<AppendStep, StoreError> {
        match self {
            Planned::Write {
                first_seq,
                auto_compaction_job,
                ..
            } => Ok(AppendStep::Written {
                next_seq: first_seq + batch.len(),
                messages: numbered(batch.entries, first_seq),
                auto_compaction_job,
            }),
            Planned::Replay {
                thread_key,
                next_seq,
            } => Ok(AppendStep::Replayed {
                thread_key,
                next_seq,
                uuids: batch.entries.into_iter().map(|p| p.uuid).collect(),
            }),
            Planned::Refused(error) => Err(error),
        }
    }

    pub(super) fn writes(&self) -> bool {
        matches!(self, Planned::Write { .. })
    }
}

/// One thread of a group, as read under its lock and then moved on by each append written.
pub(super) struct GroupThread {
    pub(super) thread_key: String,
    /// `next_seq` as read, before the group's appends moved it on.
    pub(super) read_next_seq: i64,
    pub(super) next_seq: i64,
    pub(super) visible_count: i64,
    pub(super) context_tokens: i64,
    pub(super) stored_bytes: i64,
    pub(super) triggers: AppendTriggers,
    /// When an append of the group last wrote to it; `None` leaves the row as it was.
    pub(super) updated_at: Option<i64>,
    /// The uuids the group named that the thread holds, stored before the group or written by
    /// its earlier appends, with their seq and fingerprint.
    pub(super) known: HashMap<String, (i64, String)>,
}

impl GroupThread {
    /// The thread as its row was read: `[next_seq, visible_count, context_tokens,
    /// stored_bytes]`.
    pub(super) fn new(thread_key: String, counters: [i64; 4], triggers: AppendTriggers) -> Self {
        let [next_seq, visible_count, context_tokens, stored_bytes] = counters;
        GroupThread {
            thread_key,
            read_next_seq: next_seq,
            next_seq,
            visible_count,
            context_tokens,
            stored_bytes,
            triggers,
            updated_at: None,
            known: HashMap::new(),
        }
    }
}

/// Who begins and ends a group's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bracket {
    /// The group's own statements do: `BEGIN IMMEDIATE` goes with the read and `COMMIT` with
    /// the write, two calls fewer. SQLite only, which runs statements sent together in one call.
    Inline,
    /// The caller's transaction (PostgreSQL, which takes one statement a call).
    Caller,
}

/// How a group finds out which of the uuids its clients named are stored already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UuidCheck {
    /// The group's read looks them up with its threads.
    Read,
    /// Not read: the insert leaves out a row whose uuid is stored and says how many it wrote.
    /// Fewer than planned means an append may be a replay or a conflict, and so may an append
    /// refused for its `expected_next_seq` (a retry of an append that was written: its replay
    /// comes first). Either way ([`GroupOutcome::ReadUuids`]) the caller rolls the group back
    /// and writes it again with [`UuidCheck::Read`].
    /// A retry is rare, and on PostgreSQL the lookup was most of the read's time: its plan,
    /// cached per connection, is only as good as the statistics it was made with, and a plan
    /// made on a young table scans every message (BENCHMARKS.md). PostgreSQL only, for groups
    /// whose rows go in one statement.
    OnInsert,
}

/// Whether a group's read locks its threads' rows (PostgreSQL; SQLite's write lock is the file's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RowLock {
    ForUpdate,
    /// A plain read: the unlocked group (`pg_group`) checks at its write that nothing moved.
    None,
}

/// What [`Store::write_group`] did.
pub(super) enum GroupOutcome {
    /// Every append decided, and the writes done (not committed).
    Planned(Vec<Planned>),
    /// With [`UuidCheck::OnInsert`], an append's outcome depends on what the uuids it named hold:
    /// nothing may be kept, and the group is decided again reading them.
    ReadUuids,
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

impl Store {
    /// Appends a batch atomically: all of it or nothing.
    ///
    /// Retries are idempotent: a batch whose uuids are all stored with the same content returns
    /// the stored messages and writes nothing. A uuid stored with other content is a conflict,
    /// and so is a batch that is only partly stored (it cannot be the retry of one atomic append).
    pub async fn append(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        request: AppendRequest,
    ) -> Result<AppendOutcome, StoreError> {
        // Times are stored in milliseconds: the answer shows what a later read will.
        let now = chrono::DateTime::from_timestamp_millis(now_millis()).unwrap_or_default();
        let batch = PreparedBatch::new(request.entries, now)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.group_commit.submit(
            self,
            QueuedAppend {
                tenant: tenant.clone(),
                thread_id: thread_id.to_owned(),
                batch,
                expected_next_seq: request.expected_next_seq,
                reply,
            },
        );
        let step = answer.await.map_err(|_| StoreError::CommitFailed {
            message: "the append's group was abandoned".to_owned(),
            transient: true,
        })??;
        match step {
            AppendStep::Written {
                messages,
                next_seq,
                auto_compaction_job,
            } => Ok(AppendOutcome {
                messages,
                replayed: false,
                next_seq,
                auto_compaction_job,
            }),
            AppendStep::Replayed {
                thread_key,
                next_seq,
                uuids,
            } => {
                let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
                let messages = self.messages_by_uuid(&thread_key, &uuids).await?;
                Ok(AppendOutcome {
                    messages,
                    replayed: true,
                    next_seq,
                    auto_compaction_job: None,
                })
            }
        }
    }

    /// Writes a whole group of appends with a fixed number of statements, however many appends
    /// it holds: read the group's threads and the uuids they name, insert every new row, move
    /// every thread's counters. Each append is decided in memory, in queue order, against its
    /// thread as the earlier appends of the group left it: a refusal or a replay writes nothing
    /// and leaves the others alone. Jobs the appends trigger are enqueued before the rows, in the
    /// same transaction, so that the rows' call can end it. An `Err` is a statement that failed:
    /// nothing of the group may be kept, and with [`Bracket::Inline`] the transaction may still
    /// be open.
    pub(super) async fn write_group(
        &self,
        conn: &mut AnyConnection,
        group: &[QueuedAppend],
        bracket: Bracket,
        check: UuidCheck,
    ) -> Result<GroupOutcome, StoreError> {
        let mut threads = read_group(
            conn,
            self.backend,
            group,
            self.append_defaults(),
            bracket,
            check,
            RowLock::ForUpdate,
        )
        .await?;
        let mut rows = Vec::new();
        let mut plans = plan_group(group, &mut threads, &mut rows);
        if check == UuidCheck::OnInsert && may_be_replays(group, &plans) {
            return Ok(GroupOutcome::ReadUuids);
        }
        for (append, plan) in group.iter().zip(&mut plans) {
            if let Planned::Write {
                tokens_before,
                auto_compaction_job,
                jobs_created,
                ..
            } = plan
            {
                let thread = &threads[&thread_of(append)];
                let jobs = self
                    .enqueue_triggered_jobs(conn, append, thread, *tokens_before)
                    .await?;
                *auto_compaction_job = jobs.auto_compaction;
                *jobs_created = jobs.created;
            }
        }
        if plans.iter().any(Planned::writes) {
            let inserted =
                write_rows(conn, self.backend, &rows, threads.values(), bracket, check).await?;
            if inserted.is_some_and(|inserted| inserted < rows.len()) {
                return Ok(GroupOutcome::ReadUuids);
            }
        } else if bracket == Bracket::Inline {
            // Replays and refusals only: nothing to keep.
            sqlx::query("ROLLBACK").execute(&mut *conn).await?;
        }
        Ok(GroupOutcome::Planned(plans))
    }

    /// Enqueues, in the group's transaction, what one append triggers: a compaction when the
    /// estimate crosses the thread's threshold, the tree job of an outlined thread.
    async fn enqueue_triggered_jobs(
        &self,
        conn: &mut AnyConnection,
        append: &QueuedAppend,
        thread: &GroupThread,
        tokens_before: i64,
    ) -> Result<TriggeredJobs, StoreError> {
        let mut jobs = TriggeredJobs::default();
        // One time for the backoff's check and the job it may enqueue.
        let now = now_millis();
        let compaction = CompactionTrigger::of(append, thread, tokens_before);
        let retry = compaction == CompactionTrigger::RetryIfDue
            && super::jobs::auto_compaction_due(conn, &thread.thread_key, now).await?;
        if compaction == CompactionTrigger::Crossed || retry {
            let outcome = super::jobs::enqueue_in(
                conn,
                self.backend,
                &super::NewJob {
                    tenant: append.tenant.clone(),
                    thread_key: Some(thread.thread_key.clone()),
                    kind: super::KIND_COMPACTION.to_owned(),
                    payload: super::CompactionPayload::auto(&append.thread_id).to_value(),
                    dedup_key: Some(super::jobs::compaction_dedup_key(&thread.thread_key)),
                    max_attempts: self.job_max_attempts,
                },
                now,
            )
            .await?;
            jobs.created |= outcome.created;
            jobs.auto_compaction = Some(outcome.job.id);
        }
        if thread.triggers.outlined {
            let outcome = super::jobs::enqueue_tree_in(
                conn,
                self.backend,
                &append.tenant,
                &thread.thread_key,
                self.job_max_attempts,
            )
            .await?;
            jobs.created |= outcome.created;
        }
        Ok(jobs)
    }

    /// Messages with `seq > after_seq` (all when `None`), in seq order, at most `limit`.
    pub async fn list_messages(
        &self,
        tenant: &TenantId,
        thread_id: &str,
        after_seq: Option<i64>,
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
        thread_id: &str,
        after_seq: Option<i64>,
        limit: u32,
        max_bytes: i64,
    ) -> Result<MessagePage, StoreError> {
        let head = self.thread_head(tenant, thread_id).await?;
        let (thread_key, next_seq) = (head.thread_key, head.next_seq);
        let rows = sqlx::query(&page_within_bytes("m.seq, m.uuid, m.created_at, m.body"))
            .bind(&thread_key)
            .bind(after_seq.unwrap_or(-1))
            .bind(i64::from(limit))
            .bind(max_bytes)
            .fetch_all(&self.pool)
            .await?;
        Ok(MessagePage {
            messages: rows.iter().map(entry_from_row).collect::<Result<_, _>>()?,
            next_seq,
        })
    }

    async fn messages_by_uuid(
        &self,
        thread_key: &str,
        uuids: &[&str],
    ) -> Result<Vec<Entry>, StoreError> {
        let sql = format!(
            "SELECT seq, uuid, created_at, body FROM messages WHERE thread_key = $1 AND uuid IN ({}) ORDER BY seq",
            super::list_placeholders(2, uuids.len())
        );
        let mut query = sqlx::query(&sql).bind(thread_key.to_owned());
        for uuid in uuids {
            query = query.bind(uuid.to_string());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(entry_from_row).collect()
    }
}

/// The rows with `seq > $2` of the thread `$1`, in seq order, at most `$3` of them, cut once
/// their bodies reach `$4` bytes: the sizes of the page's rows are summed first (the LIMIT
/// applies before the running sum), then only the bodies that fit are read, so what is cut off
/// is never loaded. The first row is always in, so a page always moves forward. `columns` are of
/// the messages row `m`. The sizes are `octet_length`s, which both engines read without loading
/// the value (SQLite from the record header, PostgreSQL from the TOAST pointer); `LENGTH` counts
/// characters and so loads every body it sizes.
pub(super) fn page_within_bytes(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM \
         (SELECT seq, SUM(size) OVER (ORDER BY seq) - size AS before_size FROM \
          (SELECT seq, octet_length(body) AS size FROM messages \
           WHERE thread_key = $1 AND seq > $2 ORDER BY seq LIMIT $3) sizes) page \
         JOIN messages m ON m.thread_key = $1 AND m.seq = page.seq \
         WHERE page.before_size < $4 ORDER BY m.seq"
    )
}

/// How a batch changes the running context-token estimate of its thread.
#[derive(Debug, Clone, Copy)]
enum BatchTokens {
    Add(i64),
    /// The batch holds a compact boundary: the context restarts at its last one.
    Reset(i64),
    /// The batch holds an assistant entry reporting `usage`: the estimate becomes its figures
    /// plus what follows it (`history::normalize::estimate_context` on a whole window).
    Anchor(i64),
}

fn context_tokens_of<'a>(entries: impl Iterator<Item = &'a Entry>) -> BatchTokens {
    let mut tokens = 0_i64;
    let mut reset = false;
    let mut anchored = false;
    for entry in entries {
        if entry.is_compact_boundary() {
            reset = true;
            anchored = false;
            tokens = 0;
        }
        match usage_tokens(entry) {
            Some(reported) => {
                anchored = true;
                tokens = i64::try_from(reported).unwrap_or(i64::MAX);
            }
            None => {
                let added = i64::try_from(context_entry_tokens(entry)).unwrap_or(i64::MAX);
                tokens = tokens.saturating_add(added);
            }
        }
    }
    if reset {
        BatchTokens::Reset(tokens)
    } else if anchored {
        BatchTokens::Anchor(tokens)
    } else {
        BatchTokens::Add(tokens)
    }
}

/// What the server holds every thread's appends to, where the thread's settings say nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AppendDefaults {
    /// The auto-compaction threshold, in estimated tokens; 0 disables it.
    pub(super) auto_compact_tokens: i64,
    /// Most bytes of bodies a thread may store (`--max-thread-bytes`); 0 for no limit.
    pub(super) max_thread_bytes: i64,
}

/// What an append may trigger, from the thread's settings: its auto-compaction threshold (its
/// own, else the server default) and whether it is outlined; and what it may not pass.
#[derive(Debug, Clone)]
pub(super) struct AppendTriggers {
    auto_compact_tokens: i64,
    outlined: bool,
    /// Most bytes of bodies the thread may store; 0 for no limit.
    max_stored_bytes: i64,
    /// The columns they were read from, for a write that checks they did not change.
    pub(super) columns: SettingsColumns,
}

/// A thread's `thread_settings` columns that decide what its appends trigger (NULL when it has
/// no settings row, or the column is unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SettingsColumns {
    pub(super) auto_compact_tokens: Option<i64>,
    pub(super) outline: Option<String>,
}

impl AppendTriggers {
    /// From the thread's `thread_settings` columns (NULL when it has none).
    pub(super) fn from_settings(
        own_threshold: Option<i64>,
        outline: Option<String>,
        defaults: AppendDefaults,
    ) -> Result<Self, StoreError> {
        Ok(AppendTriggers {
            auto_compact_tokens: own_threshold.unwrap_or(defaults.auto_compact_tokens),
            outlined: super::settings::outline_column(outline.clone())?
                .is_some_and(|options| options.enabled),
            max_stored_bytes: defaults.max_thread_bytes,
            columns: SettingsColumns {
                auto_compact_tokens: own_threshold,
                outline,
            },
        })
    }
}

/// The jobs an append enqueued.
#[derive(Default)]
struct TriggeredJobs {
    /// The auto-compaction job, created now or found pending or running.
    auto_compaction: Option<String>,
    /// A job was created (so a worker should wake).
    created: bool,
}

/// What one written append means for its thread's auto-compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CompactionTrigger {
    None,
    /// The estimate crossed the threshold: enqueue a compaction.
    Crossed,
    /// Still above the threshold after an attempt that failed or found nothing: enqueue again
    /// if the backoff allows it (a query).
    RetryIfDue,
}

impl CompactionTrigger {
    fn of(append: &QueuedAppend, thread: &GroupThread, tokens_before: i64) -> Self {
        let triggers = &thread.triggers;
        // An outlined thread is never auto-compacted: its outline keeps the context small, and a
        // compact boundary in its tail would cut the tail short.
        let threshold = triggers.auto_compact_tokens;
        // A batch that holds a compact boundary has just compacted the thread.
        let eligible = !matches!(append.batch.tokens, BatchTokens::Reset(_)) && !triggers.outlined;
        // The estimate right after this append (a later append of the group may move it on).
        let tokens_after = append_tokens(tokens_before, append.batch.tokens);
        if !eligible {
            CompactionTrigger::None
        } else if crosses_threshold(tokens_before, tokens_after, threshold) {
            CompactionTrigger::Crossed
        } else if threshold > 0 && tokens_after >= threshold {
            CompactionTrigger::RetryIfDue
        } else {
            CompactionTrigger::None
        }
    }
}

/// Whether any append the group writes may enqueue a job: a compaction, or an outlined
/// thread's tree job.
pub(super) fn group_needs_jobs(
    group: &[QueuedAppend],
    plans: &[Planned],
    threads: &HashMap<(&str, &str), GroupThread>,
) -> bool {
    group.iter().zip(plans).any(|(append, plan)| {
        let Planned::Write { tokens_before, .. } = plan else {
            return false;
        };
        let thread = &threads[&thread_of(append)];
        thread.triggers.outlined
            || CompactionTrigger::of(append, thread, *tokens_before) != CompactionTrigger::None
    })
}

/// Auto-compaction fires once, on the append that takes the estimate from below the threshold to
/// at or above it (0 = off).
fn crosses_threshold(before: i64, after: i64, threshold: i64) -> bool {
    threshold > 0 && before < threshold && after >= threshold
}

/// The estimate after a batch, from the one before it.
fn append_tokens(before: i64, tokens: BatchTokens) -> i64 {
    match tokens {
        BatchTokens::Add(added) => before.saturating_add(added),
        BatchTokens::Reset(tokens) | BatchTokens::Anchor(tokens) => tokens,
    }
}

/// Most uuids looked up in the statement that locks a PostgreSQL group's threads.
const MAX_JOINED_UUIDS: usize = 1_000;

/// The (tenant, thread id) an append goes to: how a group's threads are keyed.
pub(super) fn thread_of(append: &QueuedAppend) -> (&str, &str) {
    (append.tenant.0.as_str(), append.thread_id.as_str())
}

/// The statement that reads a group's threads and named uuids, and what it binds: each thread's
/// (tenant, thread id), in `keys` order, then `uuids` (empty when they are too many to join,
/// `joined` false: they are looked up in chunks after it).
pub(super) struct GroupRead<'g> {
    pub sql: String,
    /// The keys go as one JSON array of `{t, i}` objects (tenant, thread id), not bound pairs.
    pub keys_json: bool,
    pub keys: Vec<(&'g str, &'g str)>,
    /// Every uuid the group's clients named, with the thread it was named for.
    pub named: Vec<((&'g str, &'g str), &'g str)>,
    pub uuids: Vec<&'g str>,
    pub joined: bool,
}

pub(super) fn read_group_sql(
    backend: super::Backend,
    group: &[QueuedAppend],
    bracket: Bracket,
    check: UuidCheck,
    lock: RowLock,
) -> GroupRead<'_> {
    let mut keys: Vec<(&str, &str)> = group.iter().map(thread_of).collect();
    keys.sort_unstable();
    keys.dedup();
    // PostgreSQL takes the keys as one JSON array, so that every group, whatever its size, runs
    // one prepared statement with one cached plan: a list of terms is a new statement per size,
    // planned again at each run (a fifth of a group's time in the database).
    let keys_json = backend == super::Backend::Postgres;
    let (from, terms) = if keys_json {
        (
            "json_to_recordset($1::json) AS k(t text, i text) \
             JOIN threads ON threads.tenant_id = k.t AND threads.thread_id = k.i",
            "TRUE".to_owned(),
        )
    } else {
        let terms = (0..keys.len())
            .map(|i| {
                format!(
                    "(threads.tenant_id = ${} AND threads.thread_id = ${})",
                    2 * i + 1,
                    2 * i + 2
                )
            })
            .collect::<Vec<_>>()
            .join(" OR ");
        ("threads", terms)
    };
    let first_uuid = if keys_json { 2 } else { 2 * keys.len() + 1 };
    // Only uuids the client named are looked up: a generated one is new.
    let named: Vec<((&str, &str), &str)> = group
        .iter()
        .filter(|_| check == UuidCheck::Read)
        .flat_map(|append| {
            let key = thread_of(append);
            let sent = append.batch.entries.iter().filter(|p| p.uuid_sent);
            sent.map(move |p| (key, p.uuid.as_str()))
        })
        .collect();
    let mut uuids: Vec<&str> = named.iter().map(|(_, uuid)| *uuid).collect();
    uuids.sort_unstable();
    uuids.dedup();
    // A huge batch's uuids are looked up in chunks instead, below every bind limit. So are a
    // PostgreSQL group's under row locks: a statement that waited for a lock reads the locked
    // rows as the other writer committed them but every other table as it stood when the
    // statement began, so a joined lookup would miss the uuids that writer just stored; the
    // lookup after the lock is a statement of its own, which sees them.
    let locked_on_postgres = backend == super::Backend::Postgres && lock == RowLock::ForUpdate;
    let joined = uuids.len() <= MAX_JOINED_UUIDS && !locked_on_postgres;
    if !joined {
        uuids.clear();
    }
    let (materialized, lock) = match (backend, lock) {
        (super::Backend::Postgres, RowLock::ForUpdate) => ("MATERIALIZED", "FOR UPDATE OF threads"),
        _ => ("", ""),
    };
    let begin = match bracket {
        Bracket::Inline => "BEGIN IMMEDIATE; ",
        Bracket::Caller => "",
    };
    let locked = format!(
        "{begin}WITH locked AS {materialized} (\
         SELECT threads.thread_key, threads.tenant_id, threads.thread_id, threads.next_seq, \
         threads.visible_count, threads.context_tokens, threads.stored_bytes, \
         s.auto_compact_tokens, s.outline \
         FROM {from} LEFT JOIN thread_settings s ON s.thread_key = threads.thread_key \
         WHERE {terms} ORDER BY threads.tenant_id, threads.thread_id {lock})"
    );
    // A uuid is looked up in every thread of the group; a match in another thread than the one
    // it was named for is never asked for.
    let sql = if uuids.is_empty() {
        format!(
            "{locked} SELECT locked.*, NULL AS uuid, NULL AS seq, NULL AS content_hash FROM locked"
        )
    } else {
        format!(
            "{locked} SELECT locked.*, m.uuid, m.seq, m.content_hash FROM locked \
             LEFT JOIN messages m ON m.thread_key = locked.thread_key AND m.uuid IN ({})",
            super::list_placeholders(first_uuid, uuids.len())
        )
    };
    GroupRead {
        sql,
        keys_json,
        keys,
        named,
        uuids,
        joined,
    }
}

/// Reads every thread the group appends to, with its settings and the uuids the group names, in
/// one statement (up to [`MAX_JOINED_UUIDS`] uuids, and not under PostgreSQL's row locks; else
/// the uuids are looked up in chunks after it). On
/// SQLite the write lock is taken first, by the `BEGIN IMMEDIATE` sent with it
/// ([`Bracket::Inline`]), so no other process on the file can write between the group's read
/// and its writes; on PostgreSQL this statement locks the rows, in (tenant, thread) order, the
/// same in every runner, so concurrent groups cannot deadlock. Another tenant's thread is not
/// found.
pub(super) async fn read_group<'g>(
    conn: &mut AnyConnection,
    backend: super::Backend,
    group: &'g [QueuedAppend],
    defaults: AppendDefaults,
    bracket: Bracket,
    check: UuidCheck,
    lock: RowLock,
) -> Result<HashMap<(&'g str, &'g str), GroupThread>, StoreError> {
    let GroupRead {
        sql,
        keys_json,
        keys,
        named,
        uuids,
        joined,
    } = read_group_sql(backend, group, bracket, check, lock);
    let mut query = sqlx::query(&sql);
    if keys_json {
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|(tenant, thread_id)| serde_json::json!({"t": tenant, "i": thread_id}))
            .collect();
        query = query.bind(serde_json::Value::Array(keys).to_string());
    } else {
        for (tenant, thread_id) in &keys {
            query = query.bind(tenant.to_string()).bind(thread_id.to_string());
        }
    }
    for uuid in &uuids {
        query = query.bind(uuid.to_string());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut threads: HashMap<(&str, &str), GroupThread> = HashMap::with_capacity(keys.len());
    for row in rows {
        let (tenant, thread_id): (String, String) =
            (row.try_get("tenant_id")?, row.try_get("thread_id")?);
        // The map borrows its keys from the group, which outlives it.
        let Some(&key) = keys.iter().find(|k| k.0 == tenant && k.1 == thread_id) else {
            continue;
        };
        // On PostgreSQL a thread comes once per uuid found in it.
        let thread = match threads.entry(key) {
            Slot::Occupied(known) => known.into_mut(),
            Slot::Vacant(new) => new.insert(GroupThread::new(
                row.try_get("thread_key")?,
                [
                    row.try_get("next_seq")?,
                    row.try_get("visible_count")?,
                    row.try_get("context_tokens")?,
                    row.try_get("stored_bytes")?,
                ],
                AppendTriggers::from_settings(
                    row.try_get("auto_compact_tokens")?,
                    row.try_get("outline")?,
                    defaults,
                )?,
            )),
        };
        if joined {
            if let Some(uuid) = row.try_get::<Option<String>, _>("uuid")? {
                let found = (row.try_get("seq")?, row.try_get("content_hash")?);
                thread.known.insert(uuid, found);
            }
        }
    }
    if !joined {
        let mut named: Vec<(&str, &str)> = named
            .iter()
            .filter_map(|(key, uuid)| Some((threads.get(key)?.thread_key.as_str(), *uuid)))
            .collect();
        named.sort_unstable();
        for ((thread_key, uuid), found) in stored_hashes_of(conn, &named).await? {
            if let Some(thread) = threads.values_mut().find(|t| t.thread_key == thread_key) {
                thread.known.insert(uuid, found);
            }
        }
    }
    Ok(threads)
}

/// Whether a refusal decided without the stored uuids may be wrong: an append refused for its
/// `expected_next_seq` is a replay if its uuids are stored (a replay is decided before the seq,
/// [`plan_append`]), and one that is partly a replay of the group's earlier members is a whole
/// replay if its other uuids are stored, and one refused for the thread's byte limit is a replay
/// (never refused) if they are. Either way its uuids must be read first.
pub(super) fn may_be_replays(group: &[QueuedAppend], plans: &[Planned]) -> bool {
    group.iter().zip(plans).any(|(append, plan)| {
        matches!(
            plan,
            Planned::Refused(
                StoreError::SeqConflict { .. }
                    | StoreError::PartialReplay { .. }
                    | StoreError::ThreadTooLarge { .. }
            )
        ) && append.batch.entries.iter().any(|p| p.uuid_sent)
    })
}

/// Decides every append of the group, in queue order ([`plan_append`]); an append to a thread
/// the group's read did not find is refused.
pub(super) fn plan_group<'g>(
    group: &'g [QueuedAppend],
    threads: &mut HashMap<(&'g str, &'g str), GroupThread>,
    rows: &mut Vec<NewRow<'g>>,
) -> Vec<Planned> {
    group
        .iter()
        .map(|append| match threads.get_mut(&thread_of(append)) {
            Some(thread) => plan_append(thread, append, rows).unwrap_or_else(Planned::Refused),
            None => Planned::Refused(StoreError::ThreadNotFound),
        })
        .collect()
}

/// Decides one append against its thread as the group has left it so far; a write queues its
/// rows and moves the thread on. A replay is recognised, and a conflict refused, against what is
/// stored and what the group's earlier appends wrote alike.
pub(super) fn plan_append<'g>(
    thread: &mut GroupThread,
    append: &'g QueuedAppend,
    rows: &mut Vec<NewRow<'g>>,
) -> Result<Planned, StoreError> {
    let batch = &append.batch;
    let mut found = 0;
    for p in batch.entries.iter().filter(|p| p.uuid_sent) {
        if let Some((seq, hash)) = thread.known.get(&p.uuid) {
            if *hash != p.content_hash {
                return Err(StoreError::UuidConflict {
                    uuid: p.uuid.clone(),
                    seq: *seq,
                });
            }
            found += 1;
        }
    }
    if found > 0 {
        if found < batch.entries.len() {
            return Err(StoreError::PartialReplay {
                stored: found,
                total: batch.entries.len(),
            });
        }
        return Ok(Planned::Replay {
            thread_key: thread.thread_key.clone(),
            next_seq: thread.next_seq,
        });
    }
    if let Some(expected) = append.expected_next_seq {
        if expected != thread.next_seq {
            return Err(StoreError::SeqConflict {
                expected,
                actual: thread.next_seq,
            });
        }
    }
    let stored_bytes = thread.stored_bytes.saturating_add(batch.bytes);
    let limit = thread.triggers.max_stored_bytes;
    let room = if batch.is_snips() {
        limit.saturating_add(SNIP_HEADROOM_BYTES)
    } else {
        limit
    };
    if limit > 0 && stored_bytes > room {
        return Err(StoreError::ThreadTooLarge {
            stored: thread.stored_bytes,
            adding: batch.bytes,
            limit,
        });
    }
    thread.stored_bytes = stored_bytes;
    let first_seq = thread.next_seq;
    let created_at = batch.now.timestamp_millis();
    for (p, seq) in batch.entries.iter().zip(first_seq..) {
        if p.entry.kind.is_model_visible() {
            thread.visible_count += 1;
        }
        thread
            .known
            .insert(p.uuid.clone(), (seq, p.content_hash.clone()));
        rows.push(NewRow {
            thread_key: thread.thread_key.clone(),
            seq,
            prepared: p,
            visible_rank: thread.visible_count,
            created_at,
        });
    }
    let tokens_before = thread.context_tokens;
    thread.context_tokens = append_tokens(tokens_before, batch.tokens);
    thread.next_seq += batch.len();
    // `None` orders before any time.
    thread.updated_at = thread.updated_at.max(Some(created_at));
    Ok(Planned::Write {
        first_seq,
        tokens_before,
        auto_compaction_job: None,
        jobs_created: false,
    })
}

/// Inserts the group's rows and moves the counters of every thread it wrote to, ending the
/// transaction too with [`Bracket::Inline`], in one call: the statements sent together on
/// SQLite, the insert a data-modifying part of the update on PostgreSQL (which takes one
/// statement a call). Only rows past the first [`INSERT_CHUNK`] take calls of their own. Each
/// call is a round trip, or on SQLite two thread wake-ups, that the group's writer waits for.
/// With [`UuidCheck::OnInsert`] (PostgreSQL, one statement's rows), rows whose uuid is stored are
/// left out and the answer is how many went in.
async fn write_rows<'a>(
    conn: &mut AnyConnection,
    backend: super::Backend,
    rows: &[NewRow<'_>],
    threads: impl Iterator<Item = &'a GroupThread>,
    bracket: Bracket,
    check: UuidCheck,
) -> Result<Option<usize>, StoreError> {
    let written: Vec<&GroupThread> = threads.filter(|t| t.updated_at.is_some()).collect();
    // A group holds at most 64 appends, so its counters always fit one statement.
    debug_assert!(written.len() <= INSERT_CHUNK);
    let commit = match bracket {
        Bracket::Inline => "; COMMIT",
        Bracket::Caller => "",
    };
    let (earlier, last) = rows.split_at(rows.len().saturating_sub(1) / INSERT_CHUNK * INSERT_CHUNK);
    insert_rows(conn, earlier).await?;
    let update = update_threads_sql(last.len() * INSERT_WIDTH + 1, written.len());
    let insert = insert_rows_sql(last.len());
    let counted = check == UuidCheck::OnInsert;
    debug_assert!(!counted || (backend == super::Backend::Postgres && earlier.is_empty()));
    let sql = match backend {
        _ if last.is_empty() => format!("{update}{commit}"),
        super::Backend::Sqlite => format!("{insert}; {update}{commit}"),
        super::Backend::Postgres if counted => format!(
            "WITH inserted AS ({insert} ON CONFLICT (thread_key, uuid) DO NOTHING RETURNING 1) \
             {update} RETURNING (SELECT count(*) FROM inserted)"
        ),
        super::Backend::Postgres => {
            format!("WITH inserted AS ({insert} RETURNING 1) {update}{commit}")
        }
    };
    let query = bind_thread_counters(bind_rows(sqlx::query(&sql), last), &written);
    if !counted {
        query.execute(&mut *conn).await?;
        return Ok(None);
    }
    // One row per thread moved, each with the count.
    let inserted: i64 = match query.fetch_optional(&mut *conn).await? {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    Ok(Some(usize::try_from(inserted).unwrap_or(0)))
}

/// Values each thread's counters bind: its key, `updated_at`, `next_seq`, `visible_count`,
/// `context_tokens` and `stored_bytes`.
pub(super) const THREAD_COUNTERS_WIDTH: usize = 6;

/// The update of `count` threads' counters, its placeholders numbered from `$start`.
pub(super) fn update_threads_sql(start: usize, count: usize) -> String {
    format!(
        "UPDATE threads SET updated_at = v.column2, next_seq = v.column3, \
         visible_count = v.column4, context_tokens = v.column5, stored_bytes = v.column6 \
         FROM (VALUES {}) AS v WHERE threads.thread_key = v.column1",
        super::values_placeholders_from(start, count, THREAD_COUNTERS_WIDTH)
    )
}

fn bind_thread_counters<'q>(mut query: AnyQuery<'q>, threads: &[&GroupThread]) -> AnyQuery<'q> {
    for thread in threads {
        query = query
            .bind(thread.thread_key.clone())
            .bind(thread.updated_at.unwrap_or_default())
            .bind(thread.next_seq)
            .bind(thread.visible_count)
            .bind(thread.context_tokens)
            .bind(thread.stored_bytes);
    }
    query
}

/// Makes entries ready to write (uuid, fingerprint, `created_at`) and inserts them from
/// `next_seq` on. Returns the stored entries and the new visible count.
pub(super) async fn insert_entries(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &str,
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

async fn insert_prepared(
    tx: &mut sqlx::Transaction<'_, Any>,
    thread_key: &str,
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
                thread_key: thread_key.to_owned(),
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
fn numbered(prepared: Vec<Prepared>, first_seq: i64) -> Vec<Entry> {
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
    pub(super) thread_key: String,
    pub(super) seq: i64,
    pub(super) prepared: &'p Prepared,
    /// The thread's visible count once this entry is in: its rank among what a model sees.
    pub(super) visible_rank: i64,
    pub(super) created_at: i64,
}

/// Inserts rows of any threads, [`INSERT_CHUNK`] to a statement.
async fn insert_rows(conn: &mut AnyConnection, rows: &[NewRow<'_>]) -> Result<(), StoreError> {
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
            .bind(row.thread_key.clone())
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
    thread_key: &str,
    uuids: &[&str],
) -> Result<HashMap<String, (i64, String)>, StoreError> {
    let named: Vec<(&str, &str)> = uuids.iter().map(|uuid| (thread_key, *uuid)).collect();
    Ok(stored_hashes_of(conn, &named)
        .await?
        .into_iter()
        .map(|((_, uuid), stored)| (uuid, stored))
        .collect())
}

/// `(thread_key, uuid) → (seq, content hash)` of the named pairs that are stored: the append's
/// replay check for a whole group, in one statement per [`INSERT_CHUNK`] uuids. Consecutive
/// pairs of one thread share a term, so each term is an index lookup.
async fn stored_hashes_of(
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
    fn the_threshold_fires_once_when_crossed() {
        assert!(crosses_threshold(90, 100, 100));
        assert!(crosses_threshold(0, 500, 100));
        assert!(!crosses_threshold(100, 150, 100));
        assert!(!crosses_threshold(10, 50, 100));
        assert!(!crosses_threshold(0, 500, 0));
    }

    #[test]
    fn a_boundary_in_a_batch_restarts_the_estimate() {
        let e = |v: serde_json::Value| entry(v);
        let batch = [
            e(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            e(json!({"type": "system", "subtype": "compact_boundary", "content": "x"})),
            e(json!({"type": "user", "message": {"role": "user", "content": "abcd"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()),
            BatchTokens::Reset(1)
        ));
        assert!(matches!(
            context_tokens_of(batch[..1].iter()),
            BatchTokens::Add(2)
        ));
    }

    #[test]
    fn usage_in_a_batch_anchors_the_estimate() {
        let batch = [
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
            entry(
                json!({"type": "assistant", "message": {"role": "assistant", "id": "m",
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 30000, "output_tokens": 20},
                "content": [{"type": "text", "text": "hi"}]}}),
            ),
            entry(json!({"type": "user", "message": {"role": "user", "content": "abcdefgh"}})),
        ];
        assert!(matches!(
            context_tokens_of(batch.iter()),
            BatchTokens::Anchor(30027)
        ));
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
}
