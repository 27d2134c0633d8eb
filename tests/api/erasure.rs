//! Erasure reaches every copy (issue 33): canaries planted in user text, assistant text, a tool
//! result, a thinking block and a document, in outlined and compacted threads whose summarizer
//! quotes everything it reads (its context lines and the summary before too), are erased while
//! a writer keeps appending. From the answer on no surface serves them, every context stays
//! valid, no acknowledged append is lost, and once the erasure's scrub is done the database
//! files hold none of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::{assistant, user, Backend, TestApp};
use crate::tree::{
    assert_hidden_everywhere, assert_valid, drain, exchange, keep_needles, outline_on,
    request_source, runner,
};
use async_trait::async_trait;
use axum::http::StatusCode;
use loupe::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use serde_json::{json, Value};

on_both_backends!(
    erased_canaries_leave_every_surface_and_the_database_files,
    an_erasure_answers_with_a_receipt_and_refuses_what_it_cannot_do,
    a_snip_reaches_the_compaction_summaries_that_covered_it,
    a_summary_apart_from_its_boundary_and_a_forged_tombstone_are_erased_too,
    an_erasure_whose_scrub_never_ran_is_scrubbed_at_the_next_start,
    an_erased_model_name_leaves_no_hash_in_the_database,
);

/// A summarizer as leaky as a model can be: it keeps every `NEEDLE-` word of what it reads,
/// its context lines and the summary it folds in included.
pub(crate) struct Leaky;

#[async_trait]
impl Summarizer for Leaky {
    fn name(&self) -> String {
        "leaky".to_owned()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let mut source = req.context.join(" ");
        if let Some(previous) = &req.previous_summary {
            source = format!("{source} {previous}");
        }
        source = format!("{source} {}", request_source(req));
        Ok(Summary {
            text: keep_needles(&source, req.max_bytes),
            summarizer: self.name(),
            // A model's line: it cost a call.
            calls: 1,
        })
    }
}

/// The canaries of thread `tag`, and the entries that carry them (uuids `c-<tag>-…`).
fn canaries(tag: &str) -> (Vec<String>, Vec<Value>, Vec<String>) {
    let c = |kind: &str| format!("NEEDLE-{kind}-{tag}");
    let names = ["USER", "ASSISTANT", "TOOL", "THINK", "DOC"]
        .map(c)
        .to_vec();
    let id = |what: &str| format!("c-{tag}-{what}");
    let entries = vec![
        user(&id("user"), &format!("my password is {} keep it", names[0])),
        assistant(
            &id("assistant"),
            &format!("msg_{tag}_a"),
            &format!("noted, the key is {}", names[1]),
        ),
        user(&format!("p-{tag}-tool"), "run the report"),
        json!({"type": "assistant", "uuid": id("tool-use"), "message": {"role": "assistant",
            "id": format!("msg_{tag}_t"), "content": [{"type": "tool_use", "id": format!("toolu_{tag}"),
            "name": "Bash", "input": {"command": "cat report"}}]}}),
        json!({"type": "user", "uuid": id("tool"), "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{tag}"),
             "content": format!("report says {}", names[2])}]}}),
        json!({"type": "assistant", "uuid": id("think"), "message": {"role": "assistant",
            "id": format!("msg_{tag}_k"), "content": [
            {"type": "thinking", "thinking": format!("the user wants {}", names[3]),
             "signature": "c2lnbmF0dXJl"},
            {"type": "text", "text": "the report is fine"}]}}),
        json!({"type": "user", "uuid": id("doc"), "message": {"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
             "data": format!("contract clause {}", names[4])}},
            {"type": "text", "text": "read this contract"}]}}),
        assistant(&format!("p-{tag}-read"), &format!("msg_{tag}_r"), "read it"),
    ];
    let erased = ["user", "assistant", "tool", "think", "doc"]
        .map(id)
        .to_vec();
    (names, entries, erased)
}

const FILLER: &str = "the weather report and other chatter about nothing in particular";

