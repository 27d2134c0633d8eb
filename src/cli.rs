//! Command line and configuration: every setting is a flag and an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

mod transcripts;

use crate::http::{AuthMode, Limits};
use crate::jobs::JobsConfig;
use crate::store::{SqliteSynchronous, Store, StoreOptions, TenantId};
use crate::summarize::{self, Backend, SummarizerConfig};
use crate::telemetry::LogFormat;

/// Loupe keeps LLM conversation threads whole and hands them back ready for the model.
#[derive(Debug, Parser)]
#[command(name = "loupe", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// With no subcommand, Loupe serves (as `loupe serve`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

// Parsed once at start: the size of the `serve` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API (the default).
    Serve(Box<ServeArgs>),
    /// Apply the database migrations, then exit.
    Migrate(DatabaseArgs),
    /// Print the OpenAPI document.
    Openapi,
    /// Create, list and revoke API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Create and list tenants.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// Import JSON Lines transcripts (Claude Code session files) into a thread.
    Import(transcripts::ImportArgs),
    /// Export a thread as JSON Lines, each entry as it was sent.
    Export(transcripts::ExportArgs),
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key for a tenant (creating the tenant when missing); prints the key once.
    Create {
        /// The tenant the key acts for.
        #[arg(long)]
        tenant: String,
        /// What the key is for.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List keys (their public prefixes, never the keys).
    List {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Revoke a key by its id (`key_…`).
    Revoke {
        key_id: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant.
    Create {
        id: String,
        /// A display name (defaults to the id).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

/// A secret from the command line or the environment; never printed by `Debug`.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::str::FromStr for Secret {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Secret(value.to_owned()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Shortest accepted admin key.
pub const MIN_ADMIN_KEY_LEN: usize = 16;

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://…` for PostgreSQL; `sqlite://path` for the embedded database (the default).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://data/loupe.db",
        hide_env_values = true
    )]
    pub database_url: String,
    /// Most open database connections.
    #[arg(long, env = "LOUPE_DB_MAX_CONNECTIONS", default_value_t = crate::store::DEFAULT_MAX_CONNECTIONS)]
    pub db_max_connections: u32,
}

/// The database of the server: where it is, and the tuning of its append path, which only a
/// serving process uses. The other subcommands take [`DatabaseArgs`] alone, so their help lists
/// nothing they would ignore.
#[derive(Debug, Clone, Args)]
pub struct ServeDatabaseArgs {
    #[command(flatten)]
    pub connection: DatabaseArgs,
    /// SQLite only: `normal` (an answered append survives a crash of the process) or `full`
    /// (it survives a power loss too: the WAL is synced at every commit).
    #[arg(long, env = "LOUPE_SQLITE_SYNCHRONOUS", default_value = "normal", value_parser = clap::builder::TypedValueParser::try_map(clap::builder::PossibleValuesParser::new(["normal", "full"]), |v| v.parse::<SqliteSynchronous>()))]
    pub sqlite_synchronous: SqliteSynchronous,
    /// PostgreSQL only: how long, in microseconds, a group of appends waits for as many appends
    /// as the last groups held before it commits (0: no wait). Fuller groups cost the database
    /// less per append; a lone writer never waits.
    #[arg(long, env = "LOUPE_APPEND_GATHER_US", default_value_t = crate::store::DEFAULT_APPEND_GATHER.as_micros() as u64)]
    pub append_gather_us: u64,
    /// PostgreSQL only: a streaming standby of the primary that reads may go to (repeatable; in
    /// the environment, comma-separated). A read that must see a write waits for a standby to
    /// replay it at most `--read-wait-ms`, then reads from the primary (docs/SCALING.md).
    #[arg(
        long = "read-database-url",
        env = "LOUPE_READ_DATABASE_URLS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub read_database_urls: Vec<String>,
    /// Milliseconds a read waits for a standby to replay what it must see.
    #[arg(long, env = "LOUPE_READ_WAIT_MS", default_value_t = 100)]
    pub read_wait_ms: u64,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "LOUPE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub database: ServeDatabaseArgs,
    /// Largest accepted request body, in bytes (default 32 MiB, the largest provider request).
    #[arg(long, env = "LOUPE_BODY_LIMIT", default_value_t = Limits::DEFAULT.body_bytes)]
    pub body_limit: usize,
    /// Seconds a request may run before it is answered with 503.
    #[arg(long, env = "LOUPE_REQUEST_TIMEOUT_SECS", default_value_t = Limits::DEFAULT.request_timeout.as_secs())]
    pub request_timeout_secs: u64,
    /// Most messages accepted in one append.
    #[arg(long, env = "LOUPE_MAX_BATCH_MESSAGES", default_value_t = Limits::DEFAULT.max_batch_messages)]
    pub max_batch_messages: usize,
    /// Seconds a cursor claim's lease lasts when the claim names none.
    #[arg(long, env = "LOUPE_CURSOR_LEASE_SECS", default_value_t = Limits::DEFAULT.cursor_lease_default.as_secs())]
    pub cursor_lease_secs: u64,
    /// Longest lease, in seconds, a cursor claim may ask for.
    #[arg(long, env = "LOUPE_CURSOR_LEASE_MAX_SECS", default_value_t = Limits::DEFAULT.cursor_lease_max.as_secs())]
    pub cursor_lease_max_secs: u64,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, env = "LOUPE_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Log format.
    #[arg(long, env = "LOUPE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    /// The admin key: guards `/v1/admin` and `/metrics`, and turns on keyed mode. At least 16
    /// characters.
    #[arg(long, env = "LOUPE_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<Secret>,
    /// Serve without API keys on a non-loopback address (anyone who reaches it reads every
    /// thread).
    #[arg(long, env = "LOUPE_ALLOW_OPEN")]
    pub allow_open: bool,
    /// Requests per second each tenant may send on average (0 turns the limit off).
    #[arg(long, env = "LOUPE_RATE_LIMIT_PER_SEC", default_value_t = Limits::DEFAULT.rate_limit_per_sec)]
    pub rate_limit_per_sec: f64,
    /// Requests a tenant may send at once above the average rate.
    #[arg(long, env = "LOUPE_RATE_LIMIT_BURST", default_value_t = Limits::DEFAULT.rate_limit_burst)]
    pub rate_limit_burst: u32,
    /// Most expensive requests (context, rounds, normalize) running at once.
    #[arg(long, env = "LOUPE_MAX_EXPENSIVE_REQUESTS", default_value_t = Limits::DEFAULT.max_expensive_requests)]
    pub max_expensive_requests: usize,
    /// Milliseconds an expensive request waits for a slot before 503 `overloaded`.
    #[arg(long, env = "LOUPE_EXPENSIVE_WAIT_MS", default_value_t = Limits::DEFAULT.expensive_wait.as_millis() as u64)]
    pub expensive_wait_ms: u64,
    /// Most expensive requests one tenant may run at once (its share of
    /// --max-expensive-requests; open mode has one tenant, which gets them all).
    #[arg(long, env = "LOUPE_MAX_EXPENSIVE_PER_TENANT", default_value_t = Limits::DEFAULT.max_expensive_per_tenant)]
    pub max_expensive_per_tenant: usize,
    /// Seconds a request body may take to arrive; a slower one gets 408 `body-timeout`.
    #[arg(long, env = "LOUPE_BODY_READ_TIMEOUT_SECS", default_value_t = Limits::DEFAULT.body_read_timeout.as_secs())]
    pub body_read_timeout_secs: u64,
    /// Seconds a connection may take to send a request's headers before it is closed.
    #[arg(long, env = "LOUPE_HEADER_READ_TIMEOUT_SECS", default_value_t = Limits::DEFAULT.header_read_timeout.as_secs())]
    pub header_read_timeout_secs: u64,
    /// Most open client connections; further connections wait in the listen backlog.
    #[arg(long, env = "LOUPE_MAX_CONNECTIONS", default_value_t = Limits::DEFAULT.max_connections)]
    pub max_connections: usize,
    /// Largest thread metadata, in bytes of JSON.
    #[arg(long, env = "LOUPE_MAX_METADATA_BYTES", default_value_t = Limits::DEFAULT.max_metadata_bytes)]
    pub max_metadata_bytes: usize,
    /// Most bytes of message bodies in one page of messages (a page always holds at least one).
    #[arg(long, env = "LOUPE_MAX_PAGE_BYTES", default_value_t = Limits::DEFAULT.max_page_bytes)]
    pub max_page_bytes: usize,
    /// Bytes of normalized context prefixes kept in memory (per process), so a context read
    /// normalizes only what was appended since the last read (0 turns the cache off).
    #[arg(long, env = "LOUPE_CONTEXT_CACHE_BYTES", default_value_t = Limits::DEFAULT.context_cache_bytes)]
    pub context_cache_bytes: usize,
    /// Host names that open mode answers on `/v1` and `/metrics` besides `localhost`,
    /// `127.0.0.1` and `[::1]` (comma-separated, without ports). Keyed mode answers any host.
    #[arg(long, env = "LOUPE_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Accept webhook endpoints on loopback and private addresses, and send to them (off by
    /// default: a tenant could otherwise reach the service's own network).
    #[arg(long, env = "LOUPE_WEBHOOKS_ALLOW_PRIVATE")]
    pub webhooks_allow_private: bool,
    /// Slowest average rate, in bytes per second, at which an import's body may arrive once its
    /// first body-read timeout has passed.
    #[arg(long, env = "LOUPE_IMPORT_MIN_BYTES_PER_SEC", default_value_t = Limits::DEFAULT.import_min_bytes_per_sec)]
    pub import_min_bytes_per_sec: u64,
    /// Seconds an import may run, however fast its body arrives.
    #[arg(long, env = "LOUPE_IMPORT_TIMEOUT_SECS", default_value_t = Limits::DEFAULT.import_timeout.as_secs())]
    pub import_timeout_secs: u64,
    /// Most imports one tenant may run at once.
    #[arg(long, env = "LOUPE_MAX_IMPORTS_PER_TENANT", default_value_t = Limits::DEFAULT.max_imports_per_tenant)]
    pub max_imports_per_tenant: usize,
    /// Most requests one tenant may have in flight at once (default: a quarter of
    /// --max-connections; open mode has one tenant, which gets them all).
    #[arg(long, env = "LOUPE_MAX_REQUESTS_PER_TENANT")]
    pub max_requests_per_tenant: Option<usize>,
    /// Seconds a write to a client may wait for the client to read before the connection closes.
    #[arg(long, env = "LOUPE_WRITE_TIMEOUT_SECS", default_value_t = Limits::DEFAULT.write_timeout.as_secs())]
    pub write_timeout_secs: u64,
    /// Memory the request bodies held at once across the process may take while they are
    /// handled: each counted as its parsed values plus four copies of its text, what storing it
    /// holds at its peak (at least five times --body-limit); past it requests get 503
    /// `overloaded`, and a body that alone would pass it 413.
    #[arg(long, env = "LOUPE_MAX_INFLIGHT_BODY_BYTES", default_value_t = Limits::DEFAULT.max_inflight_body_bytes)]
    pub max_inflight_body_bytes: usize,
    /// Bytes of stored entries that answers hold at once across the process: context windows
    /// past 1 MiB, message pages, cursor batches, exports, rounds and event streams (a page is
    /// charged six times its stored bytes while it is built, then its answer's length until it
    /// is sent); a read waits for room, a tenant may hold half (0: no budget).
    #[arg(long, env = "LOUPE_MAX_INFLIGHT_WINDOW_BYTES", default_value_t = Limits::DEFAULT.max_inflight_window_bytes)]
    pub max_inflight_window_bytes: usize,
    /// Most connections one peer address (an IPv6 /64) may hold open at once (default: a
    /// quarter of --max-connections; 0: no limit, for a reverse proxy that is every client's
    /// address); past it its new connections are closed.
    #[arg(long, env = "LOUPE_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,
    /// Most bytes of message bodies one thread may store (0: no limit); an append past it gets
    /// 413 `thread-too-large`.
    #[arg(long, env = "LOUPE_MAX_THREAD_BYTES", default_value_t = crate::store::DEFAULT_MAX_THREAD_BYTES)]
    pub max_thread_bytes: i64,
    /// Failed authentications one peer address may make per second on average (0: no limit).
    #[arg(long, env = "LOUPE_AUTH_FAILURES_PER_SEC", default_value_t = Limits::DEFAULT.auth_failures_per_sec)]
    pub auth_failures_per_sec: f64,
    /// Failed authentications one peer address may make at once above the average.
    #[arg(long, env = "LOUPE_AUTH_FAILURE_BURST", default_value_t = Limits::DEFAULT.auth_failure_burst)]
    pub auth_failure_burst: u32,
    /// What this process runs: the HTTP API, the background job workers, or both.
    #[arg(long, env = "LOUPE_ROLE", value_enum, default_value_t = Role::All)]
    pub role: Role,
    #[command(flatten)]
    pub jobs: JobArgs,
    #[command(flatten)]
    pub summarizer: SummarizerArgs,
}

/// The summarizer that compaction and the summary tree use.
#[derive(Debug, Clone, Args)]
pub struct SummarizerArgs {
    /// `extractive` (offline, no model), `anthropic` or `openai` (any OpenAI-compatible server).
    #[arg(
        long = "summarizer",
        env = "LOUPE_SUMMARIZER",
        default_value = "extractive"
    )]
    pub backend: Backend,
    /// The provider's base URL, without the `/v1/...` path (default: the provider's own).
    #[arg(long = "summarizer-base-url", env = "LOUPE_SUMMARIZER_BASE_URL", value_parser = http_url)]
    pub base_url: Option<String>,
    /// The model (default: claude-haiku-4-5 for anthropic, gpt-4o-mini for openai).
    #[arg(long = "summarizer-model", env = "LOUPE_SUMMARIZER_MODEL")]
    pub model: Option<String>,
    /// The provider's API key; when unset, ANTHROPIC_API_KEY or OPENAI_API_KEY.
    #[arg(
        long = "summarizer-api-key",
        env = "LOUPE_SUMMARIZER_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<Secret>,
    /// Seconds one HTTP request to the provider may take.
    #[arg(long = "summarizer-timeout-secs", env = "LOUPE_SUMMARIZER_TIMEOUT_SECS",
          default_value_t = summarize::DEFAULT_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_secs: u64,
    /// HTTP attempts per model call, the first included.
    #[arg(long = "summarizer-max-attempts", env = "LOUPE_SUMMARIZER_MAX_ATTEMPTS",
          default_value_t = summarize::DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// First retry delay in milliseconds; doubled per retry.
    #[arg(long = "summarizer-backoff-base-ms", env = "LOUPE_SUMMARIZER_BACKOFF_BASE_MS",
          default_value_t = summarize::DEFAULT_BACKOFF_BASE_MS)]
    pub backoff_base_ms: u64,
    /// Most bytes of rendered history sent in one call; longer histories go in chunks.
    #[arg(long = "summarizer-max-input-bytes", env = "LOUPE_SUMMARIZER_MAX_INPUT_BYTES",
          default_value_t = summarize::DEFAULT_MAX_INPUT_BYTES, value_parser = at_least_1024)]
    pub max_input_bytes: usize,
    /// Output token cap per call (default: 8000 for anthropic; not sent to openai unless set).
    #[arg(
        long = "summarizer-max-output-tokens",
        env = "LOUPE_SUMMARIZER_MAX_OUTPUT_TOKENS"
    )]
    pub max_output_tokens: Option<u32>,
}

