//! The model backends against a local fake of each provider's HTTP API.

use std::time::{Duration, Instant};

use crate::fake_provider::*;
use clap::Parser;
use loupe::cli::{Cli, Command};
use loupe::summarize::{
    build, merge_verbatim, AnthropicSummarizer, Backend, ExtractiveSummarizer, OpenAiSummarizer,
    Purpose, SummarizeError, Summarizer, SummarizerConfig, SummaryRequest,
};

const KEY: &str = "sk-test-key";

fn config(backend: Backend, fake: &Fake) -> SummarizerConfig {
    let mut c = SummarizerConfig::new(backend);
    c.base_url = fake.base_url.clone();
    c.model = match backend {
        Backend::Openai => "gpt-test".into(),
        _ => "claude-test".into(),
    };
    c.api_key = Some(KEY.into());
    c.timeout = Duration::from_secs(5);
    c.backoff_base = Duration::from_millis(1);
    c.max_backoff = Duration::from_millis(20);
    c.max_retry_after = Duration::from_millis(60);
    c
}

fn compaction(entries: Vec<loupe::history::model::Entry>) -> SummaryRequest {
    SummaryRequest::new(entries, Purpose::Compaction, 8_000)
}

fn anthropic(fake: &Fake) -> AnthropicSummarizer {
    AnthropicSummarizer::new(config(Backend::Anthropic, fake))
}

fn openai(fake: &Fake) -> OpenAiSummarizer {
    OpenAiSummarizer::new(config(Backend::Openai, fake))
}

/// What the history must and must not look like once rendered for a model.
fn assert_rendered_transcript(body: &str) {
    for needle in [
        "Please fix the failing parser test",
        "use thiserror for the new error type",
        "[image]",
        "Read(src/parser.rs)",
        "Bash(cargo test parser)",
        "error[E0308]",
        "Edit(src/tokenizer.rs)",
    ] {
        assert!(body.contains(needle), "missing {needle:?} in {body}");
    }
    for banned in [
        "tool_use",
        "tool_result",
        "toolu_",
        "SECRET-THOUGHT",
        "signature",
        "iVBORw0KGgo",
        "uuid-",
        "msg_000",
        "\"type\"",
    ] {
        assert!(!body.contains(banned), "{banned:?} leaked into {body}");
    }
    let first = body.find("Please fix the failing parser test").unwrap();
    assert!(first < body.find("Read(src/parser.rs)").unwrap());
}

// ---------------------------------------------------------------------------------------------
// Anthropic

#[tokio::test]
async fn anthropic_success_sends_a_transcript_and_post_processes_the_reply() {
    let reply = "<analysis>\nscratch work\n</analysis>\n\n<summary>\n1. Primary Request and Intent:\n   Fix the parser.\n\n\n\n8. Current Work:\n   tokenizer\n</summary>";
    let fake = Fake::start(Some(KEY), vec![Step::Reply(reply.into())]).await;
    let mut req = compaction(session());
    req.instructions = Some("Focus on the tokenizer change.".into());
    let summary = anthropic(&fake).summarize(&req).await.unwrap();
    assert_eq!(
        summary.text,
        "1. Primary Request and Intent:\n   Fix the parser.\n\n8. Current Work:\n   tokenizer"
    );
    assert_eq!(summary.summarizer, "anthropic:claude-test");
    assert_eq!(summary.calls, 1);

    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let r = &requests[0];
    assert_eq!(r.body["model"], "claude-test");
    assert_eq!(r.body["max_tokens"], 8000);
    assert_eq!(r.body["messages"].as_array().unwrap().len(), 1);
    assert!(r.system_text().contains("summarizing conversations"));
    let user = r.user_text();
    assert_rendered_transcript(&r.body.to_string().replace("\\n", "\n"));
    assert!(user.contains("<analysis>") && user.contains("<summary>"));
    assert!(user.contains("All User Messages"));
    assert!(user.contains("Additional Instructions:\nFocus on the tokenizer change."));
    assert!(!user.contains("<previous_summary>"));
    // A meta message that is only a system reminder carries nothing for a summary.
    assert!(!user.contains("REMINDER-META"));
}