/// A thread with its canaries among exchanges, outlined, its tree built; compacted too when
/// `compacted` (twice, so a summary folds in the one before).
pub(crate) async fn planted_thread(
    app: &TestApp,
    tag: &str,
    compacted: bool,
) -> (Vec<String>, Vec<String>) {
    let runner = runner(app, Arc::new(Leaky));
    let thread = app.thread(tag).await;
    outline_on(
        app,
        &thread,
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
    )
    .await;
    let (names, planted, erased) = canaries(tag);
    for i in 0..12 {
        app.append(
            &thread,
            exchange(i, &format!("Question {i}: {FILLER}"), "ok"),
        )
        .await;
    }
    app.append(&thread, planted).await;
    // A progress flood (lines of their own, all empty), then a line long enough for a model:
    // the summarizer read the canaries' lines as its context across the flood.
    let flood: Vec<Value> = (0..300)
        .map(|i| json!({"type": "progress", "uuid": format!("f-{tag}-{i}"), "data": {"tick": i}}))
        .collect();
    app.append(&thread, flood).await;
    app.append(
        &thread,
        exchange(
            99,
            &format!("After the flood, a long question: {FILLER}, {FILLER}"),
            "ok",
        ),
    )
    .await;
    for i in 12..30 {
        app.append(
            &thread,
            exchange(i, &format!("Question {i}: {FILLER}"), "ok"),
        )
        .await;
        if compacted && (i == 20 || i == 29) {
            let compact = app
                .post(
                    &format!("/v1/threads/{thread}/compact"),
                    json!({"keep_recent_rounds": 2}),
                )
                .await;
            assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
        }
        drain(&runner).await;
    }
    (names, erased)
}

/// Every surface of the thread: model-facing ones (through [`assert_hidden_everywhere`]) and the
/// raw record (messages, export, rounds, a raw cursor batch, the thread's jobs).
pub(crate) async fn assert_gone_everywhere(app: &TestApp, thread: &str, secrets: &[&str]) {
    assert_hidden_everywhere(app, thread, secrets).await;
    let holds = |text: String| secrets.iter().find(|s| text.contains(**s)).copied();
    let mut surfaces = vec![
        format!("/v1/threads/{thread}/export"),
        format!("/v1/threads/{thread}/rounds"),
        format!("/v1/threads/{thread}/cursors/raw-reader/pending?limit=1000"),
        format!("/v1/threads/{thread}/jobs"),
        format!("/v1/threads/{thread}/erasures"),
    ];
    let mut after = String::new();
    loop {
        let page = app
            .get(&format!("/v1/threads/{thread}/messages?limit=200{after}"))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert_eq!(holds(page.body.to_string()), None, "messages page");
        match page.body["next_after_seq"].as_i64() {
            Some(next) => after = format!("&after_seq={next}"),
            None => break,
        }
    }
    let jobs = app.get(&format!("/v1/threads/{thread}/jobs")).await;
    for job in jobs.body["jobs"].as_array().into_iter().flatten() {
        surfaces.push(format!("/v1/jobs/{}", job["id"].as_str().unwrap()));
    }
    // Search finds none of them, in their thread or the tenant's (thinking included).
    for secret in secrets {
        surfaces.push(format!(
            "/v1/threads/{thread}/search?q={secret}&thinking=true"
        ));
        surfaces.push(format!("/v1/search?q={secret}&thinking=true"));
    }
    for uri in surfaces {
        let response = app.get(&uri).await;
        assert_eq!(response.status, StatusCode::OK, "{uri}: {}", response.body);
        assert_eq!(
            holds(response.body.to_string()),
            None,
            "{uri}: {}",
            response.body
        );
    }
}

/// Whether any of `secrets` is in the bytes of `file`.
fn file_holds(file: &str, secrets: &[String]) -> bool {
    std::fs::read(file).is_ok_and(|bytes| {
        secrets.iter().any(|secret| {
            bytes
                .windows(secret.len())
                .any(|window| window == secret.as_bytes())
        })
    })
}

