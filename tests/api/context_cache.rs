//! Context reads through the cache of normalized prefixes (`http::context_cache`), on both
//! backends: an agent's appends, streamed fragments, snips, micro-compaction settings, a real
//! compaction and a thread deleted and created again are interleaved with context reads, and every
//! answer, for a spread of options, must be byte for byte the JSON of a service whose cache is
//! off. The incremental path must have been taken along the way.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use loupe::context::cache::ContextCache;
use loupe::http::{AppState, AuthMode, Limits};
use loupe::jobs::{Clock, JobsConfig, Runner};
use loupe::store::Seq;
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{assistant, user, TestApp};

on_both_backends!(
    cached_context_reads_equal_uncached_ones,
    a_tenants_cached_context_never_answers_another_tenant,
    concurrent_reads_of_a_thread_all_go_on_from_its_checkpoint,
    a_burst_of_first_reads_reads_the_window_once,
    a_checkpoint_that_cannot_answer_leaves_the_cache,
    a_window_read_in_pages_answers_as_a_whole_read,
    a_tail_ends_where_its_head_saw_the_thread_end,
    a_boundary_committed_after_the_head_belongs_to_a_later_read,
);

/// The options every step is read with.
const QUERIES: &[&str] = &[
    "",
    "?cache=true&thinking=enabled",
    "?provider=openai",
    "?provider=openai_responses&thinking=strip",
    "?provider=gemini&model=claude-opus-5",
    "?tools=Bash,Grep&advisor=true",
];

/// The service with its cache on, a handle on that cache, and the same service with it off.
struct Services {
    cached: Router,
    cache: Arc<ContextCache>,
    uncached: Router,
}

fn services(app: &TestApp, auth: impl Fn() -> AuthMode) -> Services {
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    };
    // Small pages, so a read that finds no checkpoint reads these short threads in pages.
    let paged = Limits {
        context_page_entries: 3,
        ..limits.clone()
    };
    let state = AppState::new(app.store.clone(), paged, auth());
    let cache = state.context_cache.clone();
    let uncached = AppState::new(
        app.store.clone(),
        Limits {
            context_cache_bytes: 0,
            ..limits
        },
        auth(),
    );
    Services {
        cached: loupe::http::router(state),
        cache,
        uncached: loupe::http::router(uncached),
    }
}

/// The status and the raw body bytes of a GET.
async fn get(router: &Router, key: Option<&str>, uri: &str) -> (StatusCode, Vec<u8>) {
    let mut request = Request::builder().method(Method::GET).uri(uri);
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    (
        status,
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

/// Reads the thread's context with every option set through both services: the same bytes.
async fn same_answers(s: &Services, key: Option<&str>, thread: &str, step: &str) {
    for query in QUERIES {
        let uri = format!("/v1/threads/{thread}/context{query}");
        // Twice through the cache: after an append, then with nothing appended.
        for pass in ["after the step", "read again"] {
            let (status, cached) = get(&s.cached, key, &uri).await;
            let (expected_status, uncached) = get(&s.uncached, key, &uri).await;
            assert_eq!(status, expected_status, "{step}, {query}, {pass}");
            assert_eq!(
                String::from_utf8_lossy(&cached),
                String::from_utf8_lossy(&uncached),
                "{step}, {query}, {pass}"
            );
        }
    }
}

/// `loupe_context_reads_total{path}` in the process's metrics (other tests add to it too, so
/// only its growth by at least some count says something).
fn context_reads(path: &str) -> u64 {
    let series = format!("loupe_context_reads_total{{path=\"{path}\"}}");
    loupe::metrics::render()
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

fn incremental_reads() -> u64 {
    context_reads("incremental")
}

/// A response `id` streamed as fragments: text, then tool calls each followed by its result.
fn streamed(prefix: &str, id: &str, tools: usize) -> Vec<Value> {
    let mut entries = vec![json!({"uuid": format!("{prefix}-t"), "type": "assistant",
        "message": {"role": "assistant", "id": id, "model": "claude-opus-5",
            "content": [{"type": "text", "text": format!("Looking at {prefix}.")}]}})];
    for k in 0..tools {
        let call = format!("toolu_{prefix}_{k}");
        entries.push(json!({"uuid": format!("{prefix}-u{k}"), "type": "assistant",
            "message": {"role": "assistant", "id": id, "model": "claude-opus-5",
                "content": [{"type": "tool_use", "id": call, "name": if k % 2 == 0 { "Read" } else { "Bash" },
                    "input": {"file_path": format!("src/{prefix}.rs")}}]}}));
        entries.push(json!({"uuid": format!("{prefix}-r{k}"), "type": "user",
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call,
                "content": format!("fn {prefix}_{k}() {{}}\n").repeat(20)}]}}));
    }
    entries
}