fn http_url(value: &str) -> Result<String, String> {
    if value.starts_with("http://") || value.starts_with("https://") {
        Ok(value.to_owned())
    } else {
        Err(format!("must be an http(s) URL, not {value:?}"))
    }
}

fn at_least_1024(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1024 => Ok(n),
        _ => Err(format!(
            "must be a whole number of at least 1024, not {value:?}"
        )),
    }
}

impl SummarizerArgs {
    /// The summarizer's configuration. `provider_key` looks up the provider's own key variable
    /// (ANTHROPIC_API_KEY, OPENAI_API_KEY), used when no Loupe key is given.
    pub fn config(&self, provider_key: impl Fn(&str) -> Option<String>) -> SummarizerConfig {
        let mut config = SummarizerConfig::new(self.backend);
        if let Some(url) = &self.base_url {
            config.base_url = url.clone();
        }
        if let Some(model) = &self.model {
            config.model = model.clone();
        }
        let fallback_key = match self.backend {
            Backend::Anthropic => provider_key("ANTHROPIC_API_KEY"),
            Backend::Openai => provider_key("OPENAI_API_KEY"),
            Backend::Extractive => None,
        };
        config.api_key = self
            .api_key
            .as_ref()
            .map(|secret| secret.0.clone())
            .or(fallback_key.filter(|key| !key.trim().is_empty()));
        config.timeout = Duration::from_secs(self.timeout_secs);
        config.max_attempts = self.max_attempts;
        config.backoff_base = Duration::from_millis(self.backoff_base_ms);
        config.max_input_bytes = self.max_input_bytes;
        config.max_output_tokens = self.max_output_tokens;
        config
    }
}