/// What the database holds of `secrets` once every erasure says its scrub is done: the SQLite
/// file and WAL, or a `pg_dump` of the database.
pub(crate) async fn stored_copies(
    app: &TestApp,
    threads: &[&str],
    secrets: &[String],
) -> Vec<String> {
    // The scrub runs after the answer: wait for the receipts to say it is done (a bound on
    // waiting, not a timing under test).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for thread in threads {
        loop {
            let list = app.get(&format!("/v1/threads/{thread}/erasures")).await;
            let erasures = list.body["erasures"].as_array().unwrap().clone();
            if erasures.iter().all(|e| !e["storage_scrubbed_at"].is_null()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never scrubbed: {}",
                list.body
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    match app.backend {
        Backend::Sqlite => {
            let path = app
                .url
                .strip_prefix("sqlite://")
                .unwrap()
                .split('?')
                .next()
                .unwrap();
            [path.to_owned(), format!("{path}-wal")]
                .into_iter()
                .filter(|file| file_holds(file, secrets))
                .collect()
        }
        Backend::Postgres => {
            let dump = std::process::Command::new(pg_dump())
                .arg("--data-only")
                .arg(format!("--dbname={}", app.url))
                .output()
                .expect("run pg_dump");
            assert!(
                dump.status.success(),
                "{}",
                String::from_utf8_lossy(&dump.stderr)
            );
            // The planner's statistics sample column values too (not in a dump).
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
            let stats: Vec<String> = sqlx::query_scalar(
                "SELECT COALESCE(most_common_vals::text, '') || COALESCE(histogram_bounds::text, '') \
                 FROM pg_stats WHERE schemaname = current_schema()",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            pool.close().await;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&dump.stdout),
                stats.concat()
            );
            secrets
                .iter()
                .filter(|secret| text.contains(secret.as_str()))
                .cloned()
                .collect()
        }
    }
}

/// `pg_dump` on the PATH, or the newest one Debian installs.
fn pg_dump() -> String {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|dir| dir.path().join("bin/pg_dump"))
        .filter(|path| path.exists())
        .max();
    installed.map_or("pg_dump".to_owned(), |path| path.display().to_string())
}

async fn erased_canaries_leave_every_surface_and_the_database_files(app: TestApp) {
    let (outlined_names, outlined_erased) = planted_thread(&app, "outlined", false).await;
    let (compacted_names, compacted_erased) = planted_thread(&app, "compacted", true).await;
    let all: Vec<String> = outlined_names
        .iter()
        .chain(&compacted_names)
        .cloned()
        .collect();
    // Planted: the outline quotes them, and the compaction summary carries them.
    let outline = app.get("/v1/threads/outlined/outline").await;
    assert!(
        outline.body.to_string().contains(&outlined_names[0]),
        "{}",
        outline.body
    );
    let context = app.get("/v1/threads/compacted/context").await;
    assert!(
        context.body.to_string().contains(&compacted_names[0]),
        "{}",
        context.body
    );
    for cursor in ["reader", "raw-reader"] {
        for thread in ["outlined", "compacted"] {
            // Bookmarks at the start: their pending batches hold the whole thread.
            let response = app
                .get(&format!(
                    "/v1/threads/{thread}/cursors/{cursor}/pending?limit=1"
                ))
                .await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.body);
        }
    }
    if app.backend == Backend::Postgres {
        // As autovacuum would: the statistics now sample the bodies.
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
        sqlx::query("ANALYZE messages")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("ANALYZE tree_nodes")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    // Searched, so the search index holds them too.
    for (thread, names) in [
        ("outlined", &outlined_names),
        ("compacted", &compacted_names),
    ] {
        for name in names.iter() {
            let found = app
                .get(&format!(
                    "/v1/threads/{thread}/search?q={name}&thinking=true"
                ))
                .await;
            let hits = found.body["hits"].as_array().map_or(0, Vec::len);
            assert!(hits > 0, "{name}: {}", found.body);
        }
    }
    let before = stored_copies(&app, &["outlined", "compacted"], &all).await;
    assert!(!before.is_empty(), "planted in the files");

    // A writer appends to both threads while the erasures run.
    let stop = AtomicBool::new(false);
    let writer = async {
        let mut acknowledged = Vec::new();
        let mut i = 100;
        while !stop.load(Ordering::SeqCst) {
            for thread in ["outlined", "compacted"] {
                let uuid = format!("w-{thread}-{i}");
                let response = app
                    .post(
                        &format!("/v1/threads/{thread}/messages"),
                        json!({"messages": [user(&uuid, "more"), assistant(&format!("{uuid}-a"), &format!("msg_w{i}"), "ok")]}),
                    )
                    .await;
                if response.status == StatusCode::CREATED {
                    acknowledged.push((thread, uuid));
                }
            }
            i += 1;
            tokio::task::yield_now().await;
        }
        acknowledged
    };
    let erase_and_scan = async {
        for (thread, erased, names) in [
            ("outlined", &outlined_erased, &outlined_names),
            ("compacted", &compacted_erased, &compacted_names),
        ] {
            let receipt = app
                .post(
                    &format!("/v1/threads/{thread}/erasures"),
                    json!({"uuids": erased, "reason": "user request"}),
                )
                .await;
            assert_eq!(receipt.status, StatusCode::CREATED, "{}", receipt.body);
            assert_eq!(
                receipt.body["seqs"].as_array().unwrap().len(),
                5,
                "{}",
                receipt.body
            );
            assert_eq!(receipt.body["artifacts"]["messages"], 5, "{}", receipt.body);
            assert!(
                receipt.body["artifacts"]["tree_nodes"].as_u64().unwrap() > 0,
                "{}",
                receipt.body
            );
            if thread == "compacted" {
                assert_eq!(
                    receipt.body["artifacts"]["compaction_summaries"], 2,
                    "both summaries covered them: {}",
                    receipt.body
                );
            }
            // From the answer on, nothing serves them.
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            assert_gone_everywhere(&app, thread, &names).await;
        }
        stop.store(true, Ordering::SeqCst);
    };
    let (acknowledged, ()) = tokio::join!(writer, erase_and_scan);
    assert!(!acknowledged.is_empty(), "the writer ran alongside");
    for (thread, uuid) in &acknowledged {
        let export = app.get(&format!("/v1/threads/{thread}/export")).await;
        assert!(
            export.body.to_string().contains(uuid.as_str()),
            "lost {uuid}"
        );
    }

    // The tree job summarizes the stand-ins again; the summaries stay clean.
    let runner = runner(&app, Arc::new(Leaky));
    drain(&runner).await;
    let secrets: Vec<&str> = all.iter().map(String::as_str).collect();
    for thread in ["outlined", "compacted"] {
        assert_gone_everywhere(&app, thread, &secrets).await;
        // The tombstones: seq, uuid, type and role kept, content gone, the erasure named.
        let page = app
            .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
            .await;
        let tombstone = page.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["uuid"] == format!("c-{thread}-tool"))
            .unwrap()
            .clone();
        assert_eq!(tombstone["type"], "user", "{tombstone}");
        assert_eq!(tombstone["message"]["role"], "user", "{tombstone}");
        assert_eq!(tombstone["message"]["content"], json!([]), "{tombstone}");
        assert!(tombstone["erased"]["erasure_id"].is_string(), "{tombstone}");
        app.assert_stored_bytes_counted(thread).await;
    }
    let left = stored_copies(&app, &["outlined", "compacted"], &all).await;
    assert!(left.is_empty(), "still on disk: {left:?}");
    app.finish().await;
}

