//! The context cache: each thread's normalized prefix (an incremental [`Checkpoint`]) per tenant,
//! thread and options, so that a context read normalizes only what was appended since the last
//! one (`docs/NORMALIZATION.md` § Incremental reads). In-process, bounded by bytes, least recently
//! used out first; `--context-cache-bytes 0` turns it off.
//!
//! Checkpoints are shared (`Arc`): concurrent reads of one thread and options all go on from the
//! same one, and no lock is held while normalizing. Only a read whose tail holds a new cut takes
//! the checkpoint out, moves its own copy on and puts it back; a read beside it still answers
//! from the old one, or reads the whole window if it finds none: slower, never wrong (the later
//! of two checkpoints put back stays; both are valid).
//!
//! Reads that find no checkpoint take turns per key ([`ContextCache::first_read_turn`]): one
//! reads the window, and those arriving meanwhile wait for it, then go on from the checkpoint it
//! left. A burst of first reads of a long thread (a restart, a new client) then reads its
//! window once, not once per read.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::history::normalize::incremental::Checkpoint;
use crate::history::NormalizeOptions;
use crate::store::{Seq, TenantId, ThreadId, ThreadKey};
use crate::turns::{KeyedTurns, Turn};

/// What a checkpoint is cached under. The tenant is part of the key, so a tenant can only ever
/// reach its own threads' checkpoints; the options are all of them (the thread's
/// micro-compaction settings included), since each changes the output. So is the thread's
/// redaction epoch: an erasure changes entries without appending, and a checkpoint normalized
/// before it is never read after it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContextKey {
    tenant: TenantId,
    thread_id: ThreadId,
    options: NormalizeOptions,
    epoch: i64,
}

impl ContextKey {
    pub fn new(
        tenant: &TenantId,
        thread_id: &ThreadId,
        options: &NormalizeOptions,
        epoch: i64,
    ) -> ContextKey {
        ContextKey {
            tenant: tenant.clone(),
            thread_id: thread_id.clone(),
            options: options.clone(),
            epoch,
        }
    }

    /// The redaction epoch of the thread the checkpoint was read from.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The options the cached prefix was normalized with.
    pub fn options(&self) -> &NormalizeOptions {
        &self.options
    }

    fn approx_bytes(&self) -> usize {
        let tools: usize = self.options.tools.iter().flatten().map(String::len).sum();
        self.tenant.0.len()
            + self.thread_id.as_str().len()
            + tools
            + self.options.model.as_ref().map_or(0, String::len)
            + 128
    }
}

/// A cached checkpoint, and what it belongs to.
#[derive(Debug, Clone)]
pub struct CachedContext {
    /// The thread it was read from ([`crate::store::ContextWindow::thread_key`]): a thread
    /// deleted and created again under the same id does not match.
    pub thread_key: ThreadKey,
    /// Where the window starts: its size is bounded from there.
    pub window_start: Seq,
    pub checkpoint: Checkpoint,
}

/// The cache (see the module docs).
#[derive(Debug)]
pub struct ContextCache {
    budget: usize,
    lru: Mutex<Lru>,
    /// Reads that found a checkpoint.
    hits: AtomicU64,
    /// The keys being read without a checkpoint, each with the turn its readers wait for.
    first_reads: Arc<KeyedTurns<ContextKey>>,
}

/// A read's turn to read a key's window without a checkpoint ([`ContextCache::first_read_turn`]).
/// Given back when dropped.
pub type FirstReadTurn = Turn<ContextKey>;

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<ContextKey, Slot>,
    /// Use order: the least recently used first.
    order: BTreeMap<u64, ContextKey>,
    clock: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Slot {
    used: u64,
    bytes: usize,
    /// Shared: concurrent reads of one thread all go on from it.
    cached: Arc<CachedContext>,
}

impl ContextCache {
    /// A cache holding at most `budget` bytes of checkpoints (0: nothing is cached).
    pub fn new(budget: usize) -> ContextCache {
        ContextCache {
            budget,
            lru: Mutex::new(Lru::default()),
            hits: AtomicU64::new(0),
            first_reads: Arc::default(),
        }
    }

    /// The key's turn to read its window without a checkpoint, when no other read of the key is
    /// under way; otherwise waits until that read ends and returns `None`, so that the caller
    /// looks again for the checkpoint it left instead of reading the whole window too.
    pub async fn first_read_turn(&self, key: &ContextKey) -> Option<FirstReadTurn> {
        self.first_reads.turn_or_wait(key).await
    }

