//! Smoke property tests: messy histories → deterministic, idempotent, provider-valid output.

use std::collections::HashSet;

use loupe::history::{
    entries_from_messages, normalize, Entry, MicrocompactOptions, NormalizeOptions, Provider,
    ThinkingMode,
};
use proptest::prelude::*;
use serde_json::{json, Value};

const IDS: &[&str] = &[
    "toolu_A",
    "toolu_B",
    "C",
    "functions.Bash:0",
    "",
    "call_with_a_very_long_identifier_that_exceeds_forty",
];
const MSG_IDS: &[Option<&str>] = &[Some("m1"), Some("m2"), Some("m3"), None];

fn arb_asst_block() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"type": "text", "text": "answer"})),
        Just(json!({"type": "text", "text": " \n"})),
        Just(json!({"type": "text", "text": ""})),
        Just(json!({"type": "thinking", "thinking": "hmm", "signature": "sig"})),
        Just(json!({"type": "thinking", "thinking": "unsigned"})),
        Just(json!({"type": "redacted_thinking", "data": "xyz"})),
        (0..IDS.len()).prop_map(
            |i| json!({"type": "tool_use", "id": IDS[i], "name": "Bash", "input": {"c": i}})
        ),
        (0..IDS.len()).prop_map(
            |i| json!({"type": "tool_use", "id": IDS[i], "name": "Read", "input": "{\"p\":"})
        ),
        Just(
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}})
        ),
        Just(json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []})),
        Just(
            json!({"type": "server_tool_use", "id": "srvtoolu_2", "name": "advisor", "input": {}})
        ),
        Just(json!({"type": "advisor_tool_result", "tool_use_id": "srvtoolu_2", "content": {}})),
        Just(json!({"type": "tool_result", "tool_use_id": "toolu_A", "content": "misplaced"})),
        Just(json!({"type": "mystery_block", "payload": 1})),
    ]
}

fn arb_user_block() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"type": "text", "text": "prompt"})),
        Just(json!({"type": "text", "text": "  "})),
        (0..IDS.len()).prop_map(|i| json!({"type": "tool_result", "tool_use_id": IDS[i], "content": "out"})),
        (0..IDS.len()).prop_map(|i| json!({"type": "tool_result", "tool_use_id": IDS[i], "is_error": true, "content": []})),
        Just(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}})),
        Just(json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}})),
        Just(json!({"type": "tool_result", "tool_use_id": "toolu_B", "content": [{"type": "tool_reference", "tool_name": "Gone"}]})),
        Just(json!({"type": "tool_use", "id": "toolu_X", "name": "Bash", "input": {}})),
        Just(json!(17)),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    User(Vec<Value>, bool),
    UserText(&'static str),
    Asst(usize, Vec<Value>),
    Attachment(Vec<Value>),
    Boundary(bool),
    Summary,
    LocalCommand,
    Info,
    Progress,
    Snip(usize),
    ApiError(usize),
    Virtual,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::collection::vec(arb_user_block(), 0..4), any::<bool>()).prop_map(|(b, m)| Op::User(b, m)),
        2 => prop::sample::select(vec!["hello", "", "   ", "go on"]).prop_map(Op::UserText),
        6 => (0..MSG_IDS.len(), prop::collection::vec(arb_asst_block(), 0..4)).prop_map(|(i, b)| Op::Asst(i, b)),
        1 => prop::collection::vec(arb_user_block(), 1..3).prop_map(Op::Attachment),
        1 => any::<bool>().prop_map(Op::Boundary),
        1 => Just(Op::Summary),
        1 => Just(Op::LocalCommand),
        1 => Just(Op::Info),
        1 => Just(Op::Progress),
        1 => (0..40usize).prop_map(Op::Snip),
        1 => (0..3usize).prop_map(Op::ApiError),
        1 => Just(Op::Virtual),
    ]
}

