//! Hostile input and faults: NUL bytes, slow uploads, secrets in answers, database faults,
//! panicking and racing jobs, deleted threads, oversized metadata and pages.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::common::{user, TestApp};
use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request, StatusCode};
use loupe::http::Limits;
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome};
use loupe::store::{JobState, TenantId, ThreadJobs};
use loupe::summarize::{ExtractiveSummarizer, SummarizeError, Summarizer, Summary, SummaryRequest};
use serde_json::{json, Value};

on_both_backends!(
    nul_bytes_in_ids_and_values_get_a_4xx,
    a_closed_database_answers_503_with_retry_after,
    a_job_error_shows_no_internal_strings,
    a_panicking_job_is_retried_and_the_worker_lives_on,
    a_tree_job_keeps_its_dedup_key_while_running_and_runs_again_after_an_append,
    a_tree_job_writes_nothing_after_its_thread_was_deleted,
    a_tree_job_that_read_a_message_before_its_snip_never_writes_it,
    a_compaction_that_read_a_message_before_its_erasure_never_writes_it,
    metadata_is_bounded_and_pages_are_cut_by_bytes,
    auto_compaction_tries_again_after_an_unproductive_attempt,
    a_restarted_instance_takes_back_its_own_running_jobs,
    deleting_a_large_thread_removes_every_row,
);

fn tenant() -> TenantId {
    TenantId::default_tenant()
}

/// Rows of `table` in the test's database.
async fn count_rows(app: &TestApp, table: &str) -> i64 {
    count_where(app, table, "1 = 1").await
}

async fn count_where(app: &TestApp, table: &str, condition: &str) -> i64 {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table} WHERE {condition}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

/// Runs one SQL statement on the test's database (to age a row, or simulate a crash).
async fn execute(app: &TestApp, sql: &str) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    sqlx::query(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

async fn nul_bytes_in_ids_and_values_get_a_4xx(app: TestApp) {
    let thread = app.thread("t").await;
    app.append(&thread, vec![user("m0", "hi")]).await;
    for uri in [
        "/v1/threads/%00".to_owned(),
        "/v1/threads/a%00b/messages".to_owned(),
        "/v1/jobs/%00".to_owned(),
        format!("/v1/threads/{thread}/cursors/%00"),
        "/v1/threads?cursor=%00".to_owned(),
    ] {
        let response = app.get(&uri).await;
        response.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    }
    let bad_uuid = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [user("a\u{0}b", "hi")]}),
        )
        .await;
    bad_uuid.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(bad_uuid.body["errors"][0]["field"], "messages[0].uuid");
    let bad_subtype = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [{"type": "system", "subtype": "x\u{0}", "content": "c"}]}),
        )
        .await;
    bad_subtype.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let bad_to = app
        .post(
            &format!("/v1/threads/{thread}/cursors/c/advance"),
            json!({"to": "m\u{0}"}),
        )
        .await;
    bad_to.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let bad_snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["m\u{0}"]}),
        )
        .await;
    bad_snip.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    // A value too long to echo is refused before it is looked up, and the answer stays small.
    let long = "x".repeat(100_000);
    let long_to = app
        .post(
            &format!("/v1/threads/{thread}/cursors/c/advance"),
            json!({ "to": long }),
        )
        .await;
    long_to.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert!(long_to.body.to_string().len() < 2_000, "{}", long_to.body);
    // The thread is intact.
    let page = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(page.body["messages"].as_array().unwrap().len(), 1);
    app.finish().await;
}

async fn a_closed_database_answers_503_with_retry_after(app: TestApp) {
    let thread = app.thread("t").await;
    app.store.close().await;
    for uri in [
        format!("/v1/threads/{thread}"),
        "/v1/threads".to_owned(),
        format!("/v1/threads/{thread}/context"),
    ] {
        let response = app.get(&uri).await;
        response.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
        assert!(
            response.headers.contains_key(header::RETRY_AFTER),
            "{uri}: {:?}",
            response.headers
        );
    }
    let appended = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": [user("m0", "hi")]}),
        )
        .await;
    appended.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    // Readiness says the database does not answer, in its own words, not the driver's.
    let ready = app.get("/readyz").await;
    let body = ready.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert_eq!(body["detail"], "the database does not answer");
    assert!(ready.headers.contains_key(header::RETRY_AFTER));
    app.finish().await;
}

