//! The summary tree, the outline and zoom, through the job runner and the HTTP API, on both
//! backends. Jobs run by `Runner::step`: no test sleeps.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{assistant, user, TestApp};
use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome};
use loupe::store::{TenantId, ThreadJobs};
use loupe::summarize::{
    ExtractiveSummarizer, Purpose, SummarizeError, Summarizer, Summary, SummaryRequest,
};
use loupe::tree::view::HEADER;
use loupe_validate::{anthropic, openai, AnthropicRules};
use serde_json::{json, Value};
use tower::ServiceExt;

on_both_backends!(
    zoom_is_offered_once_the_thread_is_summarized_and_answers_the_seed_cases,
    a_scripted_agent_follows_a_planted_token_down_to_its_message,
    a_duplicate_run_writes_nothing_and_a_failed_node_is_retried,
    the_outline_prefix_is_stable_between_changes,
    outline_view_needs_outline_mode,
    a_snipped_message_leaves_the_outline_zoom_and_normalized_batches,
    a_snip_whose_redaction_never_ran_is_applied_by_the_next_tree_job,
);

fn config() -> JobsConfig {
    JobsConfig {
        // Retries are due at once, so a test can run them without waiting.
        backoff_base: Duration::ZERO,
        ..JobsConfig::default()
    }
}

pub(crate) fn runner(app: &TestApp, summarizer: Arc<dyn Summarizer>) -> Runner {
    Runner::new(app.store.clone(), summarizer, config())
}

/// Runs jobs until none is left; panics on a job that does not succeed.
pub(crate) async fn drain(runner: &Runner) -> Vec<Value> {
    let mut results = Vec::new();
    for _ in 0..1_000 {
        match runner.step(Clock::System).await.unwrap() {
            StepOutcome::Idle => return results,
            StepOutcome::Succeeded { result, .. } => results.push(result),
            other => panic!("a tree job did not succeed: {other:?}"),
        }
    }
    panic!("the jobs never drained");
}

async fn put_settings(app: &TestApp, thread: &str, settings: Value) -> crate::common::TestResponse {
    app.request(
        Method::PUT,
        &format!("/v1/threads/{thread}/settings"),
        Some(settings),
    )
    .await
}

pub(crate) async fn outline_on(app: &TestApp, thread: &str, options: Value) {
    let response = put_settings(app, thread, json!({ "outline": options })).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
}

/// Exchange `i`: a user turn and an assistant answer (its own response id, so every answer
/// starts a round).
pub(crate) fn exchange(i: usize, question: &str, answer: &str) -> Vec<Value> {
    vec![
        user(&format!("u{i}"), question),
        assistant(&format!("a{i}"), &format!("msg_{i}"), answer),
    ]
}

/// Queues a compaction of `thread` keeping its last `keep_recent_rounds` rounds (a runner
/// runs it).
pub(crate) async fn compact(app: &TestApp, thread: &str, keep_recent_rounds: u32) {
    let compact = app
        .post(
            &format!("/v1/threads/{thread}/compact"),
            json!({ "keep_recent_rounds": keep_recent_rounds }),
        )
        .await;
    assert_eq!(compact.status, StatusCode::ACCEPTED, "{}", compact.body);
}

