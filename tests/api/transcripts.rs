//! Real agent transcripts: import (HTTP and CLI), export, byte-for-byte round trips, every entry
//! type stored, Claude Code's field names understood. Fixtures: `tests/fixtures/claude-code/`, a
//! Claude Code 2.1 session (progress floods, snapshots, queue operations, an old-style summary,
//! system subtypes, thinking with signatures, an image, an API error, two compactions, one with a
//! preserved segment) and its sub-agent's own file.

use crate::common::TestApp;
use axum::http::{Method, StatusCode};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

on_both_backends!(
    import_then_export_gives_every_line_back,
    a_reimport_stores_nothing_and_a_partial_one_continues,
    unknown_types_are_listed_with_their_type_and_never_sent,
    claude_code_field_names_mean_what_they_say,
    bad_lines_are_refused_with_their_reason_and_the_rest_is_stored,
    the_cli_imports_and_exports_on_the_database_and_through_a_server,
    a_reported_usage_anchors_the_estimate_and_triggers_auto_compaction,
    a_json_array_imports_and_exports_as_json_lines_do,
    a_json_import_that_is_not_one_array_is_a_problem,
    a_json_import_keeps_the_bounds_of_json_lines,
    a_refused_giant_item_leaves_a_small_report,
    overlapping_imports_of_the_same_entries_both_succeed,
    many_sub_agents_are_counted_and_the_first_hundred_listed,
    a_byte_order_mark_is_read_alike_by_both_forms,
    the_cli_reads_a_json_array_file_and_fails_without_side_effects,
);

const SESSION: &str = include_str!("../fixtures/claude-code/session.jsonl");
const AGENT: &str = include_str!("../fixtures/claude-code/agent-a7c41e9.jsonl");

async fn export(app: &TestApp, thread: &str) -> String {
    let response = app.get(&format!("/v1/threads/{thread}/export")).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(
        response.headers.get("content-type").unwrap(),
        "application/x-ndjson"
    );
    // The helper parses a JSON body when it can; an export of several lines never is one.
    response.body.as_str().expect("JSON Lines").to_owned()
}

fn values(jsonl: &str) -> Vec<Value> {
    jsonl
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

async fn import_then_export_gives_every_line_back(app: TestApp) {
    let thread = app.thread("session").await;
    let report = app.import(&thread, &format!("{SESSION}{AGENT}")).await;
    let lines = SESSION.lines().count() + AGENT.lines().count();
    assert_eq!(report["lines"], lines as u64, "{report}");
    assert_eq!(report["stored"], lines as u64, "{report}");
    assert_eq!(report["refused"], 0, "{report}");
    assert_eq!(
        report["sidechain_threads"],
        json!(["session.agent-a7c41e9"])
    );

    // Byte for byte, so the JSON values (key order included) are the same too.
    let exported = export(&app, &thread).await;
    assert_eq!(exported, SESSION);
    assert_eq!(values(&exported), values(SESSION));
    let sub = export(&app, "session.agent-a7c41e9").await;
    assert_eq!(sub, AGENT);
    let metadata = app.get("/v1/threads/session.agent-a7c41e9").await.body["metadata"].clone();
    assert_eq!(metadata["parent_thread"], "session");
    assert_eq!(metadata["agent_id"], "a7c41e9");

    // Every entry got its seq, in line order.
    let page = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    let stored = page.body["messages"].as_array().unwrap();
    assert_eq!(stored.len(), SESSION.lines().count());
    for (index, (entry, line)) in stored.iter().zip(values(SESSION)).enumerate() {
        assert_eq!(entry["seq"], index as i64);
        assert_eq!(entry["type"], line["type"], "seq {index}");
    }

    // The context starts at the last boundary: its summary, then the preserved segment named
    // by uuids, then the rest; valid for the provider.
    let context = app
        .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let messages = context.body["messages"].as_array().unwrap();
    let texts: Vec<String> = messages.iter().map(|m| m["content"].to_string()).collect();
    assert!(texts[0].contains("now round 1.005 to 1.01"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("The CSV writer calls toFixed")),
        "the preserved segment is kept: {texts:?}"
    );
    assert!(texts.last().unwrap().contains("Opened the PR"), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains("amount parser rounded")));
    app.finish().await;
}