async fn append(s: &Services, key: Option<&str>, thread: &str, messages: Value) {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/threads/{thread}/messages"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let body = serde_json::to_vec(&json!({ "messages": messages })).unwrap();
    let response = s
        .cached
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
}

/// Round `i` of the agent (a streamed response with `tools` tool calls, then their results).
async fn append_round(s: &Services, thread: &str, i: usize, tools: usize) {
    let round = streamed(&format!("r{i}"), &format!("msg_r{i}"), tools);
    append(s, None, thread, json!(round)).await;
}

/// A new thread `name` with a prompt and `rounds` rounds of one tool call each.
async fn thread_with_rounds(app: &TestApp, s: &Services, name: &str, rounds: usize) -> String {
    let thread = app.thread(name).await;
    append(
        s,
        None,
        &thread,
        json!([user("p0", "Fix the failing test.")]),
    )
    .await;
    for i in 0..rounds {
        append_round(s, &thread, i, 1).await;
    }
    thread
}

async fn cached_context_reads_equal_uncached_ones(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = app.thread("agent").await;
    let before = incremental_reads();
    let hits_before = s.cache.hits();

    append(
        &s,
        None,
        &thread,
        json!([user("p0", "Fix the failing test.")]),
    )
    .await;
    same_answers(&s, None, &thread, "a prompt").await;
    for i in 0..4 {
        append_round(&s, &thread, i, 1 + i % 2).await;
        same_answers(&s, None, &thread, &format!("round {i}")).await;
    }
    // A response whose calls are not answered yet, then answered.
    append(&s, None, &thread, json!([{"uuid": "open", "type": "assistant", "message": {"role": "assistant",
        "id": "msg_open", "content": [{"type": "tool_use", "id": "toolu_open", "name": "Grep", "input": {"pattern": "x"}}]}}]))
    .await;
    same_answers(&s, None, &thread, "an unanswered call").await;
    append(&s, None, &thread, json!([{"uuid": "open-r", "type": "user", "message": {"role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_open", "content": "src/lib.rs:1"}]}},
        assistant("done0", "msg_done0", "The test passes now."),
        user("p1", "Now update the docs."),
        {"uuid": "att1", "type": "attachment", "message": {"role": "user", "content": [{"type": "text", "text": "<system-reminder>docs/</system-reminder>"}]}}]))
    .await;
    same_answers(
        &s,
        None,
        &thread,
        "answered, a new prompt and an attachment",
    )
    .await;
    for i in 4..6 {
        append_round(&s, &thread, i, 2).await;
        same_answers(&s, None, &thread, &format!("round {i}")).await;
    }

    // A snip of an old message: the checkpoint holds it, so the next read starts over.
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["r0-t"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    same_answers(&s, None, &thread, "a snip of an old message").await;
    append(&s, None, &thread, json!(streamed("r6", "msg_r6", 1))).await;
    same_answers(&s, None, &thread, "round 6").await;
    // A snip of the latest round only.
    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["r6-r0"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    same_answers(&s, None, &thread, "a snip of the latest result").await;

    // Micro-compaction turned on: other settings, another cached prefix.
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"microcompact": {"enabled": true, "keep_recent": 2, "min_bytes": 100}})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    same_answers(&s, None, &thread, "micro-compaction on").await;
    for i in 7..10 {
        append_round(&s, &thread, i, 2).await;
        same_answers(&s, None, &thread, &format!("round {i}, micro-compacted")).await;
    }

    // Clearing turned on beside it: batches of old results sent as stubs, the zoom tool offered.
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(
                json!({"microcompact": {"enabled": true, "keep_recent": 2, "min_bytes": 100},
                "clearing": {"enabled": true, "keep_tokens": 100, "batch_tokens": 150,
                    "min_bytes": 200}}),
            ),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    same_answers(&s, None, &thread, "clearing on").await;
    for i in 100..106 {
        append_round(&s, &thread, i, 2).await;
        same_answers(&s, None, &thread, &format!("round {i}, cleared")).await;
    }
    let (_, cleared) = get(&s.cached, None, &format!("/v1/threads/{thread}/context")).await;
    let cleared: Value = serde_json::from_slice(&cleared).unwrap();
    assert!(
        cleared["repairs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "tool_result_cleared"),
        "{cleared}"
    );
    assert_eq!(cleared["tools"][0]["name"], "zoom");

    // A real compaction: a new boundary and summary, the latest round kept.
    compact_now(&app, &thread, 1).await;
    same_answers(&s, None, &thread, "after a compaction").await;
    for i in 10..12 {
        append_round(&s, &thread, i, 1).await;
        same_answers(
            &s,
            None,
            &thread,
            &format!("round {i} after the compaction"),
        )
        .await;
    }

    // The thread deleted and created again under the same id: its old prefix must not be used.
    let old_length = app.get(&format!("/v1/threads/{thread}")).await.body["message_count"]
        .as_u64()
        .unwrap();
    let deleted = app.delete(&format!("/v1/threads/{thread}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    app.thread("agent").await;
    // It grows past the old checkpoint's resume point before it is read, every entry a
    // response of its own, so only the thread's identity tells the old prefix from the new one.
    let mut answers = vec![user("q0", "A new task.")];
    answers.extend((0..old_length + 4).map(|i| {
        assistant(
            &format!("n{i}"),
            &format!("msg_n{i}"),
            &format!("Step {i}."),
        )
    }));
    append(&s, None, &thread, json!(answers)).await;
    same_answers(&s, None, &thread, "the new thread").await;
    for i in 0..2 {
        let round = json!(streamed(&format!("m{i}"), &format!("msg_m{i}"), 1));
        append(&s, None, &thread, round).await;
        same_answers(&s, None, &thread, &format!("new thread, round {i}")).await;
    }

    let (checkpoints, bytes) = s.cache.size();
    assert!(checkpoints > 0 && bytes > 0, "checkpoints are cached");
    // Most reads after the first of each step and option set go on from a checkpoint.
    let incremental = incremental_reads() - before;
    assert!(incremental >= 60, "only {incremental} incremental reads");
    // The process-wide counter also counts other tests' reads: this cache's own count does not.
    let hits = s.cache.hits() - hits_before;
    assert!(hits >= 60, "only {hits} reads found their checkpoint");
    app.finish().await;
}

async fn a_tenants_cached_context_never_answers_another_tenant(app: TestApp) {
    let app = app.keyed();
    let (alice, bob) = (app.create_key("alice").await, app.create_key("bob").await);
    let keyed = || AuthMode::Keyed {
        admin_key: Some(crate::common::ADMIN_KEY.to_owned()),
    };
    let s = services(&app, keyed);
    for (key, who) in [(&alice, "alice"), (&bob, "bob")] {
        let created = app
            .post_as(key, "/v1/threads", json!({"id": "shared"}))
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        append(
            &s,
            Some(key),
            "shared",
            json!([user(&format!("{who}-p"), &format!("{who}'s secret task"))]),
        )
        .await;
        append(
            &s,
            Some(key),
            "shared",
            json!(streamed(who, &format!("msg_{who}"), 1)),
        )
        .await;
    }
    for round in 0..3 {
        for (key, who, other) in [(&alice, "alice", "bob"), (&bob, "bob", "alice")] {
            same_answers(&s, Some(key), "shared", &format!("{who}, round {round}")).await;
            let (_, body) = get(&s.cached, Some(key), "/v1/threads/shared/context").await;
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains(&format!("{who}'s secret")), "{text}");
            assert!(!text.contains(&format!("{other}'s secret")), "{text}");
            append(
                &s,
                Some(key),
                "shared",
                json!(streamed(
                    &format!("{who}{round}"),
                    &format!("msg_{who}{round}"),
                    1
                )),
            )
            .await;
        }
    }
    app.finish().await;
}

/// Reads of one thread at the same moment share its checkpoint: each finds it (none waits for or
/// misses it because another holds it), and each answers what the uncached service does.
async fn concurrent_reads_of_a_thread_all_go_on_from_its_checkpoint(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "busy", 4).await;
    let uri = format!("/v1/threads/{thread}/context");
    // The first read leaves a checkpoint; the second moves it to the last closed round.
    same_answers(&s, None, &thread, "before the burst").await;
    let (_, expected) = get(&s.uncached, None, &uri).await;
    let hits = s.cache.hits();
    let answers = futures_util::future::join_all((0..8).map(|_| get(&s.cached, None, &uri))).await;
    assert_eq!(s.cache.hits() - hits, 8, "every read found the checkpoint");
    for (status, body) in answers {
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&expected)
        );
    }
    assert_eq!(
        s.cache.size().0,
        QUERIES.len(),
        "the checkpoints stay cached"
    );
    app.finish().await;
}

