//! Command line and configuration: every setting is a flag and an environment variable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::http::{AppState, Limits};
use crate::store::{Store, StoreOptions};

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
}

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
            ..Limits::default()
        }
    }
}

impl DatabaseArgs {
    pub async fn open(&self) -> anyhow::Result<Store> {
        let mut options = StoreOptions::new(&self.database_url);
        options.max_connections = self.db_max_connections;
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
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::telemetry::init(args.log_format);
    let store = args.database.open().await?;
    tracing::info!(backend = store.backend().name(), "database ready");
    let state = AppState {
        store: store.clone(),
        limits: Arc::new(args.limits()),
    };
    let app = crate::http::router(state);
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            crate::shutdown::signal().await;
            stop.cancel();
        }
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned());
    // In-flight requests finish; a request still running after the grace period is cut off.
    tokio::select! {
        result = server => result.context("server error")?,
        _ = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("grace period over; exiting with requests still in flight");
        }
    }
    store.close().await;
    tracing::info!("stopped");
    Ok(())
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
}