async fn a_reimport_stores_nothing_and_a_partial_one_continues(app: TestApp) {
    let thread = app.thread("again").await;
    // A crash after the first 40 lines: the re-run stores only the rest.
    let first: String = SESSION.lines().take(40).map(|l| format!("{l}\n")).collect();
    let report = app.import(&thread, &first).await;
    assert_eq!(report["stored"], 40);
    let report = app.import(&thread, SESSION).await;
    let total = SESSION.lines().count() as u64;
    assert_eq!(report["stored"], total - 40, "{report}");
    assert_eq!(report["already_stored"], 40, "{report}");
    let report = app.import(&thread, SESSION).await;
    assert_eq!(report["stored"], 0, "{report}");
    assert_eq!(report["already_stored"], total, "{report}");
    assert_eq!(export(&app, &thread).await, SESSION);
    // A file sent in two requests, the second continuing the first's uuid chain, names its
    // uuid-less entries as one request does.
    let other = app.thread("split").await;
    let (head, rest) =
        SESSION.split_at(SESSION.find("\n{\"type\":\"queue-operation\"").unwrap() + 1);
    let part = app.import(&other, head).await;
    let previous = part["last_uuid"].as_str().unwrap().to_owned();
    let response = app
        .raw_as(
            None,
            Method::POST,
            &format!("/v1/threads/{other}/import?previous_uuid={previous}"),
            Some("application/x-ndjson"),
            rest.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let uuids = |body: &Value| -> Vec<Value> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["uuid"].clone())
            .collect()
    };
    let a = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    let b = app
        .get(&format!("/v1/threads/{other}/messages?limit=1000"))
        .await;
    assert_eq!(uuids(&a.body), uuids(&b.body));
    app.finish().await;
}

async fn unknown_types_are_listed_with_their_type_and_never_sent(app: TestApp) {
    let thread = app.thread("kinds").await;
    let entries = json!([
        {"type": "summary", "summary": "Fix the parser", "leafUuid": "x1"},
        {"uuid": "u1", "type": "user", "message": {"role": "user", "content": "hi"}},
        {"type": "file-history-snapshot", "messageId": "u1", "snapshot": {"trackedFileBackups": {}}, "isSnapshotUpdate": false},
        {"type": "queue-operation", "operation": "enqueue", "content": "later"},
        {"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "m1", "content": [{"type": "text", "text": "hello"}]}},
    ]);
    app.append(&thread, entries.clone()).await;
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    let listed: Vec<(i64, String)> = page.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["seq"].as_i64().unwrap(),
                m["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (0, "summary".to_owned()),
            (1, "user".to_owned()),
            (2, "file-history-snapshot".to_owned()),
            (3, "queue-operation".to_owned()),
            (4, "assistant".to_owned())
        ]
    );
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(
        context.body["messages"].as_array().unwrap().len(),
        2,
        "{}",
        context.body
    );
    assert!(!context.body["messages"].to_string().contains("later"));
    // A whole transcript with such entries normalizes too.
    let normalized = app
        .post(
            "/v1/normalize",
            json!({"provider": "anthropic", "messages": entries}),
        )
        .await;
    assert_eq!(normalized.status, StatusCode::OK, "{}", normalized.body);
    assert_eq!(normalized.body["messages"].as_array().unwrap().len(), 2);
    app.finish().await;
}

async fn claude_code_field_names_mean_what_they_say(app: TestApp) {
    let thread = app.thread("camel").await;
    let entries = json!([
        {"uuid": "u0", "type": "user", "message": {"role": "user", "content": "Question one"}},
        {"uuid": "a0", "type": "assistant", "message": {"role": "assistant", "id": "m0", "content": [{"type": "text", "text": "Answer one"}]}},
        {"uuid": "b0", "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted", "logicalParentUuid": "a0",
         "compactMetadata": {"trigger": "manual", "preTokens": 40, "preservedSegment": {"headUuid": "a0", "anchorUuid": "s0", "tailUuid": "a0"}}},
        {"uuid": "s0", "type": "user", "isCompactSummary": true, "isVisibleInTranscriptOnly": true, "message": {"role": "user", "content": "SUMMARY of earlier work"}},
        {"uuid": "v0", "type": "user", "isVirtual": true, "message": {"role": "user", "content": "VIRTUAL inner call"}},
        {"uuid": "e0", "type": "assistant", "isApiErrorMessage": true, "message": {"role": "assistant", "id": "syn", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error: 529 Overloaded"}]}},
        {"uuid": "m1", "type": "user", "isMeta": true, "message": {"role": "user", "content": "<system-reminder>ctx</system-reminder>"}},
        {"uuid": "u1", "type": "user", "message": {"role": "user", "content": "Question two"}},
    ]);
    app.append(&thread, entries.clone()).await;
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let text = context.body["messages"].to_string();
    assert!(!text.contains("VIRTUAL"), "{text}");
    assert!(!text.contains("API Error"), "{text}");
    assert!(
        !text.contains("Question one"),
        "before the boundary: {text}"
    );
    assert!(text.contains("SUMMARY of earlier work"), "{text}");
    assert!(text.contains("Answer one"), "the preserved segment: {text}");
    assert!(text.contains("Question two"), "{text}");
    // Stored entries keep the spelling they came with.
    let exported = export(&app, &thread).await;
    assert_eq!(values(&exported), entries.as_array().unwrap().clone());
    assert!(exported.contains("\"isVirtual\":true"));
    assert!(!exported.contains("is_virtual"));
    // A retry of the same batch is a replay, whatever the spelling.
    let retry = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": entries}),
        )
        .await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["replayed"], true);
    app.finish().await;
}

