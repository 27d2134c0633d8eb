//! Thread changes, for readers that follow a thread live (`GET /v1/threads/{id}/events`): a
//! signal per followed thread that its stored entries or events moved. The database stays the
//! source of truth: a signal only says "read again", so a lost or doubled one costs a read,
//! never an event.
//!
//! Within a process a write signals the thread's followers directly. Across processes sharing a
//! PostgreSQL database, the writes of each process are also sent as `NOTIFY loupe_threads`
//! (batched, after the commit, off the writer's path) and every process that has followers
//! listens. Followers also read again every few seconds whatever they hear, which covers a
//! SQLite file shared by processes and a listener that lost its connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use super::{TenantId, ThreadId};

/// The PostgreSQL `NOTIFY` channel of thread changes.
pub const THREADS_CHANNEL: &str = "loupe_threads";

/// How often this process sends its changes at most: what other processes' followers may wait
/// more than this process's own.
const NOTIFY_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Largest `NOTIFY` payload sent (PostgreSQL refuses 8,000 bytes and more).
const MAX_PAYLOAD_BYTES: usize = 7_000;

/// Changes queued for `NOTIFY` and not yet sent: past it, more are dropped (followers read again
/// on their own every few seconds).
const MAX_QUEUED: usize = 10_000;

/// The followed threads of this process, each with a version that moves on every change.
#[derive(Default)]
pub struct ThreadChanges {
    followed: Mutex<HashMap<(String, String), watch::Sender<u64>>>,
    /// Where changes go to be sent as `NOTIFY` (PostgreSQL only).
    outbox: Mutex<Option<mpsc::Sender<String>>>,
    /// Whether a task of this process listens to the others' changes.
    listening: AtomicBool,
}

impl ThreadChanges {
    /// A receiver that sees every change of the thread from now on.
    pub fn follow(&self, tenant: &TenantId, thread_id: &ThreadId) -> watch::Receiver<u64> {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        // Threads no one follows any more go as new followers come.
        followed.retain(|_, sender| sender.receiver_count() > 0);
        followed
            .entry((tenant.0.clone(), thread_id.as_str().to_owned()))
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Signals the thread's followers in this process.
    pub fn changed_here(&self, tenant: &str, thread_id: &str) {
        let followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = followed.get(&(tenant.to_owned(), thread_id.to_owned())) {
            sender.send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    /// Signals the thread's followers here and, on PostgreSQL, in every other process.
    pub fn changed(&self, tenant: &TenantId, thread_id: &ThreadId) {
        self.changed_here(&tenant.0, thread_id.as_str());
        let outbox = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(outbox) = outbox.as_ref() {
            // Full: dropped, and the followers elsewhere read again on their own.
            let _ = outbox.try_send(payload_line(&tenant.0, thread_id.as_str()));
        }
    }

    /// Sends the changes as `NOTIFY` through `pool` from now on, batched; returns the task.
    pub fn send_through(self: &Arc<Self>, pool: sqlx::AnyPool) -> tokio::task::JoinHandle<()> {
        let (sender, mut receiver) = mpsc::channel::<String>(MAX_QUEUED);
        *self.outbox.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let mut lines = vec![first];
                while let Ok(line) = receiver.try_recv() {
                    lines.push(line);
                }
                lines.sort_unstable();
                lines.dedup();
                for payload in payloads(&lines) {
                    let sent = sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(THREADS_CHANNEL)
                        .bind(payload)
                        .execute(&pool)
                        .await;
                    if let Err(error) = sent {
                        tracing::debug!(%error, "thread changes were not notified");
                    }
                }
                // The changes of the next moment gather into one statement: a NOTIFY per
                // append cost appends 13-22% of their throughput on PostgreSQL.
                tokio::time::sleep(NOTIFY_EVERY).await;
            }
        })
    }

    /// Signals the followers of each thread a `NOTIFY` payload names (from any process).
    pub fn heard(&self, payload: &str) {
        for line in payload.lines() {
            if let Some((tenant, thread_id)) = line.split_once(' ') {
                self.changed_here(tenant, thread_id);
            }
        }
    }

    /// Claims the listening task's place: true when none runs (the caller starts one).
    pub fn start_listening(&self) -> bool {
        self.listening
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The listening task asks whether to go on: with no follower left it stops (true),
    /// unless one came meanwhile and found it still running.
    pub fn stop_listening_unless_followed(&self) -> bool {
        if self.any_followed() {
            return false;
        }
        self.listening.store(false, Ordering::SeqCst);
        // A follower that came between the check and the store saw a listener: take the place
        // back and go on, unless another task has started since.
        !(self.any_followed() && self.start_listening())
    }

    /// Whether anyone here follows a thread.
    pub fn any_followed(&self) -> bool {
        let followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        followed.values().any(|sender| sender.receiver_count() > 0)
    }
}

/// A change as one payload line: tenant and thread ids hold no space.
fn payload_line(tenant: &str, thread_id: &str) -> String {
    format!("{tenant} {thread_id}")
}

/// `lines` joined into payloads of at most [`MAX_PAYLOAD_BYTES`].
fn payloads(lines: &[String]) -> Vec<String> {
    let mut payloads = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + 1 + line.len() > MAX_PAYLOAD_BYTES {
            payloads.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(line);
    }
    if !current.is_empty() {
        payloads.push(current);
    }
    payloads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_follower_sees_each_change_once_it_looks() {
        let changes = ThreadChanges::default();
        let tenant = TenantId("t".to_owned());
        let thread = ThreadId::new("a".to_owned());
        let mut follower = changes.follow(&tenant, &thread);
        assert!(!follower.has_changed().unwrap());
        changes.changed(&tenant, &thread);
        changes.heard("t a\nt other\nmalformed");
        assert!(follower.has_changed().unwrap());
        follower.borrow_and_update();
        assert!(!follower.has_changed().unwrap());
        // Another thread's change, or another tenant's, is not this thread's.
        changes.changed(&TenantId("u".to_owned()), &thread);
        changes.changed(&tenant, &ThreadId::new("b".to_owned()));
        assert!(!follower.has_changed().unwrap());
        drop(follower);
        assert!(!changes.any_followed());
    }

    #[test]
    fn payloads_stay_under_the_limit_and_keep_every_line() {
        let lines: Vec<String> = (0..2_000).map(|i| format!("tenant thread-{i}")).collect();
        let payloads = payloads(&lines);
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD_BYTES));
        let joined: Vec<&str> = payloads.iter().flat_map(|p| p.lines()).collect();
        assert_eq!(joined.len(), lines.len());
    }
}