/// Fails as a transport error naming an internal host would.
struct Unreachable;

#[async_trait]
impl Summarizer for Unreachable {
    fn name(&self) -> String {
        "unreachable".to_owned()
    }
    async fn summarize(&self, _: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Err(SummarizeError::Transport(
            "error sending request for url (http://summarizer.internal:9999/v1/messages)"
                .to_owned(),
        ))
    }
}

/// Panics in the middle of a job.
struct Panicking;

#[async_trait]
impl Summarizer for Panicking {
    fn name(&self) -> String {
        "panicking".to_owned()
    }
    async fn summarize(&self, _: &SummaryRequest) -> Result<Summary, SummarizeError> {
        panic!("the summarizer panicked");
    }
}

/// Rounds enough to compact: prompt, tool call, result, answer.
async fn rounds(app: &TestApp, thread: &str, from: usize, n: usize) {
    app.append(thread, crate::common::tool_rounds("u", from, n, 200))
        .await;
}

async fn compaction_job(app: &TestApp, thread: &str) -> String {
    let response = app
        .post(
            &format!("/v1/threads/{thread}/compact"),
            json!({"keep_recent_rounds": 1}),
        )
        .await;
    assert!(response.status.is_success(), "{}", response.body);
    response.body["id"].as_str().unwrap().to_owned()
}

async fn a_job_error_shows_no_internal_strings(app: TestApp) {
    let thread = app.thread("t").await;
    rounds(&app, &thread, 0, 4).await;
    let id = compaction_job(&app, &thread).await;
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(Unreachable),
        JobsConfig::default(),
    );
    let outcome = runner.step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::WillRetry { .. }),
        "{outcome:?}"
    );
    let job = app.get(&format!("/v1/jobs/{id}")).await;
    let error = job.body["last_error"].as_str().unwrap();
    assert!(error.contains("summarizer"), "{error}");
    assert!(!error.contains("internal"), "{error}");
    app.finish().await;
}

async fn a_panicking_job_is_retried_and_the_worker_lives_on(app: TestApp) {
    let thread = app.thread("t").await;
    rounds(&app, &thread, 0, 4).await;
    let id = compaction_job(&app, &thread).await;
    let config = JobsConfig {
        backoff_base: Duration::ZERO,
        ..JobsConfig::default()
    };
    let panicking = Runner::new(app.store.clone(), Arc::new(Panicking), config.clone());
    match panicking.step(Clock::System).await.unwrap() {
        StepOutcome::WillRetry { error, .. } => assert!(error.contains("panicked"), "{error}"),
        other => panic!("expected a retry, got {other:?}"),
    }
    let job = app.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(job.body["state"], "pending", "{}", job.body);
    assert_eq!(job.body["attempts"], 1);
    // The same worker goes on, and the retry (with a summarizer that works) succeeds.
    let working = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        config,
    );
    let outcome = working.step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    app.finish().await;
}

/// A summarizer that waits at its first call until released, so a test can act while a job
/// runs.
struct Gate {
    entered: tokio::sync::Notify,
    open: tokio::sync::Semaphore,
    inner: ExtractiveSummarizer,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate {
            entered: tokio::sync::Notify::new(),
            open: tokio::sync::Semaphore::new(0),
            inner: ExtractiveSummarizer::new(),
        })
    }

    fn release(&self) {
        self.open.add_permits(1_000);
    }
}

#[async_trait]
impl Summarizer for Gate {
    fn name(&self) -> String {
        "gate".to_owned()
    }
    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        self.entered.notify_one();
        let _permit = self.open.acquire().await.unwrap();
        self.inner.summarize(request).await
    }
}

const LONG: &str = "a long message that does not fit in one line of sixty-four bytes at all, \
    so the summarizer writes its line";

/// A worker's step, held inside its summarizer's call: the gate, the runner (to step again)
/// and the step's outcome once the gate is released.
async fn step_held_in_its_summarizer(
    app: &TestApp,
) -> (Arc<Gate>, Arc<Runner>, tokio::task::JoinHandle<StepOutcome>) {
    let gate = Gate::new();
    let runner = Arc::new(Runner::new(app.store.clone(), gate.clone(), tree_config()));
    let running = tokio::spawn({
        let runner = runner.clone();
        async move { runner.step(Clock::System).await.unwrap() }
    });
    gate.entered.notified().await;
    (gate, runner, running)
}