async fn bad_lines_are_refused_with_their_reason_and_the_rest_is_stored(app: TestApp) {
    let thread = app.thread("bad").await;
    let body = concat!(
        "{\"uuid\":\"g1\",\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"one\"}}\n",
        "{this is not json\n",
        "\n",
        "{\"uuid\":\"g2\",\"type\":\"assistant\",\"message\":{\"role\":\"user\",\"content\":\"x\"}}\r\n",
        "{\"uuid\":\"g1\",\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"changed\"}}\n",
        "{\"uuid\":\"g3\",\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"three\"}}",
    );
    let report = app.import(&thread, body).await;
    assert_eq!(report["lines"], 5, "{report}");
    assert_eq!(report["stored"], 2, "{report}");
    assert_eq!(report["refused"], 3, "{report}");
    let refused: Vec<(u64, String)> = report["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["line"].as_u64().unwrap(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(refused[0].0, 2);
    assert!(refused[0].1.contains("not a valid entry"), "{refused:?}");
    assert_eq!(refused[1].0, 3);
    assert!(refused[1].1.contains("message.role"), "{refused:?}");
    assert_eq!(refused[2].0, 4);
    assert!(refused[2].1.contains("other content"), "{refused:?}");

    let wrong_type = app
        .raw_as(
            None,
            Method::POST,
            &format!("/v1/threads/{thread}/import"),
            Some("text/plain"),
            b"{}".to_vec(),
        )
        .await;
    wrong_type.assert_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type");
    let missing = app
        .raw_as(
            None,
            Method::POST,
            "/v1/threads/nope/import",
            Some("application/x-ndjson"),
            b"{}".to_vec(),
        )
        .await;
    missing.assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get("/v1/threads/nope/export")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

async fn the_cli_imports_and_exports_on_the_database_and_through_a_server(app: TestApp) {
    use clap::Parser;
    let dir = std::env::temp_dir().join(format!("loupe-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let session = dir.join("session.jsonl");
    let agent = dir.join("agent.jsonl");
    std::fs::write(&session, SESSION).unwrap();
    std::fs::write(&agent, AGENT).unwrap();
    let run = |args: Vec<String>| async move {
        loupe::cli::run(loupe::cli::Cli::parse_from(args))
            .await
            .unwrap();
    };
    let s = |v: &str| v.to_owned();

    // On the database directly, twice (the second run stores nothing new).
    for _ in 0..2 {
        run(vec![
            s("loupe"),
            s("import"),
            s("--thread"),
            s("direct"),
            s("--database-url"),
            app.url.clone(),
            session.display().to_string(),
            agent.display().to_string(),
        ])
        .await;
    }
    let out = dir.join("direct.jsonl");
    run(vec![
        s("loupe"),
        s("export"),
        s("--thread"),
        s("direct"),
        s("--database-url"),
        app.url.clone(),
        s("-o"),
        out.display().to_string(),
    ])
    .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap(), SESSION);
    // The sub-agent's file went to its own thread, linked to its parent.
    assert_eq!(export(&app, "direct.agent-a7c41e9").await, AGENT);
    let sidechain = app.get("/v1/threads/direct.agent-a7c41e9").await.body;
    assert_eq!(sidechain["metadata"]["parent_thread"], "direct");
    assert_eq!(sidechain["metadata"]["sidechain"], true);

    // Through a running server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = app.router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    run(vec![
        s("loupe"),
        s("import"),
        s("--thread"),
        s("remote"),
        s("--url"),
        base.clone(),
        session.display().to_string(),
        agent.display().to_string(),
    ])
    .await;
    let out = dir.join("remote.jsonl");
    run(vec![
        s("loupe"),
        s("export"),
        s("--thread"),
        s("remote.agent-a7c41e9"),
        s("--url"),
        base,
        s("-o"),
        out.display().to_string(),
    ])
    .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap(), AGENT);
    assert_eq!(export(&app, "remote").await, SESSION);
    server.abort();
    std::fs::remove_dir_all(&dir).unwrap();
    app.finish().await;
}

