//! Retention (issue 38): expired threads leave lists at once and the retention job deletes them
//! whole, in batches, reporting each; a thread's own policy replaces its tenant's; an append
//! renews an idle thread; a trimming policy keeps only what follows the last compact boundary.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use loupe::jobs::retention::retention_job;
use loupe::jobs::{Clock, Runner, StepOutcome};
use serde_json::{json, Value};

use crate::common::{tool_rounds, user, Backend, TestApp};
use crate::webhooks::Receiver;

on_both_backends!(
    expired_threads_leave_lists_at_once_and_the_sweep_deletes_them_whole,
    a_threads_own_policy_replaces_its_tenants,
    an_append_renews_an_idle_thread,
    an_expired_thread_is_gone_from_every_read_before_the_sweep,
    an_append_does_not_bring_an_expired_thread_back,
    a_fork_takes_its_parents_own_policy_and_its_clock_starts_at_the_fork,
    the_sweep_works_in_batches,
    a_trim_keeps_only_what_follows_the_last_boundary,
    bad_policies_are_refused,
);

const HOUR_MS: i64 = 3_600_000;

async fn connect(app: &TestApp) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&app.url).await.unwrap()
}

/// Moves the thread's times `ms` into the past, as if it had been made and last changed then.
pub(crate) async fn age(app: &TestApp, thread: &str, ms: i64) {
    let pool = connect(app).await;
    let moved = sqlx::query(
        "UPDATE threads SET created_at = created_at - $1, updated_at = updated_at - $1 \
         WHERE thread_id = $2",
    )
    .bind(ms)
    .bind(thread)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(moved.rows_affected(), 1);
    pool.close().await;
}

async fn thread_key(app: &TestApp, thread: &str) -> String {
    let pool = connect(app).await;
    let key: String = sqlx::query_scalar("SELECT thread_key FROM threads WHERE thread_id = $1")
        .bind(thread)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    key
}

/// Rows left under `key` in every thread table.
/// Rows left under `key` in every table with a `thread_key` column, `threads` included: read
/// from the schema, so a table added later is checked too.
async fn rows_under(app: &TestApp, key: &str) -> Vec<(String, i64)> {
    let pool = connect(app).await;
    let tables: Vec<String> = match app.backend {
        Backend::Sqlite => sqlx::query_scalar(
            "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c \
             WHERE m.type = 'table' AND c.name = 'thread_key' ORDER BY m.name",
        ),
        Backend::Postgres => sqlx::query_scalar(
            "SELECT CAST(table_name AS TEXT) FROM information_schema.columns \
             WHERE column_name = 'thread_key' AND table_schema = current_schema() \
             ORDER BY table_name",
        ),
    }
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(tables.len() > 10, "{tables:?}");
    let mut left = Vec::new();
    for table in tables {
        let count: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {table} WHERE thread_key = $1"
        ))
        .bind(key)
        .fetch_one(&pool)
        .await
        .unwrap();
        if count > 0 {
            left.push((table, count));
        }
    }
    pool.close().await;
    left
}

fn runner(app: &TestApp) -> Runner {
    Runner::new(
        app.store.clone(),
        Arc::new(loupe::summarize::ExtractiveSummarizer::new()),
        loupe::jobs::JobsConfig::default(),
    )
}

/// Enqueues the retention job and runs jobs until none is left; returns the retention jobs'
/// results.
pub(crate) async fn sweep(app: &TestApp) -> Vec<Value> {
    app.store
        .enqueue_job(&retention_job(), chrono::Utc::now().timestamp_millis())
        .await
        .unwrap();
    let runner = runner(app);
    let mut results = Vec::new();
    for _ in 0..1_000 {
        match runner.step(Clock::System).await.unwrap() {
            StepOutcome::Idle => return results,
            StepOutcome::Succeeded { result, .. } => {
                if result.get("expired_threads").is_some() {
                    results.push(result);
                }
            }
            other => panic!("a job did not succeed: {other:?}"),
        }
    }
    panic!("the jobs never drained");
}

