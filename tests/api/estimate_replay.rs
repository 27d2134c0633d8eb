//! A held-out replay of the context token estimate (issue 36): simulated Claude Code sessions
//! are appended to threads one request at a time, and before each response that reports `usage`
//! the context read's `context_tokens` is compared with the prompt that response reports.
//!
//! The provider is simulated with real BPE tokenizers and a system prompt (plus tools) the
//! service never sees, so the figures measure what a client meets: `sim-sonnet` counts with
//! cl100k_base behind a 14,000-token overhead, `sim-haiku` with o200k_base behind 9,000; each
//! session moves its overhead by up to 3% (another project, another system prompt). A request's
//! prompt is that overhead plus, for each message since the last compact boundary, 4 framing
//! tokens and its blocks (text and thinking as their text, a tool call as its name and JSON input
//! plus 8, a tool result as its text plus 6); the response's `usage` splits it into a few input
//! tokens, the previous prompt read from the cache and the rest written to it. About 1% of the
//! requests carry context the client added and never stored: those cuts are unexplainable, and
//! listed apart.
//!
//! The synthetic replay runs in the suite and asserts the goals on its fixed data:
//! anchored p95 |error| at most 2%, content-only median at most 15%, and `upper_tokens` at least
//! the prompt on 95% of the explainable cuts (`-- --nocapture` prints the figures). The fixtures'
//! usage is hand-made: that replay only reports, by hand (`cargo test --test api estimate_replay
//! -- --ignored --nocapture`).

use std::sync::LazyLock;

use crate::common::{Backend, TestApp};
use axum::http::StatusCode;
use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;

on_both_backends!(simulated_sessions_meet_the_goals);
ignored_on_both_backends!("a report on hand-made usage, run by hand": fixture_transcripts_report);

const SESSIONS: usize = 30;

/// The context size at which a simulated client compacts before its next prompt.
const AUTO_COMPACT_TOKENS: u64 = 160_000;

/// The goals of issue 36 on the simulated sessions.
const ANCHORED_P95_GOAL: f64 = 0.02;
const CONTENT_MEDIAN_GOAL: f64 = 0.15;
const UPPER_COVERAGE_GOAL: f64 = 0.95;

async fn simulated_sessions_meet_the_goals(app: TestApp) {
    let label = backend_label(app.backend);
    let mut cuts = Vec::new();
    for (i, session) in SIMULATED.iter().enumerate() {
        let thread = app.thread(&format!("sim-{i:02}")).await;
        let mut pending: Vec<&Value> = Vec::new();
        for event in &session.events {
            match event {
                Event::Store(entry) => pending.push(entry),
                Event::Call(call) => {
                    if !pending.is_empty() {
                        app.append(&thread, &pending).await;
                        pending.clear();
                    }
                    let mut cut = measure(&app, &thread, call.prompt).await;
                    cut.label = format!("sim-{i:02} call {}", call.index);
                    cut.injected = call.injected;
                    cut.switched = call.switched;
                    cuts.push(cut);
                    pending.push(&call.entry);
                }
            }
        }
        if !pending.is_empty() {
            app.append(&thread, &pending).await;
        }
    }
    let bytes: usize = SIMULATED.iter().map(|s| s.bytes).sum();
    eprintln!(
        "[{label}] {SESSIONS} simulated sessions, {:.1} MB of entries",
        bytes as f64 / 1e6
    );
    let figures = Figures::report(&label, &cuts);
    let mut missed = Vec::new();
    if figures.anchored_p95 > ANCHORED_P95_GOAL {
        missed.push(format!(
            "anchored p95 |err| {} > {}",
            pct(figures.anchored_p95),
            pct(ANCHORED_P95_GOAL)
        ));
    }
    if figures.content_median > CONTENT_MEDIAN_GOAL {
        missed.push(format!(
            "content-only median |err| {} > {}",
            pct(figures.content_median),
            pct(CONTENT_MEDIAN_GOAL)
        ));
    }
    let coverage = figures.upper_coverage.expect("upper_tokens is answered");
    if coverage < UPPER_COVERAGE_GOAL {
        missed.push(format!(
            "upper_tokens >= prompt on {} of the explainable cuts < {}",
            pct(coverage),
            pct(UPPER_COVERAGE_GOAL)
        ));
    }
    assert!(missed.is_empty(), "[{label}] goals missed: {missed:#?}");
    app.finish().await;
}

