//! Every SQL statement of Loupe lives under this module.
//!
//! One implementation serves both backends through sqlx's `Any` driver: the schema uses only
//! types both share (TEXT, BIGINT), and the few statements whose dialects differ branch on
//! [`Backend`]. The one exception is SQLite's group writer (`append/sqlite_writer`), which runs
//! the same statements through rusqlite on a thread of its own. Handlers never see which
//! backend they talk to.
//!
//! Every read and write of thread data takes a [`TenantId`], so no caller can reach another
//! tenant's threads by forgetting a filter.
//!
//! The rooms, each adding its methods to [`Store`]:
//! - `append/`: the append engine; its module docs open with the table of the write paths.
//! - `ids` (a leaf): [`ThreadId`], the id a client names a thread by; [`ThreadKey`], the internal
//!   key its data is stored under; [`Seq`], a message's place in its thread.
//! - `rows` (a leaf every other room may use): a message read back from its row, rows made ready
//!   and inserted many to a statement, the byte-bounded page, the stored uuids' lookup.
//! - reads: `messages` (pages, entries by uuid), `context` (the window after the last compact
//!   boundary, its snips and tail), `cursors`, `tree` (nodes, outline, zoom), `transcripts`,
//!   `economics` (a thread's requests, sizes and costs, folded page by page).
//! - `threads`, `settings`, `keys` (tenants and API keys), `admin`.
//! - `jobs`: the durable queue (enqueue in the caller's transaction, leases) and the
//!   compaction's write; `payloads`: the job kinds and payloads the store enqueues itself.

mod admin;
mod append;
mod changes;
mod context;
mod cursors;
mod economics;
mod erasure;
mod events;
mod expiry;
mod forks;
mod hosts;
mod ids;
mod jobs;
mod keys;
mod ledger;
mod messages;
mod overheads;
mod payloads;
mod retention;
mod rows;
mod search;
mod settings;
mod standbys;
pub use standbys::{Lsn, ReadRoute, StandbyStats, MAX_STALENESS, REMEMBER_WRITES_FOR};
mod threads;
mod transcripts;
mod tree;
mod webhooks;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};

pub use admin::database_url;
pub use append::{AppendOutcome, AppendRequest, GroupCommitStats, SNIP_HEADROOM_BYTES};
pub use changes::{ThreadChanges, THREADS_CHANNEL};
pub use context::{ContextHead, ContextTail, ContextWindow, WindowBounds, MAX_WINDOW_ENTRIES};
pub use cursors::{
    AdvanceOutcome, AdvanceRequest, BatchLimit, Bookmark, Claim, CursorState, Lease, PendingBatch,
};
pub use economics::{Economics, EconomicsRead};
pub use erasure::{
    Erasure, ErasureArtifacts, ErasureRead, ErasureTargets, ErasureTurn, ErasureTx, SummaryRows,
    MAX_ERASED_ENTRIES,
};
pub use events::{EventsHead, ThreadEvent};
pub use forks::{CopiedFrom, ForkOf, NewFork};
pub use ids::{Seq, ThreadId, ThreadKey};
pub use jobs::{
    ClaimedJob, CompactionWrite, EnqueueOutcome, Job, JobState, NewJob, ThreadJobs, NOTIFY_CHANNEL,
};
pub use keys::{ApiKeyRecord, CreatedKey, KeyIdentity, TenantRecord};
pub use ledger::{
    Ledger, LedgerAnchor, LedgerFilter, LedgerSummary, SummaryLedger, LEDGER_ANCHORS_PER_SUMMARY,
};
pub use messages::{MessagePage, SeqWindow};
pub use payloads::{
    CompactionPayload, DEFAULT_KEEP_RECENT_ROUNDS, KIND_COMPACTION, KIND_NOOP, KIND_RETENTION,
    KIND_TREE,
};
pub use retention::{RetentionPolicy, ThreadRetention, TrimCandidate};
pub use rows::fingerprint;
pub use rows::PageBytes;
pub use search::{
    IndexLag, SearchHit, SearchQuery, INDEX_BATCH, MARK_CLOSE, MARK_OPEN, MAX_QUERY_CHARS,
    MAX_TERMS,
};
pub use settings::{ClearingSettings, MicrocompactSettings, ThreadSettings};
pub use threads::{
    filterable_key, Lineage, NewThread, Thread, ThreadFilter, ThreadOrder, ThreadPage,
    MAX_COUNTED_THREADS, MAX_FILTER_KEY_CHARS, MAX_FILTER_MEMBERS,
};
pub use tree::{
    LevelLine, NewNode, OutlineSnapshot, StandIns, TreeStatus, ZoomRead, LINE_CONTEXT_LINES,
};
pub use webhooks::{
    AttemptOutcome, DueDelivery, WebhookDelivery, WebhookEndpoint, DUE_ENDPOINTS_SQL,
    HEAD_DELIVERY_SQL, MAX_DELIVERY_ATTEMPTS, MAX_ENDED_PER_ENDPOINT, MAX_UNSENT_PER_ENDPOINT,
    MAX_WEBHOOKS_PER_TENANT, WEBHOOK_KINDS,
};

