//! Every error answer is `application/problem+json`: a walk over every operation of the OpenAPI
//! document, sending each the mistakes a caller makes (unknown and malformed ids, bad query
//! values, bodies that are not JSON, of the wrong shape, too large or too slow, the wrong
//! method, no key or the wrong one, too many requests), on both backends. Each error must be a
//! problem document whose `type` is in the document's closed enum and whose status is one the
//! document lists for that operation; a caller's mistake is never a 5xx.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::{assistant, user, TestApp, TestResponse, ADMIN_KEY};
use loupe::http::Limits;

/// One operation of the document.
struct Operation {
    method: Method,
    path: String,
    spec: Value,
}

fn operations(document: &Value) -> Vec<Operation> {
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, spec) in item.as_object().unwrap() {
            operations.push(Operation {
                method: method.to_uppercase().parse().unwrap(),
                path: path.clone(),
                spec: spec.clone(),
            });
        }
    }
    operations
}

/// The schema `$ref` names, or the schema itself.
fn resolve<'a>(document: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(name) => {
            let name = name.trim_start_matches("#/components/schemas/");
            &document["components"]["schemas"][name]
        }
        None => schema,
    }
}

/// The existing resources a probe names when it means to reach the handler's own checks.
const THREAD: &str = "walk";
const CURSOR: &str = "reader";

/// Checks one answer: an error is a problem document of a documented kind and status.
struct Checker {
    kinds: Vec<String>,
    checked: usize,
}

impl Checker {
    fn new(document: &Value) -> Checker {
        let kinds = document["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kind| kind.as_str().unwrap().to_owned())
            .collect();
        Checker { kinds, checked: 0 }
    }

    /// `documented`: the statuses the operation lists, or `None` where no operation answers (an
    /// unknown route or method).
    fn check(&mut self, what: &str, response: &TestResponse, documented: Option<&Value>) {
        let status = response.status;
        assert!(
            !status.is_server_error(),
            "{what}: a caller's mistake got {status}: {}",
            response.body
        );
        if status.as_u16() < 400 {
            return;
        }
        self.checked += 1;
        let content_type = response
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            content_type.as_deref(),
            Some("application/problem+json"),
            "{what}: {status} answered {content_type:?}: {}",
            response.body
        );
        let body = &response.body;
        let kind = body["type"].as_str().unwrap_or_default();
        assert!(
            self.kinds.iter().any(|known| known == kind),
            "{what}: {status} with a type outside the document's enum: {body}"
        );
        assert_eq!(body["status"], status.as_u16(), "{what}: {body}");
        assert!(body["title"].is_string(), "{what}: no title: {body}");
        assert!(body["detail"].is_string(), "{what}: no detail: {body}");
        assert!(
            body["request_id"].is_string(),
            "{what}: no request_id: {body}"
        );
        if let Some(responses) = documented {
            assert!(
                responses.get(status.as_str()).is_some(),
                "{what}: {status} ({kind}) is not in the document's responses {:?}",
                responses.as_object().unwrap().keys().collect::<Vec<_>>()
            );
        }
    }
}

/// The path with its parameters filled: `existing` names the walk's own resources, else each
/// parameter takes `value`.
fn fill(path: &str, value: &str, existing: bool) -> String {
    let mut filled = path.to_owned();
    for (name, own) in [
        ("thread_id", THREAD),
        ("name", CURSOR),
        ("job_id", "job_nope"),
        ("key_id", "key_nope"),
    ] {
        let with = if existing { own } else { value };
        filled = filled.replace(&format!("{{{name}}}"), with);
    }
    filled
}

