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

#[path = "support/history.rs"]
mod history;

use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use loupe::history::{normalize, Entry, NormalizeOptions};
use loupe::store::{AppendRequest, NewThread, Store, StoreOptions, TenantId};
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

    // SQLite: a file of its own in the temporary directory.
    let path = std::env::temp_dir()
        .join("loupe-bench")
        .join(format!("{}.db", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite://{}", path.display());
    run_backend(&mut c, &rt, "sqlite", &url, &template, thread_len);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }

    // PostgreSQL: a fresh database, dropped afterwards (also when a benchmark panics).
    match std::env::var("TEST_DATABASE_URL") {
        Err(_) => println!(
            "NOTICE: TEST_DATABASE_URL is not set: the PostgreSQL benchmarks are skipped \
             (set it to a role that may create databases, e.g. \
             postgres://loupe:loupe@127.0.0.1:5432/postgres)"
        ),
        Ok(admin_url) => {
            let db = ScratchDb::create(&rt, &admin_url);
            run_backend(&mut c, &rt, "postgres", &db.url, &template, thread_len);
            drop(db);
        }
    }
    c.final_summary();
}

/// A PostgreSQL database that exists for this run.
struct ScratchDb {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDb {
    fn create(rt: &Runtime, admin_url: &str) -> ScratchDb {
        let name = format!("loupe_bench_{}", uuid::Uuid::new_v4().simple());
        rt.block_on(async {
            let admin = Store::connect(&StoreOptions::new(admin_url))
                .await
                .expect("connect to TEST_DATABASE_URL");
            admin.create_database(&name).await.expect("create database");
            admin.close().await;
        });
        println!("postgres: created database {name}");
        ScratchDb {
            admin_url: admin_url.to_owned(),
            url: loupe::store::database_url(admin_url, &name),
            name,
        }
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        // A runtime of its own: this may run while unwinding out of the benchmark's runtime.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let admin = Store::connect(&StoreOptions::new(&admin_url)).await?;
                admin.drop_database(&name).await?;
                admin.close().await;
                Ok::<_, loupe::store::StoreError>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => println!("postgres: dropped database {}", self.name),
            other => eprintln!("postgres: could not drop database {}: {other:?}", self.name),
        }
    }
}

/// `count` entries cycled from the template, with fresh uuids `{tag}-{n}` (n from `*next`).
fn batch(template: &[Entry], tag: &str, next: &mut usize, count: usize) -> Vec<Entry> {
    (0..count)
        .map(|_| {
            let mut e = template[*next % template.len()].clone();
            e.seq = None;
            e.uuid = Some(format!("{tag}-{next}"));
            *next += 1;
            e
        })
        .collect()
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
                id: Some(id.to_owned()),
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
                || batch(template, &thread, &mut next, size),
                |entries| {
                    let (store, tenant, thread) = (store.clone(), tenant.clone(), thread.clone());
                    async move {
                        let outcome = store
                            .append(
                                &tenant,
                                &thread,
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
            let entries = batch(template, "long", &mut next, count);
            store
                .append(
                    &tenant,
                    &thread,
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
                    .list_messages(&tenant, &thread, after_seq, 100)
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
        tail.extend(batch(
            template,
            &format!("{thread}-tail"),
            &mut next,
            CONTEXT_TAIL - 2,
        ));
        rt.block_on(store.append(
            &tenant,
            thread,
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
                    .context_window(&tenant, thread, None)
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
