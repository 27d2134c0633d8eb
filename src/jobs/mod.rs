//! Background jobs: tokio workers in the same binary, sharing the durable queue in the database.
//!
//! [`Runner::step`] is one unit of work — claim a job, run it, record the outcome — and takes the
//! time from a [`Clock`], so tests drive the queue step by step with injected time and never
//! sleep. [`spawn_workers`] runs `N` loops of it, woken when a job is enqueued (an in-process
//! `Notify`; on PostgreSQL also `LISTEN`/`NOTIFY` across processes) and polling as a fallback.
//!
//! Lifecycle (see `docs/COMPACTION.md`): `pending` → (claimed) `running` → `succeeded`, or on an
//! error back to `pending` after a bounded exponential backoff, or `failed` after the last
//! attempt. A running job whose lease expires (its worker died) is claimed again.

pub mod compaction;
pub mod erasure;
pub mod retention;
pub mod tree;
pub mod view_reader;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{Backend, ClaimedJob, JobState, Store, StoreError, NOTIFY_CHANNEL};
pub use crate::store::{CompactionPayload, KIND_COMPACTION, KIND_NOOP, KIND_RETENTION, KIND_TREE};
use crate::summarize::{SummarizeError, Summarizer};
pub use compaction::SUMMARY_PAGE_ENTRIES;

/// Where the workers' time comes from.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    System,
    /// Every timestamp of the step is this one (tests).
    Fixed(i64),
}

impl Clock {
    pub fn now_ms(self) -> i64 {
        match self {
            Clock::System => chrono::Utc::now().timestamp_millis(),
            Clock::Fixed(ms) => ms,
        }
    }
}

/// Settings of the workers.
#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// How long a claim holds a job without renewal; a running worker renews it every third.
    pub lease: Duration,
    /// First retry delay, doubled per failed attempt, capped at `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How often an idle worker looks for work when no wake-up arrives.
    pub poll_interval: Duration,
    /// Byte budget of a compaction summary.
    pub summary_max_bytes: usize,
    /// Most estimated tokens of history one summarizer request of a compaction carries: a
    /// longer window is summarized a page at a time, each page's summary folded into the next,
    /// so a job holds one page of message bodies whatever the window's length. The default is
    /// above the default automatic compaction threshold, so such a window is one page.
    pub compaction_page_tokens: u64,
    /// How often the retention job is enqueued (`retention::spawn_retention_sweeper`).
    pub retention_sweep: Duration,
    /// This process's name among those sharing the database: its workers' claims start with
    /// `<instance_id>/`, so after a restart it gives back the jobs it held at once.
    pub instance_id: Cow<'static, str>,
}

impl JobsConfig {
    /// The defaults, which the command line's flags also take theirs from.
    pub const DEFAULT: JobsConfig = JobsConfig {
        lease: Duration::from_secs(300),
        backoff_base: Duration::from_secs(5),
        backoff_max: Duration::from_secs(300),
        poll_interval: Duration::from_secs(1),
        summary_max_bytes: 24_000,
        compaction_page_tokens: 256_000,
        retention_sweep: Duration::from_secs(60),
        instance_id: Cow::Borrowed("local"),
    };
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig::DEFAULT
    }
}

impl JobsConfig {
    /// The delay before the retry that follows failed attempt number `attempts` (1-based):
    /// `base · 2^(attempts−1)`, at most `backoff_max`.
    pub fn backoff(&self, attempts: i64) -> Duration {
        let exponent = attempts.saturating_sub(1).clamp(0, 20) as u32;
        self.backoff_base
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.backoff_max)
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// No job was claimable.
    Idle,
    Succeeded {
        job_id: String,
        result: Value,
    },
    /// The attempt failed; the job is pending again.
    WillRetry {
        job_id: String,
        error: String,
    },
    /// The last attempt failed.
    Failed {
        job_id: String,
        error: String,
    },
    /// The lease was taken over while the job ran: its outcome was discarded.
    LeaseLost {
        job_id: String,
    },
    /// Shutdown: the job was given back unfinished.
    Released {
        job_id: String,
    },
}

impl StepOutcome {
    /// The `outcome` label of the jobs metric.
    pub fn label(&self) -> &'static str {
        match self {
            StepOutcome::Idle => "idle",
            StepOutcome::Succeeded { .. } => "succeeded",
            StepOutcome::WillRetry { .. } => "retry",
            StepOutcome::Failed { .. } => "failed",
            StepOutcome::LeaseLost { .. } => "lease_lost",
            StepOutcome::Released { .. } => "released",
        }
    }
}

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("summarizer: {0}")]
    Summarize(#[from] SummarizeError),
    #[error("{0}")]
    Invalid(String),
    /// The job's code panicked; caught, so the worker lives on and the job is retried.
    #[error("the job panicked")]
    Panicked,
}

