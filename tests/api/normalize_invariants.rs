//! The normalizer's properties, checked by the independent validator on chaotic histories.
//!
//! For every generated history, both providers, and a spread of options:
//! 1. the validator accepts the output (violations and the minimal failing history are printed);
//! 2. normalizing is idempotent: `normalize(entries_from_messages(out), same opts) == out`;
//! 3. no user or assistant text disappears without a repair naming its seq: every text of
//!    `text_inventory` is a substring of some output text / tool_result / tool message content,
//!    unless a repair's `seqs` contains that text's seq;
//! 4. thinking / redacted_thinking / server tool result blocks reach Anthropic byte-identical to a
//!    stored block (signatures and encrypted content are verified);
//! 5. every repair names seqs that exist in the history.

use std::collections::HashSet;

use crate::chaos::{self, text_inventory};
use loupe::history::{
    entries_from_messages, normalize, Entry, NormalizeOptions, Normalized, Provider, ThinkingMode,
};
use loupe_validate::{anthropic, openai, AnthropicRules, Violation};
use proptest::prelude::*;
use serde_json::Value;

fn providers() -> [Provider; 2] {
    [Provider::Anthropic, Provider::Openai]
}

/// The i-th provider (a fresh value: no `Clone`/`Copy` assumed).
fn provider(i: usize) -> Provider {
    providers().into_iter().nth(i).expect("provider index")
}

fn thinking_modes() -> Vec<ThinkingMode> {
    vec![ThinkingMode::Keep, ThinkingMode::Strip]
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
    )
        .prop_map(|(thinking, cache, advisor, tools)| Knobs {
            thinking,
            cache,
            advisor,
            tools: tools.map(|t| t.into_iter().map(str::to_string).collect()),
        })
}

fn options(provider: Provider, k: &Knobs) -> NormalizeOptions {
    NormalizeOptions {
        provider,
        tools: k.tools.clone(),
        thinking: thinking_modes().swap_remove(k.thinking),
        cache: k.cache,
        advisor: k.advisor,
        ..NormalizeOptions::default()
    }
}

fn violations(provider: &Provider, k: &Knobs, messages: &[Value]) -> Vec<Violation> {
    if is_anthropic(provider) {
        let rules = AnthropicRules {
            thinking_enabled: thinking_enabled(&thinking_modes()[k.thinking]),
            ..AnthropicRules::default()
        };
        anthropic::validate(messages, &rules)
    } else {
        openai::validate(messages)
    }
}

/// Every text the output carries: string content, text blocks / parts, tool_result content
/// (string or text blocks), OpenAI tool message content.
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
    let v = violations(p, k, &out.messages);
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

    // 2. Idempotent.
    let again = normalize(&entries_from_messages(&out.messages, provider(pi)), &opts);
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
    //    stored block (ignoring a `cache_control` marker Loupe may add).
    if is_anthropic(p) {
        let stored: HashSet<String> = entries
            .iter()
            .filter_map(|e| e.message.as_ref())
            .flat_map(|m| m.content.to_blocks())
            .filter(must_stay_verbatim)
            .map(|b| b.to_string())
            .collect();
        for m in &out.messages {
            for b in m["content"].as_array().into_iter().flatten() {
                if !must_stay_verbatim(b) {
                    continue;
                }
                let mut b = b.clone();
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
    #![proptest_config(ProptestConfig { cases: 2000, max_shrink_iters: 4096, ..ProptestConfig::default() })]

    #[test]
    fn chaotic_histories_normalize_to_valid_lists(entries in chaos::chaotic_history(), k in knobs()) {
        for pi in 0..providers().len() {
            check(&entries, pi, &k)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Histories that are already valid keep every text, whatever the options.
    #[test]
    fn clean_histories_normalize_to_valid_lists(entries in chaos::clean_history(), k in knobs()) {
        for pi in 0..providers().len() {
            check(&entries, pi, &k)?;
        }
    }
}