/// How a request named a message: by its seq or by its uuid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageRef {
    Seq(i64),
    Uuid(String),
}

impl std::fmt::Display for MessageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageRef::Seq(seq) => write!(f, "seq {seq}"),
            // Echoed into problem details: a long value is cut, so a body stays small.
            MessageRef::Uuid(uuid) => write!(f, "uuid {}", clip(uuid, 64)),
        }
    }
}

/// `text` cut to at most `max` characters, marked with `…` when cut.
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]).into(),
        None => text.into(),
    }
}

/// `text` as any text column can hold it: PostgreSQL's `text` refuses the NUL character, which
/// JSON lets a caller send (`\u0000`, a binary file read by a tool), so text Loupe derives from
/// entries (search rows, anchors, outline lines, summaries) and error messages it keeps get
/// U+FFFD in its place, on both backends alike. Stored entry bodies are JSON text, where a NUL
/// is always escaped, and stay as sent.
pub fn storable_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}").into()
    } else {
        text.into()
    }
}

/// [`storable_text`] of an owned string, copied only when it holds a NUL.
pub fn into_storable(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            Err(StoreError::Config(format!(
                "unsupported database URL (expected postgres:// or sqlite:): {url}"
            )))
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// The tenant a request acts for. Every query of thread data is scoped by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantId(pub String);

impl TenantId {
    /// The single tenant of open mode (no API keys configured).
    pub fn default_tenant() -> Self {
        TenantId("default".to_owned())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("thread not found")]
    ThreadNotFound,
    #[error("a thread with id {0:?} already exists")]
    ThreadExists(String),
    #[error("expected next seq {expected}, but the thread is at {actual}")]
    SeqConflict { expected: i64, actual: i64 },
    #[error("message {uuid} is already stored with different content (seq {seq})")]
    UuidConflict { uuid: String, seq: i64 },
    #[error("{stored} of the {total} messages are already stored: resend the whole batch or only new messages")]
    PartialReplay { stored: usize, total: usize },
    #[error("uuid {0:?} appears twice in the batch")]
    DuplicateUuid(String),
    #[error("the thread holds no message with {0}")]
    NoSuchMessage(MessageRef),
    /// A background writer's sources changed since it read them (a snip hid some): it writes
    /// nothing and runs again.
    #[error("the thread's messages were hidden or erased since the job read them")]
    SourcesChanged,
    /// An erasure named entries the thread does not hold.
    #[error("the thread holds no entry with {field} {}", .names.iter().take(10).map(|n| clip(n, 64).into_owned()).collect::<Vec<_>>().join(", "))]
    NoSuchEntries {
        /// `uuids` or `seqs`: how the request named them.
        field: &'static str,
        names: Vec<String>,
    },
    /// A page read within room of the answer budget holds more than the room: the reader takes
    /// room for `bytes` and reads it again ([`PageBytes`]).
    #[error("the next page holds {bytes} bytes, more than the room the read took")]
    PageLargerThanRoom { bytes: i64 },
    #[error("the window holds {entries} entries, more than {max}; start it later")]
    WindowTooLarge { entries: i64, max: i64 },
    #[error(
        "the thread stores {stored} bytes; {adding} more would pass its limit of {limit} bytes"
    )]
    ThreadTooLarge {
        stored: i64,
        adding: i64,
        limit: i64,
    },
    #[error("{reason}")]
    CursorConflict {
        /// The bookmark's (seq, uuid) now; `None` when it has none yet.
        current: Option<(i64, String)>,
        reason: &'static str,
    },
    #[error("another worker holds the cursor's lease until {expires_at} (Unix ms)")]
    CursorLeased { expires_at: i64 },
    #[error("the bookmark is at seq {current_seq}; it cannot move back to seq {target_seq}")]
    CursorBackward { current_seq: i64, target_seq: i64 },
    #[error(
        "the thread holds {next_seq} entries: a fork takes 0 to {next_seq} of them, not {at_seq}"
    )]
    ForkPastEnd { at_seq: i64, next_seq: i64 },
    #[error("the metadata would be {bytes} bytes of JSON, more than {max}")]
    MetadataTooLarge { bytes: usize, max: usize },
    /// A key or a string of the metadata holds a NUL (`\u0000`), which PostgreSQL's metadata
    /// filters cannot hold: refused on both backends alike. Holds the top-level member's name.
    #[error(
        "metadata keys and strings may not hold a NUL character (\\u0000); member {:?} does",
        clip(.0, 64)
    )]
    MetadataHoldsNul(String),
    #[error("a tenant with id {0:?} already exists")]
    TenantExists(String),
    #[error("API key not found")]
    KeyNotFound,
    #[error("invalid pagination cursor")]
    BadCursor,
    #[error("job not found")]
    JobNotFound,
    #[error("webhook not found")]
    WebhookNotFound,
    #[error("delivery not found")]
    DeliveryNotFound,
    /// The job's lease was taken over by another claim: this worker may not finish it.
    #[error("the lease on job {0} is no longer held by this worker")]
    LeaseLost(String),
    /// The thread was compacted by someone else since the job read it.
    #[error("the thread was compacted while the job ran")]
    BoundaryMoved,
    #[error("configuration: {0}")]
    Config(String),
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The database cannot hold what the request sent (a value too large for it, a character
    /// its text type refuses): the caller's to change, never worth a retry.
    #[error("the database cannot store the request's content: {0}")]
    ContentRefused(String),
    /// The transaction of a group of appends failed: none of them was stored.
    #[error("the commit failed: {message}")]
    CommitFailed { message: String, transient: bool },
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    /// A fault of the database or of the way to it, not of the request: connection refused,
    /// reset or closed, the server shutting down or restarting, no connection free in time, a
    /// lock held too long ("database is locked"), a serialization failure or deadlock. Retrying
    /// the same request later can succeed.
    /// Whether the database refused the request's own content (PostgreSQL class 22, data
    /// exception, and 54, program limit exceeded; SQLite's SQLITE_TOOBIG), which no retry fixes.
    pub fn refuses_content(&self) -> bool {
        match self {
            StoreError::ContentRefused(_) => true,
            StoreError::Database(sqlx::Error::Database(db)) => {
                let code = db.code().unwrap_or_default();
                let sqlite_too_big = code.parse::<i64>().is_ok_and(|code| code & 0xff == 18);
                code.starts_with("22") || code.starts_with("54") || sqlite_too_big
            }
            _ => false,
        }
    }

    pub fn is_transient(&self) -> bool {
        if let StoreError::CommitFailed { transient, .. } = self {
            return *transient;
        }
        let StoreError::Database(error) = self else {
            return false;
        };
        match error {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                // PostgreSQL: class 08 connection exception, 57P0x shutdown or restart, 53xxx
                // insufficient resources, 40001 serialization failure (a standby's query cancelled to
                // replay, too), 40P01 deadlock.
                // SQLite: 5 SQLITE_BUSY and 6 SQLITE_LOCKED, with their extended codes.
                let postgres = code.starts_with("08")
                    || code.starts_with("57P")
                    || code.starts_with("53")
                    || code == "40001"
                    || code == "40P01"
                    // 25006: a write reached a host that became a standby (a failover under way).
                    || code == "25006";
                let sqlite = code
                    .parse::<i64>()
                    .is_ok_and(|code| matches!(code & 0xff, 5 | 6));
                let message = db.message();
                postgres
                    || sqlite
                    || message.contains("database is locked")
                    || message.contains("terminating connection")
            }
            _ => false,
        }
    }
}