/// A burst of first reads of a thread reads its window once: the reads that find no checkpoint
/// while another reads the window wait for it, then go on from the checkpoint it left. Each
/// answers what the uncached service does, and no turn is left behind.
async fn a_burst_of_first_reads_reads_the_window_once(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "cold", 40).await;
    let uri = format!("/v1/threads/{thread}/context");
    let (_, expected) = get(&s.uncached, None, &uri).await;
    let hits = s.cache.hits();
    let answers = futures_util::future::join_all((0..8).map(|_| get(&s.cached, None, &uri))).await;
    assert_eq!(
        s.cache.hits() - hits,
        7,
        "one read read the window, the others went on from its checkpoint"
    );
    for (status, body) in answers {
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&expected)
        );
    }
    assert_eq!(s.cache.first_reads(), 0, "every turn was given back");
    app.finish().await;
}

/// A thread deleted and made again under the same id keeps none of its checkpoint: the first read
/// finds it belongs to another thread and drops it, so no later read tries it again. With only a
/// prompt (no closed round) the new thread leaves no checkpoint of its own.
async fn a_checkpoint_that_cannot_answer_leaves_the_cache(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "again", 3).await;
    same_answers(&s, None, &thread, "the first thread").await;
    // One checkpoint per set of options read.
    assert_eq!(
        s.cache.size().0,
        QUERIES.len(),
        "the first thread left its checkpoints"
    );
    assert_eq!(
        app.delete(&format!("/v1/threads/{thread}")).await.status,
        StatusCode::NO_CONTENT
    );
    app.thread("again").await;
    append(&s, None, &thread, json!([user("q0", "Another task.")])).await;
    let hits = s.cache.hits();
    same_answers(&s, None, &thread, "the thread made again").await;
    assert_eq!(s.cache.size().0, 0, "the stale checkpoints were dropped");
    assert_eq!(s.cache.hits(), hits, "no read was answered from it");
    app.finish().await;
}