/// A generated transcript of about 24 MB (a session's shape: progress floods between tool
/// rounds) goes through the streaming importer in one pass, in batches, and comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_generated_transcript_streams_through_in_batches() {
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let thread = app.thread("large").await;
    let lines = generated_transcript(60_000);
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    assert!(bytes > 20_000_000, "{bytes} bytes");
    let tenant = loupe::store::TenantId::default_tenant();
    let mut importer = loupe::import::Importer::new(
        app.store.clone(),
        tenant.clone(),
        thread.clone().into(),
        String::new(),
    );
    let mut splitter = loupe::import::LineSplitter::new(1 << 20);
    // Fed in 64 KiB pieces that cut lines anywhere, as a socket or a file delivers them.
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    for chunk in text.as_bytes().chunks(64 * 1024) {
        for piece in splitter.feed(chunk) {
            importer.push_piece(piece).await.unwrap();
        }
    }
    assert!(splitter.finish().is_none());
    let report = importer.finish().await.unwrap();
    assert_eq!(report.lines, 60_000);
    assert_eq!(report.stored, 60_000);
    assert_eq!(report.refused, 0);
    let last = app
        .store
        .export_page(
            &tenant,
            &thread.as_str().into(),
            loupe::store::Seq::new(59_998),
            10,
            loupe::store::PageBytes::unroomed(i64::MAX),
        )
        .await
        .unwrap();
    assert_eq!(last, [(59_999, lines[59_999].clone())]);
    app.finish().await;
}

/// An HTTP import streams: a body larger than the body limit that takes longer than the request
/// timeout to arrive is read to its end, as long as each piece comes within the body-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_import_may_outlast_the_request_timeout_and_the_body_limit() {
    let limits = loupe::http::Limits {
        request_timeout: std::time::Duration::from_millis(600),
        body_read_timeout: std::time::Duration::from_secs(5),
        body_bytes: 64 * 1024,
        rate_limit_per_sec: 0.0,
        ..loupe::http::Limits::default()
    };
    let app = TestApp::with_limits(crate::common::Backend::Sqlite, limits).await;
    let thread = app.thread("streamed").await;
    let lines = generated_transcript(1_500);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    assert!(text.len() > 4 * 64 * 1024, "{} bytes", text.len());
    let pieces: Vec<axum::body::Bytes> = text
        .as_bytes()
        .chunks(text.len() / 4 + 1)
        .map(axum::body::Bytes::copy_from_slice)
        .collect();
    let response = app.send(slow_import(&thread, pieces, 300)).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(response.body["lines"], 1_500);
    assert_eq!(response.body["stored"], 1_500);
    assert_eq!(export(&app, &thread).await, text);
    app.finish().await;
}

/// A body that stops arriving is cut off with 408 `body-timeout`; the batches committed before the
/// stall stay, and re-sending the whole file stores only the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_import_is_cut_off_and_a_retry_continues() {
    let limits = loupe::http::Limits {
        body_read_timeout: std::time::Duration::from_millis(300),
        rate_limit_per_sec: 0.0,
        ..loupe::http::Limits::default()
    };
    let app = TestApp::with_limits(crate::common::Backend::Sqlite, limits).await;
    let thread = app.thread("stalled").await;
    let lines = generated_transcript(700);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    // 600 whole lines, then silence for longer than the body-read timeout.
    let cut = lines[..600].iter().map(|l| l.len() + 1).sum::<usize>();
    let pieces = vec![
        axum::body::Bytes::copy_from_slice(&text.as_bytes()[..cut]),
        axum::body::Bytes::copy_from_slice(&text.as_bytes()[cut..]),
    ];
    let response = app.send(slow_import(&thread, pieces, 1_500)).await;
    response.assert_problem(StatusCode::REQUEST_TIMEOUT, "body-timeout");
    let stored = values(&export(&app, &thread).await).len();
    assert!(
        (500..600).contains(&stored),
        "the first batch of 500 is committed, the unfinished one is not: {stored}"
    );
    let report = app.import(&thread, &text).await;
    assert_eq!(report["already_stored"], stored);
    assert_eq!(report["stored"], 700 - stored);
    assert_eq!(export(&app, &thread).await, text);
    app.finish().await;
}