/// Tables of per-thread data, all keyed by `thread_key`; deleting a thread empties them.
const THREAD_DATA_TABLES: &[&str] = &[
    "messages",
    "search_rows",
    "erasures",
    "cursors",
    "jobs",
    "thread_settings",
    "tree_nodes",
    "outlines",
    "outline_merges",
    "thread_events",
];

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The database, whichever backend it is.
#[derive(Clone)]
pub struct Store {
    /// Reads, and on PostgreSQL writes too.
    pool: AnyPool,
    /// Where every write transaction runs. On SQLite a pool of one connection: SQLite admits one
    /// writer at a time, so writers queue here, in-process and in arrival order (the pool's
    /// queue is fair), instead of polling the file lock through the busy handler. On
    /// PostgreSQL (and for an in-memory SQLite database) the same pool as `pool`.
    writer: AnyPool,
    backend: Backend,
    /// The database URL, for connections outside the pool (PostgreSQL `LISTEN`).
    url: Arc<str>,
    /// Woken after a job is enqueued in this process (workers also poll, and on PostgreSQL
    /// listen for `NOTIFY` from other processes).
    job_signal: Arc<tokio::sync::Notify>,
    /// Signals to the followers of threads (`GET /v1/threads/{id}/events`).
    changes: Arc<changes::ThreadChanges>,
    /// Server default of the auto-compaction threshold, in estimated tokens; 0 disables it.
    auto_compact_tokens: i64,
    /// Most bytes of bodies one thread may store; 0 for no limit.
    max_thread_bytes: i64,
    /// Attempts a job enqueued by a write (auto-compaction) gets.
    job_max_attempts: i64,
    /// Appends waiting to be committed together.
    group_commit: Arc<append::GroupCommit>,
    /// PostgreSQL: how this process's last groups left their threads (`append/pg_unlocked`).
    thread_cache: Arc<append::ThreadCache>,
    /// Erasures waiting for their files to be scrubbed: one scrub at a time (`store/erasure`).
    scrubs: Arc<erasure::ScrubQueue>,
    /// Erasures and snip redactions of a thread, one at a time in this process.
    erasure_turns: Arc<crate::turns::KeyedTurns<(String, String)>>,
    /// SQLite's group writer, on a thread of its own (a file database only).
    sqlite_writer: Option<Arc<append::SqliteWriter>>,
    /// Asks the WAL task to empty the WAL file (SQLite file databases only): after a delete, the
    /// WAL still holds the pages as they were, deleted text included.
    wal_scrub: Option<Arc<tokio::sync::Notify>>,
    /// PostgreSQL standbys that reads may go to (`--read-database-url`).
    standbys: Option<Arc<standbys::Standbys>>,
    /// The hosts of a multi-host `DATABASE_URL`, and which is the primary now.
    primary: Option<Arc<hosts::PrimaryHosts>>,
}

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// Default auto-compaction threshold (estimated context tokens); 0 disables it. Threads
    /// override it in their settings.
    pub auto_compact_tokens: i64,
    /// Attempts of jobs the store enqueues itself (auto-compaction).
    pub job_max_attempts: i64,
    /// Most bytes of bodies one thread may store; an append past it is refused
    /// ([`StoreError::ThreadTooLarge`]). 0 for no limit.
    pub max_thread_bytes: i64,
    /// How SQLite makes a commit durable (ignored by PostgreSQL).
    pub sqlite_synchronous: SqliteSynchronous,
    /// PostgreSQL: the longest a group of appends waits to be as full as the last groups were
    /// (`group_commit`); zero never waits. SQLite's single writer fills its groups by itself.
    pub append_gather: Duration,
}

