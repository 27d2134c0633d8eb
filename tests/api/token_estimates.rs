//! The context read's token estimate (`docs/NORMALIZATION.md` § Token estimate) under attack:
//! the overhead learned from first calls and added to content-only reads, the
//! `context_anchored` flag that decides whether a read adds it, the `model_overheads` table
//! under concurrent first calls, and the stored count that triggers automatic compaction.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::common::{user, TestApp};

on_both_backends!(
    first_calls_of_many_models_at_once_never_deadlock,
    a_usage_no_provider_could_report_teaches_no_overhead,
    a_content_read_of_a_first_calls_window_answers_that_calls_prompt,
    a_window_whose_usage_was_erased_adds_the_learned_overhead,
    a_preserved_segment_is_not_taken_for_overhead,
    after_a_compaction_the_stored_count_is_still_an_upper_bound,
    upper_tokens_less_the_overhead_is_what_automatic_compaction_counts,
    a_client_boundary_with_a_preserved_segment_keeps_the_stored_count_an_upper_bound,
    an_erasure_after_a_compaction_keeps_the_stored_count_an_upper_bound,
    an_append_after_an_erasure_recount_keeps_the_window_unanchored,
    a_first_call_racing_an_erasure_learns_nothing_from_the_erased_entry,
    every_providers_usage_anchors_the_context,
);
ignored_on_both_backends!(
    "open finding: a response split across appends, `usage` on its last part only":
    a_first_call_split_across_appends_learns_its_prompt_less_the_content_before_it,
);

/// An assistant entry of `model` whose request's prompt was `prompt` tokens.
fn response(uuid: &str, id: &str, model: &str, prompt: u64) -> Value {
    json!({"uuid": uuid, "type": "assistant", "message": {"role": "assistant", "id": id,
        "model": model, "content": [{"type": "text", "text": "ok"}],
        "usage": {"input_tokens": prompt, "output_tokens": 1}}})
}

/// 7,000 ASCII characters without punctuation: prose, 2,000 tokens at the default rate (3.5
/// characters a token), one entry of framing.
fn prose() -> String {
    "word ".repeat(1_400)
}

async fn context_tokens(app: &TestApp, thread: &str) -> Value {
    let read = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    read.body["context_tokens"].clone()
}

/// `(context_tokens, context_anchored, window_content_tokens, stored_bytes)` as stored.
async fn stored(app: &TestApp, thread: &str) -> (i64, i64, i64, i64) {
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let row: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT context_tokens, context_anchored, window_content_tokens, stored_bytes \
         FROM threads WHERE thread_id = $1",
    )
    .bind(thread)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    row
}

async fn erase(app: &TestApp, thread: &str, uuids: &[&str]) {
    let erasure = app
        .post(
            &format!("/v1/threads/{thread}/erasures"),
            json!({ "uuids": uuids }),
        )
        .await;
    assert_eq!(erasure.status, StatusCode::CREATED, "{}", erasure.body);
}

/// A client compact boundary whose preserved segment is the thread's first entry.
fn keeping_the_first_entry(uuid: &str) -> Value {
    json!({"uuid": uuid, "type": "system", "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "compact_metadata": {"trigger": "manual", "pre_tokens": 2000,
                             "preserved_segment": {"first_seq": 0, "last_seq": 0}}})
}

/// The read is content only, with no overhead learned, and the stored count (the compaction
/// trigger's) is at least its upper bound; `when` says at what point, for the message.
async fn assert_the_stored_count_bounds_the_content_read(app: &TestApp, thread: &str, when: &str) {
    let estimate = context_tokens(app, thread).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    assert!(estimate["overhead_tokens"].is_null(), "{estimate}");
    let (stored, ..) = stored(app, thread).await;
    assert!(
        stored as u64 >= estimate["upper_tokens"].as_u64().unwrap(),
        "{when}stored count {stored} against the read's {estimate}"
    );
}

/// Six tool rounds, compacted keeping two (a boundary bringing back a preserved segment), the
/// summary written by the extractive summarizer.
async fn compacted_thread(app: &TestApp) -> String {
    let thread = app.thread("compacted").await;
    app.append(&thread, crate::common::tool_rounds("q", 0, 6, 200))
        .await;
    crate::tree::compact(app, &thread, 2).await;
    let runner = crate::tree::runner(
        app,
        std::sync::Arc::new(loupe::summarize::ExtractiveSummarizer::new()),
    );
    crate::tree::drain(&runner).await;
    thread
}