/// The real Claude Code transcripts of `tests/fixtures/claude-code/*.jsonl`, by file stem.
fn fixtures() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/claude-code");
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// The same comparison over the real transcripts: each request's thread holds the lines before
/// it, imported as they are (a sub-agent's lines go to its own thread).
async fn fixture_transcripts_report(app: TestApp) {
    let label = backend_label(app.backend);
    let mut cuts = Vec::new();
    for (name, text) in fixtures() {
        let lines: Vec<&str> = text.lines().collect();
        let entries: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut last_id = Value::Null;
        for (i, entry) in entries.iter().enumerate() {
            let message = &entry["message"];
            if entry["type"] != "assistant"
                || entry["isApiErrorMessage"] == true
                || message["model"] == "<synthetic>"
            {
                continue;
            }
            let first_of_response = message["id"] != last_id || message["id"].is_null();
            last_id = message["id"].clone();
            let prompt = prompt_of(&message["usage"]);
            if !first_of_response || prompt == 0 {
                continue;
            }
            let thread = app.thread(&format!("{name}-{i}")).await;
            let body: String = lines[..i].iter().map(|l| format!("{l}\n")).collect();
            app.import(&thread, &body).await;
            let read_from = match entry["agentId"].as_str() {
                Some(agent) if entry["isSidechain"] == true => format!("{thread}.agent-{agent}"),
                _ => thread,
            };
            let mut cut = measure(&app, &read_from, prompt).await;
            cut.label = format!("{name}.jsonl line {}", i + 1);
            cuts.push(cut);
        }
    }
    eprintln!("[{label}] the fixtures' transcripts (hand-made usage: a report, no goal)");
    Figures::report(&label, &cuts);
    for cut in &cuts {
        eprintln!(
            "  {}: {:?} {} (upper {})",
            cut.label,
            cut.basis,
            signed_pct(cut.err),
            cut.upper_err.map_or("absent".to_owned(), signed_pct)
        );
    }
    app.finish().await;
}

fn backend_label(backend: Backend) -> String {
    format!("{backend:?}").to_lowercase()
}

/// What a response's `usage` says its prompt was: input, cache writes and cache reads.
fn prompt_of(usage: &Value) -> u64 {
    [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|f| usage[f].as_u64().unwrap_or(0))
    .sum()
}

// ---------------------------------------------------------------------------------------------
// The measurement and its figures.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Basis {
    Usage,
    Content,
}

/// One held-out comparison: the estimate before a request against the prompt it reported.
struct Cut {
    label: String,
    basis: Basis,
    /// (estimate − prompt) / prompt.
    err: f64,
    /// (upper − prompt) / prompt, when `upper_tokens` is answered.
    upper_err: Option<f64>,
    /// Tokens the client sent and never stored (0 for an explainable cut).
    injected: u64,
    /// The first request after the session moved to another model.
    switched: bool,
}

async fn measure(app: &TestApp, thread: &str, prompt: u64) -> Cut {
    let context = app
        .get(&format!("/v1/threads/{thread}/context?provider=anthropic"))
        .await;
    assert_eq!(context.status, StatusCode::OK, "{}", context.body);
    let read = &context.body["context_tokens"];
    let relative = |tokens: u64| (tokens as f64 - prompt as f64) / prompt as f64;
    Cut {
        label: String::new(),
        basis: match read["basis"].as_str() {
            Some("usage") => Basis::Usage,
            Some("content") => Basis::Content,
            other => panic!("basis {other:?}: {read}"),
        },
        err: relative(read["tokens"].as_u64().expect("context_tokens.tokens")),
        upper_err: read["upper_tokens"].as_u64().map(relative),
        injected: 0,
        switched: false,
    }
}

/// The figures the goals are about.
struct Figures {
    anchored_p95: f64,
    content_median: f64,
    upper_coverage: Option<f64>,
}