#[tokio::test]
async fn anthropic_rate_limit_honours_retry_after_then_succeeds() {
    let fake = Fake::start(Some(KEY), vec![Step::RateLimited(Some("1"))]).await;
    let started = Instant::now();
    let summary = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    // Retry-After: 1 s, capped at 60 ms by the test config; the backoff alone would be 1 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(summary.calls, 2);
    assert_eq!(summary.text, "SUMMARY-2");
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(
        fake.requests()[0].body,
        fake.requests()[1].body,
        "a retry resends the same body"
    );
}

#[tokio::test]
async fn anthropic_overloaded_529_is_retried() {
    let fake = Fake::start(Some(KEY), vec![Step::Status(529), Step::Status(503)]).await;
    let summary = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert_eq!(summary.calls, 3);
    assert_eq!(summary.text, "SUMMARY-3");
}

#[tokio::test]
async fn anthropic_repeated_500_ends_in_the_extractive_fallback() {
    let fake = Fake::start(Some(KEY), vec![Step::Status(500); 10]).await;
    let config = config(Backend::Anthropic, &fake);
    let summarizer = build(&config);
    let req = compaction(session());
    let summary = summarizer.summarize(&req).await.unwrap();
    assert_eq!(fake.requests().len(), 4, "max_attempts defaults to 4");
    assert_eq!(summary.calls, 4);
    assert!(
        summary.summarizer.starts_with(
            "fallback:extractive (anthropic:claude-test failed: server error (HTTP 500)"
        ),
        "{}",
        summary.summarizer
    );
    assert_eq!(
        summary.text,
        ExtractiveSummarizer::new().summarize_now(&req).text
    );
    assert!(summary.text.len() <= req.max_bytes);
    assert!(summary.text.contains("Please fix the failing parser test"));
}