/// The longest a read waits for a connection to a standby before it reads from the primary.
const STANDBY_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// [`StoreOptions::append_gather`]'s default (BENCHMARKS.md, hot path).
pub const DEFAULT_APPEND_GATHER: Duration = Duration::from_millis(1);

/// Group runners on PostgreSQL: two, so one group fills while the other commits. More runners
/// leave each group nearly alone (8 measured 5,100 appends/s against 7,000–7,500 for 1 or 2).
const POSTGRES_GROUP_RUNNERS: usize = 2;

/// SQLite's `synchronous` setting in WAL mode: what an answered append survives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SqliteSynchronous {
    /// No fsync at commit: an answered append survives a crash of the process, and a power loss
    /// may lose the last ones (the WAL is synced at checkpoints).
    #[default]
    Normal,
    /// The WAL is synced at every commit (one fsync per group of appends): an answered append
    /// survives a power loss too.
    Full,
}

impl std::str::FromStr for SqliteSynchronous {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.to_ascii_lowercase().as_str() {
            "normal" => Ok(SqliteSynchronous::Normal),
            "full" => Ok(SqliteSynchronous::Full),
            _ => Err(format!("{value:?} is not `normal` or `full`")),
        }
    }
}

impl SqliteSynchronous {
    pub(super) fn pragma(self) -> &'static str {
        match self {
            SqliteSynchronous::Normal => "PRAGMA synchronous = NORMAL",
            SqliteSynchronous::Full => "PRAGMA synchronous = FULL",
        }
    }
}

/// `docs/NORMALIZATION.md` § Compaction: effective window (200,000 − 20,000 output reserve) − 13,000.
pub const DEFAULT_AUTO_COMPACT_TOKENS: i64 = 167_000;

/// Default size of the connection pool.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// Attempts of a job before it ends `failed`.
pub const DEFAULT_JOB_MAX_ATTEMPTS: i64 = 5;

/// [`StoreOptions::max_thread_bytes`]'s default, 1 GiB: far past any context window (a thread
/// that long is mostly history behind its compactions), and a bound on what one thread's reads
/// can make the process hold.
pub const DEFAULT_MAX_THREAD_BYTES: i64 = 1 << 30;

impl StoreOptions {
    pub fn new(url: impl Into<String>) -> Self {
        StoreOptions {
            url: url.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_secs(10),
            auto_compact_tokens: DEFAULT_AUTO_COMPACT_TOKENS,
            job_max_attempts: DEFAULT_JOB_MAX_ATTEMPTS,
            max_thread_bytes: DEFAULT_MAX_THREAD_BYTES,
            sqlite_synchronous: SqliteSynchronous::default(),
            append_gather: DEFAULT_APPEND_GATHER,
        }
    }
}