impl Figures {
    /// Prints the figures of `cuts` and returns those the goals read.
    fn report(label: &str, cuts: &[Cut]) -> Figures {
        let of = |basis| cuts.iter().filter(move |c| c.basis == basis);
        let anchored = sorted_abs(of(Basis::Usage).map(|c| c.err));
        let content = sorted_abs(of(Basis::Content).map(|c| c.err));
        let unexplainable: Vec<&Cut> = cuts.iter().filter(|c| c.injected > 0).collect();
        eprintln!(
            "[{label}] {} cuts: {} anchored, {} content-only, {} unexplainable",
            cuts.len(),
            anchored.len(),
            content.len(),
            unexplainable.len()
        );
        let signed = |basis| median(&sorted(of(basis).map(|c| c.err)));
        eprintln!(
            "  anchored |err|: median {}, p90 {}, p95 {}, p99 {}, max {} (signed median {})",
            pct(median(&anchored)),
            pct(quantile(&anchored, 0.90)),
            pct(quantile(&anchored, 0.95)),
            pct(quantile(&anchored, 0.99)),
            pct(anchored.last().copied().unwrap_or(f64::NAN)),
            signed_pct(signed(Basis::Usage)),
        );
        let explainable = sorted_abs(of(Basis::Usage).filter(|c| c.injected == 0).map(|c| c.err));
        eprintln!(
            "  anchored, explainable only: p95 {}, p99 {}",
            pct(quantile(&explainable, 0.95)),
            pct(quantile(&explainable, 0.99))
        );
        for cut in &unexplainable {
            eprintln!(
                "  unexplainable: {} ({} tokens injected, {:?}): {}",
                cut.label,
                cut.injected,
                cut.basis,
                signed_pct(cut.err)
            );
        }
        for cut in cuts.iter().filter(|c| c.switched) {
            eprintln!(
                "  after a model switch: {} ({:?}): {}",
                cut.label,
                cut.basis,
                signed_pct(cut.err)
            );
        }
        eprintln!(
            "  content-only |err|: median {}, p90 {} (signed median {})",
            pct(median(&content)),
            pct(quantile(&content, 0.90)),
            signed_pct(signed(Basis::Content)),
        );
        let uppers: Vec<f64> = cuts
            .iter()
            .filter(|c| c.injected == 0)
            .filter_map(|c| c.upper_err)
            .collect();
        let upper_coverage = (!uppers.is_empty()).then(|| {
            let covered = uppers.iter().filter(|e| **e >= 0.0).count() as f64;
            let overshoot = sorted(uppers.iter().copied());
            let coverage = covered / uppers.len() as f64;
            eprintln!(
                "  upper_tokens >= prompt: {} of {} explainable cuts; median overshoot {}",
                pct(coverage),
                uppers.len(),
                signed_pct(median(&overshoot))
            );
            coverage
        });
        if upper_coverage.is_none() {
            eprintln!("  upper_tokens: not answered");
        }
        Figures {
            anchored_p95: quantile(&anchored, 0.95),
            content_median: median(&content),
            upper_coverage,
        }
    }
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

fn sorted_abs(values: impl Iterator<Item = f64>) -> Vec<f64> {
    sorted(values.map(f64::abs))
}

/// The nearest-rank quantile of sorted values (NaN when there are none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len().max(1)) - 1)
        .copied()
        .unwrap_or(f64::NAN)
}