/// Values of the wrong type for a schema, and values just past its bounds.
fn wrong_values(document: &Value, schema: &Value) -> Vec<Value> {
    let schema = resolve(document, schema);
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let mut values = vec![json!([[["nested"]]])];
    if !types.contains(&"string") {
        values.push(json!("a string"));
    }
    if !types.contains(&"integer") && !types.contains(&"number") {
        values.push(json!(12345));
    }
    if !types.contains(&"object") {
        values.push(json!({"unexpected": true}));
    }
    if types.contains(&"integer") {
        values.push(json!(1.5));
        values.push(json!(u64::MAX));
        values.push(json!(i64::MIN));
        if let Some(max) = schema["maximum"].as_i64() {
            values.push(json!(max + 1));
        }
        if let Some(min) = schema["minimum"].as_i64() {
            values.push(json!(min - 1));
        }
    }
    if types.contains(&"string") {
        values.push(json!("\u{0}"));
        if let Some(max) = schema["maxLength"].as_u64() {
            values.push(json!("x".repeat(max as usize + 1)));
        }
    }
    if types.contains(&"array") {
        values.push(json!([]));
        values.push(json!([null, 1, "x"]));
    }
    values
}

/// Bodies a caller gets wrong, for an operation taking `schema`: each as (content type, bytes).
fn wrong_bodies(document: &Value, schema: &Value) -> Vec<(Option<&'static str>, Vec<u8>)> {
    let json = Some("application/json");
    let mut bodies: Vec<(Option<&'static str>, Vec<u8>)> = vec![
        (None, b"{}".to_vec()),
        (Some("text/plain"), b"{}".to_vec()),
        (json, Vec::new()),
        (json, b"{".to_vec()),
        (json, b"null".to_vec()),
        (json, b"[]".to_vec()),
        (json, b"\"text\"".to_vec()),
        (json, b"{}".to_vec()),
        (json, b"{\"unexpected\": 1}".to_vec()),
        (json, b"\xff\xfe".to_vec()),
        (json, b"{\"a\": \"\\ud800\"}".to_vec()),
    ];
    let schema = resolve(document, schema);
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            for value in wrong_values(document, property) {
                let body = json!({ name: value });
                bodies.push((json, serde_json::to_vec(&body).unwrap()));
            }
        }
    }
    bodies
}

/// Query strings a caller gets wrong for the operation's query parameters.
fn wrong_queries(spec: &Value) -> Vec<String> {
    let mut queries = vec!["?%ZZ=1".to_owned(), "?a=%FF".to_owned()];
    for parameter in spec["parameters"].as_array().into_iter().flatten() {
        if parameter["in"] != "query" {
            continue;
        }
        let name = parameter["name"].as_str().unwrap();
        for value in [
            "",
            "nonsense",
            "-1",
            "0",
            "1.5",
            "99999999999999999999",
            "%00",
            "%FF",
        ] {
            queries.push(format!("?{name}={value}"));
        }
        queries.push(format!("?{name}=1&{name}=2"));
        queries.push(format!("?{name}={}", "x".repeat(5_000)));
    }
    queries
}

/// A thread with a round, a cursor and a snip, so the probes reach the handlers' own checks.
async fn seed(app: &TestApp, key: Option<&str>) {
    let steps = [
        ("/v1/threads".to_owned(), json!({ "id": THREAD })),
        (
            format!("/v1/threads/{THREAD}/messages"),
            json!({"messages": [user("u0", "hello"), assistant("a0", "msg_0", "hi")]}),
        ),
        (
            format!("/v1/threads/{THREAD}/cursors/{CURSOR}/claim"),
            json!({}),
        ),
    ];
    for (uri, body) in steps {
        let answer = app.request_as(key, Method::POST, &uri, Some(body)).await;
        assert!(answer.status.is_success(), "{uri}: {}", answer.body);
    }
}

fn body_of(operation: &Operation) -> Option<(&str, &Value)> {
    let content = operation.spec["requestBody"]["content"].as_object()?;
    // The import's default form, JSON Lines, where it is offered beside JSON (whose own
    // problems `transcripts` checks): its body is streamed, not read whole.
    let (content_type, media) = content
        .iter()
        .find(|(content_type, _)| *content_type == "application/x-ndjson")
        .or_else(|| content.iter().next())?;
    Some((content_type.as_str(), &media["schema"]))
}

/// The operation's request at `uri` with the least body it takes: `{}` for JSON, `lines` for the
/// import's JSON Lines, none for an operation without a body.
async fn send_minimal(
    app: &TestApp,
    key: Option<&str>,
    operation: &Operation,
    uri: &str,
    lines: &[u8],
) -> TestResponse {
    let method = operation.method.clone();
    match body_of(operation) {
        Some(("application/json", _)) => app.request_as(key, method, uri, Some(json!({}))).await,
        Some((content_type, _)) => {
            app.raw_as(key, method, uri, Some(content_type), lines.to_vec())
                .await
        }
        None => app.request_as(key, method, uri, None).await,
    }
}

