//! The store conformance suite: every case runs on SQLite and on PostgreSQL, through the HTTP API.

use crate::common::{assistant, user, Backend, TestApp};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use loupe::http::Limits;
use serde_json::{json, Value};

on_both_backends!(
    threads_are_created_read_listed_and_deleted,
    thread_ids_are_unique_and_checked,
    appends_get_dense_seqs_and_page_back_as_stored,
    stored_messages_are_lossless,
    a_resent_batch_is_an_idempotent_replay,
    a_reused_uuid_with_other_content_conflicts,
    a_partly_stored_batch_conflicts_and_writes_nothing,
    compare_and_append_rejects_a_stale_writer,
    an_invalid_batch_writes_nothing,
    bad_requests_get_problem_responses,
    deleting_a_thread_removes_its_messages,
    concurrent_writers_get_dense_unique_seqs,
    concurrent_compare_and_append_has_one_winner,
    probes_answer_and_every_response_carries_a_request_id,
);

fn seqs(messages: &Value) -> Vec<i64> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect()
}

async fn threads_are_created_read_listed_and_deleted(app: TestApp) {
    let created = app
        .post(
            "/v1/threads",
            json!({"id": "t-1", "metadata": {"user": "ana", "n": 1}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.body["id"], "t-1");
    assert_eq!(created.body["message_count"], 0);

    let generated = app.post("/v1/threads", json!({})).await;
    assert_eq!(generated.status, StatusCode::CREATED);
    let generated_id = generated.body["id"].as_str().unwrap().to_owned();
    assert!(generated_id.starts_with("thr_"));
    app.thread("t-3").await;

    let read = app.get("/v1/threads/t-1").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body["metadata"], json!({"user": "ana", "n": 1}));

    // Page through all three, two at a time, oldest first.
    let first = app.get("/v1/threads?limit=2").await;
    assert_eq!(first.status, StatusCode::OK);
    let ids: Vec<&str> = first.body["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t-1", generated_id.as_str()]);
    let cursor = first.body["next_cursor"].as_str().unwrap();
    let second = app
        .get(&format!("/v1/threads?limit=2&cursor={cursor}"))
        .await;
    let ids: Vec<&str> = second.body["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t-3"]);
    assert!(second.body.get("next_cursor").is_none());

    assert_eq!(
        app.delete("/v1/threads/t-1").await.status,
        StatusCode::NO_CONTENT
    );
    app.get("/v1/threads/t-1")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.delete("/v1/threads/t-1")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get("/v1/threads?cursor=garbage")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get("/v1/threads?limit=0")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.finish().await;
}

async fn thread_ids_are_unique_and_checked(app: TestApp) {
    app.thread("dup").await;
    app.post("/v1/threads", json!({"id": "dup"}))
        .await
        .assert_problem(StatusCode::CONFLICT, "thread-exists");
    let bad = app.post("/v1/threads", json!({"id": "has space"})).await;
    let problem = bad.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(problem["errors"][0]["field"], "id");
    app.post("/v1/threads", json!({"id": "x", "surprise": 1}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.finish().await;
}

async fn appends_get_dense_seqs_and_page_back_as_stored(app: TestApp) {
    let thread = app.thread("pages").await;
    let batch = json!({"messages": [
        user("u0", "Check the weather."),
        assistant("a1", "msg_A1", "Using weather tool..."),
        {"type": "user", "message": {"role": "user", "content": "no uuid given"}},
    ]});
    let appended = app
        .post(&format!("/v1/threads/{thread}/messages"), batch)
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    assert_eq!(seqs(&appended.body["messages"]), [0, 1, 2]);
    assert_eq!(appended.body["next_seq"], 3);
    assert_eq!(appended.body["replayed"], false);
    let generated = appended.body["messages"][2]["uuid"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(generated).is_ok());
    assert!(appended.body["messages"][0]["created_at"].is_string());

    let more = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [user("u3", "Great, thanks.")]}),
        )
        .await;
    assert_eq!(seqs(&more.body["messages"]), [3]);

    let all = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(seqs(&all.body["messages"]), [0, 1, 2, 3]);
    assert_eq!(
        all.body["messages"][1]["message"]["content"][0]["text"],
        "Using weather tool..."
    );
    assert!(all.body.get("next_after_seq").is_none());

    let page = app
        .get(&format!(
            "/v1/threads/{thread}/messages?after_seq=0&limit=2"
        ))
        .await;
    assert_eq!(seqs(&page.body["messages"]), [1, 2]);
    assert_eq!(page.body["next_after_seq"], 2);
    let rest = app
        .get(&format!(
            "/v1/threads/{thread}/messages?after_seq=2&limit=2"
        ))
        .await;
    assert_eq!(seqs(&rest.body["messages"]), [3]);
    assert_eq!(
        app.get(&format!("/v1/threads/{thread}")).await.body["message_count"],
        4
    );
    app.finish().await;
}

