//! Every provider through the HTTP API: the context, the stateless normalizer and pending batches
//! for `anthropic`, `openai`, `openai_responses` and `gemini`; the `model` option; media the
//! providers refuse. Each output is checked by the independent validator.

use crate::chaos::{image_of, BMP, PNG_1PX};
use crate::common::{user, TestApp};
use axum::http::StatusCode;
use loupe_validate::{anthropic, gemini, openai, responses, AnthropicRules, Violation};
use serde_json::{json, Value};

on_both_backends!(
    every_provider_gets_a_valid_context_with_model_and_media_repairs,
    thinking_enabled_closes_a_loop_opened_without_thinking,
);

const PROVIDERS: &[&str] = &["anthropic", "openai", "openai_responses", "gemini"];

fn validate(provider: &str, messages: &[Value]) -> Vec<Violation> {
    match provider {
        "anthropic" => anthropic::validate(messages, &AnthropicRules::default()),
        "openai" => openai::validate(messages),
        "openai_responses" => responses::validate(messages),
        _ => gemini::validate(messages),
    }
}

fn kinds(body: &Value) -> Vec<String> {
    body["repairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect()
}

/// A loop by `claude-a` with thinking, a reasoning item and a signed call; a prompt with a BMP
/// and a PNG; then a call by `claude-b` still waiting for its result.
fn history() -> Value {
    json!([
        {"uuid": "p0", "type": "user", "message": {"role": "user", "content": [
            {"type": "text", "text": "Look at these."}, image_of("image/bmp", BMP), image_of("image/png", PNG_1PX)]}},
        {"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "m1", "model": "claude-a", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "SIG-A"},
            {"type": "reasoning", "id": "rs_a", "summary": [], "encrypted_content": "ENC-A"},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.png"}, "thought_signature": "TS-A"}]}},
        {"uuid": "r1", "type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a picture"}]}},
        {"uuid": "a2", "type": "assistant", "message": {"role": "assistant", "id": "m2", "model": "claude-b", "content": [
            {"type": "text", "text": "One more."},
            {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"path": "b.png"}}]}},
    ])
}

async fn every_provider_gets_a_valid_context_with_model_and_media_repairs(app: TestApp) {
    let thread = app.thread("four").await;
    app.append(&thread, history()).await;
    let base = format!("/v1/threads/{thread}/context");
    for provider in PROVIDERS {
        for model in ["", "&model=claude-a", "&model=claude-b"] {
            let context = app.get(&format!("{base}?provider={provider}{model}")).await;
            assert_eq!(context.status, StatusCode::OK, "{}", context.body);
            let messages = context.body["messages"].as_array().unwrap();
            let v = validate(provider, messages);
            assert!(v.is_empty(), "{provider}{model}: {v:?}\n{}", context.body);
            let text = serde_json::to_string(messages).unwrap();
            assert!(text.contains("[image removed: media type \\\"image/bmp\\\" is not accepted]"));
            assert!(kinds(&context.body).contains(&"media_refused".to_string()));
            // Each provider sees only its own reasoning, and only the request model's.
            let own = match *provider {
                "anthropic" => "SIG-A",
                "openai_responses" => "ENC-A",
                "gemini" => "TS-A",
                _ => "no reasoning reaches Chat Completions",
            };
            assert_eq!(
                text.contains(own),
                *provider != "openai" && model != "&model=claude-b",
                "{provider}{model}: {text}"
            );
            let foreign = kinds(&context.body).contains(&"foreign_thinking_dropped".to_string());
            assert_eq!(
                foreign,
                *provider != "openai" && model == "&model=claude-b",
                "{provider}{model}: {}",
                context.body
            );
        }
    }
    // The shapes: Responses items and Gemini contents under `messages`.
    let items = app
        .get(&format!("{base}?provider=openai_responses"))
        .await
        .body;
    assert_eq!(items["messages"][0]["type"], "message");
    assert!(items["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["type"] == "function_call_output" && i["call_id"] == "toolu_2"));
    let contents = app.get(&format!("{base}?provider=gemini")).await.body;
    let last = contents["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["role"], "user");
    assert!(last["parts"][0]["functionResponse"].is_object(), "{last}");

    // The same through the stateless normalizer and a normalized pending batch.
    for provider in PROVIDERS {
        let body = json!({"messages": history(), "provider": provider, "model": "claude-a"});
        let normalized = app.post("/v1/normalize", body).await;
        assert_eq!(normalized.status, StatusCode::OK, "{}", normalized.body);
        let v = validate(provider, normalized.body["messages"].as_array().unwrap());
        assert!(v.is_empty(), "{provider}: {v:?}");
        let pending = app
            .get(&format!(
                "/v1/threads/{thread}/cursors/c/pending?format=normalized&provider={provider}&model=claude-b"
            ))
            .await;
        assert_eq!(pending.status, StatusCode::OK, "{}", pending.body);
        let messages = pending.body["normalized"]["messages"].as_array().unwrap();
        let v = validate(provider, messages);
        assert!(v.is_empty(), "{provider}: {v:?}");
    }
    app.post("/v1/normalize", json!({"messages": [], "model": ""}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.get(&format!("{base}?model="))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{base}?provider=cohere"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.finish().await;
}

async fn thinking_enabled_closes_a_loop_opened_without_thinking(app: TestApp) {
    let thread = app.thread("loop").await;
    app.append(
        &thread,
        json!([
            user("u0", "Go."),
            {"uuid": "a1", "type": "assistant", "message": {"role": "assistant", "id": "m1", "model": "claude-a", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "SIG-A"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}},
            {"uuid": "r1", "type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}},
        ]),
    )
    .await;
    let base = format!("/v1/threads/{thread}/context?thinking=enabled");
    let rules = AnthropicRules {
        thinking_enabled: true,
        manual_thinking: true,
        ..AnthropicRules::default()
    };
    let same = app.get(&format!("{base}&model=claude-a")).await;
    assert_eq!(same.status, StatusCode::OK, "{}", same.body);
    assert!(kinds(&same.body).is_empty(), "{}", same.body);
    assert_eq!(same.body["messages"][1]["content"][0]["type"], "thinking");
    let messages = same.body["messages"].as_array().unwrap();
    assert!(anthropic::validate(messages, &rules).is_empty());

    // Another model: its thinking goes, and the loop it opened is closed.
    let other = app.get(&format!("{base}&model=claude-b")).await;
    assert_eq!(
        kinds(&other.body),
        ["foreign_thinking_dropped", "thinking_loop_closed"]
    );
    let messages = other.body["messages"].as_array().unwrap();
    assert!(anthropic::validate(messages, &rules).is_empty());
    assert_eq!(
        messages[2]["content"][1]["text"],
        "[Continue from the tool results above]"
    );
    // Without the repair the validator would refuse it.
    let mut broken = messages.clone();
    broken[2]["content"].as_array_mut().unwrap().pop();
    assert_eq!(
        anthropic::validate(&broken, &rules)
            .iter()
            .map(|v| v.rule)
            .collect::<Vec<_>>(),
        ["D1.13"]
    );
    app.finish().await;
}