fn listed(list: &Value) -> Vec<String> {
    list["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn put(app: &TestApp, uri: &str, body: Value) -> crate::common::TestResponse {
    app.request(Method::PUT, uri, Some(body)).await
}

async fn expired_threads_leave_lists_at_once_and_the_sweep_deletes_them_whole(app: TestApp) {
    const CANARY: &str = "CANARY-RETENTION-5d1e";
    let app = {
        let limits = loupe::http::Limits {
            webhooks_allow_private: true,
            ..app.limits.clone()
        };
        app.reconfigure(limits, loupe::http::AuthMode::Open)
    };
    let receiver = Receiver::start(0, Duration::ZERO).await;
    app.post(
        "/v1/webhooks",
        json!({"url": receiver.url, "kinds": ["thread.expired", "thread.deleted"]}),
    )
    .await;
    for (thread, text) in [("old", CANARY), ("fresh", "nothing to see")] {
        app.post("/v1/threads", json!({"id": thread})).await;
        app.append(thread, tool_rounds(text, 0, 3, 4)).await;
        app.append(
            thread,
            vec![user(&format!("{thread}-said"), &format!("remember {text}"))],
        )
        .await;
    }
    // A cursor and settings: rows of other tables under the thread.
    let pending = app.get("/v1/threads/old/cursors/reader/pending").await;
    assert_eq!(pending.status, StatusCode::OK, "{}", pending.body);
    put(
        &app,
        "/v1/threads/old/settings",
        json!({"auto_compact_tokens": 0}),
    )
    .await;
    age(&app, "old", 2 * HOUR_MS).await;
    let key = thread_key(&app, "old").await;

    // No policy: both are kept.
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["old", "fresh"]);
    let policy = put(
        &app,
        "/v1/retention",
        json!({"delete_after_idle_seconds": 3600}),
    )
    .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.body);
    // Expired: gone from every list at once, before any sweep.
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["fresh"]);
    assert_eq!(
        listed(
            &app.get("/v1/threads?order=desc&include_total=true")
                .await
                .body
        ),
        ["fresh"]
    );
    assert_eq!(
        app.get("/v1/threads?include_total=true").await.body["total"],
        1
    );
    // Nor does a search across the tenant's threads find what it holds.
    let found = app.get(&format!("/v1/search?q={CANARY}")).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(found.body["hits"], json!([]), "{}", found.body);
    let fresh = app.get("/v1/search?q=nothing").await;
    assert!(
        !fresh.body["hits"].as_array().unwrap().is_empty(),
        "{}",
        fresh.body
    );
    // Nor is it found by its id: expired is gone, as deleted (its retention too).
    app.get("/v1/threads/old/retention")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    let retention = app.get("/v1/threads/fresh/retention").await;
    assert_eq!(retention.status, StatusCode::OK, "{}", retention.body);
    assert!(retention.body["own"].is_null());
    assert_eq!(
        retention.body["effective"]["delete_after_idle_seconds"],
        3600
    );
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(retention.body["expires_at"].clone()).unwrap();
    assert!(expires > chrono::Utc::now());

    let results = sweep(&app).await;
    assert_eq!(results[0]["expired_threads"], 1, "{results:?}");
    app.get("/v1/threads/old")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(rows_under(&app, &key).await, []);
    let fresh = app.get("/v1/threads/fresh/messages").await;
    assert_eq!(fresh.body["messages"].as_array().unwrap().len(), 13);
    // A second sweep finds nothing.
    assert_eq!(sweep(&app).await[0]["expired_threads"], 0);

    // Reported: expired, then deleted.
    let config = loupe::webhooks::WebhookConfig {
        allow_private: true,
        ..Default::default()
    };
    let client = loupe::webhooks::client(&config);
    // One delivery per endpoint at a time: send until none is left.
    let now = || chrono::Utc::now().timestamp_millis();
    while loupe::webhooks::deliver_due(&app.store, &client, &config, now())
        .await
        .unwrap()
        > 0
    {}
    let kinds: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(&r.body).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["thread.expired", "thread.deleted"]);

    // Nothing of the expired thread's text is left in the database.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = crate::erasure::stored_copies(&app, &[], &[CANARY.to_owned()]).await;
        if left.is_empty() {
            break;
        }
        // SQLite's WAL is emptied in the background: a bound on waiting, not a timing.
        assert!(std::time::Instant::now() < deadline, "left in {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.finish().await;
}

