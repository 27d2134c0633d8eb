//! What one request may hold: input the database cannot take, token figures no provider could
//! report, foreign `Host`s in open mode, failed authentications per peer, a tenant's share of the
//! requests and imports in flight, the process's budget of request bodies, slow and endless
//! imports, and whole-thread reads cut by bytes. The memory these bounds keep is measured on the
//! release binary in `memory_bounds`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use loupe::http::{AppState, AuthMode, Limits};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{assistant, user, TestApp};

fn no_rate_limit() -> Limits {
    Limits {
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    }
}

async fn a_nul_in_a_type_is_the_callers_mistake(app: TestApp) {
    let thread = app.thread("t").await;
    let response = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [{"type": "snap\u{0}shot", "data": 1}]}),
        )
        .await;
    let problem = response.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(
        problem["errors"][0]["field"], "messages[0].type",
        "{problem}"
    );
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(page.body["messages"], json!([]));
    app.finish().await;
}

async fn usage_past_what_a_provider_reports_saturates(app: TestApp) {
    let thread = app.thread("t").await;
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"auto_compact_tokens": 100_000})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let mut answer = assistant("a", "msg_1", "hi");
    answer["message"]["usage"] =
        json!({"input_tokens": u64::MAX, "output_tokens": u64::MAX, "cache_read_input_tokens": 7});
    let appended = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [user("u", "hello"), answer]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    // The stored count crosses the threshold: the figures do not wrap to a small one (the sum
    // was 5 before, and the stored count went negative, so auto-compaction never fired).
    assert!(
        appended.body["compaction_job_id"].is_string(),
        "the saturated count is past the threshold: {}",
        appended.body
    );
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let tokens = context.body["context_tokens"]["tokens"].as_u64().unwrap();
    assert_eq!(context.body["context_tokens"]["basis"], "usage");
    assert!(tokens >= 2_000_000_000, "{tokens}");
    assert!(tokens < i64::MAX as u64, "{tokens}");
    app.finish().await;
}

async fn open_mode_answers_only_loopback_host_names(app: TestApp) {
    let get = |host: Option<&'static str>, path: &'static str| {
        let mut request = Request::builder().uri(path);
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        request.body(Body::empty()).unwrap()
    };
    for host in [
        "localhost:8080",
        "127.0.0.1:1",
        "[::1]:8080",
        "LOCALHOST",
        "[::1]",
    ] {
        let response = app.send(get(Some(host), "/v1/threads")).await;
        assert_eq!(response.status, StatusCode::OK, "{host}: {}", response.body);
    }
    assert_eq!(
        app.send(get(None, "/v1/threads")).await.status,
        StatusCode::OK
    );
    for host in [
        "attacker.example:8080",
        "attacker.example",
        "127.0.0.1.attacker.example",
        "localhost.attacker.example:80",
    ] {
        app.send(get(Some(host), "/v1/threads"))
            .await
            .assert_problem(StatusCode::MISDIRECTED_REQUEST, "host-not-allowed");
    }
    // Public pages carry nothing a rebinding page could steal.
    let health = app.send(get(Some("attacker.example"), "/healthz")).await;
    assert_eq!(health.status, StatusCode::OK);
    // Names an operator allows.
    let limits = Limits {
        allowed_hosts: vec!["loupe.internal".to_owned()],
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let allowed = app
        .send(get(Some("LOUPE.internal:80"), "/v1/threads"))
        .await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.body);
    app.send(get(Some("attacker.example"), "/v1/threads"))
        .await
        .assert_problem(StatusCode::MISDIRECTED_REQUEST, "host-not-allowed");
    // Keyed mode: the key is what protects the API, whatever the host.
    let app = app.keyed_with(no_rate_limit());
    let key = app.create_key("acme").await;
    let mut keyed = get(Some("attacker.example"), "/v1/threads");
    keyed.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {key}").parse().unwrap(),
    );
    assert_eq!(app.send(keyed).await.status, StatusCode::OK);
    app.finish().await;
}

/// A request from `peer` with `key`.
fn from_peer(peer: &str, key: &str, path: &str) -> Request<Body> {
    let mut request = Request::builder()
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    let addr: SocketAddr = format!("{peer}:40000").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(addr));
    request
}

