//! Every SQL statement of Loupe lives under this module.
//!
//! One implementation serves both backends through sqlx's `Any` driver: the schema uses only
//! types both share (TEXT, BIGINT), and the few statements whose dialects differ branch on
//! [`Backend`]. Handlers never see which backend they talk to.
//!
//! Every read and write of thread data takes a [`TenantId`], so no caller can reach another
//! tenant's threads by forgetting a filter.

mod admin;
mod context;
mod cursors;
mod jobs;
mod keys;
mod messages;
mod settings;
mod threads;
mod transcripts;
mod tree;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};

pub use admin::database_url;
pub use context::{ContextWindow, MAX_WINDOW_ENTRIES};
pub use cursors::{
    AdvanceOutcome, AdvanceRequest, Bookmark, Claim, CursorState, Lease, PendingBatch,
};
pub use jobs::{
    ClaimedJob, CompactionWrite, EnqueueOutcome, Job, JobState, NewJob, NOTIFY_CHANNEL,
};
pub use keys::{ApiKeyRecord, CreatedKey, KeyIdentity, TenantRecord};
pub use messages::{fingerprint, AppendOutcome, AppendRequest, MessagePage};
pub use settings::{MicrocompactSettings, ThreadSettings};
pub use threads::{NewThread, Thread, ThreadPage};
pub use tree::{NewNode, OutlineSnapshot, TreeStatus, ZoomRead};

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
            MessageRef::Uuid(uuid) => write!(f, "uuid {uuid}"),
        }
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
    #[error("the window holds {entries} entries, more than {max}; start it later")]
    WindowTooLarge { entries: i64, max: i64 },
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
    #[error("a tenant with id {0:?} already exists")]
    TenantExists(String),
    #[error("API key not found")]
    KeyNotFound,
    #[error("invalid pagination cursor")]
    BadCursor,
    #[error("job not found")]
    JobNotFound,
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
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Tables of per-thread data, all keyed by `thread_key`; deleting a thread empties them.
const THREAD_DATA_TABLES: &[&str] = &[
    "messages",
    "cursors",
    "jobs",
    "thread_settings",
    "tree_nodes",
    "outlines",
];

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The database, whichever backend it is.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// The database URL, for connections outside the pool (PostgreSQL `LISTEN`).
    url: Arc<str>,
    /// Woken after a job is enqueued in this process (workers also poll, and on PostgreSQL
    /// listen for `NOTIFY` from other processes).
    job_signal: Arc<tokio::sync::Notify>,
    /// Server default of the auto-compaction threshold, in estimated tokens; 0 disables it.
    auto_compact_tokens: i64,
    /// Attempts a job enqueued by a write (auto-compaction) gets.
    job_max_attempts: i64,
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
}

/// Reference-behaviour §4.1: effective window (200,000 − 20,000 output reserve) − 13,000.
pub const DEFAULT_AUTO_COMPACT_TOKENS: i64 = 167_000;

/// Attempts of a job before it ends `failed`.
pub const DEFAULT_JOB_MAX_ATTEMPTS: i64 = 5;

impl StoreOptions {
    pub fn new(url: impl Into<String>) -> Self {
        StoreOptions {
            url: url.into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            auto_compact_tokens: DEFAULT_AUTO_COMPACT_TOKENS,
            job_max_attempts: DEFAULT_JOB_MAX_ATTEMPTS,
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
        let connect_options = AnyConnectOptions::from_str(&sqlite_create_mode(&options.url))?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL lets readers run beside the one writer; a writer waits for the
                        // lock instead of failing at once.
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect_options)
            .await?;
        Ok(Store {
            pool,
            backend,
            url: options.url.as_str().into(),
            job_signal: Arc::new(tokio::sync::Notify::new()),
            auto_compact_tokens: options.auto_compact_tokens.max(0),
            job_max_attempts: options.job_max_attempts.max(1),
        })
    }

    /// Applies the migrations of this backend that have not run yet.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = match self.backend {
            Backend::Postgres => &POSTGRES_MIGRATIONS,
            Backend::Sqlite => &SQLITE_MIGRATIONS,
        };
        migrator.run(&self.pool).await?;
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL the store was opened with.
    pub fn url(&self) -> &str {
        &self.url
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
    }
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
    (0..rows)
        .map(|row| format!("({})", list_placeholders(row * width + 1, width)))
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
}
