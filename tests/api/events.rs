//! Following a thread live (issue 38): `GET /v1/threads/{id}/events` as Server-Sent Events,
//! resumed with `Last-Event-ID` from another process serving the same database (a second store
//! and router, as after a restart), with nothing missed and nothing twice.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{user, TestApp};

on_both_backends!(
    a_stream_resumes_in_another_process_with_nothing_missed_or_twice,
    bad_stream_requests_are_refused,
    more_events_than_a_page_before_an_entry_are_all_sent,
    a_thread_recreated_under_its_id_is_another_stream,
    a_tenant_holds_a_bounded_number_of_streams,
    outline_moves_and_expiry_are_streamed,
    what_a_stream_read_ahead_is_not_sent_after_an_erasure_or_delete_answered,
);

/// On PostgreSQL another process's write reaches this one's followers through `NOTIFY`, not
/// only through their periodic read: a follower of one store is signalled by an append made
/// through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_append_signals_followers_through_notify() {
    let app = TestApp::new(crate::common::Backend::Postgres).await;
    app.thread("t").await;
    let tenant = loupe::store::TenantId("default".to_owned());
    let thread = loupe::store::ThreadId::new("t".to_owned());
    let other = loupe::store::Store::connect(&loupe::store::StoreOptions::new(&app.url))
        .await
        .unwrap();
    let mut followed = other.follow(&tenant, &thread);
    // The listener of `other` starts with its first follower; appends until one is heard (a
    // `NOTIFY` sent before the listener listens is not delivered).
    let heard = async {
        for i in 0.. {
            app.append("t", vec![user(&format!("n{i}"), "hello")]).await;
            if tokio::time::timeout(Duration::from_millis(500), followed.changed())
                .await
                .is_ok()
            {
                return i;
            }
        }
        unreachable!()
    };
    let tries = tokio::time::timeout(Duration::from_secs(30), heard)
        .await
        .expect("a change heard within 30 s");
    assert!(tries < 60, "{tries}");
    // And another thread's change is not this one's.
    app.thread("u").await;
    followed.borrow_and_update();
    app.append("u", vec![user("x", "elsewhere")]).await;
    let crossed = tokio::time::timeout(Duration::from_secs(2), followed.changed()).await;
    assert!(crossed.is_err(), "signalled by another thread's append");
    drop(followed);
    other.close().await;
    app.finish().await;
}

/// One event as received.
#[derive(Debug, Clone, PartialEq)]
struct Received {
    event: String,
    id: Option<String>,
    data: Value,
}

/// A response's event stream, read an event at a time.
struct Events {
    body: Body,
    buffer: String,
}

async fn open(router: &Router, uri: &str, last_id: Option<&str>) -> Events {
    let mut request = Request::get(uri);
    if let Some(id) = last_id {
        request = request.header("last-event-id", id);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    Events {
        body: response.into_body(),
        buffer: String::new(),
    }
}

impl Events {
    /// The next event; `None` when the stream ended. Waits at most 30 s (a bound on a hang,
    /// not a timing under test).
    async fn next(&mut self) -> Option<Received> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut received = Received {
                    event: "message".to_owned(),
                    id: None,
                    data: Value::Null,
                };
                let mut comment_only = true;
                for line in block.lines() {
                    let Some((field, value)) = line.split_once(':') else {
                        continue;
                    };
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => received.event = value.to_owned(),
                        "id" => received.id = Some(value.to_owned()),
                        "data" => received.data = serde_json::from_str(value).unwrap(),
                        _ => continue,
                    }
                    comment_only = false;
                }
                if comment_only {
                    continue;
                }
                return Some(received);
            }
            let frame = tokio::time::timeout(Duration::from_secs(30), self.body.frame())
                .await
                .expect("an event within 30 s");
            match frame {
                None => return None,
                Some(frame) => {
                    if let Ok(data) = frame.unwrap().into_data() {
                        self.buffer.push_str(&String::from_utf8_lossy(&data));
                    }
                }
            }
        }
    }

    async fn take(&mut self, n: usize) -> Vec<Received> {
        let mut all = Vec::new();
        for _ in 0..n {
            all.push(self.next().await.expect("the stream goes on"));
        }
        all
    }
}

/// The events as `kind id`, for comparing sequences.
fn shape(events: &[Received]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{} {}", e.event, e.id.as_deref().unwrap_or("-")))
        .collect()
}

