//! Store throughput and paging latency, on SQLite (a temporary file) and PostgreSQL (a fresh
//! database created from `TEST_DATABASE_URL`, dropped afterwards; skipped with a notice when the
//! variable is unset).
//!
//! Run: `TEST_DATABASE_URL=postgres://loupe:loupe@127.0.0.1:5432/postgres cargo bench --bench store`
//!
//! - `append_batch_1`, `append_batch_100`: messages/s appended to one thread (realistic entries
//!   from `support/history.rs`, unique uuids, no `expected_next_seq`).
//! - `page_last_100`: `list_messages(after_seq = 99_899, limit = 100)` on a 100,000-message thread
//!   built during setup with batches of 1000 (`page_first_100` is the same from the start).
//!
//! Under `cargo test --benches` (criterion's test mode, no `--bench` argument) the big thread
//! holds 2,000 messages instead, so the check stays quick.

#[path = "support/common.rs"]
mod common;
#[path = "support/history.rs"]
mod history;

use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use loupe::history::{normalize, Entry, NormalizeOptions};
use loupe::store::{AppendRequest, NewThread, Seq, Store, StoreOptions, TenantId};
use tokio::runtime::Runtime;

const SETUP_BATCH: usize = 1000;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let thread_len: usize = if full { 100_000 } else { 2_000 };
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

    common::on_each_backend(|backend, url| {
        run_backend(&mut c, &rt, backend, url, &template, thread_len)
    });
    c.final_summary();
}

fn run_backend(
    c: &mut Criterion,
    rt: &Runtime,
    backend: &str,
    url: &str,
    template: &[Entry],
    thread_len: usize,
) {
    let tenant = TenantId::default_tenant();
    let store = rt.block_on(async {
        let store = Store::connect(&StoreOptions::new(url))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        store
    });
    let new_thread = |id: &str| {
        rt.block_on(store.create_thread(
            &tenant,
            NewThread {
                id: Some(id.to_owned().into()),
                ..Default::default()
            },
        ))
        .expect("create thread");
    };

    // Appends: one thread per batch size, growing for the whole measurement.
    let mut group = c.benchmark_group(format!("{backend}/append"));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2));
    for size in [1usize, 100] {
        let thread = format!("append-{size}");
        new_thread(&thread);
        let mut next = 0usize;
        group.throughput(Throughput::Elements(size as u64));
        group.bench_function(format!("batch_{size}"), |b| {
            b.to_async(rt).iter_batched(
                || common::batch(template, &thread, &mut next, size),
                |entries| {
                    let (store, tenant, thread) = (store.clone(), tenant.clone(), thread.clone());
                    async move {
                        let outcome = store
                            .append(
                                &tenant,
                                &thread.as_str().into(),
                                AppendRequest {
                                    entries,
                                    expected_next_seq: None,
                                },
                            )
                            .await
                            .expect("append");
                        assert_eq!(outcome.messages.len(), size);
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    // Paging the end of a long thread.
    let thread = "long".to_owned();
    new_thread(&thread);
    let started = Instant::now();
    let mut next = 0usize;
    rt.block_on(async {
        while next < thread_len {
            let count = SETUP_BATCH.min(thread_len - next);
            let entries = common::batch(template, "long", &mut next, count);
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
        }
    });
    let setup = started.elapsed();
    println!(
        "{backend}: built a {thread_len}-message thread in {:.1} s ({:.0} messages/s, batches of {SETUP_BATCH})",
        setup.as_secs_f64(),
        thread_len as f64 / setup.as_secs_f64()
    );

    let last_page_after = thread_len as i64 - 101; // 99_899 for 100,000 messages
    let mut group = c.benchmark_group(format!("{backend}/page"));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2));
    for (name, after_seq, first_seq) in [
        ("last_100", Some(last_page_after), last_page_after + 1),
        ("first_100", None, 0),
    ] {
        group.bench_function(name, |b| {
            b.to_async(rt).iter(|| async {
                let page = store
                    .list_messages(
                        &tenant,
                        &thread.as_str().into(),
                        after_seq.map(Seq::new),
                        100,
                    )
                    .await
                    .expect("page");
                assert_eq!(page.messages.len(), 100);
                assert_eq!(page.messages[0].seq, Some(first_seq));
                page
            })
        });
    }
    group.finish();

    // The context at the end of the long thread, whose last boundary leaves 200 messages, against
    // the same 200 messages in a thread with no history before them: the cost should not depend
    // on what lies before the boundary.
    let short = "short".to_owned();
    new_thread(&short);
    for thread in [&thread, &short] {
        let mut tail = vec![compact_boundary(), compact_summary()];
        tail.extend(common::batch(
            template,
            &format!("{thread}-tail"),
            &mut next,
            CONTEXT_TAIL - 2,
        ));
        rt.block_on(store.append(
            &tenant,
            &thread.as_str().into(),
            AppendRequest {
                entries: tail,
                expected_next_seq: None,
            },
        ))
        .expect("append the boundary and its tail");
    }
    let mut group = c.benchmark_group(format!("{backend}/context"));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(2));
    let options = NormalizeOptions::default();
    for (name, thread) in [("after_100000", &thread), ("no_history", &short)] {
        group.bench_function(name, |b| {
            b.to_async(rt).iter(|| async {
                let window = store
                    .context_window(&tenant, &thread.as_str().into(), None)
                    .await
                    .expect("context window");
                assert_eq!(window.entries.len(), CONTEXT_TAIL);
                normalize(&window.entries, &options)
            })
        });
    }
    group.finish();
    rt.block_on(store.close());
}

/// Entries after the last compact boundary in the context benchmark (boundary and summary included).
const CONTEXT_TAIL: usize = 200;

fn compact_boundary() -> Entry {
    serde_json::from_value(serde_json::json!({
        "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
        "compact_metadata": {"trigger": "manual", "pre_tokens": 1_000_000}
    }))
    .expect("a boundary entry")
}

fn compact_summary() -> Entry {
    serde_json::from_value(serde_json::json!({
        "type": "user", "is_compact_summary": true,
        "message": {"role": "user", "content": "This session is being continued from a previous conversation. Summary: the user is building Loupe."}
    }))
    .expect("a summary entry")
}
