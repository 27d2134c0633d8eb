//! PostgreSQL standbys for reads, with read-your-writes (`docs/SCALING.md`).
//!
//! Every write is answered with a consistency token: the primary's WAL position after its commit
//! ([`Lsn`]). A read that carries one is served by a standby only once the standby has replayed
//! past it; it waits for that a bounded time, then reads from the primary. A read without one
//! takes the position this process remembers for the thread, if it wrote the thread in the last
//! few seconds. Each standby's replay position is polled by one task, shared by every request:
//! often while a read waits, rarely otherwise (for the lag metric). PostgreSQL 15 has no
//! `WAIT FOR LSN`, so polling is the way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::AnyPool;
use sqlx::Row;
use tokio::sync::watch;

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
            (!p.is_empty() && p.len() <= 8)
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
const REMEMBER_WRITES_FOR: Duration = Duration::from_secs(5);

/// Threads whose write positions are remembered at most; past it the oldest half is forgotten
/// (their reads then go by their token alone).
const MAX_REMEMBERED: usize = 100_000;

/// How often a standby's replay position is read while a read waits for it, and otherwise.
const POLL_WAITED: Duration = Duration::from_millis(2);
const POLL_IDLE: Duration = Duration::from_millis(250);

/// Where a read was served, for the metrics and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRoute {
    /// A standby had replayed past the token (or there was none).
    Standby,
    /// A standby caught up while the read waited.
    StandbyAfterWait,
    /// No standby caught up in time, or none was healthy: the primary.
    Primary,
}

/// Counts of the reads each way since start, and the standbys' lag.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StandbyStats {
    pub standby_reads: u64,
    pub waited_reads: u64,
    pub primary_reads: u64,
    pub healthy_standbys: usize,
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
    recent: Mutex<HashMap<(String, String), (Lsn, Instant)>>,
    primary_position: AtomicU64,
    next: AtomicUsize,
    standby_reads: AtomicU64,
    waited_reads: AtomicU64,
    primary_reads: AtomicU64,
}

impl Standbys {
    /// Standbys over `pools`, polled from now on; a read waits at most `wait` for one.
    pub fn start(pools: Vec<AnyPool>, wait: Duration) -> Arc<Self> {
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
            next: AtomicUsize::new(0),
            standby_reads: AtomicU64::new(0),
            waited_reads: AtomicU64::new(0),
            primary_reads: AtomicU64::new(0),
        });
        for index in 0..standbys.standbys.len() {
            tokio::spawn(poll(Arc::downgrade(&standbys), index));
        }
        standbys
    }

    /// Remembers that the tenant's thread was written at `lsn`.
    pub fn wrote(&self, tenant: &TenantId, thread_id: &str, lsn: Lsn) {
        self.primary_position.fetch_max(lsn.0, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= MAX_REMEMBERED {
            let now = Instant::now();
            recent.retain(|_, (_, at)| now.duration_since(*at) < REMEMBER_WRITES_FOR);
            if recent.len() >= MAX_REMEMBERED {
                recent.clear();
            }
        }
        let entry = recent
            .entry((tenant.0.clone(), thread_id.to_owned()))
            .or_insert((lsn, Instant::now()));
        *entry = (entry.0.max(lsn), Instant::now());
    }

    /// The position a read of the thread must see: its token, or the last write this process
    /// remembers of the thread, whichever is later.
    fn needed(
        &self,
        tenant: &TenantId,
        thread_id: Option<&ThreadId>,
        token: Option<Lsn>,
    ) -> Option<Lsn> {
        let remembered = thread_id.and_then(|thread_id| {
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent
                .get(&(tenant.0.clone(), thread_id.as_str().to_owned()))
                .filter(|(_, at)| at.elapsed() < REMEMBER_WRITES_FOR)
                .map(|(lsn, _)| *lsn)
        });
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
        let needed = self.needed(tenant, thread_id, token).unwrap_or_default();
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
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.wake_pollers.notify_waiters();
        let waited = tokio::time::timeout(self.wait, self.until_caught_up(needed)).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match waited {
            Ok(pool) => {
                self.waited_reads.fetch_add(1, Ordering::Relaxed);
                (Some(pool), ReadRoute::StandbyAfterWait)
            }
            Err(_) => {
                self.primary_reads.fetch_add(1, Ordering::Relaxed);
                (None, ReadRoute::Primary)
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
            healthy_standbys: healthy.len(),
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
        let answer = sqlx::query(
            "SELECT pg_is_in_recovery() AS recovering, \
             COALESCE(pg_last_wal_replay_lsn(), '0/0')::text AS replayed",
        )
        .fetch_one(&standby.pool)
        .await;
        let position = answer.ok().and_then(|row| {
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
            None => standby.healthy.store(false, Ordering::Relaxed),
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

/// The primary's WAL position now: past the commit of every write this process answered. The
/// insert position, not the write position: with `synchronous_commit = off` a commit answered
/// may not be written yet, and a standby can only replay past it once it is.
pub(super) async fn primary_position(pool: &AnyPool) -> Result<Lsn, StoreError> {
    let text: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(pool)
        .await?;
    text.parse()
        .map_err(|error: String| StoreError::Corrupt(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse_print_and_order_as_postgresql_writes_them() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, (0x16 << 32) | 0xB374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("0/3000060".parse::<Lsn>().unwrap() < "1/0".parse().unwrap());
        for bad in ["", "16", "/1", "1/", "x/1", "1/123456789", "-1/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad}");
        }
    }
}
