//! PostgreSQL standbys for reads, with read-your-writes (`docs/SCALING.md`).
//!
//! Every write is answered with a consistency token: the primary's WAL position after its commit
//! ([`Lsn`]). A read that carries one is served by a standby only once the standby has replayed
//! past it; it waits for that a bounded time, then reads from the primary. A read without one
//! takes the position this process remembers for the thread (or, reading no one thread, for the
//! tenant), if it wrote there in the last few seconds. And no read goes to a standby that has
//! not replayed what the primary held [`MAX_STALENESS`] ago (its replay paused, or far behind),
//! so what a process forgets after [`REMEMBER_WRITES_FOR`] every standby it reads from has.
//!
//! Each standby's replay position is polled by one task, shared by every request: often while a
//! read waits, rarely otherwise; one more task samples the primary's position for the staleness
//! bound. PostgreSQL 15 has no `WAIT FOR LSN`, so polling is the way.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::str::FromStr;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyPool, ConnectOptions, Row};
use tokio::sync::watch;

use super::hosts::PrimaryHosts;
use super::{StoreError, TenantId, ThreadId};

/// A WAL position, as `pg_current_wal_lsn()` answers it (`16/B374D848`): comparable, and written
/// back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Lsn(pub u64);

impl std::str::FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("not a WAL position (like `16/B374D848`): {text:?}");
        let (high, low) = text.split_once('/').ok_or_else(bad)?;
        let part = |p: &str| {
            // As PostgreSQL prints it: hex digits only (no sign `from_str_radix` would take).
            (!p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(p, 16).ok())
                .flatten()
                .ok_or_else(bad)
        };
        Ok(Lsn((u64::from(part(high)?) << 32) | u64::from(part(low)?)))
    }
}

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// How long a thread's last write position is remembered for reads that carry no token.
pub const REMEMBER_WRITES_FOR: Duration = Duration::from_secs(5);

/// The most a standby read from may be behind: it has replayed what the primary held this long
/// ago. Well under [`REMEMBER_WRITES_FOR`], so a write this process forgets is on every standby
/// it still reads from (a snip or an erasure included).
pub const MAX_STALENESS: Duration = Duration::from_secs(2);

/// Threads whose write positions are remembered at most; past it the oldest half is forgotten
/// (their reads then go by their token and the staleness bound alone).
const MAX_REMEMBERED: usize = 100_000;

/// How often a standby's replay position is read while a read waits for it, and otherwise; how
/// long one poll may take before the standby counts as lost.
const POLL_WAITED: Duration = Duration::from_millis(2);
const POLL_IDLE: Duration = Duration::from_millis(250);
const POLL_TIMEOUT: Duration = Duration::from_secs(1);

/// The primary's WAL position ([`primary_position`] says why the write position).
const PRIMARY_POSITION_SQL: &str = "SELECT pg_current_wal_lsn()::text";

/// The least time between two samples of the primary's position that writes record.
const SAMPLE_SPACING: Duration = Duration::from_millis(50);

/// Where a read was served, for the metrics and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRoute {
    /// A standby had replayed past the token (or there was none).
    Standby,
    /// A standby caught up while the read waited.
    StandbyAfterWait,
    /// No standby was healthy, or the staleness floor was unknown: the primary.
    Primary,
    /// The read waited the whole wait and no standby caught up: the primary, a fallback.
    /// Many of these say the wait is shorter than the standbys' usual lag.
    PrimaryAfterWait,
}

impl ReadRoute {
    /// Whether the primary serves the read.
    pub fn is_primary(self) -> bool {
        matches!(self, ReadRoute::Primary | ReadRoute::PrimaryAfterWait)
    }
}

/// Counts of the reads each way since start, and the standbys' lag.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StandbyStats {
    pub standby_reads: u64,
    pub waited_reads: u64,
    /// Reads served by the primary, fallbacks included.
    pub primary_reads: u64,
    /// Of those, the reads that waited for a standby in vain.
    pub fallback_reads: u64,
    pub healthy_standbys: usize,
    /// Reads waiting for a standby to catch up now.
    pub waiting_reads: usize,
    /// The largest gap, in WAL bytes, between the primary's last known position and a healthy
    /// standby's replay position.
    pub max_lag_bytes: u64,
}