impl Store {
    /// Opens the database (creating an SQLite file and its folder when missing). Does not migrate.
    pub async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(&options.url)?;
        if backend == Backend::Sqlite {
            create_sqlite_parent_dir(&options.url)?;
        }
        // libpq's multi-host form: the pool writes to whichever host is the primary.
        let primary = match backend {
            Backend::Postgres => match hosts::split_hosts(&options.url)? {
                urls if urls.len() > 1 => {
                    Some(hosts::PrimaryHosts::find(urls, options.acquire_timeout).await?)
                }
                _ => None,
            },
            Backend::Sqlite => None,
        };
        let connect_options = match &primary {
            Some(primary) => primary.current_options(),
            None => AnyConnectOptions::from_str(&sqlite_create_mode(&options.url))?,
        };
        let pool = open_pool(
            backend,
            &logged(connect_options.clone()),
            options.max_connections,
            options.acquire_timeout,
            options.sqlite_synchronous,
            primary.clone(),
        )
        .await?;
        if let Some(primary) = &primary {
            tokio::spawn(primary.clone().watch(pool.clone()));
        }
        let connect_options = logged(connect_options);
        // A file database gets its one writer connection, SQLite's group writer and the WAL's
        // checkpoints; an in-memory one (tests) writes through its one pool.
        let (writer, sqlite_writer, wal_scrub) =
            if backend == Backend::Sqlite && !options.url.contains(":memory:") {
                let writer = open_pool(
                    backend,
                    &connect_options,
                    1,
                    options.acquire_timeout,
                    options.sqlite_synchronous,
                    None,
                )
                .await?;
                let file = sqlx::sqlite::SqliteConnectOptions::from_str(&options.url)?;
                let group_writer =
                    append::SqliteWriter::open(file.get_filename(), options.sqlite_synchronous)?;
                // Last, once nothing can fail: the task keeps the pool open.
                let scrub = Arc::new(tokio::sync::Notify::new());
                tokio::spawn(checkpoint_wal(pool.clone(), scrub.clone()));
                (writer, Some(Arc::new(group_writer)), Some(scrub))
            } else {
                (pool.clone(), None, None)
            };
        let changes = Arc::new(changes::ThreadChanges::default());
        if backend == Backend::Postgres {
            // Ends when the store's last clone goes (with the sender it reads from).
            changes.send_through(writer.clone());
        }
        Ok(Store {
            pool,
            writer,
            backend,
            url: options.url.as_str().into(),
            job_signal: Arc::new(tokio::sync::Notify::new()),
            changes,
            auto_compact_tokens: options.auto_compact_tokens.max(0),
            max_thread_bytes: options.max_thread_bytes.max(0),
            job_max_attempts: options.job_max_attempts.max(1),
            // SQLite has one writer, whose groups fill while it writes. On PostgreSQL a few
            // runners, each waiting a moment for a fuller group, write most appends per commit.
            group_commit: Arc::new(match backend {
                Backend::Sqlite => append::GroupCommit::new(1, Duration::ZERO),
                // A small pool (less room for readers and workers) gets fewer.
                Backend::Postgres => append::GroupCommit::new(
                    POSTGRES_GROUP_RUNNERS.min(options.max_connections.saturating_sub(2) as usize),
                    options.append_gather,
                ),
            }),
            sqlite_writer,
            wal_scrub,
            thread_cache: Arc::default(),
            scrubs: Arc::default(),
            erasure_turns: Arc::default(),
            standbys: None,
            primary,
        })
    }

    /// Reads may go to these PostgreSQL standbys (`urls`), each checked to be one
    /// (`pg_is_in_recovery()`); a read that must see a write waits at most `wait` for a standby
    /// to replay it, then reads from the primary.
    pub async fn with_standbys(
        mut self,
        urls: &[String],
        wait: Duration,
        options: &StoreOptions,
    ) -> Result<Self, StoreError> {
        if urls.is_empty() {
            return Ok(self);
        }
        if self.backend != Backend::Postgres {
            return Err(StoreError::Config(
                "read standbys need a PostgreSQL primary".into(),
            ));
        }
        let mut pools = Vec::with_capacity(urls.len());
        let mut hosts = Vec::new();
        for url in urls {
            hosts.extend(hosts::split_hosts(url)?);
        }
        for url in &hosts {
            if Backend::from_url(url)? != Backend::Postgres {
                return Err(StoreError::Config(
                    "a read standby must be a PostgreSQL URL".into(),
                ));
            }
            let connect = logged(AnyConnectOptions::from_str(url)?);
            // Lazily: a standby down at start is read from once its poller reaches it. A
            // standby lost fails its reads within a second (read again on the primary), not
            // after the primary's acquire timeout.
            pools.push(
                sqlx::pool::PoolOptions::<sqlx::Any>::new()
                    .max_connections(options.max_connections)
                    .acquire_timeout(options.acquire_timeout.min(STANDBY_ACQUIRE_TIMEOUT))
                    .test_before_acquire(false)
                    .connect_lazy_with(connect),
            );
        }
        let primary = standbys::PrimaryAddress {
            url: self.url.clone(),
            hosts: self.primary.clone(),
        };
        self.standbys = Some(standbys::Standbys::start(pools, primary, wait));
        Ok(self)
    }

    /// The store a read of the tenant's thread (or of the tenant's threads, without one) runs
    /// on: a standby that has replayed `token` and the last write this process made to the
    /// thread, else the primary. Writes made through it still go to the primary.
    pub async fn for_read(
        &self,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
        token: Option<Lsn>,
    ) -> (Store, ReadRoute) {
        let Some(standbys) = &self.standbys else {
            return (self.clone(), ReadRoute::Primary);
        };
        match standbys.route(tenant, thread_id, token).await {
            (Some(pool), route) => (
                Store {
                    pool,
                    ..self.clone()
                },
                route,
            ),
            (None, route) => (self.clone(), route),
        }
    }

    /// After a write the caller answered: the primary's WAL position, past the write's commit,
    /// remembered for the thread's next reads (or, for a write of no one thread, such as the
    /// tenant's retention policy, the tenant's reads of no one thread); `None` without standbys.
    pub async fn written(
        &self,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
    ) -> Result<Option<Lsn>, StoreError> {
        let Some(standbys) = &self.standbys else {
            return Ok(None);
        };
        let lsn = standbys::primary_position(&self.writer).await?;
        standbys.wrote(tenant, thread_id, lsn);
        Ok(Some(lsn))
    }

    /// Remembers that a write this process made also changed `thread_id`, at `lsn` (an erasure
    /// reaching a fork), for the thread's next reads as [`Store::written`] does.
    pub fn remember_write(&self, tenant: &TenantId, thread_id: &ThreadId, lsn: Lsn) {
        if let Some(standbys) = &self.standbys {
            standbys.wrote(tenant, Some(thread_id), lsn);
        }
    }

    /// How reads were routed, when the store has standbys.
    pub fn standby_stats(&self) -> Option<StandbyStats> {
        self.standbys.as_ref().map(|s| s.stats())
    }

    /// Applies the migrations of this backend that have not run yet.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = match self.backend {
            Backend::Postgres => &POSTGRES_MIGRATIONS,
            Backend::Sqlite => &SQLITE_MIGRATIONS,
        };
        migrator.run(&self.writer).await?;
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Waits for the pool to move to another primary (never, with one host).
    pub async fn primary_switched(&self) {
        match &self.primary {
            Some(primary) => primary.switched().await,
            None => std::future::pending().await,
        }
    }

    /// The signals of followed threads' changes.
    pub fn changes(&self) -> &Arc<changes::ThreadChanges> {
        &self.changes
    }

    /// The URL of the database: of the primary now, when the URL named several hosts.
    pub fn url(&self) -> String {
        match &self.primary {
            Some(primary) => primary.current_url().to_owned(),
            None => self.url.to_string(),
        }
    }

    /// Notified when this process enqueues a job.
    pub fn job_signal(&self) -> Arc<tokio::sync::Notify> {
        self.job_signal.clone()
    }

    /// Attempts of a job before it ends `failed`.
    pub fn job_max_attempts(&self) -> i64 {
        self.job_max_attempts
    }

    /// The server's default auto-compaction threshold (0 = off).
    pub fn default_auto_compact_tokens(&self) -> i64 {
        self.auto_compact_tokens
    }

    /// What every thread's appends are held to where its settings say nothing.
    fn append_defaults(&self) -> append::AppendDefaults {
        append::AppendDefaults {
            auto_compact_tokens: self.auto_compact_tokens,
            max_thread_bytes: self.max_thread_bytes,
        }
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Connections open and idle, for metrics.
    pub fn pool_usage(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}

/// How often SQLite's WAL is copied back into the database, beside the writer. Often, so that
/// each checkpoint is small: at 50 ms the appends' p99 measured 12 ms, at 1 s 38 ms (BENCHMARKS.md).
const WAL_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(50);
/// WAL pages (4 KiB each) past which a commit checkpoints by itself: a safety net for when the
/// background checkpoints fall behind.
pub(super) const WAL_AUTOCHECKPOINT_PAGES: u32 = 8_000;

/// Checkpoints an SQLite database's WAL every [`WAL_CHECKPOINT_INTERVAL`] on a reader connection,
/// until the pool closes. Left to SQLite, the commit that crosses 1,000 WAL pages checkpoints
/// itself: the group commit's writer then stalls on copying pages and syncing the database file
/// while every append waits. A passive checkpoint runs beside the writer and never blocks it.
///
/// When `scrub` is notified (a delete removed text), the WAL is also emptied: a truncating
/// checkpoint, tried again until no reader holds an older snapshot.
async fn checkpoint_wal(pool: AnyPool, scrub: Arc<tokio::sync::Notify>) {
    let mut ticks = tokio::time::interval(WAL_CHECKPOINT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let scrubbing = tokio::select! {
            _ = ticks.tick() => false,
            () = scrub.notified() => true,
        };
        if pool.is_closed() {
            return;
        }
        if scrubbing {
            truncate_wal(&pool).await;
            continue;
        }
        if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            if pool.is_closed() {
                return;
            }
            tracing::debug!(%error, "WAL checkpoint failed; the next one retries");
        }
    }
}