fn build(ops: &[Op]) -> Vec<Entry> {
    let errors = [
        "PDF too large (max 100 pages, 20MB). Try reading the file a different way (e.g., extract text with pdftotext).",
        "Image was too large. Double press esc to go back and try again with a smaller image.",
        "Prompt is too long",
    ];
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let base = json!({"seq": i, "uuid": format!("u{i}")});
        let mut v = base.as_object().unwrap().clone();
        let mut set = |k: &str, val: Value| {
            v.insert(k.to_string(), val);
        };
        match op {
            Op::User(blocks, meta) => {
                set("type", json!("user"));
                set("is_meta", json!(meta));
                set("message", json!({"role": "user", "content": blocks}));
            }
            Op::UserText(t) => {
                set("type", json!("user"));
                set("message", json!({"role": "user", "content": t}));
            }
            Op::Asst(id, blocks) => {
                set("type", json!("assistant"));
                let mut m = json!({"role": "assistant", "content": blocks});
                if let Some(id) = MSG_IDS[*id] {
                    m["id"] = json!(id);
                }
                set("message", m);
            }
            Op::Attachment(blocks) => {
                set("type", json!("attachment"));
                set("message", json!({"role": "user", "content": blocks}));
            }
            Op::Boundary(preserve) => {
                set("type", json!("system"));
                set("subtype", json!("compact_boundary"));
                set("content", json!("Conversation compacted"));
                if *preserve && i >= 3 {
                    set(
                        "compact_metadata",
                        json!({"preserved_segment": {"first_seq": i - 3, "last_seq": i - 1}}),
                    );
                }
            }
            Op::Summary => {
                set("type", json!("user"));
                set("is_compact_summary", json!(true));
                set(
                    "message",
                    json!({"role": "user", "content": "Summary: stuff"}),
                );
            }
            Op::LocalCommand => {
                set("type", json!("system"));
                set("subtype", json!("local_command"));
                set(
                    "content",
                    json!("<local-command-stdout>ok</local-command-stdout>"),
                );
            }
            Op::Info => {
                set("type", json!("system"));
                set("subtype", json!("informational"));
                set("content", json!("info"));
            }
            Op::Progress => {
                set("type", json!("progress"));
                set("data", json!({}));
            }
            Op::Snip(k) => {
                set("type", json!("system"));
                set("subtype", json!("snip"));
                set("snip_metadata", json!({"removed_uuids": [format!("u{k}")]}));
            }
            Op::ApiError(k) => {
                set("type", json!("assistant"));
                set("is_api_error", json!(true));
                set(
                    "message",
                    json!({"role": "assistant", "id": format!("err{i}"), "model": "<synthetic>",
                    "content": [{"type": "text", "text": errors[*k]}]}),
                );
            }
            Op::Virtual => {
                set("type", json!("user"));
                set("is_virtual", json!(true));
                set("message", json!({"role": "user", "content": "virtual"}));
            }
        }
        out.push(serde_json::from_value(Value::Object(v)).unwrap());
    }
    out
}

fn arb_opts() -> impl Strategy<Value = NormalizeOptions> {
    (
        0..4usize,
        0..3usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(p, thinking, cache, advisor, tools, mc)| NormalizeOptions {
                provider: [
                    Provider::Anthropic,
                    Provider::Openai,
                    Provider::OpenaiResponses,
                    Provider::Gemini,
                ][p],
                tools: tools.then(|| vec!["Bash".to_string()]),
                thinking: [
                    ThinkingMode::Keep,
                    ThinkingMode::Strip,
                    ThinkingMode::Enabled,
                ][thinking],
                model: None,
                cache,
                advisor,
                microcompact: mc.then(|| MicrocompactOptions {
                    keep_recent: 1,
                    min_bytes: 1,
                    ..Default::default()
                }),
                // Clearing after micro-compaction, where both are on (its own test is
                // normalize_invariants).
                clearing: mc.then_some(loupe::history::normalize::ClearingOptions {
                    keep_tokens: 0,
                    batch_tokens: 0,
                    min_bytes: 1,
                }),
            },
        )
}

