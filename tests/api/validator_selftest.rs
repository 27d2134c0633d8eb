//! Self-tests of the validator and the chaos generator: the generator really produces chaos (a
//! naive conversion breaks the validator in most cases, and every kind of chaos shows up), clean
//! histories pass, and the validator catches the providers' documented error examples.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::chaos::{self, naive_messages, text_inventory};
use loupe::history::{Content, Entry, EntryKind};
use loupe_validate::{anthropic, gemini, openai, responses, AnthropicRules, Violation};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

fn thinking_on() -> AnthropicRules {
    AnthropicRules {
        thinking_enabled: true,
        allow_empty: false,
        ..AnthropicRules::default()
    }
}

/// `n` histories from a fixed seed (reproducible counts).
fn sample<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("tree").current())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Generator

fn check_invariants(entries: &[Entry]) -> Result<(), TestCaseError> {
    let mut uuids = HashSet::new();
    let mut position: HashMap<&str, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        prop_assert_eq!(e.seq, Some(i as i64));
        let u = e.uuid.as_deref().expect("uuid");
        prop_assert!(uuids.insert(u), "duplicate uuid {}", u);
        position.insert(u, i);
        prop_assert_eq!(
            e.message.is_some(),
            e.kind != EntryKind::System && e.kind != EntryKind::Progress
        );
    }
    for (i, e) in entries.iter().enumerate() {
        if let Some((a, b)) = chaos::preserved_segment(e) {
            prop_assert!(e.is_compact_boundary());
            prop_assert!(a <= b && b < i as i64, "segment {}..{} at {}", a, b, i);
        }
        if let Some(m) = &e.snip_metadata {
            for u in &m.removed_uuids {
                prop_assert!(position.get(u.as_str()).is_some_and(|&p| p < i));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Realistic histories without chaos are valid as they are: the validator accepts good lists.
    #[test]
    fn clean_histories_pass(entries in chaos::clean_history()) {
        check_invariants(&entries)?;
        let msgs = naive_messages(&entries);
        let v = anthropic::validate(&msgs, &thinking_on());
        prop_assert!(v.is_empty(), "{:#?}\n{}", v, serde_json::to_string_pretty(&msgs).unwrap());
        // Every text of a clean history is in context.
        let texts: usize = entries.iter().map(|e| chaos::entry_texts(e).len()).sum();
        prop_assert_eq!(text_inventory(&entries).len(), texts);
    }

    #[test]
    fn chaotic_histories_are_well_formed(entries in chaos::chaotic_history()) {
        check_invariants(&entries)?;
        // Every stored entry round-trips through JSON.
        let json = serde_json::to_value(&entries).unwrap();
        let back: Vec<Entry> = serde_json::from_value(json).unwrap();
        prop_assert_eq!(back, entries);
    }
}

/// Over 500 chaotic histories, the naive `{role, content}` conversion breaks the Anthropic rules in
/// most cases, and across them every major rule fires: the validator can fail, on each rule.
#[test]
fn naive_conversion_of_chaos_mostly_violates() {
    let histories = sample(chaos::chaotic_history(), 500);
    let mut violating = 0;
    let mut fired: BTreeMap<&'static str, usize> = BTreeMap::new();
    for entries in &histories {
        let v = anthropic::validate(&naive_messages(entries), &AnthropicRules::default());
        if !v.is_empty() {
            violating += 1;
        }
        for r in v.iter().map(|v| v.rule).collect::<HashSet<_>>() {
            *fired.entry(r).or_default() += 1;
        }
    }
    eprintln!("violating: {violating}/500; rules fired (cases): {fired:?}");
    assert!(
        violating >= 450,
        "only {violating}/500 chaotic histories violate"
    );
    for rule in [
        "D1.3", "D1.4", "D1.5", "D1.7", "D1.8", "D1.9", "D1.10", "D1.11", "D1.13", "D1.16", "A2.5",
    ] {
        assert!(
            fired.get(rule).copied().unwrap_or(0) > 0,
            "{rule} never fired: {fired:?}"
        );
    }
}

fn blocks(e: &Entry) -> &[Value] {
    match e.message.as_ref().map(|m| &m.content) {
        Some(Content::Blocks(b)) => b,
        _ => &[],
    }
}

fn all_blocks(entries: &[Entry]) -> impl Iterator<Item = (&Entry, &Value)> {
    entries
        .iter()
        .flat_map(|e| blocks(e).iter().map(move |b| (e, b)))
}

fn count_media(entries: &[Entry]) -> usize {
    all_blocks(entries)
        .map(|(_, b)| {
            let nested = b["content"].as_array().map_or(0, |items| {
                items
                    .iter()
                    .filter(|i| i["type"] == "image" || i["type"] == "document")
                    .count()
            });
            nested + usize::from(b["type"] == "image" || b["type"] == "document")
        })
        .sum()
}

/// Which kinds of chaos a history shows.
fn features(entries: &[Entry]) -> Vec<&'static str> {
    let mut f = Vec::new();
    let mut add = |on: bool, name: &'static str| {
        if on {
            f.push(name)
        }
    };
    let asst: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Assistant)
        .collect();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for e in &asst {
        if let Some(id) = e.response_id() {
            *ids.entry(id).or_default() += 1;
        }
    }
    add(ids.values().any(|&n| n > 1), "split fragments");
    add(
        entries.windows(3).any(|w| {
            w[0].kind == EntryKind::Assistant
                && w[2].kind == EntryKind::Assistant
                && w[0].response_id() == w[2].response_id()
                && blocks(&w[1]).iter().any(|b| b["type"] == "tool_result")
        }),
        "interleaved results",
    );
    let uses: Vec<&str> = all_blocks(entries)
        .filter(|(_, b)| b["type"] == "tool_use")
        .filter_map(|(_, b)| b["id"].as_str())
        .collect();
    let results: Vec<&str> = all_blocks(entries)
        .filter(|(_, b)| b["type"] == "tool_result")
        .filter_map(|(_, b)| b["tool_use_id"].as_str())
        .collect();
    add(uses.iter().any(|u| !results.contains(u)), "missing result");
    add(results.iter().any(|r| !uses.contains(r)), "orphan result");
    add(
        results.len() > results.iter().collect::<HashSet<_>>().len(),
        "duplicate result",
    );
    add(
        uses.len() > uses.iter().collect::<HashSet<_>>().len(),
        "duplicate tool_use id",
    );
    add(uses.iter().any(|u| !loupe_id(u)), "bad tool id");
    add(
        uses.iter().any(|u| u.len() > 40 && loupe_id(u)),
        "valid id over 40 chars",
    );
    add(
        all_blocks(entries).any(|(_, b)| b["type"] == "tool_use" && !b["input"].is_object()),
        "non-object input",
    );
    for (name, blank) in [("empty", true), ("whitespace-only", false)] {
        let is = |s: &str| {
            if blank {
                s.is_empty()
            } else {
                !s.is_empty() && s.trim().is_empty()
            }
        };
        add(
            entries.iter().any(|e| matches!(e.message.as_ref().map(|m| &m.content), Some(Content::Text(s)) if is(s))),
            if blank { "empty string content" } else { "whitespace-only string content" },
        );
        add(
            all_blocks(entries)
                .any(|(_, b)| b["type"] == "text" && b["text"].as_str().is_some_and(is)),
            if name == "empty" {
                "empty text block"
            } else {
                "whitespace-only text block"
            },
        );
    }
    add(
        asst.iter().any(|e| {
            !blocks(e).is_empty()
                && blocks(e)
                    .iter()
                    .all(|b| b["type"] == "thinking" || b["type"] == "redacted_thinking")
        }),
        "thinking-only fragment",
    );
    add(
        all_blocks(entries).any(|(_, b)| {
            b["type"] == "thinking" && b["signature"].as_str().is_none_or(str::is_empty)
        }),
        "unsigned thinking",
    );
    add(
        entries
            .last()
            .is_some_and(|e| blocks(e).last().is_some_and(|b| b["type"] == "thinking")),
        "trailing thinking",
    );
    add(entries.iter().any(|e| e.is_virtual), "virtual");
    add(
        entries
            .iter()
            .any(|e| e.is_meta && e.kind == EntryKind::User),
        "meta",
    );
    add(
        entries.iter().any(|e| e.kind == EntryKind::Attachment),
        "attachment",
    );
    let sub = |s: &str| entries.iter().any(|e| e.subtype.as_deref() == Some(s));
    add(sub("informational"), "informational");
    add(sub("local_command"), "local_command");
    add(sub("compact_boundary"), "compact_boundary");
    add(
        entries
            .iter()
            .any(|e| chaos::preserved_segment(e).is_some()),
        "preserved segment",
    );
    add(sub("snip"), "snip");
    add(
        entries.iter().any(|e| e.kind == EntryKind::Progress),
        "progress",
    );
    add(entries.iter().any(|e| e.is_api_error), "api error");
    add(
        entries.windows(2).any(|w| {
            w[0].is_meta
                && w[1].is_api_error
                && blocks(&w[0])
                    .iter()
                    .any(|b| b["type"] == "document" || b["type"] == "image")
        }),
        "api error after meta media",
    );
    add(
        all_blocks(entries).any(|(_, b)| {
            b["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|i| i["type"] == "tool_reference"))
        }),
        "tool_reference",
    );
    let srv = |name: &str, answered: bool| {
        all_blocks(entries).any(|(e, b)| {
            b["type"] == "server_tool_use"
                && b["name"] == name
                && blocks(e).iter().any(|r| r["tool_use_id"] == b["id"]) == answered
        })
    };
    add(srv("advisor", true), "advisor answered");
    add(srv("advisor", false), "advisor unanswered");
    add(srv("web_search", true), "web_search answered");
    add(srv("web_search", false), "web_search unanswered");
    add(
        entries
            .iter()
            .find(|e| e.message.is_some())
            .is_some_and(|e| e.kind == EntryKind::Assistant),
        "assistant first",
    );
    add(count_media(entries) > 100, "over 100 media");
    add(
        all_blocks(entries).any(|(_, b)| b["type"] == "future_block"),
        "unknown block type",
    );
    add(
        entries.iter().any(|e| {
            e.kind == EntryKind::User
                && matches!(
                    e.message.as_ref().map(|m| &m.content),
                    Some(Content::Text(_))
                )
        }),
        "string content",
    );
    add(
        asst.iter().any(|e| {
            e.message.as_ref().and_then(|m| m.model.as_deref()) == Some("<synthetic>")
                && !e.is_api_error
        }),
        "kept synthetic assistant",
    );
    f
}