async fn failed_authentications_are_limited_per_peer(app: TestApp) {
    let limits = Limits {
        auth_failures_per_sec: 0.01,
        auth_failure_burst: 3,
        ..no_rate_limit()
    };
    let app = app.keyed_with(limits);
    let key = app.create_key("acme").await;
    let bogus = format!("lp_abcd1234_{}", "A".repeat(32));
    for _ in 0..3 {
        app.send(from_peer("10.0.0.1", &bogus, "/v1/threads"))
            .await
            .assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let refused = app.send(from_peer("10.0.0.1", &bogus, "/v1/threads")).await;
    refused.assert_problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited");
    assert!(refused.headers.contains_key(header::RETRY_AFTER));
    // Refused before any key is looked up, a valid one too: the peer waits.
    app.send(from_peer("10.0.0.1", &key, "/v1/threads"))
        .await
        .assert_problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited");
    // Another peer is not affected, and a key found not valid moments ago stays not valid.
    let other = app.send(from_peer("10.0.0.2", &key, "/v1/threads")).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.body);
    app.send(from_peer("10.0.0.2", &bogus, "/v1/threads"))
        .await
        .assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    app.finish().await;
}

/// Sends `request` and keeps the answer's body unread: the request is still in flight.
async fn hold(app: &TestApp, request: Request<Body>) -> axum::response::Response {
    app.router.clone().oneshot(request).await.unwrap()
}