/// An import request whose body arrives in `pieces`, with `pause_ms` before each piece after the
/// first.
fn slow_import(
    thread: &str,
    pieces: Vec<axum::body::Bytes>,
    pause_ms: u64,
) -> axum::http::Request<axum::body::Body> {
    let stream = futures_util::stream::iter(pieces.into_iter().enumerate()).then(
        move |(index, piece)| async move {
            if index > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            }
            Ok::<_, std::convert::Infallible>(piece)
        },
    );
    axum::http::Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/threads/{thread}/import"))
        .header("content-type", "application/x-ndjson")
        .body(axum::body::Body::from_stream(stream))
        .unwrap()
}

/// Claude Code-shaped lines: rounds of a prompt, a tool call with usage, twelve progress events
/// and a tool result of a few hundred bytes.
fn generated_transcript(count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let uuid = format!("gen-{i:08}");
            let value = match i % 15 {
                0 => json!({"parentUuid": null, "isSidechain": false, "type": "user", "uuid": uuid,
                    "message": {"role": "user", "content": format!("Step {i}: run the tests again.")}}),
                1 => json!({"isSidechain": false, "type": "assistant", "uuid": uuid, "requestId": format!("req_{i}"),
                    "message": {"id": format!("msg_{i}"), "role": "assistant", "model": "claude-opus-4-5",
                        "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": "pnpm test"}}],
                        "usage": {"input_tokens": 3, "cache_read_input_tokens": 20_000 + i, "output_tokens": 40}}}),
                14 => json!({"isSidechain": false, "type": "user", "uuid": uuid,
                    "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{}", i - 13),
                        "content": "PASS src/parse/amount.test.ts\n".repeat(12)}]}}),
                _ => json!({"isSidechain": false, "type": "progress", "uuid": uuid, "toolUseID": format!("bash-progress-{i}"),
                    "data": {"type": "bash_progress", "output": "  PASS src/parse/amount.test.ts (12 ms)\n".repeat(8),
                        "elapsedTimeSeconds": i % 60}}),
            };
            value.to_string()
        })
        .collect()
}