/// Background jobs (compaction) and their triggers.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Job worker tasks in this process (roles `worker` and `all`).
    #[arg(long, env = "LOUPE_WORKERS", default_value_t = 2)]
    pub workers: usize,
    /// Default auto-compaction threshold in estimated context tokens (0 = off); threads
    /// override it in their settings. 167,000 = 200,000 − 20,000 output reserve − 13,000 buffer.
    #[arg(long, env = "LOUPE_AUTO_COMPACT_TOKENS", default_value_t = crate::store::DEFAULT_AUTO_COMPACT_TOKENS)]
    pub auto_compact_tokens: i64,
    /// Attempts of a job before it ends `failed`.
    #[arg(long, env = "LOUPE_JOB_MAX_ATTEMPTS", default_value_t = crate::store::DEFAULT_JOB_MAX_ATTEMPTS)]
    pub job_max_attempts: i64,
    /// Seconds a worker's claim on a job lasts without renewal (renewed every third of it);
    /// a job whose worker died is claimed again after this.
    #[arg(long, env = "LOUPE_JOB_LEASE_SECS", default_value_t = JobsConfig::DEFAULT.lease.as_secs())]
    pub job_lease_secs: u64,
    /// First retry delay after a failed attempt, in milliseconds; doubled per attempt.
    #[arg(long, env = "LOUPE_JOB_BACKOFF_BASE_MS", default_value_t = JobsConfig::DEFAULT.backoff_base.as_millis() as u64)]
    pub job_backoff_base_ms: u64,
    /// Longest retry delay, in seconds.
    #[arg(long, env = "LOUPE_JOB_BACKOFF_MAX_SECS", default_value_t = JobsConfig::DEFAULT.backoff_max.as_secs())]
    pub job_backoff_max_secs: u64,
    /// Most estimated tokens of history in one summarizer request of a compaction: a longer
    /// window is summarized in pages, each page's summary folded into the next, so a job holds
    /// one page of message bodies at a time. At least 1,000.
    #[arg(long, env = "LOUPE_COMPACTION_PAGE_TOKENS", default_value_t = JobsConfig::DEFAULT.compaction_page_tokens)]
    pub compaction_page_tokens: u64,
    /// Milliseconds between looks for work when no wake-up arrives.
    #[arg(long, env = "LOUPE_JOB_POLL_MS", default_value_t = JobsConfig::DEFAULT.poll_interval.as_millis() as u64)]
    pub job_poll_ms: u64,
    /// Seconds between retention sweeps (a job deleting expired threads and trimming, in
    /// batches).
    #[arg(long, env = "LOUPE_RETENTION_SWEEP_SECS", default_value_t = JobsConfig::DEFAULT.retention_sweep.as_secs())]
    pub retention_sweep_secs: u64,
    /// This process's name among the processes sharing the database (default: the host name).
    /// On start it gives back at once the jobs it held when it stopped; give each process on
    /// one host its own name. 1–64 characters of `[A-Za-z0-9._:-]`.
    #[arg(long, env = "LOUPE_INSTANCE_ID", value_parser = instance_id)]
    pub instance_id: Option<String>,
}