async fn a_threads_own_policy_replaces_its_tenants(app: TestApp) {
    for thread in ["kept", "short", "follows"] {
        app.post("/v1/threads", json!({"id": thread})).await;
        app.append(thread, vec![user(&format!("{thread}-0"), "hello")])
            .await;
        age(&app, thread, 2 * HOUR_MS).await;
    }
    // An absolute age shorter than the thread's.
    put(
        &app,
        "/v1/threads/short/retention",
        json!({"delete_after_seconds": 60}),
    )
    .await;
    // Its own policy keeps it for ever, whatever the tenant's (set before the tenant's policy
    // expires it: an expired thread is gone, and a policy no longer reaches it).
    let kept = put(&app, "/v1/threads/kept/retention", json!({})).await;
    assert_eq!(kept.status, StatusCode::OK, "{}", kept.body);
    assert!(kept.body["expires_at"].is_null());
    assert_eq!(
        kept.body["own"],
        json!({"delete_after_idle_seconds": null, "delete_after_seconds": null, "trim_before_last_boundary": false})
    );
    put(
        &app,
        "/v1/retention",
        json!({"delete_after_idle_seconds": 3600}),
    )
    .await;
    assert!(app.get("/v1/threads/kept/retention").await.body["expires_at"].is_null());
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["kept"]);
    assert_eq!(sweep(&app).await[0]["expired_threads"], 2);
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["kept"]);
    // Following the tenant's again: expired.
    let follows = app.delete("/v1/threads/kept/retention").await;
    assert_eq!(follows.status, StatusCode::OK, "{}", follows.body);
    assert!(follows.body["own"].is_null());
    assert_eq!(
        listed(&app.get("/v1/threads").await.body),
        Vec::<String>::new()
    );
    assert_eq!(sweep(&app).await[0]["expired_threads"], 1);
    app.finish().await;
}

async fn an_append_renews_an_idle_thread(app: TestApp) {
    app.post("/v1/threads", json!({"id": "t"})).await;
    // Idle for 50 minutes of its hour: not expired yet.
    age(&app, "t", 50 * 60_000).await;
    put(
        &app,
        "/v1/retention",
        json!({"delete_after_idle_seconds": 3600}),
    )
    .await;
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["t"]);
    let before = app.get("/v1/threads/t/retention").await.body["expires_at"].clone();
    // Renewed by an append: its hour starts again.
    app.append("t", vec![user("u", "back again")]).await;
    let after = app.get("/v1/threads/t/retention").await.body["expires_at"].clone();
    let at = |value: Value| serde_json::from_value::<chrono::DateTime<chrono::Utc>>(value).unwrap();
    assert!(
        at(after.clone()) - at(before.clone()) >= chrono::Duration::minutes(49),
        "{before} then {after}"
    );
    // Past the first hour, within the second: it stays.
    age(&app, "t", 20 * 60_000).await;
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["t"]);
    assert_eq!(sweep(&app).await[0]["expired_threads"], 0);
    assert_eq!(app.get("/v1/threads/t").await.status, StatusCode::OK);
    // The store's own check, as the job makes it: not expired now.
    let now = chrono::Utc::now().timestamp_millis();
    assert!(!app
        .store
        .expire_thread(
            &loupe::store::TenantId("default".into()),
            &loupe::store::ThreadId::new("t".to_owned()),
            now
        )
        .await
        .unwrap());
    app.finish().await;
}

/// Every route that reads (or writes under) one thread, as a method, a path under
/// `/v1/threads/{id}` and a body.
fn thread_routes() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (Method::GET, "", None),
        (Method::PATCH, "", Some(json!({"metadata": {"k": "v"}}))),
        (Method::GET, "/messages", None),
        (Method::GET, "/context", None),
        (Method::GET, "/context?view=outline", None),
        (Method::GET, "/rounds", None),
        (Method::GET, "/outline", None),
        (Method::POST, "/zoom", Some(json!({"id": 0, "n": 1}))),
        (Method::GET, "/ledger", None),
        (Method::GET, "/economics", None),
        (Method::GET, "/export", None),
        (Method::GET, "/search?q=CANARY", None),
        (Method::GET, "/cursors/reader/pending", None),
        (Method::GET, "/cursors/reader", None),
        (Method::GET, "/events", None),
        (Method::GET, "/settings", None),
        (
            Method::PUT,
            "/settings",
            Some(json!({"auto_compact_tokens": 0})),
        ),
        (Method::GET, "/retention", None),
        (Method::PUT, "/retention", Some(json!({}))),
        (Method::GET, "/erasures", None),
        (Method::POST, "/fork", Some(json!({"id": "copy"}))),
    ]
}