fn loupe_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every kind of chaos the generator promises shows up in 500 cases.
#[test]
fn chaos_covers_every_kind() {
    let histories = sample(chaos::chaotic_history(), 500);
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    for h in &histories {
        for f in features(h) {
            *seen.entry(f).or_default() += 1;
        }
    }
    eprintln!("{seen:#?}");
    let expected = [
        "split fragments",
        "interleaved results",
        "missing result",
        "orphan result",
        "duplicate result",
        "duplicate tool_use id",
        "bad tool id",
        "valid id over 40 chars",
        "non-object input",
        "empty string content",
        "whitespace-only string content",
        "empty text block",
        "whitespace-only text block",
        "thinking-only fragment",
        "unsigned thinking",
        "trailing thinking",
        "virtual",
        "meta",
        "attachment",
        "informational",
        "local_command",
        "compact_boundary",
        "preserved segment",
        "snip",
        "progress",
        "api error",
        "api error after meta media",
        "tool_reference",
        "advisor answered",
        "advisor unanswered",
        "web_search answered",
        "web_search unanswered",
        "assistant first",
        "over 100 media",
        "unknown block type",
        "string content",
        "kept synthetic assistant",
    ];
    for f in expected {
        assert!(
            seen.get(f).copied().unwrap_or(0) >= 3,
            "{f} appears in fewer than 3 of 500 cases: {seen:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// text_inventory

#[test]
fn text_inventory_follows_boundary_snip_virtual_and_errors() {
    // A clean one-turn history, extended by hand.
    let mut e = chaos::build(
        &[chaos::LoopSpec {
            prompt_as_string: true,
            prompt_image: false,
            steps: vec![chaos::StepSpec {
                thinking: false,
                redacted: false,
                text: true,
                server: None,
                tools: vec![],
                split: false,
                interleave: false,
                model: 0,
                reasoning: false,
                signed: false,
            }],
        }],
        &[],
    );
    // [0 user "[u1] …", 1 assistant "[a3] …"]
    assert_eq!(text_inventory(&e).len(), 2);
    let mut extra = e.clone();
    // 2 virtual user, 3 api error assistant, 4 boundary (preserving seq 0..0), 5 summary,
    // 6 snip removing the summary, 7 user "   ", 8 user tail.
    let mk = |kind: EntryKind, text: &str| {
        let mut x = e[0].clone();
        x.kind = kind;
        x.message.as_mut().unwrap().content = Content::Text(text.into());
        x
    };
    let mut v = mk(EntryKind::User, "virtual");
    v.is_virtual = true;
    let mut err = mk(EntryKind::Assistant, chaos::PDF_TOO_LARGE);
    err.is_api_error = true;
    let mut boundary = e[0].clone();
    boundary.kind = EntryKind::System;
    boundary.message = None;
    boundary.subtype = Some("compact_boundary".into());
    boundary.compact_metadata =
        Some(json!({"trigger": "auto", "preserved_segment": {"first_seq": 0, "last_seq": 0}}));
    let summary = mk(EntryKind::User, "summary text");
    let mut snip = boundary.clone();
    snip.subtype = Some("snip".into());
    snip.compact_metadata = None;
    snip.snip_metadata = Some(loupe::history::SnipMetadata {
        removed_uuids: vec!["u-5".into()],
    });
    let blank = mk(EntryKind::User, "   ");
    let tail = mk(EntryKind::User, "  tail text \n");
    extra.extend([v, err, boundary, summary, snip, blank, tail]);
    for (i, x) in extra.iter_mut().enumerate() {
        x.seq = Some(i as i64);
        x.uuid = Some(format!("u-{i}"));
    }
    let inv = text_inventory(&extra);
    let seqs: Vec<i64> = inv.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [0, 8], "{inv:?}");
    assert_eq!(inv[1].1, "tail text");
    // Without the preserved segment only the tail survives.
    extra[4].compact_metadata = Some(json!({"trigger": "auto"}));
    assert_eq!(text_inventory(&extra), vec![(8, "tail text".to_string())]);
    e.clear();
    assert!(text_inventory(&e).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The providers' documented error examples, through the public API.

fn rules_of(v: &[Violation]) -> Vec<&'static str> {
    let mut r: Vec<_> = v.iter().map(|v| v.rule).collect();
    r.dedup();
    r
}

fn anth(list: Value) -> Vec<Violation> {
    anthropic::validate(list.as_array().unwrap(), &AnthropicRules::default())
}

#[test]
fn anthropic_doc_examples() {
    let prompt = json!({"role": "user", "content": "go"});
    let tu = |id: &str| json!({"type": "tool_use", "id": id, "name": "Bash", "input": {}});
    let tr = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"});
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("A1.6 split assistant", json!([prompt, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}, {"role": "assistant", "content": [tu("toolu_1")]}, {"role": "user", "content": [tr("toolu_1")]}]), "D1.4", "roles must alternate"),
        ("A1.6 split results", json!([prompt, {"role": "assistant", "content": [tu("A"), tu("B")]}, {"role": "user", "content": [tr("A")]}, {"role": "user", "content": [tr("B")]}]), "D1.9", "unexpected `tool_use_id` found in `tool_result` blocks: B"),
        ("A1.7 assistant first", json!([{"role": "assistant", "content": "hi"}]), "D1.3", "first message must use the \"user\" role"),
        ("A2.2 empty content", json!([{"role": "user", "content": []}]), "D1.5", "all messages must have non-empty content except for the optional final assistant message"),
        ("A2.3 empty text", json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]), "D1.5", "text content blocks must be non-empty"),
        ("A2.4 whitespace text", json!([{"role": "user", "content": [{"type": "text", "text": "\n"}]}]), "D1.5", "text content blocks must contain non-whitespace text"),
        ("A2.7 partial input", json!([prompt, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": "{\"a"}]}, {"role": "user", "content": [tr("t")]}]), "D1.7", "tool_use.input: Input should be a valid dictionary"),
        ("A3.5 final thinking", json!([prompt, {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "thinking", "thinking": "t", "signature": "s"}]}]), "D1.11", "The final block in an assistant message cannot be `thinking`."),
        ("A4.1 foreign id", json!([prompt, {"role": "assistant", "content": [tu("functions.Bash:0")]}, {"role": "user", "content": [tr("functions.Bash:0")]}]), "D1.7", "String should match pattern '^[a-zA-Z0-9_-]+$'"),
        ("A4.2 server id", json!([prompt, {"role": "assistant", "content": [{"type": "server_tool_use", "id": "toolu_x", "name": "web_search", "input": {}}, {"type": "web_search_tool_result", "tool_use_id": "toolu_x", "content": []}]}]), "D1.7", "'^srvtoolu_[a-zA-Z0-9_]+$'"),
        ("A4.3 duplicate ids", json!([prompt, {"role": "assistant", "content": [tu("A")]}, {"role": "user", "content": [tr("A")]}, {"role": "assistant", "content": [tu("A")]}, {"role": "user", "content": [tr("A")]}]), "D1.7", "`tool_use` ids must be unique"),
        ("A4.4 missing result", json!([prompt, {"role": "assistant", "content": [tu("A")]}, {"role": "user", "content": "next"}]), "D1.8", "`tool_use` ids were found without `tool_result` blocks immediately after: A."),
        ("A4.5 text first", json!([prompt, {"role": "assistant", "content": [tu("A")]}, {"role": "user", "content": [{"type": "text", "text": "x"}, tr("A")]}]), "D1.8", "immediately after: A"),
        ("A4.7 orphan", json!([{"role": "user", "content": [tr("toolu_9")]}]), "D1.9", "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."),
        ("A4.8 duplicate result", json!([prompt, {"role": "assistant", "content": [tu("A")]}, {"role": "user", "content": [tr("A"), tr("A")]}]), "D1.9", "each tool_use must have a single result. Found multiple `tool_result` blocks with id: A"),
        ("A5.2 advisor result", json!([prompt, {"role": "assistant", "content": [{"type": "advisor_tool_result", "tool_use_id": "srvtoolu_1", "content": {}}, {"type": "text", "text": "x"}]}]), "D1.10", "unexpected `tool_use_id` found in `advisor_tool_result` blocks: srvtoolu_1. Each `advisor_tool_result` block must have a corresponding `server_tool_use` block before it."),
        ("A5.3 unresolved web search", json!([prompt, {"role": "assistant", "content": [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}, {"type": "text", "text": "x"}]}, {"role": "user", "content": "more"}]), "D1.10", "`web_search` tool use with id `srvtoolu_1` was found without a corresponding `web_search_tool_result` block"),
        ("A6.1 unsigned", json!([prompt, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "x"}]}, {"role": "user", "content": "more"}]), "D1.11", "thinking.signature: Field required"),
        ("A6.6 thinking disabled", json!([prompt, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "x"}]}]), "D1.13", "When thinking is disabled"),
        ("A8.1 five markers", json!([{"role": "user", "content": (0..5).map(|i| json!({"type": "text", "text": format!("t{i}"), "cache_control": {"type": "ephemeral"}})).collect::<Vec<_>>()}]), "D1.15", "A maximum of 4 blocks with cache_control may be provided. Found 5."),
        ("A7.4 101 images", json!([{"role": "user", "content": (0..101).map(|_| chaos::image_block()).collect::<Vec<_>>()}]), "D1.16", "found 101"),
        ("A2.5 unknown block", json!([{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "future_block", "x": 1}]}]), "A2.5", "'future_block'"),
        ("Loupe reduces to {role, content}", json!([{"role": "user", "content": "x", "uuid": "u1"}]), "D1.0", "messages.0.uuid: Extra inputs are not permitted"),
    ];
    for (name, list, rule, text) in cases {
        let v = anth(list);
        assert!(
            v.iter().any(|v| v.rule == rule && v.message.contains(text)),
            "{name}: expected {rule} containing {text:?}, got {v:#?}"
        );
    }
}

