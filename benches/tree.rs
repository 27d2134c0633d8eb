//! The summary tree: zoom latency on a long thread, the tree job's build rate, summarizer calls
//! per message, and the outline's size against the full history's. Timed plainly (no statistics
//! framework), through the public `Store`, `jobs::Runner` and HTTP router only.
//!
//! Run: `TEST_DATABASE_URL=postgres://loupe:loupe@127.0.0.1:5432/postgres cargo bench --bench tree`
//! (`BENCH_DATABASE_URL` is read first). PostgreSQL runs in a fresh database `loupe_bench_<uuid>`
//! dropped at the end; SQLite in a temporary file. Without a URL the PostgreSQL half is skipped
//! with a notice; `TREE_BENCH_BACKENDS=sqlite` or `=postgres` runs parts 1 and 2 on one backend
//! only. Under `cargo test --benches` (no `--bench` argument) every size is small, so the
//! run is a quick smoke check.
//!
//! 1. **Build and zoom** (both backends). A thread in outline mode (default options) gets
//!    `TREE_BENCH_MESSAGES` (100,000) realistic entries (`support/history.rs`, cycled with fresh
//!    uuids) through `Store::append` in batches of 1,000; after each batch the tree job runs
//!    (`Runner::step` until idle), with an extractive summarizer. Reported: append time, job
//!    time, nodes written per second of job time. Then `TREE_BENCH_ZOOMS` (2,000) random valid
//!    lines per level (`n = 1, 2, 4, …` up to the largest complete block) are zoomed through
//!    `Store::zoom_read`, then again through the router (`POST /v1/threads/{id}/zoom`, in
//!    process, `tower::ServiceExt::oneshot`): p50/p99/max per level and over all levels (0
//!    zooms skips this).
//! 2. **Enabling outline mode on a stored thread** (both backends). Threads of
//!    `TREE_BENCH_BULK` (a comma-separated list: 5,000, 10,000, 20,000) messages get outline mode
//!    turned on after their appends, so one job builds the whole tree and moves the whole history
//!    into the outline at once (an empty list skips this).
//! 3. **Summarizer calls and outline size** (SQLite; both are backend-independent: the job and
//!    the policy are deterministic). A conversation of `TREE_BENCH_CONVERSATION` (10,000)
//!    messages — the generator's turns, plus pasted long prompts and long answers — is appended
//!    one exchange at a time with the tree job run after each append. At 500, 1,000, 2,000,
//!    5,000 and 10,000 messages: summarizer invocations (a counting wrapper around the
//!    extractive summarizer) and nodes written per message, and the serialized bytes of the
//!    `messages` of `GET …/context?view=outline` against those of `GET …/context` (the whole
//!    history normalized; auto-compaction is off).

#[path = "support/common.rs"]
mod common;
#[path = "support/history.rs"]
mod history;

use common::Scratch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use axum::Router;
use loupe::history::Entry;
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome};
use loupe::store::{
    AppendRequest, NewThread, Store, StoreOptions, TenantId, ThreadSettings, ZoomRead,
};
use loupe::summarize::{
    ExtractiveSummarizer, Purpose, SummarizeError, Summarizer, Summary, SummaryRequest,
};
use loupe::tree::OutlineOptions;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// Messages per append while building the long thread.
const BATCH: usize = 1_000;
/// Message counts at which the conversation's figures are taken.
const CHECKPOINTS: [usize; 5] = [500, 1_000, 2_000, 5_000, 10_000];

struct Sizes {
    messages: usize,
    zooms: usize,
    bulk: Vec<usize>,
    conversation: usize,
}