fn instance_id(value: &str) -> Result<String, String> {
    if crate::auth::is_identifier(value, 64) {
        Ok(value.to_owned())
    } else {
        Err("1 to 64 characters of [A-Za-z0-9._:-]".to_owned())
    }
}

/// The host's name, the default instance id; `local` when it cannot be read or is not one.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| crate::auth::is_identifier(name, 64))
        .unwrap_or_else(|| "local".to_owned())
}

impl JobArgs {
    pub fn config(&self) -> JobsConfig {
        JobsConfig {
            lease: Duration::from_secs(self.job_lease_secs.max(1)),
            backoff_base: Duration::from_millis(self.job_backoff_base_ms),
            backoff_max: Duration::from_secs(self.job_backoff_max_secs),
            poll_interval: Duration::from_millis(self.job_poll_ms.max(10)),
            compaction_page_tokens: self.compaction_page_tokens.max(1_000),
            retention_sweep: Duration::from_secs(self.retention_sweep_secs.max(1)),
            instance_id: self.instance_id.clone().unwrap_or_else(host_name).into(),
            ..JobsConfig::DEFAULT
        }
    }
}

/// What a `serve` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// The HTTP API only (jobs are enqueued, never run here).
    Api,
    /// Job workers only (no HTTP listener).
    Worker,
    /// Both.
    All,
}