fn median(sorted: &[f64]) -> f64 {
    quantile(sorted, 0.5)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn signed_pct(x: f64) -> String {
    format!("{:+.2}%", x * 100.0)
}

// ---------------------------------------------------------------------------------------------
// The simulated provider.

struct SimModel {
    name: &'static str,
    /// The system prompt and tools, in tokens, before a session's variation.
    overhead: u64,
    bpe: fn() -> &'static CoreBPE,
}

const MODELS: [SimModel; 2] = [
    SimModel {
        name: "sim-sonnet",
        overhead: 14_000,
        bpe: tiktoken_rs::cl100k_base_singleton,
    },
    SimModel {
        name: "sim-haiku",
        overhead: 9_000,
        bpe: tiktoken_rs::o200k_base_singleton,
    },
];

impl SimModel {
    fn tokens(&self, text: &str) -> u64 {
        (self.bpe)().encode_ordinary(text).len() as u64
    }

    fn block_tokens(&self, block: &Value) -> u64 {
        let text = |field: &str| self.tokens(block[field].as_str().unwrap_or(""));
        match block["type"].as_str() {
            Some("text") => text("text"),
            Some("thinking") => text("thinking"),
            Some("tool_use") => text("name") + self.tokens(&block["input"].to_string()) + 8,
            Some("tool_result") => self.content_tokens(&block["content"]) + 6,
            other => panic!("the simulation sends no {other:?} block"),
        }
    }

    fn content_tokens(&self, content: &Value) -> u64 {
        match content {
            Value::String(text) => self.tokens(text),
            Value::Array(blocks) => blocks.iter().map(|b| self.block_tokens(b)).sum(),
            _ => 0,
        }
    }

    /// A message as the provider counts it: 4 framing tokens and its content.
    fn message_tokens(&self, content: &Value) -> u64 {
        4 + self.content_tokens(content)
    }
}

// ---------------------------------------------------------------------------------------------
// The simulated sessions.

/// Generated once per process: both backends replay the same sessions.
static SIMULATED: LazyLock<Vec<Session>> =
    LazyLock::new(|| (0..SESSIONS).map(Session::generate).collect());

struct Session {
    events: Vec<Event>,
    /// The bytes of its stored entries.
    bytes: usize,
}

enum Event {
    /// An entry no response reports usage for: stored with the next append.
    Store(Value),
    /// An assistant entry whose `usage` reports `prompt`: the cut comes before it is stored.
    Call(Call),
}

struct Call {
    entry: Value,
    prompt: u64,
    /// The call's number in its session.
    index: usize,
    injected: u64,
    switched: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    English,
    Japanese,
    Chinese,
}

/// The state of one simulated client and provider.
struct Sim {
    rng: Rng,
    lang: Lang,
    model: usize,
    /// Each model's overhead for this session's project.
    overhead: [u64; 2],
    /// The tokens of the messages since the last boundary, as the current model counts them.
    window_tokens: u64,
    /// The messages since the last boundary (recounted when the model changes).
    window: Vec<Value>,
    /// Context the client sent and never stored, until the next boundary.
    hidden: u64,
    /// The previous prompt, while the provider's cache holds it.
    cached: Option<u64>,
    switched: bool,
    calls: usize,
    parent: Value,
    session_id: String,
    day: usize,
    seconds: u64,
    events: Vec<Event>,
}

impl Session {
    fn generate(index: usize) -> Session {
        let mut rng = Rng::new(index as u64 + 1);
        let lang = match index % 5 {
            3 if index.is_multiple_of(2) => Lang::Japanese,
            3 => Lang::Chinese,
            _ => Lang::English,
        };
        let variation = 0.97 + 0.06 * rng.unit();
        let overhead = MODELS.map(|m| (m.overhead as f64 * variation).round() as u64);
        let rounds = rng.range(20, 81);
        // A third of the sessions compact once or twice; a quarter move to the smaller model.
        let compactions: Vec<usize> = match index % 3 {
            1 => (0..rng.range(1, 3)).map(|_| rng.range(5, rounds)).collect(),
            _ => Vec::new(),
        };
        let switch_at = (index % 4 == 2).then(|| rng.range(rounds / 3, 2 * rounds / 3));
        let session_id = rng.uuid();
        let mut sim = Sim {
            rng,
            lang,
            model: 0,
            overhead,
            window_tokens: 0,
            window: Vec::new(),
            hidden: 0,
            cached: None,
            switched: false,
            calls: 0,
            parent: Value::Null,
            session_id,
            day: index % 28 + 1,
            seconds: 9 * 3600,
            events: Vec::new(),
        };
        for round in 0..rounds {
            if compactions.contains(&round) {
                sim.compact();
            }
            if switch_at == Some(round) {
                sim.switch_model();
            }
            sim.round();
        }
        let bytes = sim
            .events
            .iter()
            .map(|e| match e {
                Event::Store(entry) | Event::Call(Call { entry, .. }) => entry.to_string().len(),
            })
            .sum();
        Session {
            events: sim.events,
            bytes,
        }
    }
}

impl Sim {
    fn model(&self) -> &'static SimModel {
        &MODELS[self.model]
    }

    /// An entry with the fields Claude Code writes on every line, chained to the previous one.
    fn stamp(&mut self, kind: &str, fields: Value) -> Value {
        self.seconds += self.rng.range(1, 20) as u64;
        let uuid = self.rng.uuid();
        let s = self.seconds;
        let mut entry = json!({
            "parentUuid": self.parent, "sessionId": self.session_id, "type": kind, "uuid": uuid,
            "timestamp": format!("2026-03-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                self.day, s / 3600 % 24, s / 60 % 60, s % 60, self.rng.below(1000)),
        });
        entry
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        self.parent = json!(uuid);
        entry
    }

    fn store(&mut self, kind: &str, fields: Value) {
        let entry = self.stamp(kind, fields);
        self.events.push(Event::Store(entry));
    }

    /// A user entry: sent to the model from now on.
    fn user(&mut self, content: Value, fields: Value) {
        self.window_tokens += self.model().message_tokens(&content);
        let mut all = json!({"message": {"role": "user", "content": content}});
        all.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        self.window.push(content);
        self.store("user", all);
    }

    /// A request and its response: the prompt is counted, and the response's usage says so.
    fn call(&mut self, content: Vec<Value>) {
        let injected = if self.rng.below(100) == 0 {
            self.rng.range(2_000, 40_001) as u64
        } else {
            0
        };
        self.hidden += injected;
        let model = self.model();
        let prompt = self.overhead[self.model] + self.window_tokens + self.hidden;
        let content = Value::Array(content);
        let output = model.message_tokens(&content);
        let input = self.rng.range(3, 11) as u64;
        let read = self.cached.unwrap_or(0).min(prompt - input);
        let stop = if content.as_array().unwrap().last().unwrap()["type"] == "tool_use" {
            "tool_use"
        } else {
            "end_turn"
        };
        let id = format!("msg_01{}", self.rng.hex(22));
        let entry = self.stamp(
            "assistant",
            json!({"message": {"model": model.name, "id": id, "role": "assistant",
                "content": content, "stop_reason": stop, "usage": {"input_tokens": input,
                    "cache_creation_input_tokens": prompt - input - read,
                    "cache_read_input_tokens": read, "output_tokens": output}}}),
        );
        self.events.push(Event::Call(Call {
            entry,
            prompt,
            index: self.calls,
            injected,
            switched: std::mem::take(&mut self.switched),
        }));
        self.calls += 1;
        self.cached = Some(prompt);
        self.window_tokens += output;
        self.window.push(content);
    }

    fn progress(&mut self, tool_id: &str) {
        let line = command_line(&mut self.rng);
        let fields = json!({"data": {"type": "bash_progress", "output": line, "fullOutput": line,
            "elapsedTimeSeconds": self.rng.range(1, 30), "totalLines": 1},
            "toolUseID": format!("bash-progress-{}", self.rng.below(100)),
            "parentToolUseID": tool_id});
        self.store("progress", fields);
    }

    /// A client-side compaction: a boundary, then a summary the next requests start from.
    fn compact(&mut self) {
        let pre_tokens = self.overhead[self.model] + self.window_tokens + self.hidden;
        let logical_parent = std::mem::replace(&mut self.parent, Value::Null);
        self.store(
            "system",
            json!({"subtype": "compact_boundary", "content": "Conversation compacted",
                "isMeta": false, "level": "info",
                "compactMetadata": {"trigger": "auto", "preTokens": pre_tokens},
                "logicalParentUuid": logical_parent}),
        );
        self.window.clear();
        (self.window_tokens, self.hidden, self.cached) = (0, 0, None);
        let summary = format!(
            "This session is being continued from a previous conversation that ran out of \
             context. The conversation is summarized below:\n{}",
            prose(&mut self.rng, self.lang, 800, 4_000)
        );
        self.user(
            json!(summary),
            json!({"isCompactSummary": true, "isVisibleInTranscriptOnly": true}),
        );
    }

    /// The rest of the session runs on the other model: its cache starts empty, and it counts
    /// the window with its own tokenizer.
    fn switch_model(&mut self) {
        self.model = 1;
        let model = self.model();
        self.window_tokens = self.window.iter().map(|c| model.message_tokens(c)).sum();
        self.cached = None;
        self.switched = true;
    }

    /// A prompt, a tool loop and a final answer; compacted first when the context nears the
    /// window, as Claude Code does.
    fn round(&mut self) {
        if self.overhead[self.model] + self.window_tokens + self.hidden > AUTO_COMPACT_TOKENS {
            self.compact();
        }
        let prompt = prose(&mut self.rng, self.lang, 30, 600);
        self.user(json!(prompt), json!({}));
        let steps = if self.rng.below(10) == 0 {
            self.rng.range(3, 9)
        } else {
            self.rng.range(0, 3)
        };
        for _ in 0..steps {
            self.tool_step();
        }
        let mut blocks = Vec::new();
        if self.rng.below(5) == 0 {
            blocks.push(self.thinking());
        }
        blocks.push(json!({"type": "text", "text": prose(&mut self.rng, self.lang, 100, 1_500)}));
        self.call(blocks);
    }

    fn thinking(&mut self) -> Value {
        json!({"type": "thinking", "thinking": prose(&mut self.rng, Lang::English, 100, 1_200),
            "signature": self.rng.hex(120)})
    }

    /// One turn of the tool loop: a response calling one or two tools, progress events, and
    /// the results.
    fn tool_step(&mut self) {
        let mut blocks = Vec::new();
        if self.rng.below(10) < 3 {
            blocks.push(self.thinking());
        }
        if self.rng.below(10) < 6 {
            blocks.push(json!({"type": "text", "text": prose(&mut self.rng, self.lang, 40, 400)}));
        }
        let calls = if self.rng.below(100) < 15 { 2 } else { 1 };
        let mut results = Vec::new();
        for _ in 0..calls {
            let id = format!("toolu_01{}", self.rng.hex(22));
            let (name, input, output) = tool_call(&mut self.rng);
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            let content = if self.rng.below(5) == 0 {
                json!([{"type": "text", "text": output}])
            } else {
                json!(output)
            };
            results.push((
                name,
                json!({"type": "tool_result", "tool_use_id": id, "content": content}),
            ));
        }
        self.call(blocks);
        for (name, result) in &results {
            if *name == "Bash" {
                for _ in 0..self.rng.range(0, 4) {
                    self.progress(result["tool_use_id"].as_str().unwrap());
                }
            }
        }
        let results = results.into_iter().map(|(_, r)| r).collect();
        self.user(Value::Array(results), json!({}));
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic content.

/// xorshift64*: a fixed seed per session, no outside randomness.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// In `[low, high)`.
    fn range(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low)
    }

    /// In `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// In `[low, high)`, evenly spread over the logarithm: small sizes are common, large rare.
    fn log_range(&mut self, low: usize, high: usize) -> usize {
        (low as f64 * (high as f64 / low as f64).powf(self.unit())) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from_digit(self.below(16) as u32, 16).unwrap())
            .collect()
    }

    fn uuid(&mut self) -> String {
        let h = self.hex(32);
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..]
        )
    }
}

