//! Webhooks (issue 38): deliveries a local receiver checks (signature, id, at least once), the
//! outbox written in the change's transaction, retries with backoff, replays, the address
//! policy, tenants kept apart, and a SIGKILL of the real binary mid-way that loses no event.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use loupe::http::AuthMode;
use loupe::webhooks::{deliver_due, WebhookConfig};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::common::{user, TestApp};

on_both_backends!(
    deliveries_are_signed_and_report_every_change,
    a_failed_delivery_is_retried_with_backoff_then_replayed,
    a_change_that_rolls_back_queues_nothing,
    private_addresses_are_refused_unless_allowed,
    an_endpoint_reaches_only_its_tenants_events,
    a_slow_endpoint_gets_every_append_in_order,
    a_hanging_tenant_holds_back_no_other,
    the_endpoint_cap_holds_under_racing_registrations,
    an_endpoint_far_behind_drops_its_oldest_deliveries,
    the_sender_reaches_unsent_deliveries_by_index,
    a_name_that_does_not_resolve_shows_the_one_generic_reason,
    ended_deliveries_are_bounded_per_endpoint,
);

/// What the receiver got: each request's headers and body.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: String,
}

/// A local endpoint that answers 500 to its first `failures` requests, then 204; or, with
/// `delay`, answers only after it.
#[derive(Clone)]
pub(crate) struct Receiver {
    pub url: String,
    pub got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub(crate) async fn start(failures: u32, delay: Duration) -> Receiver {
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let failures = Arc::new(AtomicU32::new(failures));
        let handler = {
            let (got, failures) = (got.clone(), failures.clone());
            move |headers: HeaderMap, body: String| {
                let (got, failures) = (got.clone(), failures.clone());
                async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned()
                    };
                    got.lock().unwrap().push(Received {
                        id: header("webhook-id"),
                        timestamp: header("webhook-timestamp"),
                        signature: header("webhook-signature"),
                        body,
                    });
                    // Recorded first: a slow answer still counts as an attempt received.
                    tokio::time::sleep(delay).await;
                    let failing = failures
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::NO_CONTENT
                    }
                }
            }
        };
        let router = axum::Router::new().route("/hook", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Receiver { url, got }
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

/// Checks a delivery's signature as a receiver following the Standard Webhooks specification
/// does, written here from the specification, not with the service's code.
pub(crate) fn verify(secret: &str, received: &Received) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", received.id, received.timestamp, received.body).as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    received
        .signature
        .split(' ')
        .any(|signature| signature == format!("v1,{expected}"))
}

fn allowing_private(app: TestApp) -> TestApp {
    let limits = loupe::http::Limits {
        webhooks_allow_private: true,
        ..app.limits.clone()
    };
    app.reconfigure(limits, AuthMode::Open)
}

fn config() -> WebhookConfig {
    WebhookConfig {
        allow_private: true,
        backoff_base: Duration::from_secs(10),
        ..WebhookConfig::DEFAULT
    }
}