/// A model whose tokenizer counts exactly the default rates, behind a 20,000-token system
/// prompt and tools: the first call of a thread holding one 2,000-token message reports a
/// 22,000-token prompt. A second thread holding the same message, before its first call, is
/// that same request: the content-only read must answer 22,000 and an overhead of 20,000.
///
/// (Found: the overhead was learned as the prompt less the *upper bound* of the content, the
/// stored count, a quarter over the default rates plus 8 tokens a frame, 2,508 here, while the
/// read added it to the content at the default rates, 2,000: every content-only read was low by
/// a quarter of its first call's content plus its framing.) The same holds when the first call
/// comes in a later append than the content before it.
async fn a_content_read_of_a_first_calls_window_answers_that_calls_prompt(app: TestApp) {
    let taught = app.thread("taught").await;
    app.append(
        &taught,
        json!([user("q0", &prose()), response("a0", "msg_0", "sim", 22_000)]),
    )
    .await;
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q1", &prose())])).await;
    let estimate = context_tokens(&app, &fresh).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    assert_eq!(
        (
            estimate["tokens"].as_u64(),
            estimate["overhead_tokens"].as_u64()
        ),
        (Some(22_000), Some(20_000)),
        "the same request as the first call's: {estimate}"
    );
    assert!(estimate["upper_tokens"].as_u64() >= Some(22_000));
    // The first call in its own append, after the content: the same lesson.
    let later = app.thread("later").await;
    app.append(&later, json!([user("q2", &prose())])).await;
    app.append(&later, json!([response("a2", "msg_2", "sim", 22_000)]))
        .await;
    let estimate = context_tokens(&app, &fresh).await;
    assert_eq!(
        estimate["overhead_tokens"].as_u64(),
        Some(20_000),
        "{estimate}"
    );
    app.finish().await;
}

/// A tenant whose first calls name more models than `model_overheads` keeps (16) races them
/// on many threads at once, each beside a plain append of another tenant. Every append must be
/// stored (201): nothing here is the database's fault.
///
/// Today `overheads::learn_in` follows each upsert with a `DELETE ... NOT IN (the 16 most
/// recent)`, which locks the rows it evicts in whatever order it meets them, after the upserts
/// locked theirs in (tenant, model) order. Two groups of the tenant (PostgreSQL has two group
/// runners) then each wait on a row the other holds: PostgreSQL aborts one with `deadlock
/// detected`, which is transient, so every append of that group is answered 503, the other
/// tenant's plain appends that shared it included (about 3 % of each tenant's appends here).
async fn first_calls_of_many_models_at_once_never_deadlock(app: TestApp) {
    const THREADS: usize = 120;
    const MODELS: usize = 24;
    const ROUNDS: usize = 6;
    let app = app.keyed();
    let churn = app.create_key("churn").await;
    let bystander = app.create_key("bystander").await;
    let mut statuses: BTreeMap<(&str, u16), usize> = BTreeMap::new();
    for round in 0..ROUNDS {
        for t in 0..THREADS {
            for key in [&churn, &bystander] {
                let id = format!("r{round}-t{t}");
                let created = app.post_as(key, "/v1/threads", json!({ "id": id })).await;
                assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
            }
        }
        let (app, churn, bystander) = (&app, &churn, &bystander);
        // Each first call beside a plain append of the other tenant, so that groups hold both.
        let appends = (0..THREADS).flat_map(|t| {
            let uri = format!("/v1/threads/r{round}-t{t}/messages");
            let model = format!("model-{:02}", (t * 7 + round) % MODELS);
            let first_call = json!([
                user(&format!("q{t}"), "hi"),
                response(
                    &format!("a{t}"),
                    &format!("m{t}"),
                    &model,
                    20_000 + t as u64
                )
            ]);
            let plain = json!([user(&format!("q{t}"), "hello")]);
            [
                ("churn", churn, first_call),
                ("bystander", bystander, plain),
            ]
            .map(|(tenant, key, messages)| {
                let uri = uri.clone();
                async move {
                    let answer = app
                        .post_as(key, &uri, json!({ "messages": messages }))
                        .await;
                    (tenant, answer.status)
                }
            })
        });
        for (tenant, status) in join_all(appends).await {
            *statuses.entry((tenant, status.as_u16())).or_default() += 1;
        }
    }
    let stored: usize = statuses
        .iter()
        .filter(|((_, status), _)| *status == 201)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        stored,
        2 * ROUNDS * THREADS,
        "answers by tenant and status: {statuses:?}"
    );
    app.finish().await;
}