/// The receipt names the erased seqs and is listed; a repeated erasure answers the same seqs
/// without counting them again; unknown names or none are refused and change nothing.
async fn an_erasure_answers_with_a_receipt_and_refuses_what_it_cannot_do(app: TestApp) {
    let thread = app.thread("receipts").await;
    app.append(&thread, exchange(0, "my pin is NEEDLE-PIN", "ok"))
        .await;
    app.append(&thread, exchange(1, "thanks", "ok")).await;
    let uri = format!("/v1/threads/{thread}/erasures");
    let refused = [
        (json!({"uuids": ["u0", "nope"]}), StatusCode::CONFLICT),
        (json!({"seqs": [99]}), StatusCode::CONFLICT),
        (json!({"uuids": ["u0"], "seqs": [99]}), StatusCode::CONFLICT),
        (json!({"uuids": [""]}), StatusCode::CONFLICT),
        (json!({}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"uuids": [], "seqs": null}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"seqs": []}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"seqs": (0..1001).collect::<Vec<_>>()}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"seqs": [0], "reason": "x".repeat(501)}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (body, status) in refused {
        let response = app.post(&uri, body.clone()).await;
        assert_eq!(response.status, status, "{body}: {}", response.body);
        assert_eq!(
            response.headers["content-type"], "application/problem+json",
            "{}",
            response.body
        );
    }
    let missing = app
        .post("/v1/threads/nope/erasures", json!({"seqs": [0]}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert!(
        page.body.to_string().contains("NEEDLE-PIN"),
        "nothing changed"
    );

    // A read leaves a cached context: the erasure drops it, and says so.
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(context.body.to_string().contains("NEEDLE-PIN"));
    let first = app
        .post(&uri, json!({"seqs": [0], "reason": "asked"}))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(
        first.body["artifacts"]["cached_contexts"], 1,
        "{}",
        first.body
    );
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(
        !context.body.to_string().contains("NEEDLE-PIN"),
        "{}",
        context.body
    );
    assert_eq!(first.body["seqs"], json!([0]));
    assert_eq!(first.body["reason"], "asked");
    assert_eq!(first.body["artifacts"]["messages"], 1);
    // Both kinds of names together name their union, each entry once.
    let again = app.post(&uri, json!({"uuids": ["u0"], "seqs": [0]})).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    assert_eq!(again.body["seqs"], json!([0]));
    assert_eq!(
        again.body["artifacts"]["messages"], 0,
        "already a tombstone"
    );
    let list = app.get(&uri).await;
    let ids: Vec<&Value> = list.body["erasures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["erasure_id"])
        .collect();
    assert_eq!(ids, [&first.body["erasure_id"], &again.body["erasure_id"]]);
    // The stored receipt is the one answered (the scrub's time aside).
    let mut listed = list.body["erasures"][0].clone();
    let mut answered = first.body.clone();
    listed["storage_scrubbed_at"] = Value::Null;
    answered["storage_scrubbed_at"] = Value::Null;
    assert_eq!(listed, answered);
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(
        page.body["messages"][0]["erased"]["erasure_id"],
        first.body["erasure_id"]
    );
    assert!(!list.body.to_string().contains("NEEDLE-PIN"));
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert!(
        !page.body.to_string().contains("NEEDLE-PIN"),
        "{}",
        page.body
    );
    // The rest of the thread works: appends, contexts. An erased tool result is repaired as a
    // missing one is, and reported, for every provider.
    app.append(&thread, canaries("receipts").1).await;
    let erased = app.post(&uri, json!({"uuids": ["c-receipts-tool"]})).await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        assert_valid(&context.body, provider);
        assert!(!context.body.to_string().contains("NEEDLE-TOOL-receipts"));
        let kinds: Vec<&str> = context.body["repairs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["kind"].as_str())
            .collect();
        assert!(kinds.contains(&"erased"), "{provider}: {kinds:?}");
        assert!(
            kinds.contains(&"synthetic_tool_result"),
            "{provider}: {kinds:?}"
        );
    }
    app.assert_stored_bytes_counted(&thread).await;
    // A burst of erasures, while the thread is read: each answered (or told to come back, when
    // the tenant's expensive slots are taken) and, in the end, scrubbed (the scrubs run one at
    // a time, each covering those queued before it).
    let burst =
        futures_util::future::join_all((0..20).map(|_| app.post(&uri, json!({"seqs": [1]}))));
    let context_uri = format!("/v1/threads/{thread}/context");
    let read = app.get(&context_uri);
    let (burst, read) = tokio::join!(burst, read);
    let answered = |response: &crate::common::TestResponse, ok: StatusCode| {
        response.status == ok
            || (response.status == StatusCode::SERVICE_UNAVAILABLE
                && response.body["type"] == "urn:loupe:problem:overloaded")
    };
    assert!(answered(&read, StatusCode::OK), "{}", read.body);
    assert!(
        burst.iter().all(|r| answered(r, StatusCode::CREATED)),
        "{burst:?}"
    );
    assert!(burst.iter().any(|r| r.status == StatusCode::CREATED));
    let left = stored_copies(&app, &[thread.as_str()], &["NEEDLE-PIN".to_owned()]).await;
    assert!(left.is_empty(), "{left:?}");
    // The receipts page: two at a time, the same list in the same order.
    let all = app.get(&format!("{uri}?limit=1000")).await.body["erasures"].clone();
    let mut paged = Vec::new();
    let mut next = String::new();
    loop {
        let page = app.get(&format!("{uri}?limit=2{next}")).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        paged.extend(page.body["erasures"].as_array().unwrap().iter().cloned());
        match page.body["next_after"].as_str() {
            Some(after) => next = format!("&after={after}"),
            None => break,
        }
    }
    assert!(paged.len() > 3, "{paged:?}");
    assert_eq!(Value::Array(paged), all);
    app.finish().await;
}

/// A snip hides a message from the context, the summary a compaction wrote of it included: the
/// summary is derived again without it before the answer. The record keeps the message.
async fn a_snip_reaches_the_compaction_summaries_that_covered_it(app: TestApp) {
    let runner = runner(&app, Arc::new(Leaky));
    let thread = app.thread("snip-summary").await;
    app.append(
        &thread,
        exchange(0, "the door code is NEEDLE-DOOR", "noted"),
    )
    .await;
    for i in 1..8 {
        app.append(
            &thread,
            exchange(i, &format!("Question {i}: {FILLER}"), "ok"),
        )
        .await;
    }
    let compact = app
        .post(
            &format!("/v1/threads/{thread}/compact"),
            json!({"keep_recent_rounds": 2}),
        )
        .await;
    assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
    drain(&runner).await;
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(
        context.body.to_string().contains("NEEDLE-DOOR"),
        "planted: {}",
        context.body
    );

    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["u0"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        assert!(
            !context.body.to_string().contains("NEEDLE-DOOR"),
            "{provider}: {}",
            context.body
        );
        assert_valid(&context.body, provider);
    }
    let messages = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    let holders: Vec<&Value> = messages.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.to_string().contains("NEEDLE-DOOR"))
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "only the snipped message itself: {holders:?}"
    );
    assert_eq!(holders[0]["uuid"], "u0");
    app.finish().await;
}