fn env_size(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

fn env_sizes(name: &str, default: &str) -> Vec<usize> {
    let value = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    value
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}={value:?} is not a list of numbers"))
        })
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run a short smoke.
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            messages: env_size("TREE_BENCH_MESSAGES", 100_000),
            zooms: env_size("TREE_BENCH_ZOOMS", 2_000),
            bulk: env_sizes("TREE_BENCH_BULK", "5000,10000,20000"),
            conversation: env_size("TREE_BENCH_CONVERSATION", 10_000),
        }
    } else {
        Sizes {
            messages: 3_000,
            zooms: 20,
            bulk: vec![1_000],
            conversation: 1_000,
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("load average at start: {}", load_average());
    let defaults = OutlineOptions::default();
    println!(
        "outline options: defaults (line {} B, outline budget {} B, tail {} tokens)",
        defaults.line_bytes, defaults.budget_bytes, defaults.tail_tokens
    );
    let template: Vec<Entry> = history::history_values(10_000, 7)
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();

    // Parts 1 and 2 on these backends (`TREE_BENCH_BACKENDS`, default both).
    let backends =
        std::env::var("TREE_BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    let on = |name: &str| backends.split(',').any(|b| b.trim() == name);
    let admin_url = if on("postgres") {
        common::admin_url()
    } else {
        None
    };
    rt.block_on(async {
        if on("sqlite") {
            let scratch = Scratch::sqlite(store_options()).await;
            build_and_zoom(&scratch.store, &template, &sizes).await;
            for &messages in &sizes.bulk {
                bulk_enable(&scratch.store, &template, messages).await;
            }
            scratch.finish().await;
        }
        if let Some(url) = &admin_url {
            let scratch = Scratch::postgres(url, store_options()).await;
            build_and_zoom(&scratch.store, &template, &sizes).await;
            for &messages in &sizes.bulk {
                bulk_enable(&scratch.store, &template, messages).await;
            }
            scratch.finish().await;
        }
        if sizes.conversation > 0 {
            let scratch = Scratch::sqlite(store_options()).await;
            conversation(&scratch.store, sizes.conversation).await;
            scratch.finish().await;
        }
    });
    println!("load average at end: {}", load_average());
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" / "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Auto-compaction off: a compaction job would append to the threads being measured.
fn store_options() -> StoreOptions {
    StoreOptions {
        auto_compact_tokens: 0,
        ..StoreOptions::new("")
    }
}

/// Counts what the tree job asks of the summarizer, then answers as the extractive one does.
#[derive(Default)]
struct Counting {
    lines: AtomicU64,
    merges: AtomicU64,
    /// Answers whose `summarizer` is not `verbatim` (a model backend would have been called).
    written: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    lines: u64,
    merges: u64,
    written: u64,
}

impl Counting {
    fn counts(&self) -> Counts {
        Counts {
            lines: self.lines.load(Ordering::Relaxed),
            merges: self.merges.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
        }
    }
}

#[async_trait]
impl Summarizer for Counting {
    fn name(&self) -> String {
        "extractive".to_owned()
    }

    async fn summarize(&self, req: &SummaryRequest) -> Result<Summary, SummarizeError> {
        match req.purpose {
            Purpose::Merge => self.merges.fetch_add(1, Ordering::Relaxed),
            _ => self.lines.fetch_add(1, Ordering::Relaxed),
        };
        let summary = ExtractiveSummarizer::new().summarize(req).await?;
        if summary.summarizer != "verbatim" {
            self.written.fetch_add(1, Ordering::Relaxed);
        }
        Ok(summary)
    }
}

fn runner(store: &Store, summarizer: Arc<Counting>) -> Runner {
    Runner::new(store.clone(), summarizer, JobsConfig::default())
}

/// What the jobs run by one [`drain`] did.
#[derive(Debug, Default, Clone, Copy)]
struct Drained {
    jobs: u64,
    nodes: u64,
    elapsed: Duration,
}

impl std::ops::AddAssign for Drained {
    fn add_assign(&mut self, other: Drained) {
        self.jobs += other.jobs;
        self.nodes += other.nodes;
        self.elapsed += other.elapsed;
    }
}

/// Runs jobs until none is claimable; panics on a job that does not succeed.
async fn drain(runner: &Runner) -> Drained {
    let started = Instant::now();
    let mut drained = Drained::default();
    loop {
        match runner.step(Clock::System).await.expect("job step") {
            StepOutcome::Idle => break,
            StepOutcome::Succeeded { result, .. } => {
                drained.jobs += 1;
                drained.nodes += result["nodes_written"].as_u64().unwrap_or_default();
            }
            other => panic!("a tree job did not succeed: {other:?}"),
        }
    }
    drained.elapsed = started.elapsed();
    drained
}

async fn new_thread(store: &Store, id: &str) {
    store
        .create_thread(
            &TenantId::default_tenant(),
            NewThread {
                id: Some(id.to_owned().into()),
                ..Default::default()
            },
        )
        .await
        .expect("create thread");
}

/// Outline mode on, with the default budgets (`OutlineOptions::default()`).
async fn outline_on(store: &Store, thread: &str) {
    store
        .put_thread_settings(
            &TenantId::default_tenant(),
            &thread.into(),
            &ThreadSettings {
                outline: Some(OutlineOptions {
                    enabled: true,
                    ..OutlineOptions::default()
                }),
                ..ThreadSettings::default()
            },
        )
        .await
        .expect("outline settings");
}

async fn append(store: &Store, thread: &str, entries: Vec<Entry>) {
    let count = entries.len();
    let outcome = store
        .append(
            &TenantId::default_tenant(),
            &thread.into(),
            AppendRequest {
                entries,
                expected_next_seq: None,
            },
        )
        .await
        .expect("append");
    assert_eq!(outcome.messages.len(), count);
}

/// Nodes of a complete tree over `t` messages: `⌊t/2^l⌋` at every level.
fn tree_size(t: u64) -> u64 {
    (0..=t.ilog2()).map(|level| t >> level).sum()
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// Prints p50/p99/max per level and over all levels, as a Markdown table.
fn report_latencies(title: &str, by_level: &BTreeMap<u32, Vec<Duration>>) {
    println!("{title}");
    println!("| n | zooms | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    let mut all = Vec::new();
    for (level, times) in by_level {
        let mut sorted = times.clone();
        sorted.sort();
        println!(
            "| {} | {} | {} | {} | {} |",
            1u64 << level,
            sorted.len(),
            ms(percentile(&sorted, 50.0)),
            ms(percentile(&sorted, 99.0)),
            ms(*sorted.last().unwrap())
        );
        all.extend(sorted);
    }
    all.sort();
    println!(
        "| all | {} | {} | {} | {} |",
        all.len(),
        ms(percentile(&all, 50.0)),
        ms(percentile(&all, 99.0)),
        ms(*all.last().unwrap())
    );
}

/// Random valid lines: for each level with a complete block, `zooms` random blocks of it.
fn zoom_plan(messages: u64, zooms: usize, seed: u64) -> Vec<(u32, i64, i64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    for level in 0..=messages.ilog2() {
        let blocks = messages >> level;
        for _ in 0..zooms {
            let index = rng.gen_range(0..blocks);
            plan.push((level, (index << level) as i64, (1i64) << level));
        }
    }
    // Interleave the levels, so no level gets a warmer cache than the others.
    for i in (1..plan.len()).rev() {
        let j = rng.gen_range(0..=i);
        plan.swap(i, j);
    }
    plan
}

async fn build_and_zoom(store: &Store, template: &[Entry], sizes: &Sizes) {
    let backend = store.backend().name();
    let tenant = TenantId::default_tenant();
    let thread = "zoom";
    new_thread(store, thread).await;
    outline_on(store, thread).await;
    let counting = Arc::new(Counting::default());
    let runner = runner(store, counting.clone());
    let mut next = 0usize;
    let mut appending = Duration::ZERO;
    let mut built = Drained::default();
    while next < sizes.messages {
        let count = BATCH.min(sizes.messages - next);
        let entries = common::batch(template, thread, &mut next, count);
        let started = Instant::now();
        append(store, thread, entries).await;
        appending += started.elapsed();
        built += drain(&runner).await;
    }
    let t = sizes.messages as u64;
    let snapshot = store
        .outline_snapshot(&tenant, &thread.into())
        .await
        .expect("outline snapshot");
    let status = store
        .tree_status(&snapshot.thread_key)
        .await
        .expect("tree status");
    assert_eq!(
        status.nodes as u64,
        tree_size(t),
        "every complete block has its node"
    );
    assert_eq!(built.nodes, tree_size(t));
    let counts = counting.counts();
    assert_eq!(
        status.summarized as u64, counts.written,
        "the build status counts them too"
    );
    println!(
        "{backend}: appended {t} messages in {:.1} s ({:.0} messages/s, batches of {BATCH})",
        appending.as_secs_f64(),
        t as f64 / appending.as_secs_f64()
    );
    println!(
        "{backend}: tree jobs after each batch: {} jobs, {} nodes in {:.1} s of job time = {:.0} \
         nodes/s ({:.0} messages/s); summarizer invoked {} times ({} lines, {} merges; {} not \
         verbatim) = {:.3} per message",
        built.jobs,
        built.nodes,
        built.elapsed.as_secs_f64(),
        built.nodes as f64 / built.elapsed.as_secs_f64(),
        t as f64 / built.elapsed.as_secs_f64(),
        counts.lines + counts.merges,
        counts.lines,
        counts.merges,
        counts.written,
        counts.written as f64 / t as f64
    );
    let line_bytes: usize = snapshot
        .lines
        .iter()
        .map(|(node, text)| loupe::tree::render_line(*node, text).len() + 1)
        .sum();
    println!(
        "{backend}: outline: {} lines, {line_bytes} bytes, boundary {}, version {}",
        snapshot.lines.len(),
        snapshot.outline.boundary(),
        snapshot.version
    );

    if sizes.zooms == 0 {
        return;
    }
    // Zoom through the store.
    let plan = zoom_plan(t, sizes.zooms, 42);
    let mut by_level: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for &(level, id, n) in &plan {
        let started = Instant::now();
        let read = store
            .zoom_read(&tenant, &thread.into(), id, n)
            .await
            .expect("zoom read");
        let elapsed = started.elapsed();
        match read {
            Ok(ZoomRead::Message(Some(_))) | Ok(ZoomRead::Halves(Some(_), Some(_))) => {}
            other => panic!("zoom({id}, {n}) on {backend}: {other:?}"),
        }
        by_level.entry(level).or_default().push(elapsed);
    }
    report_latencies(
        &format!("{backend}: Store::zoom_read on a {t}-message thread"),
        &by_level,
    );

    // Zoom through the router: routing, JSON in and out, the answer's rendering.
    let router = common::router(store);
    let uri = format!("/v1/threads/{thread}/zoom");
    let plan = zoom_plan(t, sizes.zooms, 43);
    let mut by_level: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for &(level, id, n) in &plan {
        let started = Instant::now();
        let (status, body) =
            common::send(&router, Method::POST, &uri, Some(json!({"id": id, "n": n}))).await;
        let elapsed = started.elapsed();
        assert_eq!(status, StatusCode::OK);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["is_error"], false, "zoom({id}, {n}): {body}");
        by_level.entry(level).or_default().push(elapsed);
    }
    report_latencies(
        &format!(
            "{backend}: POST /v1/threads/{{id}}/zoom (router, in process) on a {t}-message thread"
        ),
        &by_level,
    );
}

/// Outline mode turned on for a thread that already holds `messages` messages: one job builds
/// the whole tree and moves the history into the outline.
async fn bulk_enable(store: &Store, template: &[Entry], messages: usize) {
    if messages == 0 {
        return;
    }
    let backend = store.backend().name();
    let thread = &format!("bulk-{messages}");
    new_thread(store, thread).await;
    let mut next = 0usize;
    while next < messages {
        let count = BATCH.min(messages - next);
        let entries = common::batch(template, thread, &mut next, count);
        append(store, thread, entries).await;
    }
    outline_on(store, thread).await;
    let counting = Arc::new(Counting::default());
    let drained = drain(&runner(store, counting)).await;
    assert_eq!(drained.nodes, tree_size(messages as u64));
    let snapshot = store
        .outline_snapshot(&TenantId::default_tenant(), &thread.as_str().into())
        .await
        .expect("outline snapshot");
    println!(
        "{backend}: outline mode turned on for a stored {messages}-message thread: {} job(s), {} \
         nodes in {:.1} s = {:.0} nodes/s; outline of {} lines, boundary {}",
        drained.jobs,
        drained.nodes,
        drained.elapsed.as_secs_f64(),
        drained.nodes as f64 / drained.elapsed.as_secs_f64(),
        snapshot.lines.len(),
        snapshot.outline.boundary()
    );
}

/// The simulated conversation: the generator's history, with a few pasted long prompts and long
/// answers on top of its long tool results. Returned as exchanges (a user turn and everything
/// up to the next one), as a client appends them.
fn conversation_exchanges(messages: usize) -> Vec<Vec<Entry>> {
    let mut rng = history::Lcg::new(2026);
    let mut values = history::history_values(messages, 11);
    for value in &mut values {
        let obj = value.as_object_mut().unwrap();
        obj.remove("seq");
        let kind = obj["type"].as_str().unwrap_or_default().to_owned();
        let content = obj.get_mut("message").and_then(|m| m.get_mut("content"));
        match (kind.as_str(), content) {
            // A prompt with a pasted document or log: 1.5–6 KB.
            ("user", Some(content)) if content.is_string() && rng.chance(6) => {
                let len = rng.range(1_500, 6_000);
                *content = json!(format!(
                    "Here is what I have:\n{}\nWhat do you make of it?",
                    history::tool_output(&mut rng, len)
                ));
            }
            // A long explanation: 1–3 KB of text.
            ("assistant", Some(content)) if rng.chance(4) => {
                if let Some(text) = content
                    .get_mut(0)
                    .filter(|b| b["type"] == "text")
                    .and_then(|b| b.get_mut("text"))
                {
                    let len = rng.range(1_000, 3_000);
                    *text = json!(history::prose(&mut rng, len));
                }
            }
            _ => {}
        }
    }
    let mut exchanges: Vec<Vec<Entry>> = Vec::new();
    let mut previous_attachment = false;
    for value in values {
        let kind = value["type"].as_str().unwrap_or_default().to_owned();
        let prompt = kind == "user" && value["message"]["content"].is_string();
        let starts = kind == "attachment" || (prompt && !previous_attachment);
        previous_attachment = kind == "attachment";
        if starts || exchanges.is_empty() {
            exchanges.push(Vec::new());
        }
        exchanges
            .last_mut()
            .unwrap()
            .push(serde_json::from_value(value).unwrap());
    }
    exchanges
}

struct Checkpoint {
    messages: usize,
    counts: Counts,
    nodes: u64,
    job_time: Duration,
    outline_bytes: usize,
    full_bytes: usize,
    outline_tokens: u64,
    full_tokens: u64,
    outline_lines: u64,
    boundary: u64,
    outline_ms: Duration,
    full_ms: Duration,
}

async fn conversation(store: &Store, messages: usize) {
    let thread = "conversation";
    new_thread(store, thread).await;
    outline_on(store, thread).await;
    let counting = Arc::new(Counting::default());
    let runner = runner(store, counting.clone());
    let router = common::router(store);
    let exchanges = conversation_exchanges(messages);
    let exchange_count = exchanges.len();
    let history_bytes: usize = exchanges
        .iter()
        .flatten()
        .map(|e| serde_json::to_vec(e).unwrap().len())
        .sum();
    println!(
        "conversation: {messages} messages ({history_bytes} bytes of entries) in {exchange_count} \
         exchanges"
    );
    let mut checkpoints = CHECKPOINTS
        .iter()
        .copied()
        .filter(|&c| c <= messages)
        .peekable();
    let mut stored = 0usize;
    let mut appends = 0usize;
    let mut built = Drained::default();
    let mut results = Vec::new();
    for mut exchange in exchanges {
        while !exchange.is_empty() {
            // An exchange that crosses a checkpoint is appended in two parts, cut there.
            let room = checkpoints.peek().map_or(usize::MAX, |c| c - stored);
            let rest = exchange.split_off(exchange.len().min(room));
            let part = std::mem::replace(&mut exchange, rest);
            stored += part.len();
            append(store, thread, part).await;
            appends += 1;
            built += drain(&runner).await;
            if checkpoints.peek() == Some(&stored) {
                checkpoints.next();
                results.push(checkpoint(&router, thread, stored, counting.counts(), built).await);
            }
        }
    }
    println!(
        "conversation: {appends} appends, {} tree jobs, {:.1} s of job time ({:.1} ms per job)",
        built.jobs,
        built.elapsed.as_secs_f64(),
        built.elapsed.as_secs_f64() * 1000.0 / built.jobs.max(1) as f64
    );
    println!("Summarizer invocations and nodes written (cumulative)");
    println!("| messages | nodes | nodes/message | summarizer calls (lines + merges) | calls/message | not verbatim | job time s |");
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        let calls = r.counts.lines + r.counts.merges;
        println!(
            "| {} | {} | {:.3} | {} ({} + {}) | {:.3} | {} | {:.1} |",
            r.messages,
            r.nodes,
            r.nodes as f64 / r.messages as f64,
            calls,
            r.counts.lines,
            r.counts.merges,
            calls as f64 / r.messages as f64,
            r.counts.written,
            r.job_time.as_secs_f64()
        );
    }
    println!("Context size: view=outline against the full history (serialized `messages`)");
    println!("| messages | outline lines | boundary | outline view bytes | full view bytes | ratio | outline est. tokens | full est. tokens | outline read ms | full read ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} |",
            r.messages,
            r.outline_lines,
            r.boundary,
            r.outline_bytes,
            r.full_bytes,
            r.outline_bytes as f64 / r.full_bytes as f64,
            r.outline_tokens,
            r.full_tokens,
            ms(r.outline_ms),
            ms(r.full_ms)
        );
    }
}

async fn checkpoint(
    router: &Router,
    thread: &str,
    messages: usize,
    counts: Counts,
    built: Drained,
) -> Checkpoint {
    let read = |uri: String| async move {
        let started = Instant::now();
        let (status, body) = common::send(router, Method::GET, &uri, None).await;
        let elapsed = started.elapsed();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        (body, elapsed)
    };
    let (outline, outline_ms) = read(format!("/v1/threads/{thread}/context?view=outline")).await;
    let (full, full_ms) = read(format!("/v1/threads/{thread}/context")).await;
    assert_eq!(full["next_seq"], messages);
    assert_eq!(outline["next_seq"], messages);
    let bytes = |body: &Value| serde_json::to_vec(&body["messages"]).unwrap().len();
    Checkpoint {
        messages,
        counts,
        nodes: built.nodes,
        job_time: built.elapsed,
        outline_bytes: bytes(&outline),
        full_bytes: bytes(&full),
        outline_tokens: outline["estimated_tokens"].as_u64().unwrap_or_default(),
        full_tokens: full["estimated_tokens"].as_u64().unwrap_or_default(),
        outline_lines: outline["outline"]["lines"].as_u64().unwrap_or_default(),
        boundary: outline["outline"]["boundary"].as_u64().unwrap_or_default(),
        outline_ms,
        full_ms,
    }
}
