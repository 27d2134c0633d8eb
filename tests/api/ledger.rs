//! The loss ledger (issue 35): what each summary Loupe wrote kept and dropped of the anchors of
//! what it covers, its footer in what the model is sent, and rows that go with their source.

use std::sync::Arc;

use axum::http::StatusCode;
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};

use crate::common::{assistant, user, TestApp};
use crate::tree::{compact, drain, exchange, outline_on, runner};

on_both_backends!(
    a_compaction_ledger_marks_kept_and_dropped_and_the_footer_names_them,
    an_erased_anchor_leaves_the_ledger_and_the_footer,
    outline_lines_have_a_ledger_and_the_outline_a_footer,
    the_ledger_refuses_bad_parameters,
);

/// Exchange `i` of a working session: a question naming a file, a listing of its directory
/// (paths a summary has no room for), and an answer with a code, a figure and a URL.
fn work(i: usize) -> Vec<Value> {
    let listing: Vec<String> = (0..8)
        .map(|f| format!("src/area_{i}/part_{f}.rs"))
        .collect();
    let mut turns = exchange(
        i,
        &format!(
            "Step {i}: open src/area_{i}/handler_{i}.rs and run `cargo test area_{i}` again; \
             the weather report and other chatter about nothing in particular"
        ),
        &format!(
            "Done: the test area_{i} failed with E0{} after {}{} ms, see \
             https://ci.example.com/run/{i}. The weather is fine.",
            200 + i,
            100 + i,
            i
        ),
    );
    turns.insert(
        1,
        json!({"uuid": format!("ls{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_ls{i}"), "content": [{"type": "tool_use", "id": format!("toolu_ls{i}"),
            "name": "Bash", "input": {"command": format!("ls -R src/area_{i}")}}]}}),
    );
    turns.insert(
        2,
        json!({"uuid": format!("lsr{i}"), "type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_ls{i}"), "content": listing.join("\n")}]}}),
    );
    turns
}

async fn compacted(app: &TestApp, thread: &str) {
    let runner = runner(app, Arc::new(ExtractiveSummarizer::new()));
    for i in 0..14 {
        app.append(thread, work(i)).await;
    }
    compact(app, thread, 2).await;
    drain(&runner).await;
}