    /// Keys being read without a checkpoint (for tests: none once every read is done).
    pub fn first_reads(&self) -> usize {
        self.first_reads.len()
    }

    pub fn is_enabled(&self) -> bool {
        self.budget > 0
    }

    /// The key's checkpoint, left in the cache (and marked as used) for reads beside this one.
    pub fn get(&self, key: &ContextKey) -> Option<Arc<CachedContext>> {
        let mut lru = self.lock();
        lru.clock += 1;
        let used = lru.clock;
        let slot = lru.entries.get_mut(key)?;
        let previous = std::mem::replace(&mut slot.used, used);
        let cached = slot.cached.clone();
        lru.order.remove(&previous);
        lru.order.insert(used, key.clone());
        Some(cached)
    }

    /// Counts a read that a checkpoint answered (found, and went on from without falling back).
    pub fn record_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a checkpoint answered so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Takes the key's checkpoint out of the cache, if it holds one.
    pub fn take(&self, key: &ContextKey) -> Option<Arc<CachedContext>> {
        let mut lru = self.lock();
        let slot = lru.entries.remove(key)?;
        lru.order.remove(&slot.used);
        lru.bytes -= slot.bytes;
        crate::metrics::context_cache_bytes(lru.bytes);
        Some(slot.cached)
    }

    /// Puts a checkpoint (back) under `key`, then drops the least recently used ones until the
    /// cache fits its budget. One larger than the whole budget is not kept.
    pub fn put(&self, key: ContextKey, cached: impl Into<Arc<CachedContext>>) {
        let cached = cached.into();
        let bytes = key.approx_bytes() + cached.checkpoint.approx_bytes();
        if bytes > self.budget {
            return;
        }
        let mut lru = self.lock();
        if let Some(old) = lru.entries.remove(&key) {
            lru.order.remove(&old.used);
            lru.bytes -= old.bytes;
        }
        while lru.bytes + bytes > self.budget {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some(slot) = lru.entries.remove(&oldest) {
                lru.bytes -= slot.bytes;
            }
        }
        lru.clock += 1;
        let used = lru.clock;
        lru.order.insert(used, key.clone());
        lru.entries.insert(
            key,
            Slot {
                used,
                bytes,
                cached,
            },
        );
        lru.bytes += bytes;
        crate::metrics::context_cache_bytes(lru.bytes);
    }

    /// Drops every checkpoint of the tenant's thread (whatever the options): called when the
    /// thread is deleted, so that no copy of its text stays in the process. Returns how many.
    pub fn forget_thread(&self, tenant: &TenantId, thread_id: &ThreadId) -> usize {
        let mut lru = self.lock();
        let gone: Vec<(ContextKey, u64)> = lru
            .entries
            .iter()
            .filter(|(key, _)| key.tenant == *tenant && key.thread_id == *thread_id)
            .map(|(key, slot)| (key.clone(), slot.used))
            .collect();
        for (key, used) in &gone {
            lru.order.remove(used);
            if let Some(slot) = lru.entries.remove(key) {
                lru.bytes -= slot.bytes;
            }
        }
        crate::metrics::context_cache_bytes(lru.bytes);
        gone.len()
    }