/// A read that finds no checkpoint reads a long window in pages of 3 (the services' setting):
/// the same bytes as the uncached service's whole read, for every option set, and a checkpoint
/// left for the next read. A snip naming an early message, read in a later page, makes the pages
/// unusable: that read reads the whole window, and answers the same.
async fn a_window_read_in_pages_answers_as_a_whole_read(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "long", 12).await;
    let paged = context_reads("paged");
    same_answers(&s, None, &thread, "read in pages").await;
    assert!(
        context_reads("paged") - paged >= QUERIES.len() as u64,
        "each option set's first read went through pages"
    );
    assert_eq!(s.cache.size().0, QUERIES.len(), "each left a checkpoint");

    let snip = app
        .post(
            &format!("/v1/threads/{thread}/snip"),
            json!({"uuids": ["r1-t"]}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    let fresh = services(&app, || AuthMode::Open);
    let fallbacks = snip_fallbacks();
    same_answers(&fresh, None, &thread, "a snip found in a later page").await;
    assert!(
        snip_fallbacks() - fallbacks >= QUERIES.len() as u64,
        "the pages met the snip"
    );
    app.finish().await;
}

/// Asks for a compaction keeping `keep` rounds and runs it at once (the extractive summarizer).
async fn compact_now(app: &TestApp, thread: &str, keep: u32) -> loupe::jobs::StepOutcome {
    let job = app
        .post(
            &format!("/v1/threads/{thread}/compact"),
            json!({"keep_recent_rounds": keep}),
        )
        .await;
    assert_eq!(job.status, StatusCode::ACCEPTED, "{}", job.body);
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    );
    runner.step(Clock::System).await.unwrap()
}