impl JobError {
    /// What the job's `last_error` shows its tenant: the kind of failure, without the internal
    /// strings the full error carries (database messages, hosts, configuration), which go to the
    /// log only.
    fn public_text(&self) -> String {
        match self {
            JobError::Store(error) if error.is_transient() => {
                "the database was unavailable".to_owned()
            }
            JobError::Store(StoreError::BoundaryMoved)
            | JobError::Store(StoreError::SourcesChanged)
            | JobError::Store(StoreError::ThreadNotFound) => self.to_string(),
            JobError::Store(_) => "the job failed on a database error".to_owned(),
            JobError::Summarize(error) => format!("summarizer: {}", public_summarize_text(error)),
            JobError::Invalid(text) => crate::store::clip(text, 200).into_owned(),
            JobError::Panicked => self.to_string(),
        }
    }
}

fn public_summarize_text(error: &SummarizeError) -> String {
    match error {
        SummarizeError::Transport(_) => "cannot reach the model provider".to_owned(),
        SummarizeError::Config(_) => "the summarizer is misconfigured".to_owned(),
        SummarizeError::GaveUp { calls, last } => {
            format!(
                "gave up after {calls} model call(s): {}",
                public_summarize_text(last)
            )
        }
        other => crate::store::clip(&other.to_string(), 200).into_owned(),
    }
}

/// Runs jobs. One per worker (the worker id names its claims).
pub struct Runner {
    pub store: Store,
    pub summarizer: Arc<dyn Summarizer>,
    pub config: JobsConfig,
    pub worker_id: String,
}

impl Runner {
    pub fn new(store: Store, summarizer: Arc<dyn Summarizer>, config: JobsConfig) -> Self {
        Runner {
            store,
            summarizer,
            worker_id: format!(
                "{}/worker-{}",
                config.instance_id,
                uuid::Uuid::new_v4().simple()
            ),
            config,
        }
    }

    fn lease_ms(&self) -> i64 {
        self.config.lease.as_millis() as i64
    }

    /// Claims one job and runs it to its outcome. Store errors outside a job are returned.
    pub async fn step(&self, clock: Clock) -> Result<StepOutcome, StoreError> {
        self.step_until(clock, &CancellationToken::new()).await
    }

    /// [`Runner::step`] that gives the job back when `abort` fires before it is done.
    pub async fn step_until(
        &self,
        clock: Clock,
        abort: &CancellationToken,
    ) -> Result<StepOutcome, StoreError> {
        let Some(claimed) = self
            .store
            .claim_job(&self.worker_id, clock.now_ms(), self.lease_ms())
            .await?
        else {
            return Ok(StepOutcome::Idle);
        };
        Ok(self.run_claimed(&claimed, clock, abort).await)
    }

    /// Runs a claimed job and records its outcome (fenced by the claim's lease).
    pub async fn run_claimed(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
        abort: &CancellationToken,
    ) -> StepOutcome {
        let job_id = claimed.job.id.clone();
        // A panic inside the job fails this attempt (and goes through the retry path) instead
        // of killing the worker's task.
        let work = CatchUnwind(Box::pin(self.execute(claimed, clock)));
        tokio::pin!(work);
        let renew_every = (self.config.lease / 3).max(Duration::from_millis(10));
        let outcome = loop {
            tokio::select! {
                outcome = &mut work => break Some(outcome),
                _ = abort.cancelled() => break None,
                _ = tokio::time::sleep(renew_every), if matches!(clock, Clock::System) => {
                    if let Err(error) = self.store.extend_lease(claimed, clock.now_ms(), self.lease_ms()).await {
                        tracing::warn!(job_id, %error, "cannot renew the job's lease");
                    }
                }
            }
        };
        let step = match outcome {
            Some(outcome) => self.record(claimed, clock, outcome).await,
            None => match self.store.release_job(claimed, clock.now_ms()).await {
                Ok(()) => StepOutcome::Released { job_id },
                Err(error) => {
                    tracing::warn!(job_id, %error, "cannot release the job");
                    StepOutcome::LeaseLost { job_id }
                }
            },
        };
        crate::metrics::job_finished(&claimed.job.kind, step.label());
        step
    }

    /// Records a finished attempt: success was written by the job itself; a failure is
    /// written here, as a retry or for good.
    async fn record(
        &self,
        claimed: &ClaimedJob,
        clock: Clock,
        outcome: Result<Value, JobError>,
    ) -> StepOutcome {
        let job_id = claimed.job.id.clone();
        match outcome {
            Ok(result) => {
                tracing::info!(job_id, kind = %claimed.job.kind, "job succeeded");
                StepOutcome::Succeeded { job_id, result }
            }
            Err(JobError::Store(StoreError::LeaseLost(_))) => {
                tracing::warn!(
                    job_id,
                    "the job's lease was taken over; its outcome is discarded"
                );
                StepOutcome::LeaseLost { job_id }
            }
            Err(error) => {
                tracing::warn!(job_id, kind = %claimed.job.kind, %error, "job attempt failed");
                let error = error.public_text();
                let now = clock.now_ms();
                let retry_at = now + self.config.backoff(claimed.job.attempts).as_millis() as i64;
                match self.store.fail_job(claimed, &error, retry_at, now).await {
                    Ok(JobState::Failed) => {
                        tracing::warn!(job_id, %error, "job failed for good");
                        StepOutcome::Failed { job_id, error }
                    }
                    Ok(_) => {
                        tracing::info!(job_id, %error, retry_at, "job attempt failed; will retry");
                        StepOutcome::WillRetry { job_id, error }
                    }
                    Err(store_error) => {
                        tracing::warn!(job_id, %store_error, "cannot record the job's failure");
                        StepOutcome::LeaseLost { job_id }
                    }
                }
            }
        }
    }