/// The append path (not only the pure estimate): an assistant entry reporting `usage` sets the
/// thread's estimate to those figures, and crossing the threshold that way enqueues compaction,
/// although the entries' own text is tiny.
async fn a_reported_usage_anchors_the_estimate_and_triggers_auto_compaction(app: TestApp) {
    let thread = app.thread("anchored").await;
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"auto_compact_tokens": 10_000})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let uri = format!("/v1/threads/{thread}/messages");
    let small = app
        .post(
            &uri,
            json!({"messages": [crate::common::user("u0", "hello")]}),
        )
        .await;
    assert_eq!(small.status, StatusCode::CREATED, "{}", small.body);
    assert!(small
        .body
        .get("compaction_job_id")
        .is_none_or(Value::is_null));

    let reported = json!({"uuid": "a0", "type": "assistant", "message": {"role": "assistant",
        "id": "msg_0", "model": "claude-x", "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 12_000, "output_tokens": 40}}});
    let anchored = app.post(&uri, json!({"messages": [reported]})).await;
    assert_eq!(anchored.status, StatusCode::CREATED, "{}", anchored.body);
    assert!(
        anchored.body["compaction_job_id"].is_string(),
        "crossing the threshold by reported usage enqueues a compaction: {}",
        anchored.body
    );

    let context = app
        .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    assert_eq!(context.body["context_tokens"]["basis"], "usage");
    assert!(context.body["context_tokens"]["tokens"].as_i64().unwrap() >= 12_043);
    app.finish().await;
}

/// `lines` (JSON Lines) as one JSON array, each item on a line of its own.
fn as_array(lines: &str) -> String {
    let items: Vec<&str> = lines.lines().collect();
    format!("[\n{}\n]\n", items.join(",\n"))
}

/// An import of `body` as `application/json`.
async fn import_json(app: &TestApp, thread: &str, body: &[u8]) -> crate::common::TestResponse {
    app.raw_as(
        None,
        Method::POST,
        &format!("/v1/threads/{thread}/import"),
        Some("application/json"),
        body.to_vec(),
    )
    .await
}

/// The export asked for with `accept`: its content type and its text.
async fn export_accepting(app: &TestApp, thread: &str, accept: &str) -> (String, String) {
    let request = axum::http::Request::builder()
        .uri(format!("/v1/threads/{thread}/export"))
        .header("accept", accept)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let media = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(response.headers()["vary"], "accept");
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (media, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The JSON form of both directions: an array of the same entries, chosen by `Content-Type` on
/// import and `Accept` on export. It stores what the same lines store, byte for byte, and round
/// trips in either form; a re-import is idempotent, the uuid-less entries included.
async fn a_json_array_imports_and_exports_as_json_lines_do(app: TestApp) {
    let thread = app.thread("arrayed").await;
    let response = import_json(
        &app,
        &thread,
        as_array(&format!("{SESSION}{AGENT}")).as_bytes(),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let report = response.body;
    let lines = SESSION.lines().count() + AGENT.lines().count();
    assert_eq!(report["lines"], lines as u64, "{report}");
    assert_eq!(report["stored"], lines as u64, "{report}");
    assert_eq!(report["refused"], 0, "{report}");
    assert_eq!(
        report["sidechain_threads"],
        json!(["arrayed.agent-a7c41e9"])
    );
    // Stored as the lines store it: byte for byte.
    assert_eq!(export(&app, &thread).await, SESSION);
    assert_eq!(export(&app, "arrayed.agent-a7c41e9").await, AGENT);

    // Exported as an array when asked: the same bytes, each item on its line.
    let (media, array) = export_accepting(&app, &thread, "application/json").await;
    assert_eq!(media, "application/json");
    assert_eq!(array, as_array(SESSION));
    let parsed: Vec<Value> = serde_json::from_str(&array).unwrap();
    assert_eq!(parsed, values(SESSION));
    // JSON Lines stay the default, and win a tie.
    for accept in [
        "*/*",
        "application/x-ndjson",
        "application/json, application/x-ndjson",
        "text/html",
        "application/json;q=0",
    ] {
        let (media, text) = export_accepting(&app, &thread, accept).await;
        assert_eq!(
            (media.as_str(), text.as_str()),
            ("application/x-ndjson", SESSION),
            "{accept}"
        );
    }
    let (media, _) = export_accepting(
        &app,
        &thread,
        "application/x-ndjson;q=0.5, application/json",
    )
    .await;
    assert_eq!(media, "application/json");

    // The export imported back into an empty thread gives the same entries; into the same
    // thread, nothing new.
    let copy = app.thread("copy").await;
    let response = import_json(&app, &copy, array.as_bytes()).await;
    assert_eq!(
        response.body["stored"],
        SESSION.lines().count(),
        "{}",
        response.body
    );
    assert_eq!(export(&app, &copy).await, SESSION);
    let again = import_json(&app, &thread, array.as_bytes()).await;
    assert_eq!(again.body["stored"], 0, "{}", again.body);
    assert_eq!(
        again.body["already_stored"],
        SESSION.lines().count(),
        "{}",
        again.body
    );

    // A pretty-printed array: each entry stored on one line, the same entries.
    let pretty_thread = app.thread("pretty").await;
    let pretty = serde_json::to_string_pretty(&values(SESSION)).unwrap();
    let response = import_json(&app, &pretty_thread, pretty.as_bytes()).await;
    assert_eq!(
        response.body["stored"],
        SESSION.lines().count(),
        "{}",
        response.body
    );
    let stored = export(&app, &pretty_thread).await;
    assert_eq!(stored.lines().count(), SESSION.lines().count());
    assert_eq!(values(&stored), values(SESSION));

    // An empty thread is an empty array.
    let empty = app.thread("empty").await;
    let (_, text) = export_accepting(&app, &empty, "application/json").await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!([]));
    app.finish().await;
}

/// A JSON body that is not one array is 400 `bad-request` saying where, as a problem; an item
/// that is JSON but not an entry is refused in the report, as a line is.
async fn a_json_import_that_is_not_one_array_is_a_problem(app: TestApp) {
    let thread = app.thread("malformed").await;
    let entry = r#"{"uuid":"j1","type":"user","message":{"role":"user","content":"one"}}"#;
    for body in [
        String::new(),
        "{}".to_owned(),
        format!("[{entry}"),
        format!("[{entry},]"),
        format!("[{entry} {entry}]"),
        format!("[{entry}] []"),
        r#"[{"uuid": "x" "type": "user"}]"#.to_owned(),
    ] {
        let response = import_json(&app, &thread, body.as_bytes()).await;
        let problem = response.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("not a JSON array"),
            "{body:?}: {problem}"
        );
    }
    // The charset parameter is allowed; text is not JSON.
    let response = app
        .raw_as(
            None,
            Method::POST,
            &format!("/v1/threads/{thread}/import"),
            Some("application/json; charset=utf-8"),
            format!("[{entry}]").into_bytes(),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let response = app
        .raw_as(
            None,
            Method::POST,
            &format!("/v1/threads/{thread}/import"),
            Some("text/plain"),
            format!("[{entry}]").into_bytes(),
        )
        .await;
    response.assert_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type");

    // Items that are JSON but not entries: refused with their place, the others stored.
    let other = app.thread("items").await;
    let body = format!(
        r#"[{entry}, 5, {{"uuid":"j2","type":"assistant","message":{{"role":"user","content":"x"}}}}, {}]"#,
        entry.replace("j1", "j3")
    );
    let response = import_json(&app, &other, body.as_bytes()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let report = response.body;
    assert_eq!(
        (report["lines"].as_u64(), report["stored"].as_u64()),
        (Some(4), Some(2)),
        "{report}"
    );
    let places: Vec<u64> = report["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(places, [2, 3], "{report}");
    app.finish().await;
}

/// The JSON form is held to the bounds of JSON Lines: each item within the body limit (a longer
/// one refused, the rest imported) while the whole body is not; the thread's byte limit.
async fn a_json_import_keeps_the_bounds_of_json_lines(app: TestApp) {
    let limits = loupe::http::Limits {
        body_bytes: 16 * 1024,
        ..app.limits.clone()
    };
    let app = app
        .reconfigure(limits, loupe::http::AuthMode::Open)
        .with_store_options(|options| options.max_thread_bytes = 400_000)
        .await;
    let thread = app.thread("bounded").await;
    let lines = generated_transcript(300);
    let mut items: Vec<String> = lines.clone();
    let long = json!({"uuid": "too-long", "type": "user",
        "message": {"role": "user", "content": "z".repeat(20 * 1024)}})
    .to_string();
    items.insert(10, long);
    let body = format!("[{}]", items.join(","));
    assert!(body.len() > 4 * 16 * 1024, "{} bytes", body.len());
    let response = import_json(&app, &thread, body.as_bytes()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let report = response.body;
    assert_eq!(report["stored"], 300, "{report}");
    assert_eq!(report["refused"], 1, "{report}");
    assert_eq!(report["refusals"][0]["line"], 11, "{report}");
    assert_eq!(
        report["refusals"][0]["reason"],
        "the entry is longer than the limit"
    );

    // Past the thread's byte limit: 413 `thread-too-large`, the batches before stored.
    let full = app.thread("full").await;
    let lines = generated_transcript(1_200);
    let body = format!("[{}]", lines.join(","));
    assert!(body.len() > 400_000);
    let response = import_json(&app, &full, body.as_bytes()).await;
    response.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "thread-too-large");
    app.assert_stored_bytes_counted(&full).await;
    app.finish().await;
}

/// A refused item's parser message can quote the item whole: the report keeps a bounded prefix
/// of each reason, so a body of huge refused items cannot make a huge answer.
async fn a_refused_giant_item_leaves_a_small_report(app: TestApp) {
    let thread = app.thread("giant-refusals").await;
    let giant = format!("\"{}\"", "s".repeat(2 << 20));
    let lines = [giant.as_str(); 4].join("\n");
    let report = app.import(&thread, &lines).await;
    let array = format!("[{}]", [giant.as_str(); 4].join(","));
    let response = import_json(&app, &thread, array.as_bytes()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    for report in [report, response.body] {
        assert_eq!(report["refused"], 4, "{report}");
        let text = report.to_string();
        assert!(text.len() < 4_000, "a {}-byte report", text.len());
        let reason = report["refusals"][0]["reason"].as_str().unwrap();
        assert!(reason.starts_with("not a valid entry"), "{reason}");
        assert!(reason.ends_with('…'), "{reason}");
    }
    app.finish().await;
}

/// A client that retries an import while the first is still running sends the same entries
/// twice at once. Whichever stores an entry first, the other counts it as already stored: both
/// succeed, and the thread holds each entry once.
async fn overlapping_imports_of_the_same_entries_both_succeed(app: TestApp) {
    let thread = app.thread("overlap").await;
    let entries: Vec<String> = (0..3_000)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"type": role, "uuid": format!("u-{i:05}"),
                   "message": {"role": role, "content": format!("turn {i}")}})
            .to_string()
        })
        .collect();
    let imports = (0..4).map(|rotation| {
        let mut lines = entries.clone();
        lines.rotate_left(rotation * 250);
        let (app, thread) = (&app, thread.clone());
        async move {
            let body = lines.join("\n");
            let response = app
                .raw_as(
                    None,
                    Method::POST,
                    &format!("/v1/threads/{thread}/import"),
                    Some("application/x-ndjson"),
                    body.into_bytes(),
                )
                .await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.body);
            response.body
        }
    });
    let reports = futures_util::future::join_all(imports).await;
    let stored: u64 = reports.iter().map(|r| r["stored"].as_u64().unwrap()).sum();
    for report in &reports {
        assert_eq!(report["refused"], 0, "{report}");
        let counted =
            report["stored"].as_u64().unwrap() + report["already_stored"].as_u64().unwrap();
        assert_eq!(counted, 3_000, "{report}");
    }
    assert_eq!(stored, 3_000);
    let thread_row = app.get(&format!("/v1/threads/{thread}")).await.body;
    assert_eq!(thread_row["message_count"], 3_000, "{thread_row}");
    app.finish().await;
}

/// Each sub-agent gets a thread; the report names the first hundred and counts them all.
async fn many_sub_agents_are_counted_and_the_first_hundred_listed(app: TestApp) {
    let thread = app.thread("agents").await;
    let lines: Vec<String> = (0..130)
        .map(|i| {
            json!({"type": "user", "uuid": format!("a-{i}"), "isSidechain": true,
                   "agentId": format!("agent{i:03}"),
                   "message": {"role": "user", "content": "go"}})
            .to_string()
        })
        .collect();
    let report = app.import(&thread, &lines.join("\n")).await;
    assert_eq!(report["stored"], 130, "{report}");
    assert_eq!(report["sidechain_thread_count"], 130);
    assert_eq!(report["sidechain_threads"].as_array().unwrap().len(), 100);
    app.finish().await;
}

/// Some editors start a file with a UTF-8 byte-order mark: both forms read past it, so the
/// first entry is stored, not refused.
async fn a_byte_order_mark_is_read_alike_by_both_forms(app: TestApp) {
    let first = SESSION.lines().next().unwrap();
    let lines_thread = app.thread("bom-lines").await;
    let report = app
        .import(&lines_thread, &format!("\u{feff}{first}\n"))
        .await;
    assert_eq!(
        (report["stored"].as_u64(), report["refused"].as_u64()),
        (Some(1), Some(0)),
        "{report}"
    );
    let array_thread = app.thread("bom-array").await;
    let response = import_json(&app, &array_thread, format!("\u{feff}[{first}]").as_bytes()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(response.body["stored"], 1, "{}", response.body);
    let lines_export = export_accepting(&app, &lines_thread, "application/x-ndjson").await;
    let array_export = export_accepting(&app, &array_thread, "application/x-ndjson").await;
    assert_eq!(lines_export.1, format!("{first}\n"));
    assert_eq!(lines_export, array_export);
    app.finish().await;
}

/// `loupe import` reads the server's JSON export as it reads JSON Lines (pretty-printed too), a
/// mistyped input file creates no thread, and a failed export leaves an existing file whole.
async fn the_cli_reads_a_json_array_file_and_fails_without_side_effects(app: TestApp) {
    use clap::Parser;
    let dir = std::env::temp_dir().join(format!("loupe-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let run =
        |args: Vec<String>| async move { loupe::cli::run(loupe::cli::Cli::parse_from(args)).await };
    let s = |v: &str| v.to_owned();
    let entries: Vec<Value> = values(SESSION);
    let pretty = dir.join("session.json");
    std::fs::write(&pretty, serde_json::to_string_pretty(&entries).unwrap()).unwrap();
    let import_args = |thread: &str, file: &std::path::Path| {
        vec![
            s("loupe"),
            s("import"),
            s("--thread"),
            s(thread),
            s("--database-url"),
            app.url.clone(),
            file.display().to_string(),
        ]
    };
    run(import_args("from-json", &pretty)).await.unwrap();
    assert_eq!(values(&export(&app, "from-json").await), entries);

    let missing = dir.join("no-such-file.jsonl");
    let error = run(import_args("never-made", &missing)).await.unwrap_err();
    assert!(format!("{error:#}").contains("cannot open"), "{error:#}");
    let response = app.get("/v1/threads/never-made").await;
    assert_eq!(response.status, StatusCode::NOT_FOUND, "{}", response.body);

    let backup = dir.join("backup.jsonl");
    std::fs::write(&backup, "keep me\n").unwrap();
    let error = run(vec![
        s("loupe"),
        s("export"),
        s("--thread"),
        s("typo"),
        s("--database-url"),
        app.url.clone(),
        s("-o"),
        backup.display().to_string(),
    ])
    .await
    .unwrap_err();
    assert!(format!("{error:#}").contains("not found"), "{error:#}");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), "keep me\n");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    app.finish().await;
}
