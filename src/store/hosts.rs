//! libpq's multi-host connection strings (`postgres://u:p@host1:5432,host2:5432/db`), which sqlx
//! does not read, and failover among their hosts (`docs/SCALING.md`).
//!
//! Writes go to the primary: the host not in recovery (libpq's `target_session_attrs=read-write`)
//! on the latest timeline. Two such hosts are an old primary come back beside the standby
//! promoted in its place: the promoted one's timeline is the later, and a process never moves
//! back to an earlier timeline. Every new connection checks that its host is not in recovery,
//! and a watcher looks for the primary again once the one in use stops answering or is found in
//! recovery. Connections made before a switch are dropped as they come back, and the job
//! listener connects again.
//! Between the loss and the switch, requests fail as the database's faults do: 503 with
//! `Retry-After`.

use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyPool, ConnectOptions, Connection};

use super::StoreError;

/// How often the watcher checks the primary in use, and how long one host may take to answer.
const CHECK_EVERY: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One URL per host of a multi-host URL, each with the same user, database and parameters; a
/// single-host URL (or any other) as it is.
pub fn split_hosts(url: &str) -> Result<Vec<String>, StoreError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(vec![url.to_owned()]);
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return Ok(vec![url.to_owned()]);
    }
    hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                Err(StoreError::Config(format!(
                    "an empty host in the database URL's host list: {}",
                    super::clip(hosts, 200)
                )))
            } else {
                Ok(format!("{scheme}://{userinfo}{host}{tail}"))
            }
        })
        .collect()
}

/// The hosts of a multi-host URL and which one is the primary now.
pub struct PrimaryHosts {
    urls: Vec<String>,
    options: Vec<AnyConnectOptions>,
    current: AtomicUsize,
    /// The timeline of the primary in use: never moved back from.
    timeline: AtomicI64,
    /// When the pool last switched host, as nanoseconds after `start`.
    switched: AtomicU64,
    start: Instant,
    /// Told of each switch (the job listener connects again).
    switches: tokio::sync::Notify,
}

impl PrimaryHosts {
    /// The hosts of `urls` (one per host), with the primary found among them: waits up to
    /// `wait` for one, so a service started beside its database comes up once it does.
    pub async fn find(urls: Vec<String>, wait: Duration) -> Result<Arc<Self>, StoreError> {
        let options = urls
            .iter()
            .map(|url| AnyConnectOptions::from_str(url).map_err(StoreError::from))
            .collect::<Result<Vec<_>, _>>()?;
        let hosts = PrimaryHosts {
            urls,
            options,
            current: AtomicUsize::new(0),
            timeline: AtomicI64::new(0),
            switched: AtomicU64::new(0),
            start: Instant::now(),
            switches: tokio::sync::Notify::new(),
        };
        let deadline = Instant::now() + wait;
        loop {
            if let Some((index, timeline)) = hosts.probe().await {
                hosts.current.store(index, Ordering::Relaxed);
                hosts.timeline.store(timeline, Ordering::Relaxed);
                return Ok(Arc::new(hosts));
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Config(
                    "no host of the database URL accepts writes (each is in recovery or down)"
                        .into(),
                ));
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }

    /// The options of the primary in use, for the pool's new connections.
    pub fn current_options(&self) -> AnyConnectOptions {
        self.options[self.current.load(Ordering::Relaxed)].clone()
    }

    /// The URL of the primary in use (for connections outside the pool, like `LISTEN`).
    pub fn current_url(&self) -> &str {
        &self.urls[self.current.load(Ordering::Relaxed)]
    }

    /// Whether a connection of this age was made before the last switch (to the old primary).
    pub fn predates_switch(&self, age: Duration) -> bool {
        let switched = self.switched.load(Ordering::Relaxed);
        switched > 0
            && age
                >= self
                    .start
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(switched))
    }

    /// Waits for the next switch of host.
    pub async fn switched(&self) {
        self.switches.notified().await;
    }