    /// Runs the job; a success is recorded here (atomically with the job's own write).
    async fn execute(&self, claimed: &ClaimedJob, clock: Clock) -> Result<Value, JobError> {
        match claimed.job.kind.as_str() {
            KIND_NOOP => {
                let result = json!({"ok": true});
                self.store
                    .complete_job(claimed, &result, clock.now_ms())
                    .await?;
                Ok(result)
            }
            KIND_COMPACTION => self.compact(claimed, clock).await,
            KIND_TREE => self.run_tree(claimed, clock).await,
            KIND_RETENTION => self.sweep_retention(claimed, clock).await,
            other => Err(JobError::Invalid(format!("unknown job kind {other:?}"))),
        }
    }
}

/// A future whose panic becomes [`JobError::Panicked`].
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future<Output = Result<Value, JobError>>> std::future::Future
    for CatchUnwind<F>
{
    type Output = Result<Value, JobError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(poll) => poll,
            Err(_) => std::task::Poll::Ready(Err(JobError::Panicked)),
        }
    }
}

/// Runs `runners.len()` worker loops until `stop` fires; a job still running when `abort` fires
/// is given back. On PostgreSQL, a listener wakes the workers on `NOTIFY` from any process.
pub fn spawn_workers(
    runners: Vec<Runner>,
    stop: CancellationToken,
    abort: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut handles = Vec::new();
    let Some(first) = runners.first() else {
        return handles;
    };
    let signal = first.store.job_signal();
    if first.store.backend() == Backend::Postgres {
        handles.push(tokio::spawn(listen(
            first.store.clone(),
            signal.clone(),
            stop.clone(),
        )));
    }
    for runner in runners {
        let (stop, abort, signal) = (stop.clone(), abort.clone(), signal.clone());
        handles.push(tokio::spawn(async move {
            tracing::info!(worker = %runner.worker_id, "job worker started");
            while !stop.is_cancelled() {
                let idle = match runner.step_until(Clock::System, &abort).await {
                    Ok(StepOutcome::Idle) => true,
                    Ok(_) => false,
                    Err(error) => {
                        tracing::warn!(%error, "cannot claim a job");
                        true
                    }
                };
                if idle {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = signal.notified() => {}
                        _ = tokio::time::sleep(runner.config.poll_interval) => {}
                    }
                }
            }
            tracing::info!(worker = %runner.worker_id, "job worker stopped");
        }));
    }
    handles
}

/// Keeps the search index up with the appends of every thread (a search also brings its own
/// thread up to date first): a batch of each thread it is behind on, then a rest of `idle`
/// whenever none is. Under load it works at most `INDEXER_SHARE_PERCENT` of the time, resting
/// the rest: the appends it follows keep their rate (SQLite has one writer, and both share the
/// cores), and the lag it leaves shows in each search's answer.
pub fn spawn_indexer(store: Store, idle: Duration, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let started = std::time::Instant::now();
            let rest = match store.index_behind(INDEXER_THREADS).await {
                Ok(0) => idle,
                Ok(_) => {
                    let worked = started.elapsed();
                    worked * (100 - INDEXER_SHARE_PERCENT) / INDEXER_SHARE_PERCENT
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot index for search");
                    idle
                }
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(rest) => {}
            }
        }
    })
}

/// Threads the indexer takes a batch of at a time.
const INDEXER_THREADS: i64 = 16;

/// The share of the time the indexer works while appends keep it busy.
const INDEXER_SHARE_PERCENT: u32 = 2;

/// Forwards PostgreSQL `NOTIFY loupe_jobs` to the in-process signal, reconnecting on errors.
async fn listen(store: Store, signal: Arc<tokio::sync::Notify>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        // Asked each time: after a failover, the primary's URL is another.
        let url = store.url();
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(NOTIFY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listener.await {
            Ok(mut listener) => loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    // sqlx's listener connects again to the host it was made for: after a
                    // failover, that is the old primary.
                    () = store.primary_switched() => break,
                    notification = listener.recv() => match notification {
                        Ok(_) => signal.notify_one(),
                        Err(error) => {
                            tracing::warn!(%error, "job listener lost its connection");
                            break;
                        }
                    }
                }
            },
            Err(error) => tracing::warn!(%error, "cannot listen for job notifications"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let config = JobsConfig {
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(60),
            ..JobsConfig::default()
        };
        let delays: Vec<u64> = (1..=6).map(|n| config.backoff(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 60, 60]);
        assert_eq!(config.backoff(0).as_secs(), 5);
        assert_eq!(config.backoff(i64::MAX).as_secs(), 60);
    }
}