#[test]
fn anthropic_trailing_assistant_rules() {
    let list =
        json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]);
    assert!(anth(list.clone()).is_empty());
    let strict = AnthropicRules {
        allow_trailing_assistant: false,
        ..AnthropicRules::default()
    };
    assert_eq!(
        rules_of(&anthropic::validate(list.as_array().unwrap(), &strict)),
        ["D1.6"]
    );
    // The caller's next user turn follows: a trailing assistant must be non-empty and answered.
    let empty = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": []}]);
    assert_eq!(rules_of(&anth(empty.clone())), ["D1.5"]);
    let prefill = AnthropicRules {
        trailing_assistant_is_prefill: true,
        ..AnthropicRules::default()
    };
    assert!(anthropic::validate(empty.as_array().unwrap(), &prefill).is_empty());
    let dangling = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "A", "name": "Bash", "input": {}}]}]);
    assert_eq!(rules_of(&anth(dangling)), ["D1.8"]);
}

#[test]
fn openai_doc_examples() {
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "Bash", "arguments": "{}"}});
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("B1.3 null content", json!([{"role": "user", "content": null}]), "D2.2", "expected a string, got null."),
        ("B1.5 empty tool_calls", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "tool_calls": []}]), "D2.3", "Invalid 'messages[1].tool_calls': empty array."),
        ("B1.6 bad name", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "functions.Bash", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "r"}]), "D2.4", "does not match pattern"),
        ("B1.7 long id", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": null, "tool_calls": [call(&"f".repeat(53))]}, {"role": "tool", "tool_call_id": "f".repeat(53), "content": "r"}]), "D2.4", "Expected a string with maximum length 40, but got a string with length 53 instead."),
        ("B1.8 missing tool message", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": null, "tool_calls": [call("call_1")]}, {"role": "user", "content": "next"}]), "D2.5", "The following tool_call_ids did not have response messages: call_1"),
        ("B1.9 orphan tool message", json!([{"role": "tool", "tool_call_id": "call_1", "content": "r"}]), "D2.6", "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."),
        ("Loupe: arguments parse", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "Bash", "arguments": "{\"a"}}]}, {"role": "tool", "tool_call_id": "c", "content": "r"}]), "D2.4", "not valid JSON"),
        ("Loupe: no thinking", json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]), "D2.7", "thinking"),
    ];
    for (name, list, rule, text) in cases {
        let v = openai::validate(list.as_array().unwrap());
        assert!(
            v.iter().any(|v| v.rule == rule && v.message.contains(text)),
            "{name}: expected {rule} containing {text:?}, got {v:#?}"
        );
    }
}