async fn outline_on(app: &TestApp, thread: &str) {
    let response = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"outline": {"enabled": true, "line_bytes": 64}})),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
}

fn tree_config() -> JobsConfig {
    JobsConfig {
        backoff_base: Duration::ZERO,
        ..JobsConfig::default()
    }
}

async fn a_tree_job_keeps_its_dedup_key_while_running_and_runs_again_after_an_append(app: TestApp) {
    let thread = app.thread("t").await;
    outline_on(&app, &thread).await;
    app.append(&thread, vec![user("u0", LONG)]).await;
    let (gate, runner, running) = step_held_in_its_summarizer(&app).await;
    // An append while the job runs: no second tree job, the running one is marked instead.
    app.append(&thread, vec![user("u1", LONG)]).await;
    let jobs = app
        .store
        .thread_jobs(&tenant(), &thread.as_str().into(), ThreadJobs::All)
        .await
        .unwrap();
    let live: Vec<_> = jobs
        .iter()
        .filter(|job| matches!(job.state, JobState::Pending | JobState::Running))
        .collect();
    assert_eq!(live.len(), 1, "{jobs:?}");
    gate.release();
    running.await.unwrap();
    // The job ran again (its first run may have seen the append already) and built everything.
    for _ in 0..10 {
        if runner.step(Clock::System).await.unwrap() == StepOutcome::Idle {
            break;
        }
    }
    let jobs = app
        .store
        .thread_jobs(&tenant(), &thread.as_str().into(), ThreadJobs::All)
        .await
        .unwrap();
    assert!(
        jobs.iter().all(|job| job.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await;
    assert_eq!(outline.body["build"]["nodes"], 3, "{}", outline.body);
    app.finish().await;
}

async fn a_tree_job_writes_nothing_after_its_thread_was_deleted(app: TestApp) {
    let thread = app.thread("t").await;
    outline_on(&app, &thread).await;
    app.append(&thread, vec![user("u0", "short"), user("u1", LONG)])
        .await;
    let (gate, _, running) = step_held_in_its_summarizer(&app).await;
    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    gate.release();
    let outcome = running.await.unwrap();
    assert!(
        !matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(count_rows(&app, "tree_nodes").await, 0);
    assert_eq!(count_rows(&app, "outlines").await, 0);
    app.finish().await;
}

/// The race one peer shipped: a summarizer call that read a message before it was hidden must
/// not write its line after. The job is held inside its model call while the snip lands; its
/// write is refused (the thread's redaction epoch moved), and it reads again, hiding the message.
async fn a_tree_job_that_read_a_message_before_its_snip_never_writes_it(app: TestApp) {
    const SECRET: &str = "HUNTER2-SECRET";
    let thread = app.thread("t").await;
    outline_on(&app, &thread).await;
    let secret = format!("{SECRET} is my password. {LONG}");
    app.append(&thread, vec![user("u0", "short"), user("u1", &secret)])
        .await;
    let (gate, runner, running) = step_held_in_its_summarizer(&app).await;
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["u1"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    gate.release();
    let outcome = running.await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "the run read again and finished: {outcome:?}"
    );
    while !matches!(runner.step(Clock::System).await.unwrap(), StepOutcome::Idle) {}
    let leaked = count_where(&app, "tree_nodes", &format!("text LIKE '%{SECRET}%'")).await;
    assert_eq!(leaked, 0, "a line holds the snipped message");
    assert!(
        count_rows(&app, "tree_nodes").await >= 2,
        "the tree was built"
    );
    app.finish().await;
}

/// The same race for a compaction: its summarizer read the message, the erasure lands while
/// the call is in flight, and the summary it then writes would quote erased text. The write is
/// refused (the epoch moved); the job reads again, without the message.
async fn a_compaction_that_read_a_message_before_its_erasure_never_writes_it(app: TestApp) {
    const SECRET: &str = "HUNTER2-ERASED";
    let thread = app.thread("t").await;
    app.append(
        &thread,
        vec![user("u0", &format!("{SECRET} is my password"))],
    )
    .await;
    rounds(&app, &thread, 1, 4).await;
    compaction_job(&app, &thread).await;
    let (gate, _, running) = step_held_in_its_summarizer(&app).await;
    let erased = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({"uuids": ["u0"]}),
        )
        .await;
    assert_eq!(erased.status, StatusCode::CREATED, "{}", erased.body);
    assert_eq!(
        erased.body["artifacts"]["jobs_fenced"], 1,
        "{}",
        erased.body
    );
    gate.release();
    let outcome = running.await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "the job read again and finished: {outcome:?}"
    );
    assert_eq!(
        count_where(&app, "messages", &format!("body LIKE '%{SECRET}%'")).await,
        0,
        "a summary quotes the erased message"
    );
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(
        context
            .body
            .to_string()
            .contains("This session is being continued"),
        "compacted: {}",
        context.body
    );
    app.finish().await;
}

async fn metadata_is_bounded_and_pages_are_cut_by_bytes(app: TestApp) {
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        max_metadata_bytes: 1_000,
        max_page_bytes: 2_000,
        ..Limits::default()
    };
    let app = app.reconfigure(limits, loupe::http::AuthMode::Open);
    let big = app
        .post(
            "/v1/threads",
            json!({"id": "big", "metadata": {"blob": "x".repeat(2_000)}}),
        )
        .await;
    big.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(big.body["errors"][0]["field"], "metadata");
    let small = app
        .post(
            "/v1/threads",
            json!({"id": "small", "metadata": {"user": "ana"}}),
        )
        .await;
    assert_eq!(small.status, StatusCode::CREATED);
    // Ten messages of about 600 bytes each: a page of at most 2,000 bytes holds a few.
    let text = "y".repeat(500);
    let batch: Vec<Value> = (0..10).map(|i| user(&format!("m{i}"), &text)).collect();
    app.append("small", batch).await;
    let mut seen = Vec::new();
    let mut uri = "/v1/threads/small/messages?limit=1000".to_owned();
    loop {
        let page = app.get(&uri).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let messages = page.body["messages"].as_array().unwrap();
        assert!(
            !messages.is_empty() && messages.len() < 10,
            "{}",
            messages.len()
        );
        seen.extend(messages.iter().map(|m| m["seq"].as_i64().unwrap()));
        match page.body["next_after_seq"].as_i64() {
            Some(after) => uri = format!("/v1/threads/small/messages?limit=1000&after_seq={after}"),
            None => break,
        }
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    app.finish().await;
}

async fn auto_compaction_tries_again_after_an_unproductive_attempt(app: TestApp) {
    let thread = app.thread("t").await;
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"auto_compact_tokens": 500})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    // One round crosses the threshold, and a single round leaves nothing to summarize.
    rounds(&app, &thread, 0, 1).await;
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    );
    match runner.step(Clock::System).await.unwrap() {
        StepOutcome::Succeeded { result, .. } => assert_eq!(result["compacted"], false),
        other => panic!("expected an unproductive success, got {other:?}"),
    }
    // Right after, the next append does not retry (backoff)…
    rounds(&app, &thread, 1, 1).await;
    let jobs = app
        .store
        .thread_jobs(&tenant(), &thread.as_str().into(), ThreadJobs::All)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // …but once the backoff has passed, an append above the threshold enqueues again.
    execute(&app, "UPDATE jobs SET updated_at = updated_at - 7200000").await;
    rounds(&app, &thread, 2, 1).await;
    let jobs = app
        .store
        .thread_jobs(&tenant(), &thread.as_str().into(), ThreadJobs::All)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[1].state, JobState::Pending);
    assert_eq!(jobs[1].payload["trigger"], "auto");
    app.finish().await;
}

