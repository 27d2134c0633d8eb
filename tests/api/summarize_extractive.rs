//! The extractive summarizer: deterministic, offline, within its byte budget.

use crate::fake_provider::*;
use loupe::summarize::{merge_verbatim, ExtractiveSummarizer, Purpose, Summarizer, SummaryRequest};
use serde_json::json;

fn summarize(entries: Vec<loupe::history::model::Entry>, purpose: Purpose, max: usize) -> String {
    ExtractiveSummarizer::new()
        .summarize_now(&SummaryRequest::new(entries, purpose, max))
        .text
}

#[test]
fn user_words_come_first() {
    let c = summarize(session(), Purpose::Compaction, 4_000);
    assert!(c.starts_with("User requests:\n- Please fix the failing parser test in src/parser.rs, and keep the public API unchanged.\n- Here is a screenshot"), "{c}");
    let l = summarize(session(), Purpose::Line, 512);
    assert!(
        l.starts_with("user: Please fix the failing parser test"),
        "{l}"
    );
    let second = l
        .find("user: Here is a screenshot")
        .expect("second prompt kept");
    assert!(second < l.find("error:").unwrap() && second < l.find("tool:").unwrap());
}

#[test]
fn errors_and_decisions_are_kept() {
    let c = summarize(session(), Purpose::Compaction, 4_000);
    let notes = &c[c.find("Decisions and errors:").unwrap()..];
    assert!(notes.contains("- error: Bash(cargo test parser) failed: running 3 tests error[E0308]: mismatched types"), "{c}");
    assert!(notes.contains("The root cause is the tokenizer returning a &str instead of a String."));
    assert!(
        !c.contains("Let me read the file."),
        "narration is not a decision"
    );

    // An error-looking line in a successful result counts; a success count does not.
    let entries = vec![
        user("build it"),
        tool_use("t1", "Bash", json!({"command": "cargo build"})),
        tool_result(
            "t1",
            "Compiling loupe\nwarning: unused\nerror: linker `cc` not found\n",
            false,
        ),
        tool_use("t2", "Bash", json!({"command": "cargo test"})),
        tool_result(
            "t2",
            "test result: ok. 5 passed; 0 failed; 0 ignored",
            false,
        ),
    ];
    let c = summarize(entries, Purpose::Compaction, 4_000);
    assert!(
        c.contains("- error: Bash(cargo build): error: linker `cc` not found"),
        "{c}"
    );
    assert!(!c.contains("error: Bash(cargo test)"), "{c}");
}

#[test]
fn tool_calls_are_described_not_copied() {
    let c = summarize(session(), Purpose::Compaction, 4_000);
    let tools = &c[c.find("Tool activity:").unwrap()..];
    assert!(tools.contains("- Read(src/parser.rs) → 560 B"), "{c}");
    assert!(tools.contains("- Bash(cargo test parser) → error"));
    assert!(tools.contains("- Edit(src/tokenizer.rs) → 2 B"));
    assert!(
        !c.contains("fn parse() {}"),
        "tool output is described, not copied"
    );
    for banned in [
        "toolu_",
        "SECRET-THOUGHT",
        "REMINDER-META",
        "iVBOR",
        "uuid-",
    ] {
        assert!(!c.contains(banned), "{banned} in {c}");
    }
    assert!(c.ends_with("Where it stopped:\nDone editing; the tokenizer now returns String."));
    let l = summarize(session(), Purpose::Line, 512);
    assert!(
        l.contains(
            "tool: Read(src/parser.rs), Bash(cargo test parser) failed, Edit(src/tokenizer.rs)"
        ),
        "{l}"
    );
}

#[test]
fn repeated_tool_calls_are_counted() {
    let mut entries = vec![user("look around")];
    for i in 0..3 {
        let id = format!("t{i}");
        entries.push(tool_use(&id, "Read", json!({"file_path": "a.rs"})));
        entries.push(tool_result(&id, "x", false));
    }
    let c = summarize(entries, Purpose::Compaction, 1_000);
    assert!(c.contains("- Read(a.rs) → 1 B ×3"), "{c}");
}

#[test]
fn previous_summary_is_folded_in_first() {
    let mut req = SummaryRequest::new(session(), Purpose::Compaction, 4_000);
    req.previous_summary = Some(
        "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\nSummary:\n1. Set up CI.".into(),
    );
    let c = ExtractiveSummarizer::new().summarize_now(&req).text;
    assert!(
        c.starts_with("Earlier summary:\nSummary:\n1. Set up CI.\n\nUser requests:"),
        "{c}"
    );

    req.purpose = Purpose::Line;
    req.max_bytes = 300;
    let l = ExtractiveSummarizer::new().summarize_now(&req).text;
    assert!(
        l.starts_with("earlier: Summary: 1. Set up CI.; user: Please fix"),
        "{l}"
    );
    assert!(l.len() <= 300);
}