const WORDS: &[&str] = &[
    "the", "the", "the", "a", "a", "to", "of", "and", "in", "is", "it", "that", "for", "on",
    "with", "this", "we", "now", "when", "then", "so", "but", "not", "be", "are", "was", "can",
    "should", "will", "one", "each", "every", "from", "by", "at", "as", "if", "test", "tests",
    "parser", "amount", "report", "value", "function", "file", "error", "errors", "result",
    "change", "changes", "rounding", "decimal", "call", "calls", "config", "build", "run", "fails",
    "passes", "fixed", "check", "read", "write", "look", "line", "lines", "module", "type",
    "types", "field", "missing", "instead", "because", "still", "again", "first", "last", "next",
    "before", "after", "user", "users", "request", "response", "cache", "database", "query",
    "index", "order", "time", "zone", "format", "string", "number", "input", "output", "path",
    "branch", "commit", "update", "handle", "return", "returns", "expected", "actual", "case",
    "cases", "edge", "bug", "cause", "fix", "which", "where", "what", "why", "how", "also", "only",
    "just", "both", "same", "other", "new", "old", "small", "large", "slow", "fast",
];

const JAPANESE: &[&str] = &[
    "この関数は",
    "入力を検証してから",
    "エラーを返します",
    "テストが失敗しました",
    "原因は",
    "丸め処理にあります",
    "修正しました",
    "ファイルを読みました",
    "次に",
    "設定を確認します",
    "レポートの金額が",
    "小数点以下で",
    "ずれています",
    "もう一度実行してください",
    "念のため",
    "ログを見ると",
    "タイムゾーンの扱いが",
    "正しくありません",
    "ですが",
    "問題ありません",
];

