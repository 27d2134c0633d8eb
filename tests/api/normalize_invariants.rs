//! The normalizer's properties, checked by the independent validator on chaotic histories.
//!
//! For every generated history, all four providers, and a spread of options (thinking mode,
//! request model, cache, advisor, tools):
//! 1. the validator accepts the output (violations and the minimal failing history are printed);
//! 2. normalizing is idempotent: `normalize(entries_from_messages(out), same opts) == out`;
//! 3. no user or assistant text disappears without a repair naming its seq: every text of
//!    `text_inventory` is a substring of some output text / tool_result / tool message content,
//!    unless a repair's `seqs` contains that text's seq;
//! 4. thinking / redacted_thinking / server tool result blocks reach Anthropic byte-identical to a
//!    stored block (signatures and encrypted content are verified);
//! 5. every repair names seqs that exist in the history;
//! 6. with a request model, no thinking, reasoning item or thought signature written by another
//!    model is sent (the validators' `foreign_*` rules); Responses reasoning items are
//!    byte-identical to stored ones, and Gemini signatures are stored ones or the dummy.

use std::collections::HashSet;

use crate::chaos::{self, text_inventory, MODELS};
use loupe::history::normalize::{clearing, ClearingOptions};
use loupe::history::{
    entries_from_messages, normalize, Entry, EntryKind, NormalizeOptions, Normalized, Provider,
    RepairKind, ThinkingMode,
};
use loupe_validate::{
    anthropic, gemini, openai, responses, AnthropicRules, GeminiRules, ResponsesRules, Violation,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn providers() -> [Provider; 4] {
    [
        Provider::Anthropic,
        Provider::Openai,
        Provider::OpenaiResponses,
        Provider::Gemini,
    ]
}

/// The i-th provider (a fresh value: no `Clone`/`Copy` assumed).
fn provider(i: usize) -> Provider {
    providers().into_iter().nth(i).expect("provider index")
}

fn thinking_modes() -> Vec<ThinkingMode> {
    vec![
        ThinkingMode::Keep,
        ThinkingMode::Strip,
        ThinkingMode::Enabled,
    ]
}

// `strip` is what a caller with thinking off asks for (D1.13 depends on it).
fn thinking_enabled(mode: &ThinkingMode) -> bool {
    !matches!(mode, ThinkingMode::Strip)
}

fn is_anthropic(p: &Provider) -> bool {
    matches!(p, Provider::Anthropic)
}

/// The request options a case runs with (besides the provider).
#[derive(Debug, Clone)]
struct Knobs {
    thinking: usize,
    cache: bool,
    advisor: bool,
    tools: Option<Vec<String>>,
    /// The request model, an index in [`MODELS`].
    model: Option<usize>,
    /// Reversible clearing, sized small so that chaotic histories clear results.
    clearing: Option<ClearingOptions>,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        0..thinking_modes().len(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::subsequence(
            vec!["Bash", "Read", "Edit", "Grep", "Glob", "ToolSearch"],
            0..=6,
        )),
        prop::option::of(0..MODELS.len()),
        prop::option::of((
            0u64..400,
            0u64..400,
            prop::sample::select(vec![0usize, 1, 300]),
        )),
    )
        .prop_map(|(thinking, cache, advisor, tools, model, clearing)| Knobs {
            thinking,
            cache,
            advisor,
            tools: tools.map(|t| t.into_iter().map(str::to_string).collect()),
            model,
            clearing: clearing.map(|(keep_tokens, batch_tokens, min_bytes)| ClearingOptions {
                keep_tokens,
                batch_tokens,
                min_bytes,
            }),
        })
}

fn options(provider: Provider, k: &Knobs) -> NormalizeOptions {
    NormalizeOptions {
        provider,
        tools: k.tools.clone(),
        thinking: thinking_modes().swap_remove(k.thinking),
        cache: k.cache,
        advisor: k.advisor,
        model: k.model.map(|m| MODELS[m].to_string()),
        clearing: k.clearing.clone(),
        ..NormalizeOptions::default()
    }
}

/// The zoom addresses of the cleared results' stubs in `messages`, in order.
fn stub_addresses(messages: &[Value]) -> Vec<i64> {
    let json = serde_json::to_string(messages).unwrap();
    json.split(clearing::STUB_PREFIX)
        .skip(1)
        .map(|rest| {
            let (_, zoom) = rest
                .split_once("bytes; zoom ")
                .expect("a stub names its address");
            zoom.split_once("+1 reads it whole]")
                .and_then(|(seq, _)| seq.parse().ok())
                .expect("a stub's address is id+1")
        })
        .collect()
}

