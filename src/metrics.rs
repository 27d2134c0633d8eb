//! Prometheus metrics: one process-wide recorder, rendered by `GET /metrics`.
//!
//! Series (all names are stable; dashboards depend on them):
//! - `loupe_http_requests_total{method,route,status}` and
//!   `loupe_http_request_duration_seconds{method,route,status}` (histogram). `route` is the route
//!   template (`/v1/threads/{thread_id}`), never the raw URI; `unmatched` for unknown routes.
//! - `loupe_db_pool_connections`, `loupe_db_pool_idle_connections`,
//!   `loupe_db_pool_in_use_connections`: gauges, read at scrape time.
//! - `loupe_summarizer_calls_total{backend}` and `loupe_summarizer_failures_total{backend}`:
//!   summaries asked of a backend, and those that failed (a failed model call falls back to the
//!   extractive summarizer, counted as a call of `extractive`).
//! - `loupe_jobs_queued` (gauge) and `loupe_jobs_completed_total{kind,outcome}`: set by the job
//!   queue through [`set_jobs_queued`] and [`job_finished`].
//! - `loupe_rate_limited_total` and `loupe_overloaded_total`: requests refused by the guard rails.
//! - `loupe_context_reads_total{path}`: context reads that went on from a cached checkpoint
//!   (`incremental`), normalized a window of more than one page a page at a time (`paged`), or
//!   normalized the whole window at once (`full`); `loupe_context_fallbacks_total{path,reason}`:
//!   reads that had a checkpoint (`incremental`) or pages (`paged`) but could not use them, by
//!   the path that gave up (a read can give up on both before it reads the window whole); `loupe_context_cache_bytes` (gauge): what
//!   the cached checkpoints weigh.
//! - `loupe_append_groups_total`, `loupe_append_group_appends_total` and
//!   `loupe_append_split_groups_total`: group commit's transactions, the appends they held (their
//!   ratio is the mean group size), and groups a failed statement split into lone appends; read
//!   from the store at scrape time.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const HTTP_REQUESTS: &str = "loupe_http_requests_total";
pub const HTTP_DURATION: &str = "loupe_http_request_duration_seconds";
pub const DB_POOL_CONNECTIONS: &str = "loupe_db_pool_connections";
pub const DB_POOL_IDLE: &str = "loupe_db_pool_idle_connections";
pub const DB_POOL_IN_USE: &str = "loupe_db_pool_in_use_connections";
pub const SUMMARIZER_CALLS: &str = "loupe_summarizer_calls_total";
pub const SUMMARIZER_FAILURES: &str = "loupe_summarizer_failures_total";
pub const JOBS_QUEUED: &str = "loupe_jobs_queued";
pub const WEBHOOK_ATTEMPTS: &str = "loupe_webhook_attempts_total";
const JOBS_COMPLETED: &str = "loupe_jobs_completed_total";
pub const RATE_LIMITED: &str = "loupe_rate_limited_total";
pub const OVERLOADED: &str = "loupe_overloaded_total";
pub const CONTEXT_READS: &str = "loupe_context_reads_total";
pub const CONTEXT_FALLBACKS: &str = "loupe_context_fallbacks_total";
pub const CONTEXT_CACHE_BYTES: &str = "loupe_context_cache_bytes";
pub const STANDBY_READS: &str = "loupe_standby_reads_total";
pub const STANDBY_READ_RETRIES: &str = "loupe_standby_read_retries_total";
pub const STANDBY_LAG_BYTES: &str = "loupe_standby_lag_bytes";
pub const APPEND_GROUPS: &str = "loupe_append_groups_total";
pub const APPEND_GROUP_APPENDS: &str = "loupe_append_group_appends_total";
pub const APPEND_SPLIT_GROUPS: &str = "loupe_append_split_groups_total";