const CHINESE: &[&str] = &[
    "这个函数",
    "会先检查输入",
    "然后返回错误",
    "测试失败了",
    "原因是",
    "四舍五入的处理",
    "我已经修复了",
    "读取了文件",
    "接下来",
    "确认一下配置",
    "报表中的金额",
    "在小数部分",
    "出现了偏差",
    "请再运行一次",
    "为了保险起见",
    "从日志来看",
    "时区的处理",
    "不正确",
    "但是",
    "没有问题",
];

const SYLLABLES: &[&str] = &[
    "par", "se", "amo", "unt", "re", "port", "cfg", "load", "str", "buf", "ctx", "idx", "val",
    "res", "req", "user", "cache", "row", "col", "tok", "sum", "map", "key", "item", "node",
    "tree", "err", "opt", "len", "csv", "line", "fmt", "zone", "date", "round", "total",
];

fn ident(rng: &mut Rng) -> String {
    let parts: Vec<&str> = (0..rng.range(1, 4)).map(|_| rng.pick(SYLLABLES)).collect();
    parts.join("_")
}

fn type_name(rng: &mut Rng) -> String {
    (0..rng.range(1, 3))
        .map(|_| {
            let s = rng.pick(SYLLABLES);
            s[..1].to_uppercase() + &s[1..]
        })
        .collect()
}