#[test]
fn budget_is_never_exceeded() {
    let mut long = session();
    long.extend(session());
    long.push(user(&"ünïcödé 日本語 words ".repeat(50)));
    long.push(assistant(
        &"We decided to keep ünïcödé because 日本語 matters. ".repeat(20),
    ));
    for purpose in [Purpose::Compaction, Purpose::Line] {
        for with_previous in [false, true] {
            for max in (0..500).chain((500..6_000).step_by(61)) {
                let mut req = SummaryRequest::new(long.clone(), purpose, max);
                if with_previous {
                    req.previous_summary = Some("Earlier: 日本語 setup.\n\nMore.".repeat(10));
                }
                let text = ExtractiveSummarizer::new().summarize_now(&req).text;
                assert!(text.len() <= max, "{purpose:?} {max}: {} bytes", text.len());
                if purpose == Purpose::Line {
                    assert!(!text.contains('\n'), "{max}: {text}");
                }
                if max >= 200 {
                    assert!(
                        text.contains("user") || text.contains("User"),
                        "{purpose:?} {max}: {text}"
                    );
                }
            }
        }
    }
}

#[test]
fn tight_budgets_shorten_items_before_dropping_them() {
    let prompts = [
        "alpha requirement",
        "bravo correction",
        "charlie decision",
        "delta reason",
        "echo order",
    ];
    let entries: Vec<_> = prompts
        .iter()
        .map(|p| user(&format!("{p}: {}", "detail ".repeat(30))))
        .collect();
    let l = summarize(entries.clone(), Purpose::Line, 300);
    for p in prompts {
        assert!(l.contains(p), "{p} dropped from {l}");
    }
    // With room for only a few, the first and the most recent prompts are kept.
    let l = summarize(entries, Purpose::Line, 90);
    assert!(l.contains("alpha") && l.contains("echo"), "{l}");
}

#[test]
fn deterministic() {
    for purpose in [Purpose::Compaction, Purpose::Line] {
        let a = summarize(session(), purpose, 700);
        let b = summarize(session(), purpose, 700);
        assert_eq!(a, b);
    }
}

#[test]
fn a_single_entry_that_fits_is_kept_verbatim_as_a_line() {
    let text = "Ana: price stays at 49\nnorth: ok, no discounts\r\nthanks";
    let l = summarize(vec![user(text)], Purpose::Line, 512);
    assert_eq!(l, "Ana: price stays at 49 north: ok, no discounts thanks");
    // Several short entries that fit are kept whole, tagged.
    let l = summarize(
        vec![user("price stays at 49"), assistant("ok")],
        Purpose::Line,
        512,
    );
    assert_eq!(l, "user: price stays at 49; assistant: ok");
    // A tool result cut for the transcript is not verbatim, even when the cut fits.
    let big = "x".repeat(5_000);
    let l = summarize(vec![tool_result("t9", &big, false)], Purpose::Line, 8_000);
    assert!(!l.contains("omitted") && l.len() <= 8_000, "{l}");
    assert!(l.starts_with("tool: tool result (5.0 KB): xxx"), "{l}");
    // Too long: summarized, within budget.
    let long = format!("keep the price at 49 {}", "because reasons ".repeat(60));
    let l = summarize(vec![user(&long)], Purpose::Line, 128);
    assert!(
        l.len() <= 128 && l.starts_with("user: keep the price at 49"),
        "{l}"
    );
}

#[test]
fn meta_and_system_entries_are_not_user_words() {
    let entries = vec![
        meta("Caveat: META-CAVEAT"),
        entry(
            json!({"type": "system", "subtype": "compact_boundary", "content": "SYSTEM-BOUNDARY"}),
        ),
        entry(json!({"type": "progress", "data": {"x": "PROGRESS-EVENT"}})),
        user("the real request <system-reminder>INJECTED-REMINDER</system-reminder>"),
        entry(json!({"type": "assistant", "is_api_error": true,
            "message": {"role": "assistant", "content": "API Error: overloaded"}})),
    ];
    let c = summarize(entries, Purpose::Compaction, 2_000);
    assert_eq!(c, "User requests:\n- the real request");
}