/// Erasing the only response with `usage` leaves a window without any: the read is
/// content-only, and must add the tenant's learned overhead like any content-only read. (Found:
/// `threads.context_anchored` was moved only by appends, a settings change and a compaction, so
/// after the erasure it still said the window was anchored, the read loaded no overhead and
/// answered the bare content, the 82 % undercount the overhead exists to fix.) The erased
/// thread's own lesson (another model's, here) is forgotten with it; the tenant's others stay.
async fn a_window_whose_usage_was_erased_adds_the_learned_overhead(app: TestApp) {
    let taught = app.thread("taught").await;
    app.append(
        &taught,
        json!([user("q0", "hello"), response("a0", "msg_0", "sim", 20_000)]),
    )
    .await;
    let erased = app.thread("erased").await;
    app.append(
        &erased,
        json!([
            user("q1", "hello"),
            response("a1", "msg_1", "other", 30_000)
        ]),
    )
    .await;
    app.append(&erased, json!([user("q2", "and then?")])).await;
    assert_eq!(context_tokens(&app, &erased).await["basis"], "usage");
    erase(&app, &erased, &["a1"]).await;
    let estimate = context_tokens(&app, &erased).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    assert!(
        estimate["overhead_tokens"]
            .as_u64()
            .is_some_and(|o| (19_990..=20_000).contains(&o)),
        "a content-only read adds the learned overhead, and not the erased one: {estimate}"
    );
    // The same window in a thread that never had usage answers so.
    let twin = app.thread("twin").await;
    app.append(&twin, json!([user("q3", "hello"), user("q4", "and then?")]))
        .await;
    let expected = context_tokens(&app, &twin).await;
    assert_eq!(estimate["overhead_tokens"], expected["overhead_tokens"]);
    app.finish().await;
}

/// A client-side compact boundary that keeps a preserved segment (`compact_metadata.
/// preserved_segment`): the next request carries the segment, the summary and the overhead,
/// and the context read counts the segment in the window. (Found: the append path counted the
/// batch from the boundary on and took the first call after it as a window with nothing before
/// it but the summary, so the whole preserved segment, any size a client keeps, was learned as
/// the model's overhead.) Whether the boundary comes in the first call's batch or before it,
/// such a window teaches nothing: the overhead stays what a plain first call taught.
async fn a_preserved_segment_is_not_taken_for_overhead(app: TestApp) {
    let plain = app.thread("plain").await;
    app.append(
        &plain,
        json!([user("q0", "hi"), response("a0", "msg_0", "sim", 20_001)]),
    )
    .await;
    let later = app.thread("later").await;
    app.append(&later, json!([user("l0", &prose())])).await;
    app.append(
        &later,
        json!([keeping_the_first_entry("lb"), user("ls", "Summary: ok.")]),
    )
    .await;
    app.append(&later, json!([response("la", "msg_l", "sim", 22_003)]))
        .await;
    let thread = app.thread("kept").await;
    app.append(&thread, json!([user("p0", &prose())])).await;
    app.append(
        &thread,
        json!([
            keeping_the_first_entry("b1"),
            user("s1", "Summary: ok."),
            // 20,000 of overhead, the 2,000 preserved, the summary's 3.
            response("a1", "msg_1", "sim", 22_003)
        ]),
    )
    .await;
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q1", "hi")])).await;
    let estimate = context_tokens(&app, &fresh).await;
    assert!(
        estimate["overhead_tokens"]
            .as_u64()
            .is_some_and(|overhead| (19_990..=20_001).contains(&overhead)),
        "the overhead is 20,000, not the preserved segment too: {estimate}"
    );
    app.finish().await;
}