/// An expired thread answers every read as a deleted one does, before any sweep: the policy,
/// not the sweep, says it is gone.
async fn an_expired_thread_is_gone_from_every_read_before_the_sweep(app: TestApp) {
    const CANARY: &str = "CANARY";
    app.post("/v1/threads", json!({"id": "gone"})).await;
    app.append("gone", tool_rounds(CANARY, 0, 3, 4)).await;
    app.append("gone", vec![user("said", &format!("remember {CANARY}"))])
        .await;
    let pending = app.get("/v1/threads/gone/cursors/reader/pending").await;
    assert_eq!(pending.status, StatusCode::OK, "{}", pending.body);
    // Live, every route answers (none of them is a 404 for another reason).
    for (method, path, body) in thread_routes() {
        if method != Method::GET {
            continue;
        }
        let uri = format!("/v1/threads/gone{path}");
        if path == "/events" {
            continue;
        }
        let live = app.request(method.clone(), &uri, body).await;
        assert_ne!(live.status, StatusCode::NOT_FOUND, "{uri}: {}", live.body);
    }
    age(&app, "gone", 2 * HOUR_MS).await;
    put(
        &app,
        "/v1/retention",
        json!({"delete_after_idle_seconds": 3600}),
    )
    .await;

    // Exactly as for a thread that never was (or was deleted): the same status and problem.
    let mut served = Vec::new();
    for (method, path, body) in thread_routes() {
        let never = app
            .request(
                method.clone(),
                &format!("/v1/threads/never{path}"),
                body.clone(),
            )
            .await;
        never.assert_problem(StatusCode::NOT_FOUND, "not-found");
        let uri = format!("/v1/threads/gone{path}");
        let expired = app.request(method.clone(), &uri, body).await;
        let shape = |r: &crate::common::TestResponse| {
            (r.status, r.body["type"].clone(), r.body["title"].clone())
        };
        if shape(&expired) != shape(&never) {
            served.push(format!("{method} {uri}: {}", expired.status));
        }
    }
    assert!(served.is_empty(), "an expired thread served {served:#?}");
    // Nothing was forked, and nothing was written under it: the sweep finds it as it was.
    app.get("/v1/threads/copy")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(sweep(&app).await[0]["expired_threads"], 1);
    app.finish().await;
}