/// Sends what is due at `now_ms` until nothing is; returns how many attempts were made.
async fn drain(app: &TestApp, now_ms: i64) -> usize {
    let config = config();
    let client = loupe::webhooks::client(&config);
    let mut attempts = 0;
    loop {
        let sent = deliver_due(&app.store, &client, &config, now_ms)
            .await
            .unwrap();
        if sent == 0 {
            return attempts;
        }
        attempts += sent;
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn register(app: &TestApp, url: &str, kinds: Value) -> Value {
    let made = app
        .post("/v1/webhooks", json!({"url": url, "kinds": kinds}))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert!(made.body["secret"].as_str().unwrap().starts_with("whsec_"));
    made.body
}

fn bodies(received: &[Received]) -> Vec<Value> {
    received
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect()
}

async fn deliveries_are_signed_and_report_every_change(app: TestApp) {
    let app = allowing_private(app);
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let hook = register(
        &app,
        &receiver.url,
        json!([
            "entries.appended",
            "thread.created",
            "thread.deleted",
            "thread.erasure"
        ]),
    )
    .await;
    let secret = hook["secret"].as_str().unwrap();
    // Secrets are shown once.
    let listed = app.get("/v1/webhooks").await;
    assert_eq!(listed.body["webhooks"][0]["id"], hook["id"]);
    assert!(listed.body["webhooks"][0].get("secret").is_none());

    app.post("/v1/threads", json!({"id": "t"})).await;
    app.append("t", json!([user("u0", "zero"), user("u1", "one")]))
        .await;
    app.append("t", json!([user("u2", "two secret-word")]))
        .await;
    let erased = app
        .post("/v1/threads/t/erasures", json!({"seqs": [2]}))
        .await;
    assert!(erased.status.is_success(), "{}", erased.body);
    assert_eq!(
        app.delete("/v1/threads/t").await.status,
        StatusCode::NO_CONTENT
    );

    assert_eq!(drain(&app, now_ms()).await, 5);
    let received = receiver.received();
    for delivery in &received {
        assert!(verify(secret, delivery), "a bad signature: {delivery:?}");
    }
    let events = bodies(&received);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "thread.created",
            "entries.appended",
            "entries.appended",
            "thread.erasure",
            "thread.deleted"
        ]
    );
    assert_eq!(
        events[1]["data"],
        json!({"thread_id": "t", "first_seq": 0, "next_seq": 2})
    );
    assert_eq!(events[2]["data"]["first_seq"], 2);
    assert_eq!(events[3]["data"]["seqs"], json!([2]));
    assert_eq!(events[4]["data"]["thread_id"], "t");
    // The body's id is the header's, and ids are unique.
    let mut ids: Vec<&str> = received.iter().map(|r| r.id.as_str()).collect();
    for (event, id) in events.iter().zip(&ids) {
        assert_eq!(event["id"], *id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 5);
    // No delivery holds what an entry said.
    assert!(received.iter().all(|r| !r.body.contains("secret-word")));

    let page = app
        .get(&format!(
            "/v1/webhooks/{}/deliveries",
            hook["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let deliveries = page.body["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 5);
    assert!(deliveries
        .iter()
        .all(|d| d["state"] == "delivered" && d["attempts"] == 1 && d["last_status"] == 204));
    assert_eq!(drain(&app, now_ms()).await, 0, "nothing is sent twice");
    app.finish().await;
}

async fn a_failed_delivery_is_retried_with_backoff_then_replayed(app: TestApp) {
    let app = allowing_private(app);
    let receiver = Receiver::start(2, Duration::ZERO).await;
    let hook = register(&app, &receiver.url, json!(["thread.created"])).await;
    let hook_id = hook["id"].as_str().unwrap();
    app.post("/v1/threads", json!({"id": "t"})).await;
    let start = now_ms();
    assert_eq!(drain(&app, start).await, 1);
    let pending = app
        .get(&format!("/v1/webhooks/{hook_id}/deliveries?state=pending"))
        .await;
    let delivery = &pending.body["deliveries"][0];
    assert_eq!(delivery["attempts"], 1);
    assert_eq!(delivery["last_status"], 500);
    // Not before its backoff (10 s, then 20 s).
    assert_eq!(drain(&app, start + 5_000).await, 0);
    assert_eq!(drain(&app, start + 10_000).await, 1);
    assert_eq!(drain(&app, start + 25_000).await, 0);
    assert_eq!(drain(&app, start + 30_000).await, 1);
    let delivered = app
        .get(&format!(
            "/v1/webhooks/{hook_id}/deliveries?state=delivered"
        ))
        .await;
    assert_eq!(delivered.body["deliveries"][0]["attempts"], 3);
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(
        received.iter().all(|r| r.id == received[0].id),
        "one id for every attempt"
    );

    // A replay sends it again, under the same id.
    let id = delivered.body["deliveries"][0]["id"].as_str().unwrap();
    let replayed = app
        .post(
            &format!("/v1/webhooks/{hook_id}/deliveries/{id}/replay"),
            json!({}),
        )
        .await;
    assert_eq!(replayed.status, StatusCode::ACCEPTED, "{}", replayed.body);
    assert_eq!(replayed.body["state"], "pending");
    assert_eq!(drain(&app, now_ms()).await, 1);
    assert_eq!(receiver.received().last().unwrap().id, id);

    // Replaying what does not exist.
    let missing = app
        .post(
            &format!("/v1/webhooks/{hook_id}/deliveries/whd_999999/replay"),
            json!({}),
        )
        .await;
    missing.assert_problem(StatusCode::NOT_FOUND, "not-found");
    for bad_id in ["nope", "whd_+5", "whd_-1", "whd_99999999999999999999"] {
        let bad = app
            .post(
                &format!("/v1/webhooks/{hook_id}/deliveries/{bad_id}/replay"),
                json!({}),
            )
            .await;
        assert_eq!(
            bad.status,
            StatusCode::BAD_REQUEST,
            "{bad_id}: {}",
            bad.body
        );
    }
    app.finish().await;
}

async fn a_change_that_rolls_back_queues_nothing(app: TestApp) {
    let app = allowing_private(app);
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let hook = register(&app, &receiver.url, json!(["entries.appended"])).await;
    app.post("/v1/threads", json!({"id": "t"})).await;
    app.append("t", json!([user("u0", "zero")])).await;
    // A refused compare-and-append, a replay of stored messages, an oversized batch: nothing
    // committed, nothing queued.
    let refused = app
        .post(
            "/v1/threads/t/messages",
            json!({"expected_next_seq": 7, "messages": [user("u1", "one")]}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    let replay = app
        .post(
            "/v1/threads/t/messages",
            json!({"messages": [user("u0", "zero")]}),
        )
        .await;
    assert!(replay.status.is_success(), "{}", replay.body);
    let page = app
        .get(&format!(
            "/v1/webhooks/{}/deliveries",
            hook["id"].as_str().unwrap()
        ))
        .await;
    let deliveries = page.body["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    assert_eq!(deliveries[0]["data"]["next_seq"], 1);
    app.finish().await;
}

async fn private_addresses_are_refused_unless_allowed(app: TestApp) {
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[fd00::1]/hook",
        "http://0x7f.1/hook",
        "http://100.64.0.1/hook",
        "ftp://example.com/hook",
        "https://user:pass@example.com/hook",
        "not a url",
        "https://example.com:0/hook",
    ] {
        let refused = app
            .post(
                "/v1/webhooks",
                json!({"url": url, "kinds": ["thread.created"]}),
            )
            .await;
        refused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    }
    let empty = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://example.com/h", "kinds": []}),
        )
        .await;
    empty.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let unknown = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://example.com/h", "kinds": ["nope"]}),
        )
        .await;
    assert!(unknown.status.is_client_error());
    let too_many = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://example.com/h", "kinds": vec!["thread.created"; 8]}),
        )
        .await;
    too_many.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    // A public name is accepted (it is resolved, and checked, at every attempt).
    let public = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://example.com/h", "kinds": ["thread.created"]}),
        )
        .await;
    assert_eq!(public.status, StatusCode::CREATED, "{}", public.body);

    // An endpoint registered while private addresses were allowed is not sent to once they
    // are not: the attempt is refused, and the delivery fails without a request.
    let allowed = allowing_private(app);
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let hook = register(&allowed, &receiver.url, json!(["thread.created"])).await;
    allowed.post("/v1/threads", json!({"id": "t"})).await;
    let strict = WebhookConfig::DEFAULT;
    let client = loupe::webhooks::client(&strict);
    deliver_due(&allowed.store, &client, &strict, now_ms())
        .await
        .unwrap();
    assert!(receiver.received().is_empty());
    let failed = allowed
        .get(&format!(
            "/v1/webhooks/{}/deliveries?state=failed",
            hook["id"].as_str().unwrap()
        ))
        .await;
    assert!(failed.body["deliveries"][0]["last_error"]
        .as_str()
        .unwrap()
        .contains("private"));
    allowed.finish().await;
}

async fn an_endpoint_reaches_only_its_tenants_events(app: TestApp) {
    let limits = loupe::http::Limits {
        webhooks_allow_private: true,
        ..app.limits.clone()
    };
    let app = app.keyed_with(limits);
    let alice = app.create_key("alice").await;
    let bob = app.create_key("bob").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let made = app
        .post_as(
            &bob,
            "/v1/webhooks",
            json!({"url": receiver.url, "kinds": ["thread.created", "entries.appended"]}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let hook_id = made.body["id"].as_str().unwrap().to_owned();
    app.post_as(&alice, "/v1/threads", json!({"id": "a"})).await;
    app.post_as(
        &alice,
        "/v1/threads/a/messages",
        json!({"messages": [user("u", "x")]}),
    )
    .await;
    app.post_as(&bob, "/v1/threads", json!({"id": "b"})).await;
    drain(&app, now_ms()).await;
    let threads: Vec<String> = bodies(&receiver.received())
        .iter()
        .map(|e| e["data"]["thread_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(threads, ["b"]);
    // Alice sees none of Bob's endpoints or deliveries.
    let listed = app.get_as(&alice, "/v1/webhooks").await;
    assert_eq!(listed.body["webhooks"], json!([]));
    app.get_as(&alice, &format!("/v1/webhooks/{hook_id}"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get_as(&alice, &format!("/v1/webhooks/{hook_id}/deliveries"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.delete_as(&alice, &format!("/v1/webhooks/{hook_id}"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(
        app.delete_as(&bob, &format!("/v1/webhooks/{hook_id}"))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    app.finish().await;
}

async fn a_slow_endpoint_gets_every_append_in_order(app: TestApp) {
    let app = allowing_private(app);
    let slow = Receiver::start(0, Duration::from_millis(500)).await;
    let quick = Receiver::start(0, Duration::ZERO).await;
    register(&app, &slow.url, json!(["entries.appended"])).await;
    register(&app, &quick.url, json!(["entries.appended"])).await;
    app.post("/v1/threads", json!({"id": "t"})).await;
    let sender = {
        let store = app.store.clone();
        tokio::spawn(async move {
            let config = config();
            let client = loupe::webhooks::client(&config);
            let mut sent = 0;
            for _ in 0..3 {
                sent += deliver_due(&store, &client, &config, now_ms())
                    .await
                    .unwrap();
            }
            sent
        })
    };
    // Appends go on while the slow endpoint holds its delivery.
    for i in 0..8 {
        app.append("t", json!([user(&format!("u{i}"), "x")])).await;
    }
    sender.await.unwrap();
    drain(&app, now_ms()).await;
    // The slow endpoint was sent one delivery at a time: every append reached both, in order.
    for receiver in [&slow, &quick] {
        let covered: Vec<(i64, i64)> = bodies(&receiver.received())
            .iter()
            .map(|e| {
                (
                    e["data"]["first_seq"].as_i64().unwrap(),
                    e["data"]["next_seq"].as_i64().unwrap(),
                )
            })
            .collect();
        let mut next = 0;
        for (first, end) in &covered {
            assert_eq!(*first, next, "{covered:?}");
            next = *end;
        }
        assert_eq!(next, 8);
    }
    app.finish().await;
}

/// SIGKILL of the real binary while it appends and delivers: after a restart, every
/// acknowledged append has reached the receiver (at least once), every delivery signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_mid_delivery_loses_no_event() {
    use crate::drills::{client, free_port, wait_for, Service};
    let dir = std::env::temp_dir().join(format!("loupe-hooks-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let database_url = format!("sqlite://{}", dir.join("hooks.db").display());
    let log = dir.join("loupe.log");
    // Slow enough that deliveries are in flight when the kill comes.
    let receiver = Receiver::start(0, Duration::from_millis(30)).await;
    let env = [("LOUPE_WEBHOOKS_ALLOW_PRIVATE", "true")];
    let port = free_port();
    let service = Service::start(port, &database_url, &env, &log).await;
    let base = service.base.clone();
    let http = client();
    let hook: Value = http
        .post(format!("{base}/v1/webhooks"))
        .json(&json!({"url": receiver.url, "kinds": ["entries.appended"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = hook["secret"].as_str().unwrap().to_owned();
    http.post(format!("{base}/v1/threads"))
        .json(&json!({"id": "t"}))
        .send()
        .await
        .unwrap();
    let append = |base: String, i: usize| {
        let http = http.clone();
        async move {
            http.post(format!("{base}/v1/threads/t/messages"))
                .json(&json!({"messages": [user(&format!("u{i}"), "x")]}))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    };
    for i in 0..60 {
        assert!(append(base.clone(), i).await);
    }
    // Some were delivered, not all: the kill lands mid-way.
    wait_for("a first delivery", || async {
        !receiver.received().is_empty()
    })
    .await;
    service.kill().await;
    let before_restart = receiver.received().len();
    let service = Service::start(port, &database_url, &env, &log).await;
    for i in 60..80 {
        assert!(append(service.base.clone(), i).await);
    }
    wait_for("every appended seq to be delivered", || async {
        let mut seen = std::collections::BTreeSet::new();
        for event in bodies(&receiver.received()) {
            let (first, end) = (
                event["data"]["first_seq"].as_i64().unwrap(),
                event["data"]["next_seq"].as_i64().unwrap(),
            );
            seen.extend(first..end);
        }
        seen.len() == 80 && seen.iter().copied().eq(0..80)
    })
    .await;
    let received = receiver.received();
    assert!(
        before_restart < received.len(),
        "deliveries went on after the restart"
    );
    for delivery in &received {
        assert!(verify(&secret, delivery), "a bad signature: {delivery:?}");
    }
    service.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One tenant's endpoints that hang hold at most its share of the sender's slots: another
/// tenant's delivery goes out while they hang, not after them.
async fn a_hanging_tenant_holds_back_no_other(app: TestApp) {
    let limits = loupe::http::Limits {
        webhooks_allow_private: true,
        ..app.limits.clone()
    };
    let app = app.keyed_with(limits);
    let alice = app.create_key("alice").await;
    let bob = app.create_key("bob").await;
    let hanging = Receiver::start(0, Duration::from_secs(30)).await;
    let quick = Receiver::start(0, Duration::ZERO).await;
    for _ in 0..16 {
        let made = app
            .post_as(
                &alice,
                "/v1/webhooks",
                json!({"url": hanging.url, "kinds": ["thread.created"]}),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    }
    app.post_as(
        &bob,
        "/v1/webhooks",
        json!({"url": quick.url, "kinds": ["thread.created"]}),
    )
    .await;
    app.post_as(&alice, "/v1/threads", json!({"id": "a"})).await;
    app.post_as(&bob, "/v1/threads", json!({"id": "b"})).await;
    let config = WebhookConfig {
        allow_private: true,
        timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(20),
        ..WebhookConfig::DEFAULT
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let sender = loupe::webhooks::spawn_sender(app.store.clone(), config.clone(), stop.clone());
    crate::drills::wait_for("bob's delivery", || async { !quick.received().is_empty() }).await;
    let alice_attempts = hanging.received().len();
    stop.cancel();
    sender.await.unwrap();
    assert!(
        alice_attempts <= config.concurrency as usize / 4,
        "bob waited for {alice_attempts} of alice's hanging attempts"
    );
    app.finish().await;
}

async fn the_endpoint_cap_holds_under_racing_registrations(app: TestApp) {
    let app = Arc::new(app);
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                app.post(
                    "/v1/webhooks",
                    json!({"url": "https://example.com/hook", "kinds": ["thread.created"]}),
                )
                .await
                .status
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let status = task.await.unwrap();
        if status == StatusCode::CREATED {
            created += 1;
        } else {
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        }
    }
    assert_eq!(created, loupe::store::MAX_WEBHOOKS_PER_TENANT);
    let listed = app.get("/v1/webhooks").await;
    assert_eq!(
        listed.body["webhooks"].as_array().unwrap().len() as i64,
        loupe::store::MAX_WEBHOOKS_PER_TENANT
    );
    Arc::try_unwrap(app).ok().unwrap().finish().await;
}

async fn an_endpoint_far_behind_drops_its_oldest_deliveries(app: TestApp) {
    let hook = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://example.com/hook", "kinds": ["thread.created"]}),
        )
        .await;
    let hook_id = hook.body["id"].as_str().unwrap().to_owned();
    let extra = 50;
    let total = loupe::store::MAX_UNSENT_PER_ENDPOINT + extra;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
         INSERT INTO webhook_deliveries (tenant_id, endpoint_id, kind, thread_id, data, \
         created_at, next_attempt_at) \
         SELECT 'default', $2, 'thread.created', 't' || i, '{}', 0, 0 FROM n",
    )
    .bind(total)
    .bind(&hook_id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(app.store.drop_backlogs().await.unwrap(), extra as u64);
    let dropped = app
        .get(&format!(
            "/v1/webhooks/{hook_id}/deliveries?state=failed&limit=500"
        ))
        .await;
    let dropped = dropped.body["deliveries"].as_array().unwrap().clone();
    // The oldest went, and say why.
    let threads: Vec<&str> = dropped
        .iter()
        .map(|d| d["thread_id"].as_str().unwrap())
        .collect();
    let oldest: Vec<String> = (1..=extra).map(|i| format!("t{i}")).collect();
    assert_eq!(threads, oldest);
    assert!(dropped[0]["last_error"]
        .as_str()
        .unwrap()
        .starts_with("dropped"));
    let unsent: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM webhook_deliveries WHERE state IN ('pending', 'sending')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(unsent, loupe::store::MAX_UNSENT_PER_ENDPOINT);
    assert_eq!(app.store.drop_backlogs().await.unwrap(), 0);
    pool.close().await;
    app.finish().await;
}

/// The sender reaches an endpoint's unsent deliveries through an index, never by reading the
/// outbox through (a claim that did cost the backlog's square on SQLite's one writer).
async fn the_sender_reaches_unsent_deliveries_by_index(app: TestApp) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    for (name, sql, first, second) in [
        ("due endpoints", loupe::store::DUE_ENDPOINTS_SQL, "0", "10"),
        (
            "head delivery",
            loupe::store::HEAD_DELIVERY_SQL,
            "'x'",
            "'y'",
        ),
    ] {
        let sql = sql.replace("$1", first).replace("$2", second);
        let plan: Vec<String> = match app.backend {
            crate::common::Backend::Sqlite => {
                let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                rows.iter()
                    .map(|row| sqlx::Row::try_get::<String, _>(row, "detail").unwrap())
                    .collect()
            }
            crate::common::Backend::Postgres => {
                // With sequential scans priced out, a plan that still reads the table through
                // has no index to use.
                let mut conn = pool.acquire().await.unwrap();
                sqlx::query("SET enable_seqscan = off")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                sqlx::query_scalar(&format!("EXPLAIN {sql}"))
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap()
            }
        };
        let read_through = plan.iter().any(|line| {
            let line = line.to_lowercase();
            let sqlite_scan = line.starts_with("scan")
                && (line.contains("webhook_deliveries") || line.starts_with("scan d"))
                && !line.contains("using");
            sqlite_scan || line.contains("seq scan on webhook_deliveries")
        });
        assert!(!read_through, "{name} reads the outbox through: {plan:?}");
    }
    pool.close().await;
    app.finish().await;
}

/// A proxy named in the environment is not used: it would resolve endpoint names itself, past
/// the address policy (a name resolving to a private address would be reached through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_in_the_environment_is_not_used() {
    use crate::drills::{client, free_port, wait_for, Service};
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let reached = Arc::new(AtomicU32::new(0));
    tokio::spawn({
        let reached = reached.clone();
        async move {
            while let Ok((connection, _)) = proxy.accept().await {
                reached.fetch_add(1, Ordering::SeqCst);
                drop(connection);
            }
        }
    });
    let dir = std::env::temp_dir().join(format!("loupe-proxy-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let database_url = format!("sqlite://{}", dir.join("proxy.db").display());
    let env = [
        ("HTTP_PROXY", proxy_url.as_str()),
        ("HTTPS_PROXY", proxy_url.as_str()),
        ("ALL_PROXY", proxy_url.as_str()),
        ("http_proxy", proxy_url.as_str()),
        ("https_proxy", proxy_url.as_str()),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ];
    let service = Service::start(free_port(), &database_url, &env, &dir.join("loupe.log")).await;
    let base = service.base.clone();
    let http = client();
    let hook: Value = http
        .post(format!("{base}/v1/webhooks"))
        .json(&json!({"url": "http://internal.example.com/admin", "kinds": ["thread.created"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hook_id = hook["id"].as_str().expect("registered").to_owned();
    http.post(format!("{base}/v1/threads"))
        .json(&json!({"id": "t"}))
        .send()
        .await
        .unwrap();
    // The attempt is made (and fails: the name is not resolved here, or not reached).
    wait_for("an attempt", || {
        let (http, url) = (
            http.clone(),
            format!("{base}/v1/webhooks/{hook_id}/deliveries"),
        );
        async move {
            let page: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            page["deliveries"][0]["attempts"].as_i64().unwrap_or(0) >= 1
                && page["deliveries"][0]["state"] != "sending"
        }
    })
    .await;
    assert_eq!(reached.load(Ordering::SeqCst), 0, "the proxy was used");
    service.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A name that does not resolve fails with the one reason a name resolving only to private
/// addresses fails with (`webhooks::tests` checks that one): `last_error` does not tell a tenant
/// which internal names exist.
async fn a_name_that_does_not_resolve_shows_the_one_generic_reason(app: TestApp) {
    let hook = register(
        &app,
        "http://no-such-host.invalid/hook",
        json!(["thread.created"]),
    )
    .await;
    app.post("/v1/threads", json!({"id": "t"})).await;
    let strict = WebhookConfig::DEFAULT;
    let client = loupe::webhooks::client(&strict);
    let sent = deliver_due(&app.store, &client, &strict, now_ms())
        .await
        .unwrap();
    assert_eq!(sent, 1);
    let page = app
        .get(&format!(
            "/v1/webhooks/{}/deliveries",
            hook["id"].as_str().unwrap()
        ))
        .await;
    let delivery = &page.body["deliveries"][0];
    assert_eq!(delivery["attempts"], 1, "{delivery}");
    assert_eq!(
        delivery["last_error"],
        loupe::webhooks::ADDRESS_REFUSED,
        "{delivery}"
    );
    app.finish().await;
}

/// Ended deliveries (delivered, failed, dropped) are bounded per endpoint, however young: the
/// newest [`loupe::store::MAX_ENDED_PER_ENDPOINT`] stay, older ones go in the sender's
/// housekeeping; unsent ones and other endpoints' are left alone.
async fn ended_deliveries_are_bounded_per_endpoint(app: TestApp) {
    let mut hooks = Vec::new();
    for url in ["https://example.com/busy", "https://example.com/quiet"] {
        let hook = register(&app, url, json!(["thread.created"])).await;
        hooks.push(hook["id"].as_str().unwrap().to_owned());
    }
    let extra = 50;
    let cap = loupe::store::MAX_ENDED_PER_ENDPOINT;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let insert = |endpoint: String, count: i64, state: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
                 INSERT INTO webhook_deliveries (tenant_id, endpoint_id, kind, thread_id, data, \
                 created_at, next_attempt_at, state, attempts) \
                 SELECT 'default', $2, 'thread.created', 't' || i, '{}', $3, 0, $4, 1 FROM n",
            )
            .bind(count)
            .bind(endpoint)
            .bind(now_ms())
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    // Young (sent just now): the age bound keeps them all.
    insert(hooks[0].clone(), cap / 2, "failed").await;
    insert(hooks[0].clone(), cap / 2 + extra, "delivered").await;
    insert(hooks[0].clone(), 20, "pending").await;
    insert(hooks[1].clone(), 30, "delivered").await;
    let count = |endpoint: String, states: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT COUNT(*) FROM webhook_deliveries WHERE endpoint_id = $1 \
                 AND state IN ({states})"
            ))
            .bind(endpoint)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let ended = "'delivered', 'failed'";
    assert_eq!(count(hooks[0].clone(), ended).await, cap + extra);
    let first_inserted: i64 = sqlx::query_scalar(
        "SELECT MIN(delivery_id) FROM webhook_deliveries WHERE endpoint_id = $1",
    )
    .bind(&hooks[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    let week_ago = now_ms() - 7 * 24 * 3_600 * 1_000;
    app.store.prune_deliveries(week_ago).await.unwrap();
    assert_eq!(count(hooks[0].clone(), ended).await, cap);
    assert_eq!(count(hooks[0].clone(), "'pending'").await, 20);
    assert_eq!(count(hooks[1].clone(), ended).await, 30);
    // The oldest went, and only they.
    let oldest_kept: i64 = sqlx::query_scalar(
        "SELECT MIN(delivery_id) FROM webhook_deliveries WHERE endpoint_id = $1 \
         AND state IN ('delivered', 'failed')",
    )
    .bind(&hooks[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(oldest_kept, first_inserted + extra);
    // The listing shows the bound too.
    let listed = app
        .get(&format!(
            "/v1/webhooks/{}/deliveries?state=failed&limit=1",
            hooks[0]
        ))
        .await;
    assert_eq!(
        listed.body["deliveries"][0]["id"],
        format!("whd_{oldest_kept}")
    );
    app.store.prune_deliveries(week_ago).await.unwrap();
    assert_eq!(count(hooks[0].clone(), ended).await, cap);
    pool.close().await;
    app.finish().await;
}