async fn a_stream_resumes_in_another_process_with_nothing_missed_or_twice(app: TestApp) {
    app.thread("t").await;
    let first: Vec<Value> = (0..5)
        .map(|i| user(&format!("u{i}"), &format!("message {i}")))
        .collect();
    app.append("t", first).await;
    let mut stream = open(&app.router, "/v1/threads/t/events?after_seq=-1", None).await;
    let seen = stream.take(5).await;
    assert_eq!(
        shape(&seen),
        ["entry 0", "entry 1", "entry 2", "entry 3", "entry 4"]
    );
    assert_eq!(seen[2].data["uuid"], "u2");
    assert_eq!(seen[2].data["seq"], 2);
    drop(stream);

    // While no one follows: an erasure, then three more entries.
    let erased = app
        .post("/v1/threads/t/erasures", json!({"seqs": [1]}))
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    let more: Vec<Value> = (5..8)
        .map(|i| user(&format!("u{i}"), &format!("message {i}")))
        .collect();
    app.append("t", more).await;

    // Another process (a second store and router over the same database) resumes after the
    // last entry seen: the erasure, then the entries, each once.
    let other = app.restarted_router().await;
    let mut resumed = open(&other, "/v1/threads/t/events", Some("4")).await;
    let got = resumed.take(4).await;
    assert_eq!(
        shape(&got),
        ["erasure 4.1", "entry 5", "entry 6", "entry 7"]
    );
    assert_eq!(got[0].data["seqs"], json!([1]));
    assert_eq!(got[0].data["rewritten_seqs"], json!([]));
    assert_eq!(got[0].data["erasure_id"], erased.body["erasure_id"]);
    assert!(!got[0].data.to_string().contains("message 1"));

    // Live: an append through the first process, made while the second's stream waits,
    // reaches it.
    let (live, ()) = tokio::join!(resumed.take(1), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.append("t", vec![user("u8", "message 8")]).await;
    });
    assert_eq!(shape(&live), ["entry 8"]);

    // Resumed after the erasure, it is not sent again; after an entry, only what follows.
    let mut after_erasure = open(&other, "/v1/threads/t/events", Some("4.1")).await;
    assert_eq!(
        shape(&after_erasure.take(4).await),
        ["entry 5", "entry 6", "entry 7", "entry 8"]
    );
    let mut after_six = open(&app.router, "/v1/threads/t/events", Some("6")).await;
    assert_eq!(shape(&after_six.take(2).await), ["entry 7", "entry 8"]);
    // From the end (no position): only what comes next.
    let mut from_now = open(&app.router, "/v1/threads/t/events", None).await;
    let (next, ()) = tokio::join!(from_now.take(1), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.append("t", vec![user("u9", "message 9")]).await;
    });
    assert_eq!(shape(&next), ["entry 9"]);

    // Deleted: every stream says so and ends.
    assert_eq!(
        app.delete("/v1/threads/t").await.status,
        StatusCode::NO_CONTENT
    );
    for stream in [&mut resumed, &mut from_now] {
        let mut last = stream.next().await.expect("an event before the end");
        while last.event == "entry" {
            last = stream.next().await.expect("an event before the end");
        }
        assert_eq!(last.event, "deleted", "{last:?}");
        assert_eq!(stream.next().await, None);
    }
    drop((after_erasure, after_six));
    app.finish().await;
}