/// Sends every probe to every operation with `key`, checking each answer.
async fn walk(app: &TestApp, key: Option<&str>, document: &Value, checker: &mut Checker) {
    for operation in operations(document) {
        let responses = &operation.spec["responses"];
        let method = &operation.method;
        // Ids nobody has, and ids no resource could have.
        let long = "x".repeat(300);
        for value in ["nope", "%00", "%FF", long.as_str(), "a%20b", "..", "%2F"] {
            let uri = fill(&operation.path, value, false);
            let response = send_minimal(app, key, &operation, &uri, b"{}\n").await;
            checker.check(&format!("{method} {uri}"), &response, Some(responses));
        }
        let target = fill(&operation.path, "", true);
        if *method == Method::DELETE {
            // Deleting the walk's own thread would leave the next probes nothing to reach.
            continue;
        }
        for query in wrong_queries(&operation.spec) {
            let uri = format!("{target}{query}");
            let response = send_minimal(app, key, &operation, &uri, b"").await;
            checker.check(&format!("{method} {uri}"), &response, Some(responses));
        }
        if let Some((content_type, schema)) = body_of(&operation) {
            for (sent_type, bytes) in wrong_bodies(document, schema) {
                let sent_type = match (content_type, sent_type) {
                    ("application/json", sent) => sent,
                    // The import takes lines of JSON: the same bytes under its own type.
                    (own, Some("application/json")) => Some(own),
                    (_, other) => other,
                };
                let what = format!(
                    "{method} {target} with {sent_type:?} {:.80}",
                    String::from_utf8_lossy(&bytes)
                );
                let response = app
                    .raw_as(key, method.clone(), &target, sent_type, bytes)
                    .await;
                checker.check(&what, &response, Some(responses));
            }
        }
        // The other methods on the same path.
        for other in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ] {
            let item = &document["paths"][&operation.path];
            if item.get(other.as_str().to_lowercase()).is_some() {
                continue;
            }
            let response = app.request_as(key, other.clone(), &target, None).await;
            let what = format!("{other} {target}");
            checker.check(&what, &response, None);
            // The guard decides by path before the router matches the method: the admin API
            // refuses a caller first.
            assert!(
                response.status == StatusCode::METHOD_NOT_ALLOWED
                    || ((operation.path.starts_with("/v1/admin") || operation.path == "/metrics")
                        && matches!(
                            response.status,
                            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                        )),
                "{what}: {}",
                response.status
            );
        }
    }
    // Routes that do not exist.
    for uri in [
        "/v1",
        "/v1/nothing",
        "/v1/threads/walk/nothing",
        "/v2/threads",
    ] {
        let response = app.request_as(key, Method::GET, uri, None).await;
        checker.check(&format!("GET {uri}"), &response, None);
    }
}

/// The case a new user tried: an entry of an unknown type, on a thread that does not exist.
async fn an_unknown_entry_type_on_a_missing_thread(app: &TestApp, key: Option<&str>) {
    for body in [
        json!({"messages": [{"type": "robot"}]}),
        json!({"messages": [{"type": "robot", "message": 5}]}),
        json!({"messages": [{"type": "robot", "message": {"role": "robot"}}]}),
        json!({"messages": [{"type": 5}]}),
    ] {
        let response = app
            .request_as(key, Method::POST, "/v1/threads/t1/messages", Some(body))
            .await;
        assert!(response.status.is_client_error(), "{}", response.body);
        assert_eq!(
            response.headers[header::CONTENT_TYPE],
            "application/problem+json",
            "{}",
            response.body
        );
    }
}

