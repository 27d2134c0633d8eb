//! Operational guard rails: per-tenant rate limits, the bound on expensive requests, hostile
//! bodies, and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{user, TestApp, TestResponse, ADMIN_KEY};
use async_trait::async_trait;
use axum::http::{header, Method, StatusCode};
use loupe::http::Limits;
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome, KIND_NOOP};
use loupe::store::{NewJob, TenantId};
use loupe::summarize::{
    ExtractiveSummarizer, Purpose, SummarizeError, Summarizer, Summary, SummaryRequest,
    WithFallback,
};
use serde_json::{json, Value};

on_both_backends!(
    a_flooding_tenant_gets_429_while_another_is_served,
    expensive_requests_beyond_capacity_get_503,
    hostile_bodies_get_problems_and_store_nothing,
    metrics_hold_requests_pool_summarizer_and_job_series,
);

async fn a_flooding_tenant_gets_429_while_another_is_served(app: TestApp) {
    // A bucket of 5 that refills about once every 17 minutes: the flood cannot be refilled
    // during the test.
    let limits = Limits {
        rate_limit_per_sec: 0.001,
        rate_limit_burst: 5,
        ..Limits::default()
    };
    let app = app.keyed_with(limits);
    let flooder = app.create_key("flooder").await;
    let neighbour = app.create_key("neighbour").await;

    let mut served = 0;
    let mut limited = Vec::new();
    for _ in 0..20 {
        let response = app.get_as(&flooder, "/v1/threads").await;
        match response.status {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => limited.push(response),
            other => panic!("unexpected {other}: {}", response.body),
        }
    }
    assert_eq!(served, 5);
    assert_eq!(limited.len(), 15);
    for response in &limited {
        response.assert_problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited");
        let retry_after: u64 = response.headers[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry_after >= 1);
        assert_eq!(response.body["retry_after"], retry_after);
    }
    // The neighbour is served all the while, writes included.
    let response = app.get_as(&neighbour, "/v1/threads").await;
    assert_eq!(response.status, StatusCode::OK);
    let created = app
        .post_as(&neighbour, "/v1/threads", json!({"id": "n"}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    // Refused requests wrote nothing: the flooder's writes are refused too.
    app.post_as(&flooder, "/v1/threads", json!({"id": "f"}))
        .await
        .assert_problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited");
    // The admin API is not rate-limited by a tenant's bucket.
    assert_eq!(
        app.get_as(ADMIN_KEY, "/v1/admin/tenants").await.status,
        StatusCode::OK
    );
    app.finish().await;
}

async fn expensive_requests_beyond_capacity_get_503(app: TestApp) {
    // No slot at all: every expensive request is refused at once, deterministically.
    let limits = Limits {
        max_expensive_requests: 0,
        expensive_wait: Duration::ZERO,
        ..Limits::default()
    };
    let app = app.reconfigure(limits, loupe::http::AuthMode::Open);
    let thread = app.thread("t").await;
    for uri in [
        format!("/v1/threads/{thread}/context"),
        format!("/v1/threads/{thread}/rounds"),
    ] {
        let response = app.get(&uri).await;
        response.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
        assert_eq!(response.headers[header::RETRY_AFTER], "1");
    }
    app.post("/v1/normalize", json!({"messages": [user("u", "hi")]}))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
    // Cheap requests are not bounded.
    assert_eq!(app.get("/v1/threads").await.status, StatusCode::OK);
    app.finish().await;
}

/// A JSON array nested `depth` times.
fn deep_array(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

/// A JSON object nested `depth` times.
fn deep_object(depth: usize) -> String {
    "{\"a\":".repeat(depth) + "1" + &"}".repeat(depth)
}

/// Malformed, truncated, wrongly typed and deeply nested variants of a valid body.
fn hostile_bodies(valid: &Value, deep_field: &str) -> Vec<(String, Vec<u8>)> {
    let valid_bytes = serde_json::to_vec(valid).unwrap();
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("open brace".into(), b"{".to_vec()),
        ("not json".into(), b"hello".to_vec()),
        ("invalid utf-8".into(), vec![0xff, 0xfe, b'{', 0x80]),
        ("nul bytes".into(), vec![0; 64]),
        ("null".into(), b"null".to_vec()),
        ("array".into(), b"[]".to_vec()),
        ("string".into(), b"\"x\"".to_vec()),
        ("number".into(), b"42".to_vec()),
        (
            "trailing garbage".into(),
            [valid_bytes.clone(), b"}".to_vec()].concat(),
        ),
        (
            "two documents".into(),
            [valid_bytes.clone(), valid_bytes.clone()].concat(),
        ),
        ("unknown field".into(), {
            let mut with_extra = valid.clone();
            with_extra["no_such_field"] = json!(1);
            serde_json::to_vec(&with_extra).unwrap()
        }),
        ("deep array".into(), deep_array(100_000).into_bytes()),
        ("deep object".into(), deep_object(100_000).into_bytes()),
        (
            "deep field".into(),
            format!("{{\"{deep_field}\": {}}}", deep_array(5_000)).into_bytes(),
        ),
        (
            "deep field object".into(),
            format!("{{\"{deep_field}\": {}}}", deep_object(5_000)).into_bytes(),
        ),
    ];
    // Every proper prefix of a JSON object is malformed: truncate at several points.
    let len = valid_bytes.len();
    for cut in (1..len).step_by((len / 12).max(1)) {
        bodies.push((format!("truncated at {cut}"), valid_bytes[..cut].to_vec()));
    }
    bodies
}

fn assert_client_error(what: &str, response: &TestResponse) {
    assert!(
        response.status.is_client_error(),
        "{what}: status {} body {}",
        response.status,
        response.body
    );
    assert_eq!(
        response.headers.get(header::CONTENT_TYPE).unwrap(),
        "application/problem+json",
        "{what}"
    );
    assert!(
        response.body["type"]
            .as_str()
            .is_some_and(|kind| kind.starts_with("urn:loupe:problem:")),
        "{what}: {}",
        response.body
    );
    assert!(response.body["request_id"].is_string(), "{what}");
}

async fn hostile_bodies_get_problems_and_store_nothing(app: TestApp) {
    let limits = Limits {
        body_bytes: 64 * 1024,
        max_batch_messages: 10,
        // This test sends hundreds of requests; the rate limit has its own test.
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    };
    let app = app.keyed_with(limits);
    let key = app.create_key("acme").await;
    let created = app.post_as(&key, "/v1/threads", json!({"id": "t"})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let appended = app
        .post_as(
            &key,
            "/v1/threads/t/messages",
            json!({"messages": [user("m-0", "first")]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED);

    let endpoints: Vec<(Method, Option<&str>, &str, Value, &str)> = vec![
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads",
            json!({"id": "new-thread", "metadata": {"a": 1}}),
            "metadata",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads/t/messages",
            json!({"messages": [user("m-1", "second")], "expected_next_seq": 1}),
            "messages",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads/t/snip",
            json!({"seqs": [0], "uuid": "snip-1"}),
            "seqs",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/normalize",
            json!({"messages": [user("u-1", "hi")], "provider": "anthropic"}),
            "messages",
        ),
        (
            Method::POST,
            Some(ADMIN_KEY),
            "/v1/admin/tenants",
            json!({"id": "new-tenant", "name": "New"}),
            "name",
        ),
        (
            Method::POST,
            Some(ADMIN_KEY),
            "/v1/admin/keys",
            json!({"tenant": "new-tenant", "name": "k"}),
            "name",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads/t/compact",
            json!({"keep_recent_rounds": 1, "instructions": "keep names"}),
            "instructions",
        ),
        (
            Method::PUT,
            Some(key.as_str()),
            "/v1/threads/t/settings",
            json!({"auto_compact_tokens": 5000}),
            "auto_compact_tokens",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads/t/cursors/claimer/claim",
            json!({"limit": 5, "lease_seconds": 30}),
            "limit",
        ),
        (
            Method::POST,
            Some(key.as_str()),
            "/v1/threads/t/cursors/reader/advance",
            json!({"to": "m-0"}),
            "to",
        ),
    ];

    for (method, auth, uri, valid, deep_field) in &endpoints {
        for (what, body) in hostile_bodies(valid, deep_field) {
            let what = format!("{method} {uri} with {what}");
            let response = app
                .raw_as(*auth, method.clone(), uri, Some("application/json"), body)
                .await;
            assert_client_error(&what, &response);
            if what.contains("deep field object") && *uri == "/v1/threads" {
                // Free-form JSON nested past serde_json's depth limit (128) is malformed.
                assert_eq!(response.status, StatusCode::BAD_REQUEST, "{what}");
            }
        }
        // Oversized: one byte past the body limit.
        let mut oversized = valid.clone();
        let padding = "x".repeat(64 * 1024);
        oversized["pad"] = json!(padding);
        let response = app
            .raw_as(
                *auth,
                method.clone(),
                uri,
                Some("application/json"),
                serde_json::to_vec(&oversized).unwrap(),
            )
            .await;
        response.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
        // The right bytes with the wrong media type.
        let response = app
            .raw_as(
                *auth,
                method.clone(),
                uri,
                Some("text/plain"),
                serde_json::to_vec(valid).unwrap(),
            )
            .await;
        response.assert_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type");
    }
    // A message whose free-form content is nested past the depth limit.
    let deep_message = format!(
        r#"{{"messages": [{{"uuid": "d-1", "type": "user", "message": {{"role": "user", "content": "x", "usage": {}}}}}]}}"#,
        deep_object(10_000)
    );
    for uri in ["/v1/threads/t/messages", "/v1/normalize"] {
        app.raw_as(
            Some(&key),
            Method::POST,
            uri,
            Some("application/json"),
            deep_message.clone().into_bytes(),
        )
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    // Too many messages in one append.
    let batch: Vec<Value> = (0..11).map(|i| user(&format!("b-{i}"), "x")).collect();
    app.post_as(&key, "/v1/threads/t/messages", json!({"messages": batch}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    // Page sizes beyond the bounds.
    app.get_as(&key, "/v1/threads?limit=100000")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get_as(&key, "/v1/threads/t/messages?limit=0")
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");

    // Nothing was stored by any refused request.
    let threads = app.get_as(&key, "/v1/threads").await;
    assert_eq!(
        threads.body["threads"].as_array().unwrap().len(),
        1,
        "{}",
        threads.body
    );
    assert_eq!(threads.body["threads"][0]["message_count"], 1);
    let tenants = app.get_as(ADMIN_KEY, "/v1/admin/tenants").await;
    assert_eq!(
        tenants.body["tenants"].as_array().unwrap().len(),
        1,
        "{}",
        tenants.body
    );
    let keys = app.get_as(ADMIN_KEY, "/v1/admin/keys").await;
    assert_eq!(keys.body["keys"].as_array().unwrap().len(), 1);
    let cursors = app.get_as(&key, "/v1/threads/t/cursors").await;
    assert_eq!(cursors.body["cursors"], json!([]), "{}", cursors.body);
    let settings = app.get_as(&key, "/v1/threads/t/settings").await;
    assert_ne!(
        settings.body["auto_compact_tokens"], 5000,
        "{}",
        settings.body
    );

    // The service is up: every endpoint takes its valid body now.
    for (method, auth, uri, valid, _) in &endpoints {
        let response = app
            .request_as(*auth, method.clone(), uri, Some(valid.clone()))
            .await;
        assert!(
            response.status.is_success(),
            "{method} {uri}: {} {}",
            response.status,
            response.body
        );
    }
    assert_eq!(
        app.get_as(&key, "/v1/threads/t").await.body["message_count"],
        3
    );
    app.finish().await;
}

/// A model backend that always fails, to drive the fallback counters.
struct Failing;

#[async_trait]
impl Summarizer for Failing {
    fn name(&self) -> String {
        "failing:model-x".to_owned()
    }

    async fn summarize(&self, _req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Err(SummarizeError::Transport("connection refused".to_owned()))
    }
}

async fn metrics_hold_requests_pool_summarizer_and_job_series(app: TestApp) {
    let app = app.keyed();
    let key = app.create_key("acme").await;
    let created = app
        .post_as(&key, "/v1/threads", json!({"id": "metrics-thread"}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(
        app.get_as(&key, "/v1/threads/metrics-thread").await.status,
        StatusCode::OK
    );
    app.get_as(&key, "/v1/threads/missing-one").await;
    app.get_as(&key, "/no/such/route").await;

    let summarizer = WithFallback::new(Arc::new(Failing));
    let summary = summarizer
        .summarize(&SummaryRequest::new(
            vec![serde_json::from_value(user("s-1", "summarize me")).unwrap()],
            Purpose::Line,
            200,
        ))
        .await
        .unwrap();
    assert!(summary.summarizer.starts_with("fallback:extractive"));
    // A real job through the queue: one waits at the scrape, one has run.
    let noop = |n: u32| NewJob {
        tenant: TenantId("acme".to_owned()),
        thread_key: None,
        kind: KIND_NOOP.to_owned(),
        payload: json!({"n": n}),
        dedup_key: None,
        max_attempts: 3,
    };
    app.store.enqueue_job(&noop(1), 0).await.unwrap();
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    );
    let step = runner.step(Clock::Fixed(1)).await.unwrap();
    assert!(matches!(step, StepOutcome::Succeeded { .. }), "{step:?}");
    app.store.enqueue_job(&noop(2), 0).await.unwrap();

    // Guarded by the admin key.
    let anonymous = app.request_as(None, Method::GET, "/metrics", None).await;
    anonymous.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    app.get_as(&key, "/metrics")
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    let scrape = app.get_as(ADMIN_KEY, "/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(scrape.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = scrape.body.as_str().expect("a text body").to_owned();

    let series_with = |name: &str, labels: &[&str]| {
        text.lines()
            .any(|line| line.starts_with(name) && labels.iter().all(|label| line.contains(label)))
    };
    for (name, labels) in [
        (
            "loupe_http_requests_total{",
            &[
                r#"route="/v1/threads""#,
                r#"status="201""#,
                r#"method="POST""#,
            ][..],
        ),
        (
            "loupe_http_requests_total{",
            &[r#"route="/v1/threads/{thread_id}""#, r#"status="200""#][..],
        ),
        (
            "loupe_http_requests_total{",
            &[r#"route="/v1/threads/{thread_id}""#, r#"status="404""#][..],
        ),
        ("loupe_http_requests_total{", &[r#"route="unmatched""#][..]),
        (
            "loupe_http_request_duration_seconds_bucket{",
            &[r#"route="/v1/threads/{thread_id}""#, "le="][..],
        ),
        ("loupe_http_request_duration_seconds_count{", &[][..]),
        ("loupe_db_pool_connections", &[][..]),
        ("loupe_db_pool_idle_connections", &[][..]),
        ("loupe_db_pool_in_use_connections", &[][..]),
        (
            "loupe_summarizer_calls_total{",
            &[r#"backend="failing""#][..],
        ),
        (
            "loupe_summarizer_failures_total{",
            &[r#"backend="failing""#][..],
        ),
        (
            "loupe_summarizer_calls_total{",
            &[r#"backend="extractive""#][..],
        ),
        ("loupe_jobs_queued", &[][..]),
        (
            "loupe_jobs_completed_total{",
            &[r#"kind="noop""#, r#"outcome="succeeded""#][..],
        ),
        ("loupe_rate_limited_total", &[][..]),
        ("loupe_overloaded_total", &[][..]),
    ] {
        assert!(
            series_with(name, labels),
            "no {name} {labels:?} in:\n{text}"
        );
    }
    // Route templates, never raw URIs.
    assert!(!text.contains("metrics-thread"), "{text}");
    assert!(!text.contains("missing-one"), "{text}");
    assert!(!text.contains("/no/such/route"), "{text}");
    app.finish().await;
}