fn path(rng: &mut Rng) -> String {
    let ext = rng.pick(&["rs", "ts", "py", "rs", "ts"]);
    format!("src/{}/{}.{ext}", ident(rng), ident(rng))
}

/// Sentences of at least `low` bytes (and about `high` at most), in the session's language;
/// prose in a coding session names identifiers now and then.
fn prose(rng: &mut Rng, lang: Lang, low: usize, high: usize) -> String {
    let target = rng.log_range(low, high);
    let mut text = String::with_capacity(target + 64);
    while text.len() < target {
        match lang {
            Lang::English => {
                for i in 0..rng.range(6, 20) {
                    let word = if rng.below(12) == 0 {
                        format!("`{}`", ident(rng))
                    } else {
                        rng.pick(WORDS).to_owned()
                    };
                    if i == 0 {
                        text.push_str(&(word[..1].to_uppercase() + &word[1..]));
                    } else {
                        text.push(' ');
                        text.push_str(&word);
                    }
                    if i > 2 && rng.below(10) == 0 {
                        text.push(',');
                    }
                }
                text.push_str(if rng.below(8) == 0 { ".\n\n" } else { ". " });
            }
            Lang::Japanese | Lang::Chinese => {
                let phrases = if lang == Lang::Japanese {
                    JAPANESE
                } else {
                    CHINESE
                };
                for _ in 0..rng.range(2, 6) {
                    text.push_str(rng.pick(phrases));
                    if rng.below(6) == 0 {
                        text.push_str(&format!(" `{}` ", ident(rng)));
                    }
                }
                text.push('。');
            }
        }
    }
    text
}

fn code_line(rng: &mut Rng) -> String {
    let (a, b, c) = (ident(rng), ident(rng), ident(rng));
    let (t, n) = (type_name(rng), rng.log_range(1, 5_000));
    match rng.below(16) {
        0 => format!("pub fn {a}({b}: &{t}, {c}: usize) -> Result<{t}, Error> {{"),
        1 => format!("    let {a} = {b}.{c}(&{a})?;"),
        2 => format!("    if {a}.len() > {n} {{"),
        3 => format!("        return Err(Error::{t}(format!(\"{a} {{}} out of range\", {b})));"),
        4 => "    }".to_owned(),
        5 => format!("    // {}", prose(rng, Lang::English, 20, 80).trim_end()),
        6 => format!("    for ({a}, {b}) in {c}.iter().enumerate() {{"),
        7 => format!("        {a}.insert({b}.clone(), {n});"),
        8 => "}".to_owned(),
        9 => format!("#[derive(Debug, Clone, PartialEq)]\npub struct {t} {{"),
        10 => format!("    pub {a}: Option<{t}>,"),
        11 => format!("export function {a}({b}: {t}, {c}: number): {t} | undefined {{"),
        12 => format!("  const {a} = await {b}.{c}({a}, {{ {b}: {n} }});"),
        13 => format!("  if (!{a}) throw new Error(`{b} ${{{c}}} not found`);"),
        14 => format!("def {a}({b}, {c}={n}):\n    return [{b} for {b} in {c} if {b}.{a}]"),
        _ => String::new(),
    }
}