async fn stored_messages_are_lossless(app: TestApp) {
    let thread = app.thread("lossless").await;
    let entry = json!({
        "uuid": "x1", "type": "assistant", "is_meta": true,
        "message": {"role": "assistant", "id": "msg_1", "model": "claude-x", "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 3},
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
                {"type": "future_block", "nested": {"a": [1, 2, {"b": null}]}, "unicode": "ü ✓ 🚀"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "/x"}}
            ],
            "container": {"id": "c1"}},
        "session_id": "s-9", "parent_uuid": null,
        "created_at": "2026-01-02T03:04:05.678Z"
    });
    let appended = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [entry.clone()]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    let read = app.get(&format!("/v1/threads/{thread}/messages")).await;
    let mut stored = read.body["messages"][0].clone();
    assert_eq!(stored["seq"], 0);
    stored.as_object_mut().unwrap().remove("seq");
    assert_eq!(stored, entry);
    app.finish().await;
}

async fn a_resent_batch_is_an_idempotent_replay(app: TestApp) {
    let thread = app.thread("replay").await;
    let uri = format!("/v1/threads/{thread}/messages");
    let batch = json!({"messages": [user("r0", "hello"), assistant("r1", "msg_1", "hi")], "expected_next_seq": 0});
    let first = app.post(&uri, batch.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = app.post(&uri, batch).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["replayed"], true);
    assert_eq!(again.body["messages"], first.body["messages"]);
    assert_eq!(again.body["next_seq"], 2);
    let all = app.get(&uri).await;
    assert_eq!(seqs(&all.body["messages"]), [0, 1]);
    app.finish().await;
}

async fn a_reused_uuid_with_other_content_conflicts(app: TestApp) {
    let thread = app.thread("reuse").await;
    let uri = format!("/v1/threads/{thread}/messages");
    app.post(&uri, json!({"messages": [user("same", "first words")]}))
        .await;
    let conflict = app
        .post(&uri, json!({"messages": [user("same", "other words")]}))
        .await;
    let problem = conflict.assert_problem(StatusCode::CONFLICT, "uuid-conflict");
    assert_eq!(problem["uuid"], "same");
    assert_eq!(problem["seq"], 0);
    let all = app.get(&uri).await;
    assert_eq!(all.body["messages"][0]["message"]["content"], "first words");
    assert_eq!(all.body["next_seq"], 1);
    app.finish().await;
}

async fn a_partly_stored_batch_conflicts_and_writes_nothing(app: TestApp) {
    let thread = app.thread("partial").await;
    let uri = format!("/v1/threads/{thread}/messages");
    app.post(&uri, json!({"messages": [user("p0", "one")]}))
        .await;
    let partial = app
        .post(
            &uri,
            json!({"messages": [user("p0", "one"), user("p1", "two")]}),
        )
        .await;
    partial.assert_problem(StatusCode::CONFLICT, "partial-replay");
    assert_eq!(app.get(&uri).await.body["next_seq"], 1);
    app.finish().await;
}

