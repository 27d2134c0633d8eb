//! Rounds, context, snips and the stateless normalizer, through the HTTP API on both backends.

use crate::common::{assistant, user, TestApp};
use axum::http::StatusCode;
use loupe_validate::{anthropic, openai, AnthropicRules};
use serde_json::{json, Value};

on_both_backends!(
    the_seed_example_groups_into_two_rounds,
    a_crash_mid_tool_call_gets_a_synthetic_result_for_both_providers,
    the_context_starts_at_the_last_compact_boundary,
    snipped_messages_leave_the_context_but_not_the_store,
    a_snip_names_at_most_1000_per_list_each_once,
    bad_context_options_are_400,
    old_tool_results_are_cleared_in_batches_and_one_zoom_reads_them,
    clearing_settings_are_bounded_and_default_when_unset,
    the_stateless_normalizer_clears_with_the_same_stubs,
);

fn tool_use(uuid: &str, id: &str, tool_id: &str) -> Value {
    json!({"uuid": uuid, "type": "assistant", "message": {"role": "assistant", "id": id,
        "content": [{"type": "tool_use", "id": tool_id, "name": "weather", "input": {"city": "Oslo"}}]}})
}

fn tool_result(uuid: &str, tool_id: &str, text: &str) -> Value {
    json!({"uuid": uuid, "type": "user", "message": {"role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": text}]}})
}