struct Standby {
    pool: AnyPool,
    replayed: watch::Sender<Lsn>,
    healthy: AtomicBool,
}

/// The standbys a process reads from.
pub struct Standbys {
    standbys: Vec<Standby>,
    /// Reads waiting for a standby: the pollers read often while any does.
    waiting: AtomicUsize,
    wake_pollers: tokio::sync::Notify,
    wait: Duration,
    /// The last write this process made to each (tenant, thread), and to each tenant (thread
    /// `""`), with when.
    recent: Mutex<HashMap<(String, String), (Lsn, Instant)>>,
    primary_position: AtomicU64,
    /// The primary's position as sampled over the last [`MAX_STALENESS`] and a little more,
    /// oldest first.
    primary_samples: Mutex<VecDeque<(Instant, Lsn)>>,
    next: AtomicUsize,
    standby_reads: AtomicU64,
    waited_reads: AtomicU64,
    primary_reads: AtomicU64,
    fallback_reads: AtomicU64,
}

impl Standbys {
    /// Standbys over `pools`, polled from now on, with `primary` sampled for the staleness
    /// bound; a read waits at most `wait` for one.
    pub fn start(pools: Vec<AnyPool>, primary: PrimaryAddress, wait: Duration) -> Arc<Self> {
        let standbys = Arc::new(Standbys {
            standbys: pools
                .into_iter()
                .map(|pool| Standby {
                    pool,
                    replayed: watch::channel(Lsn::default()).0,
                    healthy: AtomicBool::new(false),
                })
                .collect(),
            waiting: AtomicUsize::new(0),
            wake_pollers: tokio::sync::Notify::new(),
            wait,
            recent: Mutex::new(HashMap::new()),
            primary_position: AtomicU64::new(0),
            primary_samples: Mutex::new(VecDeque::new()),
            next: AtomicUsize::new(0),
            standby_reads: AtomicU64::new(0),
            waited_reads: AtomicU64::new(0),
            primary_reads: AtomicU64::new(0),
            fallback_reads: AtomicU64::new(0),
        });
        for index in 0..standbys.standbys.len() {
            tokio::spawn(poll(Arc::downgrade(&standbys), index));
        }
        tokio::spawn(sample_primary(Arc::downgrade(&standbys), primary));
        standbys
    }

    /// Remembers that the tenant's thread was written at `lsn` (and so the tenant, for reads of
    /// no one thread); `thread_id` is `None` for a write of the tenant's own settings. The
    /// position is also a sample of the primary's: it answered it just now.
    pub fn wrote(&self, tenant: &TenantId, thread_id: Option<&ThreadId>, lsn: Lsn) {
        self.sampled(lsn);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= MAX_REMEMBERED {
            forget_oldest(&mut recent);
        }
        let now = Instant::now();
        let thread = thread_id.map(|id| (tenant.0.clone(), id.as_str().to_owned()));
        for key in thread
            .into_iter()
            .chain([(tenant.0.clone(), String::new())])
        {
            let entry = recent.entry(key).or_insert((lsn, now));
            *entry = (entry.0.max(lsn), now);
        }
    }

    /// Records the primary's position as seen now, for the staleness floor: from the sampler,
    /// and from every write, so a sampler starved of connections (a busy pool) leaves the floor
    /// fresh where writes still get through. One sample per [`SAMPLE_SPACING`] at most.
    fn sampled(&self, lsn: Lsn) {
        self.primary_position.fetch_max(lsn.0, Ordering::Relaxed);
        let mut samples = self
            .primary_samples
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match samples.back_mut() {
            // Positions only grow, and a later sample is the stricter one.
            Some(last) if now.duration_since(last.0) < SAMPLE_SPACING => {
                last.1 = last.1.max(lsn);
            }
            _ => samples.push_back((now, lsn)),
        }
        // One sample older than the bound is all the floor needs.
        while samples.len() > 1 && samples[1].0.elapsed() >= MAX_STALENESS {
            samples.pop_front();
        }
    }