/// BENCHMARKS.md's erasure figures: on a thread of `N` messages, compacted once and outlined, the
/// time an erasure takes to answer and from its answer to "no copy on disk" (the receipt's
/// `storage_scrubbed_at`, then the files scanned), beside an append of one message to the same
/// thread and a delete of a thread as large, in the same run. Prints; asserts only that the
/// text is gone.
/// `cargo test --release --test api erasure_figures -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn erasure_figures() {
    let mut backends = vec![Backend::Sqlite];
    if std::env::var("TEST_DATABASE_URL").is_ok() {
        backends.push(Backend::Postgres);
    }
    println!("| backend | messages | append of 1 | erasure answered | answer → scrubbed | delete of as many |");
    for backend in backends {
        for n in [1_000_usize, 10_000] {
            let app = TestApp::new(backend).await;
            let runner = runner(
                &app,
                Arc::new(loupe::summarize::ExtractiveSummarizer::new()),
            );
            for thread in ["erased", "deleted"] {
                app.thread(thread).await;
                outline_on(&app, thread, json!({"enabled": true})).await;
                for chunk in (0..n / 2).collect::<Vec<_>>().chunks(250) {
                    let batch: Vec<Value> = chunk
                        .iter()
                        .flat_map(|&i| {
                            let planted = thread == "erased" && i == n / 8;
                            let secret = if planted { " NEEDLE-FIGURE" } else { "" };
                            exchange(i, &format!("Question {i}: {FILLER}{secret}"), FILLER)
                        })
                        .collect();
                    app.append(thread, batch).await;
                }
                let compact = app
                    .post(&format!("/v1/threads/{thread}/compact"), json!({}))
                    .await;
                assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
                drain(&runner).await;
            }
            let started = std::time::Instant::now();
            app.append("erased", exchange(n, "one more", "ok")).await;
            let append = started.elapsed();
            let started = std::time::Instant::now();
            let receipt = app
                .post(
                    "/v1/threads/erased/erasures",
                    json!({"uuids": [format!("u{}", n / 8)]}),
                )
                .await;
            let answered = started.elapsed();
            assert_eq!(receipt.status, StatusCode::CREATED, "{}", receipt.body);
            let started = std::time::Instant::now();
            while app.get("/v1/threads/erased/erasures").await.body["erasures"][0]
                ["storage_scrubbed_at"]
                .is_null()
            {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let scrubbed = started.elapsed();
            let left = stored_copies(&app, &["erased"], &["NEEDLE-FIGURE".to_owned()]).await;
            let started = std::time::Instant::now();
            let deleted = app.delete("/v1/threads/deleted").await;
            let delete = started.elapsed();
            assert_eq!(deleted.status, StatusCode::NO_CONTENT);
            println!(
                "| {backend:?} | {n} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {}",
                append.as_secs_f64() * 1e3,
                answered.as_secs_f64() * 1e3,
                scrubbed.as_secs_f64() * 1e3,
                delete.as_secs_f64() * 1e3,
                receipt.body["artifacts"],
            );
            assert!(left.is_empty(), "{left:?}");
            app.finish().await;
        }
    }
}