async fn every_error_of_every_route_is_a_problem(app: TestApp) {
    let document = loupe::http::openapi();
    let mut checker = Checker::new(&document);
    an_unknown_entry_type_on_a_missing_thread(&app, None).await;
    seed(&app, None).await;
    walk(&app, None, &document, &mut checker).await;
    let open = checker.checked;
    assert!(open > 500, "only {open} error answers checked");

    // Keyed: the same walk with a tenant's key, then the guard's own refusals everywhere.
    let app = app.keyed();
    let key = app.create_key("walker").await;
    an_unknown_entry_type_on_a_missing_thread(&app, Some(&key)).await;
    seed(&app, Some(&key)).await;
    walk(&app, Some(&key), &document, &mut checker).await;
    let revoked = {
        let record = app.create_key_record("walker").await;
        let id = record["id"].as_str().unwrap().to_owned();
        let gone = app
            .delete_as(ADMIN_KEY, &format!("/v1/admin/keys/{id}"))
            .await;
        assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.body);
        record["key"].as_str().unwrap().to_owned()
    };
    for operation in operations(&document) {
        let uri = fill(&operation.path, "", true);
        let admin_route = operation.path.starts_with("/v1/admin") || operation.path == "/metrics";
        let keys: Vec<(&str, Option<&str>)> = vec![
            ("no key", None),
            ("a malformed key", Some("not-a-key")),
            ("a revoked key", Some(revoked.as_str())),
            (
                "the other kind of key",
                Some(if admin_route { key.as_str() } else { ADMIN_KEY }),
            ),
        ];
        for (which, sent) in keys {
            if !operation.path.starts_with("/v1") && operation.path != "/metrics" {
                continue;
            }
            let response = app
                .request_as(sent, operation.method.clone(), &uri, None)
                .await;
            let what = format!("{} {uri} with {which}", operation.method);
            checker.check(&what, &response, Some(&operation.spec["responses"]));
            assert!(
                matches!(
                    response.status,
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                ),
                "{what}: {}",
                response.status
            );
        }
    }
    app.finish().await;
}

async fn guard_rails_answer_problems_on_every_route(app: TestApp) {
    let document = loupe::http::openapi();
    let mut checker = Checker::new(&document);
    seed(&app, None).await;
    let limits = Limits {
        body_bytes: 64,
        body_read_timeout: Duration::from_millis(50),
        rate_limit_per_sec: 0.001,
        rate_limit_burst: 400,
        ..Limits::default()
    };
    let app = app.reconfigure(limits, loupe::http::AuthMode::Open);
    for operation in operations(&document) {
        let Some((content_type, _)) = body_of(&operation) else {
            continue;
        };
        if operation.path.starts_with("/v1/admin") {
            // Off in open mode: refused before its body is read.
            continue;
        }
        let uri = fill(&operation.path, "", true);
        let method = operation.method.clone();
        let responses = &operation.spec["responses"];
        // Too large.
        let big = format!("{{\"padding\": \"{}\"}}", "x".repeat(1_000));
        let response = app
            .raw_as(None, method.clone(), &uri, Some(content_type), big.into())
            .await;
        let what = format!("{method} {uri} too large");
        checker.check(&what, &response, Some(responses));
        if content_type == "application/x-ndjson" {
            // A streamed import has no overall limit; a line over the limit is refused alone.
            assert_eq!(response.body["refused"], 1, "{what}: {}", response.body);
        } else {
            assert_eq!(
                response.status,
                StatusCode::PAYLOAD_TOO_LARGE,
                "{what}: {}",
                response.body
            );
        }
        // Too slow: a first byte, then nothing.
        let stream = futures_util::stream::once(async { Ok::<_, std::io::Error>("{".to_owned()) })
            .chain(futures_util::stream::pending());
        let request = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from_stream(stream))
            .unwrap();
        let response = app.send(request).await;
        let what = format!("{method} {uri} too slow");
        checker.check(&what, &response, Some(responses));
        assert_eq!(
            response.status,
            StatusCode::REQUEST_TIMEOUT,
            "{what}: {}",
            response.body
        );
    }
    // Too many: the burst spent, every tenant operation answers 429.
    let mut limited = 0;
    for round in 0..2 {
        for operation in operations(&document) {
            if !operation.path.starts_with("/v1/threads") && !operation.path.starts_with("/v1/jobs")
            {
                continue;
            }
            let uri = fill(&operation.path, "", true);
            let response = app
                .request_as(None, operation.method.clone(), &uri, None)
                .await;
            if round == 1 || response.status == StatusCode::TOO_MANY_REQUESTS {
                checker.check(
                    &format!("{} {uri} over the rate", operation.method),
                    &response,
                    Some(&operation.spec["responses"]),
                );
            }
            limited += usize::from(response.status == StatusCode::TOO_MANY_REQUESTS);
        }
        if round == 0 {
            // Spend what is left of the burst.
            while app.get("/v1/threads").await.status != StatusCode::TOO_MANY_REQUESTS {}
        }
    }
    assert!(limited > 20, "only {limited} answers were rate-limited");
    app.finish().await;
}

