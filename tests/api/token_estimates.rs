//! The context read's token estimate (`docs/NORMALIZATION.md` § Token estimate) under attack:
//! the overhead learned from first calls and added to content-only reads, the
//! `context_anchored` flag that decides whether a read adds it, the `model_overheads` table
//! under concurrent first calls, and the stored count that triggers automatic compaction.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::common::{user, TestApp};

on_both_backends!(first_calls_of_many_models_at_once_never_deadlock);
ignored_on_both_backends!(
    "open finding of issue 36, to fix next: see the test's doc":
    a_content_read_of_a_first_calls_window_answers_that_calls_prompt,
    a_window_whose_usage_was_erased_adds_the_learned_overhead,
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

/// A model whose tokenizer counts exactly the default rates, behind a 20,000-token system
/// prompt and tools: the first call of a thread holding one 2,000-token message reports a
/// 22,000-token prompt. A second thread holding the same message, before its first call, is
/// that same request: the content-only read must answer 22,000 and an overhead of 20,000.
///
/// Today the overhead is learned as the prompt less the *upper bound* of the content (the
/// stored count: a quarter over the default rates plus 8 tokens a frame, 2,508 here), while
/// the read adds it to the content at the default rates (2,000): every content-only read is
/// low by a quarter of its first call's content plus its framing (up to about a tenth of the
/// prompt, since content up to half of it is taken).
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
/// content-only, and must add the tenant's learned overhead like any content-only read. But
/// `threads.context_anchored` is moved only by appends, a settings change and a compaction:
/// after the erasure it still says the window is anchored, so the read loads no overhead and
/// answers the bare content (the 82 % undercount the overhead exists to fix).
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
        json!([user("q1", "hello"), response("a1", "msg_1", "sim", 20_000)]),
    )
    .await;
    app.append(&erased, json!([user("q2", "and then?")])).await;
    assert_eq!(context_tokens(&app, &erased).await["basis"], "usage");
    let erasure = app
        .post(
            &format!("/v1/threads/{erased}/erasures"),
            json!({"uuids": ["a1"]}),
        )
        .await;
    assert_eq!(erasure.status, StatusCode::CREATED, "{}", erasure.body);
    let estimate = context_tokens(&app, &erased).await;
    assert_eq!(estimate["basis"], "content", "{estimate}");
    assert!(
        estimate["overhead_tokens"]
            .as_u64()
            .is_some_and(|o| o > 10_000),
        "a content-only read adds the learned overhead: {estimate}"
    );
    // The same window in a thread that never had usage answers so.
    let twin = app.thread("twin").await;
    app.append(&twin, json!([user("q3", "hello"), user("q4", "and then?")]))
        .await;
    let expected = context_tokens(&app, &twin).await;
    assert_eq!(estimate["overhead_tokens"], expected["overhead_tokens"]);
    app.finish().await;
}