#[tokio::test]
async fn trait_object_reports_extractive_and_no_calls() {
    let s: std::sync::Arc<dyn Summarizer> = std::sync::Arc::new(ExtractiveSummarizer::new());
    let out = s
        .summarize(&SummaryRequest::new(session(), Purpose::Line, 256))
        .await
        .unwrap();
    assert_eq!(s.name(), "extractive");
    assert_eq!(out.summarizer, "extractive");
    assert_eq!(out.calls, 0);
}

#[test]
fn empty_history() {
    assert_eq!(summarize(vec![], Purpose::Compaction, 100), "");
    assert_eq!(summarize(vec![], Purpose::Line, 100), "");
}

// ---------------------------------------------------------------------------------------------
// Merge: two summary-tree lines into their parent's

fn merge(left: &str, right: &str, max: usize) -> loupe::summarize::Summary {
    ExtractiveSummarizer::new().summarize_now(&SummaryRequest::merge(
        left.into(),
        right.into(),
        max,
    ))
}

const LEFT: &str = "user: Please fix the failing parser test in src/parser.rs, and keep the \
    public API unchanged; error: Bash(cargo test parser) failed: error[E0308]: mismatched types; \
    tool: Read(src/parser.rs), Bash(cargo test parser) failed";
const RIGHT: &str = "user: use thiserror for the new error type; assistant: The root cause is \
    the tokenizer returning a &str instead of a String; tool: Edit(src/tokenizer.rs)";

#[test]
fn merge_of_lines_that_fit_is_their_concatenation() {
    let out = merge(" user: price stays at 49 ", "assistant: ok\n", 512);
    assert_eq!(out.text, "user: price stays at 49; assistant: ok");
    assert_eq!(
        Some(out.text.clone()),
        merge_verbatim("user: price stays at 49", "assistant: ok", 512)
    );
    assert_eq!(out.summarizer, "verbatim");
    assert_eq!(out.calls, 0);
    let exact = LEFT.len() + 2 + RIGHT.len();
    assert_eq!(merge(LEFT, RIGHT, exact).text, format!("{LEFT}; {RIGHT}"));
    let cut = merge(LEFT, RIGHT, exact - 1);
    assert_eq!(cut.summarizer, "extractive");
    assert!(cut.text.len() < exact, "{}", cut.text);
}

#[test]
fn merge_fits_the_budget_on_one_line_and_keeps_both_heads() {
    for max in (0..400).chain((400..1_000).step_by(37)) {
        let out = merge(LEFT, RIGHT, max).text;
        assert!(out.len() <= max, "{max}: {} bytes: {out}", out.len());
        assert!(!out.contains('\n'), "{max}: {out}");
        if max > 0 {
            assert!(!out.is_empty(), "{max}");
        }
        if max >= 60 {
            assert!(out.starts_with("user: Please fix"), "{max}: {out}");
            assert!(out.contains("; user: use thiserror"), "{max}: {out}");
        }
        assert_eq!(out, merge(LEFT, RIGHT, max).text, "deterministic");
    }
    // Two long lines get half the budget each; a short line is kept whole.
    let out = merge(LEFT, RIGHT, 120).text;
    let (l, r) = out.split_once("; user: use").unwrap();
    assert!(l.len() > 40 && r.len() > 30, "{out}");
    let out = merge("user: ship it", RIGHT, 80).text;
    assert!(
        out.starts_with("user: ship it; user: use thiserror"),
        "{out}"
    );
    assert!(
        out.len() >= 70,
        "the short line's leftover goes to the other: {out}"
    );
}

#[test]
fn merge_is_utf8_safe() {
    let left = "user: 日本語のテキストを要約してください ünïcödé wörds ".repeat(6);
    let right = "assistant: décidé — on garde 日本語 parce que ça compte ".repeat(6);
    for max in 0..600 {
        let out = merge(&left, &right, max).text;
        assert!(out.len() <= max, "{max}: {out}");
        assert!(!out.contains('\n'));
        if max >= 8 {
            assert!(!out.is_empty(), "{max}");
        }
        if max >= 80 {
            assert!(
                out.starts_with("user: 日本語") && out.contains("; assistant: décidé"),
                "{max}: {out}"
            );
        }
    }
}

#[tokio::test]
async fn merge_through_the_trait() {
    let s: std::sync::Arc<dyn Summarizer> = std::sync::Arc::new(ExtractiveSummarizer::new());
    let out = s
        .summarize(&SummaryRequest::merge(LEFT.into(), RIGHT.into(), 100))
        .await
        .unwrap();
    assert_eq!(out.summarizer, "extractive");
    assert!(out.text.len() <= 100 && out.text.starts_with("user: Please fix"));
    assert_eq!(Purpose::Merge.as_str(), "merge");
}
