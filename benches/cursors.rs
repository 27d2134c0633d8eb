//! Cursor reads through the HTTP router, in process (`tower::ServiceExt::oneshot`, no socket), on
//! SQLite (a temporary file) and PostgreSQL (a fresh database created from `TEST_DATABASE_URL`,
//! dropped afterwards; skipped with a notice when the variable is unset).
//!
//! Run: `TEST_DATABASE_URL=postgres://loupe:loupe@127.0.0.1:5432/postgres cargo bench --bench cursors`
//!
//! Two threads per backend, of 1,000 and of 100,000 messages (realistic entries cycled from
//! `support/history.rs`, appended through `Store` during setup in batches of 1000). Each has a
//! cursor `memory` advanced once, through the router, to its middle message, so half the thread is
//! pending. Measured, with criterion (20 samples, 2 s warm-up, 5 s measurement):
//!
//! - `{backend}/cursor/new_count_{n}`: `GET /v1/threads/{id}/cursors/memory` on the thread of `n`.
//! - `{backend}/pending/limit_100_of_{n}`: `GET …/cursors/memory/pending?limit=100` (raw format,
//!   the 100 entries after the bookmark) on the long thread.
//!
//! Each iteration sends the request through the whole router (guard, limits, tracing, metrics)
//! and collects the response body. The router runs in open mode with the rate limit off.
//!
//! Under `cargo test --benches` (criterion's test mode, no `--bench` argument) the long thread
//! holds 2,000 messages instead, so the check stays quick.

#[path = "support/common.rs"]
mod common;
#[path = "support/history.rs"]
mod history;

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{Method, StatusCode};
use axum::Router;
use criterion::Criterion;
use loupe::history::Entry;
use loupe::store::{AppendRequest, NewThread, Store, StoreOptions, TenantId};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

const SETUP_BATCH: usize = 1000;
const SHORT: usize = 1_000;
const CURSOR: &str = "memory";

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let long: usize = if full { 100_000 } else { 2_000 };
    let mut c = Criterion::default().configure_from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let template: Vec<Entry> = history::history_values(10_000, 7)
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();

    common::on_each_backend(|backend, url| run_backend(&mut c, &rt, backend, url, &template, long));
    c.final_summary();
}

async fn get_ok(router: &Router, uri: &str) -> Bytes {
    let (status, body) = common::send(router, Method::GET, uri, None).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    body
}

/// Builds a thread of `len` messages and advances its cursor to the middle message (seq
/// `len / 2 - 1`); returns the cursor's path.
fn prepare_thread(
    rt: &Runtime,
    store: &Store,
    router: &Router,
    backend: &str,
    template: &[Entry],
    len: usize,
) -> String {
    let tenant = TenantId::default_tenant();
    let thread = format!("cursors-{len}");
    let started = Instant::now();
    rt.block_on(async {
        store
            .create_thread(
                &tenant,
                NewThread {
                    id: Some(thread.clone().into()),
                    ..Default::default()
                },
            )
            .await
            .expect("create thread");
        let mut next = 0;
        while next < len {
            let count = SETUP_BATCH.min(len - next);
            let entries = (next..next + count)
                .map(|n| common::cycled(template, &thread, n))
                .collect();
            store
                .append(
                    &tenant,
                    &thread.as_str().into(),
                    AppendRequest {
                        entries,
                        expected_next_seq: None,
                    },
                )
                .await
                .expect("setup append");
            next += count;
        }
    });
    let built = started.elapsed();

    let cursor = format!("/v1/threads/{thread}/cursors/{CURSOR}");
    let middle = len / 2 - 1;
    rt.block_on(async {
        let (status, body) = common::send(
            router,
            Method::POST,
            &format!("{cursor}/advance"),
            Some(json!({"to": format!("{thread}-{middle}"), "expected": null})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let state: Value = serde_json::from_slice(&get_ok(router, &cursor).await).unwrap();
        assert_eq!(state["bookmark"]["seq"], middle as i64, "{state}");
        assert_eq!(
            state["pending_entries"],
            (len - middle - 1) as i64,
            "{state}"
        );
        println!(
            "{backend}: thread of {len} built in {:.2} s; cursor at seq {middle}: new_count {}, \
             pending_entries {}",
            built.as_secs_f64(),
            state["new_count"],
            state["pending_entries"],
        );
    });
    cursor
}

fn run_backend(
    c: &mut Criterion,
    rt: &Runtime,
    backend: &str,
    url: &str,
    template: &[Entry],
    long: usize,
) {
    let store = rt.block_on(async {
        let store = Store::connect(&StoreOptions::new(url))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        store
    });
    let router = common::router(&store);
    let cursors: Vec<(usize, String)> = [SHORT, long]
        .into_iter()
        .map(|len| {
            let cursor = prepare_thread(rt, &store, &router, backend, template, len);
            (len, cursor)
        })
        .collect();

    let mut group = c.benchmark_group(format!("{backend}/cursor"));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2));
    for (len, cursor) in &cursors {
        group.bench_function(format!("new_count_{len}"), |b| {
            b.to_async(rt).iter(|| get_ok(&router, cursor))
        });
    }
    group.finish();

    let (len, cursor) = cursors.last().unwrap();
    let pending = format!("{cursor}/pending?limit=100");
    let body = rt.block_on(get_ok(&router, &pending));
    let first: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(first["entry_count"], 100, "{}", first["cursor"]);
    assert_eq!(first["first_seq"], (len / 2) as i64);
    println!(
        "{backend}: pending?limit=100 on the thread of {len}: seqs {}–{}, {} bytes of JSON",
        first["first_seq"],
        first["last_seq"],
        body.len()
    );
    let mut group = c.benchmark_group(format!("{backend}/pending"));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2));
    group.bench_function(format!("limit_100_of_{len}"), |b| {
        b.to_async(rt).iter(|| get_ok(&router, &pending))
    });
    group.finish();
    rt.block_on(store.close());
}