    /// The host that answers, is not in recovery and is on the latest timeline (the first in
    /// order among equals), with its timeline; asks every host.
    async fn probe(&self) -> Option<(usize, i64)> {
        let answers = futures_util::future::join_all(
            self.options
                .iter()
                .map(|options| tokio::time::timeout(PROBE_TIMEOUT, writable_timeline(options))),
        )
        .await;
        let mut best: Option<(usize, i64)> = None;
        for (index, answer) in answers.into_iter().enumerate() {
            if let Ok(Ok(Some(timeline))) = answer {
                if best.is_none_or(|(_, known)| timeline > known) {
                    best = Some((index, timeline));
                }
            }
        }
        best
    }

    /// Checks the primary in use through `pool` every [`CHECK_EVERY`]; when it fails to answer or
    /// is in recovery, finds the primary again and points the pool's new connections at it. Ends
    /// when the pool closes.
    pub async fn watch(self: Arc<Self>, pool: AnyPool) {
        while !pool.is_closed() {
            tokio::time::sleep(CHECK_EVERY).await;
            let check =
                sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(&pool);
            if let Ok(Ok(false)) = tokio::time::timeout(PROBE_TIMEOUT, check).await {
                continue;
            }
            let Some((index, timeline)) = self.probe().await else {
                tracing::warn!("no host of the database URL accepts writes yet");
                continue;
            };
            let current_timeline = self.timeline.load(Ordering::Relaxed);
            if timeline < current_timeline {
                // An old primary come back beside the one promoted in its place: its writes
                // since the fork are not on the new timeline, and ours must not go there.
                tracing::error!(
                    host = index,
                    timeline,
                    current_timeline,
                    "the only host accepting writes is on an earlier timeline: not writing to it"
                );
                continue;
            }
            if index != self.current.load(Ordering::Relaxed) {
                tracing::warn!(
                    host = index,
                    timeline,
                    "the primary moved: writing to another host"
                );
                self.current.store(index, Ordering::Relaxed);
                self.timeline.store(timeline, Ordering::Relaxed);
                pool.set_connect_options(super::logged(self.options[index].clone()));
                let at = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.switched.store(at.max(1), Ordering::Relaxed);
                self.switches.notify_waiters();
            }
        }
    }
}

/// The timeline of the host of `options` if it takes writes (`None` in recovery), on a
/// connection of its own: the first 8 hex digits of its current WAL file's name, which a
/// promotion moves at once (the checkpoint's timeline waits for the next checkpoint).
async fn writable_timeline(options: &AnyConnectOptions) -> Result<Option<i64>, sqlx::Error> {
    let mut conn = options.connect().await?;
    let answer = sqlx::query_as::<_, (bool, String)>(
        "SELECT pg_is_in_recovery(), CASE WHEN pg_is_in_recovery() THEN '' \
         ELSE pg_walfile_name(pg_current_wal_lsn()) END",
    )
    .fetch_one(&mut conn)
    .await;
    let _ = conn.close().await;
    let (recovering, wal_file) = answer?;
    if recovering {
        return Ok(None);
    }
    let timeline = wal_file
        .get(..8)
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .ok_or_else(|| sqlx::Error::Protocol(format!("a WAL file name: {wal_file:?}")))?;
    Ok(Some(timeline))
}

/// The error a new connection to a host no longer primary fails with: a fault, retried later.
pub fn not_primary() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "the host is in recovery: not the primary",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_becomes_one_url_per_host() {
        assert_eq!(
            split_hosts("postgres://u:p@h1:5432,h2:5433/db?sslmode=disable").unwrap(),
            vec![
                "postgres://u:p@h1:5432/db?sslmode=disable",
                "postgres://u:p@h2:5433/db?sslmode=disable"
            ]
        );
        assert_eq!(
            split_hosts("postgresql://[::1]:5432,h2/db").unwrap(),
            vec!["postgresql://[::1]:5432/db", "postgresql://h2/db"]
        );
        for single in [
            "postgres://u:p@h1:5432/db",
            "sqlite://data/loupe.db",
            "postgres://u:p%2C@h1/db",
        ] {
            assert_eq!(split_hosts(single).unwrap(), vec![single]);
        }
        assert!(split_hosts("postgres://u@h1,,h2/db").is_err());
    }
}