impl ServeArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            body_bytes: self.body_limit,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            max_batch_messages: self.max_batch_messages,
            cursor_lease_default: Duration::from_secs(self.cursor_lease_secs),
            cursor_lease_max: Duration::from_secs(self.cursor_lease_max_secs),
            rate_limit_per_sec: self.rate_limit_per_sec,
            rate_limit_burst: self.rate_limit_burst,
            max_expensive_requests: self.max_expensive_requests,
            expensive_wait: Duration::from_millis(self.expensive_wait_ms),
            max_expensive_per_tenant: self.max_expensive_per_tenant,
            body_read_timeout: Duration::from_secs(self.body_read_timeout_secs.max(1)),
            max_metadata_bytes: self.max_metadata_bytes,
            max_page_bytes: self.max_page_bytes.max(1),
            max_connections: self.max_connections.max(1),
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs.max(1)),
            context_cache_bytes: self.context_cache_bytes,
            allowed_hosts: self.allowed_hosts.clone(),
            webhooks_allow_private: self.webhooks_allow_private,
            import_min_bytes_per_sec: self.import_min_bytes_per_sec,
            import_timeout: Duration::from_secs(self.import_timeout_secs.max(1)),
            max_imports_per_tenant: self.max_imports_per_tenant.max(1),
            max_requests_per_tenant: self
                .max_requests_per_tenant
                .unwrap_or(self.max_connections / 4)
                .max(1),
            write_timeout: Duration::from_secs(self.write_timeout_secs.max(1)),
            // A body of the largest size must fit alone, with its parsed values and copies.
            max_inflight_body_bytes: self.max_inflight_body_bytes.max(
                crate::http::guard::body_peak_bytes(self.body_limit, self.body_limit),
            ),
            max_inflight_window_bytes: self.max_inflight_window_bytes,
            max_connections_per_address: self
                .max_connections_per_address
                .unwrap_or((self.max_connections / 4).max(1)),
            auth_failures_per_sec: self.auth_failures_per_sec,
            auth_failure_burst: self.auth_failure_burst,
            ..Limits::default()
        }
    }
}