/// Empties the WAL file: the truncating checkpoint copies every frame into the database and
/// cuts the file to nothing, once no reader holds an older snapshot (tried again meanwhile).
pub(super) async fn truncate_wal(pool: &AnyPool) {
    loop {
        match try_truncate_wal(pool).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => {
                if pool.is_closed() {
                    return;
                }
                tracing::debug!(%error, "truncating the WAL failed; trying again");
            }
        }
        tokio::time::sleep(WAL_CHECKPOINT_INTERVAL).await;
    }
}

/// One truncating checkpoint, which gives up at once when a reader holds an older snapshot:
/// waiting for it (the busy handler) would hold off every writer meanwhile. Whether the WAL was
/// emptied.
async fn try_truncate_wal(pool: &AnyPool) -> Result<bool, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query("PRAGMA busy_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let checkpoint = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut *conn)
        .await;
    sqlx::query(&format!("PRAGMA busy_timeout = {timeout}"))
        .execute(&mut *conn)
        .await?;
    match checkpoint {
        Ok(row) => Ok(sqlx::Row::try_get::<i64, _>(&row, 0).is_ok_and(|busy| busy == 0)),
        // Busy: another connection holds what the checkpoint needs.
        Err(sqlx::Error::Database(error)) if error.code().is_some_and(|c| c.starts_with('5')) => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// SQLite overwrites what a statement deletes (with zeros) rather than only unlinking it, so
/// deleted text does not linger in free pages of the file.
pub(super) const SECURE_DELETE_PRAGMA: &str = "PRAGMA secure_delete = ON";

/// Temporary files in memory: a multi-row insert keeps a statement journal, which SQLite would
/// otherwise create and delete as a file on every group (an open, a write and an unlink).
pub(super) const TEMP_STORE_PRAGMA: &str = "PRAGMA temp_store = MEMORY";

/// How long a PostgreSQL connection may sit in the pool before it is pinged when lent again.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// Opens a pool of at most `max_connections`; SQLite connections get WAL and their durability.
async fn open_pool(
    backend: Backend,
    connect_options: &AnyConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
    synchronous: SqliteSynchronous,
    primary: Option<Arc<hosts::PrimaryHosts>>,
) -> Result<AnyPool, StoreError> {
    let checked = primary.clone();
    let pool = AnyPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        // The pool pings a connection before lending it: a round trip on every request. A
        // SQLite connection is a file in this process and cannot go away; a PostgreSQL one is
        // checked only when it sat idle long enough that the server may have dropped it. One
        // broken while busy fails its statement with a 503 and is dropped when given back.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            // A connection to the host that was the primary before a switch is dropped.
            let stale = primary
                .as_ref()
                .is_some_and(|primary| primary.predates_switch(meta.age));
            Box::pin(async move {
                if stale {
                    return Ok(false);
                }
                if backend == Backend::Postgres && meta.idle_for >= IDLE_BEFORE_PING {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _meta| {
            let multi_host = checked.is_some();
            Box::pin(async move {
                // Of several hosts, only the primary takes writes: a host found in recovery
                // (the old primary come back as a standby) is refused until the watcher moves.
                if multi_host {
                    let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                        .fetch_one(&mut *conn)
                        .await?;
                    if recovering {
                        return Err(hosts::not_primary());
                    }
                }
                if backend == Backend::Sqlite {
                    // WAL lets readers run beside the one writer; `synchronous` decides what a
                    // commit survives (see the README, "Durability"). The busy timeout only
                    // covers other processes on the file: in this one, writers queue on the
                    // writer pool.
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA busy_timeout = 30000").await?;
                    conn.execute(synchronous.pragma()).await?;
                    conn.execute(TEMP_STORE_PRAGMA).await?;
                    conn.execute(SECURE_DELETE_PRAGMA).await?;
                    // `checkpoint_wal` keeps the WAL short; a commit checkpoints only if the
                    // WAL has outgrown that anyway.
                    conn.execute(
                        format!("PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}").as_str(),
                    )
                    .await?;
                }
                Ok(())
            })
        })
        .connect_with(connect_options.clone())
        .await?;
    Ok(pool)
}

/// Statements logged at trace level, slow ones as warnings.
fn logged(options: AnyConnectOptions) -> AnyConnectOptions {
    options
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1))
}

/// `sqlite:` URLs open read-write and create the file when missing.
fn sqlite_create_mode(url: &str) -> String {
    if url.starts_with("sqlite:") && !url.contains("mode=") && !url.contains(":memory:") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}mode=rwc")
    } else {
        url.to_owned()
    }
}