/// What entries written by another model than the request's carry, by field: thinking
/// signatures and redacted data, reasoning item ids, thought signatures.
fn foreign(entries: &[Entry], k: &Knobs, field: &str) -> Vec<String> {
    let Some(want) = k.model.map(|m| MODELS[m]) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| e.message.as_ref())
        .filter(|m| m.model.as_deref() != Some(want))
        .flat_map(|m| m.content.to_blocks())
        .filter_map(|b| match (field, b["type"].as_str()) {
            ("thinking", Some("thinking")) => b["signature"].as_str().map(str::to_string),
            ("thinking", Some("redacted_thinking")) => b["data"].as_str().map(str::to_string),
            ("reasoning", Some("reasoning")) => b["id"].as_str().map(str::to_string),
            ("signature", _) => b["thought_signature"].as_str().map(str::to_string),
            _ => None,
        })
        .collect()
}

fn violations(
    provider: &Provider,
    k: &Knobs,
    entries: &[Entry],
    messages: &[Value],
) -> Vec<Violation> {
    match provider {
        Provider::Anthropic => {
            let mode = &thinking_modes()[k.thinking];
            let rules = AnthropicRules {
                thinking_enabled: thinking_enabled(mode),
                manual_thinking: matches!(mode, ThinkingMode::Enabled),
                foreign_signatures: foreign(entries, k, "thinking"),
                ..AnthropicRules::default()
            };
            anthropic::validate(messages, &rules)
        }
        Provider::Openai => openai::validate(messages),
        Provider::OpenaiResponses => responses::validate_with(
            messages,
            &ResponsesRules {
                foreign_reasoning: foreign(entries, k, "reasoning"),
                ..ResponsesRules::default()
            },
        ),
        Provider::Gemini => gemini::validate_with(
            messages,
            &GeminiRules {
                foreign_signatures: foreign(entries, k, "signature"),
                ..GeminiRules::default()
            },
        ),
    }
}