pub(crate) async fn zoom(app: &TestApp, thread: &str, id: i64, n: i64) -> Value {
    let response = app
        .post(
            &format!("/v1/threads/{thread}/zoom"),
            json!({"id": id, "n": n}),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    response.body
}

pub(crate) fn assert_valid(context: &Value, provider: &str) {
    let messages = context["messages"].as_array().unwrap();
    let violations = match provider {
        "openai" => openai::validate(messages),
        "openai_responses" => loupe_validate::responses::validate(messages),
        "gemini" => loupe_validate::gemini::validate(messages),
        _ => anthropic::validate(messages, &AnthropicRules::default()),
    };
    assert!(violations.is_empty(), "{violations:?}\n{context}");
}

const FIRST_QUESTION: &str = "Ana: what exactly do we charge at launch, and why that price? \
    We said 49 last week but the spreadsheet still says 59.";

async fn zoom_is_offered_once_the_thread_is_summarized_and_answers_the_seed_cases(app: TestApp) {
    let thread = app.thread("seed").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 4000, "tail_tokens": 60}),
    )
    .await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    app.append(&thread, exchange(0, FIRST_QUESTION, "ok")).await;
    drain(&runner).await;

    // A chat of one exchange is not summarized: no lines, no zoom tool.
    let context = app
        .get(&format!("/v1/threads/{thread}/context?view=outline"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    assert_eq!(context.body["tools"], json!([]));
    assert_eq!(context.body["outline"]["lines"], 0);
    assert_eq!(context.body["messages"].as_array().unwrap().len(), 2);

    for i in 1..6 {
        app.append(
            &thread,
            exchange(
                i,
                &format!("Question {i}: and what about the plan for region {i}?"),
                &format!("Answer {i}: region {i} follows the same price."),
            ),
        )
        .await;
        drain(&runner).await;
    }
    for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
        let context = app
            .get(&format!(
                "/v1/threads/{thread}/context?view=outline&provider={provider}"
            ))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        let tools = context.body["tools"].as_array().unwrap();
        // Zoom and search: one Gemini tool declares both.
        let names: Vec<&Value> = match provider {
            "openai" => tools.iter().map(|t| &t["function"]["name"]).collect(),
            "gemini" => tools[0]["functionDeclarations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| &d["name"])
                .collect(),
            _ => tools.iter().map(|t| &t["name"]).collect(),
        };
        assert_eq!(
            names,
            [&json!("zoom"), &json!("search")],
            "{}",
            context.body
        );
        assert!(context.body["outline"]["lines"].as_u64().unwrap() >= 1);
        let boundary = context.body["outline"]["boundary"].as_u64().unwrap();
        // The boundary is a round boundary: an answer with a new response id starts the tail.
        assert!(boundary >= 3 && boundary % 2 == 1, "{boundary}");
        assert_valid(&context.body, provider);
        let first = &context.body["messages"][0];
        assert_eq!(first["role"], "user");
        let text = first["content"]
            .as_str()
            .or_else(|| first["content"][0]["text"].as_str())
            .or_else(|| first["parts"][0]["text"].as_str())
            .unwrap_or_else(|| panic!("{first}"));
        assert!(text.starts_with(HEADER), "{text}");
    }

    // zoom(0, 2): the two lines 0+1 and 1+1. Message 0 is longer than a line, so it was
    // summarized; message 1 fits, so it is its own line, word for word.
    let answer = zoom(&app, &thread, 0, 2).await;
    assert_eq!(answer["is_error"], false);
    let content = answer["content"].as_str().unwrap();
    let lines: Vec<&str> = content.lines().collect();
    assert_eq!(lines.len(), 2, "{content}");
    assert!(lines[0].starts_with("0+1|"), "{content}");
    assert!(lines[0].len() <= "0+1|".len() + 64, "{content}");
    assert_eq!(lines[1], "1+1|assistant: ok");
    // zoom(0, 1): the first message whole.
    let answer = zoom(&app, &thread, 0, 1).await;
    assert_eq!(answer["is_error"], false);
    assert_eq!(answer["content"], format!("0+1|user: {FIRST_QUESTION}"));
    assert_eq!(answer["message"]["uuid"], "u0");
    // zoom(1, 2) is not a line; zoom(64, 1) is no message of this chat.
    let answer = zoom(&app, &thread, 1, 2).await;
    assert_eq!(answer["is_error"], true);
    assert_eq!(
        answer["content"],
        "Error: zoom takes a line's id and n, as written: id+n."
    );
    let answer = zoom(&app, &thread, 64, 1).await;
    assert_eq!(answer["is_error"], true);
    assert_eq!(answer["content"], "Error: no line 64+1 here.");
    // Not {id, n} with integers: the caller's mistake, a problem.
    app.post(&format!("/v1/threads/{thread}/zoom"), json!({"id": "0"}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");

    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert_eq!(outline.status, StatusCode::OK, "{}", outline.body);
    assert_eq!(outline.body["build"]["last_job_state"], "succeeded");
    assert_eq!(outline.body["zoom_tool"]["name"], "zoom");
    assert_eq!(
        outline.body["boundary"],
        context_boundary(&app, &thread).await
    );
    app.finish().await;
}

async fn context_boundary(app: &TestApp, thread: &str) -> Value {
    app.get(&format!("/v1/threads/{thread}/context?view=outline"))
        .await
        .body["outline"]["boundary"]
        .clone()
}

/// A deterministic summarizer that keeps every `NEEDLE-<n>` token it reads, then the first words.
pub(crate) struct NeedleKeeper;

fn needles(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("NEEDLE-"))
        .map(str::to_owned)
        .collect()
}

/// The text a summarizer reads for `req`: the lines it merges, or its entries rendered.
pub(crate) fn request_source(req: &SummaryRequest) -> String {
    match req.purpose {
        Purpose::Merge => req.lines.join(" "),
        _ => loupe::summarize::render::transcript_items(&req.entries).join(" "),
    }
}

/// The needles of `source` first, then its words, within `max_bytes`.
pub(crate) fn keep_needles(source: &str, max_bytes: usize) -> String {
    let mut words = needles(source);
    words.extend(source.split_whitespace().map(str::to_owned));
    let mut text = String::new();
    for word in words {
        if text.len() + word.len() + 1 > max_bytes {
            break;
        }
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&word);
    }
    text
}

#[async_trait]
impl Summarizer for NeedleKeeper {
    fn name(&self) -> String {
        "needle-keeper".to_owned()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Ok(Summary {
            text: keep_needles(&request_source(req), req.max_bytes),
            summarizer: self.name(),
            calls: 0,
        })
    }
}

async fn a_scripted_agent_follows_a_planted_token_down_to_its_message(app: TestApp) {
    let runner = runner(&app, Arc::new(NeedleKeeper));
    for planted in [0usize, 5, 22, 37] {
        let thread = app.thread(&format!("needle-{planted}")).await;
        outline_on(
            &app,
            &thread,
            json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
        )
        .await;
        for i in 0..32 {
            let filler = "the weather report and other chatter about nothing in particular";
            let question = if 2 * i == planted {
                format!("Remember the code NEEDLE-{planted} for the vault. {filler}")
            } else {
                format!("Question {i}: {filler}")
            };
            let answer = if 2 * i + 1 == planted {
                format!("Noted: NEEDLE-{planted}. {filler}")
            } else {
                format!("Answer {i}: {filler}")
            };
            app.append(&thread, exchange(i, &question, &answer)).await;
            drain(&runner).await;
        }
        let token = format!("NEEDLE-{planted}");
        let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
        let lines = outline.body["lines"].as_array().unwrap();
        let boundary = outline.body["boundary"].as_u64().unwrap();
        assert!(boundary as usize > planted, "{}", outline.body);
        assert!(
            lines.iter().any(|l| l["n"].as_u64().unwrap() > 1),
            "the outline folded: {}",
            outline.body
        );
        // The scripted agent: the line that mentions the token, then the half that does.
        let mut line = lines
            .iter()
            .find(|l| needles(l["text"].as_str().unwrap()).contains(&token))
            .unwrap_or_else(|| panic!("no line keeps {token}: {}", outline.body))
            .clone();
        let n = line["n"].as_u64().unwrap();
        let mut calls = 0;
        loop {
            let (id, n) = (line["id"].as_i64().unwrap(), line["n"].as_i64().unwrap());
            let answer = zoom(&app, &thread, id, n).await;
            calls += 1;
            assert_eq!(answer["is_error"], false, "{answer}");
            if n == 1 {
                assert_eq!(id as usize, planted);
                assert!(answer["content"].as_str().unwrap().contains(&token));
                break;
            }
            line = answer["lines"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| needles(l["text"].as_str().unwrap()).contains(&token))
                .unwrap_or_else(|| panic!("neither half keeps {token}: {answer}"))
                .clone();
        }
        assert_eq!(calls, n.ilog2() + 1, "from a line of {n} messages");
    }
    app.finish().await;
}

/// Fails its first `failures` calls, then writes like the extractive summarizer.
struct Flaky {
    failures: u32,
    calls: AtomicU32,
}

#[async_trait]
impl Summarizer for Flaky {
    fn name(&self) -> String {
        "flaky".to_owned()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(SummarizeError::Server {
                status: 503,
                message: "overloaded".to_owned(),
            });
        }
        ExtractiveSummarizer::new().summarize(req).await
    }
}