    /// How many checkpoints the cache holds, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        let lru = self.lock();
        (lru.entries.len(), lru.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding the lock leaves consistent maps (every update completes before
        // anything can panic), so a poisoned lock is still usable.
        self.lru
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, thread: &str) -> ContextKey {
        ContextKey::new(
            &TenantId(tenant.to_owned()),
            &ThreadId::new(thread),
            &NormalizeOptions::default(),
            0,
        )
    }

    fn cached(thread_key: &str) -> CachedContext {
        CachedContext {
            thread_key: ThreadKey::from_stored(thread_key.to_owned()),
            window_start: Seq::new(0),
            checkpoint: Checkpoint::start(),
        }
    }

    #[test]
    fn forgetting_a_thread_drops_its_checkpoints_and_only_those() {
        let cache = ContextCache::new(1 << 20);
        let stripped = NormalizeOptions {
            model: Some("other".to_owned()),
            ..NormalizeOptions::default()
        };
        let tenant = TenantId("a".to_owned());
        let gone = ThreadId::new("gone");
        cache.put(key("a", "gone"), cached("k1"));
        cache.put(ContextKey::new(&tenant, &gone, &stripped, 3), cached("k1"));
        cache.put(key("a", "kept"), cached("k2"));
        cache.put(key("b", "gone"), cached("k3"));
        let (_, before) = cache.size();
        assert_eq!(cache.forget_thread(&tenant, &gone), 2);
        let (entries, bytes) = cache.size();
        assert_eq!(entries, 2);
        assert!(bytes < before);
        assert!(cache.get(&key("a", "gone")).is_none());
        assert!(cache.get(&key("a", "kept")).is_some());
        assert!(cache.get(&key("b", "gone")).is_some());
        // The use order lost them too: filling the cache evicts only live entries.
        assert_eq!(cache.lock().order.len(), 2);
    }

    #[test]
    fn tenants_and_options_are_apart() {
        let cache = ContextCache::new(1 << 20);
        cache.put(key("a", "t"), cached("ka"));
        assert!(cache.take(&key("b", "t")).is_none());
        let openai = ContextKey::new(
            &TenantId("a".into()),
            &"t".into(),
            &NormalizeOptions {
                provider: crate::history::Provider::Openai,
                ..Default::default()
            },
            0,
        );
        assert!(cache.take(&openai).is_none());
        assert_eq!(cache.take(&key("a", "t")).unwrap().thread_key, "ka");
        assert!(cache.take(&key("a", "t")).is_none(), "taken out");
        assert_eq!(cache.size(), (0, 0));
    }

    #[test]
    fn the_cache_never_holds_more_than_its_budget() {
        let one = key("a", "0").approx_bytes() + Checkpoint::start().approx_bytes();
        let budget = one * 3 + one / 2;
        let cache = ContextCache::new(budget);
        for i in 0..20 {
            cache.put(key("a", &i.to_string()), cached("k"));
            assert!(cache.size().1 <= budget, "{:?} over {budget}", cache.size());
        }
        assert_eq!(cache.size().0, 3);
        // A checkpoint larger than the whole budget is not kept, and evicts nothing.
        let tiny = ContextCache::new(one - 1);
        tiny.put(key("a", "0"), cached("k"));
        assert_eq!(tiny.size(), (0, 0));
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let one = key("a", "1").approx_bytes() + Checkpoint::start().approx_bytes();
        let cache = ContextCache::new(one * 2 + one / 2);
        cache.put(key("a", "1"), cached("k1"));
        cache.put(key("a", "2"), cached("k2"));
        // 1 is read again (and stays cached), so 2 is the oldest when 3 comes.
        assert_eq!(cache.get(&key("a", "1")).unwrap().thread_key, "k1");
        cache.put(key("a", "3"), cached("k3"));
        assert!(cache.take(&key("a", "2")).is_none());
        assert!(cache.take(&key("a", "1")).is_some());
        assert!(cache.take(&key("a", "3")).is_some());
    }

    #[tokio::test]
    async fn cancelled_waiters_and_the_turn_holder_leave_no_entry() {
        use futures_util::FutureExt;
        let cache = Arc::new(ContextCache::new(1 << 20));
        let thread = key("a", "t");
        let turn = cache
            .first_read_turn(&thread)
            .await
            .expect("the first read's");
        // Two waiters: polled once (so they wait on the turn), then cancelled by dropping them.
        let mut waiters: Vec<_> = (0..2)
            .map(|_| Box::pin(cache.first_read_turn(&thread)))
            .collect();
        for waiter in &mut waiters {
            assert!(
                waiter.as_mut().now_or_never().is_none(),
                "waits for the turn"
            );
        }
        assert_eq!(cache.first_reads(), 1);
        drop(waiters);
        assert_eq!(cache.first_reads(), 1, "the turn is still held");
        drop(turn);
        assert_eq!(cache.first_reads(), 0);
        // Cancelled after the holder went: the last waiter to go removes the entry.
        let turn = cache.first_read_turn(&thread).await.unwrap();
        let mut waiter = Box::pin(cache.first_read_turn(&thread));
        assert!(waiter.as_mut().now_or_never().is_none());
        drop(turn);
        assert_eq!(cache.first_reads(), 1, "the waiter still holds it");
        drop(waiter);
        assert_eq!(cache.first_reads(), 0);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let cache = ContextCache::new(0);
        assert!(!cache.is_enabled());
        cache.put(key("a", "t"), cached("k"));
        assert_eq!(cache.size(), (0, 0));
    }
}
