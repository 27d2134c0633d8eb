//! Forgetting reaches every copy: a delete leaves nothing under the thread whatever races it (its
//! settings, jobs and their payloads, cursors, cached contexts), and on SQLite nothing of its text
//! in the database file or its WAL.

use crate::common::{assistant, user, Backend, TestApp};
use axum::http::StatusCode;
use serde_json::{json, Value};

on_both_backends!(
    a_delete_racing_writes_under_its_thread_leaves_nothing_behind,
    a_deleted_thread_leaves_no_cached_context,
);

/// Tables keyed by a thread, and how many of their rows belong to no thread.
async fn orphans(app: &TestApp) -> Vec<(&'static str, i64)> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let mut counts = Vec::new();
    for table in [
        "messages",
        "cursors",
        "jobs",
        "thread_settings",
        "tree_nodes",
        "outlines",
    ] {
        let count: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {table} x WHERE x.thread_key IS NOT NULL AND NOT EXISTS \
             (SELECT 1 FROM threads t WHERE t.thread_key = x.thread_key)"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        counts.push((table, count));
    }
    pool.close().await;
    counts
}

fn conversation(count: usize, text: &str) -> Vec<Value> {
    (0..count)
        .map(|i| {
            let uuid = format!("m-{i}");
            if i % 2 == 0 {
                user(&uuid, &format!("{text} {i}"))
            } else {
                assistant(&uuid, &format!("msg_{i}"), &format!("answer {i}"))
            }
        })
        .collect()
}

/// Settings, a compaction carrying the tenant's instructions, a tree job and a cursor, each
/// written at the moment the thread is deleted. Whichever wins, the delete answers 204 and
/// nothing stays under the thread: no row, and no job readable through the API.
async fn a_delete_racing_writes_under_its_thread_leaves_nothing_behind(app: TestApp) {
    let mut job_ids = Vec::new();
    for round in 0..40 {
        let thread = app.thread(&format!("race-{round}")).await;
        app.append(&thread, conversation(6, "question")).await;
        let base = format!("/v1/threads/{thread}");
        let (settings_uri, compact_uri, cursor_uri) = (
            format!("{base}/settings"),
            format!("{base}/compact"),
            format!("{base}/cursors/memory/advance"),
        );
        let settings = app.request(
            axum::http::Method::PUT,
            &settings_uri,
            Some(json!({"auto_compact_tokens": 50_000, "outline": {"enabled": true}})),
        );
        let compact = app.post(
            &compact_uri,
            json!({"instructions": "SECRET-INSTRUCTIONS keep the invoice numbers"}),
        );
        // Several cursor writes, each holding its cursor and the thread while a delete holds the
        // thread and then its cursors: the two orders must never deadlock.
        let cursors = futures_util::future::join_all((0..3).map(|i| {
            let to = format!("m-{}", 3 + i);
            app.post(&cursor_uri, json!({"to": to, "expected": null}))
        }));
        let delete = app.delete(&base);
        let (settings, compact, cursors, delete) = tokio::join!(settings, compact, cursors, delete);
        assert_eq!(delete.status, StatusCode::NO_CONTENT, "{}", delete.body);
        let written = std::iter::once(("settings", &settings));
        for (what, response) in written.chain(cursors.iter().map(|c| ("cursor", c))) {
            // A cursor write that lost to another is a 409 conflict: the caller's state, not a
            // fault.
            assert!(
                [StatusCode::OK, StatusCode::NOT_FOUND, StatusCode::CONFLICT]
                    .contains(&response.status),
                "{what}: {} {}",
                response.status,
                response.body
            );
        }
        match compact.status {
            StatusCode::ACCEPTED | StatusCode::OK => {
                job_ids.push(compact.body["id"].as_str().unwrap().to_owned());
            }
            StatusCode::NOT_FOUND => {}
            other => panic!("compact: {other} {}", compact.body),
        }
    }
    assert_eq!(
        orphans(&app).await,
        [
            ("messages", 0),
            ("cursors", 0),
            ("jobs", 0),
            ("thread_settings", 0),
            ("tree_nodes", 0),
            ("outlines", 0),
        ]
    );
    for job in &job_ids {
        let response = app.get(&format!("/v1/jobs/{job}")).await;
        assert_eq!(response.status, StatusCode::NOT_FOUND, "{}", response.body);
    }
    app.finish().await;
}

/// A context read leaves the thread's normalized prefix in the process's cache; deleting the
/// thread drops it.
async fn a_deleted_thread_leaves_no_cached_context(app: TestApp) {
    let state = loupe::http::AppState::new(
        app.store.clone(),
        app.limits.clone(),
        loupe::http::AuthMode::Open,
    );
    let cache = state.context_cache.clone();
    let router = loupe::http::router(state);
    let send = |method: axum::http::Method, uri: String, body: Option<Value>| {
        let router = router.clone();
        async move {
            let mut request = axum::http::Request::builder().method(method).uri(uri);
            let body = match body {
                Some(body) => {
                    request = request.header("content-type", "application/json");
                    axum::body::Body::from(body.to_string())
                }
                None => axum::body::Body::empty(),
            };
            let response = tower::ServiceExt::oneshot(router, request.body(body).unwrap())
                .await
                .unwrap();
            response.status()
        }
    };
    use axum::http::Method;
    for thread in ["gone", "kept"] {
        let status = send(
            Method::POST,
            "/v1/threads".into(),
            Some(json!({"id": thread})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
        let messages = json!({"messages": conversation(8, "my password is HUNTER2")});
        let status = send(
            Method::POST,
            format!("/v1/threads/{thread}/messages"),
            Some(messages),
        );
        assert_eq!(status.await, StatusCode::CREATED);
        let status = send(Method::GET, format!("/v1/threads/{thread}/context"), None).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(cache.size().0, 2, "each read left a checkpoint");
    let status = send(Method::DELETE, "/v1/threads/gone".into(), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(cache.size().0, 1, "the deleted thread's checkpoint is gone");
    app.finish().await;
}

/// SQLite keeps deleted rows' bytes in free pages and old page images in its WAL. A delete
/// zeroes what it removes, and the WAL is emptied after it, so the text is nowhere in the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_threads_text_leaves_the_sqlite_file_and_its_wal() {
    let app = TestApp::new(Backend::Sqlite).await;
    const CANARY: &str = "CANARY-7f3a9-DELETED-TEXT";
    let thread = app.thread("canaries").await;
    app.append(&thread, conversation(40, CANARY)).await;
    app.append("canaries", vec![user("late", CANARY)]).await;
    let kept = app.thread("kept").await;
    app.append(&kept, conversation(4, "nothing to see")).await;
    let path = app
        .url
        .strip_prefix("sqlite://")
        .expect("a file database")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let files = [path.clone(), format!("{path}-wal")];
    let holds_canary = |file: &str| {
        std::fs::read(file).is_ok_and(|bytes| {
            bytes
                .windows(CANARY.len())
                .any(|window| window == CANARY.as_bytes())
        })
    };
    assert!(files.iter().any(|f| holds_canary(f)), "planted");
    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    // The WAL is emptied in the background once older readers are done: wait for it (a bound
    // on waiting, not a timing under test).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while files.iter().any(|f| holds_canary(f)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted text is still in {:?}",
            files.iter().filter(|f| holds_canary(f)).collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The other thread is whole.
    let page = app.get(&format!("/v1/threads/{kept}/messages")).await;
    assert_eq!(page.body["messages"].as_array().unwrap().len(), 4);
    app.finish().await;
}
