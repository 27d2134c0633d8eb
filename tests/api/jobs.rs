//! The durable job queue and compaction, through the store, the runner and the HTTP API, on both
//! backends. Time is injected (`Clock::Fixed`): no test sleeps.

use std::collections::HashSet;
use std::sync::Arc;

use crate::common::{assistant, user, TestApp};
use crate::compaction_props::reference_plan;
use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use loupe::jobs::compaction::{DEFAULT_KEEP_RECENT_ROUNDS, SUMMARY_PREFIX};
use loupe::jobs::SUMMARY_PAGE_ENTRIES;
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome, KIND_NOOP};
use loupe::store::{now_millis, AppendRequest, JobState, NewJob, StoreError, TenantId, ThreadJobs};
use loupe::summarize::{ExtractiveSummarizer, SummarizeError, Summarizer, Summary, SummaryRequest};
use loupe_validate::{anthropic, openai, AnthropicRules};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

on_both_backends!(
    two_claimers_race_for_one_job_and_exactly_one_wins,
    concurrent_workers_run_every_job_exactly_once,
    a_dead_workers_job_runs_again_and_its_late_completion_is_fenced,
    retries_back_off_and_end_failed_with_the_error_visible,
    an_append_during_a_running_compaction_survives,
    a_duplicate_trigger_returns_the_pending_job,
    the_compacted_context_is_valid_and_starts_with_the_summary,
    a_second_compaction_never_brings_back_the_first_summary,
    nothing_to_summarize_succeeds_and_appends_nothing,
    auto_compaction_enqueues_exactly_one_job_when_the_threshold_is_crossed,
    auto_compaction_counts_what_the_cleared_view_sends,
    microcompaction_settings_change_the_context,
    another_tenants_job_is_not_found,
    the_thread_jobs_listing_is_newest_first_and_limited,
    a_long_window_is_summarized_a_page_at_a_time,
    a_uuid_named_boundary_is_planned_the_same_in_pages,
    a_page_of_nothing_a_model_reads_is_not_summarized,
    snipped_entries_are_not_summarized,
    only_a_system_entry_bounds_the_window,
    a_segment_far_outside_the_window_is_planned_as_none,
);

const LEASE_MS: i64 = 300_000;

fn runner(app: &TestApp, summarizer: Arc<dyn Summarizer>) -> Runner {
    Runner::new(app.store.clone(), summarizer, JobsConfig::default())
}

fn extractive(app: &TestApp) -> Runner {
    runner(app, Arc::new(ExtractiveSummarizer::new()))
}

fn noop_job(tenant: &str) -> NewJob {
    NewJob {
        tenant: TenantId(tenant.to_owned()),
        thread_key: None,
        kind: KIND_NOOP.to_owned(),
        payload: json!({}),
        dedup_key: None,
        max_attempts: 3,
    }
}

async fn append(app: &TestApp, thread: &str, messages: Value) -> Value {
    let response = app
        .post(
            &format!("/v1/threads/{thread}/messages"),
            json!({"messages": messages}),
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.body);
    response.body
}

/// `n` rounds: a prompt, a tool call, its result and an answer (split fragments of one response).
async fn conversation(app: &TestApp, thread: &str, from: usize, n: usize) {
    let mut messages = Vec::new();
    for i in from..from + n {
        messages.push(user(&format!("u{i}"), &format!("Question number {i}?")));
        messages.push(
            json!({"uuid": format!("t{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_{i}"), "content": [{"type": "tool_use", "id": format!("toolu_{i}"),
            "name": "Read", "input": {"path": format!("src/file{i}.rs")}}]}}),
        );
        messages.push(
            json!({"uuid": format!("r{i}"), "type": "user", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
            "content": format!("fn f{i}() {{}}\n").repeat(200)}]}}),
        );
        messages.push(assistant(
            &format!("a{i}"),
            &format!("msg_{i}"),
            &format!("Answer {i}."),
        ));
    }
    append(app, thread, Value::Array(messages)).await;
}

async fn compact(app: &TestApp, thread: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .post(&format!("/v1/threads/{thread}/compact"), body)
        .await;
    (response.status, response.body)
}

async fn all_messages(app: &TestApp, thread: &str) -> Vec<Value> {
    let page = app
        .get(&format!("/v1/threads/{thread}/messages?limit=1000"))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    page.body["messages"].as_array().unwrap().clone()
}

fn boundaries(messages: &[Value]) -> Vec<&Value> {
    messages
        .iter()
        .filter(|m| m["subtype"] == "compact_boundary")
        .collect()
}

/// A provider message list as one string, for searching.
fn texts(messages: &[Value]) -> String {
    messages.iter().map(Value::to_string).collect()
}