async fn a_restarted_instance_takes_back_its_own_running_jobs(app: TestApp) {
    let thread = app.thread("t").await;
    rounds(&app, &thread, 0, 4).await;
    let id = compaction_job(&app, &thread).await;
    let now = loupe::store::now_millis();
    // The instance claims the job, then dies: the job stays running under its lease.
    let claimed = app
        .store
        .claim_job("box-1/worker-a", now, 300_000)
        .await
        .unwrap()
        .expect("the job is claimable");
    assert_eq!(claimed.job.id, id);
    assert!(app
        .store
        .claim_job("box-1/worker-b", now + 1, 300_000)
        .await
        .unwrap()
        .is_none());
    // Another instance's restart gives back nothing; its own gives the job back at once.
    assert_eq!(
        app.store.release_jobs_of("box-2/", now + 2).await.unwrap(),
        0
    );
    assert_eq!(
        app.store.release_jobs_of("box-1/", now + 2).await.unwrap(),
        1
    );
    let job = app.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(job.body["state"], "pending", "{}", job.body);
    assert_eq!(job.body["attempts"], 0);
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    );
    let outcome = runner.step(Clock::Fixed(now + 3)).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    app.finish().await;
}

async fn deleting_a_large_thread_removes_every_row(app: TestApp) {
    let thread = app.thread("big").await;
    let other = app.thread("other").await;
    // More messages than one delete chunk.
    for batch in 0..3 {
        let messages: Vec<Value> = (0..2_500)
            .map(|i| user(&format!("m{batch}-{i}"), "x"))
            .collect();
        app.append(&thread, messages).await;
    }
    app.append(&other, vec![user("keep", "kept")]).await;
    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(count_rows(&app, "messages").await, 1);
    // A delete cut short by a crash leaves rows under a key no thread has; the sweep at the
    // next start removes them (SQLite deletes in chunks; PostgreSQL in one transaction).
    execute(
        &app,
        "INSERT INTO tree_nodes (thread_key, level, idx, text, summarizer, calls, created_at) \
         VALUES ('gone', 0, 0, 't', 'verbatim', 0, 0)",
    )
    .await;
    let swept = app.store.sweep_orphans().await.unwrap();
    if app.backend == crate::common::Backend::Sqlite {
        assert_eq!(swept, 1);
        assert_eq!(count_rows(&app, "tree_nodes").await, 0);
    }
    let page = app.get(&format!("/v1/threads/{other}/messages")).await;
    assert_eq!(page.body["messages"].as_array().unwrap().len(), 1);
    app.finish().await;
}