    /// The position a read of the thread must see: its token, or the last write this process
    /// remembers of the thread, whichever is later.
    fn needed(
        &self,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
        token: Option<Lsn>,
    ) -> Option<Lsn> {
        // A read of no one thread (the tenant's search) goes by the tenant's last write.
        let thread = thread_id.map_or("", ThreadId::as_str).to_owned();
        let remembered = {
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent
                .get(&(tenant.0.clone(), thread))
                .filter(|(_, at)| at.elapsed() < REMEMBER_WRITES_FOR)
                .map(|(lsn, _)| *lsn)
        };
        token.max(remembered)
    }

    /// The pool to read from: a healthy standby that has replayed past what the read needs,
    /// waiting for one at most the configured time; `None` for the primary.
    pub async fn route(
        &self,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
        token: Option<Lsn>,
    ) -> (Option<AnyPool>, ReadRoute) {
        let Some(floor) = self.staleness_floor() else {
            self.primary_reads.fetch_add(1, Ordering::Relaxed);
            return (None, ReadRoute::Primary);
        };
        let needed = self
            .needed(tenant, thread_id, token)
            .unwrap_or_default()
            .max(floor);
        if let Some(pool) = self.caught_up(needed) {
            self.standby_reads.fetch_add(1, Ordering::Relaxed);
            return (Some(pool), ReadRoute::Standby);
        }
        if !self
            .standbys
            .iter()
            .any(|s| s.healthy.load(Ordering::Relaxed))
        {
            self.primary_reads.fetch_add(1, Ordering::Relaxed);
            return (None, ReadRoute::Primary);
        }
        // Counted while it waits, even when the read is dropped meanwhile (a client gone, a
        // request timed out): the pollers poll often only while the count is above zero.
        let _waiting = Waiting::count(&self.waiting);
        self.wake_pollers.notify_waiters();
        let waited = tokio::time::timeout(self.wait, self.until_caught_up(needed)).await;
        match waited {
            Ok(pool) => {
                self.waited_reads.fetch_add(1, Ordering::Relaxed);
                (Some(pool), ReadRoute::StandbyAfterWait)
            }
            Err(_) => {
                self.primary_reads.fetch_add(1, Ordering::Relaxed);
                self.fallback_reads.fetch_add(1, Ordering::Relaxed);
                (None, ReadRoute::PrimaryAfterWait)
            }
        }
    }

    /// A healthy standby past `needed`, taken in turn.
    fn caught_up(&self, needed: Lsn) -> Option<AnyPool> {
        let count = self.standbys.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|i| &self.standbys[(start + i) % count])
            .find(|s| s.healthy.load(Ordering::Relaxed) && *s.replayed.borrow() >= needed)
            .map(|s| s.pool.clone())
    }

    async fn until_caught_up(&self, needed: Lsn) -> AnyPool {
        let mut receivers: Vec<_> = self
            .standbys
            .iter()
            .map(|s| s.replayed.subscribe())
            .collect();
        loop {
            if let Some(pool) = self.caught_up(needed) {
                return pool;
            }
            let changes = receivers.iter_mut().map(|r| Box::pin(r.changed()));
            // A standby's poller gone (none is, while `self` lives) is waited out by the timeout.
            let _ = futures_util::future::select_all(changes).await;
        }
    }

    /// What every standby read from must have replayed: the primary's position
    /// [`MAX_STALENESS`] ago, as the newest sample at least that old. In a process younger than
    /// the bound, its first sample instead (stricter). `None` before the first sample, so that
    /// no standby serves: one stuck far behind would serve what the primary has long erased.
    /// While no sample comes (the primary is gone, or this process cannot reach it), the floor
    /// stays at the last position seen: standbys that have everything the primary was last
    /// seen with go on serving, and the bound holds against that position, not against time.
    fn staleness_floor(&self) -> Option<Lsn> {
        let samples = self
            .primary_samples
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .rev()
            .find(|(at, _)| at.elapsed() >= MAX_STALENESS)
            .or(samples.front())
            .map(|(_, lsn)| *lsn)
    }

    pub fn stats(&self) -> StandbyStats {
        let primary = self.primary_position.load(Ordering::Relaxed);
        let healthy: Vec<&Standby> = self
            .standbys
            .iter()
            .filter(|s| s.healthy.load(Ordering::Relaxed))
            .collect();
        StandbyStats {
            standby_reads: self.standby_reads.load(Ordering::Relaxed),
            waited_reads: self.waited_reads.load(Ordering::Relaxed),
            primary_reads: self.primary_reads.load(Ordering::Relaxed),
            fallback_reads: self.fallback_reads.load(Ordering::Relaxed),
            healthy_standbys: healthy.len(),
            waiting_reads: self.waiting.load(Ordering::Relaxed),
            max_lag_bytes: healthy
                .iter()
                .map(|s| primary.saturating_sub(s.replayed.borrow().0))
                .max()
                .unwrap_or(0),
        }
    }
}