#[tokio::test]
async fn anthropic_timeout_is_retried_and_then_gives_up() {
    let fake = Fake::start(Some(KEY), vec![Step::Sleep(Duration::from_millis(1500))]).await;
    let mut c = config(Backend::Anthropic, &fake);
    c.timeout = Duration::from_millis(300);
    let summary = AnthropicSummarizer::new(c.clone())
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert_eq!(summary.calls, 2);
    assert_eq!(summary.text, "SUMMARY-2");

    let fake = Fake::start(Some(KEY), vec![Step::Sleep(Duration::from_millis(1500)); 2]).await;
    c.base_url = fake.base_url.clone();
    c.max_attempts = 2;
    let err = AnthropicSummarizer::new(c)
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(matches!(err.root(), SummarizeError::Timeout(_)), "{err}");
    assert_eq!(err.calls(), 2);
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn anthropic_malformed_json_is_retried_once() {
    let fake = Fake::start(Some(KEY), vec![Step::Malformed]).await;
    let summary = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert_eq!(summary.calls, 2);

    let fake = Fake::start(Some(KEY), vec![Step::Malformed, Step::Malformed]).await;
    let err = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(
        matches!(err.root(), SummarizeError::Malformed(m) if m.contains("invalid JSON")),
        "{err}"
    );
    assert_eq!(
        err.calls(),
        2,
        "malformed replies are retried once, not max_attempts times"
    );
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn anthropic_reply_without_text_is_malformed() {
    let fake = Fake::start(Some(KEY), vec![Step::NoText, Step::NoText]).await;
    let err = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(
        matches!(err.root(), SummarizeError::Malformed(m) if m.contains("no text block")),
        "{err}"
    );

    // An answer with only an analysis block has no summary either.
    let fake = Fake::start(
        Some(KEY),
        vec![Step::Reply("<analysis>only thinking</analysis>".into()); 2],
    )
    .await;
    let err = anthropic(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(matches!(err.root(), SummarizeError::Malformed(_)), "{err}");
}

#[tokio::test]
async fn anthropic_client_errors_are_not_retried() {
    for status in [400u16, 401, 404] {
        let fake = Fake::start(Some(KEY), vec![Step::Status(status)]).await;
        let err = anthropic(&fake)
            .summarize(&compaction(session()))
            .await
            .unwrap_err();
        assert!(
            matches!(err.root(), SummarizeError::Rejected { status: s, message } if *s == status && message.contains("scripted failure")),
            "{err}"
        );
        assert_eq!(err.calls(), 1);
        assert_eq!(fake.requests().len(), 1);
    }
}

#[tokio::test]
async fn anthropic_without_a_key_makes_no_call_and_falls_back() {
    let fake = Fake::start(Some(KEY), vec![]).await;
    let mut c = config(Backend::Anthropic, &fake);
    c.api_key = None;
    let err = AnthropicSummarizer::new(c.clone())
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(matches!(err, SummarizeError::Config(_)));
    let summary = build(&c).summarize(&compaction(session())).await.unwrap();
    assert!(summary
        .summarizer
        .starts_with("fallback:extractive (anthropic:claude-test failed: configuration error"));
    assert_eq!(summary.calls, 0);
    assert!(fake.requests().is_empty());
}

/// A history of `n` exchanges with a unique needle in each user prompt.
fn long_history(n: usize) -> Vec<loupe::history::model::Entry> {
    let filler = "lorem ipsum dolor sit amet ".repeat(8);
    (0..n)
        .flat_map(|i| {
            [
                user(&format!("request needle-{i:03}: {filler}")),
                assistant(&format!("reply {i}: {filler}")),
            ]
        })
        .collect()
}

#[tokio::test]
async fn over_long_history_is_summarized_in_chunks_folding_the_previous_summary() {
    let fake = Fake::start(Some(KEY), vec![]).await;
    let mut c = config(Backend::Anthropic, &fake);
    c.max_input_bytes = 2_048;
    let history = long_history(30); // ~14 KB rendered
    let mut req = compaction(history);
    req.previous_summary = Some("EARLIER-SUMMARY of the first session".into());
    let summary = AnthropicSummarizer::new(c).summarize(&req).await.unwrap();

    let requests = fake.requests();
    let n = requests.len();
    assert!(n >= 6, "expected several calls, got {n}");
    assert_eq!(summary.calls as usize, n);
    assert_eq!(summary.text, format!("SUMMARY-{n}"));
    assert!(requests[0]
        .user_text()
        .contains("<previous_summary>\nEARLIER-SUMMARY of the first session\n</previous_summary>"));
    for (k, r) in requests.iter().enumerate().skip(1) {
        let user = r.user_text();
        assert!(
            user.contains(&format!(
                "<previous_summary>\nSUMMARY-{k}\n</previous_summary>"
            )),
            "call {} does not fold in the previous chunk's summary",
            k + 1
        );
        assert!(user.contains("fold it in"));
    }
    for r in &requests {
        let folded = r.user_text().find("<previous_summary>").map_or(0, |_| 20);
        assert!(
            r.transcript().len() + folded <= 2_048 + 20,
            "chunk too big: {}",
            r.transcript().len()
        );
    }
    // Nothing is lost: every prompt went to exactly one call, whole.
    for i in 0..30 {
        let needle = format!("request needle-{i:03}:");
        let count = requests
            .iter()
            .filter(|r| r.transcript().contains(&needle))
            .count();
        assert_eq!(count, 1, "{needle} sent {count} times");
    }
}

#[tokio::test]
async fn a_single_turn_longer_than_the_input_bound_is_split() {
    let fake = Fake::start(Some(KEY), vec![]).await;
    let mut c = config(Backend::Anthropic, &fake);
    c.max_input_bytes = 1_024;
    let big = (0..400)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let summary = AnthropicSummarizer::new(c)
        .summarize(&compaction(vec![user(&big)]))
        .await
        .unwrap();
    assert!(summary.calls >= 3, "{}", summary.calls);
    let sent: String = fake.requests().iter().map(|r| r.transcript()).collect();
    assert!(sent.contains("word0 ") && sent.contains("word399"));
}

#[tokio::test]
async fn line_purpose_uses_the_line_prompt_and_cuts_the_reply() {
    let long_reply = "user: fix the failing parser test, keep the public API unchanged; \n error: cargo test failed with mismatched types in src/parser.rs; assistant: root cause is the tokenizer returning &str; tool: Read(src/parser.rs), Bash(cargo test parser), Edit(src/tokenizer.rs) and many more words that go past the limit";
    let fake = Fake::start(Some(KEY), vec![Step::Reply(long_reply.into())]).await;
    let req = SummaryRequest::new(session(), Purpose::Line, 160);
    let summary = anthropic(&fake).summarize(&req).await.unwrap();
    assert!(summary.text.len() <= 160, "{}", summary.text.len());
    assert!(!summary.text.contains('\n'));
    assert!(summary
        .text
        .starts_with("user: fix the failing parser test"));
    assert!(summary.text.ends_with('…'));
    let cut = summary.text.trim_end_matches('…');
    assert!(
        long_reply.replace("\n ", "").contains(cut) || long_reply.contains(cut),
        "{cut}"
    );

    let r = &fake.requests()[0];
    let user = r.user_text();
    assert!(user.contains("Write ONE line of at most 160 bytes"));
    assert!(user.contains(&"-".repeat(160)), "the ruler shows the size");
    assert!(user.contains("The user's own words"));
    assert!(r.system_text().contains("never answer, obey"));
    assert!(r.body["max_tokens"].as_u64().unwrap() <= 4096);
    assert_rendered_transcript(&r.body.to_string().replace("\\n", "\n"));
}

#[tokio::test]
async fn a_line_whose_source_fits_needs_no_model_call() {
    let fake = Fake::start(Some(KEY), vec![]).await;
    let req = SummaryRequest::new(
        vec![user("price stays at 49\nno discounts")],
        Purpose::Line,
        512,
    );
    let summary = anthropic(&fake).summarize(&req).await.unwrap();
    assert_eq!(summary.text, "price stays at 49 no discounts");
    assert_eq!(summary.summarizer, "verbatim");
    assert_eq!(summary.calls, 0);
    assert!(fake.requests().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Merge: two summary-tree lines into their parent's

const LEFT: &str = "user: Please fix the failing parser test in src/parser.rs, and keep the \
    public API unchanged; error: Bash(cargo test parser) failed: error[E0308]: mismatched types";
const RIGHT: &str = "user: use thiserror for the new error type; assistant: The root cause is \
    the tokenizer returning a &str instead of a String; tool: Edit(src/tokenizer.rs)";

fn merge_request(max: usize) -> SummaryRequest {
    SummaryRequest::merge(LEFT.into(), RIGHT.into(), max)
}

const MERGE_REPLY: &str = "Line: user: fix the failing parser test, keep the public API; \n\
    error: cargo test parser failed, mismatched types; user: use thiserror; assistant: root cause \
    is the tokenizer returning &str; tool: Edit(src/tokenizer.rs) and many more words past the limit";

/// What a Merge prompt must look like: both lines, in order, in `<line>` tags, no node ids.
fn assert_merge_prompt(r: &Recorded, max: usize) {
    let user = r.user_text();
    let left = user
        .find(&format!("<line>\n{LEFT}\n</line>"))
        .unwrap_or_else(|| panic!("left line missing: {user}"));
    let right = user
        .find(&format!("<line>\n{RIGHT}\n</line>"))
        .unwrap_or_else(|| panic!("right line missing: {user}"));
    assert!(left < right, "lines out of order");
    assert!(!user.contains('+'), "an id leaked into {user}");
    assert!(!user.contains("<transcript>"));
    assert!(user.contains(&format!("Write ONE line of at most {max} bytes")));
    assert!(user.contains(&"-".repeat(max)), "the ruler shows the size");
    assert!(user.contains("The user's own words"));
    assert!(user.contains("Never drop an item entirely"));
    assert!(r.system_text().contains("never answer, obey"));
}

fn assert_merged_line(text: &str, max: usize) {
    assert!(text.len() <= max, "{} bytes: {text}", text.len());
    assert!(!text.contains('\n'), "{text}");
    assert!(
        text.starts_with("user: fix the failing parser test"),
        "{text}"
    );
    assert!(text.ends_with('…'), "{text}");
}

#[tokio::test]
async fn anthropic_merge_sends_both_lines_and_cuts_the_reply() {
    let fake = Fake::start(Some(KEY), vec![Step::Reply(MERGE_REPLY.into())]).await;
    let summary = anthropic(&fake)
        .summarize(&merge_request(120))
        .await
        .unwrap();
    assert_merged_line(&summary.text, 120);
    assert_eq!(summary.summarizer, "anthropic:claude-test");
    assert_eq!(summary.calls, 1);
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    assert_merge_prompt(&requests[0], 120);
    assert!(requests[0].body["max_tokens"].as_u64().unwrap() <= 4096);
}

#[tokio::test]
async fn openai_merge_sends_both_lines_and_cuts_the_reply() {
    let fake = Fake::start(Some(KEY), vec![Step::Reply(MERGE_REPLY.into())]).await;
    let summary = openai(&fake).summarize(&merge_request(100)).await.unwrap();
    assert_merged_line(&summary.text, 100);
    assert_eq!(summary.summarizer, "openai:gpt-test");
    assert_eq!(summary.calls, 1);
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_merge_prompt(&requests[0], 100);
}

#[tokio::test]
async fn a_merge_whose_lines_fit_needs_no_model_call() {
    let max = LEFT.len() + 2 + RIGHT.len();
    let expected = merge_verbatim(LEFT, RIGHT, max).unwrap();
    let fake = Fake::start(Some(KEY), vec![]).await;
    let backends: Vec<Box<dyn Summarizer>> = vec![
        Box::new(anthropic(&fake)),
        Box::new(openai(&fake)),
        Box::new(ExtractiveSummarizer::new()),
    ];
    for backend in &backends {
        let summary = backend.summarize(&merge_request(max)).await.unwrap();
        assert_eq!(summary.text, expected, "{}", backend.name());
        assert_eq!(summary.summarizer, "verbatim", "{}", backend.name());
        assert_eq!(summary.calls, 0, "{}", backend.name());
    }
    for backend in [Backend::Anthropic, Backend::Openai] {
        let summary = build(&config(backend, &fake))
            .summarize(&merge_request(max))
            .await
            .unwrap();
        assert_eq!(summary.text, expected);
        assert_eq!(summary.summarizer, "verbatim");
        assert_eq!(summary.calls, 0);
    }
    assert!(fake.requests().is_empty(), "{:?}", fake.requests().len());
}

#[tokio::test]
async fn a_failed_merge_falls_back_to_the_extractive_merge() {
    let fake = Fake::start(Some(KEY), vec![Step::Status(500); 10]).await;
    let mut c = config(Backend::Anthropic, &fake);
    c.max_attempts = 2;
    let req = merge_request(120);
    let summary = build(&c).summarize(&req).await.unwrap();
    assert_eq!(summary.calls, 2);
    assert_eq!(fake.requests().len(), 2);
    assert_merge_prompt(&fake.requests()[0], 120);
    assert!(
        summary
            .summarizer
            .starts_with("fallback:extractive (anthropic:claude-test failed: server error"),
        "{}",
        summary.summarizer
    );
    assert_eq!(
        summary.text,
        ExtractiveSummarizer::new().summarize_now(&req).text
    );
    assert!(summary.text.len() <= 120 && !summary.text.contains('\n'));
    assert!(
        summary.text.starts_with("user: Please fix"),
        "{}",
        summary.text
    );
    assert!(
        summary.text.contains("; user: use thiserror"),
        "{}",
        summary.text
    );
}

// ---------------------------------------------------------------------------------------------
// OpenAI

#[tokio::test]
async fn openai_success_sends_bearer_and_chat_messages() {
    let fake = Fake::start(Some(KEY), vec![]).await;
    let summary = openai(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert_eq!(summary.text, "SUMMARY-1");
    assert_eq!(summary.summarizer, "openai:gpt-test");
    assert_eq!(summary.calls, 1);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let r = &fake.requests()[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.body["model"], "gpt-test");
    let messages = r.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[1]["role"], "user");
    assert!(
        r.body.get("max_tokens").is_none(),
        "not sent unless configured"
    );
    assert_rendered_transcript(&r.body.to_string().replace("\\n", "\n"));
}

#[tokio::test]
async fn openai_rate_limit_with_retry_after_ms() {
    let fake = Fake::start(
        Some(KEY),
        vec![Step::RateLimitedMs("40"), Step::RateLimited(None)],
    )
    .await;
    let started = Instant::now();
    let summary = openai(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(40));
    assert_eq!(summary.calls, 3);
    assert_eq!(summary.text, "SUMMARY-3");
}

#[tokio::test]
async fn openai_repeated_500_ends_in_the_extractive_fallback() {
    let fake = Fake::start(Some(KEY), vec![Step::Status(500); 10]).await;
    let mut c = config(Backend::Openai, &fake);
    c.max_attempts = 3;
    let req = SummaryRequest::new(session(), Purpose::Line, 256);
    let summary = build(&c).summarize(&req).await.unwrap();
    assert_eq!(summary.calls, 3);
    assert_eq!(fake.requests().len(), 3);
    assert!(
        summary
            .summarizer
            .starts_with("fallback:extractive (openai:gpt-test failed: server error (HTTP 500)"),
        "{}",
        summary.summarizer
    );
    assert!(summary.text.len() <= 256 && !summary.text.contains('\n'));
    assert!(
        summary.text.starts_with("user: Please fix"),
        "{}",
        summary.text
    );
}

#[tokio::test]
async fn openai_malformed_and_null_content_are_errors() {
    let fake = Fake::start(Some(KEY), vec![Step::Malformed, Step::NoText]).await;
    let err = openai(&fake)
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(
        matches!(err.root(), SummarizeError::Malformed(m) if m.contains("no text content")),
        "{err}"
    );
    assert_eq!(err.calls(), 2);
}

#[tokio::test]
async fn openai_compatible_local_server_without_key() {
    let fake = Fake::start(None, vec![]).await;
    let mut c = config(Backend::Openai, &fake);
    c.api_key = None;
    c.base_url = format!("{}/v1/", fake.base_url);
    c.max_output_tokens = Some(1234);
    let summary = OpenAiSummarizer::new(c)
        .summarize(&compaction(session()))
        .await
        .unwrap();
    assert_eq!(summary.text, "SUMMARY-1");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let r = &fake.requests()[0];
    assert!(r.headers.get("authorization").is_none());
    assert_eq!(r.body["max_tokens"], 1234);
}

#[tokio::test]
async fn unreachable_server_is_a_transport_error_then_fallback() {
    // Bind and drop a listener to get a port with nothing on it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = SummarizerConfig::new(Backend::Openai);
    c.base_url = format!("http://127.0.0.1:{port}");
    c.max_attempts = 2;
    c.backoff_base = Duration::from_millis(1);
    let err = OpenAiSummarizer::new(c.clone())
        .summarize(&compaction(session()))
        .await
        .unwrap_err();
    assert!(matches!(err.root(), SummarizeError::Transport(_)), "{err}");
    assert_eq!(err.calls(), 2);
    let summary = build(&c).summarize(&compaction(session())).await.unwrap();
    assert!(summary
        .summarizer
        .starts_with("fallback:extractive (openai:gpt-4o-mini failed: transport error"));
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// The summarizer configuration `loupe serve ARGS` makes, with `provider_keys` as the provider
/// key variables of the environment.
fn configured(
    args: &[&str],
    provider_keys: &[(&str, &str)],
) -> Result<SummarizerConfig, clap::Error> {
    let cli = Cli::try_parse_from(["loupe", "serve"].iter().chain(args))?;
    let Some(Command::Serve(serve)) = cli.command else {
        panic!("`loupe serve` parses as serve")
    };
    let keys: Vec<(String, String)> = provider_keys
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(serve
        .summarizer
        .config(|name| keys.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())))
}

#[test]
fn config_defaults_to_extractive() {
    let c = configured(&[], &[]).unwrap();
    assert_eq!(c.backend, Backend::Extractive);
    assert_eq!(c.timeout, Duration::from_secs(60));
    assert_eq!(c.max_attempts, 4);
    assert_eq!(c.max_input_bytes, 400_000);
    assert_eq!(build(&c).name(), "extractive");
}

#[test]
fn config_reads_provider_settings_and_keys() {
    let c = configured(
        &[
            "--summarizer",
            "anthropic",
            "--summarizer-timeout-secs",
            "5",
            "--summarizer-max-attempts",
            "2",
            "--summarizer-max-input-bytes",
            "50000",
        ],
        &[
            ("ANTHROPIC_API_KEY", "sk-ant"),
            ("OPENAI_API_KEY", "sk-oai"),
        ],
    )
    .unwrap();
    assert_eq!(c.backend, Backend::Anthropic);
    assert_eq!(c.base_url, "https://api.anthropic.com");
    assert_eq!(c.api_key.as_deref(), Some("sk-ant"));
    assert_eq!(c.timeout, Duration::from_secs(5));
    assert_eq!(c.max_attempts, 2);
    assert_eq!(c.max_input_bytes, 50_000);
    assert!(
        !format!("{c:?}").contains("sk-ant"),
        "Debug redacts the key"
    );
    assert_eq!(
        build(&c).name(),
        "anthropic:claude-haiku-4-5|fallback:extractive"
    );

    let c = configured(
        &[
            "--summarizer",
            "OpenAI",
            "--summarizer-api-key",
            "sk-loupe",
            "--summarizer-base-url",
            "http://localhost:8080/v1",
            "--summarizer-model",
            "qwen3",
        ],
        &[("OPENAI_API_KEY", "sk-oai")],
    )
    .unwrap();
    assert_eq!(c.backend, Backend::Openai);
    assert_eq!(c.api_key.as_deref(), Some("sk-loupe"), "the Loupe key wins");
    assert_eq!(c.base_url, "http://localhost:8080/v1");
    assert_eq!(c.model, "qwen3");
}

#[test]
fn config_rejects_bad_values() {
    for arg in [
        "--summarizer=gemini",
        "--summarizer-timeout-secs=soon",
        "--summarizer-max-attempts=-1",
        "--summarizer-base-url=api.openai.com",
        "--summarizer-max-input-bytes=10",
    ] {
        let err = configured(&[arg], &[]).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{arg}: {err}"
        );
    }
}

#[test]
fn serve_help_lists_every_summarizer_variable() {
    let mut command = <Cli as clap::CommandFactory>::command();
    let help = command
        .find_subcommand_mut("serve")
        .expect("a serve subcommand")
        .render_long_help()
        .to_string();
    for variable in [
        "LOUPE_SUMMARIZER",
        "LOUPE_SUMMARIZER_BASE_URL",
        "LOUPE_SUMMARIZER_MODEL",
        "LOUPE_SUMMARIZER_API_KEY",
        "LOUPE_SUMMARIZER_TIMEOUT_SECS",
        "LOUPE_SUMMARIZER_MAX_ATTEMPTS",
        "LOUPE_SUMMARIZER_BACKOFF_BASE_MS",
        "LOUPE_SUMMARIZER_MAX_INPUT_BYTES",
        "LOUPE_SUMMARIZER_MAX_OUTPUT_TOKENS",
    ] {
        assert!(
            help.contains(&format!("env: {variable}="))
                || help.contains(&format!("env: {variable}]")),
            "{variable} missing from `loupe serve --help`"
        );
    }
}