fn ty(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// `docs/PROVIDER-RULES.md` D1 (the parts a history can break), assuming the caller appends a user turn
/// (merged into a trailing user turn).
fn check_anthropic(msgs: &[Value]) -> Result<(), String> {
    let mut all_uses = HashSet::new();
    let mut markers = 0;
    for (i, m) in msgs.iter().enumerate() {
        let role = m["role"].as_str().ok_or("role")?;
        if i == 0 && role != "user" {
            return Err("first not user".into());
        }
        if i > 0 && msgs[i - 1]["role"] == m["role"] {
            return Err(format!("no alternation at {i}"));
        }
        let content = m["content"].as_array().ok_or("content not array")?;
        if content.is_empty() {
            return Err(format!("empty content at {i}"));
        }
        for b in content {
            if ty(b).is_empty() {
                return Err("block without type".into());
            }
            if ty(b) == "text" && b["text"].as_str().is_none_or(|t| t.trim().is_empty()) {
                return Err(format!("blank text at {i}"));
            }
            if b.get("cache_control").is_some() {
                markers += 1;
            }
        }
        if role == "assistant" {
            if matches!(
                ty(content.last().unwrap()),
                "thinking" | "redacted_thinking"
            ) {
                return Err(format!("thinking last at {i}"));
            }
            let mut uses = Vec::new();
            let mut srv = HashSet::new();
            for b in content {
                match ty(b) {
                    "tool_use" => {
                        let id = b["id"].as_str().ok_or("tool_use id")?;
                        if !valid_id(id)
                            || !all_uses.insert(id.to_string())
                            || !b["input"].is_object()
                        {
                            return Err(format!("bad tool_use {b}"));
                        }
                        uses.push(id.to_string());
                    }
                    "thinking" if b["signature"].as_str().is_none_or(str::is_empty) => {
                        return Err("unsigned".into())
                    }
                    "server_tool_use" => {
                        let id = b["id"].as_str().unwrap_or("");
                        if !id.starts_with("srvtoolu_") {
                            return Err("server id".into());
                        }
                        if !content
                            .iter()
                            .any(|r| ty(r) != "tool_result" && r["tool_use_id"] == b["id"])
                            && !deferred(msgs, i, id)
                        {
                            return Err("server use without result".into());
                        }
                        srv.insert(id.to_string());
                    }
                    "tool_result" | "image" | "document" => {
                        return Err(format!("user block in assistant at {i}"))
                    }
                    _ => {
                        if let Some(id) = b.get("tool_use_id").and_then(Value::as_str) {
                            let deferred_result = deferred_answer(msgs, i, id);
                            if !srv.contains(id) && !deferred_result {
                                return Err("orphan server result".into());
                            }
                        }
                    }
                }
            }
            if !uses.is_empty() {
                let next = msgs.get(i + 1).ok_or("tool_use without next turn")?;
                let nc = next["content"].as_array().ok_or("next content")?;
                let firsts: Vec<String> = nc
                    .iter()
                    .take_while(|b| ty(b) == "tool_result")
                    .map(|b| b["tool_use_id"].as_str().unwrap_or("").to_string())
                    .collect();
                let a: HashSet<_> = uses.iter().cloned().collect();
                let f: HashSet<_> = firsts.iter().cloned().collect();
                if firsts.len() != uses.len() || a != f {
                    return Err(format!("pairing broken after {i}"));
                }
            }
        } else {
            let prev_uses: HashSet<String> = if i > 0 {
                msgs[i - 1]["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|b| ty(b) == "tool_use")
                    .map(|b| b["id"].as_str().unwrap().to_string())
                    .collect()
            } else {
                HashSet::new()
            };
            let mut seen = HashSet::new();
            let mut after_other = false;
            for b in content {
                if ty(b) == "tool_result" {
                    let id = b["tool_use_id"].as_str().unwrap_or("").to_string();
                    if after_other || !prev_uses.contains(&id) || !seen.insert(id) {
                        return Err(format!("bad tool_result at {i}"));
                    }
                    if b["is_error"] == json!(true)
                        && b["content"].as_array().is_some_and(Vec::is_empty)
                    {
                        return Err("empty error result".into());
                    }
                } else {
                    after_other = true;
                    if matches!(
                        ty(b),
                        "tool_use" | "thinking" | "redacted_thinking" | "server_tool_use"
                    ) {
                        return Err("assistant block in user".into());
                    }
                }
            }
        }
    }
    if markers > 1 {
        return Err("more than one cache marker".into());
    }
    Ok(())
}

/// `docs/PROVIDER-RULES.md` D2.
fn check_openai(msgs: &[Value]) -> Result<(), String> {
    let mut ids = HashSet::new();
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        match m["role"].as_str() {
            Some("user") => {
                if m["content"].is_null() {
                    return Err("null user content".into());
                }
            }
            Some("tool") => return Err(format!("orphan tool message at {i}")),
            Some("assistant") => {
                let calls = m.get("tool_calls");
                if m["content"].is_null() && calls.is_none() {
                    return Err("null assistant content without calls".into());
                }
                if let Some(calls) = calls {
                    let calls = calls.as_array().ok_or("tool_calls not array")?;
                    if calls.is_empty() {
                        return Err("empty tool_calls".into());
                    }
                    let mut want = HashSet::new();
                    for c in calls {
                        let id = c["id"].as_str().ok_or("call id")?;
                        if !valid_id(id) || id.len() > 40 || !ids.insert(id.to_string()) {
                            return Err(format!("bad call id {id}"));
                        }
                        let name = c["function"]["name"].as_str().ok_or("name")?;
                        if !valid_id(name)
                            || !c["function"]["arguments"].is_string()
                            || c["type"] != "function"
                        {
                            return Err("bad function".into());
                        }
                        want.insert(id.to_string());
                    }
                    let mut got = HashSet::new();
                    for k in 0..calls.len() {
                        let t = msgs.get(i + 1 + k).ok_or("missing tool message")?;
                        if t["role"] != "tool" || !t["content"].is_string() {
                            return Err(format!("expected tool message after {i}"));
                        }
                        got.insert(t["tool_call_id"].as_str().unwrap_or("").to_string());
                    }
                    if got != want {
                        return Err(format!("tool ids mismatch after {i}"));
                    }
                    i += calls.len();
                }
            }
            _ => return Err("bad role".into()),
        }
        i += 1;
    }
    Ok(())
}

proptest! {
    // 400 cases by default; `PROPTEST_CASES=N` overrides.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400),
        ..ProptestConfig::default()
    })]

    #[test]
    fn messy_histories_normalize_validly(ops in prop::collection::vec(arb_op(), 0..30), opts in arb_opts()) {
        let entries = build(&ops);
        let a = normalize(&entries, &opts);
        let b = normalize(&entries, &opts);
        prop_assert_eq!(&a.messages, &b.messages);
        prop_assert_eq!(&a.repairs, &b.repairs);
        let check = match opts.provider {
            Provider::Anthropic => check_anthropic(&a.messages),
            Provider::Openai => check_openai(&a.messages),
            Provider::OpenaiResponses => {
                let v = loupe_validate::responses::validate(&a.messages);
                if v.is_empty() { Ok(()) } else { Err(format!("{v:?}")) }
            }
            Provider::Gemini => {
                let v = loupe_validate::gemini::validate(&a.messages);
                if v.is_empty() { Ok(()) } else { Err(format!("{v:?}")) }
            }
        };
        prop_assert!(check.is_ok(), "{:?}\n{}", check, serde_json::to_string_pretty(&a.messages).unwrap());
        if entries.iter().all(|e| e.kind == loupe::history::EntryKind::Progress) {
            prop_assert!(a.messages.is_empty());
        }
        let again = normalize(&entries_from_messages(&a.messages, opts.provider), &opts);
        prop_assert_eq!(&again.messages, &a.messages);
    }
}