/// Two shapes a review found an erasure missing: a compaction summary with other entries between
/// it and its boundary (an imported transcript's), still sent to the model; and an entry sent
/// with an `erased` field but content, which an erasure left whole.
async fn a_summary_apart_from_its_boundary_and_a_forged_tombstone_are_erased_too(app: TestApp) {
    let thread = app.thread("apart").await;
    app.append(
        &thread,
        vec![
            user("s", "the card is NEEDLE-CARD"),
            assistant("r", "msg_r", "ok"),
            json!({"type": "system", "uuid": "b", "subtype": "compact_boundary",
                "content": "Conversation compacted", "compactMetadata": {"trigger": "manual"}}),
            json!({"type": "progress", "uuid": "p", "data": {"tick": 1}}),
            json!({"type": "user", "uuid": "sum", "isCompactSummary": true, "message": {
                "role": "user", "content": "Summary: the user gave the card NEEDLE-CARD."}}),
            json!({"type": "user", "uuid": "forged", "erased": {"erasure_id": "nope",
                "erased_at": "2026-01-01T00:00:00Z"},
                "message": {"role": "user", "content": "forged NEEDLE-FORGED"}}),
            user("q", "next question"),
        ],
    )
    .await;
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(
        context.body.to_string().contains("NEEDLE-CARD"),
        "planted: {}",
        context.body
    );
    let uri = format!("/v1/threads/{thread}/erasures");
    let erased = app.post(&uri, json!({"uuids": ["s", "forged"]})).await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    assert_eq!(erased.body["artifacts"]["messages"], 2, "{}", erased.body);
    assert_eq!(
        erased.body["artifacts"]["compaction_summaries"], 1,
        "{}",
        erased.body
    );
    for uri in [
        format!("/v1/threads/{thread}/context"),
        format!("/v1/threads/{thread}/export"),
        format!("/v1/threads/{thread}/messages"),
    ] {
        let body = app.get(&uri).await.body.to_string();
        assert!(
            !body.contains("NEEDLE-CARD") && !body.contains("NEEDLE-FORGED"),
            "{uri}: {body}"
        );
    }
    app.finish().await;
}