async fn the_seed_example_groups_into_two_rounds(app: TestApp) {
    let thread = app.thread("seed").await;
    app.append(
        &thread,
        json!([
            user("s0", "Check the weather."),
            tool_use("s1", "A1", "toolu_1"),
            tool_result("s2", "toolu_1", "Sunny"),
            assistant("s3", "A1", "It is sunny."),
            user("s4", "Great, thanks."),
            assistant("s5", "B2", "You're welcome."),
        ]),
    )
    .await;
    let rounds = app.get(&format!("/v1/threads/{thread}/rounds")).await;
    assert_eq!(rounds.status, StatusCode::OK, "{}", rounds.body);
    let spans: Vec<(i64, i64, bool)> = rounds.body["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["first_seq"].as_i64().unwrap(),
                r["last_seq"].as_i64().unwrap(),
                r["closed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(spans, [(0, 4, true), (5, 5, true)]);
    // The split fragments of A1 come back as one assistant turn.
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    let messages = context.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{}", context.body);
    assert_eq!(messages[1]["role"], "assistant");
    let blocks: Vec<&str> = messages[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(blocks, ["tool_use", "text"]);
    assert!(anthropic::validate(messages, &AnthropicRules::default()).is_empty());
    app.finish().await;
}

async fn a_crash_mid_tool_call_gets_a_synthetic_result_for_both_providers(app: TestApp) {
    let thread = app.thread("crash").await;
    app.append(
        &thread,
        json!([
            user("c0", "What's the weather in Oslo?"),
            tool_use("c1", "msg_c1", "toolu_crash"),
        ]),
    )
    .await;
    let context = app
        .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let messages = context.body["messages"].as_array().unwrap();
    let violations = anthropic::validate(messages, &AnthropicRules::default());
    assert!(violations.is_empty(), "{violations:?}\n{}", context.body);
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"][0]["tool_use_id"], "toolu_crash");
    assert_eq!(last["content"][0]["is_error"], true);
    let repairs = context.body["repairs"].as_array().unwrap();
    let synthetic = repairs
        .iter()
        .find(|r| r["kind"] == "synthetic_tool_result")
        .expect("a repair says so");
    assert_eq!(synthetic["seqs"], json!([1]));
    assert!(context.body["estimated_tokens"].as_u64().unwrap() > 0);
    assert_eq!(context.body["next_seq"], 2);

    let openai_context = app
        .get(&format!("/v1/threads/{thread}/context?provider=openai"))
        .await;
    let messages = openai_context.body["messages"].as_array().unwrap();
    assert!(
        openai::validate(messages).is_empty(),
        "{}",
        openai_context.body
    );
    assert_eq!(messages.last().unwrap()["role"], "tool");
    app.finish().await;
}

async fn the_context_starts_at_the_last_compact_boundary(app: TestApp) {
    let thread = app.thread("boundary").await;
    app.append(&thread, json!([
        user("b0", "old question"),
        assistant("b1", "msg_b1", "old answer"),
        user("b2", "kept question"),
        assistant("b3", "msg_b3", "kept answer"),
        {"uuid": "b4", "type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
         "compact_metadata": {"trigger": "manual", "pre_tokens": 100, "preserved_segment": {"first_seq": 2, "last_seq": 3}}},
        {"uuid": "b5", "type": "user", "is_compact_summary": true,
         "message": {"role": "user", "content": "Summary: the user asked an old question."}},
        user("b6", "new question"),
    ]))
    .await;
    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    assert_eq!(context.body["boundary"], 4);
    let text = context.body["messages"].to_string();
    assert!(!text.contains("old answer"), "{text}");
    let summary = text.find("Summary: the user asked").expect("the summary");
    let kept = text.find("kept answer").expect("the preserved round");
    let new = text
        .find("new question")
        .expect("the message after the boundary");
    assert!(summary < kept && kept < new, "{text}");
    assert!(anthropic::validate(
        context.body["messages"].as_array().unwrap(),
        &AnthropicRules::default()
    )
    .is_empty());
    // Nothing was deleted.
    let all = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(
        all.body["messages"][1]["message"]["content"][0]["text"],
        "old answer"
    );
    // Rounds start at the boundary window by default, anywhere on request.
    let rounds = app.get(&format!("/v1/threads/{thread}/rounds")).await;
    assert_eq!(rounds.body["from_seq"], 2);
    let all_rounds = app
        .get(&format!("/v1/threads/{thread}/rounds?from_seq=0"))
        .await;
    assert_eq!(all_rounds.body["rounds"][0]["first_seq"], 0);
    app.finish().await;
}

async fn snipped_messages_leave_the_context_but_not_the_store(app: TestApp) {
    let thread = app.thread("snip").await;
    app.append(
        &thread,
        json!([
            user("n0", "first"),
            assistant("n1", "msg_n1", "noise one"),
            user("n2", "second"),
            assistant("n3", "msg_n3", "noise two"),
            user("n4", "third"),
        ]),
    )
    .await;
    let uri = format!("/v1/threads/{thread}/snip");
    let snip = app
        .post(
            &uri,
            json!({"seqs": [1], "uuids": ["n3"], "uuid": "snip-1"}),
        )
        .await;
    assert_eq!(snip.status, StatusCode::CREATED, "{}", snip.body);
    assert_eq!(snip.body["snip"]["seq"], 5);
    assert_eq!(
        snip.body["snip"]["snip_metadata"]["removed_uuids"],
        json!(["n1", "n3"])
    );
    let again = app
        .post(
            &uri,
            json!({"seqs": [1], "uuids": ["n3"], "uuid": "snip-1"}),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["next_seq"], 6);

    let context = app.get(&format!("/v1/threads/{thread}/context")).await;
    let text = context.body["messages"].to_string();
    assert!(!text.contains("noise"), "{text}");
    assert!(text.contains("first") && text.contains("second") && text.contains("third"));
    assert!(anthropic::validate(
        context.body["messages"].as_array().unwrap(),
        &AnthropicRules::default()
    )
    .is_empty());
    let stored = app.get(&format!("/v1/threads/{thread}/messages")).await;
    assert_eq!(
        stored.body["messages"][1]["message"]["content"][0]["text"],
        "noise one"
    );

    let missing = app.post(&uri, json!({"seqs": [99]})).await;
    let problem = missing.assert_problem(StatusCode::CONFLICT, "no-such-message");
    assert_eq!(problem["errors"][0]["field"], "seqs");
    let missing = app.post(&uri, json!({"uuids": ["n0", "nope"]})).await;
    let problem = missing.assert_problem(StatusCode::CONFLICT, "no-such-message");
    assert_eq!(problem["errors"][0]["field"], "uuids");
    assert!(problem["detail"].as_str().unwrap().contains("nope"));
    app.post(&uri, json!({}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post("/v1/threads/nope/snip", json!({"seqs": [0]}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

/// A snip's `seqs` and `uuids` are bounded as an erasure's are (at most 1,000 each, 422
/// otherwise: 2 million seqs ran for 18 s on PostgreSQL), a message named twice is hidden once,
/// and the snip's own uuid is 1–200 characters, as every entry's (the document says so).
async fn a_snip_names_at_most_1000_per_list_each_once(app: TestApp) {
    let thread = app.thread("bounded-snip").await;
    app.append(
        &thread,
        json!([
            user("b0", "zero"),
            assistant("b1", "msg_b1", "one"),
            user("b2", "two")
        ]),
    )
    .await;
    let uri = format!("/v1/threads/{thread}/snip");
    let seqs: Vec<i64> = (0..1001).collect();
    let uuids: Vec<String> = (0..1001).map(|i| format!("u-{i}")).collect();
    for (body, field) in [
        (json!({"seqs": seqs}), "seqs"),
        (json!({"uuids": uuids}), "uuids"),
        (json!({"seqs": vec![1; 1001]}), "seqs"),
    ] {
        let refused = app.post(&uri, body).await;
        let problem = refused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert_eq!(problem["errors"][0]["field"], field, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("1000"),
            "{problem}"
        );
    }
    let twice = app
        .post(
            &uri,
            json!({"seqs": vec![1; 1000], "uuids": ["b1", "b1", "b2"]}),
        )
        .await;
    assert_eq!(twice.status, StatusCode::CREATED, "{}", twice.body);
    assert_eq!(
        twice.body["snip"]["snip_metadata"]["removed_uuids"],
        json!(["b1", "b2"])
    );
    let empty = app.post(&uri, json!({"seqs": [0], "uuid": ""})).await;
    let problem = empty.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    assert_eq!(problem["errors"][0]["field"], "uuid", "{problem}");
    let document = loupe::http::openapi();
    let schema = &document["components"]["schemas"]["SnipRequest"]["properties"];
    assert_eq!(schema["seqs"]["maxItems"], 1000, "{schema}");
    assert_eq!(schema["uuids"]["maxItems"], 1000, "{schema}");
    assert_eq!(schema["uuid"]["minLength"], 1, "{schema}");
    assert_eq!(schema["uuid"]["maxLength"], 200, "{schema}");
    assert_eq!(schema["uuids"]["items"]["maxLength"], 200, "{schema}");
    app.finish().await;
}

async fn bad_context_options_are_400(app: TestApp) {
    let thread = app.thread("opts").await;
    let base = format!("/v1/threads/{thread}/context");
    app.get(&format!("{base}?provider=cohere"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{base}?thinking=maybe"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{base}?tools=Bash,bad%20name"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    app.get(&format!("{base}?cache=sometimes"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    let empty = app
        .get(&format!(
            "{base}?provider=openai&thinking=strip&cache=true&tools=Bash"
        ))
        .await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.body["messages"], json!([]));
    app.get("/v1/threads/nope/context")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.get("/v1/threads/nope/rounds")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

#[tokio::test]
async fn the_stateless_normalizer_merges_split_fragments() {
    let app = TestApp::new(crate::common::Backend::Sqlite).await;
    let history = json!([
        user("u0", "Run both."),
        {"type": "assistant", "message": {"role": "assistant", "id": "X", "content": [{"type": "tool_use", "id": "tu_A", "name": "Bash", "input": {"command": "a"}}]}},
        tool_result("r1", "tu_A", "done A"),
        {"type": "assistant", "message": {"role": "assistant", "id": "X", "content": [{"type": "tool_use", "id": "tu_B", "name": "Bash", "input": {"command": "b"}}]}},
        tool_result("r2", "tu_B", "done B"),
    ]);
    let response = app
        .post("/v1/normalize", json!({"messages": history, "cache": true}))
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.body);
    let messages = response.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{}", response.body);
    let uses: Vec<&str> = messages[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(uses, ["tu_A", "tu_B"]);
    let results: Vec<&str> = messages[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["tu_A", "tu_B"]);
    assert_eq!(
        messages[2]["content"][1]["cache_control"]["type"],
        "ephemeral"
    );
    let merged = response.body["repairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "fragments_merged")
        .unwrap();
    assert_eq!(merged["seqs"], json!([1, 3]));
    assert!(anthropic::validate(messages, &AnthropicRules::default()).is_empty());

    app.post("/v1/normalize", json!({"messages": [{"type": "user"}]}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(
        "/v1/normalize",
        json!({"messages": [], "provider": "cohere"}),
    )
    .await
    .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.post(
        "/v1/normalize",
        json!({"messages": [], "tools": ["ok", "not ok"]}),
    )
    .await
    .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.finish().await;
}

/// Round `i`: a tool call and its result of 400 bytes (100 estimated tokens), then an answer.
fn cleared_round(i: usize) -> Vec<Value> {
    vec![
        tool_use(&format!("c{i}"), &format!("msg_{i}"), &format!("toolu_{i}")),
        tool_result(
            &format!("r{i}"),
            &format!("toolu_{i}"),
            &format!("{i:>3} sunny ").repeat(40),
        ),
        assistant(&format!("a{i}"), &format!("msg_a{i}"), "Noted."),
    ]
}

/// The stubs of a context's messages, as (tool_use_id, zoom seq).
fn stubs_of(context: &Value) -> Vec<(String, i64)> {
    context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .filter_map(|b| {
            let stub = b["content"]
                .as_str()?
                .strip_prefix("[Old tool result cleared: ")?;
            let seq = stub
                .split_once("zoom ")?
                .1
                .split_once("+1")?
                .0
                .parse()
                .ok()?;
            Some((b["tool_use_id"].as_str()?.to_owned(), seq))
        })
        .collect()
}

async fn old_tool_results_are_cleared_in_batches_and_one_zoom_reads_them(app: TestApp) {
    let thread = app.thread("cleared").await;
    app.append(
        &thread,
        json!([user("q", "What is the weather, day by day?")]),
    )
    .await;
    let settings = app
        .request(
            axum::http::Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(
                json!({"clearing": {"enabled": true, "keep_tokens": 100, "batch_tokens": 250,
                "min_bytes": 200}}),
            ),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let mut previous: Option<Value> = None;
    let mut batches = 0;
    for i in 0..12 {
        app.append(&thread, json!(cleared_round(i))).await;
        let context = app.get(&format!("/v1/threads/{thread}/context")).await.body;
        // Offered from the first request on, so the tools never change.
        assert_eq!(context["tools"][0]["name"], "zoom", "{context}");
        let stubs = stubs_of(&context);
        // 100 tokens a result: whole results pass 350 at the fourth, then every third.
        let expected = match i {
            0..=2 => 0,
            3..=5 => 3,
            6..=8 => 6,
            _ => 9,
        };
        assert_eq!(stubs.len(), expected, "round {i}: {stubs:?}");
        let messages = context["messages"].as_array().unwrap();
        if let Some(previous) = &previous {
            let before = previous["messages"].as_array().unwrap();
            let kept = before.len() - 1;
            if stubs_of(previous).len() == stubs.len() {
                // Between batches the request only grows at its end.
                assert_eq!(before[..kept], messages[..kept], "round {i}");
            } else {
                batches += 1;
            }
        }
        previous = Some(context.clone());
    }
    assert_eq!(batches, 3);
    // Each stub opens, in one zoom, to the result whole.
    let context = previous.unwrap();
    for (tool_use_id, seq) in stubs_of(&context) {
        let zoomed = app
            .post(
                &format!("/v1/threads/{thread}/zoom"),
                json!({"id": seq, "n": 1}),
            )
            .await;
        assert_eq!(zoomed.body["is_error"], false, "{}", zoomed.body);
        let i: usize = tool_use_id.trim_start_matches("toolu_").parse().unwrap();
        let whole = format!("{i:>3} sunny ").repeat(40);
        assert!(
            zoomed.body["content"]
                .as_str()
                .unwrap()
                .contains(whole.trim()),
            "{}",
            zoomed.body
        );
        assert!(context["repairs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| { r["kind"] == "tool_result_cleared" && r["seqs"] == json!([seq]) }));
    }
    // Every provider accepts it.
    for provider in ["anthropic", "openai"] {
        let context = app
            .get(&format!("/v1/threads/{thread}/context?provider={provider}"))
            .await
            .body;
        let messages = context["messages"].as_array().unwrap();
        let violations = if provider == "openai" {
            openai::validate(messages)
        } else {
            anthropic::validate(messages, &AnthropicRules::default())
        };
        assert!(violations.is_empty(), "{provider}: {violations:?}");
    }
    // The outlined view clears its recent messages the same way, and offers zoom once.
    let settings = app
        .request(
            axum::http::Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"outline": {"enabled": true},
                "clearing": {"enabled": true, "keep_tokens": 100, "batch_tokens": 250,
                "min_bytes": 200}})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let outlined = app
        .get(&format!("/v1/threads/{thread}/context?view=outline"))
        .await
        .body;
    assert_eq!(stubs_of(&outlined), stubs_of(&context));
    // Zoom and search, once, however the thread is read.
    assert_eq!(outlined["tools"].as_array().unwrap().len(), 2, "{outlined}");
    app.finish().await;
}

/// `/v1/normalize` clears as a thread's context does: the same stubs, at the same results, their
/// addresses the results' indices in `messages`, and the zoom tool offered with them.
async fn the_stateless_normalizer_clears_with_the_same_stubs(app: TestApp) {
    let thread = app.thread("stateless-cleared").await;
    let clearing = json!({"enabled": true, "keep_tokens": 100, "batch_tokens": 250,
        "min_bytes": 200});
    let mut history = vec![user("q", "What is the weather, day by day?")];
    for i in 0..9 {
        history.extend(cleared_round(i));
    }
    app.append(&thread, Value::Array(history.clone())).await;
    let settings = app
        .request(
            axum::http::Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"clearing": clearing})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let stored = app.get(&format!("/v1/threads/{thread}/context")).await.body;
    let sent = app
        .post(
            "/v1/normalize",
            json!({"messages": history, "clearing": clearing}),
        )
        .await;
    assert_eq!(sent.status, StatusCode::OK, "{}", sent.body);
    // The thread's seqs are the indices of the same entries: the two answers are one.
    assert_eq!(stubs_of(&sent.body).len(), 6);
    assert_eq!(stubs_of(&sent.body), stubs_of(&stored));
    assert_eq!(sent.body["messages"], stored["messages"]);
    assert_eq!(sent.body["tools"], json!([stored["tools"][0]]));
    for (tool_use_id, index) in stubs_of(&sent.body) {
        let entry = &history[index as usize];
        assert_eq!(
            entry["message"]["content"][0]["tool_use_id"], tool_use_id,
            "the stub names the result's index"
        );
    }
    // Off, or left out, nothing is cleared and no tool is offered.
    let plain = app
        .post("/v1/normalize", json!({"messages": history}))
        .await
        .body;
    assert!(stubs_of(&plain).is_empty());
    assert_eq!(plain["tools"], json!([]));
    app.post(
        "/v1/normalize",
        json!({"messages": [], "clearing": {"enabled": true, "keep_tokens": -1}}),
    )
    .await
    .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
    app.finish().await;
}

async fn clearing_settings_are_bounded_and_default_when_unset(app: TestApp) {
    let thread = app.thread("bounded").await;
    let uri = format!("/v1/threads/{thread}/settings");
    let unset = app.get(&uri).await.body;
    assert_eq!(unset["clearing"], Value::Null);
    assert_eq!(
        unset["effective"]["clearing"],
        json!({"enabled": false, "keep_tokens": 2000, "batch_tokens": 10000, "min_bytes": 1000})
    );
    for (field, value) in [
        ("keep_tokens", json!(10_000_001)),
        ("batch_tokens", json!(10_000_001)),
        ("min_bytes", json!(1_000_000_001u64)),
    ] {
        let refused = app
            .request(
                axum::http::Method::PUT,
                &uri,
                Some(json!({"clearing": {"enabled": true, field: value}})),
            )
            .await;
        refused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");
        assert_eq!(
            refused.body["errors"][0]["field"],
            format!("clearing.{field}")
        );
    }
    let context = app.get(&format!("/v1/threads/{thread}/context")).await.body;
    assert_eq!(context["tools"], json!([]), "no zoom while clearing is off");
    app.finish().await;
}