fn create_sqlite_parent_dir(url: &str) -> Result<(), StoreError> {
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return Ok(());
    }
    if let Some(parent) = std::path::Path::new(path).parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Config(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
    }
    Ok(())
}

/// `$start, $start+1, …` for an `IN (…)` list of `count` values. Placeholders are written out
/// because both backends read `$N`, while sqlx's query builder writes `?` for `Any`.
pub(crate) fn list_placeholders(start: usize, count: usize) -> String {
    (start..start + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `($1, …, $width), ($width+1, …), …` for a multi-row `VALUES` of `rows` rows.
pub(crate) fn values_placeholders(rows: usize, width: usize) -> String {
    values_placeholders_from(1, rows, width)
}

/// [`values_placeholders`] numbered from `$start`: for a statement that follows others in one
/// call and shares their numbering.
pub(crate) fn values_placeholders_from(start: usize, rows: usize, width: usize) -> String {
    (0..rows)
        .map(|row| format!("({})", list_placeholders(start + row * width, width)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Milliseconds since the Unix epoch, the time type of every table.
pub fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn millis_to_datetime(millis: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(millis).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a real database refuses in a request's content is told apart from its faults: the
    /// caller's to fix (a 4xx), never a 503 a client would retry for ever.
    #[tokio::test]
    async fn content_a_database_refuses_is_not_a_fault() {
        let path = std::env::temp_dir().join(format!("loupe-refuse-{}.db", uuid::Uuid::new_v4()));
        let mut urls = vec![(
            format!("sqlite://{}", path.display()),
            "SELECT zeroblob(2000000000)",
        )];
        if let Ok(url) = std::env::var("TEST_DATABASE_URL") {
            urls.push((url, "SELECT 'not a number'::int"));
        }
        for (url, refused) in urls {
            let store = Store::connect(&StoreOptions::new(&url)).await.unwrap();
            let error: StoreError = sqlx::query(refused)
                .execute(&store.pool)
                .await
                .unwrap_err()
                .into();
            assert!(error.refuses_content(), "{url}: {error:?}");
            assert!(!error.is_transient(), "{url}: {error:?}");
            let fine: StoreError = sqlx::query("SELECT * FROM no_such_table")
                .execute(&store.pool)
                .await
                .unwrap_err()
                .into();
            assert!(!fine.refuses_content(), "{url}: {fine:?}");
            store.close().await;
        }
        let _ = std::fs::remove_file(&path);
    }

    /// A refusal is answered in Loupe's words: the database's message (which may quote what it
    /// refused, or name its types and columns) stays in the log.
    #[tokio::test]
    async fn a_refusal_answers_without_the_database_message() {
        let path = std::env::temp_dir().join(format!("loupe-refuse-{}.db", uuid::Uuid::new_v4()));
        let mut urls = vec![(
            format!("sqlite://{}", path.display()),
            "SELECT zeroblob(2000000000)",
        )];
        if let Ok(url) = std::env::var("TEST_DATABASE_URL") {
            urls.push((url, "SELECT CAST('{\"a\": \"\\u0000\"}' AS jsonb)"));
        }
        for (url, refused) in urls {
            let store = Store::connect(&StoreOptions::new(&url)).await.unwrap();
            let error: StoreError = sqlx::query(refused)
                .execute(&store.pool)
                .await
                .unwrap_err()
                .into();
            let said = error.to_string();
            assert!(error.refuses_content(), "{url}: {error:?}");
            let answer = crate::http::problem::ApiError::from(error);
            assert_eq!(answer.kind.status().as_u16(), 422, "{url}: {answer:?}");
            assert!(!answer.detail.contains(&said), "{url}: {}", answer.detail);
            for word in ["jsonb", "unicode", "string or blob", "sqlite", "postgres"] {
                assert!(
                    !answer.detail.to_lowercase().contains(word),
                    "{url}: {}",
                    answer.detail
                );
            }
            assert!(answer.source.is_some(), "the cause is kept for the log");
            store.close().await;
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn storable_text_replaces_only_nul() {
        assert_eq!(storable_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(
            storable_text("\u{1}\u{7f} é"),
            std::borrow::Cow::Borrowed("\u{1}\u{7f} é")
        ));
        assert_eq!(into_storable("x\0".to_owned()), "x\u{FFFD}");
    }

    #[test]
    fn sqlite_urls_open_in_create_mode() {
        assert_eq!(
            sqlite_create_mode("sqlite://data/x.db"),
            "sqlite://data/x.db?mode=rwc"
        );
        assert_eq!(
            sqlite_create_mode("sqlite://x.db?foo=1"),
            "sqlite://x.db?foo=1&mode=rwc"
        );
        assert_eq!(
            sqlite_create_mode("sqlite://x.db?mode=ro"),
            "sqlite://x.db?mode=ro"
        );
        assert_eq!(sqlite_create_mode("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(list_placeholders(2, 3), "$2, $3, $4");
        assert_eq!(values_placeholders(2, 2), "($1, $2), ($3, $4)");
    }

    #[test]
    fn backend_comes_from_the_url_scheme() {
        assert_eq!(
            Backend::from_url("postgresql://x").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::from_url("sqlite::memory:").unwrap(),
            Backend::Sqlite
        );
        assert!(Backend::from_url("mysql://x").is_err());
    }

    #[tokio::test]
    async fn sqlite_commits_as_durably_as_configured() {
        let dir = std::env::temp_dir().join(format!("loupe-sync-{}", uuid::Uuid::new_v4()));
        for (setting, expected) in [(SqliteSynchronous::Normal, 1), (SqliteSynchronous::Full, 2)] {
            let mut options =
                StoreOptions::new(format!("sqlite://{}/{setting:?}.db", dir.display()));
            options.sqlite_synchronous = setting;
            let store = Store::connect(&options).await.unwrap();
            for pool in [&store.pool, &store.writer] {
                let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                assert_eq!(level, expected, "{setting:?}");
                let temp_store: i64 = sqlx::query_scalar("PRAGMA temp_store")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                assert_eq!(temp_store, 2, "temporary files in memory");
                let secure_delete: i64 = sqlx::query_scalar("PRAGMA secure_delete")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                assert_eq!(secure_delete, 1, "deleted text is overwritten");
            }
            // The group writer's connection, which commits the appends.
            let path = dir.join(format!("{setting:?}.db"));
            let writer = append::WriterConnection::open(&path, setting).unwrap();
            let writer = writer.connection();
            let level: i64 = writer
                .query_row("PRAGMA synchronous", [], |row| row.get(0))
                .unwrap();
            assert_eq!(level, expected, "{setting:?}, the group writer");
            let temp_store: i64 = writer
                .query_row("PRAGMA temp_store", [], |row| row.get(0))
                .unwrap();
            assert_eq!(temp_store, 2, "temporary files in memory");
            let secure_delete: i64 = writer
                .query_row("PRAGMA secure_delete", [], |row| row.get(0))
                .unwrap();
            assert_eq!(
                secure_delete, 1,
                "deleted text is overwritten, the group writer"
            );
            store.close().await;
        }
        assert_eq!("FULL".parse(), Ok(SqliteSynchronous::Full));
        assert!("off".parse::<SqliteSynchronous>().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