/// A stop between an erasure's commit and its scrub leaves the receipt unscrubbed (and, on
/// SQLite, the text in the WAL): the next start scrubs it.
async fn an_erasure_whose_scrub_never_ran_is_scrubbed_at_the_next_start(app: TestApp) {
    let thread = app.thread("resumed").await;
    app.append(&thread, exchange(0, "my pin is NEEDLE-RESUME", "ok"))
        .await;
    let uri = format!("/v1/threads/{thread}/erasures");
    let erased = app.post(&uri, json!({"uuids": ["u0"]})).await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    stored_copies(&app, &[thread.as_str()], &[]).await;
    // As if the process had stopped before the scrub.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    sqlx::query("UPDATE erasures SET scrubbed_at = NULL")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let restarted = loupe::store::Store::connect(&loupe::store::StoreOptions::new(&app.url))
        .await
        .unwrap();
    assert_eq!(restarted.resume_scrubs().await.unwrap(), 1);
    let left = stored_copies(&app, &[thread.as_str()], &["NEEDLE-RESUME".to_owned()]).await;
    assert!(left.is_empty(), "{left:?}");
    restarted.close().await;
    app.finish().await;
}

/// An outside reader (a backup tool, a shell) holding an old snapshot of the SQLite file: the
/// scrub after an erasure waits for it without holding off writers meanwhile (a truncating
/// checkpoint that waits blocks every writer), and finishes once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_reader_never_stalls_writes_behind_a_scrub() {
    use sqlx::Connection;
    let app = TestApp::new(Backend::Sqlite).await;
    let thread = app.thread("held").await;
    app.append(&thread, exchange(0, "my pin is NEEDLE-HELD", "ok"))
        .await;
    let mut reader = sqlx::SqliteConnection::connect(&app.url).await.unwrap();
    let mut snapshot = reader.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages")
        .fetch_one(&mut *snapshot)
        .await
        .unwrap();
    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"uuids": ["u0"]}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    for i in 1..4 {
        let response = app
            .post(
                &format!("/v1/threads/{thread}/messages"),
                json!({"messages": exchange(i, "more", "ok")}),
            )
            .await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.body);
    }
    snapshot.rollback().await.unwrap();
    drop(reader);
    let left = stored_copies(&app, &[thread.as_str()], &["NEEDLE-HELD".to_owned()]).await;
    assert!(left.is_empty(), "{left:?}");
    app.finish().await;
}