fn command_line(rng: &mut Rng) -> String {
    let (a, b) = (ident(rng), ident(rng));
    match rng.below(8) {
        0 => format!("test {a}::tests::{b} ... ok"),
        1 => format!("test {a}::{b} ... FAILED"),
        2 => format!(
            "   Compiling {a} v0.{}.{} (/home/dev/src/{a})",
            rng.below(20),
            rng.below(10)
        ),
        3 => format!(
            "error[E0{}]: mismatched types\n  --> {}:{}:{}",
            rng.range(300, 800),
            path(rng),
            rng.range(1, 900),
            rng.range(1, 80)
        ),
        4 => format!(
            "{} {}",
            rng.hex(7),
            prose(rng, Lang::English, 20, 70).trim_end()
        ),
        5 => format!(
            "-rw-r--r--  1 dev dev {:>7} Mar 14 09:{:02} {}",
            rng.log_range(10, 90_000),
            rng.below(60),
            path(rng)
        ),
        6 => format!("  PASS {} ({} ms)", path(rng), rng.log_range(2, 3_000)),
        _ => format!(
            "{}:{}:    let {a} = {b}({});",
            path(rng),
            rng.range(1, 900),
            rng.log_range(1, 1_000)
        ),
    }
}

fn json_record(rng: &mut Rng) -> Value {
    json!({
        "id": rng.uuid(),
        "name": ident(rng),
        "kind": type_name(rng),
        "amount": format!("{}.{:02}", rng.log_range(1, 100_000), rng.below(100)),
        "count": rng.log_range(1, 10_000),
        "tags": (0..rng.below(4)).map(|_| ident(rng)).collect::<Vec<_>>(),
        "created_at": format!("2026-03-{:02}T{:02}:{:02}:00Z", rng.range(1, 29), rng.below(24), rng.below(60)),
        "active": rng.below(2) == 0,
    })
}

/// Text of about `bytes` bytes, one generated line after another.
fn lines_of(rng: &mut Rng, bytes: usize, line: fn(&mut Rng) -> String) -> String {
    let mut text = String::with_capacity(bytes + 128);
    while text.len() < bytes {
        text.push_str(&line(rng));
        text.push('\n');
    }
    text
}

/// A file's lines as the Read tool shows them, numbered.
fn numbered_code(rng: &mut Rng, bytes: usize) -> String {
    let code = lines_of(rng, bytes, code_line);
    let start = rng.range(1, 400);
    code.lines()
        .enumerate()
        .map(|(i, l)| format!("{:>6}→{l}\n", start + i))
        .collect()
}

/// The size of a tool result: mostly 200 bytes to 4 KB, many tiny, a few of 20 to 50 KB.
fn result_bytes(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=29 => rng.range(20, 200),
        30 => rng.range(20_000, 50_000),
        _ => rng.log_range(200, 4_000),
    }
}

/// A tool's name, its input, and its result's text.
fn tool_call(rng: &mut Rng) -> (&'static str, Value, String) {
    let file = format!("/home/dev/src/ledger/{}", path(rng));
    match rng.below(20) {
        0..=7 => {
            let bytes = result_bytes(rng);
            (
                "Read",
                json!({"file_path": file}),
                numbered_code(rng, bytes),
            )
        }
        8..=13 => {
            let command = format!("cargo test -p {} -- {}", ident(rng), ident(rng));
            let input = json!({"command": command,
                "description": prose(rng, Lang::English, 15, 60).trim_end()});
            let bytes = result_bytes(rng);
            let output = if rng.below(10) < 3 {
                let records: Vec<Value> = (0..bytes / 200 + 1).map(|_| json_record(rng)).collect();
                serde_json::to_string_pretty(&records).unwrap()
            } else {
                lines_of(rng, bytes, command_line)
            };
            ("Bash", input, output)
        }
        14..=16 => {
            let pattern = format!("fn {}\\w*\\(", ident(rng));
            let input = json!({"pattern": pattern, "path": "src", "output_mode": "content"});
            let bytes = result_bytes(rng).min(4_000);
            let output = lines_of(rng, bytes, |rng| {
                format!("{}:{}:{}", path(rng), rng.range(1, 900), code_line(rng))
            });
            ("Grep", input, output)
        }
        _ => {
            let (old, new) = (rng.log_range(40, 600), rng.log_range(40, 600));
            let input = json!({"file_path": file,
                "old_string": lines_of(rng, old, code_line),
                "new_string": lines_of(rng, new, code_line)});
            let output = if rng.below(2) == 0 {
                format!("The file {file} has been updated successfully.")
            } else {
                let bytes = rng.log_range(200, 1_500);
                format!(
                    "The file {file} has been updated. Here's the result of running `cat -n` on \
                     a snippet of the edited file:\n{}",
                    numbered_code(rng, bytes)
                )
            };
            ("Edit", input, output)
        }
    }
}