/// Latency buckets, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls are no-ops). Returns false when another
/// recorder was installed first, in which case `/metrics` renders nothing.
pub fn init() -> bool {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HTTP_DURATION.to_owned()), DURATION_BUCKETS)
                .expect("the buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    describe();
                    Some(handle)
                }
                Err(_) => {
                    tracing::warn!("a metrics recorder was already installed; /metrics is empty");
                    None
                }
            }
        })
        .is_some()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests answered, by route template and status"
    );
    describe_histogram!(HTTP_DURATION, Unit::Seconds, "HTTP request latency");
    describe_gauge!(DB_POOL_CONNECTIONS, "Open database connections");
    describe_gauge!(DB_POOL_IDLE, "Idle database connections");
    describe_gauge!(DB_POOL_IN_USE, "Database connections in use");
    describe_counter!(SUMMARIZER_CALLS, "Summaries asked of a summarizer backend");
    describe_counter!(SUMMARIZER_FAILURES, "Summaries a backend failed to write");
    describe_counter!(
        WEBHOOK_ATTEMPTS,
        "Webhook delivery attempts, by outcome (delivered, failed)"
    );
    describe_gauge!(JOBS_QUEUED, "Jobs waiting in the queue");
    describe_counter!(JOBS_COMPLETED, "Jobs finished, by kind and outcome");
    describe_counter!(
        RATE_LIMITED,
        "Requests refused by the per-tenant rate limit"
    );
    describe_counter!(
        OVERLOADED,
        "Expensive requests refused for lack of capacity"
    );
    describe_counter!(
        CONTEXT_READS,
        "Context reads, by path: incremental (from a cached checkpoint) or full"
    );
    describe_counter!(
        CONTEXT_FALLBACKS,
        "Context reads that had a cached checkpoint but normalized the whole window, by reason"
    );
    describe_gauge!(
        CONTEXT_CACHE_BYTES,
        Unit::Bytes,
        "Bytes held by the context cache's checkpoints"
    );
    describe_counter!(APPEND_GROUPS, "Transactions group commit wrote appends in");
    describe_counter!(
        APPEND_GROUP_APPENDS,
        "Appends those transactions held (divided by the groups: the mean group size)"
    );
    describe_counter!(
        APPEND_SPLIT_GROUPS,
        "Groups a failed statement rolled back, then written one append at a time"
    );
    describe_counter!(
        STANDBY_READS,
        "Reads by where they were served: standby, standby_after_wait, primary, or \
         primary_after_wait (a read that waited for a standby in vain)"
    );
    describe_counter!(
        STANDBY_READ_RETRIES,
        "Reads a standby failed that the primary then served"
    );
    describe_gauge!(
        STANDBY_LAG_BYTES,
        Unit::Bytes,
        "The largest WAL gap between this process's last write and a healthy standby's replay"
    );
    // Gauges exist from the start, so dashboards see a zero instead of no data.
    metrics::gauge!(JOBS_QUEUED).set(0.0);
    metrics::counter!(RATE_LIMITED).increment(0);
    metrics::counter!(OVERLOADED).increment(0);
}

/// The Prometheus text exposition of every series.
pub fn render() -> String {
    match HANDLE.get() {
        Some(Some(handle)) => handle.render(),
        _ => String::new(),
    }
}

/// Drains histogram samples into their buckets; call periodically so memory stays bounded
/// between scrapes.
pub fn run_upkeep() {
    if let Some(Some(handle)) = HANDLE.get() {
        handle.run_upkeep();
    }
}

/// One answered HTTP request.
pub fn http_request(method: &str, route: &str, status: u16, elapsed: Duration) {
    let labels = [
        ("method", method.to_owned()),
        ("route", route.to_owned()),
        ("status", status.to_string()),
    ];
    metrics::counter!(HTTP_REQUESTS, &labels).increment(1);
    metrics::histogram!(HTTP_DURATION, &labels).record(elapsed.as_secs_f64());
}

