//! Command line and configuration: every setting is a flag and an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

mod transcripts;

use crate::http::{AuthMode, Limits};
use crate::store::{Store, StoreOptions, TenantId};

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API (the default).
    Serve(ServeArgs),
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
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://data/loupe.db")]
    pub database_url: String,
    /// Most open database connections.
    #[arg(long, env = "LOUPE_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "LOUPE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Largest accepted request body, in bytes (default 32 MiB, the largest provider request).
    #[arg(long, env = "LOUPE_BODY_LIMIT", default_value_t = 32 * 1024 * 1024)]
    pub body_limit: usize,
    /// Seconds a request may run before it is answered with 503.
    #[arg(long, env = "LOUPE_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,
    /// Most messages accepted in one append.
    #[arg(long, env = "LOUPE_MAX_BATCH_MESSAGES", default_value_t = 10_000)]
    pub max_batch_messages: usize,
    /// Seconds a cursor claim's lease lasts when the claim names none.
    #[arg(long, env = "LOUPE_CURSOR_LEASE_SECS", default_value_t = 60)]
    pub cursor_lease_secs: u64,
    /// Longest lease, in seconds, a cursor claim may ask for.
    #[arg(long, env = "LOUPE_CURSOR_LEASE_MAX_SECS", default_value_t = 3_600)]
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
    #[arg(long, env = "LOUPE_RATE_LIMIT_PER_SEC", default_value_t = 50.0)]
    pub rate_limit_per_sec: f64,
    /// Requests a tenant may send at once above the average rate.
    #[arg(long, env = "LOUPE_RATE_LIMIT_BURST", default_value_t = 100)]
    pub rate_limit_burst: u32,
    /// Most expensive requests (context, rounds, normalize) running at once.
    #[arg(long, env = "LOUPE_MAX_EXPENSIVE_REQUESTS", default_value_t = 16)]
    pub max_expensive_requests: usize,
    /// Milliseconds an expensive request waits for a slot before 503 `overloaded`.
    #[arg(long, env = "LOUPE_EXPENSIVE_WAIT_MS", default_value_t = 500)]
    pub expensive_wait_ms: u64,
    /// What this process runs: the HTTP API, the background job workers, or both.
    #[arg(long, env = "LOUPE_ROLE", value_enum, default_value_t = Role::All)]
    pub role: Role,
    #[command(flatten)]
    pub jobs: JobArgs,
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
    #[arg(long, env = "LOUPE_JOB_LEASE_SECS", default_value_t = 300)]
    pub job_lease_secs: u64,
    /// First retry delay after a failed attempt, in milliseconds; doubled per attempt.
    #[arg(long, env = "LOUPE_JOB_BACKOFF_BASE_MS", default_value_t = 5_000)]
    pub job_backoff_base_ms: u64,
    /// Longest retry delay, in seconds.
    #[arg(long, env = "LOUPE_JOB_BACKOFF_MAX_SECS", default_value_t = 300)]
    pub job_backoff_max_secs: u64,
    /// Milliseconds between looks for work when no wake-up arrives.
    #[arg(long, env = "LOUPE_JOB_POLL_MS", default_value_t = 1_000)]
    pub job_poll_ms: u64,
}

impl JobArgs {
    pub fn config(&self) -> crate::jobs::JobsConfig {
        crate::jobs::JobsConfig {
            lease: Duration::from_secs(self.job_lease_secs.max(1)),
            backoff_base: Duration::from_millis(self.job_backoff_base_ms),
            backoff_max: Duration::from_secs(self.job_backoff_max_secs),
            poll_interval: Duration::from_millis(self.job_poll_ms.max(10)),
            ..crate::jobs::JobsConfig::default()
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
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
        Some(Command::Serve(args)) => serve(args).await,
        Some(Command::Migrate(args)) => {
            crate::telemetry::init(LogFormat::Pretty);
            args.open().await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Some(Command::Openapi) => {
            println!("{}", crate::http::openapi().to_pretty_json()?);
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

/// Open mode may listen only on loopback unless explicitly allowed.
pub fn check_open_bind(open: bool, addr: SocketAddr, allow_open: bool) -> Result<(), String> {
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
    let store = args.database.open_with(options).await?;
    tracing::info!(backend = store.backend().name(), role = ?args.role, "database ready");
    let has_keys = store
        .has_active_api_keys()
        .await
        .context("cannot read the API keys")?;
    let auth = AuthMode::resolve(admin_key, has_keys);
    check_open_bind(auth.is_open(), args.addr, args.allow_open).map_err(anyhow::Error::msg)?;
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
    // The summarizer is configured even for an API-only process, so a bad variable fails the
    // start rather than the first job.
    let summarizer_config = crate::summarize::SummarizerConfig::from_env()
        .map_err(|e| anyhow::anyhow!("summarizer configuration: {e}"))?;
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
        assert!(check_open_bind(true, public, false).is_err());
        assert!(check_open_bind(true, public, true).is_ok());
        assert!(check_open_bind(true, local, false).is_ok());
        assert!(check_open_bind(true, local6, false).is_ok());
        assert!(check_open_bind(false, public, false).is_ok());
    }
}