/// Reads one standby's replay position for as long as its [`Standbys`] lives: often while a read
/// waits, rarely otherwise. A standby that fails to answer, or is no longer in recovery (it was
/// promoted: its data may have forked from the primary's), is not read from.
async fn poll(standbys: std::sync::Weak<Standbys>, index: usize) {
    loop {
        let Some(all) = standbys.upgrade() else {
            return;
        };
        let standby = &all.standbys[index];
        let answer = tokio::time::timeout(
            POLL_TIMEOUT,
            sqlx::query(
                "SELECT pg_is_in_recovery() AS recovering, \
                 COALESCE(pg_last_wal_replay_lsn(), '0/0')::text AS replayed",
            )
            .fetch_one(&standby.pool),
        )
        .await;
        let position = answer.ok().and_then(Result::ok).and_then(|row| {
            let recovering: bool = row.try_get("recovering").ok()?;
            let replayed: String = row.try_get("replayed").ok()?;
            recovering.then(|| replayed.parse::<Lsn>().ok()).flatten()
        });
        match position {
            Some(lsn) => {
                standby.replayed.send_if_modified(|known| {
                    let moved = lsn > *known;
                    *known = (*known).max(lsn);
                    moved
                });
                standby.healthy.store(true, Ordering::Relaxed);
            }
            // What it had replayed is forgotten: a standby that restarts answers once its
            // recovery is consistent, which can be short of where it had replayed before.
            None => {
                standby.healthy.store(false, Ordering::Relaxed);
                standby.replayed.send_replace(Lsn::default());
            }
        }
        // Held through the pause: the set outlives its pollers by one pause at most.
        let busy = all.waiting.load(Ordering::Relaxed) > 0;
        let woken = all.wake_pollers.notified();
        if busy {
            tokio::time::sleep(POLL_WAITED).await;
        } else {
            let _ = tokio::time::timeout(POLL_IDLE, woken).await;
        }
    }
}

/// Where the primary is now, for the sampler's connection of its own.
pub struct PrimaryAddress {
    /// The database URL (of one host, or libpq's list of several).
    pub url: Arc<str>,
    /// Of several hosts, the one that is the primary now.
    pub hosts: Option<Arc<PrimaryHosts>>,
}

impl PrimaryAddress {
    fn current(&self) -> String {
        match &self.hosts {
            Some(hosts) => hosts.current_url().to_owned(),
            None => self.url.to_string(),
        }
    }
}

