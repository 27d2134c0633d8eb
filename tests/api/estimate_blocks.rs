//! The context estimate against today's provider block types: documents (text, blocks, PDF),
//! server tool results with nested documents, server-side compaction; and what a first call
//! beside them may teach. Each test is a finding of the review of issue 36.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::common::{user, TestApp};

on_both_backends!(
    a_text_document_in_a_tool_result_counts_near_its_text,
    one_pdf_counts_alike_in_a_tool_result_and_in_a_web_fetch_result,
    a_server_compaction_block_cuts_the_content_only_estimate,
    a_document_in_a_first_call_does_not_teach_its_text_as_overhead,
);

/// A response of `model` whose prompt was `prompt` tokens.
fn response(uuid: &str, id: &str, prompt: u64) -> Value {
    json!({"uuid": uuid, "type": "assistant", "message": {"role": "assistant", "id": id,
        "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "ok"}],
        "usage": {"input_tokens": prompt, "output_tokens": 1}}})
}

fn tool_call(uuid: &str, id: &str, tool: &str) -> Value {
    json!({"uuid": uuid, "type": "assistant", "message": {"role": "assistant", "id": id,
        "content": [{"type": "tool_use", "id": "toolu_1", "name": tool,
        "input": {"file_path": "/docs/spec.txt"}}]}})
}

fn tool_result(uuid: &str, content: Value) -> Value {
    json!({"uuid": uuid, "type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]}})
}

async fn estimate(app: &TestApp, thread: &str) -> (u64, u64) {
    let read = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let e = &read.body["context_tokens"];
    (
        e["tokens"].as_u64().unwrap(),
        e["upper_tokens"].as_u64().unwrap(),
    )
}

async fn stored_count(app: &TestApp, thread: &str) -> i64 {
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT context_tokens FROM threads WHERE thread_id = $1")
        .bind(thread)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    stored
}

/// A tool returns a 400 KB plain-text document as a `document` block (`source.type: "text"`;
/// Anthropic allows documents in a tool result). The provider counts its text (~100k tokens),
/// as it would the same text in a `text` block. (Found: any document counted 2,000 flat, so the
/// next request was estimated ~100k tokens low and the stored compaction trigger never fired.)
async fn a_text_document_in_a_tool_result_counts_near_its_text(app: TestApp) {
    let body = "word ".repeat(80_000);
    let as_text = json!([{"type": "text", "text": body}]);
    let as_document = json!([{"type": "document", "title": "spec.txt",
        "source": {"type": "text", "media_type": "text/plain", "data": body}}]);
    let mut figures = Vec::new();
    for (name, content) in [("as-text", as_text), ("as-document", as_document)] {
        let thread = app.thread(name).await;
        app.append(
            &thread,
            json!([
                user("q", "Read the spec."),
                response("a", "msg_1", 10_000),
                tool_call("c", "msg_2", "Read"),
                tool_result("r", content)
            ]),
        )
        .await;
        figures.push((
            name,
            estimate(&app, &thread).await,
            stored_count(&app, &thread).await,
        ));
    }
    let (text, document) = (figures[0].1 .0, figures[1].1 .0);
    assert!(
        document * 2 >= text,
        "the same 400 KB of text: {figures:?} (tokens, upper), stored count"
    );
    app.finish().await;
}

/// One 1 MB PDF (base64, ~1.4 M characters) read by a tool (`tool_result` → `document`) and
/// fetched by the server `web_fetch` tool (`web_fetch_tool_result` → `web_fetch_result` →
/// `document`). The provider counts the PDF by its pages either way. (Found: the estimate
/// counted it 2,000 in the first and ~400,000 in the second, the JSON of the block at 3.5
/// characters a token: a 200x difference for the same bytes, and a stored count past any
/// context window.)
async fn one_pdf_counts_alike_in_a_tool_result_and_in_a_web_fetch_result(app: TestApp) {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let data: String = (0..1_400_000_usize)
        .map(|i| ALPHABET[(i * 7 + i / 64) % 64] as char)
        .collect();
    let document = json!({"type": "document", "source": {"type": "base64",
        "media_type": "application/pdf", "data": format!("JVBERi0xLjQK{data}")}});
    let read = json!([
        user("q", "Read the paper."),
        response("a", "msg_1", 10_000),
        tool_call("c", "msg_2", "Read"),
        tool_result("r", json!([document.clone()]))
    ]);
    let fetched = json!([user("q", "Fetch the paper."), response("a", "msg_1", 10_000),
        {"uuid": "f", "type": "assistant", "message": {"role": "assistant", "id": "msg_2",
        "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch",
             "input": {"url": "https://example.com/paper.pdf"}},
            {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                "type": "web_fetch_result", "url": "https://example.com/paper.pdf",
                "retrieved_at": "2026-08-01T00:00:00Z", "content": document}},
            {"type": "text", "text": "The paper says..."}]}}]);
    let mut figures = Vec::new();
    for (name, entries) in [("read", read), ("fetched", fetched)] {
        let thread = app.thread(name).await;
        app.append(&thread, entries).await;
        figures.push((
            name,
            estimate(&app, &thread).await,
            stored_count(&app, &thread).await,
        ));
    }
    let (read, fetched) = (figures[0].1 .0, figures[1].1 .0);
    assert!(
        fetched <= 3 * read && read <= 3 * fetched,
        "one PDF: {figures:?} (tokens, upper), stored count"
    );
    app.finish().await;
}