/// The database pool at scrape time.
pub fn db_pool(size: u32, idle: usize) {
    let size = f64::from(size);
    let idle = idle as f64;
    metrics::gauge!(DB_POOL_CONNECTIONS).set(size);
    metrics::gauge!(DB_POOL_IDLE).set(idle);
    metrics::gauge!(DB_POOL_IN_USE).set((size - idle).max(0.0));
}

/// Group commit's totals since the store was opened.
pub fn append_groups(groups: u64, appends: u64, split: u64) {
    metrics::counter!(APPEND_GROUPS).absolute(groups);
    metrics::counter!(APPEND_GROUP_APPENDS).absolute(appends);
    metrics::counter!(APPEND_SPLIT_GROUPS).absolute(split);
}

/// A summary asked of `backend` (`anthropic`, `openai`, `extractive`, …).
pub fn summarizer_call(backend: &str) {
    metrics::counter!(SUMMARIZER_CALLS, "backend" => backend.to_owned()).increment(1);
}

/// A summary `backend` failed to write.
pub fn summarizer_failure(backend: &str) {
    metrics::counter!(SUMMARIZER_FAILURES, "backend" => backend.to_owned()).increment(1);
}

/// The number of jobs waiting in the queue.
pub fn set_jobs_queued(depth: u64) {
    metrics::gauge!(JOBS_QUEUED).set(depth as f64);
}

/// A job of `kind` finished with `outcome` (e.g. `succeeded`, `failed`, `cancelled`).
pub fn job_finished(kind: &str, outcome: &str) {
    metrics::counter!(JOBS_COMPLETED, "kind" => kind.to_owned(), "outcome" => outcome.to_owned())
        .increment(1);
}

/// A webhook delivery attempt ended.
pub fn webhook_attempt(delivered: bool) {
    let outcome = if delivered { "delivered" } else { "failed" };
    metrics::counter!(WEBHOOK_ATTEMPTS, "outcome" => outcome).increment(1);
}

pub fn rate_limited() {
    metrics::counter!(RATE_LIMITED).increment(1);
}

pub fn overloaded() {
    metrics::counter!(OVERLOADED).increment(1);
}

/// A context read that took `path` (`incremental` or `full`).
pub fn context_read(path: &'static str) {
    metrics::counter!(CONTEXT_READS, "path" => path).increment(1);
}

/// A context read that could not go on along `path` (`incremental`: from its cached checkpoint;
/// `paged`: a page at a time), and why (a fixed text).
pub fn context_fallback(path: &'static str, reason: &'static str) {
    metrics::counter!(CONTEXT_FALLBACKS, "path" => path, "reason" => reason).increment(1);
}

/// A read routed to `route` (`standby`, `standby_after_wait`, `primary` or
/// `primary_after_wait`), with the standbys' largest lag then.
pub fn standby_read(route: &'static str, lag_bytes: u64) {
    metrics::counter!(STANDBY_READS, "route" => route).increment(1);
    metrics::gauge!(STANDBY_LAG_BYTES).set(lag_bytes as f64);
}

/// A read a standby failed, served again by the primary.
pub fn standby_read_retried() {
    metrics::counter!(STANDBY_READ_RETRIES).increment(1);
}

/// What the context cache holds now.
pub fn context_cache_bytes(bytes: usize) {
    metrics::gauge!(CONTEXT_CACHE_BYTES).set(bytes as f64);
}

/// The backend part of a summarizer name: `anthropic:claude-…` → `anthropic`.
pub fn backend_label(summarizer_name: &str) -> &str {
    summarizer_name
        .split([':', '|'])
        .next()
        .unwrap_or(summarizer_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_labels_drop_the_model() {
        assert_eq!(backend_label("anthropic:claude-x"), "anthropic");
        assert_eq!(backend_label("extractive"), "extractive");
        assert_eq!(backend_label("openai:gpt|fallback:extractive"), "openai");
    }
}
