//! Drills beyond one database machine (`docs/SCALING.md`), on PostgreSQL clusters of their own
//! (`scripts/replicas.sh`): reads on a standby that replays 200 ms late, with read-your-writes
//! through the consistency token; a standby lost under reads; and a failover under appends with
//! synchronous replication. They assert behaviour, never timings.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use loupe::http::{AppState, AuthMode, Limits};
use loupe::store::{Store, StoreOptions};
use serde_json::{json, Value};

use crate::common::{send_to, TestResponse};

/// The drills that stop the read pair's standby must not overlap the ones reading from it.
static READ_PAIR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_url(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite with scripts/test.sh, which makes the clusters")
    })
}

/// Runs `scripts/replicas.sh FUNCTION ARGS...` (it acts as root or through sudo).
fn replicas_sh(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/replicas.sh");
    let status = Command::new("bash")
        .arg(script)
        .args(args)
        .status()
        .expect("run scripts/replicas.sh");
    assert!(status.success(), "scripts/replicas.sh {args:?}: {status}");
}

/// A fresh database on the primary of `primary_url`, once the standby at `standby_url` (if any)
/// has it too; its URLs on both.
async fn fresh_database(primary_url: &str, standby_url: Option<&str>) -> (String, Option<String>) {
    let (name, primary) = crate::common::create_test_database(primary_url).await;
    let standby = standby_url.map(|url| loupe::store::database_url(url, &name));
    let store = Store::connect(&StoreOptions::new(&primary)).await.unwrap();
    store.migrate().await.unwrap();
    store.close().await;
    if let Some(standby) = &standby {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The schema replayed: the last migration's table answers.
            if let Ok(store) = Store::connect(&StoreOptions::new(standby)).await {
                let ready = store.list_tenants().await.is_ok();
                store.close().await;
                if ready {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the standby never got {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (primary, standby)
}

/// A fresh database on the read pair: its URLs on the primary and on the standby.
async fn on_read_pair() -> (String, String) {
    let (primary, standby) = fresh_database(
        &env_url("TEST_PRIMARY_URL"),
        Some(&env_url("TEST_STANDBY_URL")),
    )
    .await;
    (primary, standby.expect("a standby URL"))
}

/// Closes the drill's stores, then drops its database from the read pair's primary.
async fn finish_on_read_pair(stores: &[&Store], database_url: &str) {
    for store in stores {
        store.close().await;
    }
    let name = database_url.rsplit('/').next().unwrap();
    crate::common::drop_test_database(&env_url("TEST_PRIMARY_URL"), name).await;
}

/// A Loupe process: its own store (and memory of its writes) over the shared databases.
async fn process(primary: &str, standbys: &[String], read_wait: Duration) -> (Router, Store) {
    let options = StoreOptions {
        acquire_timeout: Duration::from_secs(2),
        ..StoreOptions::new(primary)
    };
    process_with(&options, standbys, read_wait).await
}

/// [`process`] with store options of its own.
async fn process_with(
    options: &StoreOptions,
    standbys: &[String],
    read_wait: Duration,
) -> (Router, Store) {
    let store = Store::connect(options)
        .await
        .unwrap()
        .with_standbys(standbys, read_wait, options)
        .await
        .unwrap();
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    };
    let router = loupe::http::router(AppState::new(store.clone(), limits, AuthMode::Open));
    (router, store)
}

async fn call(
    router: &Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
    lsn: Option<&str>,
) -> TestResponse {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(lsn) = lsn {
        request = request.header("loupe-lsn", lsn);
    }
    let body = match body {
        Some(body) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(body.to_string())
        }
        None => Body::empty(),
    };
    send_to(router, request.body(body).unwrap()).await
}

async fn create(router: &Router, thread: &str) {
    let made = call(
        router,
        Method::POST,
        "/v1/threads",
        Some(json!({"id": thread})),
        None,
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
}

/// Appends one user message whose text is its uuid; its answer.
async fn append(router: &Router, thread: &str, uuid: &str) -> TestResponse {
    say(router, thread, uuid, uuid).await
}

/// Appends one user message saying `text`; its answer.
async fn say(router: &Router, thread: &str, uuid: &str, text: &str) -> TestResponse {
    let message =
        json!({"uuid": uuid, "type": "user", "message": {"role": "user", "content": text}});
    call(
        router,
        Method::POST,
        &format!("/v1/threads/{thread}/messages"),
        Some(json!({"messages": [message]})),
        None,
    )
    .await
}

/// The thread's next seq as a read of its last message page sees it (with the token, if given).
async fn seen_next_seq(router: &Router, thread: &str, lsn: Option<&str>) -> i64 {
    let page = call(
        router,
        Method::GET,
        &format!("/v1/threads/{thread}/messages?limit=1"),
        None,
        lsn,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.body["next_seq"].as_i64().unwrap()
}

/// Reads served by a standby and by the primary, since the store opened.
fn routed(store: &Store) -> (u64, u64) {
    let stats = store.standby_stats().expect("a store with standbys");
    (
        stats.standby_reads + stats.waited_reads,
        stats.primary_reads,
    )
}

struct RoundsOutcome {
    /// Reads that missed a write they had to see.
    stale: usize,
    reads: usize,
}

/// `rounds` rounds over `workers` workers, each with threads of its own: append to the next
/// thread, read it back through `reader` (with the write's token when `tokens`), then read nine
/// of the worker's threads last written more than a second before.
async fn read_your_writes(
    writer: &Router,
    reader: &Router,
    rounds: usize,
    workers: usize,
    tokens: bool,
) -> RoundsOutcome {
    const THREADS_PER_WORKER: usize = 60;
    let stale = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let run = uuid::Uuid::new_v4().simple().to_string();
    for worker in 0..workers {
        let (writer, reader) = (writer.clone(), reader.clone());
        let (stale, reads, run) = (stale.clone(), reads.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            // Each thread's expected next seq and when it was last written.
            let mut threads: Vec<(String, i64, Instant)> = Vec::new();
            for t in 0..THREADS_PER_WORKER {
                let id = format!("ryw-{run}-{worker}-{t}");
                create(&writer, &id).await;
                let made = append(&writer, &id, &format!("{id}-0")).await;
                assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
                threads.push((id, 1, Instant::now()));
            }
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            let mine = rounds / workers + usize::from(worker < rounds % workers);
            for round in 0..mine {
                let index = round % THREADS_PER_WORKER;
                let (id, next, _) = threads[index].clone();
                let answer = append(&writer, &id, &format!("{id}-{next}")).await;
                assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
                let lsn = answer.headers["loupe-lsn"].to_str().unwrap().to_owned();
                assert_eq!(
                    answer.body["lsn"],
                    lsn.as_str(),
                    "the body's token is the header's"
                );
                threads[index] = (id.clone(), next + 1, Instant::now());
                let token = tokens.then_some(lsn.as_str());
                if seen_next_seq(&reader, &id, token).await < next + 1 {
                    stale.fetch_add(1, Ordering::Relaxed);
                }
                // The nine written longest ago, once each was more than a second ago.
                let mut by_age: Vec<&(String, i64, Instant)> = threads.iter().collect();
                by_age.sort_by_key(|(_, _, at)| *at);
                let old: Vec<(String, i64)> = by_age[..9]
                    .iter()
                    .map(|(id, next, _)| (id.clone(), *next))
                    .collect();
                let youngest = by_age[8].2.elapsed();
                if youngest <= Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_millis(1_001) - youngest).await;
                }
                for (id, next) in &old {
                    if seen_next_seq(&reader, id, None).await < *next {
                        stale.fetch_add(1, Ordering::Relaxed);
                    }
                }
                reads.fetch_add(10, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    RoundsOutcome {
        stale: stale.load(Ordering::Relaxed),
        reads: reads.load(Ordering::Relaxed),
    }
}

/// 10,000 rounds through two processes (one writes, the other reads, as replicas behind a load
/// balancer): with the token, no read is stale and most are served by the standby. The same
/// rounds without it do read stale, so the lag the token bridges is real; and a process reading
/// its own writes needs no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_with_the_token_see_every_write_and_most_go_to_the_standby() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let standbys = vec![standby];
    // A short wait: a read whose write the standby replays 200 ms late goes to the primary.
    let wait = Duration::from_millis(20);
    let (writer, writer_store) = process(&primary, &standbys, wait).await;
    let (reader, reader_store) = process(&primary, &standbys, wait).await;

    let with_tokens = read_your_writes(&writer, &reader, 10_000, 16, true).await;
    assert_eq!(with_tokens.reads, 100_000);
    assert_eq!(
        with_tokens.stale, 0,
        "a read with its write's token missed the write"
    );
    let (on_standby, on_primary) = routed(&reader_store);
    assert_eq!((on_standby + on_primary) as usize, with_tokens.reads);
    assert!(
        on_standby * 100 >= 80 * (on_standby + on_primary),
        "standby {on_standby}, primary {on_primary}"
    );

    let without = read_your_writes(&writer, &reader, 400, 8, false).await;
    assert!(
        without.stale > 0,
        "no stale read without tokens: is the standby lagging?"
    );

    // The process that wrote remembers its writes: its own reads need no token.
    let own = read_your_writes(&writer, &writer, 400, 8, false).await;
    assert_eq!(own.stale, 0, "a process read its own write stale");
    let (own_standby, _) = routed(&writer_store);
    assert!(
        own_standby > 0,
        "the writer's reads never went to the standby"
    );

    finish_on_read_pair(&[&writer_store, &reader_store], &primary).await;
}

/// Every routed read takes the token and every write gives one; a malformed token is the
/// caller's mistake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_answers_a_token_and_every_routed_read_takes_one() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let (router, store) = process(&primary, &[standby], Duration::from_millis(100)).await;
    let created = call(
        &router,
        Method::POST,
        "/v1/threads",
        Some(json!({"id": "t"})),
        None,
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let mut tokens = vec![created.headers["loupe-lsn"].to_str().unwrap().to_owned()];
    assert_eq!(created.body["lsn"], tokens[0].as_str());
    let writes = [
        (
            Method::POST,
            "/v1/threads/t/messages",
            Some(json!({"messages": [
                {"uuid": "u1", "type": "user", "message": {"role": "user", "content": "the hidden word is larkspur"}},
                {"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "m1", "content": [{"type": "text", "text": "noted"}]}}
            ]})),
        ),
        (Method::PUT, "/v1/threads/t/settings", Some(json!({}))),
        (
            Method::PATCH,
            "/v1/threads/t",
            Some(json!({"metadata": {"owner": "drill"}})),
        ),
        (
            Method::POST,
            "/v1/threads/t/fork",
            Some(json!({"id": "t-fork"})),
        ),
        (Method::PUT, "/v1/threads/t/retention", Some(json!({}))),
        (Method::DELETE, "/v1/threads/t/retention", None),
        (Method::PUT, "/v1/retention", Some(json!({}))),
        (
            Method::POST,
            "/v1/threads/t/snip",
            Some(json!({"seqs": [1]})),
        ),
        (
            Method::POST,
            "/v1/threads/t/cursors/c/advance",
            Some(json!({"to": "u1"})),
        ),
        (
            Method::POST,
            "/v1/threads/t/cursors/c/claim",
            Some(json!({})),
        ),
        (Method::POST, "/v1/threads/t/compact", Some(json!({}))),
        (
            Method::POST,
            "/v1/threads/t/erasures",
            Some(json!({"seqs": [0]})),
        ),
    ];
    for (method, uri, body) in writes {
        let answer = call(&router, method, uri, body, None).await;
        assert!(answer.status.is_success(), "{uri}: {}", answer.body);
        let token = answer.headers["loupe-lsn"].to_str().unwrap().to_owned();
        assert_eq!(answer.body["lsn"], token.as_str(), "{uri}");
        tokens.push(token);
    }
    // An import, whose body is a transcript rather than JSON.
    let import = Request::builder()
        .method(Method::POST)
        .uri("/v1/threads/t-fork/import")
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from(
            json!({"uuid": "i1", "type": "user", "message": {"role": "user", "content": "imported"}})
                .to_string(),
        ))
        .unwrap();
    let imported = send_to(&router, import).await;
    assert_eq!(imported.status, StatusCode::OK, "{}", imported.body);
    let token = imported.headers["loupe-lsn"].to_str().unwrap().to_owned();
    assert_eq!(imported.body["lsn"], token.as_str());
    tokens.push(token);
    // Tokens are positions: a later write's is never before an earlier one's.
    let positions: Vec<(u64, u64)> = tokens
        .iter()
        .map(|token| {
            let (high, low) = token.split_once('/').unwrap();
            (
                u64::from_str_radix(high, 16).unwrap(),
                u64::from_str_radix(low, 16).unwrap(),
            )
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] <= w[1]), "{tokens:?}");
    let latest = tokens.last().unwrap().clone();
    let reads = [
        (Method::GET, "/v1/threads/t/context".to_owned(), None),
        (Method::GET, "/v1/threads/t/rounds".to_owned(), None),
        (Method::GET, "/v1/threads/t/messages".to_owned(), None),
        (Method::GET, "/v1/threads/t/outline".to_owned(), None),
        (Method::GET, "/v1/threads/t/export".to_owned(), None),
        (
            Method::GET,
            "/v1/threads/t/search?q=hidden".to_owned(),
            None,
        ),
        (Method::GET, "/v1/search?q=hidden".to_owned(), None),
        (
            Method::POST,
            "/v1/threads/t/zoom".to_owned(),
            Some(json!({"id": 0, "n": 1})),
        ),
        (
            Method::POST,
            "/v1/threads/t/search".to_owned(),
            Some(json!({"query": "hidden"})),
        ),
    ];
    for (method, uri, body) in reads {
        let (before, _) = routed(&store);
        let read = call(&router, method.clone(), &uri, body.clone(), Some(&latest)).await;
        assert_eq!(read.status, StatusCode::OK, "{uri}: {}", read.body);
        // The erasure is seen: its text is in no answer.
        assert!(
            !read.body.to_string().contains("larkspur"),
            "{uri}: {}",
            read.body
        );
        let (after, primary_after) = routed(&store);
        assert!(after + primary_after > before, "{uri} was not routed");
        let bad = call(
            &router,
            method.clone(),
            &uri,
            body.clone(),
            Some("16/not-hex"),
        )
        .await;
        bad.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        let separator = if uri.contains('?') { '&' } else { '?' };
        let by_query = format!("{uri}{separator}min_lsn={latest}");
        let read = call(&router, method, &by_query, body, None).await;
        assert_eq!(read.status, StatusCode::OK, "{by_query}: {}", read.body);
    }
    // The routing is in the metrics: reads by route, and the standbys' lag.
    let metrics = call(&router, Method::GET, "/metrics", None, None).await;
    let text = metrics.body.as_str().unwrap_or_default();
    for series in [
        "loupe_standby_reads_total{route=",
        "loupe_standby_lag_bytes",
    ] {
        assert!(text.contains(series), "{series} is not in /metrics");
    }
    let deleted = call(&router, Method::DELETE, "/v1/threads/t", None, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(deleted.headers.contains_key("loupe-lsn"));
    finish_on_read_pair(&[&store], &primary).await;
}

/// Waits until a standby serves the tenant's reads of no one thread: it has replayed what they
/// must see.
async fn until_the_standby_serves(store: &Store, tenant: &loupe::store::TenantId) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.for_read(tenant, None, None).await.1.is_primary() {
        assert!(Instant::now() < deadline, "the standby never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A read of no one thread (the tenant's search) right after a write of this process waits for
/// the standby to have it, as a read of the thread does: the tenant's last write is remembered
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_wide_read_after_a_write_waits_for_it() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    // The standby replays 200 ms late; reads wait 20 ms at most.
    let (router, store) = process(&primary, &[standby], Duration::from_millis(20)).await;
    create(&router, "w").await;
    let tenant = loupe::store::TenantId::default_tenant();
    until_the_standby_serves(&store, &tenant).await;
    assert_eq!(
        append(&router, "w", "w-1").await.status,
        StatusCode::CREATED
    );
    // It waited its 20 ms for the standby in vain, then went to the primary.
    let fallbacks = store.standby_stats().unwrap().fallback_reads;
    let (_, after) = store.for_read(&tenant, None, None).await;
    assert_eq!(after, loupe::store::ReadRoute::PrimaryAfterWait);
    assert_eq!(store.standby_stats().unwrap().fallback_reads, fallbacks + 1);
    // So is a change of the tenant's own policy, a write of no one thread that decides what the
    // tenant's search finds.
    until_the_standby_serves(&store, &tenant).await;
    let policy = call(
        &router,
        Method::PUT,
        "/v1/retention",
        Some(json!({"delete_after_seconds": 60})),
        None,
    )
    .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.body);
    let (_, after_policy) = store.for_read(&tenant, None, None).await;
    assert_eq!(after_policy, loupe::store::ReadRoute::PrimaryAfterWait);
    finish_on_read_pair(&[&store], &primary).await;
}

/// Resumes the read pair's standby replay when dropped, whatever the drill's outcome.
struct ReplayPaused;

impl ReplayPaused {
    fn pause() -> Self {
        replicas_sh(&[
            "pair_sql",
            "drill",
            "standby",
            "SELECT pg_wal_replay_pause()",
        ]);
        ReplayPaused
    }
}

impl Drop for ReplayPaused {
    fn drop(&mut self) {
        replicas_sh(&[
            "pair_sql",
            "drill",
            "standby",
            "SELECT pg_wal_replay_resume()",
        ]);
    }
}

/// The bound holds from a process's first read: a process started while the standby's replay
/// is paused, long after another process's erasure, never reads the erased text from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_just_started_reads_no_standby_behind_the_bound() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let standbys = [standby];
    let (writer, writer_store) = process(&primary, &standbys, Duration::from_millis(20)).await;
    create(&writer, "b").await;
    let said = say(&writer, "b", "b-0", "the word is aconite").await;
    assert_eq!(said.status, StatusCode::CREATED, "{}", said.body);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let paused = ReplayPaused::pause();
    let erased = call(
        &writer,
        Method::POST,
        "/v1/threads/b/erasures",
        Some(json!({"seqs": [0]})),
        None,
    )
    .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    // Far past the bound and every process's memory of the erasure.
    tokio::time::sleep(loupe::store::REMEMBER_WRITES_FOR + Duration::from_secs(2)).await;
    let (reader, reader_store) = process(&primary, &standbys, Duration::from_millis(20)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader_store.standby_stats().unwrap().healthy_standbys == 0 {
        assert!(Instant::now() < deadline, "the standby never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut leaks = 0;
    for _ in 0..10 {
        let page = call(&reader, Method::GET, "/v1/threads/b/messages", None, None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        if page.body.to_string().contains("aconite") {
            leaks += 1;
        }
    }
    drop(paused);
    assert_eq!(
        leaks, 0,
        "a new process read erased text from a standby far behind the bound"
    );
    finish_on_read_pair(&[&writer_store, &reader_store], &primary).await;
}

/// An erasure reaches the thread's forks, and the process that answered it reads the forks
/// back without a token as it reads the thread: never the erased text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_that_erased_reads_the_forks_without_the_erased_text() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let (router, store) = process(&primary, &[standby], Duration::from_millis(20)).await;
    create(&router, "src").await;
    let said = say(&router, "src", "s-0", "the word is hemlock").await;
    assert_eq!(said.status, StatusCode::CREATED, "{}", said.body);
    let fork = call(
        &router,
        Method::POST,
        "/v1/threads/src/fork",
        Some(json!({"id": "src-fork"})),
        None,
    )
    .await;
    assert_eq!(fork.status, StatusCode::CREATED, "{}", fork.body);
    // Past this process's memory of the fork's creation, and the standby has it.
    tokio::time::sleep(loupe::store::REMEMBER_WRITES_FOR + Duration::from_secs(1)).await;
    let erased = call(
        &router,
        Method::POST,
        "/v1/threads/src/erasures",
        Some(json!({"seqs": [0]})),
        None,
    )
    .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    assert_eq!(erased.body["forks"][0]["thread_id"], "src-fork");
    let page = call(
        &router,
        Method::GET,
        "/v1/threads/src-fork/messages",
        None,
        None,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        !page.body.to_string().contains("hemlock"),
        "the fork's erased text was read back: {}",
        page.body
    );
    finish_on_read_pair(&[&store], &primary).await;
}

/// The primary's position is sampled on a connection of the sampler's own: a process whose
/// pool is held by its requests still moves its staleness floor on, so a stuck standby stops
/// serving its reads of what other processes wrote since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_does_not_freeze_the_staleness_floor() {
    use sqlx::Connection;
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let standbys = [standby];
    let (writer, writer_store) = process(&primary, &standbys, Duration::from_millis(20)).await;
    // A process of one connection.
    let options = StoreOptions {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(30),
        ..StoreOptions::new(&primary)
    };
    let (busy, busy_store) = process_with(&options, &standbys, Duration::from_millis(20)).await;
    create(&writer, "s").await;
    assert_eq!(
        append(&writer, "s", "s-0").await.status,
        StatusCode::CREATED
    );
    let tenant = loupe::store::TenantId::default_tenant();
    let thread = loupe::store::ThreadId::new("s");
    let deadline = Instant::now() + Duration::from_secs(10);
    while busy_store
        .for_read(&tenant, Some(&thread), None)
        .await
        .1
        .is_primary()
    {
        assert!(Instant::now() < deadline, "the standby never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The standby has all there is.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Its one connection held: a webhook registration waits, in its transaction, on the
    // tenant's lock, which this connection takes first.
    let mut side = sqlx::AnyConnection::connect(&primary).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtext('loupe_webhooks:' || $1))")
        .bind(&tenant.0)
        .execute(&mut side)
        .await
        .unwrap();
    let registration = tokio::spawn({
        let busy = busy.clone();
        async move {
            call(
                &busy,
                Method::POST,
                "/v1/webhooks",
                Some(json!({"url": "https://93.184.216.34/hook", "kinds": ["thread.deleted"]})),
                None,
            )
            .await
        }
    });
    while busy_store.pool_usage() != (1, 0) {
        assert!(
            Instant::now() < deadline,
            "the registration never took the connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let paused = ReplayPaused::pause();
    assert_eq!(
        append(&writer, "s", "s-1").await.status,
        StatusCode::CREATED
    );
    // Past the bound: the busy process's floor has passed the append, which the standby lacks.
    tokio::time::sleep(loupe::store::MAX_STALENESS + Duration::from_secs(1)).await;
    let (_, route) = busy_store.for_read(&tenant, Some(&thread), None).await;
    drop(paused);
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut side)
        .await
        .unwrap();
    let registered = registration.await.unwrap();
    assert_eq!(
        registered.status,
        StatusCode::CREATED,
        "{}",
        registered.body
    );
    assert!(
        route.is_primary(),
        "a standby missing a write older than the bound served the busy process"
    );
    drop(side);
    finish_on_read_pair(&[&writer_store, &busy_store], &primary).await;
}

/// A read URL in libpq's multi-host form names each of its hosts as a standby, and each host's
/// role is checked: the primary listed among them is never read from as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_url_of_several_hosts_reads_only_those_in_recovery() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let host = |url: &str| {
        let after = &url[url.find('@').unwrap() + 1..];
        after[..after.find('/').unwrap()].to_owned()
    };
    let both = standby.replacen(
        &host(&standby),
        &format!("{},{}", host(&primary), host(&standby)),
        1,
    );
    let (router, store) = process(&primary, &[both], Duration::from_millis(100)).await;
    create(&router, "hosts").await;
    assert_eq!(
        append(&router, "hosts", "hosts-0").await.status,
        StatusCode::CREATED
    );
    // Several polls of each host.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(store.standby_stats().unwrap().healthy_standbys, 1);
    let (standby_before, _) = routed(&store);
    for _ in 0..20 {
        assert_eq!(seen_next_seq(&router, "hosts", None).await, 1);
    }
    assert!(
        routed(&store).0 > standby_before,
        "no read went to the standby"
    );
    assert_eq!(store.standby_stats().unwrap().healthy_standbys, 1);
    finish_on_read_pair(&[&store], &primary).await;
}

/// A standby whose replay is paused falls behind without limit; once it has not replayed what
/// the primary held `MAX_STALENESS` ago, no read goes to it, with a token or without, from any
/// process: a snip or erasure another process made is never read back from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_read_goes_to_a_standby_further_behind_than_the_bound() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let standbys = [standby];
    let (writer, writer_store) = process(&primary, &standbys, Duration::from_millis(20)).await;
    let (reader, reader_store) = process(&primary, &standbys, Duration::from_millis(20)).await;
    create(&writer, "p").await;
    assert_eq!(
        append(&writer, "p", "p-0").await.status,
        StatusCode::CREATED
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(seen_next_seq(&reader, "p", None).await, 1);
    let paused = ReplayPaused::pause();
    assert_eq!(
        append(&writer, "p", "p-1").await.status,
        StatusCode::CREATED
    );
    // Past the bound and the writer's memory of its write, the other process's reads without a
    // token see the write: the primary serves them.
    tokio::time::sleep(loupe::store::REMEMBER_WRITES_FOR + Duration::from_secs(1)).await;
    for _ in 0..5 {
        assert_eq!(seen_next_seq(&reader, "p", None).await, 2);
        assert_eq!(seen_next_seq(&writer, "p", None).await, 2);
    }
    drop(paused);
    finish_on_read_pair(&[&writer_store, &reader_store], &primary).await;
}

/// The standby stops under reads: they go to the primary, with no error, and back to the
/// standby once it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fall_back_to_the_primary_when_the_standby_is_lost() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let (router, store) = process(&primary, &[standby], Duration::from_millis(100)).await;
    create(&router, "lost").await;
    let answer = append(&router, "lost", "lost-0").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let reads_until = |count: usize| {
        let router = router.clone();
        async move {
            for _ in 0..count {
                let page = call(&router, Method::GET, "/v1/threads/lost/context", None, None).await;
                assert_eq!(page.status, StatusCode::OK, "{}", page.body);
                assert_eq!(page.body["messages"].as_array().unwrap().len(), 1);
            }
        }
    };
    reads_until(20).await;
    assert!(
        routed(&store).0 > 0,
        "the standby served nothing before it was lost"
    );

    replicas_sh(&["pair_ctl", "drill", "standby", "stop", "-m", "immediate"]);
    let (standby_before, primary_before) = routed(&store);
    // Reads go on without error: the first ones may still pick the standby and be read again
    // on the primary; then the standby is no longer healthy.
    reads_until(200).await;
    let (standby_after, primary_after) = routed(&store);
    assert!(
        primary_after > primary_before,
        "no read went to the primary"
    );
    assert!(
        standby_after - standby_before < 200,
        "every read was routed to the lost standby"
    );

    replicas_sh(&["pair_ctl", "drill", "standby", "start"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.standby_stats().unwrap().healthy_standbys == 0 {
        assert!(Instant::now() < deadline, "the standby never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (standby_back, _) = routed(&store);
    reads_until(20).await;
    assert!(
        routed(&store).0 > standby_back,
        "reads did not return to the standby"
    );
    finish_on_read_pair(&[&store], &primary).await;
}

/// While the primary is lost (before any promotion), a standby that has everything the primary
/// was last seen with goes on serving reads: no read waits for a primary that does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_on_from_the_standby_while_the_primary_is_lost() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let (router, store) = process(&primary, &[standby], Duration::from_millis(100)).await;
    create(&router, "orphaned").await;
    let answer = append(&router, "orphaned", "orphaned-0").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    tokio::time::sleep(loupe::store::REMEMBER_WRITES_FOR).await;
    struct PrimaryBack;
    impl Drop for PrimaryBack {
        fn drop(&mut self) {
            replicas_sh(&["pair_ctl", "drill", "primary", "start"]);
        }
    }
    replicas_sh(&["pair_ctl", "drill", "primary", "stop", "-m", "fast"]);
    let back = PrimaryBack;
    // Past the bound: the process's last sample of the primary is older than it.
    tokio::time::sleep(loupe::store::MAX_STALENESS + Duration::from_secs(1)).await;
    let (standby_before, _) = routed(&store);
    for uri in [
        "/v1/threads/orphaned/context",
        "/v1/threads/orphaned/messages",
        "/v1/threads/orphaned/export",
    ] {
        let read = call(&router, Method::GET, uri, None, None).await;
        assert_eq!(read.status, StatusCode::OK, "{uri}: {}", read.body);
    }
    assert!(
        routed(&store).0 >= standby_before + 3,
        "the standby did not serve the reads"
    );
    drop(back);
    finish_on_read_pair(&[&store], &primary).await;
}

/// Appends run while the primary is killed (`-m immediate`) and its synchronous standby is
/// promoted. Loupe, given both hosts in one URL, finds the new primary by itself; meanwhile it
/// answers 503 with `Retry-After`, never a 500; and every append it acknowledged is on the new
/// primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_synchronous_replication_loses_no_acknowledged_append() {
    const PRIMARY_PORT: &str = "5444";
    const STANDBY_PORT: &str = "5445";
    replicas_sh(&["fresh_pair", "failover", PRIMARY_PORT, STANDBY_PORT, "sync"]);
    let (primary, _) = fresh_database(
        &format!("postgres://loupe:loupe@127.0.0.1:{PRIMARY_PORT}/postgres"),
        None,
    )
    .await;
    let name = primary.rsplit('/').next().unwrap();
    let both =
        format!("postgres://loupe:loupe@127.0.0.1:{PRIMARY_PORT},127.0.0.1:{STANDBY_PORT}/{name}");
    let (router, store) = process(&both, &[], Duration::ZERO).await;

    let promoted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let mut appenders = Vec::new();
    for worker in 0..8 {
        let (router, promoted) = (router.clone(), promoted.clone());
        let acked = acked.clone();
        appenders.push(tokio::spawn(async move {
            let thread = format!("failover-{worker}");
            create(&router, &thread).await;
            let mut acknowledged = Vec::new();
            let mut statuses: HashMap<u16, usize> = HashMap::new();
            let mut after_promotion = 0;
            for n in 0.. {
                let uuid = format!("{thread}-{n}");
                let answer = append(&router, &thread, &uuid).await;
                *statuses.entry(answer.status.as_u16()).or_default() += 1;
                match answer.status {
                    StatusCode::CREATED => {
                        acknowledged.push(uuid);
                        acked.fetch_add(1, Ordering::Relaxed);
                        if promoted.load(Ordering::Relaxed) {
                            after_promotion += 1;
                        }
                    }
                    StatusCode::SERVICE_UNAVAILABLE => {
                        assert!(
                            answer.headers.contains_key(header::RETRY_AFTER),
                            "a 503 without Retry-After"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("append answered {other}: {}", answer.body),
                }
                if after_promotion >= 20 {
                    break;
                }
            }
            (thread, acknowledged, statuses)
        }));
    }
    // Some appends acknowledged by the first primary, then it dies.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if acked.load(Ordering::Relaxed) >= 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the appends never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas_sh(&["pair_ctl", "failover", "primary", "stop", "-m", "immediate"]);
    replicas_sh(&["pair_ctl", "failover", "standby", "promote"]);
    promoted.store(true, Ordering::Relaxed);

    let mut all = Vec::new();
    for appender in appenders {
        let outcome = tokio::time::timeout(Duration::from_secs(120), appender)
            .await
            .expect("Loupe did not recover from the failover by itself")
            .unwrap();
        all.push(outcome);
    }
    // Every acknowledged append is on the new primary, in order.
    let promoted_url = format!("postgres://loupe:loupe@127.0.0.1:{STANDBY_PORT}/{name}");
    let (check, check_store) = process(&promoted_url, &[], Duration::ZERO).await;
    let mut total = 0;
    for (thread, acknowledged, statuses) in &all {
        let mut stored = Vec::new();
        let mut after: Option<i64> = None;
        loop {
            let uri = match after {
                Some(seq) => format!("/v1/threads/{thread}/messages?limit=1000&after_seq={seq}"),
                None => format!("/v1/threads/{thread}/messages?limit=1000"),
            };
            let page = call(&check, Method::GET, &uri, None, None).await;
            assert_eq!(page.status, StatusCode::OK, "{}", page.body);
            for message in page.body["messages"].as_array().unwrap() {
                stored.push(message["uuid"].as_str().unwrap().to_owned());
            }
            match page.body["next_after_seq"].as_i64() {
                Some(seq) => after = Some(seq),
                None => break,
            }
        }
        for uuid in acknowledged {
            assert!(
                stored.contains(uuid),
                "acknowledged {uuid} was lost ({statuses:?})"
            );
        }
        total += acknowledged.len();
    }
    assert!(
        total > 8 * 20,
        "too few appends acknowledged to mean anything: {total}"
    );
    check_store.close().await;
    store.close().await;
    replicas_sh(&["pair_ctl", "failover", "standby", "stop"]);
}

/// BENCHMARKS.md: context reads per second over 8 concurrent readers, from the primary alone
/// and with one standby beside it, on the same database in the same run (alternated). Prints the
/// figures; asserts only that every read answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --test api replicas::read_throughput -- --ignored --nocapture"]
async fn read_throughput_with_a_standby_against_the_primary_alone() {
    let _pair = READ_PAIR.lock().await;
    let (primary, standby) = on_read_pair().await;
    let (alone, alone_store) = process(&primary, &[], Duration::ZERO).await;
    let (beside, beside_store) = process(&primary, &[standby], Duration::from_millis(100)).await;
    // 40 threads of 20 agent rounds each, written more than the standby's lag before.
    for t in 0..40 {
        let id = format!("bench-{t}");
        create(&alone, &id).await;
        let rounds = crate::common::tool_rounds(&id, 0, 20, 4);
        let answer = call(
            &alone,
            Method::POST,
            &format!("/v1/threads/{id}/messages"),
            Some(json!({ "messages": rounds })),
            None,
        )
        .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let measure = |router: Router, path: &'static str| async move {
        let done = Arc::new(AtomicUsize::new(0));
        let until = Instant::now() + Duration::from_secs(5);
        let mut readers = Vec::new();
        for reader in 0..8 {
            let (router, done) = (router.clone(), done.clone());
            readers.push(tokio::spawn(async move {
                let mut n = reader;
                while Instant::now() < until {
                    let uri = format!("/v1/threads/bench-{}/{path}", n % 40);
                    let read = call(&router, Method::GET, &uri, None, None).await;
                    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 8;
                }
            }));
        }
        for reader in readers {
            reader.await.unwrap();
        }
        done.load(Ordering::Relaxed) as f64 / 5.0
    };
    for run in 1..=3 {
        for path in ["context", "messages?limit=100"] {
            let primary_alone = measure(alone.clone(), path).await;
            let with_standby = measure(beside.clone(), path).await;
            println!(
                "run {run}: {path} reads/s, primary alone {primary_alone:.0}, with one standby \
                 {with_standby:.0} ({:.2}×); load {}",
                with_standby / primary_alone,
                std::fs::read_to_string("/proc/loadavg")
                    .unwrap_or_default()
                    .trim()
            );
        }
    }
    let (on_standby, on_primary) = routed(&beside_store);
    println!("with a standby: {on_standby} reads on it, {on_primary} on the primary");
    assert!(on_standby > 0);
    finish_on_read_pair(&[&alone_store, &beside_store], &primary).await;
}