/// A tenant's only first call names a private model; the thread is deleted. The overhead it
/// taught must be forgotten, and neither the model's name nor its digest may stay in the SQLite
/// file or its WAL (the contract of `forgetting.rs` for the thread's text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_threads_model_leaves_the_sqlite_file_and_its_wal() {
    use sha2::Digest;
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    const MODEL: &str = "acme-ft-CANARY-4o-legal-7f3a";
    let digest = hex::encode(sha2::Sha256::digest(MODEL.as_bytes()));
    let thread = app.thread("teacher").await;
    app.append(
        &thread,
        json!([user("q", "hello"), {"uuid": "a", "type": "assistant", "message": {
            "role": "assistant", "id": "msg_1", "model": MODEL,
            "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 20_000, "output_tokens": 1}}}]),
    )
    .await;
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let learned: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM model_overheads WHERE model = $1")
        .bind(&digest)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(learned, 1, "taught");
    pool.close().await;
    let path = app
        .url
        .strip_prefix("sqlite://")
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let files = [path.clone(), format!("{path}-wal")];
    let holds = |file: &str, needle: &str| {
        std::fs::read(file)
            .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
    };
    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left: Vec<(&String, &str)> = files
            .iter()
            .flat_map(|f| [(f, MODEL), (f, digest.as_str())])
            .filter(|(f, needle)| holds(f, needle))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still stored: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    for table in ["model_overheads", "overhead_sources"] {
        let rows: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rows, 0, "{table}");
    }
    pool.close().await;
    app.finish().await;
}

/// A window with no `usage` (an import without it) holding a server-side `compaction` block
/// (the API drops all blocks before the last compaction block; the normalizer cuts there too,
/// `view::cut_at_server_compaction`). (Found: the estimate still counted the 300 KB before it.)
async fn a_server_compaction_block_cuts_the_content_only_estimate(app: TestApp) {
    let thread = app.thread("compacted").await;
    let long = "word ".repeat(60_000);
    app.append(
        &thread,
        json!([user("q0", &long),
            {"uuid": "a0", "type": "assistant", "message": {"role": "assistant", "id": "msg_0",
             "content": [{"type": "text", "text": long}]}},
            {"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "msg_1",
             "content": [{"type": "compaction", "content": "We compared the two designs."},
                         {"type": "text", "text": "Next, the schema."}]}},
            user("q1", "And the schema?")]),
    )
    .await;
    let read = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let sent = serde_json::to_string(&read.body["messages"]).unwrap_or_default();
    assert!(
        !sent.contains("word word"),
        "the normalizer cut at the compaction"
    );
    let (tokens, upper) = estimate(&app, &thread).await;
    let stored = stored_count(&app, &thread).await;
    assert!(
        tokens < 1_000,
        "what is sent is ~40 tokens; estimated {tokens} (upper {upper}), stored count {stored}"
    );
    app.finish().await;
}

/// The learned overhead is the first call's prompt less the content before it. (Found: a first
/// call whose window held a 400 KB text document, counted 2,000 flat, behind a 20,000-token
/// system prompt reported ~120,000 tokens, and ~118,000 was learned as the model's overhead,
/// which every content-only read of the tenant's other threads then added.)
async fn a_document_in_a_first_call_does_not_teach_its_text_as_overhead(app: TestApp) {
    let body = "word ".repeat(80_000);
    let teacher = app.thread("teacher").await;
    app.append(
        &teacher,
        json!([{"uuid": "q", "type": "user", "message": {"role": "user", "content": [
                {"type": "document", "title": "spec.txt", "source": {"type": "text",
                 "media_type": "text/plain", "data": body}},
                {"type": "text", "text": "Summarize the spec."}]}},
            response("a", "msg_1", 20_000 + 100_000)]),
    )
    .await;
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q", "hello")])).await;
    let read = app.get(&format!("/v1/threads/{fresh}/context")).await;
    let estimate = &read.body["context_tokens"];
    assert!(
        estimate["overhead_tokens"].as_u64().unwrap_or(0) < 40_000,
        "a one-word thread of a 20,000-token-overhead model: {estimate}"
    );
    app.finish().await;
}