#[test]
fn responses_doc_examples() {
    let prompt = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]});
    let call =
        json!({"type": "function_call", "call_id": "call_1", "name": "Bash", "arguments": "{}"});
    let output = json!({"type": "function_call_output", "call_id": "call_1", "output": "ok"});
    let rs = json!({"type": "reasoning", "id": "rs_1", "summary": []});
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("B2.1 tool role", json!([{"type": "message", "role": "tool", "content": "x"}]), "D3.1", "Invalid value: 'tool'. Supported values are: 'assistant', 'system', 'developer', and 'user'."),
        ("B2.2 orphan output", json!([prompt, output]), "D3.2", "No tool call found for function call output with call_id call_1."),
        ("B2.3 missing output", json!([prompt, call, prompt]), "D3.3", "No tool output found for function call"),
        ("B2.3 message between", json!([prompt, call, prompt, output]), "D3.3", "No tool output found for function call"),
        ("B2.4 reasoning alone", json!([prompt, rs, prompt]), "D3.4", "Item 'rs_1' of type 'reasoning' was provided without its required following item."),
        ("B2.5 reasoning shape", json!([prompt, {"type": "reasoning", "id": "rs_2"}, call, output]), "D3.5", "needs id and summary"),
        ("A7.1 bmp", json!([{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": format!("data:image/bmp;base64,{}", chaos::BMP), "detail": "auto"}]}]), "D1.16", "Image format image/bmp not supported"),
    ];
    for (name, list, rule, text) in cases {
        let v = responses::validate(list.as_array().unwrap());
        assert!(
            v.iter().any(|v| v.rule == rule && v.message.contains(text)),
            "{name}: expected {rule} containing {text:?}, got {v:#?}"
        );
    }
    let good = json!([prompt, rs, call, output, prompt]);
    assert!(responses::validate(good.as_array().unwrap()).is_empty());
}

#[test]
fn gemini_doc_examples() {
    let prompt = json!({"role": "user", "parts": [{"text": "go"}]});
    let call = |sig: Option<&str>| {
        let mut p = json!({"functionCall": {"id": "c1", "name": "Task", "args": {}}});
        if let Some(sig) = sig {
            p["thoughtSignature"] = json!(sig);
        }
        json!({"role": "model", "parts": [p]})
    };
    let answer = json!({"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "Task", "response": {"output": "ok"}}}]});
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "C1 role",
            json!([{"role": "assistant", "parts": [{"text": "x"}]}]),
            "D4.1",
            "Please use a valid role: user, model.",
        ),
        (
            "C2 no parts",
            json!([{"role": "user", "parts": []}]),
            "D4.1",
            "contents.parts must not be empty.",
        ),
        (
            "C3 two fields",
            json!([{"role": "user", "parts": [{"text": "x", "inlineData": {"mimeType": "image/png", "data": ""}}]}]),
            "D4.1",
            "required oneof field 'data' must have one initialized field",
        ),
        (
            "C6 count",
            json!([prompt, call(Some("s")), prompt]),
            "D4.3",
            "the number of function response parts is equal to the number of function call parts",
        ),
        (
            "C5 response alone",
            json!([prompt, {"role": "model", "parts": [{"text": "x"}]}, answer]),
            "D4.4",
            "function response turn comes immediately after a function call turn",
        ),
        (
            "C8 ends with model",
            json!([prompt, {"role": "model", "parts": [{"text": "x"}]}]),
            "D4.2",
            "Requests ending with a model turn are not supported.",
        ),
        (
            "C9 alternation",
            json!([prompt, prompt]),
            "D4.2",
            "alternate between user and model",
        ),
        (
            "C10 signature",
            json!([prompt, call(None), answer]),
            "D4.5",
            "Function call is missing a thought_signature in functionCall parts.",
        ),
    ];
    for (name, list, rule, text) in cases {
        let v = gemini::validate(list.as_array().unwrap());
        assert!(
            v.iter().any(|v| v.rule == rule && v.message.contains(text)),
            "{name}: expected {rule} containing {text:?}, got {v:#?}"
        );
    }
    let good = json!([
        prompt,
        call(Some("skip_thought_signature_validator")),
        answer
    ]);
    assert!(gemini::validate(good.as_array().unwrap()).is_empty());
    // Signatures matter only in the current turn (after the last user prompt).
    let old =
        json!([prompt, call(None), answer, {"role": "model", "parts": [{"text": "done"}]}, prompt]);
    assert!(gemini::validate(old.as_array().unwrap()).is_empty());
}

#[test]
fn media_and_thinking_rules() {
    let img = |media: &str, data: &str| json!({"role": "user", "content": [chaos::image_of(media, data)]});
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "A7.1 media type",
            img("image/bmp", chaos::BMP),
            "Image format image/bmp not supported",
        ),
        (
            "A7.1 magic bytes",
            img("image/jpeg", chaos::PNG_1PX),
            "Could not process image",
        ),
        (
            "A7.3 pixels",
            img("image/png", chaos::PNG_9000X10),
            "9000x10",
        ),
        (
            "A7.2 size",
            img(
                "image/png",
                &(chaos::PNG_1PX.to_string() + &"A".repeat(5_300_000)),
            ),
            "image exceeds 5 MB maximum",
        ),
    ];
    for (name, list, text) in cases {
        let v = anth(json!([list]));
        assert!(
            v.iter()
                .any(|v| v.rule == "D1.16" && v.message.contains(text)),
            "{name}: expected D1.16 containing {text:?}, got {v:#?}"
        );
    }
    // Beyond 20 images, each is at most 2000 px a side.
    let many = |n: usize| json!([{"role": "user", "content": (0..n).map(|_| chaos::image_of("image/png", chaos::PNG_3000X3000)).collect::<Vec<_>>()}]);
    assert!(anth(many(20)).is_empty());
    assert!(anth(many(21))
        .iter()
        .any(|v| v.message.contains("many-image")));
    // D1.13 manual mode and D1.14 provenance.
    let loop_list = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ]);
    let manual = AnthropicRules {
        thinking_enabled: true,
        manual_thinking: true,
        ..AnthropicRules::default()
    };
    let v = anthropic::validate(loop_list.as_array().unwrap(), &manual);
    assert!(v.iter().any(|v| v.rule == "D1.13"
        && v.message
            .contains("Expected `thinking` or `redacted_thinking`, but found `tool_use`")));
    let signed = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "OLD"}, {"type": "text", "text": "x"}]},
        {"role": "user", "content": "more"},
    ]);
    let switched = AnthropicRules {
        thinking_enabled: true,
        foreign_signatures: vec!["OLD".into()],
        ..AnthropicRules::default()
    };
    assert_eq!(
        rules_of(&anthropic::validate(signed.as_array().unwrap(), &switched)),
        ["D1.14"]
    );
}