async fn ledger(app: &TestApp, thread: &str, query: &str) -> Value {
    let answer = app
        .get(&format!("/v1/threads/{thread}/ledger{query}"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body
}

/// The thread's stored entry at `seq`.
async fn entry_at(app: &TestApp, thread: &str, seq: i64) -> Value {
    let page = app
        .get(&format!(
            "/v1/threads/{thread}/messages?after_seq={}&limit=1",
            seq - 1
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.body["messages"][0].clone()
}

/// The text of the thread's message at `seq` (a summary's).
async fn message_text(app: &TestApp, thread: &str, seq: i64) -> String {
    let entry = entry_at(app, thread, seq).await;
    entry["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no text at {seq}: {entry}"))
        .to_owned()
}

fn summary_of<'a>(ledger: &'a Value, kind: &str) -> &'a Value {
    ledger["summaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["summary"] == kind)
        .unwrap_or_else(|| panic!("no {kind} summary: {ledger}"))
}

async fn a_compaction_ledger_marks_kept_and_dropped_and_the_footer_names_them(app: TestApp) {
    let thread = app.thread("ledger").await;
    compacted(&app, &thread).await;
    let all = ledger(&app, &thread, "").await;
    assert_eq!(all["index"]["pending"], 0, "{all}");
    let summary = summary_of(&all, "compaction");
    assert_eq!(summary["summarizer"], "extractive");
    let seq = summary["seq"].as_i64().unwrap();
    assert_eq!(summary["first_seq"], 0);
    let text = message_text(&app, &thread, seq).await;
    let (body, footer) = text
        .split_once("\n\n[Not kept in this summary; search finds them:")
        .unwrap_or_else(|| panic!("no footer: {text}"));
    let anchors = summary["anchors"].as_array().unwrap();
    // Every kind is found in the covered entries, and each anchor is marked by the summary.
    for kind in [
        "path",
        "command",
        "url",
        "identifier",
        "error_code",
        "number",
    ] {
        assert!(
            anchors.iter().any(|a| a["kind"] == kind),
            "{kind}: {summary}"
        );
    }
    let mut dropped_paths = 0;
    for anchor in anchors {
        let (anchor_text, kept) = (
            anchor["text"].as_str().unwrap(),
            anchor["kept"].as_bool().unwrap(),
        );
        assert_eq!(body.contains(anchor_text), kept, "{anchor} against {body}");
        let at = anchor["seq"].as_i64().unwrap();
        assert!(at < seq - 1, "an anchor of a covered entry: {anchor}");
        let holder = entry_at(&app, &thread, at).await["message"].to_string();
        assert!(holder.contains(anchor_text), "{anchor} is in {holder}");
        if anchor["kind"] == "path" && !kept {
            dropped_paths += 1;
        }
    }
    assert!(
        dropped_paths > 0,
        "the extractive summary dropped paths: {summary}"
    );
    assert_eq!(summary["counts"]["path"]["dropped"], dropped_paths);
    let word = if dropped_paths == 1 { "path" } else { "paths" };
    assert!(
        footer.contains(&format!("{dropped_paths} {word} (`")),
        "{footer}"
    );
    // The footer reaches the model with the summary, and what it names, search finds.
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(
        context.body.to_string().contains("search finds them"),
        "{}",
        context.body
    );
    let dropped = anchors
        .iter()
        .find(|a| a["kind"] == "path" && a["kept"] == false)
        .unwrap();
    let found = app
        .get(&format!(
            "/v1/threads/{thread}/search?q={}",
            dropped["text"].as_str().unwrap()
        ))
        .await;
    assert!(
        found.body["hits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|hit| hit["seq"] == dropped["seq"]),
        "{}",
        found.body
    );
    // Filters: one kind; dropped only (the counts still count both).
    let paths = ledger(&app, &thread, "?kind=path&summary=compaction").await;
    let listed = summary_of(&paths, "compaction")["anchors"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!listed.is_empty() && listed.iter().all(|a| a["kind"] == "path"));
    let only = ledger(&app, &thread, "?dropped_only=true").await;
    let only = summary_of(&only, "compaction");
    assert!(only["anchors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["kept"] == false));
    assert_eq!(only["counts"], summary["counts"]);
    app.finish().await;
}

async fn an_erased_anchor_leaves_the_ledger_and_the_footer(app: TestApp) {
    let thread = app.thread("ledger-erase").await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    app.append(
        &thread,
        vec![
            user(
                "secret",
                "the key sits in /srv/vault/canary_k9x.pem, keep it quiet",
            ),
            assistant("secret-a", "msg_secret", "noted"),
        ],
    )
    .await;
    for i in 0..10 {
        app.append(&thread, work(i)).await;
    }
    compact(&app, &thread, 2).await;
    drain(&runner).await;
    let canary = "/srv/vault/canary_k9x.pem";
    let before = ledger(&app, &thread, "").await;
    assert!(before.to_string().contains(canary), "{before}");

    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"uuids": ["secret"], "reason": "credential"}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    let after = ledger(&app, &thread, "").await;
    assert!(!after.to_string().contains(canary), "{after}");
    assert!(!after.to_string().contains("canary_k9x"), "{after}");
    let summary = summary_of(&after, "compaction");
    let text = message_text(&app, &thread, summary["seq"].as_i64().unwrap()).await;
    assert!(!text.contains("canary_k9x"), "{text}");
    // The footer was derived again with the summary: it still names what was dropped.
    if summary["counts"]
        .as_object()
        .unwrap()
        .values()
        .any(|c| c["dropped"].as_u64().unwrap() > 0)
    {
        assert!(text.contains("search finds them"), "{text}");
    }
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(!context.body.to_string().contains("canary_k9x"));
    // Deleting the thread takes its ledger: the name answers 404.
    assert_eq!(
        app.delete(&format!("/v1/threads/{thread}")).await.status,
        StatusCode::NO_CONTENT
    );
    let gone = app.get(&format!("/v1/threads/{thread}/ledger")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    app.finish().await;
}

async fn outline_lines_have_a_ledger_and_the_outline_a_footer(app: TestApp) {
    let thread = app.thread("ledger-outline").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
    )
    .await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    for i in 0..24 {
        app.append(&thread, work(i)).await;
        drain(&runner).await;
    }
    let lines = ledger(&app, &thread, "?summary=line").await;
    let summaries = lines["summaries"].as_array().unwrap();
    assert!(!summaries.is_empty(), "{lines}");
    assert!(summaries.iter().all(|s| s["summary"] == "line"));
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    let shown = outline.body["lines"].as_array().unwrap();
    let mut dropped = 0;
    for summary in summaries {
        let (id, n) = (
            summary["line"]["id"].as_i64().unwrap(),
            summary["line"]["n"].as_i64().unwrap(),
        );
        assert_eq!(summary["first_seq"], id);
        assert_eq!(summary["end_seq"], id + n);
        let line = shown
            .iter()
            .find(|l| l["id"] == id && l["n"] == n)
            .unwrap_or_else(|| panic!("{id}+{n} is shown: {}", outline.body));
        for anchor in summary["anchors"].as_array().unwrap() {
            let kept = line["text"]
                .as_str()
                .unwrap()
                .contains(anchor["text"].as_str().unwrap());
            assert_eq!(anchor["kept"], kept, "{anchor} against {line}");
            dropped += usize::from(!kept);
        }
    }
    assert!(dropped > 0, "short lines drop anchors: {lines}");
    let dropped_of = |kind: &str| -> u64 {
        summaries
            .iter()
            .filter_map(|s| s["counts"][kind]["dropped"].as_u64())
            .sum()
    };
    let context = app
        .get(&format!("/v1/threads/{thread}/context?view=outline"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let first = context.body["messages"][0].to_string();
    assert!(
        first.contains("Not kept in the lines above:") && first.contains("search tool finds them"),
        "{first}"
    );
    // The footer names every kind the lines' ledgers dropped: a shell call's command too,
    // which a line renders as `Bash(…)`.
    for (kind, word) in [("path", "path"), ("command", "command")] {
        assert!(dropped_of(kind) > 0, "{kind}: {lines}");
        assert!(first.contains(word), "{kind} in {first}");
    }
    app.finish().await;
}

async fn the_ledger_refuses_bad_parameters(app: TestApp) {
    let thread = app.thread("ledger-bad").await;
    for query in [
        "?kind=secret",
        "?summary=tree",
        "?limit=0",
        "?limit=201",
        "?dropped_only=maybe",
    ] {
        let answer = app
            .get(&format!("/v1/threads/{thread}/ledger{query}"))
            .await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            answer.body
        );
        assert_eq!(
            answer.headers["content-type"], "application/problem+json",
            "{query}"
        );
    }
    let none = app.get("/v1/threads/nobody/ledger").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{}", none.body);
    // A thread with no summary has an empty ledger.
    let empty = ledger(&app, &thread, "").await;
    assert_eq!(empty["summaries"], json!([]));
    app.finish().await;
}