#[test]
fn empty_history_gives_empty_messages() {
    for provider in [
        Provider::Anthropic,
        Provider::Openai,
        Provider::OpenaiResponses,
        Provider::Gemini,
    ] {
        let n = normalize(
            &[],
            &NormalizeOptions {
                provider,
                ..Default::default()
            },
        );
        assert!(n.messages.is_empty() && n.repairs.is_empty());
        assert_eq!(n.estimated_tokens, 0);
    }
}

/// D1.10: the server call `id` of assistant turn `i` is answered in a later assistant turn,
/// each turn between a user turn of tool results only or an assistant turn whose client calls
/// `id` made (programmatic tool calling).
fn deferred(msgs: &[Value], i: usize, id: &str) -> bool {
    let only_results = |m: &Value| {
        m["role"] == "user"
            && m["content"]
                .as_array()
                .is_some_and(|c| c.iter().all(|b| b["type"] == "tool_result"))
    };
    let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
    let called = blocks(&msgs[i])
        .iter()
        .any(|b| b["type"] == "server_tool_use" && b["id"] == id);
    let mut at = i;
    while called && msgs.get(at + 1).is_some_and(only_results) {
        let Some(later) = msgs.get(at + 2) else {
            return false;
        };
        let later = blocks(later);
        if later
            .iter()
            .any(|b| b["type"] != "tool_result" && b["tool_use_id"] == id)
        {
            return true;
        }
        let calls: Vec<&Value> = later.iter().filter(|b| b["type"] == "tool_use").collect();
        if calls.is_empty() || calls.iter().any(|b| b["caller"]["tool_id"] != id) {
            return false;
        }
        at += 2;
    }
    false
}

/// Whether the server call `id` answered in turn `i` was made by an earlier turn and deferred.
fn deferred_answer(msgs: &[Value], i: usize, id: &str) -> bool {
    (0..i).any(|start| msgs[start]["role"] == "assistant" && deferred(msgs, start, id))
}