/// An append to an expired thread is refused as for a deleted one: it neither renews the
/// thread nor adds to what it held, and the sweep deletes it.
async fn an_append_does_not_bring_an_expired_thread_back(app: TestApp) {
    app.post("/v1/threads", json!({"id": "t"})).await;
    app.append("t", vec![user("u0", "before")]).await;
    // Its own policy, and its tenant's: either expires it.
    put(
        &app,
        "/v1/threads/t/retention",
        json!({"delete_after_seconds": 3600}),
    )
    .await;
    age(&app, "t", 2 * HOUR_MS).await;
    let pool = connect(&app).await;
    let times = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT updated_at, next_seq FROM threads WHERE thread_id = 't'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = times().await;
    for _ in 0..2 {
        let append = app
            .post(
                "/v1/threads/t/messages",
                json!({"messages": [user("u1", "after")]}),
            )
            .await;
        append.assert_problem(StatusCode::NOT_FOUND, "not-found");
    }
    let compare = app
        .post(
            "/v1/threads/t/messages",
            json!({"messages": [user("u2", "after")], "expected_next_seq": 1}),
        )
        .await;
    compare.assert_problem(StatusCode::NOT_FOUND, "not-found");
    // Not renewed, nothing added.
    assert_eq!(times().await, before);
    pool.close().await;
    assert!(listed(&app.get("/v1/threads").await.body).is_empty());
    // Gone, before any sweep: its id is free for a new thread, which holds none of the old one
    // (the old one is expired then, as the sweep would).
    let created = app.post("/v1/threads", json!({"id": "t"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let messages = app.get("/v1/threads/t/messages").await;
    assert_eq!(messages.body["messages"], json!([]), "{}", messages.body);
    app.append("t", vec![user("u1", "a new thread")]).await;
    assert_eq!(sweep(&app).await[0]["expired_threads"], 0);
    assert_eq!(listed(&app.get("/v1/threads").await.body), ["t"]);
    app.finish().await;
}

/// A fork takes its parent's own policy (none: it follows the tenant's, as every thread), and
/// its times start at the fork; a fork of an expired thread is not made.
async fn a_fork_takes_its_parents_own_policy_and_its_clock_starts_at_the_fork(app: TestApp) {
    for thread in ["own", "follows"] {
        app.post("/v1/threads", json!({"id": thread})).await;
        app.append(thread, vec![user(&format!("{thread}-0"), "hello")])
            .await;
    }
    let own = json!({"delete_after_idle_seconds": 7200, "delete_after_seconds": null, "trim_before_last_boundary": true});
    put(&app, "/v1/threads/own/retention", own.clone()).await;
    put(&app, "/v1/retention", json!({"delete_after_seconds": 5400})).await;
    // Both parents are 80 minutes old: within either policy.
    age(&app, "own", 80 * 60_000).await;
    age(&app, "follows", 80 * 60_000).await;
    for parent in ["own", "follows"] {
        let fork = app
            .post(
                &format!("/v1/threads/{parent}/fork"),
                json!({"id": format!("{parent}-fork")}),
            )
            .await;
        assert_eq!(fork.status, StatusCode::CREATED, "{}", fork.body);
    }
    let fork = app.get("/v1/threads/own-fork/retention").await;
    assert_eq!(fork.status, StatusCode::OK, "{}", fork.body);
    assert_eq!(fork.body["own"], own, "{}", fork.body);
    assert_eq!(fork.body["effective"], own, "{}", fork.body);
    let follows = app.get("/v1/threads/follows-fork/retention").await;
    assert!(follows.body["own"].is_null(), "{}", follows.body);
    assert_eq!(follows.body["effective"]["delete_after_seconds"], 5400);
    // Another 20 minutes: the parent that follows its tenant is past 90 minutes and expired;
    // its fork, whose clock started at the fork, is not.
    age(&app, "own", 20 * 60_000).await;
    age(&app, "follows", 20 * 60_000).await;
    age(&app, "own-fork", 20 * 60_000).await;
    age(&app, "follows-fork", 20 * 60_000).await;
    app.get("/v1/threads/follows")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(
        app.get("/v1/threads/follows-fork").await.status,
        StatusCode::OK
    );
    // A fork of an expired thread is not made.
    app.post("/v1/threads/follows/fork", json!({"id": "late"}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get("/v1/threads/late")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    // The copied policy expires the fork by its own idle time.
    age(&app, "own-fork", 2 * HOUR_MS).await;
    app.get("/v1/threads/own-fork/messages")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    assert_eq!(app.get("/v1/threads/own").await.status, StatusCode::OK);
    app.finish().await;
}

async fn the_sweep_works_in_batches(app: TestApp) {
    let total = loupe::jobs::retention::RETENTION_BATCH as usize * 2 + 17;
    for i in 0..total {
        app.post("/v1/threads", json!({"id": format!("t{i}")}))
            .await;
    }
    put(&app, "/v1/retention", json!({"delete_after_seconds": 1})).await;
    let pool = connect(&app).await;
    sqlx::query("UPDATE threads SET created_at = created_at - 10000")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let results = sweep(&app).await;
    let expired: Vec<i64> = results
        .iter()
        .map(|r| r["expired_threads"].as_i64().unwrap())
        .collect();
    assert_eq!(expired, [100, 100, 17], "{results:?}");
    assert_eq!(results[0]["more"], true);
    assert_eq!(results[2]["more"], false);
    let pool = connect(&app).await;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM threads")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(left, 0);
    app.finish().await;
}

async fn a_trim_keeps_only_what_follows_the_last_boundary(app: TestApp) {
    const OLD: &str = "NEEDLEBEFOREBOUNDARY";
    app.post("/v1/threads", json!({"id": "t"})).await;
    app.append(
        "t",
        vec![user("needle", &format!("Remember {OLD} for later."))],
    )
    .await;
    app.append("t", tool_rounds("q", 0, 6, 3)).await;
    let compact = app
        .post("/v1/threads/t/compact", json!({"keep_recent_rounds": 1}))
        .await;
    assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
    let compaction = runner(&app).step(Clock::System).await.unwrap();
    assert!(
        matches!(compaction, StepOutcome::Succeeded { .. }),
        "{compaction:?}"
    );
    app.append("t", vec![user("after", "a question after the boundary")])
        .await;
    let context_before = app.get("/v1/threads/t/context?provider=anthropic").await;
    assert_eq!(
        context_before.status,
        StatusCode::OK,
        "{}",
        context_before.body
    );
    let found = app.get(&format!("/v1/threads/t/search?q={OLD}")).await;
    assert!(
        !found.body["hits"].as_array().unwrap().is_empty(),
        "{}",
        found.body
    );

    let set = put(
        &app,
        "/v1/threads/t/retention",
        json!({"trim_before_last_boundary": true}),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    let results = sweep(&app).await;
    assert_eq!(results[0]["trimmed_threads"], 1, "{results:?}");
    let trimmed = results[0]["trimmed_entries"].as_i64().unwrap();
    assert!(trimmed > 0);

    // Every entry before the window is a tombstone; the window is whole.
    let bounds = app
        .store
        .window_bounds(
            &loupe::store::TenantId("default".to_owned()),
            &loupe::store::ThreadId::new("t".to_owned()),
            None,
        )
        .await
        .unwrap();
    let window_start = bounds.start_seq as usize;
    assert!(bounds.boundary.is_some() && window_start > 0);
    let messages = app.get("/v1/threads/t/messages?limit=1000").await;
    let entries = messages.body["messages"].as_array().unwrap();
    for entry in &entries[..window_start] {
        assert!(entry.get("erased").is_some(), "not trimmed: {entry}");
    }
    for entry in &entries[window_start..] {
        assert!(
            entry.get("erased").is_none(),
            "trimmed from the window: {entry}"
        );
    }
    assert_eq!(window_start as i64, trimmed);
    // The context the model reads is the same.
    let context_after = app.get("/v1/threads/t/context?provider=anthropic").await;
    assert_eq!(
        context_after.body["messages"],
        context_before.body["messages"]
    );
    // Search no longer finds the trimmed text (the summary may quote it, and stays).
    let found = app.get(&format!("/v1/threads/t/search?q={OLD}")).await;
    let hits = found.body["hits"].as_array().unwrap();
    assert!(
        hits.iter()
            .filter(|hit| hit["kind"] != "line")
            .all(|hit| hit["seq"].as_i64().unwrap() >= window_start as i64),
        "{}",
        found.body
    );
    // The receipt, and the event a follower sees.
    let receipts = app.get("/v1/threads/t/erasures").await;
    assert_eq!(
        receipts.body["erasures"][0]["reason"],
        loupe::jobs::erasure::TRIM_REASON
    );
    // The files are scrubbed after it, as after any erasure.
    crate::erasure::stored_copies(&app, &["t"], &[]).await;
    let pool = connect(&app).await;
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM thread_events ORDER BY event_seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(kinds, ["trimmed"]);
    // Nothing changed since: the next sweep passes it over.
    assert_eq!(sweep(&app).await[0]["trimmed_threads"], 0);
    app.finish().await;
}

async fn bad_policies_are_refused(app: TestApp) {
    for body in [
        json!({"delete_after_idle_seconds": 0}),
        json!({"delete_after_seconds": 4_000_000_000_u64}),
    ] {
        put(&app, "/v1/retention", body)
            .await
            .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    }
    let unknown = put(&app, "/v1/retention", json!({"keep": "forever"})).await;
    assert!(unknown.status.is_client_error());
    put(&app, "/v1/threads/nope/retention", json!({}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

/// Metadata updates racing deletes (whose WAL scrub holds SQLite's write lock a moment) wait
/// their turn: the update takes the write lock first, never a read's snapshot that a write
/// makes stale, which failed at once as busy (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_updates_racing_deletes_never_fault_on_sqlite() {
    let app = Arc::new(TestApp::new(Backend::Sqlite).await);
    app.post("/v1/threads", json!({"id": "kept"})).await;
    let deleter = {
        let app = app.clone();
        tokio::spawn(async move {
            for i in 0..60 {
                let id = format!("d{i}");
                app.post("/v1/threads", json!({"id": id})).await;
                app.append(&id, vec![user(&format!("u{i}"), "to delete")])
                    .await;
                let deleted = app.delete(&format!("/v1/threads/{id}")).await;
                assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
            }
        })
    };
    let patchers: Vec<_> = (0..2)
        .map(|p| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..150 {
                    let patched = app
                        .request(
                            Method::PATCH,
                            "/v1/threads/kept",
                            Some(json!({"metadata": {format!("p{p}"): i}})),
                        )
                        .await;
                    statuses.push(patched.status);
                }
                statuses
            })
        })
        .collect();
    deleter.await.unwrap();
    for patcher in patchers {
        let statuses = patcher.await.unwrap();
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "{:?}",
            statuses
                .iter()
                .filter(|s| **s != StatusCode::OK)
                .collect::<Vec<_>>()
        );
    }
    Arc::try_unwrap(app).ok().unwrap().finish().await;
}