/// Reads whose pages met a snip of an entry before them.
fn snip_fallbacks() -> u64 {
    let series = "loupe_context_fallbacks_total{path=\"paged\",reason=\"a snip hides an entry before the tail\"}";
    loupe::metrics::render()
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A read that goes on from a checkpoint reads the thread's head and settings first, then the
/// tail: an append landing in between is left for the next read, so the entries and `next_seq`
/// of one answer agree. The head carries the settings a context read normalizes with.
async fn a_tail_ends_where_its_head_saw_the_thread_end(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "racing", 2).await;
    let settings = app
        .request(
            Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"microcompact": {"enabled": true, "keep_recent": 1}})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let tenant = loupe::store::TenantId::default_tenant();
    let head = app
        .store
        .context_head(&tenant, &thread.as_str().into())
        .await
        .unwrap();
    assert_eq!(
        head.settings.microcompact_options().map(|m| m.keep_recent),
        Some(1)
    );
    append_round(&s, &thread, 2, 1).await;
    let tail = app
        .store
        .context_tail(&head, Seq::new(0), Seq::new(0))
        .await
        .unwrap();
    assert_eq!(tail.next_seq, head.next_seq);
    let seqs: Vec<i64> = tail.entries.iter().filter_map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (0..head.next_seq).collect::<Vec<_>>(),
        "up to the head's end"
    );
    let later = app
        .store
        .context_head(&tenant, &thread.as_str().into())
        .await
        .unwrap();
    assert!(later.next_seq > head.next_seq);
    let tail = app
        .store
        .context_tail(&later, Seq::new(head.next_seq), Seq::new(0))
        .await
        .unwrap();
    assert_eq!(
        tail.entries.first().and_then(|e| e.seq),
        Some(head.next_seq)
    );
    assert_eq!(tail.entries.len() as i64, later.next_seq - head.next_seq);
    app.finish().await;
}

/// A read's bounds come from the head it read first: a compaction that commits its boundary
/// between the two (here, deterministically, between the two calls) belongs to the next read.
/// Bounded by the later boundary, the window would start at its own end and answer nothing.
async fn a_boundary_committed_after_the_head_belongs_to_a_later_read(app: TestApp) {
    let s = services(&app, || AuthMode::Open);
    let thread = thread_with_rounds(&app, &s, "bounded", 3).await;
    let tenant = loupe::store::TenantId::default_tenant();
    let head = app
        .store
        .context_head(&tenant, &thread.as_str().into())
        .await
        .unwrap();
    let outcome = compact_now(&app, &thread, 0).await;
    assert!(
        matches!(outcome, loupe::jobs::StepOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let later = app
        .store
        .context_head(&tenant, &thread.as_str().into())
        .await
        .unwrap();
    assert_eq!(
        later.next_seq,
        head.next_seq + 2,
        "a boundary and a summary"
    );
    let bounds = app.store.context_bounds(&head).await.unwrap();
    assert_eq!(
        bounds.boundary_seq(),
        None,
        "the boundary is the next read's"
    );
    assert_eq!((bounds.start_seq, bounds.next_seq), (0, head.next_seq));
    let window = app
        .store
        .window_page(&bounds, bounds.start_seq, bounds.next_seq)
        .await
        .unwrap();
    assert_eq!(
        window.len() as i64,
        head.next_seq,
        "the whole window the head saw"
    );
    let next = app.store.context_bounds(&later).await.unwrap();
    assert_eq!(next.boundary_seq(), Some(head.next_seq));
    assert_eq!(next.start_seq, head.next_seq);
    app.finish().await;
}