impl DatabaseArgs {
    pub fn options(&self) -> StoreOptions {
        let mut options = StoreOptions::new(&self.database_url);
        options.max_connections = self.db_max_connections;
        options
    }

    pub async fn open(&self) -> anyhow::Result<Store> {
        self.open_with(self.options()).await
    }

    pub async fn open_with(&self, options: StoreOptions) -> anyhow::Result<Store> {
        let store = Store::connect(&options)
            .await
            .with_context(|| format!("cannot open the database {}", redact(&self.database_url)))?;
        store
            .migrate()
            .await
            .context("cannot migrate the database")?;
        Ok(store)
    }
}

impl ServeDatabaseArgs {
    pub fn options(&self) -> StoreOptions {
        let mut options = self.connection.options();
        options.sqlite_synchronous = self.sqlite_synchronous;
        options.append_gather = Duration::from_micros(self.append_gather_us);
        options
    }

    pub async fn open_with(&self, options: StoreOptions) -> anyhow::Result<Store> {
        let store = self.connection.open_with(options.clone()).await?;
        store
            .with_standbys(
                &self.read_database_urls,
                Duration::from_millis(self.read_wait_ms),
                &options,
            )
            .await
            .context("cannot use the read standbys")
    }
}

/// Hides the password of a database URL in logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Runs the command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => serve(cli.serve).await,
        Some(Command::Serve(args)) => serve(*args).await,
        Some(Command::Migrate(args)) => {
            crate::telemetry::init(LogFormat::Pretty);
            args.open().await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Some(Command::Openapi) => {
            println!("{}", serde_json::to_string_pretty(&crate::http::openapi())?);
            Ok(())
        }
        Some(Command::Keys(command)) => keys(command).await,
        Some(Command::Tenants(command)) => tenants(command).await,
        Some(Command::Import(args)) => transcripts::import(args).await,
        Some(Command::Export(args)) => transcripts::export(args).await,
    }
}

fn tenant_arg(id: &str) -> anyhow::Result<TenantId> {
    crate::auth::check_tenant_id(id).map_err(|problem| anyhow::anyhow!("{id:?}: {problem}"))?;
    Ok(TenantId(id.to_owned()))
}

async fn keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create {
            tenant,
            name,
            database,
        } => {
            let tenant = tenant_arg(&tenant)?;
            let store = database.open().await?;
            let created = store.create_api_key(&tenant, name.as_deref()).await?;
            store.close().await;
            eprintln!(
                "created key {} for tenant {} (shown only now; Loupe keeps only its hash):",
                created.record.id, created.record.tenant
            );
            println!("{}", created.plaintext);
            Ok(())
        }
        KeysCommand::List { tenant, database } => {
            let tenant = tenant.as_deref().map(tenant_arg).transpose()?;
            let store = database.open().await?;
            let keys = store.list_api_keys(tenant.as_ref()).await?;
            store.close().await;
            println!("ID\tTENANT\tPREFIX\tNAME\tCREATED\tREVOKED");
            for key in keys {
                println!(
                    "{}\t{}\tlp_{}_…\t{}\t{}\t{}",
                    key.id,
                    key.tenant,
                    key.prefix,
                    key.name,
                    key.created_at.to_rfc3339(),
                    key.revoked_at
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_else(|| "-".to_owned())
                );
            }
            Ok(())
        }
        KeysCommand::Revoke { key_id, database } => {
            let store = database.open().await?;
            let result = store.revoke_api_key(&key_id).await;
            store.close().await;
            result.with_context(|| format!("cannot revoke {key_id}"))?;
            eprintln!("revoked {key_id}");
            Ok(())
        }
    }
}

async fn tenants(command: TenantsCommand) -> anyhow::Result<()> {
    match command {
        TenantsCommand::Create { id, name, database } => {
            let tenant = tenant_arg(&id)?;
            let store = database.open().await?;
            let result = store.create_tenant(&tenant, name.as_deref()).await;
            store.close().await;
            let created = result?;
            eprintln!("created tenant {}", created.id);
            Ok(())
        }
        TenantsCommand::List { database } => {
            let store = database.open().await?;
            let tenants = store.list_tenants().await?;
            store.close().await;
            println!("ID\tNAME\tCREATED");
            for tenant in tenants {
                println!(
                    "{}\t{}\t{}",
                    tenant.id,
                    tenant.name,
                    tenant.created_at.to_rfc3339()
                );
            }
            Ok(())
        }
    }
}