async fn a_duplicate_run_writes_nothing_and_a_failed_node_is_retried(app: TestApp) {
    let thread = app.thread("retry").await;
    // A threshold every append crosses: an outlined thread is still never auto-compacted.
    let response = put_settings(
        &app,
        &thread,
        json!({"auto_compact_tokens": 1, "outline":
            {"enabled": true, "line_bytes": 64, "budget_bytes": 4000, "tail_tokens": 100000}}),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let long = "a long message that does not fit in one line of sixty-four bytes at all, \
        so the summarizer writes its line";
    app.append(
        &thread,
        vec![user("u0", "hi"), user("u1", long), user("u2", "yo")],
    )
    .await;
    let flaky = Runner::new(
        app.store.clone(),
        Arc::new(Flaky {
            failures: 1,
            calls: AtomicU32::new(0),
        }),
        config(),
    );
    match flaky.step(Clock::System).await.unwrap() {
        StepOutcome::WillRetry { error, .. } => assert!(error.contains("overloaded"), "{error}"),
        other => panic!("expected a retry, got {other:?}"),
    }
    // The node before the failure was kept; the retry writes the rest.
    let status = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert_eq!(status.body["build"]["nodes"], 1, "{}", status.body);
    assert!(status.body["build"]["last_error"].is_string());
    let results = drain(&flaky).await;
    assert_eq!(results.len(), 1);
    // Three leaves and the parent 0+2 (2+1 has no sibling yet).
    assert_eq!(results[0]["nodes_written"], 3, "{}", results[0]);
    let before = app.get(&format!("/v1/threads/{thread}/outline")).await.body;
    assert_eq!(before["build"]["nodes"], 4);

    // A duplicate run writes nothing new.
    app.store
        .enqueue_tree(&TenantId::default_tenant(), &thread.as_str().into())
        .await
        .unwrap();
    let results = drain(&flaky).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["nodes_written"], 0, "{}", results[0]);
    let after = app.get(&format!("/v1/threads/{thread}/outline")).await.body;
    assert_eq!(after["build"]["nodes"], before["build"]["nodes"]);
    // Succeeded tree jobs are pruned down to the latest; no compaction was ever enqueued.
    let jobs = app
        .store
        .thread_jobs(
            &TenantId::default_tenant(),
            &thread.as_str().into(),
            ThreadJobs::All,
        )
        .await
        .unwrap();
    let kinds: Vec<&str> = jobs.iter().map(|job| job.kind.as_str()).collect();
    assert_eq!(kinds, ["tree"], "{jobs:?}");
    assert_eq!(
        zoom(&app, &thread, 0, 2).await,
        zoom(&app, &thread, 0, 2).await
    );
    app.finish().await;
}