async fn two_claimers_race_for_one_job_and_exactly_one_wins(app: TestApp) {
    let now = now_millis();
    app.store
        .enqueue_job(&noop_job("default"), now)
        .await
        .unwrap();
    let claims = (0..8).map(|i| {
        let store = app.store.clone();
        tokio::spawn(async move { store.claim_job(&format!("w{i}"), now, LEASE_MS).await })
    });
    let mut won = 0;
    for claim in claims {
        if claim.await.unwrap().unwrap().is_some() {
            won += 1;
        }
    }
    assert_eq!(won, 1);
    app.finish().await;
}

async fn concurrent_workers_run_every_job_exactly_once(app: TestApp) {
    let now = now_millis();
    let mut ids = HashSet::new();
    for _ in 0..40 {
        ids.insert(
            app.store
                .enqueue_job(&noop_job("default"), now)
                .await
                .unwrap()
                .job
                .id,
        );
    }
    let workers = (0..4).map(|_| {
        let runner = extractive(&app);
        tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                match runner.step(Clock::System).await.unwrap() {
                    StepOutcome::Idle => return done,
                    StepOutcome::Succeeded { job_id, .. } => done.push(job_id),
                    other => panic!("unexpected {other:?}"),
                }
            }
        })
    });
    let mut done = Vec::new();
    for worker in workers {
        done.extend(worker.await.unwrap());
    }
    assert_eq!(done.len(), 40, "every job ran once");
    assert_eq!(done.iter().cloned().collect::<HashSet<_>>(), ids);
    for id in &ids {
        let job = app.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(job.body["state"], "succeeded");
        assert_eq!(job.body["attempts"], 1);
    }
    app.finish().await;
}