async fn a_tenants_share_of_requests_in_flight_lasts_until_the_answer_is_sent(app: TestApp) {
    let limits = Limits {
        max_requests_per_tenant: 1,
        ..no_rate_limit()
    };
    let app = app.keyed_with(limits);
    let (acme, other) = (app.create_key("acme").await, app.create_key("other").await);
    let created = app.post_as(&acme, "/v1/threads", json!({"id": "t"})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let export = hold(&app, from_peer("127.0.0.1", &acme, "/v1/threads/t/export")).await;
    assert_eq!(export.status(), StatusCode::OK);
    let busy = app.get_as(&acme, "/v1/threads").await;
    busy.assert_problem(StatusCode::TOO_MANY_REQUESTS, "too-many-in-flight");
    assert!(busy.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(
        app.get_as(&other, "/v1/threads").await.status,
        StatusCode::OK
    );
    // The export's last byte is sent: the slot is free again.
    export.into_body().collect().await.unwrap();
    assert_eq!(
        app.get_as(&acme, "/v1/threads").await.status,
        StatusCode::OK
    );
    app.finish().await;
}

/// A streamed body fed through a channel, and its sender.
fn channel_body() -> (
    tokio::sync::mpsc::Sender<Result<axum::body::Bytes, std::io::Error>>,
    Body,
) {
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    let stream = tokio_stream_of(receiver);
    (sender, Body::from_stream(stream))
}

fn tokio_stream_of<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

fn import_request(thread: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/threads/{thread}/import"))
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(body)
        .unwrap()
}

async fn imports_of_one_tenant_run_within_its_share(app: TestApp) {
    let limits = Limits {
        max_imports_per_tenant: 1,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let (sender, body) = channel_body();
    let first = tokio::spawn({
        let router = app.router.clone();
        let request = import_request(&thread, body);
        async move { router.oneshot(request).await.unwrap() }
    });
    // The first import holds the tenant's one slot as long as its body is open: once its first
    // batch is stored, it is under way.
    let batch: String = (0..loupe::import::BATCH_ENTRIES)
        .map(|i| serde_json::to_string(&user(&format!("u{i}"), "hello")).unwrap() + "\n")
        .collect();
    sender.send(Ok(batch.into())).await.unwrap();
    let mut stored = 0;
    for _ in 0..600 {
        let page = app
            .get(&format!("/v1/threads/{thread}/messages?limit=1"))
            .await;
        stored = page.body["messages"].as_array().map_or(0, Vec::len);
        if stored > 0 {
            break;
        }
        assert!(!first.is_finished(), "the first import ended early");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stored > 0, "the first import's batch was not stored");
    let refused = app.send(import_request(&thread, Body::from(""))).await;
    refused.assert_problem(StatusCode::TOO_MANY_REQUESTS, "too-many-in-flight");
    drop(sender);
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let report: Value =
        serde_json::from_slice(&first.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(report["stored"], loupe::import::BATCH_ENTRIES, "{report}");
    let after = app.send(import_request(&thread, Body::from(""))).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    app.finish().await;
}

async fn a_trickling_import_is_cut_off(app: TestApp) {
    let limits = Limits {
        body_read_timeout: Duration::from_secs(1),
        import_min_bytes_per_sec: 1_000,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let (sender, body) = channel_body();
    // One byte every 200 ms: never idle for the body-read timeout, far below the rate.
    let feeder = tokio::spawn(async move {
        for _ in 0..200 {
            if sender.send(Ok(" ".into())).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let response = app.send(import_request(&thread, body)).await;
    let problem = response.assert_problem(StatusCode::REQUEST_TIMEOUT, "body-timeout");
    assert!(
        problem["detail"].as_str().unwrap().contains("bytes/s"),
        "{problem}"
    );
    assert!(!feeder.is_finished(), "cut off before the client gave up");
    feeder.abort();
    app.finish().await;
}

async fn an_import_past_its_deadline_is_cut_off_and_keeps_its_batches(app: TestApp) {
    let limits = Limits {
        body_read_timeout: Duration::from_secs(1),
        import_min_bytes_per_sec: 100,
        import_timeout: Duration::from_secs(2),
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let (sender, body) = channel_body();
    // A whole batch first, then a line every 50 ms, fast enough, for ever.
    let feeder = tokio::spawn(async move {
        let batch: String = (0..loupe::import::BATCH_ENTRIES)
            .map(|i| serde_json::to_string(&user(&format!("u{i}"), "x")).unwrap() + "\n")
            .collect();
        sender.send(Ok(batch.into())).await.unwrap();
        for i in 0.. {
            let line = serde_json::to_string(&user(&format!("late{i}"), "y")).unwrap() + "\n";
            if sender.send(Ok(line.into())).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let response = app.send(import_request(&thread, body)).await;
    let problem = response.assert_problem(StatusCode::REQUEST_TIMEOUT, "body-timeout");
    assert!(
        problem["detail"].as_str().unwrap().contains("ran longer"),
        "{problem}"
    );
    feeder.abort();
    let page = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    let stored = page.body["messages"].as_array().unwrap().len();
    assert!(stored >= loupe::import::BATCH_ENTRIES, "{stored}");
    app.finish().await;
}

/// An append of one user entry whose text is `bytes` long.
fn append_of(thread: &str, uuid: &str, bytes: usize, announced: bool) -> Request<Body> {
    let body = serde_json::to_vec(&json!({"messages": [user(uuid, &"x".repeat(bytes))]})).unwrap();
    let body = if announced {
        Body::from(body)
    } else {
        // No length announced: the budget is taken as the pieces arrive.
        let pieces: Vec<Result<axum::body::Bytes, std::io::Error>> = body
            .chunks(8 * 1024)
            .map(|c| Ok(axum::body::Bytes::copy_from_slice(c)))
            .collect();
        Body::from_stream(futures_util::stream::iter(pieces))
    };
    Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/threads/{thread}/messages"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap()
}

async fn request_bodies_held_at_once_stay_within_the_budget(app: TestApp) {
    // A 40 KiB body is charged about 200 KiB: its text, parsed, and the copies storing it makes.
    let limits = Limits {
        body_bytes: 1024 * 1024,
        max_inflight_body_bytes: 256 * 1024,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    for announced in [true, false] {
        let refused = app
            .send(append_of(&thread, "big", 300 * 1024, announced))
            .await;
        refused.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
        assert!(refused.headers.contains_key(header::RETRY_AFTER));
    }
    let held = hold(&app, append_of(&thread, "a", 40 * 1024, true)).await;
    assert_eq!(held.status(), StatusCode::CREATED);
    for announced in [true, false] {
        app.send(append_of(&thread, "b", 40 * 1024, announced))
            .await
            .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
    }
    // The first answer is sent: its body's share goes back.
    held.into_body().collect().await.unwrap();
    let second = app.send(append_of(&thread, "b", 40 * 1024, false)).await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.body);
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(page.body["messages"].as_array().unwrap().len(), 2);
    app.finish().await;
}

/// A body is charged what handling it holds at its peak: its text, its parsed values and the
/// copies storing it makes. One whose peak alone passes the budget is refused with 413, though
/// its parsed values alone would fit (the attack measured 1.58 GB for ten 30 MiB appends under a
/// budget of 1 GiB that counted the parsed values only).
async fn a_body_is_charged_the_copies_storing_it_makes(app: TestApp) {
    let limits = Limits {
        body_bytes: 1024 * 1024,
        max_inflight_body_bytes: 256 * 1024,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let refused = app.send(append_of(&thread, "a", 60 * 1024, true)).await;
    refused.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    assert!(
        refused.body["detail"].as_str().unwrap().contains("memory"),
        "{}",
        refused.body
    );
    let stored = app.send(append_of(&thread, "b", 30 * 1024, true)).await;
    assert_eq!(stored.status, StatusCode::CREATED, "{}", stored.body);
    app.finish().await;
}

/// The same service as `app`'s over its store, and its state, whose guards a test can read.
fn with_state(app: &TestApp, limits: Limits, auth: AuthMode) -> (axum::Router, AppState) {
    let state = AppState::new(app.store.clone(), limits, auth);
    (loupe::http::router(state.clone()), state)
}

/// A page takes room in the answer budget for what it holds, not for the page byte limit: with
/// most of the budget held, pages of a few small entries are still read, and a page of one large
/// entry waits for room. Before, every page took seven times the byte limit (28 MiB at the
/// defaults), so ten page reads filled a 256 MiB budget whatever they held.
async fn a_page_takes_room_for_what_it_holds(app: TestApp) {
    const MIB: usize = 1024 * 1024;
    let limits = Limits {
        max_page_bytes: 4 * MIB,
        max_inflight_window_bytes: 16 * MIB,
        ..no_rate_limit()
    };
    let (router, state) = with_state(&app, limits, AuthMode::Open);
    let thread = app.thread("t").await;
    app.append(
        &thread,
        [user("a", "a small turn"), user("b", "another small turn")],
    )
    .await;
    app.append(&thread, [user("big", &"b".repeat(3 * MIB))])
        .await;
    // Half the budget held elsewhere: room for a small page (seven times 1 MiB) is left, not
    // for seven times the page byte limit.
    let tenant = loupe::store::TenantId::default_tenant();
    let held = state
        .guards
        .answer_room(&tenant.0, 8 * MIB as u64)
        .await
        .unwrap();
    let get = |uri: String| {
        let request = Request::get(uri).body(Body::empty()).unwrap();
        router.clone().oneshot(request)
    };
    for uri in [
        format!("/v1/threads/{thread}/messages?limit=2"),
        // A batch reads one entry past its count, to learn whether more follow.
        format!("/v1/threads/{thread}/cursors/c/pending?limit=1"),
    ] {
        let answer = tokio::time::timeout(Duration::from_secs(20), get(uri.clone()))
            .await
            .unwrap_or_else(|_| panic!("{uri}: a page of two small entries waited for room"))
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{uri}");
    }
    // The large entry's page needs more room than is left (seven times 3 MiB, at most the whole
    // budget): it waits until the room comes back.
    let large = tokio::spawn(get(format!(
        "/v1/threads/{thread}/messages?after_seq=1&limit=1"
    )));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !large.is_finished(),
        "a page of 3 MiB was read in 2 MiB of room"
    );
    drop(held);
    let answer = large.await.unwrap().unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert!(body.len() > 3 * MIB);
}

/// A read whose request ends while the database loads its page (the request's timeout, or a
/// client gone) keeps its room until the database is done: the load goes on without the request.
/// The attack let readers in just before their timeout, each given the room of the one before it
/// as that one's request ended, and left 1.1 GB of loads behind a 256 MiB budget.
#[tokio::test]
async fn a_read_keeps_its_room_while_the_database_loads_it_after_its_request_ends() {
    use sqlx::Connection;
    let app = TestApp::new(crate::common::Backend::Postgres).await;
    let limits = Limits {
        max_inflight_window_bytes: 64 * 1024 * 1024,
        ..no_rate_limit()
    };
    let (router, state) = with_state(&app, limits, AuthMode::Open);
    let full = state.guards.answer_room_free();
    let thread = app.thread("t").await;
    app.append(&thread, [user("a", "a turn")]).await;
    // The page's read waits behind a lock held elsewhere, as a long load would.
    sqlx::any::install_default_drivers();
    let mut locker = sqlx::AnyConnection::connect(&app.url).await.unwrap();
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let request = Request::get(format!("/v1/threads/{thread}/messages"))
        .body(Body::empty())
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_millis(500), router.oneshot(request)).await;
    assert!(ended.is_err(), "the read waited behind the lock");
    assert!(
        state.guards.answer_room_free() < full,
        "the request ended, and the read it started still holds its room"
    );
    lock.commit().await.unwrap();
    let mut freed = false;
    for _ in 0..100 {
        if state.guards.answer_room_free() == full {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the room comes back once the read is done");
    locker.close().await.unwrap();
    app.finish().await;
}

/// Every answer that holds entries holds room in the process's answer budget until its body is
/// sent, for its own length, an entry larger than a page included; unread answers cannot hold
/// more than the budget, and one tenant no more than half of it: another's answers go on. (The
/// attack took the process to 2.38 GB with 32 unread pages of one 30 MiB entry.)
async fn answers_hold_room_in_the_answer_budget_until_sent(app: TestApp) {
    const MIB: usize = 1024 * 1024;
    // A read takes six times a page (an export's page is 4 MiB) until it has read, then what
    // its answer holds.
    let limits = Limits {
        max_page_bytes: 64 * 1024,
        max_inflight_window_bytes: 64 * MIB,
        ..no_rate_limit()
    };
    let (router, state) = with_state(&app, limits.clone(), AuthMode::Open);
    let full = state.guards.answer_room_free();
    assert_eq!(full, 64 * 1024);
    let thread = app.thread("t").await;
    // One entry of 2 MiB: thirty-two times a page.
    app.append(&thread, [user("big", &"b".repeat(2 * MIB))])
        .await;
    let get = |uri: String| {
        let router = router.clone();
        async move {
            let request = Request::get(uri).body(Body::empty()).unwrap();
            router.oneshot(request).await.unwrap()
        }
    };
    let mut held = Vec::new();
    for uri in [
        format!("/v1/threads/{thread}/messages?limit=1"),
        format!("/v1/threads/{thread}/export"),
        format!("/v1/threads/{thread}/cursors/c/pending"),
    ] {
        let answer = get(uri.clone()).await;
        assert_eq!(answer.status(), StatusCode::OK, "{uri}");
        let taken = full - state.guards.answer_room_free();
        held.push(answer);
        let each = 2 * 1024;
        assert!(
            taken >= held.len() * each && taken < held.len() * (each + 64),
            "{uri}: {taken} KiB held by {} unread answers of a 2 MiB entry",
            held.len()
        );
    }
    // Read whole, each gives its room back; the entry came whole.
    for answer in held.drain(..) {
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert!(body.len() > 2 * MIB);
    }
    assert_eq!(state.guards.answer_room_free(), full);

    // Keyed: a tenant holds at most half the budget; its next answer waits, another's does not.
    let limits = Limits {
        max_inflight_window_bytes: 16 * MIB,
        ..limits
    };
    let app = app.keyed_with(no_rate_limit());
    let (router, state) = with_state(&app, limits, AuthMode::Keyed { admin_key: None });
    let (acme, other) = (app.create_key("acme").await, app.create_key("other").await);
    let as_tenant = |key: &str, uri: &str| {
        Request::get(uri)
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap()
    };
    for (key, id) in [(&acme, "a"), (&other, "o")] {
        let created = router
            .clone()
            .oneshot(
                Request::post("/v1/threads")
                    .header(header::AUTHORIZATION, format!("Bearer {key}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(json!({"id": id}).to_string()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(created.status(), StatusCode::CREATED);
        let appended = router
            .clone()
            .oneshot(
                Request::post(format!("/v1/threads/{id}/messages"))
                    .header(header::AUTHORIZATION, format!("Bearer {key}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(
                        json!({"messages": [user("big", &"b".repeat(2 * MIB))]}).to_string(),
                    ))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(appended.status(), StatusCode::CREATED);
    }
    let page = |key: &str, id: &str| as_tenant(key, &format!("/v1/threads/{id}/messages?limit=1"));
    // An unread page holds a little over 2 MiB once built, and building one takes all of
    // acme's 8 MiB: with one held, the next waits.
    for _ in 0..1 {
        let answer = router.clone().oneshot(page(&acme, "a")).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        held.push(answer);
    }
    let waiting = tokio::spawn(router.clone().oneshot(page(&acme, "a")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "acme's answers past its share wait");
    let other_answer = tokio::time::timeout(
        Duration::from_secs(10),
        router.clone().oneshot(page(&other, "o")),
    )
    .await
    .expect("another tenant's answer does not wait for acme's")
    .unwrap();
    assert_eq!(other_answer.status(), StatusCode::OK);
    drop(other_answer);
    drop(held.drain(..));
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("room given back lets the waiting answer go on")
        .unwrap()
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    drop(answered);
    drop(held);
    assert_eq!(state.guards.answer_room_free(), 16 * 1024);
    app.finish().await;
}

/// Every line of an export, as JSON.
async fn export_lines(app: &TestApp, thread: &str) -> Vec<Value> {
    let export = app.get(&format!("/v1/threads/{thread}/export")).await;
    assert_eq!(export.status, StatusCode::OK);
    export
        .body
        .as_str()
        .map(|text| {
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .unwrap_or_else(|| vec![export.body.clone()])
}

async fn whole_thread_reads_are_cut_by_bytes_and_lose_nothing(app: TestApp) {
    let limits = Limits {
        max_page_bytes: 10_000,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let entries: Vec<Value> = (0..30)
        .map(|i| user(&format!("u{i}"), &format!("{i} {}", "w".repeat(3_000))))
        .collect();
    app.append(&thread, &entries).await;
    // Pending batches: at most 10,000 characters each (and always one entry), all in order.
    let mut seen = Vec::new();
    loop {
        let pending = app
            .get(&format!(
                "/v1/threads/{thread}/cursors/c/pending?limit=1000&format=normalized"
            ))
            .await;
        assert_eq!(pending.status, StatusCode::OK, "{}", pending.body);
        let count = pending.body["entry_count"].as_u64().unwrap();
        assert!((1..=4).contains(&count), "{}", pending.body);
        assert!(pending.body["normalized"]["messages"].is_array());
        let raw = app
            .get(&format!(
                "/v1/threads/{thread}/cursors/c/pending?limit=1000"
            ))
            .await;
        let messages = raw.body["messages"].as_array().unwrap();
        assert_eq!(messages.len() as u64, count);
        seen.extend(messages.iter().map(|m| m["uuid"].clone()));
        let advanced = app
            .post(
                &format!("/v1/threads/{thread}/cursors/c/advance"),
                json!({"to": raw.body["advance_to"]}),
            )
            .await;
        assert_eq!(advanced.status, StatusCode::OK, "{}", advanced.body);
        if !raw.body["has_more"].as_bool().unwrap() {
            break;
        }
    }
    let uuids: Vec<Value> = entries.iter().map(|e| e["uuid"].clone()).collect();
    assert_eq!(seen, uuids);
    // The export, read in pages of 4 MiB: large entries span pages, nothing is lost.
    let big: Vec<Value> = (0..3)
        .map(|i| user(&format!("big{i}"), &"b".repeat(3 * 1024 * 1024)))
        .collect();
    for entry in &big {
        app.append(&thread, [entry]).await;
    }
    let lines = export_lines(&app, &thread).await;
    let exported: Vec<Value> = lines.iter().map(|l| l["uuid"].clone()).collect();
    let all: Vec<Value> = entries
        .iter()
        .chain(&big)
        .map(|e| e["uuid"].clone())
        .collect();
    assert_eq!(exported, all);
    // Rounds, grouped from what each entry is cut to, over entries far larger than a page.
    let rounds = app.get(&format!("/v1/threads/{thread}/rounds")).await;
    assert_eq!(rounds.status, StatusCode::OK, "{}", rounds.body);
    assert_eq!(rounds.body["rounds"][0]["last_seq"], 32, "{}", rounds.body);
    app.finish().await;
}

async fn a_thread_at_its_byte_limit_refuses_appends_but_never_a_snip(app: TestApp) {
    const LIMIT: i64 = 5_000;
    let app = app
        .with_store_options(|options| options.max_thread_bytes = LIMIT)
        .await;
    let thread = app.thread("t").await;
    let text = "w".repeat(900);
    let mut written = 0;
    let refused = loop {
        let response = app
            .post(
                &format!("/v1/threads/{thread}/messages"),
                json!({"messages": [user(&format!("u{written}"), &text)]}),
            )
            .await;
        if response.status != StatusCode::CREATED {
            break response;
        }
        written += 1;
        assert!(written < 10, "no append was refused");
    };
    assert!(written >= 3, "refused too early, after {written}");
    let problem = refused.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "thread-too-large");
    assert_eq!(problem["limit_bytes"], LIMIT, "{problem}");
    // The thread's count is its stored bodies' bytes, and what it holds stays whole.
    let lines = app.export_line_bytes(&thread).await;
    assert_eq!(lines.len(), written);
    let stored: usize = lines.iter().sum();
    let info = app.get(&format!("/v1/threads/{thread}")).await;
    assert_eq!(info.body["stored_bytes"], stored, "{}", info.body);
    assert_eq!(problem["stored_bytes"], stored, "{problem}");
    assert!(stored as i64 <= LIMIT);
    // Filled to the brim with small messages, it still takes a snip: a thread at its limit can
    // always hide what it holds.
    for i in 0.. {
        let response = app
            .post(
                &format!("/v1/threads/{thread}/messages"),
                json!({"messages": [user(&format!("s{i}"), "x")]}),
            )
            .await;
        if response.status != StatusCode::CREATED {
            response.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "thread-too-large");
            break;
        }
    }
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"seqs": [0, 1, 2], "uuid": "snip-0"}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    app.assert_stored_bytes_counted(&thread).await;
    let with_snip: usize = app.export_line_bytes(&thread).await.iter().sum();
    assert!(
        with_snip as i64 > LIMIT,
        "the snip was counted: {with_snip}"
    );
    // But snips are no way around the limit: a snip can carry anything, so they get a bounded
    // headroom past it, not an exception.
    let mut statuses = Vec::new();
    for i in 0..25 {
        let snip = json!({"type": "system", "subtype": "snip", "uuid": format!("fat-snip-{i}"),
            "snip_metadata": {"removed_uuids": ["u0"]}, "pad": "p".repeat(60_000)});
        let path = format!("/v1/threads/{thread}/messages");
        statuses.push(app.post(&path, json!({"messages": [snip]})).await.status);
    }
    assert!(
        statuses.contains(&StatusCode::PAYLOAD_TOO_LARGE),
        "{statuses:?}"
    );
    app.assert_stored_bytes_counted(&thread).await;
    let stored: usize = app.export_line_bytes(&thread).await.iter().sum();
    assert!(
        stored as i64 <= LIMIT + loupe::store::SNIP_HEADROOM_BYTES,
        "{stored}"
    );
    // An import stops at the batch that would pass it, keeping the batches before.
    let other = app.thread("imported").await;
    let ndjson: String = (0..2)
        .map(|i| format!("{}\n", user(&format!("i{i}"), &"v".repeat(1_500))))
        .collect();
    let imported = app
        .send(import_request(&other, Body::from(ndjson.clone())))
        .await;
    assert_eq!(imported.status, StatusCode::OK, "{}", imported.body);
    let over = app
        .send(import_request(
            &other,
            Body::from(ndjson.replace("\"i", "\"j")),
        ))
        .await;
    over.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "thread-too-large");
    assert_eq!(app.export_line_bytes(&other).await.len(), 2);
    app.finish().await;
}

/// Migration 0008 counts the bytes of threads stored before it, as appends count them after.
async fn the_migration_counts_what_threads_stored_before_it(app: TestApp) {
    use sqlx::Connection;
    let thread = app.thread("t").await;
    let entries: Vec<Value> = (0..5)
        .map(|i| user(&format!("u{i}"), &format!("héllo {}", "ü".repeat(i * 100))))
        .collect();
    app.append(&thread, &entries).await;
    let migration = match app.backend {
        crate::common::Backend::Sqlite => {
            include_str!("../../migrations/sqlite/0008_thread_stored_bytes.sql")
        }
        crate::common::Backend::Postgres => {
            include_str!("../../migrations/postgres/0008_thread_stored_bytes.sql")
        }
    };
    let backfill = &migration[migration.find("UPDATE threads").expect("a backfill")..];
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&app.url).await.unwrap();
    sqlx::query("UPDATE threads SET stored_bytes = 0")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(backfill).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    // Bytes, not characters: the text holds two-byte characters.
    app.assert_stored_bytes_counted(&thread).await;
    app.finish().await;
}

/// A body or an imported entry made of tiny values (`[[],[],…]`) would take a hundred times its
/// length when parsed: weighed before it is, it is refused when it alone would pass the budget
/// of request bodies, while a real body of the same size passes.
async fn a_body_dense_in_values_is_refused_before_it_is_parsed(app: TestApp) {
    let limits = Limits {
        max_inflight_body_bytes: 64 * 1024 * 1024,
        ..no_rate_limit()
    };
    let app = app.reconfigure(limits, AuthMode::Open);
    let thread = app.thread("t").await;
    let dense = |n: usize| {
        let mut entry = user("dense", "q");
        entry["message"]["content"] = json!([{"type": "tool_result", "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "x"}], "extra": vec![json!([]); n]}]);
        entry
    };
    let path = format!("/v1/threads/{thread}/messages");
    let refused = app.post(&path, json!({"messages": [dense(300_000)]})).await;
    let problem = refused.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    assert!(
        problem["detail"].as_str().unwrap().contains("JSON values"),
        "{problem}"
    );
    let normalize = app
        .post(
            "/v1/normalize",
            json!({"messages": [dense(300_000)], "provider": "openai"}),
        )
        .await;
    normalize.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    // Real entries of about the same size pass.
    let real: Vec<Value> = (0..3_000)
        .map(|i| {
            user(
                &format!("u{i}"),
                &format!("word {i} {}", "lorem ipsum ".repeat(20)),
            )
        })
        .collect();
    let stored = app.post(&path, json!({"messages": real})).await;
    assert_eq!(stored.status, StatusCode::CREATED, "{}", stored.body);
    // An import refuses the one dense line and stores the others.
    let lines = [user("a", "before"), dense(300_000), user("b", "after")]
        .iter()
        .map(|entry| serde_json::to_string(entry).unwrap() + "\n")
        .collect::<String>();
    let imported = app
        .send(import_request(&app.thread("i").await, Body::from(lines)))
        .await;
    assert_eq!(imported.status, StatusCode::OK, "{}", imported.body);
    assert_eq!(imported.body["stored"], 2, "{}", imported.body);
    assert_eq!(imported.body["refusals"][0]["line"], 2, "{}", imported.body);
    let reason = imported.body["refusals"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("JSON values"), "{}", imported.body);
    app.finish().await;
}

on_both_backends!(
    a_body_dense_in_values_is_refused_before_it_is_parsed,
    the_migration_counts_what_threads_stored_before_it,
    a_thread_at_its_byte_limit_refuses_appends_but_never_a_snip,
    a_nul_in_a_type_is_the_callers_mistake,
    usage_past_what_a_provider_reports_saturates,
    open_mode_answers_only_loopback_host_names,
    failed_authentications_are_limited_per_peer,
    a_tenants_share_of_requests_in_flight_lasts_until_the_answer_is_sent,
    imports_of_one_tenant_run_within_its_share,
    a_trickling_import_is_cut_off,
    an_import_past_its_deadline_is_cut_off_and_keeps_its_batches,
    request_bodies_held_at_once_stay_within_the_budget,
    a_body_is_charged_the_copies_storing_it_makes,
    answers_hold_room_in_the_answer_budget_until_sent,
    a_page_takes_room_for_what_it_holds,
    whole_thread_reads_are_cut_by_bytes_and_lose_nothing,
);