async fn the_outline_prefix_is_stable_between_changes(app: TestApp) {
    let thread = app.thread("stable").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 2000, "tail_tokens": 80}),
    )
    .await;
    let runner = runner(&app, Arc::new(ExtractiveSummarizer::new()));
    for i in 0..12 {
        app.append(
            &thread,
            exchange(
                i,
                &format!("question {i} about the plan"),
                &format!("answer {i}"),
            ),
        )
        .await;
    }
    drain(&runner).await;
    let uri = format!("/v1/threads/{thread}/context?view=outline&cache=true");
    let first = app.get(&uri).await.body;
    let second = app.get(&uri).await.body;
    assert_eq!(first, second, "consecutive reads are identical");
    // After a restart (a new connection, a new router) the bytes are the same: the state is
    // stored, not recomputed.
    let restarted = app.restarted_router().await;
    let response = restarted
        .oneshot(
            axum::http::Request::get(uri.as_str())
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        first,
        "a restart renders the same context"
    );
    // Breakpoints: the caller's one on the last block, plus the outline's on whole 16-line
    // blocks; at most four in the request.
    let lines = first["outline"]["lines"].as_u64().unwrap() as usize;
    assert!(lines >= 16, "enough lines for a whole block: {lines}");
    let block_marks = loupe::tree::view::cache_marks(lines, 3);
    let marks = first.to_string().matches("cache_control").count();
    assert_eq!(marks, 1 + block_marks.len(), "{first}");
    assert!(marks <= 4);
    for block in &block_marks {
        assert_eq!(
            first["messages"][0]["content"][*block]["cache_control"]["type"], "ephemeral",
            "block {block}"
        );
    }
    // With the tail budget raised (no epoch can come), a new exchange only extends the request
    // at its end: the outline's version stays, and every message but the last is unchanged (the
    // caller's breakpoint moves to the new last block).
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 64, "budget_bytes": 2000, "tail_tokens": 100000}),
    )
    .await;
    drain(&runner).await;
    assert_eq!(
        app.get(&uri).await.body,
        first,
        "new options alone change nothing"
    );
    app.append(&thread, exchange(12, "one more", "fine")).await;
    drain(&runner).await;
    let third = app.get(&uri).await.body;
    assert_eq!(third["outline"]["version"], first["outline"]["version"]);
    let (a, b) = (
        first["messages"].as_array().unwrap(),
        third["messages"].as_array().unwrap(),
    );
    assert_eq!(b.len(), a.len() + 2);
    assert_eq!(
        a[..a.len() - 1],
        b[..a.len() - 1],
        "the earlier messages are unchanged"
    );
    app.finish().await;
}