async fn a_dead_workers_job_runs_again_and_its_late_completion_is_fenced(app: TestApp) {
    let thread = app.thread("dies").await;
    conversation(&app, &thread, 0, 4).await;
    let (status, job) = compact(&app, &thread, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let t0 = now_millis() + 1_000;
    // A worker claims the job and dies.
    let dead = app
        .store
        .claim_job("dead", t0, LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    let live = extractive(&app);
    assert_eq!(
        live.step(Clock::Fixed(t0 + 1_000)).await.unwrap(),
        StepOutcome::Idle
    );
    // Its lease expires: the job is claimed again and completes.
    let outcome = live.step(Clock::Fixed(t0 + LEASE_MS + 1)).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    // The dead worker wakes up: its completion and its whole run are rejected by the fence.
    let late = app
        .store
        .complete_job(&dead, &json!({}), t0 + LEASE_MS + 2)
        .await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    let rerun = extractive(&app)
        .run_claimed(
            &dead,
            Clock::Fixed(t0 + LEASE_MS + 3),
            &CancellationToken::new(),
        )
        .await;
    assert!(matches!(rerun, StepOutcome::LeaseLost { .. }), "{rerun:?}");
    assert_eq!(boundaries(&all_messages(&app, &thread).await).len(), 1);
    let job = app
        .get(&format!("/v1/jobs/{}", job["id"].as_str().unwrap()))
        .await;
    assert_eq!(job.body["state"], "succeeded");
    assert_eq!(job.body["attempts"], 2);
    assert_eq!(job.body["result"]["compacted"], true);
    app.finish().await;
}

/// Always fails like an overloaded provider.
struct Failing;

#[async_trait]
impl Summarizer for Failing {
    fn name(&self) -> String {
        "failing".to_owned()
    }
    async fn summarize(&self, _: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Err(SummarizeError::Server {
            status: 529,
            message: "overloaded".to_owned(),
        })
    }
}

async fn retries_back_off_and_end_failed_with_the_error_visible(app: TestApp) {
    let thread = app.thread("fails").await;
    conversation(&app, &thread, 0, 4).await;
    let (_, job) = compact(&app, &thread, json!({"keep_recent_rounds": 1})).await;
    let id = job["id"].as_str().unwrap().to_owned();
    let runner = runner(&app, Arc::new(Failing));
    let max = app.store.job_max_attempts();
    let mut t = now_millis() + 1_000;
    for attempt in 1..=max {
        if attempt > 1 {
            // Not claimable before its backoff ends.
            assert_eq!(
                runner.step(Clock::Fixed(t - 1)).await.unwrap(),
                StepOutcome::Idle
            );
        }
        let outcome = runner.step(Clock::Fixed(t)).await.unwrap();
        if attempt < max {
            assert!(
                matches!(outcome, StepOutcome::WillRetry { .. }),
                "{outcome:?}"
            );
            let pending = app.get(&format!("/v1/jobs/{id}")).await;
            assert_eq!(pending.body["state"], "pending");
            assert_eq!(pending.body["attempts"], attempt);
        } else {
            assert!(matches!(outcome, StepOutcome::Failed { .. }), "{outcome:?}");
        }
        t += runner.config.backoff(attempt).as_millis() as i64;
    }
    assert_eq!(
        runner.step(Clock::Fixed(t + 10_000_000)).await.unwrap(),
        StepOutcome::Idle
    );
    let failed = app.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(failed.status, StatusCode::OK);
    assert_eq!(failed.body["state"], "failed");
    assert_eq!(failed.body["attempts"], max);
    let error = failed.body["last_error"].as_str().unwrap();
    assert!(error.contains("overloaded"), "{error}");
    assert!(boundaries(&all_messages(&app, &thread).await).is_empty());
    app.finish().await;
}

/// Appends a round to the thread while it "summarizes": the write lands between the job's read
/// and its write.
struct AppendsWhileSummarizing {
    store: loupe::store::Store,
    thread: String,
}

#[async_trait]
impl Summarizer for AppendsWhileSummarizing {
    fn name(&self) -> String {
        "appends".to_owned()
    }
    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let late: Vec<loupe::history::Entry> = [
            user("late-q", "A question asked during compaction"),
            assistant("late-a", "msg_late", "An answer given during compaction"),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        self.store
            .append(
                &TenantId::default_tenant(),
                &self.thread.as_str().into(),
                AppendRequest {
                    entries: late,
                    expected_next_seq: None,
                },
            )
            .await
            .unwrap();
        ExtractiveSummarizer::new().summarize(req).await
    }
}

async fn an_append_during_a_running_compaction_survives(app: TestApp) {
    let thread = app.thread("busy").await;
    conversation(&app, &thread, 0, 5).await;
    compact(&app, &thread, json!({})).await;
    let runner = runner(
        &app,
        Arc::new(AppendsWhileSummarizing {
            store: app.store.clone(),
            thread: thread.clone(),
        }),
    );
    let outcome = runner.step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let messages = all_messages(&app, &thread).await;
    // 20 messages, 2 appended while the job ran, then the boundary and the summary.
    assert_eq!(messages.len(), 24);
    assert_eq!(messages[20]["uuid"], "late-q");
    let boundary = &messages[22];
    assert_eq!(boundary["subtype"], "compact_boundary");
    let segment = &boundary["compact_metadata"]["preserved_segment"];
    assert_eq!(segment["last_seq"], 21, "{boundary}");
    assert_eq!(messages[23]["is_compact_summary"], true);
    // The summary counts toward the thread's bytes like any append.
    app.assert_stored_bytes_counted(&thread).await;
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    let list = context.body["messages"].as_array().unwrap();
    let all = texts(list);
    assert!(all.contains("A question asked during compaction"));
    assert!(all.ends_with(&texts(&list[list.len() - 1..])));
    assert!(
        list.last().unwrap()["content"]
            .to_string()
            .contains("An answer given during compaction"),
        "the late round stays last"
    );
    // The kept rounds come before the late one, in order.
    let answer_3 = all.find("Answer 3.").unwrap();
    let answer_4 = all.find("Answer 4.").unwrap();
    let late = all.find("A question asked during compaction").unwrap();
    assert!(answer_3 < answer_4 && answer_4 < late);
    assert!(anthropic::validate(list, &AnthropicRules::default()).is_empty());
    app.finish().await;
}

async fn a_duplicate_trigger_returns_the_pending_job(app: TestApp) {
    let thread = app.thread("twice").await;
    conversation(&app, &thread, 0, 4).await;
    let (first_status, first) = compact(&app, &thread, json!({})).await;
    let (second_status, second) = compact(&app, &thread, json!({"keep_recent_rounds": 1})).await;
    assert_eq!(first_status, StatusCode::ACCEPTED);
    assert_eq!(second_status, StatusCode::OK);
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["state"], "pending");
    assert_eq!(
        app.store
            .thread_jobs(
                &TenantId::default_tenant(),
                &thread.as_str().into(),
                ThreadJobs::All
            )
            .await
            .unwrap()
            .len(),
        1
    );
    extractive(&app).step(Clock::System).await.unwrap();
    let (third_status, third) = compact(&app, &thread, json!({})).await;
    assert_eq!(third_status, StatusCode::ACCEPTED);
    assert_ne!(third["id"], first["id"]);
    let bad = compact(&app, &thread, json!({"keep_recent_rounds": -1})).await;
    assert_eq!(bad.0, StatusCode::UNPROCESSABLE_ENTITY);
    let missing = compact(&app, "nope", json!({})).await;
    assert_eq!(missing.0, StatusCode::NOT_FOUND);
    app.finish().await;
}

async fn the_compacted_context_is_valid_and_starts_with_the_summary(app: TestApp) {
    let thread = app.thread("valid").await;
    conversation(&app, &thread, 0, 6).await;
    let before = app.get(&format!("/v1/threads/{thread}/context")).await;
    let (_, job) = compact(&app, &thread, json!({"keep_recent_rounds": 2})).await;
    let outcome = extractive(&app).step(Clock::System).await.unwrap();
    let StepOutcome::Succeeded { result, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(result["boundary_seq"], 24);
    let messages = all_messages(&app, &thread).await;
    assert_eq!(
        messages.len(),
        26,
        "boundary and summary appended; nothing deleted"
    );
    assert_eq!(messages[0]["uuid"], "u0");
    let metadata = &messages[24]["compact_metadata"];
    assert_eq!(metadata["trigger"], "manual");
    assert_eq!(metadata["summarizer"], "extractive");
    assert_eq!(metadata["job_id"], job["id"]);
    assert_eq!(metadata["messages_summarized"], 17);
    assert!(metadata["pre_tokens"].as_u64().unwrap() > 0);
    // Rounds: [u0 t0 r0 a0 u1] [t1 r1 a1 u2] … [t5 r5 a5]; the last two start at t4 (seq 17).
    assert_eq!(
        metadata["preserved_segment"],
        json!({"first_seq": 17, "last_seq": 23})
    );
    for provider in ["anthropic", "openai"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        assert_eq!(context.status, StatusCode::OK, "{}", context.body);
        let list = context.body["messages"].as_array().unwrap();
        let first = list[0]["content"].to_string();
        assert_eq!(list[0]["role"], "user");
        assert!(
            first.contains("This session is being continued from a previous conversation"),
            "{first}"
        );
        let all = texts(list);
        assert!(
            !all.contains("Answer 0."),
            "summarized rounds are not copied"
        );
        assert!(all.contains("Answer 4.") && all.contains("Answer 5."));
        let problems = if provider == "anthropic" {
            anthropic::validate(list, &AnthropicRules::default())
        } else {
            openai::validate(list)
        };
        assert!(problems.is_empty(), "{provider}: {problems:?}");
    }
    let after = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert!(after.body["estimated_tokens"].as_u64() < before.body["estimated_tokens"].as_u64());
    app.finish().await;
}

async fn a_second_compaction_never_brings_back_the_first_summary(app: TestApp) {
    let thread = app.thread("again").await;
    conversation(&app, &thread, 0, 5).await;
    compact(&app, &thread, json!({"keep_recent_rounds": 2})).await;
    extractive(&app).step(Clock::System).await.unwrap();
    conversation(&app, &thread, 5, 1).await;
    // The view is [boundary, summary, t3 r3 a3 u4 | t4 r4 a4 u5 | t5 r5 a5]: the kept rounds
    // start at t4, which lies before the first boundary, so the new preserved segment spans it.
    compact(&app, &thread, json!({"keep_recent_rounds": 2})).await;
    let outcome = extractive(&app).step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let messages = all_messages(&app, &thread).await;
    let found = boundaries(&messages);
    assert_eq!(found.len(), 2);
    let segment = &found[1]["compact_metadata"]["preserved_segment"];
    let first_boundary_seq = found[0]["seq"].as_i64().unwrap();
    assert!(
        segment["first_seq"].as_i64().unwrap() < first_boundary_seq,
        "{segment}"
    );
    let summary = &messages.last().unwrap()["message"]["content"];
    assert!(
        summary.as_str().unwrap().contains("Earlier summary"),
        "{summary}"
    );
    for provider in ["anthropic", "openai"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        let list = context.body["messages"].as_array().unwrap();
        let all = texts(list);
        assert_eq!(
            all.matches("This session is being continued").count(),
            1,
            "{all}"
        );
        assert!(list[0]["content"]
            .to_string()
            .contains("This session is being continued"));
        assert!(all.contains("Answer 4.") && all.contains("Answer 5."));
        assert!(!all.contains("toolu_3"), "round 3 is summarized now");
        assert!(all.contains("toolu_4"));
        let problems = if provider == "anthropic" {
            anthropic::validate(list, &AnthropicRules::default())
        } else {
            openai::validate(list)
        };
        assert!(problems.is_empty(), "{provider}: {problems:?}");
    }
    app.finish().await;
}

async fn nothing_to_summarize_succeeds_and_appends_nothing(app: TestApp) {
    let thread = app.thread("short").await;
    conversation(&app, &thread, 0, 2).await;
    let (_, job) = compact(&app, &thread, json!({"keep_recent_rounds": 2})).await;
    let outcome = extractive(&app).step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(all_messages(&app, &thread).await.len(), 8);
    let job = app
        .get(&format!("/v1/jobs/{}", job["id"].as_str().unwrap()))
        .await;
    assert_eq!(job.body["state"], "succeeded");
    assert_eq!(job.body["result"]["compacted"], false);
    assert!(job.body["result"]["reason"]
        .as_str()
        .unwrap()
        .contains("nothing to summarize"));
    app.finish().await;
}

async fn auto_compaction_enqueues_exactly_one_job_when_the_threshold_is_crossed(app: TestApp) {
    let thread = app.thread("auto").await;
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"auto_compact_tokens": 2500})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    assert_eq!(settings.body["effective"]["auto_compact_tokens"], 2500);
    // Each round carries a tool result of 2,200 characters of code, 880 tokens at 2.5
    // characters a token: the third round crosses 2,500.
    let mut crossed_at = Vec::new();
    for i in 0..8 {
        conversation(&app, &thread, i, 1).await;
        let jobs = app
            .store
            .thread_jobs(
                &TenantId::default_tenant(),
                &thread.as_str().into(),
                ThreadJobs::All,
            )
            .await
            .unwrap();
        crossed_at.push(jobs.len());
    }
    assert_eq!(crossed_at, [0, 0, 1, 1, 1, 1, 1, 1]);
    let jobs = app
        .store
        .thread_jobs(
            &TenantId::default_tenant(),
            &thread.as_str().into(),
            ThreadJobs::All,
        )
        .await
        .unwrap();
    assert_eq!(jobs[0].payload["trigger"], "auto");
    assert_eq!(jobs[0].state, JobState::Pending);
    let outcome = extractive(&app).step(Clock::System).await.unwrap();
    assert!(
        matches!(outcome, StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let messages = all_messages(&app, &thread).await;
    assert_eq!(
        boundaries(&messages)[0]["compact_metadata"]["trigger"],
        "auto"
    );
    // The estimate restarted at the boundary: the next rounds stay below the threshold again.
    let body = append(&app, &thread, json!([user("after", "One more question?")])).await;
    assert!(body.get("compaction_job_id").is_none(), "{body}");
    app.finish().await;
}

/// With clearing on, the trigger counts what the cleared view sends: old results as stubs, and
/// at most `keep_tokens + batch_tokens` of whole ones. A settings change counts the thread
/// again, and compacts it when that leaves it past its threshold.
async fn auto_compaction_counts_what_the_cleared_view_sends(app: TestApp) {
    let tokens = |body: &Value| body["context_tokens"]["tokens"].as_u64().unwrap();
    let jobs = |thread: String| {
        let store = app.store.clone();
        async move {
            store
                .thread_jobs(
                    &TenantId::default_tenant(),
                    &thread.as_str().into(),
                    ThreadJobs::All,
                )
                .await
                .unwrap()
                .len()
        }
    };
    let cleared = app.thread("cleared-trigger").await;
    let plain = app.thread("plain-trigger").await;
    let clearing = json!({"enabled": true, "keep_tokens": 500, "batch_tokens": 500});
    for (thread, settings) in [
        (
            &cleared,
            json!({"auto_compact_tokens": 2500, "clearing": clearing}),
        ),
        (&plain, json!({"auto_compact_tokens": 2500})),
    ] {
        let response = app
            .request(
                Method::PUT,
                &format!("/v1/threads/{thread}/settings"),
                Some(settings),
            )
            .await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    }
    // Eight rounds of a 2,200-byte result each (880 tokens): the plain thread crosses
    // 2,500 at its third round; the cleared one sends eight stubs and at most 1,000 tokens of
    // whole results, and never does.
    for i in 0..8 {
        conversation(&app, &cleared, i, 1).await;
        conversation(&app, &plain, i, 1).await;
    }
    assert_eq!(jobs(plain.clone()).await, 1);
    assert_eq!(jobs(cleared.clone()).await, 0);
    let context = app
        .get(&format!("/v1/threads/{cleared}/context"))
        .await
        .body;
    assert!(texts(context["messages"].as_array().unwrap()).contains("[Old tool result cleared"));
    let stored_whole = tokens(&app.get(&format!("/v1/threads/{plain}/context")).await.body);
    assert!(stored_whole > 2_500, "{stored_whole}");
    // Turned off, the thread is counted whole again: past its threshold, it is compacted.
    let response = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{cleared}/settings"),
            Some(json!({"auto_compact_tokens": 2500})),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(jobs(cleared.clone()).await, 1);
    app.finish().await;
}

async fn microcompaction_settings_change_the_context(app: TestApp) {
    let thread = app.thread("micro").await;
    conversation(&app, &thread, 0, 7).await;
    let cleared = |body: &Value| {
        texts(body["messages"].as_array().unwrap())
            .matches("[Old tool result content cleared: Read")
            .count()
    };
    let uri = format!("/v1/threads/{thread}/context");
    assert_eq!(cleared(&app.get(&uri).await.body), 0, "off by default");
    let settings_uri = format!("/v1/threads/{thread}/settings");
    let put = |body: Value| app.request(Method::PUT, &settings_uri, Some(body));
    let response =
        put(json!({"microcompact": {"enabled": true, "keep_recent": 2, "min_bytes": 100}})).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    assert_eq!(
        response.body["effective"]["microcompact"]["tools"][0],
        "Read"
    );
    let context = app.get(&uri).await;
    assert_eq!(cleared(&context.body), 5);
    assert!(anthropic::validate(
        context.body["messages"].as_array().unwrap(),
        &AnthropicRules::default()
    )
    .is_empty());
    put(json!({"microcompact": {"enabled": true, "tools": ["Bash"], "keep_recent": 2}})).await;
    assert_eq!(
        cleared(&app.get(&uri).await.body),
        0,
        "Read is not compactable now"
    );
    put(json!({"microcompact": {"enabled": true, "min_bytes": 1000000}})).await;
    assert_eq!(
        cleared(&app.get(&uri).await.body),
        0,
        "results below min_bytes stay"
    );
    let stored = app.get(&format!("/v1/threads/{thread}/settings")).await;
    assert_eq!(stored.body["microcompact"]["min_bytes"], 1000000);
    assert_eq!(stored.body["effective"]["microcompact"]["keep_recent"], 5);
    let bad = put(json!({"microcompact": {"enabled": true, "tools": ["no spaces"]}})).await;
    bad.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    let storage = all_messages(&app, &thread).await;
    assert!(
        !texts(&storage).contains("cleared"),
        "storage is never changed"
    );
    app.finish().await;
}

async fn another_tenants_job_is_not_found(app: TestApp) {
    let now = now_millis();
    let theirs = app
        .store
        .enqueue_job(&noop_job("other"), now)
        .await
        .unwrap()
        .job;
    app.get(&format!("/v1/jobs/{}", theirs.id))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    let ours = app
        .store
        .enqueue_job(&noop_job("default"), now)
        .await
        .unwrap()
        .job;
    let response = app.get(&format!("/v1/jobs/{}", ours.id)).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body["state"], "pending");
    app.get("/v1/jobs/job_missing")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

async fn the_thread_jobs_listing_is_newest_first_and_limited(app: TestApp) {
    let thread = app.thread("listed").await;
    conversation(&app, &thread, 0, 2).await;
    // Two compactions that run (nothing to summarize), then a third left pending.
    for _ in 0..2 {
        let (status, body) = compact(&app, &thread, json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        extractive(&app).step(Clock::System).await.unwrap();
    }
    let (status, body) = compact(&app, &thread, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let all = app
        .store
        .thread_jobs(
            &TenantId::default_tenant(),
            &thread.as_str().into(),
            ThreadJobs::All,
        )
        .await
        .unwrap();
    let newest_first: Vec<&str> = all.iter().rev().map(|job| job.id.as_str()).collect();
    assert_eq!(newest_first.len(), 3, "{all:?}");
    for (query, expected) in [("", &newest_first[..]), ("?limit=2", &newest_first[..2])] {
        let listed = app.get(&format!("/v1/threads/{thread}/jobs{query}")).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
        let ids: Vec<&str> = listed.body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|job| job["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, expected, "{query}");
    }
    app.finish().await;
}

/// Records what each summarizer request carried, and answers with a summary naming its request.
#[derive(Default)]
struct Recording {
    requests: std::sync::Mutex<Vec<(Vec<String>, Option<String>)>>,
}

#[async_trait]
impl Summarizer for Recording {
    fn name(&self) -> String {
        "recording".to_owned()
    }
    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let uuids: Vec<String> = req.entries.iter().filter_map(|e| e.uuid.clone()).collect();
        let mut requests = self.requests.lock().unwrap();
        requests.push((uuids, req.previous_summary.clone()));
        Ok(Summary {
            text: format!("summary {}", requests.len()),
            summarizer: "recording".to_owned(),
            calls: 1,
        })
    }
}

impl Recording {
    fn requests(&self) -> Vec<(Vec<String>, Option<String>)> {
        self.requests.lock().unwrap().clone()
    }
}

/// Runs the one pending job with `summarizer`, the pages at most `page_tokens` each.
async fn compact_in_pages(app: &TestApp, summarizer: Arc<Recording>, page_tokens: u64) -> Value {
    let config = JobsConfig {
        compaction_page_tokens: page_tokens,
        ..JobsConfig::default()
    };
    let runner = Runner::new(app.store.clone(), summarizer, config);
    match runner.step(Clock::System).await.unwrap() {
        StepOutcome::Succeeded { result, .. } => result,
        other => panic!("{other:?}"),
    }
}

/// The uuids the plain plan (the whole window read at once, `reference_plan`) summarizes, and
/// its estimate of the context before the cut.
async fn plainly_summarized(app: &TestApp, thread: &str, keep: u32) -> (Vec<String>, u64) {
    let window = app
        .store
        .context_window(&TenantId::default_tenant(), &thread.into(), None)
        .await
        .unwrap();
    let plan = reference_plan(&window.entries, keep).expect("something to summarize");
    let (seqs, pre_tokens) = (plan.summarized, plan.pre_tokens);
    let uuid_of = |seq: Option<i64>| {
        window
            .entries
            .iter()
            .find(|e| e.seq == seq)
            .and_then(|e| e.uuid.clone())
            .unwrap()
    };
    (seqs.into_iter().map(uuid_of).collect(), pre_tokens)
}

/// Compacts `thread` with pages of `page_tokens` and checks the pages against the plain plan:
/// together they carry its entries, in order, each once, and each folds in the summary before
/// it, the first `previous`. Returns how many pages there were.
async fn check_paged_compaction(
    app: &TestApp,
    thread: &str,
    page_tokens: u64,
    previous: Option<String>,
) -> usize {
    let (expected, pre_tokens) = plainly_summarized(app, thread, DEFAULT_KEEP_RECENT_ROUNDS).await;
    let pages = Arc::new(Recording::default());
    compact(app, thread, json!({})).await;
    let result = compact_in_pages(app, pages.clone(), page_tokens).await;
    let requests = pages.requests();
    assert_eq!(result["summarizer_calls"], requests.len());
    assert_eq!(result["messages_summarized"], expected.len());
    assert_eq!(result["pre_tokens"], pre_tokens);
    let carried: Vec<String> = requests
        .iter()
        .flat_map(|(uuids, _)| uuids.clone())
        .collect();
    assert_eq!(carried, expected);
    assert_eq!(requests[0].1, previous);
    for (k, (_, previous)) in requests.iter().enumerate().skip(1) {
        assert_eq!(previous.as_deref(), Some(format!("summary {k}").as_str()));
    }
    // The last page's summary is the compaction's.
    let after = result["boundary_seq"].as_i64().unwrap();
    let written = app
        .get(&format!("/v1/threads/{thread}/messages?after_seq={after}"))
        .await;
    let summary = &written.body["messages"][0];
    assert_eq!(summary["is_compact_summary"], true);
    assert!(
        summary
            .to_string()
            .contains(&format!("summary {}", requests.len())),
        "{summary}"
    );
    requests.len()
}

/// The text of the thread's last compaction summary, without its prefix.
async fn last_summary(app: &TestApp, thread: &str) -> String {
    let messages = all_messages(app, thread).await;
    let summary = messages
        .iter()
        .rev()
        .find(|m| m["is_compact_summary"] == true)
        .unwrap();
    let text = summary["message"]["content"].as_str().unwrap();
    text.strip_prefix(SUMMARY_PREFIX).unwrap().to_owned()
}

async fn a_long_window_is_summarized_a_page_at_a_time(app: TestApp) {
    // Compacted once, then grown past one read page (1,024 entries) and one seq lookup (200).
    let thread = app.thread("paged").await;
    conversation(&app, &thread, 0, 4).await;
    compact(&app, &thread, json!({})).await;
    extractive(&app).step(Clock::System).await.unwrap();
    let earlier = last_summary(&app, &thread).await;
    for from in (4..284).step_by(40) {
        conversation(&app, &thread, from, 40).await;
    }
    // Pages of about two rounds each (a round is about 700 tokens here).
    let pages = check_paged_compaction(&app, &thread, 1_500, Some(earlier)).await;
    assert!(pages >= 100, "{pages} pages");
    app.finish().await;
}

async fn a_uuid_named_boundary_is_planned_the_same_in_pages(app: TestApp) {
    // A Claude Code compaction names the rounds it kept by uuid; the job's pages must resolve
    // them as the whole window read does, or the kept rounds would be summarized.
    let thread = app.thread("claude").await;
    conversation(&app, &thread, 0, 6).await;
    append(
        &app,
        &thread,
        json!([
            {"uuid": "cc-boundary", "type": "system", "subtype": "compact_boundary",
             "content": "Conversation compacted",
             "compactMetadata": {"trigger": "auto", "preTokens": 9000,
                "preservedSegment": {"headUuid": "u4", "anchorUuid": "cc-summary", "tailUuid": "a5"}}},
            {"uuid": "cc-summary", "type": "user", "isCompactSummary": true,
             "message": {"role": "user", "content": "Earlier: questions 0 to 3 were answered."}}
        ]),
    )
    .await;
    conversation(&app, &thread, 6, 30).await;
    let (plain, _) = plainly_summarized(&app, &thread, DEFAULT_KEEP_RECENT_ROUNDS).await;
    assert!(
        plain.contains(&"u4".to_owned()),
        "the kept rounds are summarized now"
    );
    assert!(
        !plain.contains(&"u3".to_owned()),
        "what the boundary summarized is not"
    );
    let pages = check_paged_compaction(
        &app,
        &thread,
        1_500,
        Some("Earlier: questions 0 to 3 were answered.".to_owned()),
    )
    .await;
    assert!(pages >= 5, "{pages} pages");
    app.finish().await;
}

async fn a_page_of_nothing_a_model_reads_is_not_summarized(app: TestApp) {
    // Rounds, then a flood of progress events longer than a page's entry count, then the kept
    // round: the events past the first page make a page no model reads, which must not replace
    // the summary.
    let thread = app.thread("flood").await;
    conversation(&app, &thread, 0, 4).await;
    let flood: Vec<Value> = (0..SUMMARY_PAGE_ENTRIES + 200)
        .map(|i| json!({"uuid": format!("g{i}"), "type": "progress", "data": {"type": "bash_progress"}}))
        .collect();
    append(&app, &thread, Value::Array(flood)).await;
    // A last response, the one round kept: the flood ends what is summarized.
    append(&app, &thread, json!([assistant("b", "msg_b", "Done.")])).await;
    let (summarized, _) = plainly_summarized(&app, &thread, 1).await;
    assert_eq!(
        summarized.last(),
        Some(&format!("g{}", SUMMARY_PAGE_ENTRIES + 199))
    );
    assert!(
        summarized.len() > SUMMARY_PAGE_ENTRIES,
        "the flood is summarized"
    );
    let pages = Arc::new(Recording::default());
    compact(&app, &thread, json!({"keep_recent_rounds": 1})).await;
    let result = compact_in_pages(
        &app,
        pages.clone(),
        JobsConfig::default().compaction_page_tokens,
    )
    .await;
    let requests = pages.requests();
    assert_eq!(requests.len(), 1, "one page has something to read");
    assert_eq!(requests[0].0.len(), SUMMARY_PAGE_ENTRIES);
    assert_eq!(result["summarizer_calls"], 1);
    assert_eq!(result["messages_summarized"], summarized.len());
    let after = result["boundary_seq"].as_i64().unwrap();
    let written = app
        .get(&format!("/v1/threads/{thread}/messages?after_seq={after}"))
        .await;
    assert!(written.body["messages"][0]
        .to_string()
        .contains("summary 1"));
    app.finish().await;
}

async fn snipped_entries_are_not_summarized(app: TestApp) {
    // The job reads the snips through their own index, apart from the pages of the window.
    let thread = app.thread("snipped").await;
    conversation(&app, &thread, 0, 30).await;
    append(
        &app,
        &thread,
        json!([{"uuid": "snip-1", "type": "system", "subtype": "snip",
                "content": "2 messages snipped",
                "snipMetadata": {"removedUuids": ["u3", "t3"]}}]),
    )
    .await;
    conversation(&app, &thread, 30, 10).await;
    let (plain, _) = plainly_summarized(&app, &thread, DEFAULT_KEEP_RECENT_ROUNDS).await;
    assert!(plain.contains(&"u4".to_owned()) && !plain.contains(&"u3".to_owned()));
    assert!(!plain.contains(&"t3".to_owned()));
    check_paged_compaction(&app, &thread, 1_500, None).await;
    app.finish().await;
}

async fn only_a_system_entry_bounds_the_window(app: TestApp) {
    // Any entry may carry a subtype; a progress event named `compact_boundary` is no boundary,
    // for the job's reads as for the context's.
    let thread = app.thread("not-a-boundary").await;
    conversation(&app, &thread, 0, 6).await;
    append(
        &app,
        &thread,
        json!([{"uuid": "fake-boundary", "type": "progress", "subtype": "compact_boundary",
                "compact_metadata": {"preserved_segment": {"first_seq": 8, "last_seq": 11}}}]),
    )
    .await;
    conversation(&app, &thread, 6, 4).await;
    let (plain, _) = plainly_summarized(&app, &thread, DEFAULT_KEEP_RECENT_ROUNDS).await;
    assert!(plain.contains(&"u0".to_owned()) && plain.contains(&"u5".to_owned()));
    check_paged_compaction(&app, &thread, 1_500, None).await;
    app.finish().await;
}

async fn a_segment_far_outside_the_window_is_planned_as_none(app: TestApp) {
    // A boundary's segment is the client's to write: one at the end of the seq range must not
    // overflow a page's bounds, nor send the job reading toward it.
    let thread = app.thread("far-segment").await;
    conversation(&app, &thread, 0, 3).await;
    let far = i64::MAX - 100;
    append(
        &app,
        &thread,
        json!([
            {"uuid": "far-boundary", "type": "system", "subtype": "compact_boundary",
             "content": "Conversation compacted",
             "compact_metadata": {"preserved_segment": {"first_seq": far, "last_seq": far}}},
            {"uuid": "far-summary", "type": "user", "isCompactSummary": true,
             "message": {"role": "user", "content": "Earlier: three questions."}}
        ]),
    )
    .await;
    conversation(&app, &thread, 3, 5).await;
    check_paged_compaction(
        &app,
        &thread,
        1_500,
        Some("Earlier: three questions.".to_owned()),
    )
    .await;
    app.finish().await;
}