/// A request body that sends one byte, then nothing more, ever.
struct Stalled {
    sent: bool,
}

impl axum::body::HttpBody for Stalled {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.sent {
            Poll::Pending
        } else {
            self.sent = true;
            Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(b"{")))))
        }
    }
}

fn stalled_normalize(key: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/v1/normalize")
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::new(Stalled { sent: false }))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_of_one_tenant_do_not_starve_another() {
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    };
    let app = app.keyed_with(limits);
    let slow = app.create_key("slow").await;
    let other = app.create_key("other").await;
    let thread = "t";
    let created = app
        .post_as(&other, "/v1/threads", json!({"id": thread}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let mut uploads = Vec::new();
    for _ in 0..16 {
        let router = app.router.clone();
        let request = stalled_normalize(&slow);
        uploads.push(tokio::spawn(async move {
            use tower::ServiceExt;
            router.oneshot(request).await.unwrap().status()
        }));
    }
    // Let every upload start and wait for its body.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        let context = app
            .get_as(&other, &format!("/v1/threads/{thread}/context"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    }
    for upload in uploads {
        upload.abort();
    }
    app.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408() {
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        body_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let app = app.keyed_with(limits);
    let key = app.create_key("slow").await;
    let response = app.send(stalled_normalize(&key)).await;
    response.assert_problem(StatusCode::REQUEST_TIMEOUT, "body-timeout");
    app.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_closes_a_connection_that_trickles_its_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let test = TestApp::new(crate::common::Backend::Sqlite).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = loupe::app::App {
        store: test.store.clone(),
        auth: loupe::http::AuthMode::Open,
        limits: Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
        listener: Some(listener),
        workers: 0,
        jobs: JobsConfig::default(),
        summarizer: Arc::new(ExtractiveSummarizer::new()),
        grace: Duration::from_secs(1),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(loupe::app::run(app, async move {
        let _ = stopped.await;
    }));
    // A whole request is served.
    let mut whole = tokio::net::TcpStream::connect(addr).await.unwrap();
    whole
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: loupe\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    whole.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Headers that never end: the server hangs up (the deadline only bounds a broken server).
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: lou")
        .await
        .unwrap();
    let mut buffer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), slow.read_to_end(&mut buffer)).await;
    assert!(closed.is_ok(), "the connection was left open");
    assert!(
        !String::from_utf8_lossy(&buffer).contains("200"),
        "{buffer:?}"
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    test.finish().await;
}