/// Open mode may listen only on loopback unless explicitly allowed, and never on a database
/// that has had keys (all revoked since): that would fail open, so it needs `--allow-open` too.
pub fn check_open_mode(
    open: bool,
    addr: SocketAddr,
    allow_open: bool,
    had_keys: bool,
) -> Result<(), String> {
    if open && had_keys && !allow_open {
        return Err(
            "refusing to serve without API keys: this database has had keys, and all are revoked.              Create a key (`loupe keys create --tenant T`), set LOUPE_ADMIN_KEY, or pass              --allow-open (LOUPE_ALLOW_OPEN=true) to serve it open"
                .to_owned(),
        );
    }
    if open && !addr.ip().is_loopback() && !allow_open {
        Err(format!(
            "refusing to serve without API keys on {addr}: anyone who reaches it could read every \
             thread. Create a key (`loupe keys create --tenant T`), set LOUPE_ADMIN_KEY, or pass \
             --allow-open (LOUPE_ALLOW_OPEN=true)"
        ))
    } else {
        Ok(())
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::telemetry::init(args.log_format);
    let admin_key = args.admin_key.clone().map(|secret| secret.0);
    if admin_key
        .as_ref()
        .is_some_and(|key| key.chars().count() < MIN_ADMIN_KEY_LEN)
    {
        anyhow::bail!("LOUPE_ADMIN_KEY must be at least {MIN_ADMIN_KEY_LEN} characters");
    }
    let mut options = args.database.options();
    options.auto_compact_tokens = args.jobs.auto_compact_tokens;
    options.job_max_attempts = args.jobs.job_max_attempts;
    options.max_thread_bytes = args.max_thread_bytes;
    let store = args.database.open_with(options).await?;
    tracing::info!(backend = store.backend().name(), role = ?args.role, "database ready");
    let has_keys = store
        .has_active_api_keys()
        .await
        .context("cannot read the API keys")?;
    let auth = AuthMode::resolve(admin_key, has_keys);
    let had_keys = auth.is_open()
        && store
            .has_had_api_keys()
            .await
            .context("cannot read the API keys")?;
    check_open_mode(auth.is_open(), args.addr, args.allow_open, had_keys)
        .map_err(anyhow::Error::msg)?;
    if auth.is_open() {
        tracing::warn!(
            addr = %args.addr,
            "OPEN MODE: no API keys are configured, so every request acts for the single \
             `default` tenant without authentication. Create a key with `loupe keys create \
             --tenant T` (or set LOUPE_ADMIN_KEY) and restart to require keys"
        );
    } else {
        tracing::info!(
            admin_api = matches!(&auth, AuthMode::Keyed { admin_key: Some(_) }),
            "API keys required"
        );
    }
    tokio::spawn(async {
        // Histogram samples are folded into buckets here, so memory stays flat between scrapes.
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            crate::metrics::run_upkeep();
        }
    });
    let workers = if args.role == Role::Api {
        0
    } else {
        args.jobs.workers
    };
    let summarizer_config = args.summarizer.config(|name| std::env::var(name).ok());
    let listener = if args.role == Role::Worker {
        None
    } else {
        Some(
            tokio::net::TcpListener::bind(args.addr)
                .await
                .with_context(|| format!("cannot listen on {}", args.addr))?,
        )
    };
    let app = crate::app::App {
        store,
        auth,
        limits: args.limits(),
        listener,
        workers,
        jobs: args.jobs.config(),
        summarizer: crate::summarize::build(&summarizer_config),
        grace: Duration::from_secs(args.shutdown_grace_secs),
    };
    crate::app::run(app, crate::shutdown::signal()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://loupe:secret@db:5432/loupe"),
            "postgres://loupe:***@db:5432/loupe"
        );
        assert_eq!(redact("sqlite://data/loupe.db"), "sqlite://data/loupe.db");
    }

    #[test]
    fn roles_and_workers_come_from_flags() {
        let cli = Cli::try_parse_from(["loupe"]).unwrap();
        assert_eq!(cli.serve.role, Role::All);
        assert_eq!(cli.serve.jobs.auto_compact_tokens, 167_000);
        let cli =
            Cli::try_parse_from(["loupe", "serve", "--role", "worker", "--workers", "4"]).unwrap();
        match cli.command {
            Some(Command::Serve(args)) => {
                assert_eq!((args.role, args.jobs.workers), (Role::Worker, 4));
            }
            other => panic!("expected serve, got {other:?}"),
        }
    }

    /// The flag reaches the store's options; anything but `normal` or `full` is refused.
    #[test]
    fn sqlite_durability_comes_from_its_flag() {
        let synchronous = |args: &[&str]| {
            let cli = Cli::try_parse_from(args)?;
            Ok::<_, clap::Error>(match cli.command {
                Some(Command::Serve(serve)) => serve.database.options().sqlite_synchronous,
                _ => cli.serve.database.options().sqlite_synchronous,
            })
        };
        assert_eq!(synchronous(&["loupe"]).unwrap(), SqliteSynchronous::Normal);
        let full = synchronous(&["loupe", "serve", "--sqlite-synchronous", "full"]);
        assert_eq!(full.unwrap(), SqliteSynchronous::Full);
        assert!(synchronous(&["loupe", "serve", "--sqlite-synchronous", "off"]).is_err());
    }

    /// The page size of a compaction reaches the jobs' configuration, never below 1,000 tokens.
    #[test]
    fn the_compaction_page_comes_from_its_flag() {
        let page = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Some(Command::Serve(serve)) => serve.jobs.config().compaction_page_tokens,
            other => panic!("expected serve, got {other:?}"),
        };
        assert_eq!(
            Cli::try_parse_from(["loupe"])
                .unwrap()
                .serve
                .jobs
                .config()
                .compaction_page_tokens,
            JobsConfig::DEFAULT.compaction_page_tokens
        );
        assert_eq!(
            page(&["loupe", "serve", "--compaction-page-tokens", "1000000"]),
            1_000_000
        );
        assert_eq!(
            page(&["loupe", "serve", "--compaction-page-tokens", "5"]),
            1_000
        );
    }

    /// A tenant's share of requests in flight and an address's share of connections follow
    /// `--max-connections` unless set; the window and thread bounds have their defaults.
    #[test]
    fn shares_follow_the_connections_unless_set() {
        let cli = Cli::try_parse_from(["loupe", "--max-connections", "100"]).unwrap();
        let limits = cli.serve.limits();
        assert_eq!(limits.max_requests_per_tenant, 25);
        assert_eq!(limits.max_connections_per_address, 25);
        assert_eq!(limits.max_inflight_window_bytes, 256 * 1024 * 1024);
        assert_eq!(cli.serve.max_thread_bytes, 1 << 30);
        let cli = Cli::try_parse_from([
            "loupe",
            "--max-requests-per-tenant",
            "7",
            "--max-connections-per-address",
            "0",
            "--max-thread-bytes",
            "0",
        ])
        .unwrap();
        let limits = cli.serve.limits();
        assert_eq!(limits.max_requests_per_tenant, 7);
        assert_eq!(limits.max_connections_per_address, 0);
        assert_eq!(cli.serve.max_thread_bytes, 0);
    }

    #[test]
    fn no_subcommand_means_serve_with_defaults() {
        let cli = Cli::try_parse_from(["loupe"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.addr.to_string(), "127.0.0.1:8080");
        let cli = Cli::try_parse_from(["loupe", "serve", "--addr", "0.0.0.0:9000"]).unwrap();
        match cli.command {
            Some(Command::Serve(args)) => assert_eq!(args.addr.port(), 9000),
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn key_commands_parse() {
        let cli = Cli::try_parse_from([
            "loupe", "keys", "create", "--tenant", "acme", "--name", "ci",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Keys(KeysCommand::Create { ref tenant, .. })) if tenant == "acme"
        ));
        let cli = Cli::try_parse_from(["loupe", "keys", "revoke", "key_1"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Keys(KeysCommand::Revoke { .. }))
        ));
        let cli = Cli::try_parse_from(["loupe", "keys", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Keys(KeysCommand::List { tenant: None, .. }))
        ));
    }

    #[test]
    fn admin_keys_stay_out_of_debug_output() {
        let cli = Cli::try_parse_from(["loupe", "--admin-key", "super-secret-admin-key"]).unwrap();
        assert!(!format!("{cli:?}").contains("super-secret"));
    }

    #[test]
    fn open_mode_stays_on_loopback_unless_allowed() {
        let public: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let local6: SocketAddr = "[::1]:8080".parse().unwrap();
        assert!(check_open_mode(true, public, false, false).is_err());
        assert!(check_open_mode(true, public, true, false).is_ok());
        assert!(check_open_mode(true, local, false, false).is_ok());
        assert!(check_open_mode(true, local6, false, false).is_ok());
        assert!(check_open_mode(false, public, false, false).is_ok());
    }

    #[test]
    fn a_database_whose_keys_were_all_revoked_does_not_fall_back_to_open() {
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(check_open_mode(true, local, false, true).is_err());
        assert!(check_open_mode(true, local, true, true).is_ok());
        // Keyed mode is never refused.
        assert!(check_open_mode(false, local, false, true).is_ok());
    }

    #[test]
    fn the_database_url_stays_out_of_help() {
        use clap::CommandFactory;
        std::env::set_var("DATABASE_URL", "postgres://loupe:hunter2-secret@db/loupe");
        let help = Cli::command().render_long_help().to_string();
        std::env::remove_var("DATABASE_URL");
        assert!(!help.contains("hunter2-secret"), "{help}");
    }
}