async fn outline_view_needs_outline_mode(app: TestApp) {
    let thread = app.thread("plain").await;
    app.append(&thread, exchange(0, "hello", "hi")).await;
    app.get(&format!("/v1/threads/{thread}/context?view=outline"))
        .await
        .assert_problem(StatusCode::CONFLICT, "outline-disabled");
    app.get(&format!("/v1/threads/{thread}/context?view=sideways"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    // The plain view offers no tools.
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(context.body["tools"], json!([]));
    // Bad outline settings are 422s.
    for (options, field) in [
        (
            json!({"enabled": true, "line_bytes": 8}),
            "outline.line_bytes",
        ),
        (
            json!({"enabled": true, "line_bytes": 512, "budget_bytes": 1000}),
            "outline.budget_bytes",
        ),
        (
            json!({"enabled": true, "tail_tokens": 0}),
            "outline.tail_tokens",
        ),
    ] {
        let response = put_settings(&app, &thread, json!({ "outline": options })).await;
        response.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert_eq!(
            response.body["errors"][0]["field"], field,
            "{}",
            response.body
        );
    }
    app.finish().await;
}

/// Lines of the test's database rebuilt without a model, waiting for their summarizer.
async fn stand_ins(app: &TestApp) -> i64 {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let count: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tree_nodes WHERE summarizer = 'stand-in'")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    count
}

/// Every model-facing view of the thread: the context in both views for each provider, the
/// outline, zoom down every line to the message, and a normalized cursor batch. None holds
/// `secret`, and every context is valid.
/// No model-facing view of the thread holds any of `secrets`: its contexts (every provider,
/// both views, each valid), its outline and every zoom down from it, and a normalized cursor
/// batch.
pub(crate) async fn assert_hidden_everywhere(app: &TestApp, thread: &str, secrets: &[&str]) {
    let holds = |value: &Value| {
        let text = value.to_string();
        secrets
            .iter()
            .find(|secret| text.contains(**secret))
            .copied()
    };
    for view in ["", "&view=outline"] {
        for provider in ["anthropic", "openai", "openai_responses", "gemini"] {
            let context = app
                .get(&format!(
                    "/v1/threads/{thread}/context?provider={provider}{view}"
                ))
                .await;
            assert_eq!(context.status, StatusCode::OK, "{}", context.body);
            assert_eq!(
                holds(&context.body),
                None,
                "{provider}{view}: {}",
                context.body
            );
            assert_valid(&context.body, provider);
        }
    }
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert_eq!(holds(&outline.body), None, "{}", outline.body);
    let mut open: Vec<(i64, i64)> = outline.body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["id"].as_i64().unwrap(), l["n"].as_i64().unwrap()))
        .collect();
    let mut zooms = 0;
    while let Some((id, n)) = open.pop() {
        let answer = zoom(app, thread, id, n).await;
        zooms += 1;
        assert_eq!(holds(&answer), None, "zoom({id}, {n}): {answer}");
        if n > 1 {
            for line in answer["lines"].as_array().unwrap() {
                open.push((line["id"].as_i64().unwrap(), line["n"].as_i64().unwrap()));
            }
        }
    }
    assert!(zooms > 1, "the outline had lines to open");
    let batch = app
        .get(&format!(
            "/v1/threads/{thread}/cursors/reader/pending?format=normalized&limit=1000"
        ))
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{}", batch.body);
    assert_eq!(holds(&batch.body), None, "{}", batch.body);
}

