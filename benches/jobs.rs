//! Job queue throughput and compaction latency, timed plainly (no statistics framework).
//!
//! `BENCH_DATABASE_URL` (or `TEST_DATABASE_URL`) names a PostgreSQL role that may create
//! databases; each measurement runs in a fresh database, dropped afterwards. SQLite runs in a
//! temporary file. Run: `cargo bench --bench jobs` (release profile).

#[path = "support/common.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use loupe::history::Entry;
use loupe::jobs::{Clock, CompactionPayload, JobsConfig, Runner, StepOutcome, KIND_NOOP};
use loupe::store::{now_millis, AppendRequest, NewJob, NewThread, Store, StoreOptions, TenantId};
use loupe::summarize::ExtractiveSummarizer;
use serde_json::json;

use common::Scratch;

const NOOP_JOBS: usize = 2_000;
const THREAD_MESSAGES: usize = 10_000;

fn runner(store: &Store) -> Runner {
    Runner::new(
        store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    )
}

/// Jobs claimed and completed per second by `workers` concurrent workers.
async fn noop_throughput(store: &Store, workers: usize) -> (usize, Duration) {
    let now = now_millis();
    for _ in 0..NOOP_JOBS {
        store
            .enqueue_job(
                &NewJob {
                    tenant: TenantId::default_tenant(),
                    thread_key: None,
                    kind: KIND_NOOP.to_owned(),
                    payload: json!({}),
                    dedup_key: None,
                    max_attempts: 3,
                },
                now,
            )
            .await
            .unwrap();
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let runner = runner(store);
            tokio::spawn(async move {
                let mut done = 0;
                while let StepOutcome::Succeeded { .. } = runner.step(Clock::System).await.unwrap()
                {
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await.unwrap();
    }
    (done, started.elapsed())
}

/// Appends a 10,000-message thread (2,500 tool-use rounds), then times one compaction job.
async fn compaction(store: &Store) -> Duration {
    let tenant = TenantId::default_tenant();
    let thread = store
        .create_thread(&tenant, NewThread::default())
        .await
        .unwrap();
    let mut batch = Vec::new();
    for i in 0..THREAD_MESSAGES / 4 {
        let entries = [
            json!({"type": "user", "message": {"role": "user", "content": format!("Please look at file {i} and fix the failing test.")}}),
            json!({"type": "assistant", "message": {"role": "assistant", "id": format!("msg_{i}"),
                "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read", "input": {"path": format!("src/f{i}.rs")}}]}}),
            json!({"type": "user", "message": {"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": format!("toolu_{i}"), "content": format!("fn f{i}() {{ todo!() }}\n").repeat(20)}]}}),
            json!({"type": "assistant", "message": {"role": "assistant", "id": format!("msg_{i}"),
                "content": [{"type": "text", "text": format!("Fixed f{i} because the test expected a value.")}]}}),
        ];
        batch.extend(
            entries
                .into_iter()
                .map(|v| serde_json::from_value::<Entry>(v).unwrap()),
        );
        if batch.len() >= 1_000 {
            store
                .append(
                    &tenant,
                    &thread.id,
                    AppendRequest {
                        entries: std::mem::take(&mut batch),
                        expected_next_seq: None,
                    },
                )
                .await
                .unwrap();
        }
    }
    store
        .enqueue_compaction(
            &tenant,
            &thread.id,
            CompactionPayload::manual(&thread.id, 2, None).to_value(),
            3,
            now_millis(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = runner(store).step(Clock::System).await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    elapsed
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a short smoke.
    let url = common::admin_url();
    for workers in [1, 4] {
        let Some(url) = &url else {
            break;
        };
        let scratch = Scratch::postgres(url, StoreOptions::new("")).await;
        let (done, elapsed) = noop_throughput(&scratch.store, workers).await;
        println!(
            "postgres noop jobs, {workers} worker(s): {done} in {:.2} s = {:.0} jobs/s",
            elapsed.as_secs_f64(),
            done as f64 / elapsed.as_secs_f64()
        );
        scratch.finish().await;
    }
    for workers in [1, 4] {
        let scratch = Scratch::sqlite(StoreOptions::new("")).await;
        let (done, elapsed) = noop_throughput(&scratch.store, workers).await;
        println!(
            "sqlite noop jobs, {workers} worker(s): {done} in {:.2} s = {:.0} jobs/s",
            elapsed.as_secs_f64(),
            done as f64 / elapsed.as_secs_f64()
        );
        scratch.finish().await;
    }
    if let Some(url) = &url {
        let scratch = Scratch::postgres(url, StoreOptions::new("")).await;
        let elapsed = compaction(&scratch.store).await;
        println!(
            "postgres compaction of a {THREAD_MESSAGES}-message thread (extractive): {:.0} ms",
            elapsed.as_secs_f64() * 1000.0
        );
        scratch.finish().await;
    }
    let scratch = Scratch::sqlite(StoreOptions::new("")).await;
    let elapsed = compaction(&scratch.store).await;
    println!(
        "sqlite compaction of a {THREAD_MESSAGES}-message thread (extractive): {:.0} ms",
        elapsed.as_secs_f64() * 1000.0
    );
    scratch.finish().await;
}