/// The answer to a stream of thread `t` resumed from `id` (a refusal is answered whole).
async fn resumed_from(app: &TestApp, id: &str) -> crate::common::TestResponse {
    crate::common::send_to(
        &app.router,
        Request::get("/v1/threads/t/events")
            .header("last-event-id", id)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

async fn bad_stream_requests_are_refused(app: TestApp) {
    app.thread("t").await;
    for id in ["x", "-2", "3.0", "1.2.3"] {
        resumed_from(&app, id)
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    // Past the thread's end (it holds 2 entries and no event): another thread's ids.
    app.append("t", vec![user("a", "one"), user("b", "two")])
        .await;
    for id in ["2", "1000000", "1.1", "9223372036854775807"] {
        resumed_from(&app, id)
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    app.get("/v1/threads/t/events?after_seq=-2")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    // An `after_seq` the document allows (any from -1) but past the thread's end names a message
    // the thread does not hold: 409, as a snip or an erasure naming one is, never a skip.
    for after in ["2", "9223372036854775806", "9223372036854775807"] {
        let problem = app
            .get(&format!("/v1/threads/t/events?after_seq={after}"))
            .await;
        let problem = problem.assert_problem(StatusCode::CONFLICT, "no-such-message");
        assert_eq!(problem["errors"][0]["field"], "after_seq", "{problem}");
    }
    let document = loupe::http::openapi();
    let answers = &document["paths"]["/v1/threads/{thread_id}/events"]["get"]["responses"];
    assert!(answers["409"].is_object(), "{answers}");
    app.get("/v1/threads/missing/events")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

/// More events than a page (100) placed before an entry: every one is sent, in order, then the
/// entries after them (the review: events past the first page were skipped for good).
async fn more_events_than_a_page_before_an_entry_are_all_sent(app: TestApp) {
    app.thread("t").await;
    let first: Vec<Value> = (0..3)
        .map(|i| user(&format!("u{i}"), &format!("m {i}")))
        .collect();
    app.append("t", first).await;
    for _ in 0..120 {
        let erased = app
            .post("/v1/threads/t/erasures", json!({"seqs": [0]}))
            .await;
        assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    }
    app.append("t", vec![user("u3", "m 3")]).await;
    let mut stream = open(&app.router, "/v1/threads/t/events?after_seq=-1", None).await;
    let got = stream.take(124).await;
    let mut expected: Vec<String> = (0..3).map(|seq| format!("entry {seq}")).collect();
    expected.extend((1..=120).map(|n| format!("erasure 2.{n}")));
    expected.push("entry 3".to_owned());
    assert_eq!(shape(&got), expected);
    app.finish().await;
}

/// A thread deleted and created again under its id is another thread: a stream of the first
/// says it was deleted, and an id of the first past the second's end is refused.
async fn a_thread_recreated_under_its_id_is_another_stream(app: TestApp) {
    app.thread("t").await;
    let first: Vec<Value> = (0..5)
        .map(|i| user(&format!("u{i}"), &format!("m {i}")))
        .collect();
    app.append("t", first).await;
    let mut stream = open(&app.router, "/v1/threads/t/events?after_seq=-1", None).await;
    assert_eq!(stream.take(5).await.len(), 5);
    // Deleted and created again from another process (no signal reaches this one's stream).
    let other = app.restarted_router().await;
    let deleted = crate::common::send_to(
        &other,
        Request::delete("/v1/threads/t")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let created = crate::common::send_to(
        &other,
        Request::post("/v1/threads")
            .header("content-type", "application/json")
            .body(Body::from(json!({"id": "t"}).to_string()))
            .unwrap(),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    app.append(
        "t",
        (0..7)
            .map(|i| user(&format!("n{i}"), "new"))
            .collect::<Vec<_>>(),
    )
    .await;
    let next = stream.next().await.expect("an event");
    assert_eq!(next.event, "deleted", "{next:?}");
    assert_eq!(stream.next().await, None);
    app.finish().await;
}

/// A stream holds its connection as long as its client likes: a tenant may hold 32 at once
/// (the attack: 256 idle streams took every connection of the process). Past them a stream is
/// refused at once, another tenant still gets one, and a closed stream frees its place.
async fn a_tenant_holds_a_bounded_number_of_streams(app: TestApp) {
    let app = app.keyed();
    let (a, b) = (
        app.create_key("tenant-a").await,
        app.create_key("tenant-b").await,
    );
    for key in [&a, &b] {
        assert_eq!(
            app.post_as(key, "/v1/threads", json!({"id": "t"}))
                .await
                .status,
            StatusCode::CREATED
        );
    }
    let request = |key: &str| {
        Request::get("/v1/threads/t/events")
            .header("authorization", format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..loupe::http::guard::MAX_STREAMS_PER_TENANT {
        let response = app.router.clone().oneshot(request(&a)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    let refused = crate::common::send_to(&app.router, request(&a)).await;
    refused.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
    let other = app.router.clone().oneshot(request(&b)).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    held.pop();
    let again = app.router.clone().oneshot(request(&a)).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    drop((held, other, again));
    app.finish().await;
}

/// A tree job's outline move is an event, placed after the entries it follows; a retention
/// expiry ends the stream with `deleted`.
async fn outline_moves_and_expiry_are_streamed(app: TestApp) {
    let runner = crate::tree::runner(
        &app,
        std::sync::Arc::new(loupe::summarize::ExtractiveSummarizer::new()),
    );
    app.thread("t").await;
    crate::tree::outline_on(
        &app,
        "t",
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 40}),
    )
    .await;
    let mut events = open(&app.router, "/v1/threads/t/events", None).await;
    for i in 0..6 {
        app.append(
            "t",
            crate::tree::exchange(i, &format!("Question {i}, at some length"), "ok"),
        )
        .await;
    }
    crate::tree::drain(&runner).await;
    let mut outline = None;
    let mut entries = 0;
    while outline.is_none() {
        let event = events.next().await.expect("the stream goes on");
        match event.event.as_str() {
            "entry" => entries += 1,
            "outline" => outline = Some(event),
            other => panic!("unexpected {other}"),
        }
    }
    let outline = outline.unwrap();
    assert!(
        outline.data["version"].as_i64().unwrap() >= 1,
        "{:?}",
        outline.data
    );
    let id = outline.id.clone().unwrap();
    let (follows, _) = id.split_once('.').expect("an event id");
    assert!(
        follows.parse::<i64>().unwrap() < entries,
        "{id} after {entries} entries"
    );

    let set = app
        .request(
            axum::http::Method::PUT,
            "/v1/threads/t/retention",
            Some(json!({"delete_after_seconds": 60})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.body);
    crate::retention::age(&app, "t", 120_000).await;
    crate::retention::sweep(&app).await;
    let mut tail = Vec::new();
    while let Some(event) = events.next().await {
        tail.push(event.event);
    }
    let tail: Vec<&str> = tail
        .iter()
        .map(String::as_str)
        .filter(|e| *e != "outline" && *e != "entry")
        .collect();
    // The `expired` event is the delete's own (webhooks deliver it as `thread.expired`); the
    // stream, which reads the thread's events from the thread, sees it gone.
    assert_eq!(tail, ["deleted"]);
    app.finish().await;
}

/// Whether any event of `events` holds one of `texts`.
fn holding<'a>(events: &[Received], texts: &[&'a str]) -> Vec<&'a str> {
    texts
        .iter()
        .copied()
        .filter(|text| events.iter().any(|e| e.data.to_string().contains(text)))
        .collect()
}

/// Issue 53, finding 8: a stream reads a page of entries ahead of what its client has taken. An
/// erasure (or a delete) answered meanwhile must keep what it removed out of everything the
/// stream sends after the answer: the entries read ahead are read again, as tombstones.
async fn what_a_stream_read_ahead_is_not_sent_after_an_erasure_or_delete_answered(app: TestApp) {
    app.thread("t").await;
    let secrets: Vec<String> = (0..13).map(|i| format!("secret number {i}.")).collect();
    let first: Vec<Value> = (0..8)
        .map(|i| user(&format!("u{i}"), &secrets[i]))
        .collect();
    app.append("t", first).await;
    let mut stream = open(&app.router, "/v1/threads/t/events?after_seq=-1", None).await;
    // The client takes one event: the stream has read the other seven with it, one page.
    assert_eq!(shape(&stream.take(1).await), ["entry 0"]);

    // An erasure through this process, answered before the client reads on.
    let erased = app
        .post("/v1/threads/t/erasures", json!({"seqs": [2, 5]}))
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    let rest = stream.take(8).await;
    assert_eq!(
        shape(&rest),
        [
            "entry 1",
            "entry 2",
            "entry 3",
            "entry 4",
            "entry 5",
            "entry 6",
            "entry 7",
            "erasure 7.1"
        ]
    );
    let leaked = holding(&rest, &[&secrets[2], &secrets[5]]);
    assert!(
        leaked.is_empty(),
        "sent after the erasure's answer: {leaked:?}"
    );
    for tombstone in [&rest[1], &rest[4]] {
        assert_eq!(
            tombstone.data["erased"]["erasure_id"], erased.body["erasure_id"],
            "{tombstone:?}"
        );
    }
    assert_eq!(holding(&rest, &[&secrets[3]]), [&secrets[3]]);

    // An erasure through another process (a second store on the same database): no signal
    // reaches this one on SQLite, and a `NOTIFY` may be lost; the stream checks what it holds
    // at least every 3 seconds, whatever it hears.
    let more: Vec<Value> = (8..11)
        .map(|i| user(&format!("u{i}"), &secrets[i]))
        .collect();
    app.append("t", more).await;
    assert_eq!(shape(&stream.take(1).await), ["entry 8"]);
    let other = app.restarted_router().await;
    let erased_elsewhere = crate::common::send_to(
        &other,
        Request::post("/v1/threads/t/erasures")
            .header("content-type", "application/json")
            .body(Body::from(json!({"seqs": [9]}).to_string()))
            .unwrap(),
    )
    .await;
    assert_eq!(erased_elsewhere.status, StatusCode::CREATED);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let rest = stream.take(3).await;
    assert_eq!(shape(&rest), ["entry 9", "entry 10", "erasure 10.2"]);
    assert!(holding(&rest, &[&secrets[9]]).is_empty(), "{rest:?}");

    // A delete answered while the stream holds entries read ahead: it says so, and sends none.
    let last: Vec<Value> = (11..13)
        .map(|i| user(&format!("u{i}"), &secrets[i]))
        .collect();
    app.append("t", last).await;
    assert_eq!(shape(&stream.take(1).await), ["entry 11"]);
    assert_eq!(
        app.delete("/v1/threads/t").await.status,
        StatusCode::NO_CONTENT
    );
    let end = stream.next().await.expect("the deletion, before the end");
    assert_eq!(end.event, "deleted", "{end:?}");
    assert_eq!(stream.next().await, None);
    app.finish().await;
}