/// `usage_tokens` clamps each figure to 10^9 so that `2^64-1` ("a figure no provider could
/// report") wraps nothing; but the first call that reports it still teaches the tenant's
/// overhead a prompt of a billion tokens, and every content-only read of the tenant's threads
/// (any model: the most recent overhead stands in for a model without one) then answers
/// about a billion tokens, for dozens of first calls (the running mean forgets an eighth a
/// sample).
async fn a_usage_no_provider_could_report_teaches_no_overhead(app: TestApp) {
    let absurd = app.thread("absurd").await;
    app.append(
        &absurd,
        json!([user("q0", "hi"), {"uuid": "a0", "type": "assistant", "message": {
            "role": "assistant", "id": "msg_0", "model": "sim",
            "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": u64::MAX, "cache_read_input_tokens": u64::MAX,
                      "output_tokens": 1}}}]),
    )
    .await;
    // Then three ordinary first calls of the same model.
    for i in 1..4 {
        let thread = app.thread(&format!("ordinary-{i}")).await;
        app.append(
            &thread,
            json!([
                user(&format!("q{i}"), "hi"),
                response(&format!("a{i}"), &format!("msg_{i}"), "sim", 20_000)
            ]),
        )
        .await;
    }
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q9", "hi")])).await;
    let estimate = context_tokens(&app, &fresh).await;
    // No model's window is near 10 million tokens.
    assert!(
        estimate["tokens"].as_u64() < Some(10_000_000),
        "a thread saying `hi`: {estimate}"
    );
    app.finish().await;
}

/// The stored count that triggers automatic compaction is "the last `usage` plus the content
/// after it at the uncalibrated upper rates" (NORMALIZATION.md § Token estimate): after a
/// compaction, with no usage anywhere, at least the read's `upper_tokens` of the same window
/// (no overhead is learned here, so that is the content's upper bound alone). (Found:
/// `write_compaction` set it to the summary and the kept rounds at characters / 4, about half of
/// the upper rates for code, so the next automatic compaction came that much later than the
/// bound says: the late compaction the upper bound exists to prevent.)
async fn after_a_compaction_the_stored_count_is_still_an_upper_bound(app: TestApp) {
    let thread = compacted_thread(&app).await;
    assert_the_stored_count_bounds_the_content_read(&app, &thread, "").await;
    app.finish().await;
}