/// A snip hides a message from every model-facing view at once (lines already summarized
/// included, before any job runs), and from lines built later; the raw record keeps it.
async fn a_snipped_message_leaves_the_outline_zoom_and_normalized_batches(app: TestApp) {
    const SECRET: &str = "NEEDLE-HUNTER2";
    let runner = runner(&app, Arc::new(NeedleKeeper));
    let thread = app.thread("snipped").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
    )
    .await;
    let filler = "the weather report and other chatter about nothing in particular";
    for i in 0..32 {
        let question = if i == 3 {
            format!("my password is {SECRET}, keep it. {filler}")
        } else {
            format!("Question {i}: {filler}")
        };
        app.append(
            &thread,
            exchange(i, &question, &format!("Answer {i}: {filler}")),
        )
        .await;
        drain(&runner).await;
    }
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert!(
        outline.body.to_string().contains(SECRET),
        "planted: {}",
        outline.body
    );

    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["u3"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    assert_hidden_everywhere(&app, &thread, &[SECRET]).await;
    assert!(
        stand_ins(&app).await > 0,
        "the lines above it were rebuilt without a model"
    );

    // The tree job summarizes the stand-ins again with the thread's summarizer.
    drain(&runner).await;
    assert_eq!(stand_ins(&app).await, 0);
    assert_hidden_everywhere(&app, &thread, &[SECRET]).await;

    // Lines built after the snip hide it too.
    for i in 32..40 {
        app.append(
            &thread,
            exchange(i, &format!("Question {i}: {filler}"), "ok"),
        )
        .await;
        drain(&runner).await;
    }
    assert_hidden_everywhere(&app, &thread, &[SECRET]).await;

    // A snip is not an erasure: the raw record keeps the message.
    let messages = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    assert!(messages.body.to_string().contains(SECRET));
    app.finish().await;
}

/// A snip stored without its redaction (the process stopped between the snip's append and the
/// rewrite of the tree, or the request was cut off there): the next tree job applies it first.
async fn a_snip_whose_redaction_never_ran_is_applied_by_the_next_tree_job(app: TestApp) {
    const SECRET: &str = "NEEDLE-CUTOFF";
    let runner = runner(&app, Arc::new(NeedleKeeper));
    let thread = app.thread("cut-off").await;
    outline_on(
        &app,
        &thread,
        json!({"enabled": true, "line_bytes": 96, "budget_bytes": 900, "tail_tokens": 120}),
    )
    .await;
    let filler = "the weather report and other chatter about nothing in particular";
    for i in 0..32 {
        let question = if i == 5 {
            format!("the vault code is {SECRET}. {filler}")
        } else {
            format!("Question {i}: {filler}")
        };
        app.append(
            &thread,
            exchange(i, &question, &format!("Answer {i}: {filler}")),
        )
        .await;
    }
    drain(&runner).await;
    // The snip's append alone, as the store commits it before the handler rewrites the tree.
    app.store
        .append(
            &TenantId("default".to_owned()),
            &loupe::store::ThreadId::new(thread.as_str()),
            loupe::store::AppendRequest {
                entries: vec![loupe::history::model::Entry::snip(vec!["u5".to_owned()])],
                expected_next_seq: None,
            },
        )
        .await
        .unwrap();
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert!(
        outline.body.to_string().contains(SECRET),
        "not yet applied: {}",
        outline.body
    );
    drain(&runner).await;
    assert_hidden_everywhere(&app, &thread, &[SECRET]).await;
    assert_eq!(stand_ins(&app).await, 0);
    app.finish().await;
}