/// Samples the primary's position every [`POLL_IDLE`] for the staleness bound, for as long as
/// its [`Standbys`] lives, keeping a little more than [`MAX_STALENESS`] of samples. On a
/// connection of its own, made again after a failure or a move of the primary: through the
/// shared pool, requests queued for connections would starve it, and the floor would stay
/// behind while the primary goes on writing.
async fn sample_primary(standbys: std::sync::Weak<Standbys>, primary: PrimaryAddress) {
    let mut connection: Option<(sqlx::AnyConnection, String)> = None;
    loop {
        let url = primary.current();
        if connection.as_ref().is_some_and(|(_, at)| *at != url) {
            connection = None;
        }
        let sampled = tokio::time::timeout(POLL_TIMEOUT, sample_on(&mut connection, &url)).await;
        let Some(all) = standbys.upgrade() else {
            return;
        };
        match sampled {
            Ok(Ok(lsn)) => all.sampled(lsn),
            // Made again next time: it may be to a host that went away.
            _ => connection = None,
        }
        drop(all);
        tokio::time::sleep(POLL_IDLE).await;
    }
}

/// The primary's position, read on `connection`, which is made first if there is none.
async fn sample_on(
    connection: &mut Option<(sqlx::AnyConnection, String)>,
    url: &str,
) -> Result<Lsn, StoreError> {
    if connection.is_none() {
        let options = super::logged(AnyConnectOptions::from_str(url)?);
        *connection = Some((options.connect().await?, url.to_owned()));
    }
    let (connection, _) = connection.as_mut().expect("made above");
    let text: String = sqlx::query_scalar(PRIMARY_POSITION_SQL)
        .fetch_one(&mut *connection)
        .await?;
    text.parse().map_err(StoreError::Corrupt)
}

/// Forgets the writes remembered longer than [`REMEMBER_WRITES_FOR`], and if that is not
/// enough, the older half of them.
fn forget_oldest(recent: &mut HashMap<(String, String), (Lsn, Instant)>) {
    recent.retain(|_, (_, at)| at.elapsed() < REMEMBER_WRITES_FOR);
    if recent.len() >= MAX_REMEMBERED {
        let mut times: Vec<Instant> = recent.values().map(|(_, at)| *at).collect();
        let middle = times.len() / 2;
        let (_, cutoff, _) = times.select_nth_unstable(middle);
        let cutoff = *cutoff;
        recent.retain(|_, (_, at)| *at > cutoff);
    }
}