async fn compare_and_append_rejects_a_stale_writer(app: TestApp) {
    let thread = app.thread("cas").await;
    let uri = format!("/v1/threads/{thread}/messages");
    let ok = app
        .post(
            &uri,
            json!({"messages": [user("c0", "a"), user("c1", "b")], "expected_next_seq": 0}),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED);
    let stale = app
        .post(
            &uri,
            json!({"messages": [user("c2", "c")], "expected_next_seq": 0}),
        )
        .await;
    let problem = stale.assert_problem(StatusCode::CONFLICT, "seq-conflict");
    assert_eq!(problem["next_seq"], 2);
    let fresh = app
        .post(
            &uri,
            json!({"messages": [user("c2", "c")], "expected_next_seq": 2}),
        )
        .await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert_eq!(seqs(&app.get(&uri).await.body["messages"]), [0, 1, 2]);
    app.finish().await;
}

async fn an_invalid_batch_writes_nothing(app: TestApp) {
    let thread = app.thread("atomic").await;
    let uri = format!("/v1/threads/{thread}/messages");
    // The second message is invalid: the first must not be stored either.
    let bad = app
        .post(&uri, json!({"messages": [user("ok", "fine"), {"type": "assistant", "message": {"role": "user", "content": "x"}}]}))
        .await;
    let problem = bad.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(problem["errors"][0]["field"], "messages[1].message.role");
    // A uuid twice in one batch.
    let twice = app
        .post(
            &uri,
            json!({"messages": [user("d", "one"), user("d", "two")]}),
        )
        .await;
    twice.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    // An unknown entry type is a data error, not a crash.
    let unknown = app
        .post(
            &uri,
            json!({"messages": [{"type": "robot", "message": {}}]}),
        )
        .await;
    unknown.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(&uri, json!({"messages": []}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let all = app.get(&uri).await;
    assert_eq!(all.body["messages"], json!([]));
    assert_eq!(all.body["next_seq"], 0);
    app.finish().await;
}

async fn bad_requests_get_problem_responses(app: TestApp) {
    let thread = app.thread("bad").await;
    let uri = format!("/v1/threads/{thread}/messages");
    let malformed = Request::builder()
        .method(Method::POST)
        .uri(&uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{\"messages\": [tru"))
        .unwrap();
    app.send(malformed)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    let no_type = Request::builder()
        .method(Method::POST)
        .uri(&uri)
        .body(Body::from("{}"))
        .unwrap();
    app.send(no_type)
        .await
        .assert_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type");
    app.post(&uri, json!({"messages": "nope"}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(
        "/v1/threads/missing/messages",
        json!({"messages": [user("m", "x")]}),
    )
    .await
    .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get("/v1/threads/missing/messages")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get(&format!("{uri}?after_seq=abc"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{uri}?limit=100000"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get("/v2/nothing")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.request(Method::PUT, "/v1/threads", None)
        .await
        .assert_problem(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
    // Deeply nested JSON is refused by the parser's depth limit, not by a stack overflow.
    let deep = format!(
        "{{\"messages\": [{{\"type\": \"progress\", \"data\": {}{}}}]}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let deep = Request::builder()
        .method(Method::POST)
        .uri(&uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(deep))
        .unwrap();
    let response = app.send(deep).await;
    assert!(response.status.is_client_error(), "{}", response.status);
    assert_eq!(app.get(&uri).await.body["next_seq"], 0);
    app.finish().await;
}

async fn deleting_a_thread_removes_its_messages(app: TestApp) {
    let thread = app.thread("gone").await;
    let uri = format!("/v1/threads/{thread}/messages");
    app.post(
        &uri,
        json!({"messages": [user("g0", "a"), user("g1", "b")]}),
    )
    .await;
    assert_eq!(
        app.delete(&format!("/v1/threads/{thread}")).await.status,
        StatusCode::NO_CONTENT
    );
    app.thread("gone").await;
    let all = app.get(&uri).await;
    assert_eq!(all.body["messages"], json!([]));
    // The old uuids are free again: nothing of the old thread is left.
    let again = app
        .post(&uri, json!({"messages": [user("g0", "different")]}))
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    app.finish().await;
}

async fn concurrent_writers_get_dense_unique_seqs(app: TestApp) {
    const WRITERS: usize = 6;
    const APPENDS: usize = 15;
    let thread = app.thread("race").await;
    let uri = format!("/v1/threads/{thread}/messages");
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let router = app.router.clone();
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..APPENDS {
                let body = json!({"messages": [user(&format!("w{writer}-{n}"), "x"), user(&format!("w{writer}-{n}b"), "y")]});
                let request = Request::builder()
                    .method(Method::POST)
                    .uri(&uri)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap();
                let response = tower::ServiceExt::oneshot(router.clone(), request).await.unwrap();
                assert_eq!(response.status(), StatusCode::CREATED);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let all = app.get(&format!("{uri}?limit=1000")).await;
    let messages = all.body["messages"].as_array().unwrap();
    let total = WRITERS * APPENDS * 2;
    assert_eq!(
        seqs(&all.body["messages"]),
        (0..total as i64).collect::<Vec<_>>()
    );
    let mut uuids: Vec<&str> = messages
        .iter()
        .map(|m| m["uuid"].as_str().unwrap())
        .collect();
    // Each batch stays contiguous: its two messages got neighbouring seqs.
    for pair in messages.chunks(2) {
        assert_eq!(
            format!("{}b", pair[0]["uuid"].as_str().unwrap()),
            pair[1]["uuid"].as_str().unwrap()
        );
    }
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), total);
    app.finish().await;
}

async fn concurrent_compare_and_append_has_one_winner(app: TestApp) {
    let thread = app.thread("cas-race").await;
    let uri = format!("/v1/threads/{thread}/messages");
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let router = app.router.clone();
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"messages": [user(&format!("cas{writer}"), "mine")], "expected_next_seq": 0});
            let request = Request::builder()
                .method(Method::POST)
                .uri(&uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            tower::ServiceExt::oneshot(router, request).await.unwrap().status()
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CONFLICT)
            .count(),
        7,
        "{statuses:?}"
    );
    assert_eq!(app.get(&uri).await.body["next_seq"], 1);
    app.finish().await;
}

async fn probes_answer_and_every_response_carries_a_request_id(app: TestApp) {
    let health = app.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body["status"], "ok");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    let backend = match app.backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    assert_eq!(ready.body["database"], backend);

    // A generated id on every response, errors included; a caller's own id is echoed.
    let generated = app.get("/v1/threads/none").await;
    let id = generated.headers.get("x-request-id").expect("a request id");
    assert!(uuid::Uuid::parse_str(id.to_str().unwrap()).is_ok());
    let other = app.get("/v1/threads/none").await;
    assert_ne!(other.headers.get("x-request-id"), Some(id));
    let request = Request::builder()
        .uri("/healthz")
        .header("x-request-id", "caller-chosen-42")
        .body(Body::empty())
        .unwrap();
    let echoed = app.send(request).await;
    assert_eq!(
        echoed.headers.get("x-request-id").unwrap(),
        "caller-chosen-42"
    );

    // Not ready once the database is gone.
    app.store.close().await;
    app.get("/readyz")
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    app.finish().await;
}

#[tokio::test]
async fn an_oversized_body_is_413_on_both_backends() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let app = TestApp::with_limits(
            backend,
            Limits {
                body_bytes: 1024,
                ..Limits::default()
            },
        )
        .await;
        let thread = app.thread("big").await;
        let big = json!({"messages": [user("big", &"x".repeat(4096))]});
        app.post(&format!("/v1/threads/{thread}/messages"), big)
            .await
            .assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
        assert_eq!(
            app.get(&format!("/v1/threads/{thread}")).await.body["message_count"],
            0
        );
        app.finish().await;
    }
}