/// A well-formed request naming a message the thread does not hold (by seq or uuid) is 409
/// `no-such-message` (not 404: the thread is there), changes nothing, and the document lists
/// that answer on the operation.
async fn naming_a_message_the_thread_lacks_is_409_no_such_message(app: TestApp) {
    let thread = app.thread("named").await;
    let other = app.thread("other").await;
    app.append(
        &thread,
        [user("m-0", "zero"), assistant("m-1", "msg_1", "one")],
    )
    .await;
    app.append(&other, [user("o-0", "elsewhere")]).await;

    // Snip: an unknown seq, or a uuid of another thread beside one it holds.
    let snip = format!("/v1/threads/{thread}/snip");
    for body in [
        json!({"seqs": [7]}),
        json!({"seqs": [0], "uuids": ["o-0"]}),
        json!({"uuids": ["m-1", "ghost"]}),
    ] {
        let response = app.post(&snip, body.clone()).await;
        let problem = response.assert_problem(StatusCode::CONFLICT, "no-such-message");
        let field = if body.get("uuids").is_some() {
            "uuids"
        } else {
            "seqs"
        };
        assert_eq!(problem["errors"][0]["field"], field, "{problem}");
    }
    let stored = app.get(&format!("/v1/threads/{thread}")).await;
    assert_eq!(stored.body["message_count"], 2, "no snip was stored");

    // Advance: a uuid of another thread; the cursor stays where it was.
    let cursor = format!("/v1/threads/{thread}/cursors/c");
    let moved = app
        .post(&format!("{cursor}/advance"), json!({"to": "m-0"}))
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.body);
    let response = app
        .post(&format!("{cursor}/advance"), json!({"to": "o-0"}))
        .await;
    let problem = response.assert_problem(StatusCode::CONFLICT, "no-such-message");
    assert_eq!(problem["errors"][0]["field"], "to");
    assert!(
        problem["detail"].as_str().unwrap().contains("o-0"),
        "{problem}"
    );
    let state = app.get(&cursor).await;
    assert_eq!(state.body["bookmark"]["uuid"], "m-0");

    // A thread that does not exist is still `not-found`.
    app.post("/v1/threads/absent/snip", json!({"seqs": [0]}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");

    // The document says so on both operations.
    let document = loupe::http::openapi();
    for path in [
        "/v1/threads/{thread_id}/snip",
        "/v1/threads/{thread_id}/cursors/{name}/advance",
    ] {
        let answer = &document["paths"][path]["post"]["responses"]["409"];
        let description = answer["description"].as_str().unwrap_or_default();
        assert!(
            description.contains("`no-such-message`"),
            "{path}: {answer}"
        );
        assert!(
            answer["content"]["application/problem+json"].is_object(),
            "{path}: {answer}"
        );
    }
    app.finish().await;
}

on_both_backends!(
    every_error_of_every_route_is_a_problem,
    guard_rails_answer_problems_on_every_route,
    naming_a_message_the_thread_lacks_is_409_no_such_message
);

/// The walk itself can fail: a handler answering a plain JSON error is caught.
#[test]
fn the_checker_refuses_an_error_that_is_not_a_problem() {
    let document = loupe::http::openapi();
    let mut checker = Checker::new(&document);
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    let plain = TestResponse {
        status: StatusCode::NOT_FOUND,
        headers,
        body: json!({"error": "thread not found"}),
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        checker.check("a plain error", &plain, None)
    }));
    assert!(caught.is_err());
}
