//! The NUL character (issue 53): JSON lets a caller send one (`\u0000`, a binary file read by a
//! tool), PostgreSQL's `text` cannot hold one. An entry holding one is stored as sent, and what
//! Loupe derives from it (search rows, anchors, outline lines, summaries) never makes a read
//! fail. Metadata holding one is stored as sent: the API's schema allows it (PostgreSQL's
//! `jsonb` filter index leaves such a thread out; refusing it at write time broke the schema).

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};

use crate::common::{assistant, user, TestApp};
use crate::tree::{compact, drain, exchange, outline_on, runner};

on_both_backends!(
    a_nul_in_an_entry_leaves_search_working,
    an_entry_with_a_nul_reads_back_as_sent,
    outlines_summaries_and_ledgers_take_a_nul,
    a_huge_entry_of_distinct_words_leaves_search_working,
    metadata_with_a_nul_is_stored_as_sent,
);

/// A tool's output read from a binary file: NULs among words.
const BINARY_OUTPUT: &str =
    "\u{7f}ELF\u{2}\u{1}\u{0}\u{0}\u{0} zebrafish section .text\u{0}\u{0}end";

fn reading_a_binary_file(i: usize) -> Vec<Value> {
    vec![
        json!({"uuid": format!("call{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_call{i}"), "content": [{"type": "tool_use", "id": format!("toolu_{i}"),
            "name": "Read", "input": {"file_path": "/usr/bin/zebra\u{0}fish"}}]}}),
        json!({"uuid": format!("result{i}"), "type": "user", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
            "content": BINARY_OUTPUT}]}}),
    ]
}