/// Every text the output carries: string content, text blocks / parts, tool_result content
/// (string or text blocks), OpenAI tool message content, Responses outputs (a string or parts),
/// Gemini text parts and function responses.
fn output_texts(messages: &[Value]) -> Vec<String> {
    fn collect(content: &Value, out: &mut Vec<String>) {
        match content {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => {
                for item in items {
                    if let Some(t) = item.get("text").and_then(Value::as_str) {
                        out.push(t.to_string());
                    }
                    if item.get("type").and_then(Value::as_str) == Some("tool_result") {
                        if let Some(c) = item.get("content") {
                            collect(c, out);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for m in messages {
        if let Some(c) = m.get("content") {
            collect(c, &mut out);
        }
        // A Responses tool output: a string, or input parts (text, then media).
        if let Some(o) = m.get("output") {
            collect(o, &mut out);
        }
        for p in m
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(t) = p.get("text").and_then(Value::as_str) {
                out.push(t.to_string());
            }
            let response = &p["functionResponse"]["response"];
            for key in ["output", "error"] {
                if let Some(t) = response.get(key).and_then(Value::as_str) {
                    out.push(t.to_string());
                }
            }
        }
    }
    out
}

/// Blocks whose bytes a provider verifies (signatures, encrypted content).
fn must_stay_verbatim(b: &Value) -> bool {
    let ty = b["type"].as_str().unwrap_or_default();
    ty == "thinking"
        || ty == "redacted_thinking"
        || (ty != "tool_result" && ty.ends_with("_tool_result"))
}

fn dump(entries: &[Entry]) -> String {
    serde_json::to_string_pretty(entries).unwrap_or_default()
}

fn check(entries: &[Entry], pi: usize, k: &Knobs) -> Result<(), TestCaseError> {
    let opts = options(provider(pi), k);
    let out: Normalized = normalize(entries, &opts);
    let p = &opts.provider;

    // 1. The provider accepts it.
    let v = violations(p, k, entries, &out.messages);
    prop_assert!(
        v.is_empty(),
        "provider {:?}, options {:?}\nviolations:\n{}\noutput:\n{}\nrepairs: {:#?}\nhistory:\n{}",
        p,
        k,
        v.iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        serde_json::to_string_pretty(&out.messages).unwrap_or_default(),
        out.repairs,
        dump(entries)
    );

    // 2. Idempotent (the output was written for the request's model). Without clearing: the
    //    list read back is numbered by position, not by the stored seqs its stubs name, and the
    //    provider's shape changes the sizes the rule counts; its stubs stay as they are.
    let mut back = entries_from_messages(&out.messages, provider(pi));
    for m in back.iter_mut().filter_map(|e| e.message.as_mut()) {
        m.model = opts.model.clone();
    }
    let again = normalize(
        &back,
        &NormalizeOptions {
            clearing: None,
            ..opts.clone()
        },
    );
    prop_assert_eq!(
        &again.messages,
        &out.messages,
        "not idempotent (provider {:?}, options {:?})\nhistory:\n{}",
        p,
        k,
        dump(entries)
    );

    // 3. No text lost without a repair naming its seq.
    let repaired: HashSet<i64> = out
        .repairs
        .iter()
        .flat_map(|r| r.seqs.iter().copied())
        .collect();
    let texts = output_texts(&out.messages);
    for (seq, text) in text_inventory(entries) {
        if repaired.contains(&seq) {
            continue;
        }
        prop_assert!(
            texts.iter().any(|t| t.contains(&text)),
            "text of seq {} lost without a repair naming it: {:?}\n(provider {:?}, options {:?})\noutput:\n{}\nrepairs: {:#?}\nhistory:\n{}",
            seq,
            text,
            p,
            k,
            serde_json::to_string_pretty(&out.messages).unwrap_or_default(),
            out.repairs,
            dump(entries)
        );
    }

    // 4. Signed / encrypted blocks are never edited (D1.12, A6.2, A5.4): every thinking,
    //    redacted_thinking and server tool result block of the output is byte-identical to a
    //    stored block (ignoring a `cache_control` marker Loupe may add, and a result's
    //    `tool_use_id` that a reported rewrite of its call's id changed).
    if is_anthropic(p) {
        let rewritten: Vec<String> = out
            .repairs
            .iter()
            .filter(|r| r.kind == RepairKind::ToolIdRewritten)
            .filter_map(|r| r.detail.split(" rewritten to ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next().map(String::from))
            .collect();
        let unrewritten = |mut b: Value| {
            if b.get("tool_use_id")
                .and_then(Value::as_str)
                .is_some_and(|id| rewritten.iter().any(|r| r == id))
            {
                b["tool_use_id"] = json!("<rewritten>");
            }
            b
        };
        let stored: HashSet<String> = entries
            .iter()
            .filter_map(|e| e.message.as_ref())
            .flat_map(|m| m.content.to_blocks())
            .filter(must_stay_verbatim)
            .flat_map(|b| {
                let mut any_id = b.clone();
                if any_id.get("tool_use_id").is_some() {
                    any_id["tool_use_id"] = json!("<rewritten>");
                }
                [b.to_string(), any_id.to_string()]
            })
            .collect();
        for m in &out.messages {
            for b in m["content"].as_array().into_iter().flatten() {
                if !must_stay_verbatim(b) {
                    continue;
                }
                let mut b = unrewritten(b.clone());
                if let Some(o) = b.as_object_mut() {
                    o.remove("cache_control");
                }
                prop_assert!(
                    stored.contains(&b.to_string()),
                    "block edited: {}\n(options {:?})\nhistory:\n{}",
                    b,
                    k,
                    dump(entries)
                );
            }
        }
    }

    // 6. Responses reasoning items are stored ones, verbatim; Gemini signatures are stored ones or
    //    the dummy.
    let stored_blocks: Vec<Value> = entries
        .iter()
        .filter_map(|e| e.message.as_ref())
        .flat_map(|m| m.content.to_blocks())
        .collect();
    for item in out.messages.iter().filter(|m| m["type"] == "reasoning") {
        prop_assert!(
            stored_blocks.contains(item),
            "reasoning item edited: {}",
            item
        );
    }
    for part in out
        .messages
        .iter()
        .flat_map(|c| c["parts"].as_array().into_iter().flatten())
    {
        if let Some(sig) = part.get("thoughtSignature").and_then(Value::as_str) {
            prop_assert!(
                sig == "skip_thought_signature_validator"
                    || stored_blocks
                        .iter()
                        .any(|b| b["thought_signature"].as_str() == Some(sig)),
                "thought signature made up: {}",
                sig
            );
        }
    }

    // 7. Every cleared result's stub names the stored user entry holding a tool result, which
    //    zoom(seq, 1) reads whole, and a repair names it.
    let cleared: HashSet<i64> = out
        .repairs
        .iter()
        .filter(|r| r.kind == RepairKind::ToolResultCleared)
        .flat_map(|r| r.seqs.iter().copied())
        .collect();
    for seq in stub_addresses(&out.messages) {
        let holder = entries.iter().find(|e| e.seq == Some(seq));
        prop_assert!(
            holder.is_some_and(|e| e.kind == EntryKind::User
                && e.message.as_ref().is_some_and(|m| m
                    .content
                    .to_blocks()
                    .iter()
                    .any(|b| b["type"] == "tool_result"))),
            "stub zoom {}+1 names no stored tool result\nhistory:\n{}",
            seq,
            dump(entries)
        );
        prop_assert!(cleared.contains(&seq), "stub {} without its repair", seq);
    }
    if k.clearing.is_none() {
        prop_assert!(cleared.is_empty());
    }

    // 5. Repairs name real entries.
    let seqs: HashSet<i64> = entries.iter().filter_map(|e| e.seq).collect();
    for r in &out.repairs {
        prop_assert!(
            r.seqs.iter().all(|s| seqs.contains(s)),
            "repair {:?} names a seq that is not in the history",
            r
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, max_shrink_iters: 4096, ..ProptestConfig::default() })]

    #[test]
    fn chaotic_histories_normalize_to_valid_lists(entries in chaos::chaotic_history(), k in knobs()) {
        for pi in 0..providers().len() {
            check(&entries, pi, &k)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Histories that are already valid keep every text, whatever the options.
    #[test]
    fn clean_histories_normalize_to_valid_lists(entries in chaos::clean_history(), k in knobs()) {
        for pi in 0..providers().len() {
            check(&entries, pi, &k)?;
        }
    }
}