/// A boundary a client wrote more than 100,000 entries in (past the bound a context read
/// refuses): the entries its summary covered can still be erased, and the summary is derived
/// again, its window read a page at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_before_a_boundary_past_the_window_bound_can_be_erased() {
    let app = TestApp::new(Backend::Sqlite).await;
    let thread = app.thread("long").await;
    let tenant = loupe::store::TenantId::default_tenant();
    let id = loupe::store::ThreadId::new(thread.as_str());
    let total = loupe::store::MAX_WINDOW_ENTRIES as usize + 10;
    for start in (0..total).step_by(5_000) {
        let entries = (start..(start + 5_000).min(total))
            .map(|i| {
                let text = if i == 5 {
                    "the code is NEEDLE-LONG".to_owned()
                } else {
                    format!("q{i}")
                };
                serde_json::from_value(user(&format!("e{i}"), &text)).unwrap()
            })
            .collect();
        app.store
            .append(
                &tenant,
                &id,
                loupe::store::AppendRequest {
                    entries,
                    expected_next_seq: None,
                },
            )
            .await
            .unwrap();
    }
    app.append(
        &thread,
        vec![
            json!({"type": "system", "uuid": "b", "subtype": "compact_boundary",
                "content": "Conversation compacted"}),
            json!({"type": "user", "uuid": "sum", "isCompactSummary": true, "message": {
                "role": "user", "content": "Summary: the code is NEEDLE-LONG."}}),
            user("after", "next"),
        ],
    )
    .await;
    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"seqs": [5]}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    assert_eq!(
        erased.body["artifacts"]["compaction_summaries"], 1,
        "{}",
        erased.body
    );
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    assert!(
        !context.body.to_string().contains("NEEDLE-LONG"),
        "{}",
        context.body
    );
    app.finish().await;
}

/// An erasure takes an entry's content "and any hash of it" away (README § Erase): the
/// tombstone keeps no `model`. But the entry was its thread's first call, so the append taught
/// `model_overheads` a row named by the SHA-256 of that model name, with the prompt size it
/// showed and when: the erasure leaves it, and so does deleting the thread. An unsalted
/// SHA-256 of a short name is no secret (anyone holding the files confirms a guess, or a list
/// of names, by hashing it), so the files still say the tenant used that model then.
async fn an_erased_model_name_leaves_no_hash_in_the_database(app: TestApp) {
    use sha2::{Digest, Sha256};
    let model = "acme-finetune-customer-7";
    let thread = app.thread("private").await;
    app.append(
        &thread,
        json!([user("q0", "hello"), {"uuid": "a0", "type": "assistant", "message": {
            "role": "assistant", "id": "msg_0", "model": model,
            "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 20_000, "output_tokens": 1}}}]),
    )
    .await;
    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"uuids": ["q0", "a0"]}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    let digest = hex::encode(Sha256::digest(model.as_bytes()));
    let left = stored_copies(&app, &[thread.as_str()], &[model.to_owned(), digest]).await;
    assert!(left.is_empty(), "the files still hold {left:?}");
    // Deleting a thread forgets what its first call taught just as well.
    let other = "acme-finetune-customer-8";
    let deleted = app.thread("deleted").await;
    app.append(
        &deleted,
        json!([user("q1", "hello"), {"uuid": "a1", "type": "assistant", "message": {
            "role": "assistant", "id": "msg_1", "model": other,
            "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 20_000, "output_tokens": 1}}}]),
    )
    .await;
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q2", "hello again")])).await;
    let overhead = |body: Value| body["context_tokens"]["overhead_tokens"].clone();
    let read = app.get(&format!("/v1/threads/{fresh}/context")).await;
    // The prompt less the upper bound of "hello" before it.
    assert!(
        overhead(read.body).as_u64().is_some_and(|t| t > 19_900),
        "taught by it"
    );
    let response = app.delete(&format!("/v1/threads/{deleted}")).await;
    assert!(response.status.is_success(), "{}", response.body);
    let read = app.get(&format!("/v1/threads/{fresh}/context")).await;
    assert_eq!(
        overhead(read.body),
        Value::Null,
        "forgotten with its source"
    );
    app.finish().await;
}