fn hit_seqs(found: &Value) -> Vec<i64> {
    found["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("no hits: {found}"))
        .iter()
        .map(|hit| hit["seq"].as_i64().unwrap())
        .collect()
}

async fn a_nul_in_an_entry_leaves_search_working(app: TestApp) {
    let thread = app.thread("nul-search").await;
    app.append(&thread, vec![user("u0", "Read the zebrafish binary.")])
        .await;
    app.append(&thread, reading_a_binary_file(1)).await;
    app.append(
        &thread,
        vec![assistant("a3", "msg_3", "It is an ELF file.")],
    )
    .await;
    // The thread's search, by a word of the entry other than its NULs.
    let found = app
        .get(&format!("/v1/threads/{thread}/search?q=section"))
        .await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(hit_seqs(&found.body), [2], "{}", found.body);
    assert_eq!(found.body["index"]["pending"], 0, "{}", found.body);
    let snippet = found.body["hits"][0]["snippet"].as_str().unwrap();
    assert!(
        snippet.contains("«section»") && !snippet.contains('\0'),
        "{snippet:?}"
    );
    // Tenant-wide.
    let tenant = app.get("/v1/search?q=section").await;
    assert_eq!(tenant.status, StatusCode::OK, "{}", tenant.body);
    assert_eq!(hit_seqs(&tenant.body), [2], "{}", tenant.body);
    // The search tool a model calls.
    let tool = app
        .post(
            &format!("/v1/threads/{thread}/search"),
            json!({"query": "zebrafish section"}),
        )
        .await;
    assert_eq!(tool.status, StatusCode::OK, "{}", tool.body);
    assert_eq!(tool.body["is_error"], false, "{}", tool.body);
    assert!(
        tool.body["content"].as_str().unwrap().contains("2+1|"),
        "{}",
        tool.body
    );
    // Later entries are indexed too: the index did not stop at the NUL.
    app.append(&thread, vec![user("u4", "Now the quokka file.")])
        .await;
    let later = app
        .get(&format!("/v1/threads/{thread}/search?q=quokka"))
        .await;
    assert_eq!(later.status, StatusCode::OK, "{}", later.body);
    assert_eq!(hit_seqs(&later.body), [4], "{}", later.body);
    app.finish().await;
}

async fn an_entry_with_a_nul_reads_back_as_sent(app: TestApp) {
    let thread = app.thread("nul-raw").await;
    // Written by hand, with the escapes a client chose: stored with them (as compact JSON).
    let line = r#"{"uuid":"raw1","type":"user","message":{"role":"user","content":"a\u0000b \u0000 zebra"}}"#;
    let body = format!(
        r#"{{"messages": [{line}, {{"uuid": "raw2", "type": "user", "message": {{"role": "user", "content": "next"}}}}]}}"#
    );
    let appended = app
        .raw_as(
            None,
            Method::POST,
            &format!("/v1/threads/{thread}/messages"),
            Some("application/json"),
            body.into_bytes(),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(
        page.body["messages"][0]["message"]["content"],
        "a\u{0}b \u{0} zebra"
    );
    let export = app.get(&format!("/v1/threads/{thread}/export")).await;
    assert_eq!(export.status, StatusCode::OK, "{}", export.body);
    let exported = export.body.as_str().unwrap();
    assert!(exported.lines().any(|l| l == line), "{exported}");
    let found = app
        .get(&format!("/v1/threads/{thread}/search?q=zebra"))
        .await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(hit_seqs(&found.body), [0], "{}", found.body);
    app.finish().await;
}

/// Exchange `i`, its words around NULs: a line or a summary quoting it holds them.
fn nul_exchange(i: usize) -> Vec<Value> {
    let mut turns = exchange(
        i,
        &format!("Step {i}: open src/area_{i}/part\u{0}{i}.rs and run `cargo test area_{i}`\u{0}"),
        &format!(
            "Done\u{0}: area_{i} failed with E0{} at https://ci.example.com/run/{i}\u{0}x",
            200 + i
        ),
    );
    turns.extend(reading_a_binary_file(100 + i));
    turns
}

async fn outlines_summaries_and_ledgers_take_a_nul(app: TestApp) {
    // An outline built over entries with NULs: its jobs succeed (drain panics otherwise).
    let outlined = app.thread("nul-outline").await;
    outline_on(
        &app,
        &outlined,
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
    )
    .await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    for i in 0..16 {
        app.append(&outlined, nul_exchange(i)).await;
        drain(&runner).await;
    }
    let outline = app.get(&format!("/v1/threads/{outlined}/outline")).await;
    assert_eq!(outline.status, StatusCode::OK, "{}", outline.body);
    let lines = outline.body["lines"].as_array().unwrap();
    assert!(!lines.is_empty(), "{}", outline.body);
    let context = app
        .get(&format!("/v1/threads/{outlined}/context?view=outline"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let ledger = app
        .get(&format!("/v1/threads/{outlined}/ledger?summary=line"))
        .await;
    assert_eq!(ledger.status, StatusCode::OK, "{}", ledger.body);
    assert!(
        !ledger.body["summaries"].as_array().unwrap().is_empty(),
        "{}",
        ledger.body
    );
    // A compaction summarizing them, and the ledger of its summary.
    let compacted = app.thread("nul-compact").await;
    for i in 0..12 {
        app.append(&compacted, nul_exchange(i)).await;
    }
    compact(&app, &compacted, 2).await;
    let results = drain(&runner).await;
    assert!(
        results.iter().any(|result| result["compacted"] == true),
        "{results:?}"
    );
    let ledger = app
        .get(&format!(
            "/v1/threads/{compacted}/ledger?summary=compaction"
        ))
        .await;
    assert_eq!(ledger.status, StatusCode::OK, "{}", ledger.body);
    let summaries = ledger.body["summaries"].as_array().unwrap();
    assert_eq!(summaries.len(), 1, "{}", ledger.body);
    assert!(
        !summaries[0]["anchors"].as_array().unwrap().is_empty(),
        "{}",
        ledger.body
    );
    // The summary's entry is searched as any entry is.
    let summary_seq = summaries[0]["seq"].as_i64().unwrap();
    let found = app
        .get(&format!("/v1/threads/{compacted}/search?q=area_1"))
        .await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert!(
        hit_seqs(&found.body).contains(&summary_seq),
        "{summary_seq}: {}",
        found.body
    );
    let context = app.get(&format!("/v1/threads/{compacted}/context")).await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    app.finish().await;
}

async fn a_huge_entry_of_distinct_words_leaves_search_working(app: TestApp) {
    // 1.4 MB of distinct words: more than PostgreSQL's full-text vector holds (1 MiB), which
    // the ranking builds of each row it finds.
    let thread = app.thread("many-words").await;
    let words: Vec<String> = (0..64_000u64)
        .map(|i| format!("w{i:x}q{:x}z{:x}", i * 7919, i * 104_729))
        .collect();
    let output = format!("needle {}", words.join(" "));
    app.append(
        &thread,
        vec![
            json!({"uuid": "big", "type": "user", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output}]}}),
        ],
    )
    .await;
    let found = app
        .get(&format!("/v1/threads/{thread}/search?q=needle"))
        .await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(hit_seqs(&found.body), [0], "{}", found.body);
    let tenant = app.get("/v1/search?q=needle").await;
    assert_eq!(tenant.status, StatusCode::OK, "{}", tenant.body);
    assert_eq!(hit_seqs(&tenant.body), [0], "{}", tenant.body);
    app.finish().await;
}

/// Metadata is any JSON object, as the API's schema says: a NUL in a key or a string, at any
/// depth, is stored and read back as sent, on create, update and fork.
async fn metadata_with_a_nul_is_stored_as_sent(app: TestApp) {
    for (i, metadata) in [
        json!({"user": "a\u{0}b"}),
        json!({"us\u{0}er": "ana"}),
        json!({"deep": {"list": [1, "x\u{0}"]}}),
        json!({"deep": {"k\u{0}": true}}),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("nul-meta-{i}");
        let created = app
            .post("/v1/threads", json!({"id": id, "metadata": metadata}))
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        let thread = app.get(&format!("/v1/threads/{id}")).await;
        assert_eq!(thread.body["metadata"], metadata);
    }
    let patched = app
        .request(
            Method::PATCH,
            "/v1/threads/nul-meta-0",
            Some(json!({"metadata": {"note": "x\u{0}y"}})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    let thread = app.get("/v1/threads/nul-meta-0").await;
    assert_eq!(
        thread.body["metadata"],
        json!({"user": "a\u{0}b", "note": "x\u{0}y"})
    );
    app.finish().await;
}
