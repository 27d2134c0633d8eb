//! The retention job: deletes the threads their policies expired and trims those whose policy
//! keeps only what follows the last compact boundary (`store::retention`), a batch at a time.
//! [`spawn_retention_sweeper`] enqueues it now and then (one pending or running at a time, in
//! any number of processes); a full batch enqueues the next at once.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::erasure::trim;
use super::{Clock, JobError, Runner};
use crate::store::{
    ClaimedJob, NewJob, Store, StoreError, TenantId, TrimCandidate, KIND_RETENTION,
    MAX_ERASED_ENTRIES,
};

/// Threads one retention job expires, and threads it trims.
pub const RETENTION_BATCH: u32 = 100;

/// The retention job's dedup key: one pending or running at a time.
const RETENTION_DEDUP_KEY: &str = "retention";

/// The retention job, queued to run at once (deduplicated).
pub fn retention_job() -> NewJob {
    NewJob {
        // Of no tenant: no tenant's API shows it.
        tenant: TenantId(String::new()),
        thread_key: None,
        kind: KIND_RETENTION.to_owned(),
        payload: json!({}),
        dedup_key: Some(RETENTION_DEDUP_KEY.to_owned()),
        max_attempts: 5,
    }
}

impl Runner {
    pub(super) async fn sweep_retention(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
    ) -> Result<Value, JobError> {
        let now = clock.now_ms();
        let due = self.store.expired_threads(now, RETENTION_BATCH).await?;
        let mut expired = 0;
        for (tenant, thread_id) in &due {
            match self.store.expire_thread(tenant, thread_id, now).await {
                Ok(true) => expired += 1,
                Ok(false) | Err(StoreError::ThreadNotFound) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let candidates = self.store.trim_candidates(RETENTION_BATCH).await?;
        let mut trimmed = 0;
        for candidate in &candidates {
            match trim_thread(&self.store, candidate).await {
                Ok(entries) => trimmed += entries,
                Err(StoreError::ThreadNotFound) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let more =
            due.len() == RETENTION_BATCH as usize || candidates.len() == RETENTION_BATCH as usize;
        let result = json!({
            "expired_threads": expired,
            "trimmed_threads": candidates.len(),
            "trimmed_entries": trimmed,
            "more": more,
        });
        self.store.complete_job(claimed, &result, now).await?;
        if more {
            self.store.enqueue_job(&retention_job(), now).await?;
        }
        Ok(result)
    }
}

/// Trims the thread of `candidate`: erases its entries before its context window that are not
/// erased yet, then records it checked. Returns how many entries went.
async fn trim_thread(store: &Store, candidate: &TrimCandidate) -> Result<u64, StoreError> {
    let head = store
        .thread_head(&candidate.tenant, &candidate.thread_id)
        .await?;
    if head.thread_key != candidate.thread_key {
        return Err(StoreError::ThreadNotFound);
    }
    let bounds = store
        .window_bounds_below(&candidate.thread_key, head.next_seq)
        .await?;
    let below = if bounds.boundary.is_some() {
        bounds.start_seq
    } else {
        0
    };
    let mut trimmed = 0;
    let mut from = candidate.trimmed_below;
    while from < below {
        let (seqs, last) = store
            .unerased_seqs_between(
                &candidate.thread_key,
                from,
                below,
                MAX_ERASED_ENTRIES as u32,
            )
            .await?;
        let Some(last) = last else { break };
        if !seqs.is_empty() {
            let erasure = trim(
                store,
                &candidate.tenant,
                &candidate.thread_id,
                &candidate.thread_key,
                &seqs,
            )
            .await?;
            // As after any erasure: the files stop holding the text (the receipt says when).
            store.queue_scrub(erasure.erasure_id);
            trimmed += seqs.len() as u64;
        }
        from = last + 1;
    }
    store
        .mark_trimmed(
            &candidate.thread_key,
            below.max(candidate.trimmed_below),
            head.next_seq,
            candidate.updated_at,
        )
        .await?;
    Ok(trimmed)
}

/// Enqueues the retention job every `interval` until `stop`.
pub fn spawn_retention_sweeper(
    store: Store,
    interval: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let now = chrono::Utc::now().timestamp_millis();
            if let Err(error) = store.enqueue_job(&retention_job(), now).await {
                tracing::warn!(%error, "cannot enqueue the retention job");
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(interval) => {}
            }
        }
    })
}