/// One read waiting for a standby, counted for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The primary's WAL position now: past the commit of every write this process answered. The
/// write position, which is where a standby's replay stops when all is sent; the insert
/// position can stand a page header past it on an idle primary, and no standby would ever
/// reach it. A commit answered is written unless `synchronous_commit = off`, which read-your-
/// writes needs off (`docs/SCALING.md`).
pub(super) async fn primary_position(pool: &AnyPool) -> Result<Lsn, StoreError> {
    let text: String = sqlx::query_scalar(PRIMARY_POSITION_SQL)
        .fetch_one(pool)
        .await?;
    text.parse()
        .map_err(|error: String| StoreError::Corrupt(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A standby that never answers.
    fn gone() -> AnyPool {
        sqlx::any::install_default_drivers();
        sqlx::pool::PoolOptions::<sqlx::Any>::new()
            .acquire_timeout(Duration::from_millis(200))
            .connect_lazy("postgres://loupe:loupe@127.0.0.1:1/none")
            .unwrap()
    }

    /// A primary that never answers.
    fn nowhere() -> PrimaryAddress {
        PrimaryAddress {
            url: "postgres://loupe:loupe@127.0.0.1:1/none".into(),
            hosts: None,
        }
    }

    #[test]
    fn a_full_memory_forgets_the_older_half_not_everything() {
        let mut recent = HashMap::new();
        let start = Instant::now();
        for n in 0..MAX_REMEMBERED {
            recent.insert(
                ("alice".to_owned(), n.to_string()),
                (Lsn(n as u64), start + Duration::from_nanos(n as u64)),
            );
        }
        forget_oldest(&mut recent);
        assert!(recent.len() < MAX_REMEMBERED && recent.len() >= MAX_REMEMBERED / 2 - 1);
        let newest = ("alice".to_owned(), (MAX_REMEMBERED - 1).to_string());
        assert!(
            recent.contains_key(&newest),
            "the newest write was forgotten"
        );
        assert!(!recent.contains_key(&("alice".to_owned(), "0".to_owned())));
    }

    /// A standby that stops answering is not read from, and what it had replayed is forgotten:
    /// restarted, it may answer from short of there.
    #[tokio::test]
    async fn a_standby_that_stops_answering_forgets_its_position() {
        let standbys = Standbys::start(vec![gone()], nowhere(), Duration::from_millis(10));
        standbys.standbys[0].healthy.store(true, Ordering::Relaxed);
        standbys.standbys[0].replayed.send_replace(Lsn(1 << 40));
        let mut replayed = standbys.standbys[0].replayed.subscribe();
        tokio::time::timeout(Duration::from_secs(5), replayed.wait_for(|lsn| lsn.0 == 0))
            .await
            .expect("the poller never forgot the position")
            .unwrap();
        assert!(!standbys.standbys[0].healthy.load(Ordering::Relaxed));
        let tenant = TenantId("t".into());
        let (pool, route) = standbys.route(&tenant, None, None).await;
        assert!(pool.is_none());
        assert_eq!(route, ReadRoute::Primary);
    }

    /// The floor comes only from samples, and is never lower than the bound allows: none before
    /// the first, the first in a process younger than the bound (never zero, which any stuck
    /// standby passes), and the newest once it is older than the bound (the sampler stopped
    /// getting through, and the standbys that have all the primary was last seen with serve).
    #[tokio::test]
    async fn the_staleness_floor_comes_only_from_samples() {
        let standbys = Standbys::start(vec![gone()], nowhere(), Duration::from_millis(10));
        let set = |samples: &[(Duration, u64)]| {
            let now = Instant::now();
            *standbys.primary_samples.lock().unwrap() = samples
                .iter()
                .map(|(ago, lsn)| (now - *ago, Lsn(*lsn)))
                .collect();
        };
        let second = Duration::from_secs(1);
        set(&[]);
        assert_eq!(standbys.staleness_floor(), None);
        // Just started: the first sample, not nothing.
        set(&[(second / 2, 7), (second / 4, 9)]);
        assert_eq!(standbys.staleness_floor(), Some(Lsn(7)));
        // Running: the newest sample at least the bound old.
        set(&[(3 * second, 5), (MAX_STALENESS, 6), (second, 8)]);
        assert_eq!(standbys.staleness_floor(), Some(Lsn(6)));
        // The sampler has not got through for longer than the bound: the last position seen.
        set(&[(4 * second, 5), (3 * second, 6)]);
        assert_eq!(standbys.staleness_floor(), Some(Lsn(6)));
        // And an unknown floor sends a read to the primary, whatever a standby has replayed.
        set(&[]);
        standbys.standbys[0].healthy.store(true, Ordering::Relaxed);
        standbys.standbys[0].replayed.send_replace(Lsn(u64::MAX));
        let tenant = TenantId("t".into());
        let (pool, route) = standbys.route(&tenant, None, None).await;
        assert!(pool.is_none());
        assert_eq!(route, ReadRoute::Primary);
        // A write's position is a sample too: the primary answered it just now.
        standbys.wrote(&tenant, None, Lsn(42));
        assert_eq!(standbys.staleness_floor(), Some(Lsn(42)));
    }

    /// A waiting read dropped before its wait ends (a client gone) is no longer counted, so the
    /// pollers go back to polling rarely.
    #[tokio::test]
    async fn a_dropped_waiting_read_is_not_counted() {
        let waiting = AtomicUsize::new(0);
        let wait = async {
            let _counted = Waiting::count(&waiting);
            std::future::pending::<()>().await;
        };
        assert!(tokio::time::timeout(Duration::from_millis(10), wait)
            .await
            .is_err());
        assert_eq!(waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn positions_parse_print_and_order_as_postgresql_writes_them() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, (0x16 << 32) | 0xB374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("0/3000060".parse::<Lsn>().unwrap() < "1/0".parse().unwrap());
        for bad in [
            "",
            "16",
            "/1",
            "1/",
            "x/1",
            "1/123456789",
            "-1/0",
            "+1/+0",
            "1/ 0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad}");
        }
    }
}