/// `upper_tokens` as the OpenAPI document describes it beside automatic compaction: the trigger
/// counts the same content bound without the learned overhead. (Found: the document said
/// `upper_tokens` was "what automatic compaction counts", while a content-only read's holds the
/// overhead the trigger leaves out, so a client budgeting by it expected a compaction that
/// never came.) Two tenants store the same content under the same threshold, one with a learned
/// overhead: both compact alike, and their bounds differ by the overhead alone.
async fn upper_tokens_less_the_overhead_is_what_automatic_compaction_counts(app: TestApp) {
    let app = app.keyed();
    let taught = app.create_key("taught").await;
    let fresh = app.create_key("fresh").await;
    let created = app
        .post_as(&taught, "/v1/threads", json!({"id": "teacher"}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let first_call = json!([user("q0", "hello"), response("a0", "msg_0", "sim", 20_000)]);
    let taught_it = app
        .post_as(
            &taught,
            "/v1/threads/teacher/messages",
            json!({ "messages": first_call }),
        )
        .await;
    assert_eq!(taught_it.status, StatusCode::CREATED, "{}", taught_it.body);
    let mut bounds = Vec::new();
    for key in [&taught, &fresh] {
        let created = app
            .post_as(key, "/v1/threads", json!({"id": "budgeted"}))
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        let settings = app
            .request_as(
                Some(key),
                axum::http::Method::PUT,
                "/v1/threads/budgeted/settings",
                Some(json!({"auto_compact_tokens": 5_000})),
            )
            .await;
        assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
        // Two messages of 2,508 tokens at the upper rates: past 5,000 with the second.
        for q in ["q1", "q2"] {
            let appended = app
                .post_as(
                    key,
                    "/v1/threads/budgeted/messages",
                    json!({"messages": [user(q, &prose())]}),
                )
                .await;
            assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
        }
        let read = app.get_as(key, "/v1/threads/budgeted/context").await;
        assert_eq!(read.status, StatusCode::OK, "{}", read.body);
        let jobs = app.get_as(key, "/v1/threads/budgeted/jobs").await;
        let compactions = jobs.body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|job| job["kind"] == "compaction")
            .count();
        bounds.push((read.body["context_tokens"].clone(), compactions));
    }
    let [(with_overhead, compacted), (without, compacted_too)] = &bounds[..] else {
        unreachable!()
    };
    assert_eq!(
        (*compacted, *compacted_too),
        (1, 1),
        "the same content compacts alike: {bounds:?}"
    );
    let figure = |estimate: &Value, name: &str| estimate[name].as_u64().unwrap();
    assert!(figure(without, "upper_tokens") >= 5_000, "{without}");
    assert_eq!(
        figure(with_overhead, "tokens") - figure(without, "tokens"),
        figure(with_overhead, "overhead_tokens"),
        "{bounds:?}"
    );
    assert!(
        figure(with_overhead, "upper_tokens") - figure(without, "upper_tokens") >= 19_990,
        "{bounds:?}"
    );
    // And the document says so.
    let document = app.get("/openapi.json").await;
    let described = &document.body["components"]["schemas"]["ContextEstimate"]["properties"]
        ["upper_tokens"]["description"];
    assert!(
        described
            .as_str()
            .is_some_and(|text| text.contains("without the learned overhead")),
        "{described}"
    );
    app.finish().await;
}

/// A client-written compact boundary that brings back a preserved segment: the read counts the
/// segment in the window (content basis), so the stored count, "the read's upper_tokens less
/// the overhead's bound" on a content-only window, must count it too. (Found: the append path
/// reset the count at the boundary and counted only what follows it.)
async fn a_client_boundary_with_a_preserved_segment_keeps_the_stored_count_an_upper_bound(
    app: TestApp,
) {
    let thread = app.thread("kept").await;
    app.append(&thread, json!([user("p0", &prose())])).await;
    app.append(
        &thread,
        json!([keeping_the_first_entry("b1"), user("s1", "Summary: ok.")]),
    )
    .await;
    assert_the_stored_count_bounds_the_content_read(&app, &thread, "").await;
    app.finish().await;
}

/// A compaction that keeps rounds writes a boundary with a preserved segment and stores the
/// kept rounds in its count. An erasure then counts the thread again. (Found: the recount reset
/// at the boundary, so the kept rounds dropped out of the stored count while the read still
/// counted them.)
async fn an_erasure_after_a_compaction_keeps_the_stored_count_an_upper_bound(app: TestApp) {
    let thread = compacted_thread(&app).await;
    let before = context_tokens(&app, &thread).await;
    let (compacted, ..) = stored(&app, &thread).await;
    assert!(compacted as u64 >= before["upper_tokens"].as_u64().unwrap());
    // Erase the first round's question: summarized, not kept.
    erase(&app, &thread, &["q0"]).await;
    let estimate = context_tokens(&app, &thread).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    let (tokens, ..) = stored(&app, &thread).await;
    assert!(
        tokens as u64 >= estimate["upper_tokens"].as_u64().unwrap(),
        "after the erasure: stored count {tokens} (it was {compacted} after the compaction) \
         against the read's {estimate}"
    );
    app.finish().await;
}

/// An assistant entry with `usage` whose tombstone can be made exactly as long as its body: the
/// tombstone drops `pad`, `model` and `usage` and adds the server's `erased` mark (`created_at`
/// is sent, so both carry the same text); a probe measures the difference.
fn crafted(uuid: &str, prompt: u64, pad: usize) -> Value {
    json!({"uuid": uuid, "type": "assistant", "created_at": "2026-01-01T00:00:00Z",
        "pad": "x".repeat(pad),
        "message": {"role": "assistant", "id": "msg_1", "model": "m", "content": "",
            "usage": {"input_tokens": prompt}}})
}

/// PostgreSQL's unlocked append path takes a thread from its cache and writes its counters
/// only if the row is as the cache left it. (Found: it compared `next_seq`, `stored_bytes`,
/// `context_tokens` and the settings, but wrote `context_anchored` and `window_content_tokens`
/// from the cache, so an erasure recount that changed those two alone was undone by the next
/// append: the window whose only usage was erased was marked anchored again, and the read added
/// no overhead.)
async fn an_append_after_an_erasure_recount_keeps_the_window_unanchored(app: TestApp) {
    let taught = app.thread("taught").await;
    app.append(
        &taught,
        json!([user("q0", "hello"), response("a0", "msg_0", "sim", 20_000)]),
    )
    .await;
    // A probe: what the erasure frees, and what the window counts once erased.
    const PROBE_PAD: usize = 400;
    let probe = app.thread("probe").await;
    app.append(
        &probe,
        json!([user("q1", &prose()), crafted("a1", 1000, PROBE_PAD)]),
    )
    .await;
    let (_, _, _, bytes_before) = stored(&app, &probe).await;
    erase(&app, &probe, &["a1"]).await;
    let (erased_count, _, _, bytes_after) = stored(&app, &probe).await;
    let freed = (bytes_before - bytes_after) as usize;
    assert!(freed < PROBE_PAD, "freed {freed}");
    assert!((1000..10_000).contains(&erased_count), "{erased_count}");
    // The thread: usage equal to its erased count, a tombstone as long as the entry.
    let thread = app.thread("target").await;
    app.append(
        &thread,
        json!([
            user("q1", &prose()),
            crafted("a1", erased_count as u64, PROBE_PAD - freed)
        ]),
    )
    .await;
    let (tokens, anchored, _, bytes) = stored(&app, &thread).await;
    assert_eq!((tokens, anchored), (erased_count, 1));
    erase(&app, &thread, &["a1"]).await;
    let after_erasure = stored(&app, &thread).await;
    assert_eq!(
        (after_erasure.0, after_erasure.1, after_erasure.3),
        (erased_count, 0, bytes),
        "the recount unanchored the window, moving neither count nor bytes"
    );
    app.append(&thread, json!([user("q2", "and then?")])).await;
    let (_, anchored, content, _) = stored(&app, &thread).await;
    let estimate = context_tokens(&app, &thread).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    assert!(
        anchored == 0 && estimate["overhead_tokens"].as_u64() > Some(19_000),
        "after an append: context_anchored {anchored}, window_content_tokens {content} \
         (after the erasure: {after_erasure:?}); the read: {estimate}"
    );
    app.finish().await;
}

/// The erasure forgets the overheads the thread taught inside its transaction, and counts the
/// thread again (`window_content_tokens` among it) only after it committed. (Found: a first
/// call appended in between was sampled against the window's content *with the erased entry*,
/// and what it taught was kept in `model_overheads` and `overhead_sources` after the erasure
/// answered.) The window is long so that the recount takes a while; the first call is sent as
/// soon as the erasure's receipt is committed.
async fn a_first_call_racing_an_erasure_learns_nothing_from_the_erased_entry(app: TestApp) {
    const PROMPT: u64 = 200_000;
    let pool = sqlx::AnyPool::connect(&app.url).await.unwrap();
    let mut hits = Vec::new();
    for round in 0..3 {
        let thread = app.thread(&format!("secret-{round}")).await;
        for chunk in 0..8 {
            let filler: Vec<Value> = (0..500)
                .map(|i| user(&format!("f{chunk}-{i}"), "a"))
                .collect();
            app.append(&thread, filler).await;
        }
        app.append(&thread, json!([user("secret", &prose())])).await;
        let (_, _, window_before, _) = stored(&app, &thread).await;
        sqlx::query("DELETE FROM model_overheads")
            .execute(&pool)
            .await
            .unwrap();
        let erasing = erase(&app, &thread, &["secret"]);
        let racing = async {
            // As soon as the erasure's receipt is committed, the first call of the window.
            loop {
                let committed: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM erasures e JOIN threads t \
                     ON t.thread_key = e.thread_key WHERE t.thread_id = $1",
                )
                .bind(&thread)
                .fetch_one(&pool)
                .await
                .unwrap();
                if committed > 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            app.append(&thread, json!([response("first", "msg_f", "sim", PROMPT)]))
                .await;
        };
        tokio::join!(erasing, racing);
        let learned: Vec<i64> = sqlx::query_scalar("SELECT tokens FROM model_overheads")
            .fetch_all(&pool)
            .await
            .unwrap();
        // With the erased 2,000 tokens in the content, the lesson is 2,000 lower.
        let stale = PROMPT as i64 - window_before;
        if learned.contains(&stale) {
            hits.push((round, window_before, learned));
        }
    }
    pool.close().await;
    assert!(
        hits.is_empty(),
        "overheads learned from a window content that held the erased entry \
         (round, window_content_tokens before the erasure, model_overheads.tokens): {hits:?}"
    );
    app.finish().await;
}

/// A response stored in two parts (one response id), the first part without `usage`, the
/// second with it: the second is the window's first call, and its prompt is the window before
/// the response. The first part is the response's own output, not in its prompt, but
/// `window_content_tokens` counts it as content before the call, so the overhead learned is
/// low by the first part's size (2,000 tokens here).
async fn a_first_call_split_across_appends_learns_its_prompt_less_the_content_before_it(
    app: TestApp,
) {
    let thread = app.thread("split").await;
    app.append(&thread, json!([user("q", "hi")])).await;
    app.append(
        &thread,
        json!([{"uuid": "x1", "type": "assistant", "message": {"role": "assistant",
            "id": "msg_s", "model": "split", "content": [{"type": "text", "text": prose()}]}}]),
    )
    .await;
    // 20,000 of overhead and `hi`.
    app.append(&thread, json!([response("x2", "msg_s", "split", 20_001)]))
        .await;
    let fresh = app.thread("fresh").await;
    app.append(&fresh, json!([user("q1", "hi")])).await;
    let estimate = context_tokens(&app, &fresh).await;
    assert!(
        estimate["overhead_tokens"]
            .as_u64()
            .is_some_and(|o| (19_990..=20_001).contains(&o)),
        "the overhead is 20,000, not less the response's own first part: {estimate}"
    );
    app.finish().await;
}

/// A response's `usage` as each provider's SDK returns it anchors the context read and prices
/// the economics alike: a 1,003-token prompt of which 900 came from the cache, 20 tokens out.
/// OpenAI's and Gemini's cached tokens are inside their prompt figure, Anthropic's beside it.
///
/// (Found by the Chat Completions example: `prompt_tokens` and `completion_tokens` were not
/// read, so a thread of Chat responses was estimated from its content alone, `basis: content`.)
async fn every_providers_usage_anchors_the_context(app: TestApp) {
    let forms = [
        (
            "anthropic",
            "anthropic",
            json!({"input_tokens": 3, "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 900, "output_tokens": 20}),
        ),
        (
            "chat",
            "openai",
            json!({"prompt_tokens": 1003, "completion_tokens": 20,
            "total_tokens": 1023, "prompt_tokens_details": {"cached_tokens": 900, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 8, "audio_tokens": 0}}),
        ),
        (
            "responses",
            "openai_responses",
            json!({"input_tokens": 1003,
            "input_tokens_details": {"cached_tokens": 900}, "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 8}, "total_tokens": 1023}),
        ),
        (
            "gemini",
            "gemini",
            json!({"promptTokenCount": 1003, "cachedContentTokenCount": 900,
            "candidatesTokenCount": 12, "thoughtsTokenCount": 8, "totalTokenCount": 1023}),
        ),
    ];
    for (name, provider, usage) in forms {
        let thread = app.thread(name).await;
        app.append(
            &thread,
            json!([user("q", "What is in the report?"),
                {"uuid": "a", "type": "assistant", "message": {"role": "assistant", "id": "r1",
                    "model": "m", "content": [{"type": "text", "text": "Revenue rose."}],
                    "usage": usage}}]),
        )
        .await;
        let read = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await;
        assert_eq!(read.status, StatusCode::OK, "{}", read.body);
        let estimate = &read.body["context_tokens"];
        assert_eq!(
            (estimate["basis"].as_str(), estimate["tokens"].as_u64()),
            (Some("usage"), Some(1023)),
            "{name}: {estimate}"
        );
        let economics = app.get(&format!("/v1/threads/{thread}/economics")).await;
        assert_eq!(economics.status, StatusCode::OK, "{}", economics.body);
        let point = &economics.body["points"][0];
        assert_eq!(
            point["reported"],
            json!({"prompt_tokens": 1003, "output_tokens": 20}),
            "{name}: {point}"
        );
        let written = if name == "anthropic" { 100 } else { 0 };
        let plain = 1003 - 900 - written;
        assert_eq!(
            point["cost"]["reported"].as_f64(),
            Some((plain * 100 + written * 125 + 900 * 10) as f64 / 100.0),
            "{name}: {point}"
        );
    }
    app.finish().await;
}
