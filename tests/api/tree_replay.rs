//! A replay of a simulated 5,000-message conversation in outline mode, with a context read after
//! every append: how much of each request is a prefix of the previous one (what a provider's
//! prompt cache can reuse). Goal: at least 95% on average. SQLite only: the outline's logic does
//! not depend on the backend, and the store's tree reads run on both in tests/tree.rs.

use std::sync::Arc;

use crate::common::{Backend, TestApp};
use loupe::jobs::{Clock, JobsConfig, Runner, StepOutcome};
use loupe::summarize::ExtractiveSummarizer;
use serde_json::{json, Value};

/// A small deterministic generator (no dependency on proptest's runner for a scripted replay).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn range(&mut self, low: u64, high: u64) -> usize {
        (low + self.next() % (high - low)) as usize
    }
}

fn words(rng: &mut Lcg, low: u64, high: u64) -> String {
    let bytes = rng.range(low, high);
    const WORDS: [&str; 12] = [
        "price", "region", "deploy", "parser", "error", "fixed", "the", "plan", "file", "test",
        "user", "cache",
    ];
    let mut text = String::with_capacity(bytes + 8);
    while text.len() < bytes {
        text.push_str(WORDS[rng.range(0, WORDS.len() as u64)]);
        text.push(' ');
    }
    text
}

/// One turn: a prompt, sometimes a tool call and its result, and an answer.
fn turn(rng: &mut Lcg, i: usize) -> Vec<Value> {
    let mut batch = vec![json!({"uuid": format!("u{i}"), "type": "user",
        "message": {"role": "user", "content": words(rng, 40, 600)}})];
    if rng.range(0, 3) == 0 {
        let id = format!("toolu_{i}");
        batch.push(
            json!({"uuid": format!("c{i}"), "type": "assistant", "message": {"role": "assistant",
            "id": format!("msg_c{i}"), "content": [{"type": "tool_use", "id": id, "name": "Read",
            "input": {"path": format!("src/file{i}.rs")}}]}}),
        );
        batch.push(
            json!({"uuid": format!("r{i}"), "type": "user", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": id,
            "content": words(rng, 200, 6000)}]}}),
        );
    }
    batch.push(
        json!({"uuid": format!("a{i}"), "type": "assistant", "message": {"role": "assistant",
        "id": format!("msg_{i}"), "content": [{"type": "text", "text": words(rng, 80, 1500)}]}}),
    );
    batch
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[tokio::test]
async fn a_replayed_conversation_keeps_most_of_each_request_as_a_prefix_of_the_previous() {
    let app = TestApp::new(Backend::Sqlite).await;
    let thread = app.thread("replay").await;
    let settings = app
        .request(
            axum::http::Method::PUT,
            &format!("/v1/threads/{thread}/settings"),
            Some(json!({"outline": {"enabled": true}})),
        )
        .await;
    assert!(settings.status.is_success(), "{}", settings.body);
    let runner = Runner::new(
        app.store.clone(),
        Arc::new(ExtractiveSummarizer::new()),
        JobsConfig::default(),
    );
    let mut rng = Lcg(7);
    let (mut messages, mut turns) = (0usize, 0usize);
    let mut previous: Option<Vec<u8>> = None;
    let mut shares = Vec::new();
    let mut versions = std::collections::HashSet::new();
    let mut history_bytes = 0usize;
    while messages < 5_000 {
        let batch = turn(&mut rng, turns);
        history_bytes += batch.iter().map(|m| m.to_string().len()).sum::<usize>();
        messages += batch.len();
        turns += 1;
        app.append(&thread, batch).await;
        loop {
            match runner.step(Clock::System).await.unwrap() {
                StepOutcome::Idle => break,
                StepOutcome::Succeeded { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        let context = app
            .get(&format!("/v1/threads/{thread}/context?view=outline"))
            .await;
        assert!(context.status.is_success(), "{}", context.body);
        versions.insert(context.body["outline"]["version"].as_i64().unwrap());
        let request = serde_json::to_vec(
            &json!({"tools": context.body["tools"], "messages": context.body["messages"]}),
        )
        .unwrap();
        if let Some(previous) = &previous {
            shares.push(common_prefix(previous, &request) as f64 / request.len() as f64);
        }
        previous = Some(request);
    }
    let average = shares.iter().sum::<f64>() / shares.len() as f64;
    let below_half = shares.iter().filter(|s| **s < 0.5).count();
    let last = previous.unwrap().len();
    let outline = app.get(&format!("/v1/threads/{thread}/outline")).await.body;
    eprintln!(
        "replay: {messages} messages in {turns} appends; average prefix share {:.2}% \
         (min {:.2}%, {below_half} requests under 50%); {} outline versions; \
         last request {last} bytes vs {history_bytes} bytes of history; \
         {} nodes, {} written by the summarizer ({:.3} per message)",
        average * 100.0,
        shares.iter().cloned().fold(1.0, f64::min) * 100.0,
        versions.len(),
        outline["build"]["nodes"],
        outline["build"]["summarized_nodes"],
        outline["build"]["summarized_nodes"].as_f64().unwrap() / messages as f64,
    );
    assert!(
        average >= 0.95,
        "average prefix share {average:.4} is under the 95% goal"
    );
    assert!(
        last < history_bytes / 4,
        "the outline keeps the request small"
    );
    app.finish().await;
}
